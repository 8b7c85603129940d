"""Step choice of each action, as verl's SkipManager makes it."""

from __future__ import annotations

import pytest

from skipweave.config.schema import Action, StepSet
from skipweave.policy.actions import choose_step


@pytest.mark.parametrize(
    ("action", "step", "recorded", "expected"),
    [
        (Action.CACHE, 2, [1, 3], None),
        (Action.CACHE, 3, [1, 3], 3),
        (Action.REPEAT, 2, [1, 3], 1),
        (Action.REPEAT, 9, [1, 3], 3),
        (Action.REPEAT, 0, [1, 3], 1),
        (Action.REPEAT, 5, [], None),
        (Action.REPEAT_CYCLE, 3, [1, 2], 1),
        (Action.REPEAT_CYCLE, 4, [1, 2], 2),
        (Action.REPEAT_LAST, 7, [1, 2], 2),
    ],
)
def test_choose_step(action: Action, step: int, recorded: list[int], expected: int | None) -> None:
    assert choose_step(action, step, recorded) == expected


def test_record_steps_are_recorded_before_repeating() -> None:
    rec = StepSet(((1, 2),))
    assert choose_step(Action.REPEAT_CYCLE, 2, [1], rec) is None
    assert choose_step(Action.REPEAT_CYCLE, 3, [1, 2], rec) == 1
