"""A plain ``def`` target that hands back an awaitable (a coroutine, an asyncio Task) which its caller awaits.

Recorded as the awaitable's value with ``returned: "awaitable"`` in the manifest, and replayed as an awaitable again,
served when awaited: ``await target(...)`` works on a miss and on a hit alike, and the RNG state and declared effects
are where the live awaitable left them (as for an ``async`` target). A handle to work running elsewhere (a Ray
``ObjectRef``'s shape) is handed back untouched and not recorded. Real patches, a real store, a real event loop.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.store.format.manifest import RETURNED_AWAITABLE
from skipweave.store.staging import EntryMeta
from skipweave.store.step_store import StepStore
from skipweave.weaving.proxy import ReplayMissing

HOST = '''
import asyncio
import random

import torch

CALLS = []


class Handle:
    """Awaitable, but a handle to work running elsewhere (a Ray ObjectRef's shape): no coroutine, no asyncio future."""

    def __init__(self, step):
        self.step = step

    def __await__(self):
        yield from ()
        return {"step": self.step}


class Trainer:
    def __init__(self):
        self.metrics = []

    async def _work(self, step, salt):
        await asyncio.sleep(0)
        CALLS.append(step)
        self.metrics.append({"step": step, "salt": salt})
        return {"step": step, "salt": salt, "draw": random.random(), "noise": torch.rand(3)}

    def generate(self, step, salt=0):
        return self._work(step, salt)

    def scheduled(self, step):
        return asyncio.ensure_future(self._work(step, 0))

    def handle(self, step):
        CALLS.append(step)
        return Handle(step)
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def plan(mod: Any, dump: Path, method: str = "generate", **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {
        "enable": True, "dump_dir": str(dump), "targets": {"gen": f"{mod.__name__}:Trainer.{method}"},
        "step": {"source": "arg", "arg": 0, "path": ""}, "effects": ["self.metrics"], **role,
    }}}


def manifests(dump: Path) -> list[dict[str, Any]]:
    """Every entry's manifest, single or grouped, as a reader loads it."""
    store = StepStore(str(dump), "default", "rollout")
    return [store.load(store.key(step, "gen", "r0", 0)).manifest for step in store.recorded_steps("gen", "r0")]


async def play(trainer: Any, steps: tuple[int, ...], salt: int = 0) -> list[Any]:
    """Each step as a host that awaits the call later: a draw between the call and its await, then after it."""
    seen = []
    for step in steps:
        random.seed(step)
        torch.manual_seed(step)
        pending = trainer.generate(step, salt)
        assert inspect.iscoroutine(pending)  # on a miss and on a hit alike
        between = random.random()  # live, the awaitable has not run yet: it draws after this
        out = await pending
        seen.append((between, out["step"], out["salt"], out["draw"], out["noise"].tolist(), random.random(),
                     torch.rand(1).item(), copy.deepcopy(trainer.metrics)))
    return seen


def session(mod: Any, dump: Path, steps: tuple[int, ...] = (1, 2), salt: int = 0, **role: Any) -> tuple[Any, dict]:
    """One weave, one trainer, ``steps`` played; returns what the host saw and the counters this session moved."""
    skipweave.unweave()
    skipweave.weave(plan(mod, dump, **role))
    before = skipweave.counters()
    seen = asyncio.run(play(mod.Trainer(), steps, salt))
    skipweave.flush()
    after = skipweave.counters()
    return seen, {k: after[k] - before[k] for k in ("hits", "misses", "bypasses")}


def test_a_def_handing_back_a_coroutine_records_its_value_and_replays_an_awaitable(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    live, counts = session(mod, dump)
    assert mod.CALLS == [1, 2] and counts == {"hits": 0, "misses": 2, "bypasses": 0}
    assert [m["returned"] for m in manifests(dump)] == [RETURNED_AWAITABLE, RETURNED_AWAITABLE]

    again, counts = session(mod, dump)
    assert mod.CALLS == [1, 2] and counts == {"hits": 2, "misses": 0, "bypasses": 0}  # no live call
    # the same values, the draws after each await as live (RNG restored when awaited, not at the call: the draw
    # between the call and its await is the seed's, as live), the declared effect appended again
    assert again == live


def test_a_replay_only_run_serves_it_as_an_awaitable_and_stops_at_a_step_never_recorded(
        mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    live, _ = session(mod, dump)
    again, counts = session(mod, dump, replay_only=True)
    assert again == live and counts["hits"] == 2 and mod.CALLS == [1, 2]
    skipweave.unweave()
    skipweave.weave(plan(mod, dump, replay_only=True))
    with pytest.raises(ReplayMissing, match="step 3 call 0"):
        mod.Trainer().generate(3)
    assert mod.CALLS == [1, 2]


def test_an_entry_not_served_when_awaited_runs_live_then_and_is_recorded_again(mod: Any, tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    session(mod, dump, steps=(1,))
    # other inputs, fingerprint.on_mismatch regenerate: found out when awaited, so the live call runs then
    again, counts = session(mod, dump, steps=(1,), salt=7, fingerprint={"on_mismatch": "regenerate"})
    assert mod.CALLS == [1, 1] and again[0][2] == 7 and counts["misses"] == 1
    (manifest,) = manifests(dump)
    assert manifest["returned"] == RETURNED_AWAITABLE
    third, counts = session(mod, dump, steps=(1,), salt=7)
    assert mod.CALLS == [1, 1] and counts["hits"] == 1 and third == again


@pytest.mark.parametrize("serve", ["live", "recorded"])
def test_verify_compares_once_awaited_and_hands_back_an_awaitable(mod: Any, tmp_path: Path, serve: str) -> None:
    dump, report = tmp_path / "dump", tmp_path / "report.jsonl"
    live, _ = session(mod, dump)
    files = sorted(p for p in dump.rglob("*") if p.is_file() and ".runs" not in p.parts)
    verified, counts = session(mod, dump, action="verify", report=str(report), serve=serve)
    assert mod.CALLS == [1, 2, 1, 2]  # every call ran live
    assert [json.loads(x)["status"] for x in report.read_text().splitlines()] == ["identical", "identical"]
    assert verified == live
    assert sorted(p for p in dump.rglob("*") if p.is_file() and ".runs" not in p.parts) == files  # nothing recorded


def test_a_def_handing_back_a_running_task_hands_back_that_task_untouched(mod: Any, tmp_path: Path) -> None:
    """A Task has identity and methods the host uses (``asyncio.wait`` refuses a coroutine; ``done()``, ``cancel()``):
    it is handed back as it is, unrecorded, as an unwoven run would have it."""
    dump = tmp_path / "dump"

    async def run() -> list[Any]:
        trainer = mod.Trainer()
        out = []
        for step in (1, 2):
            task = trainer.scheduled(step)
            done, _ = await asyncio.wait({task})
            assert task in done and task.done()
            out.append(task.result()["step"])
        return out

    skipweave.weave(plan(mod, dump, "scheduled"))
    assert asyncio.run(run()) == [1, 2] and mod.CALLS == [1, 2]
    skipweave.unweave()
    assert manifests(dump) == []


def test_a_handle_to_work_elsewhere_is_handed_back_untouched_and_not_recorded(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = tmp_path / "dump"
    skipweave.weave(plan(mod, dump, "handle"))
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        out = mod.Trainer().handle(1)
        skipweave.flush()
    assert type(out) is mod.Handle and asyncio.run(_awaited(out)) == {"step": 1}
    assert any("a handle to a result still being computed" in r.getMessage() for r in caplog.records)
    assert manifests(dump) == []


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def test_returned_survives_grouping_and_a_plain_result_has_none(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=4)
    items = [(store.key(1, "gen", "r0", c), store.stage({"c": c}, rng_state=None).copied(),
              EntryMeta("m:f", f"fp{c}", 0.1, background=True, returned=RETURNED_AWAITABLE if c % 2 else None))
             for c in range(4)]
    assert all(isinstance(r, tuple) for r in store.commit_many(items))
    store.close_all()
    assert list((tmp_path / "ns" / "rollout" / "1" / "gen").glob("*.pack.json"))  # one group holds them
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=4)
    assert [reader.load(reader.key(1, "gen", "r0", c)).manifest.get("returned") for c in range(4)] == [
        None, RETURNED_AWAITABLE, None, RETURNED_AWAITABLE]
