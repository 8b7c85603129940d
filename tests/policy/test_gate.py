"""The gate's compiled pieces give what the interpreted forms give: readers, argument lookups, expressions, steps."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from skipweave.config.schema import BypassConfig, BypassKind, StepSet, StepSourceConfig, StepSourceKind
from skipweave.policy.access import MISSING, compile_arg, compile_reader, get_arg, get_path
from skipweave.policy.bypass import make_bypass
from skipweave.policy.expressions import Expression, ExpressionFailed
from skipweave.policy.gate import MAX_STEP_SET, compile_bypass, compile_step, eligible_steps
from skipweave.policy.steps import StepError, StepSource, set_step

VERL_STEP = StepSourceConfig(path="meta_info.global_steps")
"""The step source of a role following verl's convention (skipweave/integrations/verl/convention.py)."""
VERL_BYPASS = BypassConfig(paths=("meta_info.validate",))
"""The bypass of a role following verl's convention."""


class Keys(Mapping):  # type: ignore[type-arg]
    """A Mapping with an attribute of the same name as a key: the key wins."""

    def __init__(self) -> None:
        self.meta_info = {"validate": False}
        self._d = {"meta_info": {"validate": True, "global_steps": 9}}

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Any:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class Proxied:
    """Reports another class, as wrapt's ObjectProxy does: never judged by its type."""

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


OBJECTS: list[Any] = [
    SimpleNamespace(meta_info={"validate": True, "global_steps": 3}),
    SimpleNamespace(meta_info={"global_steps": 3.0}),
    SimpleNamespace(meta_info=OrderedDict(validate=1)),
    SimpleNamespace(meta_info=None),
    SimpleNamespace(),
    {"meta_info": {"validate": 0, "flags": {"eval": True}}},
    {"meta_info": SimpleNamespace(validate=True)},
    Keys(),
    Proxied(SimpleNamespace(meta_info={"global_steps": 5})),
    SimpleNamespace(meta_info={"flags": SimpleNamespace(eval=[1])}),
    SimpleNamespace(items=[SimpleNamespace(step=4)]),
    None,
    3,
    "text",
]
PATHS = ["meta_info", "meta_info.validate", "meta_info.global_steps", "meta_info.flags.eval", "items.0.step",
         "items.-1.step", ""]


@pytest.mark.parametrize("path", PATHS)
def test_compiled_readers_give_what_get_path_gives(path: str) -> None:
    read = compile_reader(path)
    for obj in OBJECTS * 2:  # twice: the second pass reads classes already judged
        assert read(obj) is get_path(obj, path) or read(obj) == get_path(obj, path), (path, obj)


def test_a_class_registered_as_a_mapping_after_it_was_read_is_read_as_one() -> None:
    class Late:
        meta_info = {"validate": False}

        def __contains__(self, key: str) -> bool:
            return key == "meta_info"

        def __getitem__(self, key: str) -> Any:
            return {"validate": True}

    read = compile_reader("meta_info.validate")
    assert read(Late()) is False
    Mapping.register(Late)
    assert read(Late()) is True


@pytest.mark.parametrize("ref", [0, 1, 2, "batch", "step", "absent"])
def test_compiled_argument_lookups_give_what_get_arg_gives(ref: int | str) -> None:
    positions = {"batch": 0, "step": 1}
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("b",), {}), (("b", 3), {}), ((), {"batch": "b"}), (("b",), {"step": 2}), ((), {}),
        (("b", 3, "extra"), {"other": 1}),
    ]
    for pos in (positions, None):
        fast = compile_arg(ref, pos)
        for args, kwargs in calls:
            assert fast(args, kwargs) is get_arg(args, kwargs, ref, pos), (ref, pos, args, kwargs)


def test_bound_expressions_give_what_evaluate_gives() -> None:
    expr = Expression("skip.r.step.expr", "batch.meta_info['global_steps'] + offset + len(args)")
    fast = expr.bind({"batch": 0, "offset": 1}, {"offset": 10})
    batch = SimpleNamespace(meta_info={"global_steps": 2})
    for args, kwargs in (((batch,), {}), ((batch, 5), {}), ((), {"batch": batch}), ((), {"batch": batch,
                                                                                            "offset": 7})):
        assert fast(None, args, kwargs) == expr.evaluate(None, args, kwargs, {"batch": 0, "offset": 1},
                                                         defaults={"offset": 10})
    with pytest.raises(ExpressionFailed, match="no argument 'batch'"):
        fast(None, (), {})
    on_self = Expression("skip.r.bypass.expr", "not self.model.training")
    fast_self = on_self.bind(None, {})
    trainer = SimpleNamespace(model=SimpleNamespace(training=False))
    assert fast_self(trainer, (), {}) is True
    with pytest.raises(AttributeError):  # the host's own error: the interpreted form writes the message
        fast_self(None, (), {})


def test_bypass_shapes() -> None:
    resolve = lambda path: (lambda args, kwargs: bool(kwargs.get("eval")))  # noqa: E731
    never = BypassConfig(when=BypassKind.NEVER)
    assert compile_bypass(never, make_bypass(never, resolve), own=True, expr=None, expr_interpreted=None,
                          positions=None, defaults={}) is None
    expr_cfg = BypassConfig(when=BypassKind.EXPR, expr="flag")
    expr = Expression("skip.r.bypass.expr", "flag")
    fn = compile_bypass(expr_cfg, make_bypass(expr_cfg, resolve), own=True, expr=expr,
                        expr_interpreted=lambda i, a, k: True, positions={"flag": 0}, defaults={})
    assert fn is not None
    batch = SimpleNamespace(meta_info={"validate": True})
    # bypass.expr alone decides: verl's meta_info.validate is not also read (the documented meaning of when=expr)
    assert fn(None, (0,), {}) is False and fn(None, (batch,), {}) is True
    assert make_bypass(expr_cfg, resolve)((SimpleNamespace(meta_info={"validate": True}),), {}) is False
    assert fn(None, (), {}) is True  # the call passed no 'flag': the interpreted form decides (bypass, warned)
    cfg = BypassConfig(when=BypassKind.CALLABLE, callable="m:f")
    fn = compile_bypass(cfg, make_bypass(cfg, resolve), own=True, expr=None, expr_interpreted=None,
                        positions=None, defaults={})
    assert fn is not None and fn(None, (), {"eval": 1}) is True and fn(None, (), {}) is False


@pytest.mark.parametrize("kind, cfg", [
    ("attr", StepSourceConfig(source=StepSourceKind.ATTR, path="state.global_step")),
    ("arg", StepSourceConfig(source=StepSourceKind.ARG, arg="batch", path="meta_info.global_steps")),
    ("expr", StepSourceConfig(source=StepSourceKind.EXPR, expr="self.state.global_step")),
])
def test_compiled_steps_give_what_step_for_gives(kind: str, cfg: StepSourceConfig) -> None:
    values = [3, 3.0, "4", True, None, -2, 2**70, [1]]
    compiled = compile_step(StepSource(cfg, {"batch": 0}), {"batch": 0}, {})
    reference = StepSource(cfg, {"batch": 0}).step_for
    for value in values:
        instance = SimpleNamespace(state=SimpleNamespace(global_step=value))
        batch = SimpleNamespace(meta_info={"global_steps": value})
        outcomes = []
        for step_of in (compiled, reference):
            try:
                outcomes.append(step_of(instance, (batch,), {}))
            except StepError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1], (kind, value)


def test_the_counter_advances_once_per_call_and_auto_falls_back_to_it_once() -> None:
    counter = StepSource(StepSourceConfig(source=StepSourceKind.COUNTER))
    step_of = compile_step(counter, None, {})
    assert [step_of(None, (), {}) for _ in range(3)] == [1, 2, 3]
    auto = StepSource(VERL_STEP)
    step_of = compile_step(auto, None, {})
    plain = SimpleNamespace(meta_info={})
    assert [step_of(None, (plain,), {}) for _ in range(2)] == [1, 2]
    assert step_of(None, (SimpleNamespace(meta_info={"global_steps": 7}),), {}) == 7
    assert step_of(None, (plain,), {}) == 3


def test_step_containers_stay_small_and_are_shared() -> None:
    assert eligible_steps(StepSet(None)) is None
    one_range = eligible_steps(StepSet(((1, 10**9),)))
    assert isinstance(one_range, range) and 10**9 in one_range and 10**9 + 1 not in one_range
    several = eligible_steps(StepSet(((1, 2), (5, MAX_STEP_SET))))
    assert isinstance(several, frozenset) and {1, 2, 5, MAX_STEP_SET} <= several
    assert eligible_steps(StepSet(((1, 2), (5, MAX_STEP_SET)))) is several  # one set per distinct selection
    huge = StepSet(((1, 2), (5, MAX_STEP_SET + 5)))
    got = eligible_steps(huge)
    assert got is huge and MAX_STEP_SET + 5 in got and MAX_STEP_SET + 6 not in got and 3 not in got


def test_missing_is_a_sentinel_not_a_value() -> None:
    assert compile_reader("a")(SimpleNamespace()) is MISSING
    assert compile_reader("a")({}) is MISSING and compile_reader("a.b")({"a": {}}) is MISSING


def _gate(bypass: BypassConfig, step: StepSourceConfig) -> Any:
    from skipweave.policy.gate import compile_gate

    return compile_gate(bypass, make_bypass(bypass, lambda p: (lambda a, k: False)), own=True, expr=None,
                        expr_interpreted=None, source=StepSource(step, {"batch": 0}), steps=StepSet(((1, 1),)),
                        positions={"batch": 0}, defaults={})


def test_path_shapes_read_from_one_argument_decide_as_the_interpreted_gate() -> None:
    from skipweave.policy.gate import compile_gate

    def outcome(bypass: BypassConfig, step: StepSourceConfig, args: tuple[Any, ...], compiled: bool) -> Any:
        gate = compile_gate(bypass, make_bypass(bypass, lambda p: None, {"batch": 0}), own=True, expr=None,
                            expr_interpreted=None, source=StepSource(step, {"batch": 0}), steps=StepSet(None),
                            positions={"batch": 0}, defaults={}, compiled=compiled)
        try:
            return gate.first(None, args, {})
        except StepError:
            return "StepError"

    shapes = [(VERL_BYPASS, VERL_STEP), (BypassConfig(), StepSourceConfig()),
              (BypassConfig(paths=("meta_info.validate", "meta_info.eval")), VERL_STEP),
              (BypassConfig(paths=("flags.validate",)), StepSourceConfig(source=StepSourceKind.ARG, path="info.step")),
              (BypassConfig(paths=("items.0",)), VERL_STEP),
              (VERL_BYPASS, StepSourceConfig(source=StepSourceKind.ARG, path=""))]
    calls = [(SimpleNamespace(meta_info={"global_steps": 4}),), (SimpleNamespace(meta_info={"validate": True}),),
             (SimpleNamespace(meta_info={"eval": 1, "global_steps": 2}),), ({"meta_info": {"global_steps": 7}},),
             (SimpleNamespace(meta_info=Keys()),), (SimpleNamespace(flags={"validate": False}, info={"step": 3}),),
             (SimpleNamespace(),), (5,), ()]
    for bypass, step in shapes:
        for args in calls:
            reference = outcome(bypass, step, args, compiled=False)
            for _ in range(2):  # before and after the argument classes are judged
                assert outcome(bypass, step, args, compiled=True) == reference, (bypass, step, args)


def test_the_defaults_read_no_argument_bypass_nothing_and_count_calls() -> None:
    """Without a convention, the schema's defaults name no host: no argument is read for a step (a plain int first
    argument is no step), no call is bypassed, and the steps are set_step's or the call counter's."""
    from skipweave.policy.gate import compile_bypass

    default = BypassConfig()
    assert compile_bypass(default, make_bypass(default, lambda p: None), own=True, expr=None, expr_interpreted=None,
                          positions=None, defaults={}) is None
    assert not make_bypass(default, lambda p: None)((SimpleNamespace(meta_info={"validate": True}),), {})
    for compiled in (True, False):
        gate = compile_gate_default(compiled)
        assert [gate.first(None, (arg,), {}) for arg in (7, SimpleNamespace(meta_info={"global_steps": 9}))] == [1, 2]
        set_step(40)
        try:
            assert gate.first(None, (7,), {}) == 40
        finally:
            set_step(None)


def compile_gate_default(compiled: bool) -> Any:
    from skipweave.policy.gate import compile_gate

    bypass, step = BypassConfig(), StepSourceConfig()
    return compile_gate(bypass, make_bypass(bypass, lambda p: None), own=True, expr=None, expr_interpreted=None,
                        source=StepSource(step), steps=StepSet(None), positions=None, defaults={}, compiled=compiled)


def test_the_gate_settles_plain_shapes_and_hands_over_the_rest() -> None:
    from skipweave.policy.gate import BYPASS

    gate = _gate(VERL_BYPASS, VERL_STEP)
    batch = SimpleNamespace(meta_info={"global_steps": 4})
    for _ in range(2):  # the first call judges the class (general path), the second reads it inline
        assert gate.first(None, (batch,), {}) == 4
        assert gate.first(None, (SimpleNamespace(meta_info={"validate": True}),), {}) is BYPASS
        assert gate.first(None, (SimpleNamespace(meta_info={"validate": [1], "global_steps": 2}),), {}) is BYPASS
        assert gate.first(None, (SimpleNamespace(meta_info={"validate": [], "global_steps": 2}),), {}) == 2
        assert gate.first(None, (), {"batch": batch}) == 4  # by keyword: the compiled functions
        assert gate.first(None, (Keys(),), {}) is BYPASS  # a Mapping: its keys win
        assert gate.first(None, (SimpleNamespace(meta_info={"global_steps": 3.0}),), {}) == 3


def test_an_argument_named_self_or_a_digit_string_is_an_argument_not_the_instance() -> None:
    from skipweave.policy.gate import compile_gate

    instance = SimpleNamespace(state=SimpleNamespace(global_step=3), meta_info={"validate": True})
    args = (SimpleNamespace(meta_info={"global_steps": 2}), SimpleNamespace(meta_info={"validate": True,
                                                                                       "global_steps": 5}))

    def outcome(bypass: BypassConfig, step: StepSourceConfig, compiled: bool) -> Any:
        gate = compile_gate(bypass, make_bypass(bypass, lambda p: None, {"batch": 0}), own=True, expr=None,
                            expr_interpreted=None, source=StepSource(step, {"batch": 0}), steps=StepSet(None),
                            positions={"batch": 0}, defaults={}, compiled=compiled)
        try:
            return gate.first(instance, args, {})
        except StepError:
            return "StepError"

    for bypass, step in ((BypassConfig(arg="self"), VERL_STEP),
                         (BypassConfig(when=BypassKind.NEVER),
                          StepSourceConfig(source=StepSourceKind.ARG, arg="self", path="state.global_step")),
                         (BypassConfig(arg="1"), StepSourceConfig(source=StepSourceKind.ARG, arg=1))):
        reference = outcome(bypass, step, compiled=False)
        for _ in range(2):  # before and after the argument classes are judged
            assert outcome(bypass, step, compiled=True) == reference, (bypass, step)


def test_numpy_and_torch_bools_are_not_steps_and_int_subclasses_are_plain_ints() -> None:
    import enum

    import numpy as np
    import torch

    class Step(enum.IntEnum):
        TEN = 10

    source = StepSource(StepSourceConfig(source=StepSourceKind.ARG, arg=0, path=""))
    for flag in (np.bool_(True), torch.tensor(True)):
        with pytest.raises(StepError):
            source.step_for(None, (flag,), {})
    step = source.step_for(None, (Step.TEN,), {})
    assert step == 10 and type(step) is int
