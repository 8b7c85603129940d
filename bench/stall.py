"""Event-loop stall while ``async`` calls record: a ticker's worst gap during concurrent recordings.

    python -m bench.stall [--calls 32] [--mb 8] [--rounds 3]

Prints one JSON line. An ``async def`` target returning ``--mb`` MB of int64 tokens is called ``--calls`` times
at once (``asyncio.gather``) into an empty store, while a ticker task sleeping 1 ms at a time notes the longest
gap between its wake-ups: how long the event loop was kept from every other task. The tensors are made before
the measurement, so the host itself blocks nothing. The same is measured for the target unwoven (the floor: the
loop's own scheduling) and for the replay of those recordings.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import time
from typing import Any

from bench.common import emit, write_host

HOST = '''
import asyncio

TOKENS = {}  # step -> its tokens, made before the measurement: the loop's stalls are skipweave's, not the fills'


async def generate(step, numel):
    await asyncio.sleep(0)
    return {"step": step, "tokens": TOKENS[step]}
'''


async def _worst_gap(calls: int, numel: int, first_step: int) -> tuple[float, float]:
    """(worst ticker gap, wall seconds of the gather), both in seconds."""
    import skipweave_bench_stall_host as host

    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    await asyncio.gather(*(host.generate(first_step + i, numel) for i in range(calls)))
    wall = time.perf_counter() - t0
    done = True
    await task
    return worst, wall


def measure(calls: int, mb: float, rounds: int) -> dict[str, Any]:
    """Run every case; returns ``{case: {"worst_s": [...], "wall_s": [...]}}``."""
    import skipweave

    logging.getLogger("skipweave").setLevel(logging.WARNING)
    name = "skipweave_bench_stall_host"
    work, host = write_host("skipweave-bench-stall-", name, HOST)
    numel = int(mb * (1 << 20)) // 8
    import torch

    host.TOKENS.update({1 + i: torch.full((numel,), 1 + i, dtype=torch.int64) for i in range(calls)})
    out: dict[str, dict[str, list[float]]] = {k: {"worst_s": [], "wall_s": []} for k in ("bare", "record", "replay")}
    for r in range(rounds):
        dump = os.path.join(work, f"dump{r}")
        plan = {"skip": {"rollout": {"enable": True, "dump_dir": dump, "step": {"source": "arg", "arg": 0, "path": ""},
                                     "targets": {"g": f"{name}:generate"}}}}
        for case in ("bare", "record", "replay"):
            skipweave.unweave()
            if case != "bare":
                skipweave.weave(plan)
            worst, wall = asyncio.run(_worst_gap(calls, numel, 1))
            out[case]["worst_s"].append(worst)
            out[case]["wall_s"].append(wall)
        skipweave.unweave()
        shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return {"cases": out, "calls": calls, "mb": mb, "counters": skipweave.counters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--mb", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    emit(measure(args.calls, args.mb, args.rounds))


if __name__ == "__main__":
    main()
