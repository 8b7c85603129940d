"""Many small entries: per-sample recording (verl's fully-async rollouter) and its replay, per entry.

    python -m bench.small --entries 2000 --kb 1 --rounds 3 --dir /tmp/x

Prints one JSON line. A woven function returns one sample of ``--kb`` KB of int64 token ids; it is called
``--entries`` times over 4 steps (the step from an argument, the calls of a step matched by call order), into
an empty store, then again to replay. Per round:

* ``record``: seconds per entry from the first call until ``skipweave.flush()`` returned (every entry
  committed): the amortized cost, what the host pays once the writer's buffer is full;
* ``record_return``: seconds per entry the calls themselves took (the writer working behind them);
* ``through``: seconds per entry with ``write_buffer: 0`` (each entry written and fsynced before its call
  returns), for comparison;
* ``hit``: seconds per entry of the replay;
* ``record_norng``, ``return_norng``, ``hit_norng``: ``record``, ``record_return`` and ``hit`` with ``restore_rng:
  false``, so no generator is even looked at: what watching the RNG state costs per entry;
* ``record_draws``, ``return_draws``, ``hit_draws``: the same with a function that draws from torch's generator at
  every call, so torch's state (5 KiB) is recorded with every entry and restored at every hit.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from typing import Any

from bench.common import emit, write_host

HOST = '''
import torch

SAMPLE = None


def sample(step, i):
    return {"ids": SAMPLE, "index": i}


def sample_drawing(step, i):
    torch.rand(1)  # e.g. sampling in the call: torch's generator moves
    return {"ids": SAMPLE, "index": i}
'''

STEPS = 4


def _run(host: Any, entries: int, fn: str = "sample") -> float:
    per_step = entries // STEPS
    call = getattr(host, fn)
    t0 = time.perf_counter()
    for step in range(1, STEPS + 1):
        for i in range(per_step):
            call(step, i)
    return time.perf_counter() - t0


def measure(entries: int, kb: float, rounds: int, folder: str) -> dict[str, Any]:
    """Run every case ``rounds`` times; ``{case: [seconds per entry, ...]}``."""
    import torch

    import skipweave

    logging.getLogger("skipweave").setLevel(logging.WARNING)
    name = "skipweave_bench_small_host"
    work, host = write_host("skipweave-bench-small-", name, HOST)
    host.SAMPLE = torch.arange(int(kb * 1024) // 8, dtype=torch.int64)
    entries -= entries % STEPS
    out: dict[str, list[float]] = {"record": [], "record_return": [], "through": [], "hit": [], "record_norng": [],
                                   "return_norng": [], "hit_norng": [], "record_draws": [], "return_draws": [],
                                   "hit_draws": []}
    # case -> (write_buffer, restore_rng, the keys of its call's own return and of its replay, the function)
    cases = {"record": (None, True, "record_return", "hit", "sample"), "through": (0, True, None, None, "sample"),
             "record_norng": (None, False, "return_norng", "hit_norng", "sample"),
             "record_draws": (None, True, "return_draws", "hit_draws", "sample_drawing")}
    try:
        for r in range(rounds):
            for case, (buffer, rng, returns, hits, fn) in cases.items():
                dump = os.path.join(folder, f"{case}{r}")
                role: dict[str, Any] = {"enable": True, "dump_dir": dump, "step": {"source": "arg", "arg": 0,
                                                                                  "path": ""},
                                        "calls_per_step": entries // STEPS, "targets": {"s": f"{name}:{fn}"},
                                        "restore_rng": rng}
                if buffer is not None:
                    role["write_buffer"] = buffer
                plan = {"skip": {"rollout": role}}
                skipweave.weave(plan)
                t0 = time.perf_counter()
                returned = _run(host, entries, fn)
                skipweave.flush()
                total = time.perf_counter() - t0
                skipweave.unweave()
                out[case].append(total / entries)
                if returns is not None and hits is not None:
                    out[returns].append(returned / entries)
                    before = skipweave.counters()["hits"]
                    skipweave.weave(plan)
                    out[hits].append(_run(host, entries, fn) / entries)
                    skipweave.unweave()
                    assert skipweave.counters()["hits"] - before == entries, "the replay missed entries"
                shutil.rmtree(dump, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"cases": out, "entries": entries, "kb": kb, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--kb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    emit(measure(args.entries, args.kb, args.rounds, args.dir))


if __name__ == "__main__":
    main()
