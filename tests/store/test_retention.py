"""Retention of recorded steps (``skip.<role>.keep``): the rules, what is never removed, and two writer processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.cli.main import main
from skipweave.config.errors import ConfigError
from skipweave.config.parse import parse_role
from skipweave.store.format.layout import list_steps
from skipweave.store.retainer import Retainer
from skipweave.store.retention import KeepRule, plan_retention, remove_step, trash_folders
from skipweave.store.scan import Status, scan
from skipweave.store.step_store import StepStore

FORK = mp.get_context("fork")
NS, ROLE = "default", "rollout"


def _record(store: StepStore, step: int, *, calls: int = 1, shard: str = "r0", close: bool = True) -> None:
    store.prepare_part(step, "gen", shard)
    for call in range(calls):
        store.record(store.key(step, "gen", shard, call), {"ids": torch.full((256,), step), "call": call},
                     target_path="m:f", fingerprint="", rng_state=None, seconds=0.0)
    if close:
        store.close_part(step, "gen", shard)


def _store(tmp_path: Path, steps: int) -> StepStore:
    store = StepStore(str(tmp_path / "dump"), NS, ROLE)
    for step in range(1, steps + 1):
        _record(store, step)
    return store


def _apply(store: StepStore, rule: KeepRule, **kw: Any) -> list[int]:
    plan = plan_retention(store, rule, **kw)
    for item in plan.remove:
        remove_step(store, item, lock_timeout=0)
        assert item.outcome == "removed", item.detail
    return [i.step for i in plan.remove]


def _serves(store: StepStore, step: int, calls: int = 1, shard: str = "r0") -> bool:
    fresh = StepStore(store.dump_dir, NS, ROLE)  # judged as a later run would
    return fresh.is_complete(step, "gen", shard) and all(
        torch.equal(fresh.load(fresh.key(step, "gen", shard, c)).result["ids"], torch.full((256,), step))
        for c in range(calls))


def test_keep_config_is_validated_with_errors_naming_the_key() -> None:
    role = parse_role(ROLE, {"keep": {"last": 3, "bytes": "2GiB", "pin": [1, "5-7"]}})
    assert (role.keep.last, role.keep.bytes) == (3, 2 << 30) and 6 in role.keep.pin and 4 not in role.keep.pin
    assert parse_role(ROLE, role.to_config()).keep == role.keep
    unset = parse_role(ROLE, {}).keep
    assert (unset.last, unset.bytes, unset.pin) == (None, None, None)  # keep everything, as before
    assert parse_role(ROLE, {"keep": {"pin": []}}).keep.pin is None
    for bad, key in (({"last": 0}, "keep.last"), ({"last": True}, "keep.last"), ({"bytes": "lots"}, "keep.bytes"),
                     ({"bytes": -1}, "keep.bytes"), ({"pin": "x"}, "keep.pin"), ({"lats": 2}, "keep.lats"),
                     ([3], "keep")):
        with pytest.raises(ConfigError) as err:
            parse_role(ROLE, {"keep": bad})
        assert err.value.key == f"skip.{ROLE}.{key}"


def test_last_bytes_and_pin(tmp_path: Path) -> None:
    store = _store(tmp_path, 8)
    assert plan_retention(store, KeepRule()).remove == []  # no rule: every step kept
    plan = plan_retention(store, KeepRule(last=3, pin={2}))
    assert [i.step for i in plan.remove] == [1, 3, 4, 5]
    assert [(i.step, i.detail) for i in plan.kept] == [(2, "pinned")]
    size = {i.step: i.bytes for i in plan_retention(store, KeepRule(max_bytes=0)).remove}
    assert sum(size.values()) == plan.bytes and all(i.files >= 4 for i in plan.remove)

    # bytes: the oldest go until the role holds at most the size; a pinned step is passed over for the next
    assert [i.step for i in plan_retention(store, KeepRule(max_bytes=size[7] + size[8] + size[6] // 2)).remove] == \
        [1, 2, 3, 4, 5, 6]
    six = sum(size[s] for s in (1, 4, 5, 6, 7, 8))
    assert [i.step for i in plan_retention(store, KeepRule(max_bytes=six, pin={1})).remove] == [2, 3]
    # both: a count limit, then a size limit over what is left
    four = sum(size[s] for s in (2, 6, 7, 8))
    assert _apply(store, KeepRule(last=5, max_bytes=four, pin={2})) == [1, 3, 4, 5]
    assert list_steps(store.dump_dir, NS, ROLE) == [2, 6, 7, 8]
    assert all(_serves(store, s) for s in (2, 6, 7, 8))
    assert trash_folders(store.dump_dir, NS, ROLE) == []
    assert _apply(store, KeepRule(last=5, max_bytes=four, pin={2})) == []  # nothing more to do
    # another role and namespace are never touched
    other = StepStore(store.dump_dir, NS, "ref")
    _record(other, 1)
    assert _apply(store, KeepRule(last=1)) == [2, 6, 7] and list_steps(store.dump_dir, NS, "ref") == [1]


def _open_part_then_exit(dump: str) -> None:
    _record(StepStore(dump, NS, ROLE), 0, close=False)
    os._exit(0)  # no exit handler closes the part: an interrupted run's


def test_the_step_just_written_and_steps_a_writer_may_still_add_to_are_never_removed(tmp_path: Path) -> None:
    store = _store(tmp_path, 5)
    _record(store, 6, close=False)  # this process still records step 6: its part is open, its writer running
    plan = plan_retention(store, KeepRule(last=1), protect={5})
    assert [i.step for i in plan.remove] == [1, 2, 3, 4]
    assert {i.step: i.detail for i in plan.kept} == {5: "just written by this process"}
    plan = plan_retention(store, KeepRule(max_bytes=0))
    assert [i.step for i in plan.remove] == [1, 2, 3, 4, 5]
    assert "not closed and its writer is running" in str(plan.kept[0].detail) and plan.kept[0].step == 6

    # an open part whose writer ended (an interrupted run) keeps nothing; one that cannot be asked keeps its step
    # while it is younger than min_age
    child = FORK.Process(target=_open_part_then_exit, args=(store.dump_dir,))
    child.start()
    child.join()
    assert not (Path(store.dump_dir) / NS / ROLE / "0" / "gen" / "r0.part.json").read_text().count("closed")
    assert 0 in [i.step for i in plan_retention(store, KeepRule(last=2)).remove]
    manifest = next((Path(store.dump_dir) / NS / ROLE / "3" / "gen").glob("*.manifest.json"))
    manifest.write_text(manifest.read_text().replace('"host":', '"host": "elsewhere", "was":'))
    os.remove(manifest.parent / "r0.part.json")
    young = plan_retention(store, KeepRule(last=2), min_age=3600)
    assert 3 in [i.step for i in young.kept] and 3 not in [i.step for i in young.remove]
    assert 3 in [i.step for i in plan_retention(store, KeepRule(last=2), min_age=0).remove]

    # the judgement is made again under the parts' locks right before the removal
    item = next(i for i in plan_retention(store, KeepRule(last=2), min_age=0).remove if i.step == 3)
    remove_step(store, item, lock_timeout=0, min_age=3600)
    assert item.outcome == "skipped" and 3 in list_steps(store.dump_dir, NS, ROLE)


def test_a_run_removes_steps_once_per_new_step_off_the_recorded_call(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path / "dump"), NS, ROLE, keep=KeepRule(last=2))
    for step in range(1, 5):
        _record(store, step)
    retainer = Retainer(store, KeepRule(last=2))
    assert {i.step for i in retainer.after_commit({4}) if i.outcome == "removed"} == {1, 2}
    _record(store, 5, close=False)
    assert retainer.after_commit({5}, pending={5}) != [] and list_steps(store.dump_dir, NS, ROLE) == [4, 5]
    _record(store, 1)  # an older step recorded again, or more calls of step 5: no new step, no round
    assert retainer.after_commit({1}) == [] and retainer.after_commit({5}) == []
    assert list_steps(store.dump_dir, NS, ROLE) == [1, 4, 5]
    # the store's own retention (the background writer calls it after each commit)
    assert store.after_commit({6}) != [] and list_steps(store.dump_dir, NS, ROLE) == [4, 5]


_WRITER = '''
import sys, time, torch
sys.path.insert(0, {host!r})
import skipweave, {name} as host
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {dump!r}, "keep": {{"last": 3}},
                 "targets": {{"gen": "{name}.gen"}}}}}}}})
for step in range(1, 13):
    skipweave.set_step(step)
    host.gen(step, {rank})
    time.sleep(0.03)
'''


def test_two_writer_processes_with_keep_last(tmp_path: Path, host_module: Any, capsys: Any) -> None:
    name, folder = host_module("import torch\n\ndef gen(step, rank):\n"
                               "    return {'ids': torch.full((4096,), step * 10 + rank)}\n", import_now=False)
    dump = str(tmp_path / "dump")

    def writer(rank: int) -> None:
        code = _WRITER.format(host=str(folder), name=name, dump=dump, rank=rank)
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANK": str(rank)}, check=True)

    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, as the ranks of a job
        list(pool.map(writer, (0, 1)))
    steps = list_steps(dump, NS, ROLE)
    assert {10, 11, 12} <= set(steps) and len(steps) < 12  # rounds ran in the run; each step at most once

    def check() -> None:  # every part left is whole and serves its own writer's values; the newest 3 both ranks'
        result = scan(dump, checksums=True)
        assert result.parts and all(p.status is Status.COMPLETE for p in result.parts)
        assert not [x for x in result.leftovers if x.kind.value == "trash"]
        store = StepStore(dump, NS, ROLE)
        for part in result.parts:
            loaded = store.load(store.key(part.step, "gen", part.shard, 0))
            assert torch.equal(loaded.result["ids"], torch.full((4096,), part.step * 10 + int(part.shard[1:])))
        for step in (10, 11, 12):
            assert {p.shard for p in result.parts if p.step == step} == {"r0", "r1"}

    check()
    assert main(["gc", dump, "--keep-last", "3", "--yes", "--min-age", "0"]) == 0
    capsys.readouterr()
    assert list_steps(dump, NS, ROLE) == [10, 11, 12]
    check()


def test_a_process_recording_in_the_callers_thread_applies_keep_on_a_thread_of_its_own(tmp_path: Path,
                                                                                     host_module: Any) -> None:
    # write_buffer: 0 commits in the recorded call's thread, as a Ray worker outside a task does: no background
    # writer runs a round, so the store starts one per new step on a daemon thread of its own.
    import threading

    import skipweave

    name, _ = host_module("import torch\n\ndef gen(step):\n    return {'ids': torch.full((64,), step)}\n")
    dump = str(tmp_path / "dump")
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": dump, "write_buffer": 0, "keep": {"last": 2},
                                          "targets": {"gen": f"{name}.gen"}}}})
    try:
        host = sys.modules[name]
        for step in range(1, 7):
            skipweave.set_step(step)
            host.gen(step)
            for thread in [t for t in threading.enumerate() if t.name.startswith("skipweave-retention-")]:
                thread.join(timeout=30)
    finally:
        skipweave.unweave()
    assert list_steps(dump, NS, ROLE) == [5, 6]
    assert not trash_folders(dump, NS, ROLE)


@pytest.mark.parametrize("replay_only", [False, True])
def test_a_step_removed_while_a_run_serves_it_is_named(tmp_path: Path, host_module: Any, caplog: Any,
                                                       replay_only: bool) -> None:
    # Another process's retention (or gc) removes a step this run is halfway through serving: the rest of the step
    # runs live (or, replay-only, stops) with words that name the cause, not a bare miss or "never recorded".
    import shutil

    import skipweave
    from skipweave.weaving.replay import ReplayMissing

    name, _ = host_module("import torch\nCALLS = []\n\ndef gen(step, i):\n    CALLS.append((step, i))\n"
                          "    return {'ids': torch.full((8,), step * 100 + i)}\n")
    host = sys.modules[name]
    dump = str(tmp_path / "dump")
    role = {"enable": True, "dump_dir": dump, "step": {"source": "arg", "arg": "step", "path": ""},
            "targets": {"gen": f"{name}.gen"}}
    skipweave.weave({"skip": {"rollout": role}})
    for i in range(3):
        host.gen(1, i)
    skipweave.unweave()
    host.CALLS.clear()
    skipweave.weave({"skip": {"rollout": {**role, "replay_only": replay_only}}})
    try:
        assert torch.equal(host.gen(1, 0)["ids"], torch.full((8,), 100))
        shutil.rmtree(os.path.join(dump, NS, ROLE, "1"))  # what another process's round does (rename, delete)
        with caplog.at_level("WARNING", logger="skipweave"):
            if replay_only:
                with pytest.raises(ReplayMissing, match="step 1, which served this step's calls, was removed while"):
                    host.gen(1, 1)
            else:
                assert torch.equal(host.gen(1, 1)["ids"], torch.full((8,), 101)) and host.CALLS == [(1, 1)]
    finally:
        skipweave.unweave()
    assert "recorded step 1 was removed while this run served it" in caplog.text


def test_the_final_round_applies_the_rule_that_skipped_rounds_left(tmp_path: Path) -> None:
    # Another process cleans the role (its .retention.lock is held) while this one records every step: each round is
    # skipped. The run's end waits for the lock (within FINAL_ROUND_S) and applies the rule once.
    import threading

    from skipweave.store.retention import role_lock

    dump = str(tmp_path / "dump")
    store = StepStore(dump, NS, ROLE, keep=KeepRule(last=3, pin={2}))
    _record(store, 1)
    held, release = threading.Event(), threading.Event()

    def other() -> None:
        with role_lock(dump, NS, ROLE, timeout=0):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=other)
    holder.start()
    assert held.wait(30)
    try:
        for step in range(1, 11):
            _record(store, step)
            assert store.after_commit({step}) == []  # skipped: the role is being cleaned
        assert list_steps(dump, NS, ROLE) == list(range(1, 11))
        threading.Timer(0.3, release.set).start()
        done = store.final_round(timeout=10)
    finally:
        release.set()
        holder.join()
    assert sorted(i.step for i in done if i.outcome == "removed") == [1, 3, 4, 5, 6, 7]
    assert list_steps(dump, NS, ROLE) == [2, 8, 9, 10] and all(_serves(store, s) for s in (2, 8, 9, 10))
    assert store.final_round() == []  # nothing committed since: no round due


_QUICK = '''
import sys
sys.path.insert(0, {host!r})
import skipweave, {name} as host
role = {{"enable": True, "dump_dir": {dump!r}, "keep": {{"last": 3, "pin": [2]}}, "targets": {{"gen": "{name}.gen"}}}}
if {through!r}:
    role["write_buffer"] = 0  # committed in the recorded call's thread, as a Ray worker outside a task does
skipweave.weave({{"skip": {{"rollout": role}}}})
for step in range(1, 11):
    skipweave.set_step(step)
    host.gen(step)
'''


def test_keep_holds_when_a_quick_run_ends(tmp_path: Path, host_module: Any) -> None:
    # 10 steps in well under a second: rounds queued behind the steps, or cut short by the exit, leave the rule unmet
    # unless the run's end applies it once more. Several fresh processes: each must end with exit status 0.
    name, folder = host_module("import torch\n\ndef gen(step):\n    return {'ids': torch.full((4096,), step)}\n",
                               import_now=False)

    def run(i: int) -> tuple[str, subprocess.CompletedProcess[str]]:
        dump = str(tmp_path / f"dump{i}")
        code = _QUICK.format(host=str(folder), name=name, dump=dump, through=i >= 3)
        return dump, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, range(5)))
    for dump, out in results:
        assert out.returncode == 0 and "terminate called" not in out.stderr, out.stderr
        assert list_steps(dump, NS, ROLE) == [2, 8, 9, 10], (dump, out.stderr)
        assert not trash_folders(dump, NS, ROLE)
        store = StepStore(dump, NS, ROLE)
        for step in (2, 8, 9, 10):
            assert store.is_complete(step, "gen", "r0")
            assert torch.equal(store.load(store.key(step, "gen", "r0", 0)).result["ids"], torch.full((4096,), step))
