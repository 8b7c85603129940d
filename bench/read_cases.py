"""A verified replay of a verl-sized batch beside the floors of reading its files: the ``reads`` section.

    python -m bench.read_cases --mb 250 --rounds 9 --dir /tmp/x
    python -m bench.read_cases --peak --dir /tmp/x/store      # one fresh process: the replay's peak memory

Prints one JSON line. The batch (int64 ids, masks and positions, float32 and bfloat16 log-probs, strings and dicts:
``bench.payload``) is recorded once with ``StepStore.record``; then, each round, the cases take turns (the order
rotating), so each round gives paired ratios measured under the same load:

* ``skipweave_load.warm`` -- ``StepStore.load`` (manifest checked, payload checksummed, tensors built, tree decoded:
  the store's real read path) with the entry's files in the page cache;
* ``mmap_xxh3.warm`` -- every payload file of the entry (its tree and tensor files) mapped and hashed with xxh3_128:
  the floor of any verified read;
* ``skipweave_touch.warm`` -- the replay, then one byte of every page of every tensor read: what the host's first
  pass over a mapped result adds (information, no target);
* ``skipweave_load.cold`` and ``raw_read.cold`` -- the replay, and a raw ``read()`` of the same payload files into
  one freshly allocated buffer, each after the files were dropped from the page cache
  (``posix_fadvise(DONTNEED)``): a replay on a machine where the recording is not cached.

``--peak`` loads the entry once in a fresh process and reports how much its peak resident memory (``VmHWM``) grew
over what the process held before: right after the replay, and after every page of every tensor was touched once
(a mapped tensor's pages count once read). The parent runs it in several processes.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import ROOT, child_env, emit, evict, files_under, peak_bytes, rss_bytes
from bench.io_cases import _record, _store, raw_read
from bench.payload import make_batch, sequences_for

WARM = ("skipweave_load", "mmap_xxh3", "skipweave_touch")
COLD = ("skipweave_load", "raw_read")
PAGE = mmap.PAGESIZE


def mmap_xxh3(paths: list[str]) -> str:
    """Map each file read-only and hash it with xxh3_128 (the checksum skipweave's manifests use)."""
    import xxhash

    digests = []
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if not size:
                digests.append(xxhash.xxh3_128(b"").hexdigest())
                continue
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as m:
                digests.append(xxhash.xxh3_128(m).hexdigest())
    return ",".join(digests)


def raw_read_all(paths: list[str]) -> list[Any]:
    """Each file read whole into one freshly allocated buffer (``bench.io_cases.raw_read``)."""
    return [raw_read(p) for p in paths]


def tensors_of(obj: Any) -> list[Any]:
    """The tensors of a replayed batch (``batch`` values of a DataProto-like object)."""
    return [t for t in obj.batch.values()]


def touch(obj: Any) -> int:
    """Read one byte of every page of every tensor of ``obj`` (a first pass over a mapped result); returns a sum so
    that nothing is optimised away."""
    import torch

    total = 0
    for t in tensors_of(obj):
        flat = t.reshape(-1).view(torch.uint8)
        total += int(flat[::PAGE].sum())
    return total


def _load(store: Any, key: Any) -> Any:
    return store.load(key).result


def _load_touch(store: Any, key: Any) -> Any:
    out = store.load(key).result
    touch(out)
    return out


def run(mb: float, rounds: int, folder: str, peaks: int) -> dict[str, Any]:
    """Record the batch, then every case once per round (the order rotating); returns seconds by case and round,
    the sizes and the peak memory of ``peaks`` fresh replaying processes."""
    os.makedirs(folder, exist_ok=True)
    n = sequences_for(mb)
    obj = make_batch(n)
    batch_bytes = sum(int(t.numel() * t.element_size()) for t in tensors_of(obj))
    root = os.path.join(folder, "store")
    store = _store(root)
    _record(store, 1, obj)
    del obj
    gc.collect()
    key = store.key(1, "gen", "r0", 0)
    entry = files_under(root)
    payload = sorted(p for p in entry if p.endswith((".tree.json", ".safetensors")))
    cases: dict[str, Callable[[], Any]] = {
        "skipweave_load": functools.partial(_load, store, key),
        "mmap_xxh3": functools.partial(mmap_xxh3, payload),
        "skipweave_touch": functools.partial(_load_touch, store, key),
        "raw_read": functools.partial(raw_read_all, payload),
    }
    slots = [(c, "warm") for c in WARM] + [(c, "cold") for c in COLD]
    seconds: dict[str, list[float]] = {f"{c}.{cache}": [] for c, cache in slots}
    for r in range(rounds):
        k = r % len(slots)
        for case, cache in slots[k:] + slots[:k]:
            if cache == "cold":
                evict(entry)
            else:
                for p in entry:
                    with open(p, "rb") as fh:
                        while fh.read(64 << 20):
                            pass
            gc.collect()
            t0 = time.perf_counter()
            out = cases[case]()
            seconds[f"{case}.{cache}"].append(time.perf_counter() - t0)
            del out
    peak = [_peak_child(root) for _ in range(peaks)]
    return {"mb": mb, "sequences": n, "rounds": rounds, "seconds": seconds, "batch_bytes": batch_bytes,
            "payload_bytes": sum(os.path.getsize(p) for p in payload), "peak": peak}


def _peak_child(root: str) -> dict[str, int]:
    """Run ``--peak`` in a fresh process; its JSON line."""
    proc = subprocess.run([sys.executable, "-m", "bench.read_cases", "--peak", "--dir", root], capture_output=True,
                          text=True, env=child_env(), cwd=str(ROOT), timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"peak child exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    out: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def peak(root: str) -> dict[str, int]:
    """In this (fresh) process: the peak RSS the replay added, right after it and after touching every page."""
    store = _store(root)
    key = store.key(1, "gen", "r0", 0)
    store.recorded_steps("gen", "r0")  # the store's own set-up (listings), not the replay's memory
    gc.collect()
    before = rss_bytes()
    out = _load(store, key)
    after_load = peak_bytes() - before
    touch(out)
    after_touch = peak_bytes() - before
    return {"load": after_load, "touched": after_touch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=250.0, help="batch size in MB of tensors")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peaks", type=int, default=3, help="fresh processes measuring the replay's peak memory")
    parser.add_argument("--dir", required=True, help="a scratch folder (deleted afterwards); with --peak, the store")
    parser.add_argument("--peak", action="store_true", help="measure one replay's peak memory in this process")
    args = parser.parse_args()
    if args.peak:
        # imported before the baseline (the replay's memory, not the modules'); tensordict also because decoding
        # resolves only classes of modules the process imported
        import tensordict

        import skipweave.store.format.codec
        import skipweave.store.format.tensorfile

        del tensordict, skipweave
        emit(peak(args.dir))
        return
    try:
        emit(run(args.mb, args.rounds, args.dir, args.peaks))
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
