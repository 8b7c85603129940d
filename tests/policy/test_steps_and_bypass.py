"""Step sources and bypass predicates over real call arguments."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from skipweave.config.schema import BypassConfig, BypassKind, StepSourceConfig, StepSourceKind
from skipweave.policy.bypass import make_bypass
from skipweave.policy.steps import StepError, StepSource, set_step


def test_auto_reads_verl_global_steps_else_counts() -> None:
    src = StepSource(StepSourceConfig(path="meta_info.global_steps"))  # verl's convention
    batch = SimpleNamespace(meta_info={"global_steps": np.int64(5)})
    assert src.step_for(None, (batch,), {}) == 5
    assert [src.step_for(None, ("x",), {}) for _ in range(3)] == [1, 2, 3]


def test_auto_without_a_path_reads_no_argument(caplog: pytest.LogCaptureFixture) -> None:
    """The schema's default names no host: auto is set_step's step, else the call counter, whatever the call
    carries; the first count says so once, naming the key to set."""
    src = StepSource(StepSourceConfig(), name="gen", key="skip.rollout.step")
    batch = SimpleNamespace(meta_info={"global_steps": 5})
    with caplog.at_level("WARNING", logger="skipweave"):
        assert [src.step_for(None, (a,), {}) for a in (batch, 9, batch)] == [1, 2, 3]
    assert [r.getMessage() for r in caplog.records] == [
        "skipweave: gen: no step source set and skipweave.set_step() not called; counting calls as steps (1, 2, …). "
        "If your calls carry their step, set skip.rollout.step (source arg, attr, regex or expr, or convention for a "
        "host's)"]
    set_step(8)
    try:
        assert src.step_for(None, (batch,), {}) == 8 and src.peek(None, (batch,), {}) == 8
    finally:
        set_step(None)
    assert src.peek(None, (batch,), {}) is None
    assert StepSource(StepSourceConfig(source=StepSourceKind.ARG, arg=1)).step_for(None, ("x", 4), {}) == 4


def test_set_step_source_requires_a_step() -> None:
    src = StepSource(StepSourceConfig(source=StepSourceKind.SET_STEP))
    set_step(None)
    with pytest.raises(StepError, match="set_step"):
        src.step_for(None, (), {})
    set_step(4)
    assert src.step_for(None, (), {}) == 4
    set_step(None)


def test_arg_source_error_names_the_path() -> None:
    src = StepSource(StepSourceConfig(source=StepSourceKind.ARG, arg="prompts", path="meta_info.step"))
    with pytest.raises(StepError, match="meta_info.step"):
        src.step_for(None, (), {"prompts": SimpleNamespace(meta_info={})})


def test_bypass_default_is_verl_validate_and_arrays_count() -> None:
    pred = make_bypass(BypassConfig(paths=("meta_info.validate", "non_tensor_batch.validate")), lambda p: None)
    assert pred((SimpleNamespace(meta_info={"validate": True}),), {})
    assert not pred((SimpleNamespace(meta_info={}),), {})
    assert pred((SimpleNamespace(meta_info={}, non_tensor_batch={"validate": np.array([False, True])}),), {})
    assert not make_bypass(BypassConfig(when=BypassKind.NEVER), lambda p: None)(
        (SimpleNamespace(meta_info={"validate": True}),), {})
