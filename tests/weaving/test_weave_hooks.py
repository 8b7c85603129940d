"""The weaver's public surface for integrations: weave hooks, weaving an object its path does not reach."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import wrapt

import skipweave
from skipweave.config.schema import SkipConfig
from skipweave.weaving.weave_hooks import WEAVE_HOOKS
from skipweave.weaving.weaver import WEAVER


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def on_weave(self, plan: SkipConfig) -> None:
        self.seen.append(plan)

    def on_unweave(self) -> None:
        self.seen.append(None)


def _cfg(dump: Path, targets: dict[str, str]) -> dict[str, object]:
    return {"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "targets": targets}}}


def test_weave_and_unweave_call_every_registered_hook(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path,
) -> None:
    name, _ = host_module("def free(n):\n    return n + 1\n")
    hook = WEAVE_HOOKS.add(_Recorder())
    try:
        skipweave.weave(_cfg(tmp_path / "d", {"free": f"{name}:free"}))
        skipweave.unweave()
    finally:
        WEAVE_HOOKS.remove(hook)
    assert len(hook.seen) == 2 and isinstance(hook.seen[0], SkipConfig) and hook.seen[1] is None
    names = [type(h).__name__ for h in WEAVE_HOOKS]
    assert "RayPropagation" in names and "Coexistence" in names  # shipped integrations registered themselves


def test_weave_object_weaves_a_class_no_path_reaches_and_unweave_removes_it(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path,
) -> None:
    name, _ = host_module("class Gen:\n    def run(self, n):\n        return n\n")
    skipweave.weave(_cfg(tmp_path / "d", {"run": f"{name}:Gen.run"}))
    try:
        plan = skipweave.woven_plan()
        assert plan is not None
        role = plan.roles["rollout"]
        copy = type("Gen", (), {"run": sys.modules[name].Gen.__dict__["run"].__wrapped__})  # as Ray rebuilds it
        patch = WEAVER.weave_object(role, role.targets[0], copy, "run")
        assert isinstance(copy.__dict__["run"], wrapt.FunctionWrapper) and not patch.pending
        assert patch in WEAVER.patches
    finally:
        skipweave.unweave()
    assert not isinstance(copy.__dict__["run"], wrapt.FunctionWrapper)
