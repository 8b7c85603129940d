"""The call engine's parts over real weaves (issue 43): one action class per ``skip.<role>.action``, the frozen
per-target context the parts receive, and the recorder's delivery adapter (how a host's result reaches the store)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.config import load_skip_config
from skipweave.config.schema import Action
from skipweave.policy.actions import choose_step
from skipweave.weaving.actions import ACTIONS, action_for
from skipweave.weaving.calls import LIVE_ONLY, Call, Unserved
from skipweave.weaving.engine import Cache, Repeat, RepeatCycle, RepeatLast
from skipweave.weaving.proxy import SkipProxy, proxy_of
from skipweave.weaving.record import Delivery, Recorder
from skipweave.weaving.verifier import Verify
from tests.conftest import HOST_SOURCE


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST_SOURCE)
    return sys.modules[name]


def _plan(dump: Path, name: str, **role: Any) -> Any:
    return load_skip_config({"skip": {"rollout": {"enable": True, "dump_dir": str(dump),
                                                  "targets": {"g": f"{name}.Gen.generate"}, **role}}})


def _proxy(mod: Any) -> SkipProxy:
    proxy = proxy_of(mod.Gen.generate._self_wrapper)
    assert proxy is not None
    return proxy


def test_every_action_of_the_schema_has_its_class() -> None:
    classes = {Action.CACHE: Cache, Action.REPEAT: Repeat, Action.REPEAT_CYCLE: RepeatCycle,
               Action.REPEAT_LAST: RepeatLast, Action.VERIFY: Verify}
    assert {kind: ACTIONS[kind] for kind in Action} == classes


@pytest.mark.parametrize("kind", [Action.REPEAT, Action.REPEAT_CYCLE, Action.REPEAT_LAST])
def test_a_replaying_action_chooses_as_the_policy_does_and_a_validation_call_only_its_own_step(
        tmp_path: Path, kind: Action) -> None:
    role = _plan(tmp_path, "m", action=kind.value, record_steps="1-2").roles["rollout"]
    action = action_for(role)
    assert action.records and not action.takes_validation and not action.own_step_only(False)
    for step in range(1, 9):
        assert action.serving_step(step, [1, 2, 5]) == choose_step(kind, step, [1, 2, 5], role.record_steps)
    assert action.serving_step(4, [1, 2, 5], validation=True) is None
    assert action.serving_step(5, [1, 2, 5], validation=True) == 5


def test_cache_and_verify_serve_a_call_from_its_own_step_only_and_verify_writes_nothing(tmp_path: Path) -> None:
    cache = action_for(_plan(tmp_path, "m").roles["rollout"])
    verify = action_for(_plan(tmp_path, "m", action="verify").roles["rollout"])
    assert isinstance(cache, Cache) and isinstance(verify, Verify)
    for action in (cache, verify):
        assert action.own_step_only(False) and action.serving_step(3, [1, 2]) is None
        assert action.serving_step(2, [1, 2]) == 2
    assert cache.records and not cache.takes_validation and not cache.validation_fate
    assert not verify.records and verify.takes_validation and "compared with" in verify.validation_fate


def test_the_context_is_frozen_and_names_the_parts_the_engine_uses(mod: Any, tmp_path: Path) -> None:
    skipweave.weave(_plan(tmp_path, mod.__name__, action="verify"))
    try:
        proxy = _proxy(mod)
        ctx = proxy.context
        assert (ctx.role.role, ctx.target.name, ctx.store) == ("rollout", "g", proxy.store)
        assert ctx.ledger is proxy.engine.ledger and ctx.action is proxy.engine.action
        assert isinstance(ctx.action, Verify) and ctx.binding is proxy.binding and ctx.binding is not None
        assert proxy.engine.replayer.ctx is ctx and proxy.engine.recorder.ctx is ctx
        assert ctx.environment.original is proxy.original and ctx.environment.value() is proxy.environment
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.store = None  # type: ignore[misc]
    finally:
        skipweave.unweave()


def test_a_delivery_records_what_it_takes_of_the_result_under_its_own_store_target(mod: Any, tmp_path: Path) -> None:
    """The adapter an integration records through (verl's TransferQueue trainer): another store target, a value taken
    from the host's result, no host state; the host gets its own result untouched. An ``Unserved`` that records
    nothing leaves no entry."""
    skipweave.weave(_plan(tmp_path, mod.__name__, restore_rng=True))
    try:
        proxy = _proxy(mod)
        taken: list[int] = []

        def recorded(result: Any, d: Call) -> dict[str, Any]:
            taken.append(d.step)
            return {"y": result["y"] * 2, "step": d.step}

        recorder = Recorder(proxy.context, Delivery(store_target="elsewhere", recorded=recorded, host_state=False))
        store = proxy.store
        result = {"y": torch.arange(3)}
        for step in (4, 5):
            store.prepare_part(step, "elsewhere", "r0")
            d = Call(step, proxy.ledger.take_index(step, "r0"), "r0", None)
            assert recorder.after_live(result, d, 0.01, outcome=LIVE_ONLY if step == 5 else Unserved()) is result
        skipweave.flush()
        loaded = store.load(store.key(4, "elsewhere", "r0", 0))
        assert torch.equal(loaded.result["y"], torch.arange(3) * 2) and loaded.result["step"] == 4
        assert loaded.rng_state is None and taken == [4]  # (restore_rng is on: the delivery keeps no host state)
        assert torch.equal(result["y"], torch.arange(3))
        assert store.part_calls(5, "elsewhere", "r0") == ()
        assert not (tmp_path / "default" / "rollout" / "4" / "g").exists()
    finally:
        skipweave.unweave()
