"""Declared side effects (``skip.<role>.effects``) over real weaves: a list the call appends to is recorded as the
items it appended, every other effect as its whole value.

A trainer that appends one metrics dict per call to ``self.metrics`` must not store the whole, growing list in
every step's entry (the store would grow with the square of the steps); a replay appends the recorded items to the
live list in place, so run 2's list after each replayed step equals run 1's.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.store.step_store import StepStore

HOST = '''
import asyncio

CALLS = []


class Trainer:
    def __init__(self):
        self.metrics = []
        self.window = [0, 0, 0]
        self.history = []
        self.counts = [0]
        self.shaped = {}

    def generate(self, step):
        CALLS.append(step)
        self.metrics.append({"step": step, "loss": step * 0.5, "name": f"m{step}"})
        return {"step": step, "tokens": [step] * 4}

    async def agenerate(self, step):
        await asyncio.sleep(0)
        CALLS.append(step)
        self.metrics.append({"step": step, "loss": step * 0.5, "name": f"m{step}"})
        return {"step": step}

    async def overlapping(self, step, together=0):
        CALLS.append(step)
        self.metrics.append(step)
        for _ in range(2000):  # the calls of a batch run beside each other: each appends while the others run
            if len(CALLS) >= together:
                break
            await asyncio.sleep(0.001)
        return step

    def others(self, step):
        CALLS.append(step)
        self.history = self.history + [step]      # replaced by a new list
        self.window.append(step)                  # appended, then shrunk to its last three
        del self.window[:-3]
        self.counts[0] += 1                       # an item changed in place, then one appended
        self.counts.append(step)
        self.shaped = {"n_before": 0, "tail": [step]}  # a dict that looks like a recorded tail
        self.metrics.append(step)
        return step
'''

EFFECTS = ["self.metrics", "self.window", "self.history", "self.counts", "self.shaped"]


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def plan(mod: Any, dump: Path, method: str = "generate", **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {
        "enable": True, "dump_dir": str(dump), "targets": {"gen": f"{mod.__name__}:Trainer.{method}"},
        "step": {"source": "arg", "arg": 0, "path": ""}, "effects": ["self.metrics"], **role,
    }}}


def step_bytes(dump: Path, step: int) -> int:
    """Bytes of every file under a step's folder (its entry, manifest and part state)."""
    return sum(p.stat().st_size for p in (dump / "default" / "rollout" / str(step)).rglob("*") if p.is_file())


def entry(dump: Path, step: int) -> Any:
    store = StepStore(str(dump), "default", "rollout")
    return store.load(store.key(step, "gen", "r0", 0))


def test_an_appended_list_records_only_what_each_call_appended(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump))
    first, after = mod.Trainer(), []
    for step in range(1, 31):
        first.generate(step)
        after.append(copy.deepcopy(first.metrics))
    skipweave.unweave()
    assert mod.CALLS == list(range(1, 31))
    sizes = [step_bytes(dump, step) for step in (1, 30)]
    assert sizes[1] <= sizes[0] + 64, sizes  # not 30 dicts at step 30: the store grows with the steps, not their square
    last = entry(dump, 30)
    assert last.appended == {"self.metrics": {"n_before": 29, "tail": [after[-1][-1]]}}
    assert "self.metrics" not in (last.effects or {})

    mod.CALLS.clear()
    skipweave.weave(plan(mod, dump))
    second = mod.Trainer()
    keep = second.metrics
    for step in range(1, 31):
        out = second.generate(step)
        assert out == {"step": step, "tokens": [step] * 4}
        assert second.metrics == after[step - 1], step
    skipweave.unweave()
    assert mod.CALLS == [] and second.metrics is keep  # every step replayed, the list refilled in place


def test_a_list_subclass_is_appended_to_in_place(mod: Any, tmp_path: Path) -> None:
    class Log(list):  # type: ignore[type-arg]
        pass

    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump))
    first = mod.Trainer()
    first.metrics = Log()
    for step in (1, 2):
        first.generate(step)
    skipweave.unweave()
    assert entry(dump, 2).appended == {"self.metrics": {"n_before": 1, "tail": [first.metrics[1]]}}
    skipweave.weave(plan(mod, dump))
    second = mod.Trainer()
    second.metrics = keep = Log()
    for step in (1, 2):
        second.generate(step)
    skipweave.unweave()
    assert second.metrics is keep and type(keep) is Log and keep == first.metrics


def test_a_replaced_shrunk_or_changed_list_and_a_dict_keep_their_whole_value(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump, "others", effects=EFFECTS))
    first = mod.Trainer()
    for step in (1, 2, 3, 4):
        first.others(step)
    skipweave.unweave()
    recorded = entry(dump, 4)
    assert recorded.effects == {"self.window": [2, 3, 4], "self.history": [1, 2, 3, 4], "self.counts": [4, 1, 2, 3, 4],
                                "self.shaped": {"n_before": 0, "tail": [4]}}
    assert recorded.appended == {"self.metrics": {"n_before": 3, "tail": [4]}}

    mod.CALLS.clear()
    skipweave.weave(plan(mod, dump, "others", effects=EFFECTS))
    second = mod.Trainer()
    second.window, second.history, second.counts = [9], [9, 9], [9, 9, 9]  # other values than run 1's before the call
    keep = second.window, second.history, second.counts
    second.others(4)  # served step 4's entry: the whole values come back whatever was there
    skipweave.unweave()
    assert mod.CALLS == []
    assert (second.window, second.history, second.counts) == ([2, 3, 4], [1, 2, 3, 4], [4, 1, 2, 3, 4])
    assert all(a is b for a, b in zip((second.window, second.history, second.counts), keep, strict=True))
    assert second.shaped == {"n_before": 0, "tail": [4]}  # a dict shaped like a tail is a value, never a tail
    assert second.metrics == [4]  # the appended item, appended to what run 2 had


def test_an_async_target_records_and_replays_the_appended_items(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"

    async def run(trainer: Any) -> list[Any]:
        seen = []
        for step in range(1, 21):
            await trainer.agenerate(step)
            seen.append(copy.deepcopy(trainer.metrics))
        return seen

    skipweave.weave(plan(mod, dump, "agenerate"))
    first = mod.Trainer()
    after = asyncio.run(run(first))
    skipweave.unweave()
    assert step_bytes(dump, 20) <= step_bytes(dump, 1) + 64
    assert entry(dump, 20).appended == {"self.metrics": {"n_before": 19, "tail": [after[-1][-1]]}}

    mod.CALLS.clear()
    skipweave.weave(plan(mod, dump, "agenerate"))
    second = mod.Trainer()
    keep = second.metrics
    assert asyncio.run(run(second)) == after
    skipweave.unweave()
    assert mod.CALLS == [] and second.metrics is keep


def test_calls_running_beside_each_other_record_whole_lists(mod: Any, tmp_path: Path) -> None:
    """Tasks that append to one list while another's call runs: a tail would hold the other's items too."""
    dump = tmp_path / "dump"

    async def run(trainer: Any) -> list[Any]:
        await asyncio.gather(*(trainer.overlapping(step, 3) for step in (1, 2, 3)))
        seen = [list(trainer.metrics)]
        for step in (4, 5):
            await trainer.overlapping(step)
            seen.append(list(trainer.metrics))
        return seen

    skipweave.weave(plan(mod, dump, "overlapping"))
    first = mod.Trainer()
    after = asyncio.run(run(first))
    skipweave.unweave()
    assert sorted(mod.CALLS) == [1, 2, 3, 4, 5] and sorted(after[0]) == [1, 2, 3]
    for step in (1, 2, 3):  # each call's list held the other calls' items too: recorded whole
        recorded = entry(dump, step)
        assert recorded.appended is None and recorded.effects == {"self.metrics": after[0]}, step
    assert entry(dump, 4).appended == {"self.metrics": {"n_before": 3, "tail": [4]}}
    assert entry(dump, 5).appended == {"self.metrics": {"n_before": 4, "tail": [5]}}

    mod.CALLS.clear()
    skipweave.weave(plan(mod, dump, "overlapping"))
    second = mod.Trainer()
    assert asyncio.run(run(second)) == after  # the gathered steps put a whole list back, the later ones append
    skipweave.unweave()
    assert mod.CALLS == []


def test_an_entry_with_the_whole_list_recorded_still_replays_it(mod: Any, tmp_path: Path) -> None:
    """Entries recorded before tails were recorded hold the whole list under ``effects``: a replay puts it back."""
    dump = tmp_path / "dump"
    store = StepStore(str(dump), "default", "rollout")
    whole = [{"step": 1, "loss": 0.5, "name": "m1"}, {"step": 2, "loss": 1.0, "name": "m2"}]
    store.record(store.key(2, "gen", "r0", 0), {"step": 2, "tokens": [2] * 4},
                 target_path=f"{mod.__name__}:Trainer.generate", fingerprint="", rng_state=None, seconds=0.1,
                 effects={"self.metrics": whole})
    store.close_all()
    assert entry(dump, 2).appended is None

    skipweave.weave(plan(mod, dump))
    trainer = mod.Trainer()
    trainer.metrics = keep = [{"other": True}]  # not run 1's list before the call: the whole value replaces it
    assert trainer.generate(2) == {"step": 2, "tokens": [2] * 4}
    skipweave.unweave()
    assert mod.CALLS == [] and trainer.metrics is keep and keep == whole


def test_a_replay_onto_a_list_of_another_length_appends_and_warns_once(mod: Any, tmp_path: Path,
                                                                       caplog: Any) -> None:
    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump))
    first = mod.Trainer()
    for step in (1, 2, 3):
        first.generate(step)
    skipweave.unweave()

    skipweave.weave(plan(mod, dump))
    second = mod.Trainer()
    for step in (2, 3):  # step 1 not called: the list holds one item less than run 1's before each call
        second.generate(step)
    skipweave.unweave()
    assert second.metrics == first.metrics[1:]
    warned = [r.getMessage() for r in caplog.records if "self.metrics" in r.getMessage()]
    assert len(warned) == 1 and "held 0 items before the call where the recording's held 1" in warned[0], warned


def test_a_replay_onto_something_not_a_list_runs_live(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump))
    for step in (1, 2):
        mod.Trainer().generate(step)
    skipweave.unweave()

    mod.CALLS.clear()
    skipweave.weave(plan(mod, dump))
    trainer = mod.Trainer()
    trainer.metrics = ()  # cannot be appended to: the entry is not served, the call runs live
    with pytest.raises(AttributeError):
        trainer.generate(1)
    trainer.metrics = []
    trainer.generate(2)
    skipweave.unweave()
    assert mod.CALLS == [1] and len(trainer.metrics) == 1


DEQUE_HOST = '''
from collections import defaultdict, deque

CALLS = []


class Trainer:
    """Keeps the last 4 completions it logged, as TRL's trainers do (``self._logs``)."""

    def __init__(self):
        self._logs = {"completion": deque(maxlen=4), "rewards": defaultdict(lambda: deque(maxlen=4))}

    def generate(self, step):
        CALLS.append(step)
        texts = [f"s{step}c{i}" for i in range(3)]
        self._logs["completion"].extend(texts)
        self._logs["rewards"]["rule"].extend(float(step + i) for i in range(3))
        return {"step": step}
'''


def test_deques_and_the_values_a_defaultdict_makes_are_restored_as_the_host_made_them(
        host_module: Any, tmp_path: Path) -> None:
    """A deque is recorded as the list of its items and refilled in place, its ``maxlen`` kept; a key a
    ``defaultdict`` lacks on replay gets its factory's value (a bounded deque), filled, not the recording's list,
    so the host's later appends stay bounded as in run 1."""
    name, _ = host_module(DEQUE_HOST)
    mod = sys.modules[name]
    dump = tmp_path / "dump"
    role = plan(mod, dump, effects=["self._logs"])
    skipweave.weave(role)
    first, after = mod.Trainer(), []
    for step in (1, 2):
        first.generate(step)
        after.append({"completion": list(first._logs["completion"]),
                      "rewards": {k: list(v) for k, v in first._logs["rewards"].items()}})
    skipweave.unweave()
    assert after[1]["completion"] == ["s1c2", "s2c0", "s2c1", "s2c2"]  # bounded by maxlen 4

    mod.CALLS.clear()
    skipweave.weave(role)
    second = mod.Trainer()
    completions = second._logs["completion"]
    for step in (1, 2):
        second.generate(step)
        rewards = second._logs["rewards"]["rule"]
        assert list(second._logs["completion"]) == after[step - 1]["completion"]
        assert list(rewards) == after[step - 1]["rewards"]["rule"]
        assert type(rewards).__name__ == "deque" and rewards.maxlen == 4
    skipweave.unweave()
    assert mod.CALLS == []
    assert second._logs["completion"] is completions and completions.maxlen == 4
    second._logs["rewards"]["rule"].extend([9.0] * 4)  # the host appends on: bounded as run 1's deque is
    assert len(second._logs["rewards"]["rule"]) == 4
