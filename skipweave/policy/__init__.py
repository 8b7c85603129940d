"""Policy layer: actions, step sources, step selection and bypass predicates (no I/O)."""

from skipweave.policy.actions import choose_step
from skipweave.policy.bypass import make_bypass
from skipweave.policy.steps import StepError, StepSource, get_step, set_step

__all__ = ["StepError", "StepSource", "choose_step", "get_step", "make_bypass", "set_step"]
