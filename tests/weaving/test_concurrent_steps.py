"""Many steps in flight at once (verl's fully-async rollouter, DAPO's several calls per step): every recorded
call is kept after a clean exit, and the next run replays them all."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
from pathlib import Path
from typing import Any

import skipweave

HOST = '''
import asyncio
import random
import torch

CALLS = []


class Batch:
    def __init__(self, step, i=0, delay=None):
        self.batch = {"x": torch.arange(3) + step}
        self.non_tensor_batch = {}
        self.meta_info = {"global_steps": step, "i": i, "delay": delay}


class Rollout:
    async def generate_sequences(self, prompts):
        CALLS.append(prompts.meta_info["global_steps"])
        delay = prompts.meta_info["delay"]
        await asyncio.sleep(random.random() * 0.01 if delay is None else delay)  # the calls of many steps interleave
        out = Batch(prompts.meta_info["global_steps"], prompts.meta_info["i"])
        out.batch["y"] = torch.rand(2)
        return out
'''


def _gather(m: Any, plan: list[tuple[int, int]], delays: dict[int, float] | None = None) -> list[Any]:
    async def main() -> list[Any]:
        r = m.Rollout()
        return list(await asyncio.gather(*(
            r.generate_sequences(m.Batch(step, i, (delays or {}).get(step))) for step, i in plan
        )))

    return asyncio.run(main())


def test_the_step_with_most_calls_finishing_last_does_not_make_the_others_incomplete(
    host_module: Any, tmp_path: Path, caplog: Any,
) -> None:
    """The case from the field: step 1 makes 2 calls, steps 2 and 3 one each, all in flight at once."""
    name, _ = host_module(HOST)
    m = sys.modules[name]
    plan = [(1, 0), (1, 1), (2, 0), (3, 0)]
    delays = {1: 0.05, 2: 0.0, 3: 0.0}  # step 1's calls are recorded last
    cfg = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path),
                                "targets": {"gen": f"{name}:Rollout.generate_sequences"}}}}
    skipweave.weave(cfg)
    _gather(m, plan, delays)
    skipweave.unweave()
    m.CALLS.clear()
    caplog.set_level(logging.WARNING, logger="skipweave")
    skipweave.weave(cfg)
    _gather(m, plan, delays)
    skipweave.unweave()
    assert m.CALLS == [] and "left incomplete" not in caplog.text


def test_fifty_concurrent_steps_of_one_to_three_calls_lose_nothing(host_module: Any, tmp_path: Path,
                                                                    caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    rng = random.Random(3)
    plan = [(step, i) for step in range(1, 51) for i in range(rng.randint(1, 3))]
    rng.shuffle(plan)
    cfg = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path),
                                "targets": {"gen": f"{name}:Rollout.generate_sequences"}}}}
    skipweave.weave(cfg)
    first = _gather(m, plan)
    skipweave.unweave()  # a clean exit closes every part this process opened
    assert sorted(m.CALLS) == sorted(s for s, _ in plan)
    m.CALLS.clear()
    caplog.set_level(logging.WARNING, logger="skipweave")
    skipweave.weave(cfg)
    again = _gather(m, plan)
    skipweave.unweave()
    assert m.CALLS == []  # every call replayed
    assert "left incomplete" not in caplog.text and "set aside" not in caplog.text
    assert [o.meta_info["skipweave"]["status"] for o in again] == ["hit"] * len(plan)
    by_step: dict[int, list[Any]] = {}
    for (step, _), out in zip(plan, again, strict=True):
        by_step.setdefault(step, []).append(out.batch["y"])
    rec: dict[int, list[Any]] = {}
    for (step, _), out in zip(plan, first, strict=True):
        rec.setdefault(step, []).append(out.batch["y"])
    for step, ys in by_step.items():  # the calls of a step come back as recorded (in call-index order)
        assert sorted(y.tolist() for y in ys) == sorted(y.tolist() for y in rec[step])


KILLED = '''
import os, sys
sys.path.insert(0, sys.argv[1])
import skipweave, {name} as host
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": sys.argv[2], "step": {{"source": "set_step"}},
                          "targets": {{"gen": "{name}:gen"}}}}}}}})
for step in range(1, 11):
    skipweave.set_step(step)
    for _ in range(int(sys.argv[3]) if step == 10 else 2):
        host.gen(step)
skipweave.flush()  # every call's entry committed (a kill loses what is still pending)
os.kill(os.getpid(), 9)  # right after step 10's calls: nothing is closed at exit
'''


def test_a_killed_runs_complete_last_step_is_kept_and_a_partial_one_resumed(host_module: Any,
                                                                           tmp_path: Path) -> None:
    import subprocess

    name, folder = host_module("CALLS = []\ndef gen(n):\n    CALLS.append(n)\n    return {'n': n}\n")
    m = sys.modules[name]
    # 1 of 2 calls of step 10: its entry serves the first call with its inputs, only the second runs live
    # (tests/store/test_resume.py: the whole part is set aside when its entries cannot be matched by inputs)
    for last_calls, expect_live in ((2, []), (1, [10])):
        dump = tmp_path / f"dump{last_calls}"
        proc = subprocess.run([sys.executable, "-c", KILLED.format(name=name), str(folder), str(dump),
                               str(last_calls)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -9, proc.stderr
        m.CALLS.clear()
        skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "step": {"source": "set_step"},
                                              "targets": {"gen": f"{name}:gen"}}}})
        for step in range(1, 11):
            skipweave.set_step(step)
            m.gen(step)
            m.gen(step)
        skipweave.unweave()
        assert m.CALLS == expect_live  # 2 of 2 calls: served; 1 of 2: resumed
        if last_calls == 1:  # completed by this run, closed for the next
            assert '"closed"' in (dump / "default" / "rollout" / "10" / "gen" / "r0.part.json").read_text()


INTERRUPTED = '''
import sys
sys.path.insert(0, sys.argv[1])
import skipweave, {name} as host
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": sys.argv[2], "step": {{"source": "set_step"}},
                          "targets": {{"gen": "{name}:gen"}}}}}}}})
skipweave.set_step(1)
host.gen(1)
host.gen(1)
skipweave.set_step(2)
host.gen(2)
host.STOP["how"] = sys.argv[3]
host.gen(2)  # interrupted inside the real call; the interpreter then exits normally (atexit runs)
'''


def test_a_step_interrupted_inside_a_call_is_never_closed(host_module: Any, tmp_path: Path, caplog: Any) -> None:
    """Ctrl-C, or a preemption handler's sys.exit, during a call: the step is left open, so the next run judges it
    by its calls and resumes it (the entry it holds serves the call with its inputs; the interrupted call runs)."""
    import subprocess

    name, folder = host_module('''
import sys
CALLS = []
STOP = {}


def gen(n):
    CALLS.append(n)
    how = STOP.pop("how", None)
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "sigterm":
        sys.exit(143)
    return {"n": n, "call": len(CALLS)}
''')
    m = sys.modules[name]
    for how in ("interrupt", "sigterm"):
        dump = tmp_path / how
        proc = subprocess.run([sys.executable, "-c", INTERRUPTED.format(name=name), str(folder), str(dump), how],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0, proc.stderr
        m.CALLS.clear()
        caplog.clear()
        caplog.set_level(logging.INFO, logger="skipweave")
        skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "step": {"source": "set_step"},
                                              "targets": {"gen": f"{name}:gen"}}}})
        for step in (1, 2):
            skipweave.set_step(step)
            m.gen(step)
            m.gen(step)
        skipweave.unweave()
        assert m.CALLS == [2], how  # step 1 replayed; step 2's recorded call served, the interrupted one live
        assert "left incomplete by an interrupted run (1 of 2 calls committed and never closed); resuming it" \
            in caplog.text
