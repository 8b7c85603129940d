"""What the bundle tests share: a woven host recorded into a dump dir, and bundles crafted member by member."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

import skipweave
from skipweave.store.bundle.layout import COMMENT_PREFIX, MANIFEST_NAME
from skipweave.store.format.manifest import bytes_checksum

NS, ROLE, CALLS, STEPS = "default", "rollout", 2, (1, 2, 3)
HOST = '''
import random

import torch

CALLS = []


def gen(step, i):
    CALLS.append((step, i))
    noise = torch.randn(3)  # moves torch's generator: a replay must leave it where the real call did
    return {"ids": torch.full((4,), step * 100 + i), "noise": noise, "text": ["a", str(i)], "r": random.random()}
'''


def load_host(folder: Path, name: str = "bhost") -> Any:
    """Write the host module into ``folder`` (on ``sys.path``) and import it afresh."""
    (folder / f"{name}.py").write_text(HOST)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def role(dump: str, **more: Any) -> dict[str, Any]:
    """A cache role over the host's ``gen``, its step the ``step`` argument."""
    return {"enable": True, "dump_dir": dump, "targets": {"gen": "bhost:gen"},
            "step": {"source": "arg", "arg": "step", "path": ""}, "calls_per_step": CALLS, **more}


def run(host: Any, dump: str, steps: tuple[int, ...] = STEPS, **more: Any) -> tuple[list[Any], list[Any]]:
    """One woven run over ``steps``: every result and the random draws the host makes after each call, and the real
    calls made."""
    host.CALLS.clear()
    skipweave.weave({"skip": {ROLE: role(dump, **more)}})
    out: list[Any] = []
    try:
        torch.manual_seed(0)
        for step in steps:
            for i in range(CALLS):
                out.append(host.gen(step, i))
                out.append(torch.rand(2))  # what the host draws next: identical only if the RNG state was restored
    finally:
        skipweave.unweave()
    return out, list(host.CALLS)


def identical(a: list[Any], b: list[Any]) -> bool:
    """Bit-identical results (tensors by bytes, the rest by value)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            if x.keys() != y.keys() or x["text"] != y["text"] or x["r"] != y["r"]:
                return False
            if not all(torch.equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in ("ids", "noise")):
                return False
        elif not (torch.equal(x, y)):
            return False
    return True


def craft(path: Path, members: list[tuple[Any, bytes]], *, listed: list[dict[str, Any]] | None = None,
          manifest: dict[str, Any] | None = None, compress_type: int = zipfile.ZIP_STORED) -> Path:
    """Write a bundle holding ``members`` (``(name or ZipInfo, bytes)``) and a bundle manifest listing them (or
    ``listed``) with a matching comment: consistent in everything but the flaw a test plants."""
    if listed is None:
        names = [m[0].filename if isinstance(m[0], zipfile.ZipInfo) else m[0] for m in members]
        listed = [{"name": n, "bytes": len(d), "checksum": bytes_checksum(d)} for n, (_, d) in zip(names, members,
                                                                                                   strict=True)]
    doc = {"kind": "skipweave-bundle", "bundle_version": 1, "members": listed,
           "checksum": bytes_checksum(b"".join(d for _, d in members)), **(manifest or {})}
    data = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w", compression=compress_type) as zf:
        for name, payload in members:
            zf.writestr(name, payload)
        zf.writestr(MANIFEST_NAME, data, compress_type=zipfile.ZIP_STORED)
        zf.comment = (COMMENT_PREFIX + bytes_checksum(data)).encode()
    return path


def members_of(bundle: Path) -> list[tuple[str, bytes]]:
    """Every member of a bundle but its manifest, with its bytes."""
    with zipfile.ZipFile(bundle) as zf:
        return [(n, zf.read(n)) for n in zf.namelist() if n != MANIFEST_NAME]
