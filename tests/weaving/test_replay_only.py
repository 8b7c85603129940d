"""Replay-only roles: a missing recording stops the run, validation is recorded apart and served, stubs stand in.

Real wrapt patches over real host modules and real stores; a recording run and a replay-only run are two
weaves over the same dump dir, as two processes would be.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.config.errors import ConfigError
from skipweave.weaving.proxy import ReplayMissing
from skipweave.weaving.stubs import StubUnforeseen

HOST = '''
from dataclasses import dataclass

CALLS = []
STARTED = []


@dataclass
class Batch:
    meta_info: dict


class Engine:
    """A rollout manager whose constructor starts workers (the engine a replay-only run does without)."""

    def __init__(self, workers):
        STARTED.append(workers)
        self.workers = list(range(workers))

    def generate(self, batch):
        CALLS.append(dict(batch.meta_info))
        step = batch.meta_info["global_steps"]
        kind = "val" if batch.meta_info.get("validate") else "train"
        return Batch({"out": f"{kind}-{step}-{len(CALLS)}"})

    async def agenerate(self, batch):
        return self.generate(batch)

    def sync_weights(self):
        return len(self.workers)

    async def wake_up(self):
        return True

    def shutdown(self):
        self.workers = []


def make_engine():
    return Engine(2)
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def _plan(mod: Any, dump: Path, *, replay_only: bool = False, record_validation: bool = True,
          stub: dict[str, Any] | None = None, steps: Any = "all", **role: Any) -> dict[str, Any]:
    targets: dict[str, Any] = {"gen": f"{mod.__name__}:Engine.generate", "agen": f"{mod.__name__}:Engine.agenerate"}
    if stub is not None:
        targets["engine"] = {"path": f"{mod.__name__}:Engine", "stub": stub}
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(dump), "steps": steps, "replay_only": replay_only,
                                 "record_validation": record_validation, "targets": targets, **role}}}


def _status(out: Any) -> str:
    return str(out.meta_info["skipweave"]["status"])


def test_a_missing_recording_stops_a_replay_only_run_naming_role_target_step_call_and_dump_dir(
        mod: Any, tmp_path: Path) -> None:
    skipweave.weave(_plan(mod, tmp_path))
    engine = mod.Engine(1)
    engine.generate(mod.Batch({"global_steps": 1}))
    skipweave.unweave()
    skipweave.weave(_plan(mod, tmp_path, replay_only=True))
    calls = len(mod.CALLS)
    assert _status(engine.generate(mod.Batch({"global_steps": 1}))) == "hit"
    with pytest.raises(ReplayMissing) as caught:
        engine.generate(mod.Batch({"global_steps": 2}))
    message = str(caught.value)
    for part in ("role rollout", "target gen", "step 2", "call 0", str(tmp_path)):
        assert part in message, (part, message)
    with pytest.raises(ReplayMissing, match="step 1 call 1"):  # a second call of a step recorded once
        engine.generate(mod.Batch({"global_steps": 1}))
    with pytest.raises(ReplayMissing, match="target agen"):
        asyncio.run(engine.agenerate(mod.Batch({"global_steps": 1})))
    assert len(mod.CALLS) == calls  # nothing ran live


def test_validation_is_recorded_apart_live_in_recording_runs_and_served_only_in_replay_only_runs(
        mod: Any, tmp_path: Path) -> None:
    engine = mod.Engine(1)
    train, val = mod.Batch({"global_steps": 3}), mod.Batch({"global_steps": 3, "validate": True})
    skipweave.weave(_plan(mod, tmp_path))
    recorded_train = engine.generate(train).meta_info["out"]
    first_val = engine.generate(val)
    assert _status(first_val) == "bypass"  # runs live, as validation always did
    skipweave.unweave()

    skipweave.weave(_plan(mod, tmp_path))  # a second recording run: validation live again, not recorded twice
    assert engine.generate(train).meta_info["out"] == recorded_train
    again = engine.generate(val)
    assert _status(again) == "bypass" and again.meta_info["out"] != first_val.meta_info["out"]
    skipweave.unweave()
    entries = sorted(p.name for p in (tmp_path / "default" / "rollout" / "3" / "gen").glob("*.manifest.json"))
    assert entries == ["r0-0000.manifest.json", "val_r0-0000.manifest.json"]

    skipweave.weave(_plan(mod, tmp_path, replay_only=True))
    calls = len(mod.CALLS)
    served_val = engine.generate(val)
    assert _status(served_val) == "hit" and served_val.meta_info["out"] == first_val.meta_info["out"]
    assert engine.generate(train).meta_info["out"] == recorded_train  # each kind gets its own recording
    with pytest.raises(ReplayMissing, match="validation call 0"):
        engine.generate(mod.Batch({"global_steps": 4, "validate": True}))
    assert len(mod.CALLS) == calls


def test_without_record_validation_validation_stays_a_plain_bypass(mod: Any, tmp_path: Path) -> None:
    skipweave.weave(_plan(mod, tmp_path, record_validation=False))
    out = mod.Engine(1).generate(mod.Batch({"global_steps": 3, "validate": True}))
    assert _status(out) == "bypass"
    assert not list(tmp_path.rglob("val_*"))


def test_a_validation_training_step_never_serves_the_other(mod: Any, tmp_path: Path) -> None:
    engine = mod.Engine(1)
    skipweave.weave(_plan(mod, tmp_path))
    engine.generate(mod.Batch({"global_steps": 5, "validate": True}))  # only validation recorded at step 5
    skipweave.unweave()
    skipweave.weave(_plan(mod, tmp_path))
    out = engine.generate(mod.Batch({"global_steps": 5}))
    assert _status(out) == "miss" and out.meta_info["out"].startswith("train-")


def test_a_stub_class_gives_a_stand_in_whose_replayed_and_declared_methods_work(mod: Any, tmp_path: Path) -> None:
    stub = {"methods": {"shutdown": None, "sync_weights": 7, "wake_up": True}, "attrs": {"workers": []}}
    skipweave.weave(_plan(mod, tmp_path, stub=stub))
    live = mod.make_engine()  # a recording run: the stub is not woven, the constructor runs
    assert mod.STARTED == [2] and type(live) is mod.Engine
    recorded = live.generate(mod.Batch({"global_steps": 1})).meta_info["out"]
    skipweave.unweave()

    skipweave.weave(_plan(mod, tmp_path, replay_only=True, stub=stub))
    calls = len(mod.CALLS)
    engine = mod.make_engine()
    assert mod.STARTED == [2]  # no constructor ran, no worker started
    assert isinstance(engine, mod.Engine) and engine.workers == []
    assert engine.generate(mod.Batch({"global_steps": 1})).meta_info["out"] == recorded
    assert engine.sync_weights() == 7 and engine.shutdown() is None
    assert asyncio.run(engine.wake_up()) is True
    assert len(mod.CALLS) == calls
    with pytest.raises(ReplayMissing, match="target agen"):  # a replayed method of the stand-in stays replayed
        asyncio.run(engine.agenerate(mod.Batch({"global_steps": 9})))


def test_unforeseen_calls_and_reads_of_a_stand_in_name_the_member_and_the_key(mod: Any, tmp_path: Path) -> None:
    skipweave.weave(_plan(mod, tmp_path, replay_only=True, stub={"methods": {"shutdown": None}}))
    engine = mod.make_engine()
    with pytest.raises(StubUnforeseen) as caught:
        engine.sync_weights()
    text = str(caught.value)
    assert "Engine.sync_weights" in text and "skip.rollout.targets.engine.stub.methods.sync_weights" in text
    with pytest.raises(StubUnforeseen, match=r"Engine\.workers.*stub\.attrs\.workers"):
        _ = engine.workers
    with pytest.raises(StubUnforeseen, match="wake_up"):
        asyncio.run(engine.wake_up())


def test_a_stub_function_returns_its_declared_value_and_is_never_called(mod: Any, tmp_path: Path) -> None:
    plan = _plan(mod, tmp_path, replay_only=True)
    plan["skip"]["rollout"]["targets"]["sync"] = {"path": f"{mod.__name__}:Engine.sync_weights",
                                                  "stub": {"returns": {"version": 3}}}
    skipweave.weave(plan)
    engine = mod.Engine(1)
    first = engine.sync_weights()
    assert first == {"version": 3}
    first["version"] = 4  # a fresh copy per call
    assert engine.sync_weights() == {"version": 3}


@pytest.mark.parametrize("stub, problem", [
    ({"methods": {"shutdown": None}, "proxy": "x.y:Z"}, "no proxy on a stub target"),
    ({"methods": ["shutdown"]}, "a mapping name -> value"),
    ({"methods": {"not a name": None}}, "Python identifiers"),
    ({"returns": object()}, "plain data"),
    ({"calls": {}}, "calls"),
])
def test_bad_stubs_are_config_errors_naming_the_key(mod: Any, tmp_path: Path, stub: dict[str, Any],
                                                    problem: str) -> None:
    target: dict[str, Any] = {"path": f"{mod.__name__}:Engine"}
    if "proxy" in stub:
        target["proxy"] = stub.pop("proxy")
    target["stub"] = stub
    plan = _plan(mod, tmp_path, replay_only=True)
    plan["skip"]["rollout"]["targets"]["engine"] = target
    with pytest.raises(ConfigError, match="skip.rollout.targets.engine") as caught:
        skipweave.weave(plan)
    assert problem in str(caught.value)


def test_a_role_of_stubs_alone_is_refused(mod: Any, tmp_path: Path) -> None:
    plan = {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(tmp_path), "replay_only": True, "targets": {
        "engine": {"path": f"{mod.__name__}:Engine", "stub": {}}}}}}
    with pytest.raises(ConfigError, match="besides its stubs"):
        skipweave.weave(plan)


def test_a_stub_method_that_is_not_one_of_the_class_is_refused_when_built(mod: Any, tmp_path: Path) -> None:
    skipweave.weave(_plan(mod, tmp_path, replay_only=True, stub={"methods": {"shut_down": None}}))
    with pytest.raises(StubUnforeseen, match="has no method 'shut_down'"):
        mod.make_engine()


FACTORY_HOST = '''
import asyncio
import functools
import inspect
import sys

STARTED = []


def auto_await(func):
    """verl's sync-or-await helper: runs the coroutine when called plainly, hands it back when awaited."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        coro = func(*args, **kwargs)
        if sys._getframe(1).f_code.co_flags & inspect.CO_COROUTINE:
            return coro
        return asyncio.run(coro)
    return wrapper


class Servers:
    @classmethod
    @auto_await
    async def create(cls, n):
        STARTED.append(n)
        return cls()

    @auto_await
    async def sleep(self):
        STARTED.append("sleep")
        return "slept"

    def replicas(self):
        return ["r0"]
'''


def test_a_factory_method_stub_returns_a_stand_in_of_its_class_and_bridges_stay_sync_or_await(
        host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(FACTORY_HOST)
    mod = sys.modules[name]
    gen = f"{mod.__name__}:Servers.replicas"
    plan = {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(tmp_path), "replay_only": True, "targets": {
        "gen": gen, "servers": {"path": f"{name}:Servers.create",
                                "stub": {"stand_in": True, "methods": {"sleep": "no-op"}}}}}}}
    skipweave.weave(plan)
    servers = mod.Servers.create(4)
    assert isinstance(servers, mod.Servers) and mod.STARTED == []
    assert servers.sleep() == "no-op"  # called plainly: the value

    async def awaited() -> Any:
        return await servers.sleep(), await mod.Servers.create(2)

    value, again = asyncio.run(awaited())  # awaited: an awaitable, as the helper would hand back
    assert value == "no-op" and isinstance(again, mod.Servers) and mod.STARTED == []
    with pytest.raises(ConfigError, match="no returns with stand_in"):
        skipweave.weave({"skip": {"rollout": {**plan["skip"]["rollout"], "targets": {
            "gen": gen, "servers": {"path": f"{name}:Servers.create", "stub": {"stand_in": True, "returns": 1}}}}}})


def test_every_validation_call_of_a_step_is_recorded_and_served_in_order(mod: Any, tmp_path: Path) -> None:
    engine = mod.Engine(1)
    batches = [mod.Batch({"global_steps": 1, "validate": True, "part": i}) for i in range(3)]
    skipweave.weave(_plan(mod, tmp_path))
    recorded = [engine.generate(b).meta_info["out"] for b in batches]  # verl validates batch by batch
    skipweave.unweave()
    skipweave.weave(_plan(mod, tmp_path, replay_only=True))
    assert [engine.generate(b).meta_info["out"] for b in batches] == recorded
    with pytest.raises(ReplayMissing, match="validation call 3"):
        engine.generate(batches[0])


def test_a_replay_only_call_whose_step_cannot_be_told_stops_instead_of_running_live(mod: Any,
                                                                                    tmp_path: Path) -> None:
    plan = _plan(mod, tmp_path, replay_only=True)
    plan["skip"]["rollout"]["step"] = {"source": "arg", "path": "meta_info.step"}
    skipweave.weave(plan)
    calls = len(mod.CALLS)
    with pytest.raises(ReplayMissing, match="cannot tell"):
        mod.Engine(1).generate(mod.Batch({"global_steps": 1}))
    assert len(mod.CALLS) == calls


def test_a_class_stub_listed_before_a_replayed_method_of_that_class(mod: Any, tmp_path: Path) -> None:
    targets = {"engine": {"path": f"{mod.__name__}:Engine", "stub": {}}, "gen": f"{mod.__name__}:Engine.generate"}
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl",
                                          "dump_dir": str(tmp_path), "replay_only": True,
                                          "targets": targets}}})
    with pytest.raises(ReplayMissing, match="target gen"):  # the method is woven on the class itself
        mod.Engine(1).generate(mod.Batch({"global_steps": 1}))


STANDIN_HOST = '''
class Engine:
    LIMIT = 4

    def __init__(self):
        raise RuntimeError("the engine must not start")

    @property
    def ready(self):
        raise RuntimeError("real property code ran")

    @classmethod
    def build(cls):
        return cls()

    @staticmethod
    def helper():
        return "real"

    async def stream(self):
        yield "real"


class Table(dict):
    def size(self):
        return len(self)


async def tokens():
    yield "real"
'''


def test_stand_ins_keep_the_class_s_own_code_from_running(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(STANDIN_HOST)
    mod = sys.modules[name]
    role = {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "replay_only": True, "targets": {
        "gen": f"{name}:Engine.helper",
        "engine": {"path": f"{name}:Engine", "stub": {"methods": {"build": "built", "stream": ["a", "b"]},
                                                       "attrs": {"ready": True}}},
        "table": {"path": f"{name}:Table", "stub": {"methods": {"size": 0}}},
        "tokens": {"path": f"{name}:tokens", "stub": {"returns": [1, 2]}}}}
    skipweave.weave({"skip": {"rollout": role}})
    engine = mod.Engine()
    assert engine.ready is True and engine.LIMIT == 4  # a declared attribute over a property; class data stays
    assert engine.build() == "built" and type(engine).build() == "built"  # a classmethod, from either side

    async def consume(gen: Any) -> list[Any]:
        return [x async for x in gen]

    assert asyncio.run(consume(engine.stream())) == ["a", "b"]
    assert asyncio.run(consume(mod.tokens())) == [1, 2]
    table = mod.Table()
    assert isinstance(table, dict) and table.size() == 0
    skipweave.unweave()
    skipweave.weave({"skip": {"rollout": {**role, "targets": {
        "gen": f"{name}:Engine.helper", "engine": {"path": f"{name}:Engine", "stub": {}}}}}})
    with pytest.raises(StubUnforeseen, match=r"Engine\.ready.*stub\.attrs\.ready"):
        _ = mod.Engine().ready  # an undeclared property: the class's getter never runs


def test_a_recording_that_cannot_be_restored_says_why_in_a_replay_only_run(mod: Any, tmp_path: Path) -> None:
    live = mod.Engine(1)
    skipweave.weave(_plan(mod, tmp_path, effects=["self.workers"]))
    live.generate(mod.Batch({"global_steps": 1}))
    skipweave.unweave()
    skipweave.weave(_plan(mod, tmp_path, replay_only=True, effects=["self.workers"], stub={}))
    engine = mod.make_engine()  # a stand-in: `workers` was not declared, so the effect cannot be put back
    with pytest.raises(ReplayMissing, match="cannot be served: .*self.workers.*StubUnforeseen"):
        engine.generate(mod.Batch({"global_steps": 1}))
