"""The JSON manifest that commits one entry, and the checks that decide whether it may be served."""

from __future__ import annotations

import functools
import math
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from skipweave.store.errors import EntryInvalid, EntryRefused
from skipweave.store.format import jsonio
from skipweave.store.format.layout import EntryKey, parse_payload_name
from skipweave.store.format.versions import FINGERPRINT_RULES, FORMAT_VERSION, reader_of, version_of
from skipweave.store.fs import open_payload, open_regular
from skipweave.store.identity import this_writer

_CHUNK = 8 << 20
MANIFEST_MAX_BYTES = 1 << 20
"""A manifest is a few hundred bytes; a larger file is not one skipweave wrote (and is not parsed)."""


RETURNED_AWAITABLE = "awaitable"
"""The manifest's ``returned`` when a plain ``def`` target handed back an awaitable (a coroutine, an asyncio future)
whose value is the recorded result: a replay hands back an awaitable again, so ``await target(...)`` works on a hit as
on a miss. Absent for every other entry, and in every format-1 entry (whose replay hands back the bare value)."""

CHECKSUM_ALGORITHM = "xxh3_128"
"""The payload checksum: fast (several GB/s), non-cryptographic; detects corruption, not tampering."""


def new_hasher() -> xxhash.xxh3_128:
    """A fresh streaming hasher of the payload checksum (feed it with ``update``)."""
    return xxhash.xxh3_128()


def checksum_digest(hasher: xxhash.xxh3_128) -> str:
    """The manifest form ``xxh3_128:<hex>`` of a hasher's digest."""
    return f"{CHECKSUM_ALGORITHM}:{hasher.hexdigest()}"


def file_checksum(path: str) -> str:
    """Return ``xxh3_128:<hex>`` of a file's bytes, read in 8 MiB chunks into one reused buffer (never through a
    symlink).

    Raises:
        OSError: the file cannot be read (:class:`~skipweave.store.errors.UnsafePath`: it is no regular file).
    """
    with open(open_regular(path), "rb", buffering=0) as fh:
        return _stream_checksum(fh)


def _stream_checksum(fh: Any) -> str:
    h = new_hasher()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := fh.readinto(buf):
        h.update(view[:n])
    return checksum_digest(h)


def bytes_checksum(data: bytes | memoryview) -> str:
    """Return ``xxh3_128:<hex>`` of in-memory bytes."""
    return checksum_digest(xxhash.xxh3_128(data))


def library_versions() -> dict[str, str]:
    """Versions of the libraries an entry's bytes depend on.

    Taken from the modules' ``__version__`` when they are imported (the store imports all of them
    when recording) and only otherwise from the installed distributions, whose lookup scans
    ``sys.path`` (about 0.3 s on its first call in a process). Computed once per process.
    """
    return dict(_library_versions())


@functools.lru_cache(maxsize=1)
def _library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("skipweave", "torch", "numpy", "safetensors"):
        module = sys.modules.get(name)
        found = getattr(module, "__version__", None) if module is not None else None
        if found is None:
            found = _distribution_version(name)
        if found is not None:
            out[name] = str(found)
    return out


def _distribution_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


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
    fingerprint_rule: str,
    files: list[PayloadFile],
    pickled: bool,
    seconds: float,
    writer: dict[str, Any] | None = None,
    concurrent: bool = False,
    environment: Mapping[str, Any] | None = None,
    returned: str | None = None,
) -> dict[str, Any]:
    """Return the manifest mapping of a new entry, of format :data:`FORMAT_VERSION` (see docs/format.md).

    ``writer`` is :meth:`skipweave.store.identity.Writer.as_manifest` (this process when ``None``);
    ``concurrent`` says another thread called the target at the same step while this call ran; ``environment`` what
    the call ran with (:mod:`skipweave.store.format.environment`), left out when ``None``; ``fingerprint_rule`` how
    ``fingerprint`` was taken (:data:`~skipweave.store.format.versions.FINGERPRINT_RULES`; no default: an entry
    written again, by ``migrate`` or a resume, keeps its digest and so the rule it was taken with, format 1's
    ``arguments``, while a new recording's is its call's, so every writer must say which); ``returned`` is
    :data:`RETURNED_AWAITABLE` when a plain ``def`` target returned an awaitable whose value is the recorded result.
    """
    versions = library_versions()
    manifest = {
        "format_version": FORMAT_VERSION,
        "skipweave_version": versions.get("skipweave", "unknown"),
        "role": role,
        "target": target,
        "target_path": target_path,
        "step": step,
        "call_index": call,
        "shard": shard,
        "input_fingerprint": fingerprint,
        "fingerprint_rule": fingerprint_rule,
        "payload": [{"name": f.name, "bytes": f.bytes, "checksum": f.checksum} for f in files],
        "pickled": pickled,
        "generation_seconds": seconds,
        "versions": versions,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_unix": time.time(),
        "writer": writer if writer is not None else this_writer().as_manifest(),
        "concurrent": concurrent,
    }
    if environment is not None:
        manifest["environment"] = environment
    if returned is not None:
        manifest["returned"] = returned
    return manifest


def read_manifest(path: str) -> dict[str, Any]:
    """Read and structurally check a manifest.

    Raises:
        FileNotFoundError: no manifest (the entry was never committed).
        EntryForeign: a format version this skipweave does not read (the entry is kept as it is).
        EntryInvalid: unreadable JSON, no version number, or missing fields.
    """
    return check_structure(read_json(path, MANIFEST_MAX_BYTES, "manifest"), path)


def read_json(path: str, limit: int, what: str) -> Any:
    """Parse a JSON file of at most ``limit`` bytes, opened without following a symlink (a manifest, a group file).

    Raises:
        FileNotFoundError: no such file.
        EntryInvalid: unreadable, larger than ``limit``, or not JSON (``what`` names the file in the message).
    """
    try:
        # bytes, not text: a field written with surrogates (an ``argv0`` holding a byte that is not UTF-8) is read
        # back by jsonio.loads, which a strict UTF-8 text read would refuse (see skipweave.store.format.jsonio)
        with open(open_regular(path), "rb") as fh:
            if os.fstat(fh.fileno()).st_size > limit:
                raise ValueError(f"larger than {limit} bytes")
            return jsonio.loads(fh.read())
    except FileNotFoundError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise EntryInvalid(f"{what} {path} is unreadable: {exc}") from exc


def check_structure(data: Any, path: str) -> dict[str, Any]:
    """Check that parsed JSON is shaped like a manifest of a format version this skipweave reads, as
    :func:`read_manifest` does (also for the entries a group file holds, see :mod:`skipweave.store.format.group`);
    return it. The fields a version requires are the same in versions 1 and 2 (2 only adds optional ones).

    Raises:
        EntryForeign: a format version this skipweave does not read
            (:func:`~skipweave.store.format.versions.version_of`).
        EntryInvalid: no version number, a missing field, or a malformed payload list.
    """
    version_of(data, path)
    for field in ("role", "target", "step", "call_index", "shard", "payload", "input_fingerprint"):
        if field not in data:
            raise EntryInvalid(f"manifest {path} lacks '{field}'")
    payload = data["payload"]
    if not isinstance(payload, list) or not all(
        isinstance(item, dict)
        and isinstance(item.get("name"), str)
        and "/" not in item["name"]
        and isinstance(item.get("bytes"), int)
        and isinstance(item.get("checksum"), str)
        for item in payload
    ):
        raise EntryInvalid(f"manifest {path} has a malformed payload list (each item needs name, bytes, checksum)")
    return data


def check_identity(manifest: dict[str, Any], path: str, *, role: str, target: str, step: int, call: int,
                   shard: str) -> None:
    """Refuse a manifest that belongs to another entry (copied or swapped in place).

    Raises:
        EntryInvalid: naming the field whose recorded value differs from the key it was read for.
    """
    expected = {"role": role, "target": target, "step": step, "call_index": call, "shard": shard}
    for field, want in expected.items():
        got = manifest.get(field)
        if got != want or type(got) is not type(want):
            raise EntryInvalid(
                f"manifest {path} belongs to another entry: {field}={got!r}, expected {want!r}"
            )


_OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "generation_seconds": (float, int),
    "created_unix": (float, int),
    "created": (str,),
    "target_path": (str,),
    "versions": (dict,),
    "writer": (dict,),
    "skipweave_version": (str,),
}
"""Optional manifest fields and the types they must have when present: a run and the CLI read them, so a
value of another type (``"generation_seconds": "fast"``) makes the entry invalid instead of failing there."""


def _finite(value: Any) -> bool:
    """A number a float holds, finite (an int beyond a float's range is not: ``float()`` of it raises)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def seconds_of(manifest: dict[str, Any], field: str = "generation_seconds") -> float:
    """A non-negative finite number of seconds from a manifest field, 0.0 when missing or not one."""
    value = manifest.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    if not _finite(value):
        return 0.0
    value = float(value)
    return value if value >= 0 else 0.0


@dataclass(frozen=True)
class CheckedManifest:
    """A manifest that passed :func:`check_manifest`: the manifest and its two payload items."""

    manifest: dict[str, Any]
    tree: dict[str, Any]
    tensors: dict[str, Any]


def check_manifest(manifest: dict[str, Any], path: str, key: EntryKey, *, allow_pickle: bool) -> CheckedManifest:
    """Decide whether a readable manifest may be served for ``key``: the one judgement of runs and the CLI.

    Checks, in order: the manifest names this very entry (role, target, step, call index, shard; see
    :func:`check_identity`), its payload is exactly one tree file and one tensor file whose names carry the
    entry's stem (``r0-0003.<token>.tree.json``, ``r0-0003.<token>.tensors.safetensors`` or its compressed form
    ``...safetensors.zst``: no other file, no
    path), and it holds no pickled data unless ``allow_pickle``. The payload bytes are checked by the reader
    (:func:`verify_payload`, or the store's verified read).

    Args:
        manifest: what :func:`read_manifest` returned.
        path: the manifest's path, for messages.
        key: the entry the manifest was read for (from where it sits).
        allow_pickle: the role's ``allow_pickle``.

    Returns:
        The :class:`CheckedManifest`.

    Raises:
        EntryRefused: the entry claims pickled data and ``allow_pickle`` is off.
        EntryInvalid: any other reason, named in the message.
    """
    items: dict[str, dict[str, Any]] = {}
    check_identity(manifest, path, role=key.role, target=key.target, step=key.step, call=key.call,
                   shard=key.shard)
    for item in manifest["payload"]:
        parsed = parse_payload_name(item["name"])
        if parsed is None or parsed[0] != key.stem or parsed[1] in items:
            raise EntryInvalid(
                f"manifest {path} lists payload file {item['name']!r}, which is not one of this entry's "
                f"({key.stem}.<token>.tree.json and {key.stem}.<token>.tensors.safetensors, once each)"
            )
        if item["bytes"] < 0:
            raise EntryInvalid(f"manifest {path} gives payload {item['name']!r} a negative size")
        items[parsed[1]] = item
    tensor_kinds = [k for k in items if k.startswith("tensors.")]
    if set(items) != {"tree.json", *tensor_kinds} or len(tensor_kinds) != 1:
        raise EntryInvalid(f"manifest {path} lists no tree or tensor file, or two tensor files")
    check_fields(manifest, path, key, allow_pickle=allow_pickle)
    return CheckedManifest(manifest, items["tree.json"], items[tensor_kinds[0]])


def check_fields(manifest: dict[str, Any], path: str, key: EntryKey, *, allow_pickle: bool) -> None:
    """The checks of :func:`check_manifest` that do not concern payload files: the optional fields' types, the
    input fingerprint, and pickled data against ``allow_pickle`` (entries of a group file are judged with it too,
    see :mod:`skipweave.store.format.group`).

    Raises:
        EntryRefused: the entry claims pickled data and ``allow_pickle`` is off.
        EntryInvalid: a field has a value of the wrong type.
    """
    for field, kinds in _OPTIONAL_TYPES.items():
        value = manifest.get(field)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)
                                  or (float in kinds and not _finite(value))):
            raise EntryInvalid(f"manifest {path} has {field}={value!r:.80}, not a {kinds[0].__name__}")
    rule = manifest.get("fingerprint_rule", "signature")
    if reader_of(manifest).names_rule and rule not in FINGERPRINT_RULES:
        raise EntryInvalid(f"manifest {path} has fingerprint_rule={rule!r:.80}, expected "
                           f"one of {', '.join(FINGERPRINT_RULES)}")
    if manifest.get("returned") not in (None, RETURNED_AWAITABLE):
        raise EntryInvalid(f"manifest {path} has returned={manifest.get('returned')!r:.80}, expected "
                           f"{RETURNED_AWAITABLE!r}")
    if not isinstance(manifest.get("input_fingerprint"), str):
        raise EntryInvalid(f"manifest {path} has an input_fingerprint that is not a string")
    pickled = manifest.get("pickled", False)
    if not isinstance(pickled, bool):
        raise EntryInvalid(f"manifest {path} has pickled={pickled!r}, expected true or false")
    check_pickle(manifest, path, key, allow_pickle=allow_pickle)


def check_pickle(manifest: dict[str, Any], path: str, key: EntryKey, *, allow_pickle: bool) -> None:
    """The last check of :func:`check_fields`: pickled data against ``allow_pickle``. Alone for a manifest that
    passed :func:`check_fields` with ``allow_pickle=True`` already (a group's entries, judged once per group file
    by :func:`~skipweave.store.format.group.check_group`), the only part of the judgement that depends on the reader.

    Raises:
        EntryRefused: the entry claims pickled data and ``allow_pickle`` is off.
    """
    if manifest.get("pickled", False) is True and not allow_pickle:
        raise EntryRefused(
            f"entry {path} was recorded with allow_pickle=true; loading it would unpickle data, which can run "
            f"arbitrary code. Set skip.{key.role}.allow_pickle=true if you trust this recording"
        )


def verify_payload(folder: str, manifest: dict[str, Any], *, checksums: bool = True) -> None:
    """Check that every payload file is a regular file (no symlink) with the recorded size (and checksum).

    Raises:
        EntryInvalid: naming the first file that is missing, not a regular file, truncated or corrupt.
    """
    for item in manifest["payload"]:
        path = os.path.join(folder, item["name"])
        with open_payload(path, item["bytes"]) as fh:
            if not checksums:
                continue
            try:
                matches = _stream_checksum(fh) == item["checksum"]
            except OSError as exc:
                raise EntryInvalid(f"payload {path} is unreadable: {exc}") from None
            if not matches:
                raise EntryInvalid(f"payload {path} does not match its checksum {item['checksum']}")


__all__ = ["CHECKSUM_ALGORITHM", "FORMAT_VERSION", "MANIFEST_MAX_BYTES", "RETURNED_AWAITABLE", "CheckedManifest",
           "EntryInvalid", "EntryRefused", "PayloadFile", "build_manifest", "bytes_checksum", "check_fields",
           "check_identity", "check_manifest", "check_pickle", "check_structure", "checksum_digest", "file_checksum",
           "library_versions", "new_hasher", "read_json", "read_manifest", "seconds_of", "verify_payload"]
