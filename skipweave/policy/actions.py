"""Actions: which recorded step may serve a call at a given step.

Follows verl's ``SkipManager`` step choice:

- ``cache``: only the entry recorded for this very step.
- ``repeat``: this step if recorded, else the nearest earlier recorded step, else the nearest later
  one (verl's current ``repeat``).
- ``repeat_cycle``: this step if recorded, else cycle through the recorded steps in order, step ``k``
  served by the ``((k - 1) mod n)``-th recorded step (verl 2026's ``repeat`` over ``1..max_dump_step``).
- ``repeat_last``: this step if recorded, else the last recorded step (verl 2026's ``repeat_last``).

With every ``repeat*`` action a miss is recorded only while nothing is recorded yet, or when the step
lies in ``record_steps`` (verl 2026's ``1..max_dump_step``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from skipweave.config.schema import Action, StepSet


def choose_step(
    action: Action, step: int, recorded: Sequence[int], record_steps: StepSet | None = None
) -> int | None:
    """Return the recorded step that serves ``step``, or ``None`` to call through and record.

    Args:
        action: the role's action.
        step: the call's step.
        recorded: sorted steps that hold a complete recording for this target and shard.
        record_steps: for ``repeat*`` actions, steps that are recorded when missing even though
            another recorded step could serve them; ``None`` means "only the first".

    Returns:
        The serving step, or ``None`` on a miss that should be recorded.
    """
    pos = bisect.bisect_left(recorded, step)
    if pos < len(recorded) and recorded[pos] == step:
        return step
    if action is Action.CACHE or not recorded:
        return None
    if record_steps is not None and step in record_steps:
        return None
    if action is Action.REPEAT:
        return recorded[pos - 1] if pos > 0 else recorded[0]
    if action is Action.REPEAT_CYCLE:
        return recorded[(step - 1) % len(recorded)]
    return recorded[-1]  # REPEAT_LAST
