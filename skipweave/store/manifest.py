"""The JSON manifest that commits one entry, and the checks that decide whether it may be served."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

import xxhash

FORMAT_VERSION = 1
"""Version of the entry format; a manifest with another version is never served."""

_CHUNK = 8 << 20


class EntryInvalid(Exception):
    """A committed entry cannot be served: unreadable manifest, foreign format, missing or corrupt payload."""


def file_checksum(path: str) -> str:
    """Return ``xxh3_128:<hex>`` of a file's bytes, read in 8 MiB chunks."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return "xxh3_128:" + h.hexdigest()


def bytes_checksum(data: bytes | memoryview) -> str:
    """Return ``xxh3_128:<hex>`` of in-memory bytes."""
    return "xxh3_128:" + xxhash.xxh3_128(data).hexdigest()


def library_versions() -> dict[str, str]:
    """Versions of the libraries an entry's bytes depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("skipweave", "torch", "numpy", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


@dataclass(frozen=True)
class PayloadFile:
    """One payload file of an entry: name relative to the target folder, size in bytes, checksum."""

    name: str
    bytes: int
    checksum: str


def build_manifest(
    *,
    role: str,
    target: str,
    target_path: str,
    step: int,
    call: int,
    shard: str,
    fingerprint: str,
    files: list[PayloadFile],
    pickled: bool,
    seconds: float,
) -> dict[str, Any]:
    """Return the manifest mapping of a new entry (see the on-disk format in the docs)."""
    return {
        "format_version": FORMAT_VERSION,
        "role": role,
        "target": target,
        "target_path": target_path,
        "step": step,
        "call_index": call,
        "shard": shard,
        "input_fingerprint": fingerprint,
        "payload": [{"name": f.name, "bytes": f.bytes, "checksum": f.checksum} for f in files],
        "pickled": pickled,
        "generation_seconds": seconds,
        "versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_unix": time.time(),
        "writer": {"host": platform.node(), "pid": os.getpid(), "argv0": sys.argv[0] if sys.argv else ""},
    }


def read_manifest(path: str) -> dict[str, Any]:
    """Read and structurally check a manifest.

    Raises:
        FileNotFoundError: no manifest (the entry was never committed).
        EntryInvalid: unreadable JSON, another format version, or missing fields.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise EntryInvalid(f"manifest {path} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version") if isinstance(data, dict) else type(data).__name__
        raise EntryInvalid(f"manifest {path} has format_version {found!r}, this skipweave reads {FORMAT_VERSION}")
    for field in ("role", "target", "step", "call_index", "shard", "payload", "input_fingerprint"):
        if field not in data:
            raise EntryInvalid(f"manifest {path} lacks '{field}'")
    return data


def verify_payload(folder: str, manifest: dict[str, Any], *, checksums: bool = True) -> None:
    """Check that every payload file exists with the recorded size (and checksum).

    Raises:
        EntryInvalid: naming the first file that is missing, truncated or corrupt.
    """
    for item in manifest["payload"]:
        path = os.path.join(folder, item["name"])
        try:
            size = os.path.getsize(path)
        except OSError:
            raise EntryInvalid(f"payload {path} is missing") from None
        if size != item["bytes"]:
            raise EntryInvalid(f"payload {path} has {size} bytes, manifest says {item['bytes']}")
        if checksums and file_checksum(path) != item["checksum"]:
            raise EntryInvalid(f"payload {path} does not match its checksum {item['checksum']}")
