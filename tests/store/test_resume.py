"""Resuming a step an interrupted run left short, sample by sample (skipweave/store/resume.py and its callers).

The acceptance test runs a fully-async-shaped host in a subprocess: a thread-pool rollouter making 512 per-sample
calls of one woven target per step, each result a deterministic function of its prompt. The first run is SIGKILLed
1 s after the 300th call of step 3 returned; the next run (the same command) makes exactly the 212 missing calls of
that step live and ends with the results of an uninterrupted run; a third one replays everything.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

SAMPLES = 512
KILL_STEP = 3
KILL_AFTER = 300
STEPS = 4

HOST_MODULE = '''
import os
import threading

import torch

LIVE = {"path": None}
BLOCK = {"after": 0, "step": 0, "started": 0}
_lock = threading.Lock()
_never = threading.Event()


def gen(prompt, step):
    """One sample of a rollout: a small torch computation seeded from the prompt (deterministic)."""
    with _lock:
        with open(LIVE["path"], "a") as fh:
            fh.write(f"{step} {prompt}\\n")
        if step == BLOCK["step"]:
            BLOCK["started"] += 1
            blocked = BLOCK["after"] and BLOCK["started"] > BLOCK["after"]
        else:
            blocked = False
    if blocked:  # the first run: no call after the 300th of the kill step returns (the test kills the process)
        _never.wait()
    g = torch.Generator().manual_seed(sum(prompt.encode()) * 1000003 + len(prompt))
    x = torch.randn(8, 8, generator=g)
    return {"tokens": (x @ x.T).argmax(dim=1), "logp": torch.log_softmax(x.sum(dim=0), dim=0), "prompt": prompt}
'''

HOST = f"KILL_STEP, STEPS, SAMPLES = {KILL_STEP}, {STEPS}, {SAMPLES}\n" + '''
import concurrent.futures
import hashlib
import json
import logging
import os
import sys
import threading

sys.path.insert(0, sys.argv[1])
import skipweave
import resume_host as host

dump, live, marker, out, kill_after = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
host.LIVE["path"] = live
if kill_after and not os.path.exists(marker):  # only the run the test kills blocks
    host.BLOCK.update(after=kill_after, step=KILL_STEP)
skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": dump,
                                      "step": {"source": "arg", "arg": "step", "path": ""},
                                      "targets": {"gen": "resume_host:gen"}}}})
returned = {"n": 0}
lock = threading.Lock()


def sample(prompt, step):
    result = host.gen(prompt, step)
    with lock:
        if step == KILL_STEP:
            returned["n"] += 1
            if returned["n"] == kill_after and kill_after:
                with open(marker, "w") as fh:
                    fh.write("300")
    return result


digests = {}
with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    for step in range(1, STEPS + 1):
        prompts = [f"s{step}-{i}" for i in range(SAMPLES)]
        results = list(pool.map(sample, prompts, [step] * len(prompts)))
        h = hashlib.sha256()
        for r in results:
            h.update(r["prompt"].encode())
            h.update(r["tokens"].numpy().tobytes())
            h.update(r["logp"].numpy().tobytes())
        digests[step] = h.hexdigest()
skipweave.unweave()
with open(out, "w") as fh:
    json.dump({"digests": digests, "counters": skipweave.counters()}, fh)
'''


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "resume_host.py").write_text(HOST_MODULE)
    (folder / "main.py").write_text(HOST)
    return folder


def _command(host_dir: Path, dump: Path, run: str, kill_after: int) -> list[str]:
    work = dump.parent
    return [sys.executable, str(host_dir / "main.py"), str(host_dir), str(dump), str(work / f"{run}.live"),
            str(work / "marker"), str(work / f"{run}.json"), str(kill_after)]


def _live_at(work: Path, run: str, step: int) -> int:
    path = work / f"{run}.live"
    return sum(1 for line in path.read_text().splitlines() if line.startswith(f"{step} ")) if path.exists() else 0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPWEAVE_RUN")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(skipweave.__file__).parents[1]),
                                                    env.get("PYTHONPATH", "")) if p)
    return env


def test_a_killed_async_step_resumes_sample_by_sample(host_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    dump = work / "dump"
    marker = work / "marker"
    killed = subprocess.Popen(_command(host_dir, dump, "killed", KILL_AFTER), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert killed.poll() is None, killed.communicate()
            assert time.monotonic() < deadline, "the host never reached the 300th call of the kill step"
            time.sleep(0.02)
        time.sleep(1.0)
        killed.send_signal(signal.SIGKILL)
    finally:
        killed.wait(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    step_dir = dump / "default" / "rollout" / str(KILL_STEP) / "gen"
    assert not (step_dir / "r0.part.json").exists() or "closed" not in (step_dir / "r0.part.json").read_text()

    resumed = subprocess.run(_command(host_dir, dump, "resumed", KILL_AFTER), env=_env(), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _live_at(work, "resumed", KILL_STEP) == SAMPLES - KILL_AFTER, resumed.stderr  # exactly the 212 missing
    assert [_live_at(work, "resumed", s) for s in range(1, STEPS + 1) if s != KILL_STEP] == [0, 0, SAMPLES]
    assert "set aside" not in resumed.stderr  # every entry of the interrupted run served its own sample
    assert (step_dir / "r0.part.json").read_text().count('"closed"') == 1

    fresh = subprocess.run(_command(host_dir, work / "fresh", "fresh", 0), env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    expected = json.loads((work / "fresh.json").read_text())["digests"]
    assert json.loads((work / "resumed.json").read_text())["digests"] == expected

    third = subprocess.run(_command(host_dir, dump, "third", KILL_AFTER), env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert _live_at(work, "third", KILL_STEP) == 0 and not (work / "third.live").exists()
    out: dict[str, Any] = json.loads((work / "third.json").read_text())
    assert out["digests"] == expected
    assert out["counters"]["hits"] == SAMPLES * STEPS and out["counters"]["misses"] == 0


SMALL_HOST = '''
import torch

CALLS = []


def gen(step, prompt):
    CALLS.append((step, prompt))
    return {"p": prompt, "v": torch.tensor([float(sum(prompt.encode())), float(step)])}
'''


def _weave(name: str, dump: Path, **role: Any) -> None:
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump),
                                          "step": {"source": "arg", "arg": "step", "path": ""},
                                          "targets": {"gen": f"{name}:gen"}, **role}}})


def _interrupted(name: str, dump: Path, prompts: list[str], *, fingerprinted: bool = True) -> None:
    """Step 1 recorded whole (4 calls: a step makes 4), step 2 left short by a run that died: ``prompts``' entries
    committed as one group, the part never closed."""
    from skipweave.store.step_store import EntryMeta, StepStore
    from skipweave.weaving.fingerprint import fingerprint

    m = sys.modules[name]
    _weave(name, dump)
    for p in "abcd":
        m.gen(1, p)
    skipweave.unweave()
    store = StepStore(str(dump), "default", "rollout")
    items = [(store.key(2, "gen", "r0", c), store.stage(m.gen(2, p), rng_state=None).copied(),
              EntryMeta(f"{name}:gen", fingerprint((2, p), {}) if fingerprinted else "", 0.0))
             for c, p in enumerate(prompts)]
    assert all(isinstance(r, tuple) for r in store.commit_many(items))
    assert list((dump / "default" / "rollout" / "2" / "gen").glob("r0-0000-*.pack.json"))  # a group
    m.CALLS.clear()


def test_entries_whose_inputs_no_call_had_are_set_aside_as_the_resumed_part_closes(
        host_module: Any, tmp_path: Path, caplog: Any) -> None:
    name, _ = host_module(SMALL_HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _interrupted(name, dump, ["a", "b", "c"])
    wanted = ["c", "x", "a", "y"]  # 'b' is not asked for any more: its entry must not stay in the completed part
    _weave(name, dump)
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        first = [m.gen(2, p) for p in wanted]
        skipweave.unweave()
    assert m.CALLS == [(2, "x"), (2, "y")]  # 'a' and 'c' served by their inputs, whatever their position
    assert "1 entries the interrupted run recorded served no call of this run" in caplog.text
    assert "left incomplete" not in caplog.text  # not the whole part
    aside = [p for p in (dump / "default" / "rollout" / "_set_aside").iterdir() if "unclaimed" in p.name]
    assert len(aside) == 1 and list(aside[0].glob("*.pack.json"))  # the group went, its kept calls written alone
    folder = dump / "default" / "rollout" / "2" / "gen"
    assert '"closed"' in (folder / "r0.part.json").read_text()
    assert [p["p"] for p in first] == wanted

    m.CALLS.clear()
    _weave(name, dump)
    again = [m.gen(2, p) for p in wanted]
    skipweave.unweave()
    assert m.CALLS == []  # the step is whole: every call served
    assert all(torch.equal(x["v"], y["v"]) and x["p"] == y["p"] for x, y in zip(again, first, strict=True))


@pytest.mark.parametrize("case", ["no fingerprint", "fingerprint.include"])
def test_a_short_part_that_cannot_be_matched_by_inputs_is_set_aside_whole(host_module: Any, tmp_path: Path,
                                                                         caplog: Any, case: str) -> None:
    name, _ = host_module(SMALL_HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    # "fingerprint.include": fingerprinted entries, but the role hashes only a part of the inputs
    _interrupted(name, dump, ["a", "b"], fingerprinted=case == "fingerprint.include")
    role: dict[str, Any] = {"fingerprint": {"include": ["1"]}} if case == "fingerprint.include" else {}
    _weave(name, dump, **role)
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        for p in "abcd":
            m.gen(2, p)
        skipweave.unweave()
    assert m.CALLS == [(2, p) for p in "abcd"]  # today's rule: nothing of the interrupted run is mixed in
    assert "left incomplete by an interrupted run" in caplog.text


def test_a_replay_only_run_serves_what_a_short_part_holds_and_stops_at_the_rest(host_module: Any,
                                                                               tmp_path: Path) -> None:
    from skipweave.weaving.replay import ReplayMissing

    name, _ = host_module(SMALL_HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _interrupted(name, dump, ["a", "b"])
    before = sorted(p.name for p in (dump / "default" / "rollout" / "2" / "gen").iterdir())
    _weave(name, dump, replay_only=True)
    try:
        assert m.gen(2, "b")["p"] == "b" and m.gen(2, "a")["p"] == "a"
        with pytest.raises(ReplayMissing, match="step 2 call 2"):
            m.gen(2, "c")
    finally:
        skipweave.unweave()
    assert m.CALLS == []
    assert sorted(p.name for p in (dump / "default" / "rollout" / "2" / "gen").iterdir()) == before  # untouched


def _short_part(name: str, dump: Path, step: int, prompts: list[str]) -> None:
    """``prompts``' entries of ``step`` committed as a run that died leaves them (a forked child that exits at once):
    one group, the part never closed."""
    import multiprocessing

    from skipweave.store.step_store import EntryMeta, StepStore
    from skipweave.weaving.fingerprint import fingerprint

    def commit() -> None:
        m = sys.modules[name]
        store = StepStore(str(dump), "default", "rollout")
        items = [(store.key(step, "gen", "r0", c), store.stage(m.gen(step, p), rng_state=None).copied(),
                  EntryMeta(f"{name}:gen", fingerprint((step, p), {}), 0.0)) for c, p in enumerate(prompts)]
        os._exit(0 if all(isinstance(r, tuple) for r in store.commit_many(items)) else 1)

    child = multiprocessing.get_context("fork").Process(target=commit)
    child.start()
    child.join()
    assert child.exitcode == 0


def test_a_short_part_with_no_closed_step_beside_it_is_resumed_not_served_by_position(host_module: Any,
                                                                                     tmp_path: Path) -> None:
    # Nothing tells how many calls a step makes (no calls_per_step, no closed part left: retention removed them, or
    # the run died in its first step): a part of several calls never closed is not a whole step served by position.
    name, _ = host_module(SMALL_HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _short_part(name, dump, 3, ["a", "b", "c"])
    _weave(name, dump)
    served = [m.gen(3, p) for p in "dabc"]  # another order than the recording's
    skipweave.unweave()
    assert [s["p"] for s in served] == list("dabc")
    assert m.CALLS == [(3, "d")]


def test_retention_never_removes_a_step_this_process_resumes(host_module: Any, tmp_path: Path) -> None:
    import threading

    name, _ = host_module(SMALL_HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _weave(name, dump, calls_per_step=4)
    for step in (1, 2):
        for p in "abcd":
            m.gen(step, p)
    skipweave.unweave()
    _short_part(name, dump, 3, ["a", "b", "c"])
    m.CALLS.clear()
    _weave(name, dump, calls_per_step=4, keep={"last": 1}, write_buffer=0)
    try:
        first = m.gen(3, "a")  # served: step 3 is resumed
        m.gen(4, "a")  # another step in flight (an async rollouter): its commit starts a retention round
        for thread in [t for t in threading.enumerate() if t.name.startswith("skipweave-retention-")]:
            thread.join(timeout=30)
        rest = [m.gen(3, p) for p in "bcd"]
        steps = sorted(int(p.name) for p in (dump / "default" / "rollout").iterdir() if p.name.isdigit())
        assert 3 in steps and 1 not in steps and 2 not in steps
    finally:
        skipweave.unweave()
    assert m.CALLS == [(4, "a"), (3, "d")]  # b and c served from the resumed part, not regenerated
    assert [r["p"] for r in [first, *rest]] == list("abcd")
    # the run's end applies the rule once more: step 3 is no longer resumed, and only the newest step is kept
    assert sorted(int(p.name) for p in (dump / "default" / "rollout").iterdir() if p.name.isdigit()) == [4]
