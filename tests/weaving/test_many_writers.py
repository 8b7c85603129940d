"""Many writers of one target at one step: threads and processes, with and without ``RANK``.

Every writer must get its own result back: in the recording run (never another writer's fresh entry) and in
the replay (whatever order the writers arrive in). A real call leaves a mark, so the tests count them. The
Ray-actor and multi-node cases are in ``tests/integrations/ray/test_many_writers.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import skipweave

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

HOST = '''
import asyncio, os, random, threading, time
import torch

LIVE = []
_lock = threading.Lock()


def gen(batch):
    with _lock:
        LIVE.append((batch["who"], batch["meta_info"]["global_steps"]))
    time.sleep(0.05)  # the writers' calls overlap
    return {"who": batch["who"], "step": batch["meta_info"]["global_steps"], "sample": torch.rand(3)}


async def agen(batch):
    LIVE.append(batch["meta_info"]["global_steps"])
    await asyncio.sleep(0.05)
    return {"step": batch["meta_info"]["global_steps"], "sample": torch.rand(3)}
'''


def batch(who: int, step: int) -> dict[str, Any]:
    return {"who": who, "meta_info": {"global_steps": step}}


def plan(name: str, dump: Path, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(dump), "targets": {"gen": f"{name}:gen"},
                                 **role}}}


@pytest.fixture
def no_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("rank", [None, "3"])
def test_eight_threads_each_get_their_own_result_in_both_runs(host_module: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, no_rank: None,
                                                            rank: str | None, caplog: Any) -> None:
    if rank is not None:
        monkeypatch.setenv("RANK", rank)  # threads share their process's RANK: it cannot tell them apart
    name, _ = host_module(HOST)
    m = sys.modules[name]
    samples: list[dict[tuple[int, int], list[float]]] = []
    for run in (1, 2):
        m.LIVE.clear()
        skipweave.weave(plan(name, tmp_path / "dump"))
        got: dict[tuple[int, int], Any] = {}
        jitter = random.Random(run)
        delays = {t: jitter.random() * 0.02 for t in range(8)}  # another arrival order in each run

        def work(t: int, got: dict[tuple[int, int], Any], delay: float) -> None:
            for step in (1, 2, 3):
                threading.Event().wait(delay)
                got[(t, step)] = m.gen(batch(t, step))

        threads = [threading.Thread(target=work, args=(t, got, delays[t])) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        skipweave.unweave()
        assert all(r["who"] == t and r["step"] == step for (t, step), r in got.items())
        samples.append({k: r["sample"].tolist() for k, r in got.items()})
        assert len(m.LIVE) == (24 if run == 1 else 0)
    assert samples[0] == samples[1]  # each thread was served the very entry it recorded
    from skipweave.store.scan import scan

    entries = list(scan(str(tmp_path / "dump")).entries())  # single entries or groups, as a run reads them
    assert sorted(e.key.call for e in entries if e.key.step == 1) == list(range(8))


WRITER = '''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import skipweave
import {name} as m

dump, who, sync = sys.argv[2], int(sys.argv[3]), sys.argv[4]
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "convention": "verl", "dump_dir": dump,
                                         "targets": {{"gen": "{name}:gen"}}}}}}}})


def barrier(kind):
    open(os.path.join(sync, f"{{kind}}-{{who}}"), "w").close()
    while sum(n.startswith(kind) for n in os.listdir(sync)) < 4:
        time.sleep(0.01)


barrier("start")
out = {{}}
for step in (1, 2, 3):
    r = m.gen({{"who": who, "meta_info": {{"global_steps": step}}}})
    out[step] = {{"who": r["who"], "sample": r["sample"].tolist(), "status": None}}
barrier("end")  # a trainer's processes live until the job ends
skipweave.unweave()
print(json.dumps({{"out": out, "live": len(m.LIVE)}}))
'''


@pytest.mark.parametrize("variant", ["no RANK", "RANK"])
def test_four_processes_each_get_their_own_result_in_both_runs(host_module: Any, tmp_path: Path,
                                                             variant: str) -> None:
    name, folder = host_module(HOST)
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(name=name))
    dump = tmp_path / "dump"
    runs: list[dict[int, dict[str, Any]]] = []
    for run in (1, 2):
        sync = tmp_path / f"sync{run}"
        sync.mkdir()
        procs = []
        for who in range(4):
            # Independent processes (no run id in common: started by hand, not by one woven launcher) are the
            # hardest case; children of one launcher share its run id, as Ray workers do (tests/integrations/ray).
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "SKIPWEAVE_RUN")}
            if variant == "RANK":
                env["RANK"] = str(who)
            procs.append(subprocess.Popen([sys.executable, str(script), str(folder), str(dump), str(who), str(sync)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        reports = {}
        for who, proc in enumerate(procs):
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            reports[who] = json.loads(out.strip().splitlines()[-1])
        for who, rep in reports.items():
            assert rep["live"] == (3 if run == 1 else 0), (run, who, rep)
            assert all(r["who"] == who for r in rep["out"].values())
        runs.append(reports)
    for who in range(4):
        assert runs[0][who]["out"] == runs[1][who]["out"]  # the very entry this writer recorded


def test_several_writers_in_one_shard_warn_once_what_to_set(host_module: Any, tmp_path: Path, no_rank: None,
                                                          caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump"))
    threads = [threading.Thread(target=m.gen, args=(batch(t, 1),)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    skipweave.unweave()
    caplog.set_level(logging.WARNING)
    skipweave.weave(plan(name, tmp_path / "dump"))
    for _ in range(3):
        m.gen(batch(9, 1))  # inputs no thread recorded: never another thread's entry
    skipweave.unweave()
    shared = [r.getMessage() for r in caplog.records if "holds recordings of several writers" in r.getMessage()]
    assert len(shared) == 1 and "RANK" in shared[0]
    assert len(m.LIVE) == 6


def _gather_steps(m: Any, steps: list[int]) -> list[Any]:
    async def main() -> list[Any]:
        return list(await asyncio.gather(*(m.agen(batch(0, s)) for s in steps)))

    return asyncio.run(main())


@pytest.mark.parametrize("single_flight", [True, False])
def test_concurrent_first_calls_under_repeat_generate_once(host_module: Any, tmp_path: Path,
                                                           single_flight: bool) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    role = {"action": "repeat", "single_flight": single_flight, "targets": {"gen": f"{name}:agen"}}
    skipweave.weave(plan(name, tmp_path / "dump", **role))
    out = _gather_steps(m, [1, 2, 3, 4, 5])
    skipweave.unweave()
    if single_flight:
        assert m.LIVE == [1]  # steps 2-5 waited for step 1's recording and were served it
        assert all(r["sample"].tolist() == out[0]["sample"].tolist() for r in out)
    else:
        assert sorted(m.LIVE) == [1, 2, 3, 4, 5]


def test_concurrent_threads_under_repeat_generate_once(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump", action="repeat"))
    got: dict[int, Any] = {}

    def work(step: int) -> None:
        got[step] = m.gen(batch(0, step))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    skipweave.unweave()
    assert len(m.LIVE) == 1
    assert len({tuple(r["sample"].tolist()) for r in got.values()}) == 1


def test_repeat_under_gather_serves_the_nearest_recorded_step(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    role = {"action": "repeat", "record_steps": "1-5", "targets": {"gen": f"{name}:agen"}}
    skipweave.weave(plan(name, tmp_path / "dump", **role))
    recorded = _gather_steps(m, [1, 2, 3, 4, 5])
    skipweave.unweave()
    m.LIVE.clear()
    skipweave.weave(plan(name, tmp_path / "dump", **role))  # a fresh run, steps arriving out of order
    out = _gather_steps(m, [12, 3, 7, 4, 1, 5, 2])
    skipweave.unweave()
    assert m.LIVE == []
    by_step = {r["step"]: r["sample"].tolist() for r in recorded}
    assert out[0]["sample"].tolist() == by_step[5]  # step 12: the nearest earlier recorded step
    assert out[2]["sample"].tolist() == by_step[5]


CHILD = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import skipweave
import {name} as m
role = {{"enable": True, "convention": "verl", "dump_dir": sys.argv[2], "targets": {{"gen": "{name}:gen"}}}}
skipweave.weave({{"skip": {{"rollout": role}}}})
r = m.gen({{"who": 0, "meta_info": {{"global_steps": 1}}}})
print(json.dumps({{"live": len(m.LIVE), "sample": r["sample"].tolist()}}))
'''


def test_a_child_started_after_the_parent_unwove_replays_the_parents_recording(host_module: Any,
                                                                             tmp_path: Path) -> None:
    """A notebook or a harness records in-process, unweaves, then replays in a subprocess: the child is not a
    concurrent writer of the parent's run, so it is served the parent's recording."""
    name, folder = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump"))
    recorded = m.gen(batch(0, 1))["sample"].tolist()
    skipweave.unweave()
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(name=name))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(script), str(folder), str(tmp_path / "dump")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"live": 0, "sample": recorded}


def test_a_call_cancelled_before_it_ran_leaves_nothing_to_wait_for(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump", action="repeat", targets={"gen": f"{name}:agen"}))

    async def main() -> Any:
        first = asyncio.ensure_future(m.agen(batch(0, 1)))
        first.cancel()  # e.g. a TaskGroup whose sibling failed at once, a shutdown
        with pytest.raises(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(m.agen(batch(0, 2)), timeout=20)

    out = asyncio.run(main())
    skipweave.unweave()
    assert out["step"] == 2 and m.LIVE == [2]


UNENCODABLE = '''
import asyncio


class Opaque:
    __slots__ = ("x",)  # no __dict__, not a dataclass: the safe codec cannot hold it


async def agen(batch):
    await asyncio.sleep(0)
    o = Opaque()
    o.x = 1
    return o
'''


def test_a_first_call_whose_result_cannot_be_recorded_returns_it(host_module: Any, tmp_path: Path,
                                                                 caplog: Any) -> None:
    name, _ = host_module(UNENCODABLE)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump", targets={"gen": f"{name}:agen"}))
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(asyncio.run(m.agen(batch(0, 1)))), daemon=True)
    worker.start()
    worker.join(timeout=30)
    skipweave.unweave()
    assert not worker.is_alive(), "the call hung"
    assert type(result[0]).__name__ == "Opaque"
    assert skipweave.counters()["record_failures"] >= 1


SEQUENTIAL = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import skipweave
import {name} as m
role = {{"enable": True, "convention": "verl", "dump_dir": sys.argv[2], "targets": {{"gen": "{name}:gen"}}}}
skipweave.weave({{"skip": {{"rollout": role}}}})
r = m.gen({{"who": int(sys.argv[3]), "meta_info": {{"global_steps": 1}}}})
print(json.dumps({{"live": len(m.LIVE), "who": r["who"]}}))
'''


def test_children_of_one_run_one_after_the_other_each_record_their_own(host_module: Any, tmp_path: Path,
                                                                      no_rank: None) -> None:
    """Workers of one launcher (one run id) that reach a step one after the other, the first already gone:
    the later one never gets the earlier one's fresh result by call order."""
    name, folder = host_module(HOST)
    script = tmp_path / "seq.py"
    script.write_text(SEQUENTIAL.format(name=name))
    env = {k: v for k, v in os.environ.items() if k != "SKIPWEAVE_RUN"} | {"SKIPWEAVE_RUN": "onelauncher"}
    seen = []
    for who in (0, 1):
        proc = subprocess.run([sys.executable, str(script), str(folder), str(tmp_path / "dump"), str(who)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        seen.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert seen == [{"live": 1, "who": 0}, {"live": 1, "who": 1}]


def test_single_flight_never_blocks_a_thread_that_runs_an_event_loop(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(plan(name, tmp_path / "dump", action="repeat"))
    started = threading.Event()
    original = m.time.sleep

    def slow_first(seconds: float) -> None:
        started.set()
        original(0.5)

    m.time.sleep = slow_first
    try:
        first = threading.Thread(target=m.gen, args=(batch(0, 1),))
        first.start()
        started.wait(10)

        async def on_the_loop() -> Any:  # step 2 from a thread whose event loop must keep running
            return m.gen(batch(0, 2))

        out = asyncio.run(asyncio.wait_for(on_the_loop(), timeout=20))
        first.join(20)
    finally:
        m.time.sleep = original
    skipweave.unweave()
    assert out["step"] == 2 and sorted(s for _, s in m.LIVE) == [1, 2]  # ran live instead of blocking the loop


def test_a_first_call_that_raises_still_counts_as_called(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module("def gen(batch):\n    raise RuntimeError('CUDA out of memory')\n")
    m = sys.modules[name]
    dump = tmp_path / "not-made-yet"
    skipweave.weave(plan(name, dump))
    with pytest.raises(RuntimeError):
        m.gen(batch(0, 1))
    run = os.environ["SKIPWEAVE_RUN"]
    skipweave.unweave()
    assert (dump / ".runs" / run / "default" / "rollout" / "gen.called").exists()
    assert (dump / ".runs" / run / "default" / "rollout" / "gen.eligible").exists()
