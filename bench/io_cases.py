"""Record and replay of one batch size, every writer and reader taking turns in one process.

    python -m bench.io_cases --mb 250 --rounds 7 --dir /tmp/x [--cache cold,warm] [--cases raw_write,...]

Prints one JSON line: per case, the seconds and peak extra RSS of every round.

Why one process with rounds: the machine is shared and its speed drifts by 2-4x within minutes. Each
round runs every case once, back to back (the order rotates from round to round), so each round gives
a *paired* ratio skipweave/raw measured under the same conditions; the ratios reported are medians of
those. The process is started with ``MALLOC_MMAP_THRESHOLD_`` at 1 MiB, so every large block is mapped
fresh and returned to the system when freed: no case inherits another's touched memory, and the peak
RSS of each case is its own (``VmHWM`` is reset before each measurement, see ``bench.common``).

Cases:

* writers (the batch is in memory; the peak counted is what the writer adds to it):
  ``raw_write`` -- the same bytes skipweave writes (every tensor's buffer and the codec's JSON tree)
  written back to back to one file, then fsync: the floor any format can reach;
  ``skipweave_record`` -- ``StepStore.record`` (encode, write, checksums, fsyncs, manifest, commit);
  ``torch_save`` -- ``torch.save`` of the whole object, then fsync;
  ``pickle_dump`` -- ``pickle.dump`` of the object (verl's ``DataProto.save_to_disk``), then fsync.
* readers (each reads what its writer wrote during set-up; the peak counted includes the loaded object):
  ``raw_read`` -- the raw file read into one freshly allocated buffer (``readinto``);
  ``skipweave_load`` -- ``StepStore.load``: verify checksums, every byte in memory, decode;
  ``torch_load`` -- ``torch.load(weights_only=False)``; ``pickle_load`` -- ``pickle.load`` (verl).

``--cache cold`` evicts the files from the page cache before every read (``posix_fadvise(DONTNEED)``:
a read from disk, as in a new run on a machine with other jobs); ``warm`` reads them once first (a replay
right after the record, or a small dump dir on a big machine).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import emit, evict, files_under, peak_bytes, reset_peak, rss_bytes
from bench.payload import DataProto, make_batch, sequences_for

WRITE_CASES = ("raw_write", "skipweave_record", "torch_save", "pickle_dump")
READ_CASES = ("raw_read", "skipweave_load", "torch_load", "pickle_load")


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


def raw_buffers(obj: DataProto) -> list[memoryview]:
    """The bytes skipweave would write for ``obj``: every tensor's buffer plus the codec's JSON tree."""
    from skipweave.store.format import codec

    enc = codec.encode({"result": obj, "rng": None})
    tree = json.dumps(enc.tree, separators=(",", ":")).encode()
    views = [t.reshape(-1).view(torch.uint8).numpy().data for t in enc.tensors.values()]
    return [*views, memoryview(tree)]


def raw_write(path: str, buffers: list[memoryview]) -> None:
    """Write the buffers back to back into one file, 1 MiB per call, and fsync it.

    Calls of 1-16 MiB are what the kernel digests best here: one ``write`` of a whole 64 MB tensor was
    slower (the raw floor must be the fastest plain writer, not a strawman).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for b in buffers:
            for i in range(0, len(b), 1 << 20):
                _write_all(fd, b[i:i + (1 << 20)])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: str) -> torch.Tensor:
    """Read a whole file into one freshly allocated buffer."""
    size = os.path.getsize(path)
    buf = torch.empty(size, dtype=torch.uint8)
    view = buf.numpy().data
    with open(path, "rb", buffering=0) as fh:
        got = 0
        while got < size:
            n = fh.readinto(view[got:])
            if not n:
                raise OSError(f"{path} ended after {got} of {size} bytes")
            got += n
    return buf


def _fsync_close(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


def torch_save(path: str, obj: Any) -> None:
    """``torch.save`` of the whole object, then fsync."""
    fh = open(path, "wb")  # noqa: SIM115 - closed by _fsync_close
    torch.save(obj, fh)
    _fsync_close(fh)


def pickle_dump(path: str, obj: Any) -> None:
    """What verl's ``DataProto.save_to_disk`` does (``pickle.dump`` of the object), then fsync."""
    fh = open(path, "wb")  # noqa: SIM115 - closed by _fsync_close
    pickle.dump(obj, fh)
    _fsync_close(fh)


def pickle_load(path: str) -> Any:
    """What verl's ``DataProto.load_from_disk`` does: ``pickle.load``."""
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _store(folder: str) -> Any:
    from skipweave.store.step_store import StepStore

    return StepStore(folder, "bench", "rollout")


def _record(store: Any, step: int, obj: Any) -> int:
    key = store.key(step, "gen", "r0", 0)
    return int(store.record(key, obj, target_path="bench:gen", fingerprint="", rng_state=None, seconds=0.0))


def _load(store: Any, key: Any) -> Any:
    return store.load(key).result


def _measure(op: Callable[[], Any]) -> tuple[float, int]:
    """Seconds of ``op()`` and the peak RSS it added over the RSS before it (its result included)."""
    gc.collect()
    before = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    out = op()
    seconds = time.perf_counter() - t0
    extra = peak_bytes() - before
    del out
    return seconds, extra


def _disk(path: str) -> int:
    return sum(os.path.getsize(f) for f in files_under(path)) if os.path.isdir(path) else os.path.getsize(path)


class _Cases:
    """The batch, the files the readers read, and one callable per case."""

    def __init__(self, mb: float, folder: str) -> None:
        self.folder = folder
        self.n = sequences_for(mb)
        self.obj = make_batch(self.n)
        self.buffers = raw_buffers(self.obj)
        self.store = _store(os.path.join(folder, "record"))
        self.step = 0
        self.disk: dict[str, int] = {}
        src = os.path.join(folder, "src")
        os.makedirs(src, exist_ok=True)
        raw_write(os.path.join(src, "raw"), self.buffers)
        torch_save(os.path.join(src, "torch"), self.obj)
        pickle_dump(os.path.join(src, "pickle"), self.obj)
        self.load_store = _store(os.path.join(src, "skipweave"))
        _record(self.load_store, 1, self.obj)
        self.sources = {
            "raw_read": [os.path.join(src, "raw")],
            "skipweave_load": files_under(os.path.join(src, "skipweave")),
            "torch_load": [os.path.join(src, "torch")],
            "pickle_load": [os.path.join(src, "pickle")],
        }
        for case, files in self.sources.items():
            self.disk[case] = sum(os.path.getsize(f) for f in files)
        self.readers: dict[str, Callable[[], Any]] = {
            "raw_read": functools.partial(raw_read, os.path.join(src, "raw")),
            "skipweave_load": functools.partial(_load, self.load_store, self.load_store.key(1, "gen", "r0", 0)),
            "torch_load": functools.partial(torch.load, os.path.join(src, "torch"), weights_only=False),
            "pickle_load": functools.partial(pickle_load, os.path.join(src, "pickle")),
        }

    def write(self, case: str) -> tuple[float, int]:
        out = os.path.join(self.folder, "out")
        if case == "skipweave_record":
            self.step += 1
            seconds, peak = _measure(lambda: _record(self.store, self.step, self.obj))
            target = os.path.join(self.folder, "record", "bench", "rollout", str(self.step))
        else:
            writer: Callable[[], None] = {
                "raw_write": lambda: raw_write(out, self.buffers),
                "torch_save": lambda: torch_save(out, self.obj),
                "pickle_dump": lambda: pickle_dump(out, self.obj),
            }[case]
            seconds, peak = _measure(writer)
            target = out
        self.disk[case] = _disk(target)
        shutil.rmtree(target) if os.path.isdir(target) else os.unlink(target)
        return seconds, peak

    def read(self, case: str, cache: str) -> tuple[float, int]:
        files = self.sources[case]
        if cache == "cold":
            evict(files)
        else:
            for f in files:  # bring every page into the page cache
                with open(f, "rb") as fh:
                    while fh.read(64 << 20):
                        pass
        return _measure(self.readers[case])


def run(mb: float, rounds: int, folder: str, caches: tuple[str, ...], cases: list[str]) -> dict[str, Any]:
    """Every case once per round, the order rotating; returns per-case seconds and peaks by round."""
    os.makedirs(folder, exist_ok=True)
    try:
        c = _Cases(mb, folder)
        slots = [(case, "write") for case in cases if case in WRITE_CASES]
        slots += [(case, cache) for cache in caches for case in cases if case in READ_CASES]
        results: dict[str, dict[str, list[float]]] = {
            f"{case}.{slot}": {"seconds": [], "peak_extra": []} for case, slot in slots
        }
        for r in range(rounds):
            k = r % len(slots)
            for case, slot in slots[k:] + slots[:k]:
                s, p = c.write(case) if slot == "write" else c.read(case, slot)
                results[f"{case}.{slot}"]["seconds"].append(s)
                results[f"{case}.{slot}"]["peak_extra"].append(p)
        return {"mb": mb, "sequences": c.n, "rounds": rounds, "results": results, "disk_bytes": c.disk,
                "tensor_bytes": sum(len(b) for b in c.buffers[:-1]), "tree_bytes": len(c.buffers[-1])}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, required=True, help="batch size in MB of tensors")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", required=True, help="a scratch folder (deleted afterwards)")
    parser.add_argument("--cache", default="cold,warm", help="comma-separated page-cache states for reads")
    parser.add_argument("--cases", default=",".join(WRITE_CASES + READ_CASES))
    args = parser.parse_args()
    caches = tuple(c for c in args.cache.split(",") if c)
    if not caches or any(c not in ("cold", "warm") for c in caches):
        parser.error("--cache takes cold, warm or cold,warm")
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in WRITE_CASES + READ_CASES]
    if unknown or not cases:
        parser.error(f"unknown case(s) {unknown}; choose from {WRITE_CASES + READ_CASES}")
    emit(run(args.mb, args.rounds, args.dir, caches, cases))


if __name__ == "__main__":
    main()
