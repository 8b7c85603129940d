"""Which role configs get the bypass screen, and what it reads."""

from __future__ import annotations

from skipweave.config.schema import BypassConfig, BypassKind, StepSet, StepSourceConfig, StepSourceKind
from skipweave.policy.screen import MAX_STEP_SET, Screen, screen_for

ALL = StepSet(None)
SOME = StepSet(((1, 1), (3, 4)))


def test_verl_defaults_screen_the_validation_flag_and_the_step() -> None:
    s = screen_for(BypassConfig(), StepSourceConfig(), SOME)
    assert s == Screen(0, "meta_info", "validate", "global_steps", frozenset({1, 3, 4}))


def test_every_step_eligible_screens_the_flag_only() -> None:
    s = screen_for(BypassConfig(), StepSourceConfig(), ALL)
    assert s is not None and s.flag == "validate" and s.step_key is None


def test_bypass_never_screens_the_step_only_and_nothing_when_every_step_is_eligible() -> None:
    never = BypassConfig(when=BypassKind.NEVER)
    s = screen_for(never, StepSourceConfig(), SOME)
    assert s is not None and s.flag is None and s.step_key == "global_steps"
    assert screen_for(never, StepSourceConfig(), ALL) is None


def test_shapes_the_screen_leaves_to_the_general_path() -> None:
    callable_bypass = BypassConfig(when=BypassKind.CALLABLE, callable="m:f")
    assert screen_for(callable_bypass, StepSourceConfig(), SOME) is None
    two_flags = BypassConfig(paths=("meta_info.validate", "meta_info.is_eval"))
    assert screen_for(two_flags, StepSourceConfig(), SOME) is None
    deep = BypassConfig(paths=("meta_info.flags.validate",))
    assert screen_for(deep, StepSourceConfig(), SOME) is None
    indexed = BypassConfig(paths=("items.0",))
    assert screen_for(indexed, StepSourceConfig(), SOME) is None


def test_step_elsewhere_keeps_the_flag_screen_without_the_step() -> None:
    for step in (StepSourceConfig(source=StepSourceKind.COUNTER),
                 StepSourceConfig(source=StepSourceKind.SET_STEP),
                 StepSourceConfig(source=StepSourceKind.ARG, arg=1),
                 StepSourceConfig(source=StepSourceKind.ARG, path="state.step")):
        s = screen_for(BypassConfig(), step, SOME)
        assert s is not None and s.flag == "validate" and s.step_key is None, step


def test_named_arguments_use_the_signature_positions() -> None:
    named = BypassConfig(arg="prompts")
    step = StepSourceConfig(source=StepSourceKind.ARG, arg="prompts")
    s = screen_for(named, step, SOME, {"prompts": 1})
    assert s is not None and (s.index, s.step_key) == (1, "global_steps")
    assert screen_for(named, step, SOME, {}) is None  # the name is not a positional parameter


def test_step_containers_stay_small_and_are_shared() -> None:
    one_range = StepSet(((1, 10**9),))
    s = screen_for(BypassConfig(), StepSourceConfig(), one_range)
    assert s is not None and isinstance(s.eligible, range) and 10**9 in s.eligible and 10**9 + 1 not in s.eligible
    several = StepSet(((1, 2), (5, MAX_STEP_SET)))
    s = screen_for(BypassConfig(), StepSourceConfig(), several)
    assert s is not None and isinstance(s.eligible, frozenset) and {1, 2, 5, MAX_STEP_SET} <= s.eligible
    again = screen_for(BypassConfig(), StepSourceConfig(), StepSet(((1, 2), (5, MAX_STEP_SET))))
    assert again is not None and again.eligible is s.eligible  # one set per distinct selection, not per target
    huge = StepSet(((1, 2), (5, MAX_STEP_SET + 5)))
    s = screen_for(BypassConfig(), StepSourceConfig(), huge)
    assert s is not None and s.eligible is huge
    assert MAX_STEP_SET + 5 in s.eligible and MAX_STEP_SET + 6 not in s.eligible and 3 not in s.eligible
