"""What verifying a call adds, for a verl-sized batch: the recording's read and the comparison, beside a raw read.

    python -m bench.verify_cases --mb 250 --rounds 5 --dir /tmp/x

Prints one JSON line: per case, the seconds of every round. The batch is recorded once; then each round, the cases
taking turns (the order rotating), with the files in the page cache (a verify run reads what the recording run
wrote, typically right after it or from a warm cache):

* ``raw_read`` -- the raw bytes of the batch (every tensor's buffer and the codec's JSON tree) read into one buffer;
* ``skipweave_load`` -- ``StepStore.load`` of the recording (checksums, decode): the read a verify call makes;
* ``compare_identical`` -- :func:`skipweave.verify.compare.compare` of the recording with an equal live batch (the
  common case of a verify run: nothing changed);
* ``compare_diverged`` -- the same with one token and every log-prob changed (where the details are computed).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from bench.common import sized_main
from bench.io_cases import _load, _record, _store, raw_buffers, raw_read, raw_write
from bench.payload import make_batch, sequences_for

CASES = ("raw_read", "skipweave_load", "compare_identical", "compare_diverged")


def run(mb: float, rounds: int, folder: str) -> dict[str, Any]:
    """Every case once per round, the order rotating; returns per-case seconds by round."""
    from skipweave.verify.compare import compare

    os.makedirs(folder, exist_ok=True)
    try:
        n = sequences_for(mb)
        live = make_batch(n)
        store = _store(os.path.join(folder, "store"))
        _record(store, 1, live)
        raw = os.path.join(folder, "raw")
        raw_write(raw, raw_buffers(live))
        key = store.key(1, "gen", "r0", 0)
        recorded = _load(store, key)
        changed = make_batch(n)
        changed.batch["input_ids"][n // 2, 4000] += 1
        changed.batch["old_log_probs"] += 1e-3
        outcomes = {"compare_identical": compare(recorded, live).status,
                    "compare_diverged": compare(recorded, changed).status}
        cases: dict[str, Callable[[], Any]] = {
            "raw_read": functools.partial(raw_read, raw),
            "skipweave_load": functools.partial(_load, store, key),
            "compare_identical": functools.partial(compare, recorded, live),
            "compare_diverged": functools.partial(compare, recorded, changed),
        }
        for case in ("raw_read", "skipweave_load"):  # warm the page cache
            cases[case]()
        seconds: dict[str, list[float]] = {case: [] for case in CASES}
        for r in range(rounds):
            k = r % len(CASES)
            for case in CASES[k:] + CASES[:k]:
                t0 = time.perf_counter()
                out = cases[case]()
                seconds[case].append(time.perf_counter() - t0)
                del out
        return {"mb": mb, "sequences": n, "rounds": rounds, "seconds": seconds, "outcomes": outcomes,
                "disk_bytes": sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store.dump_dir)
                                  for f in fs)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sized_main(__doc__, run, mb=250.0)
