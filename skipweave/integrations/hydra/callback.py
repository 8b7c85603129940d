"""The Hydra callback a profile registers: weave the job's ``skip`` plan before the task runs.

A profile file (``conf/skip/<name>.yaml``, headed ``# @package _global_``) sets
``hydra.callbacks.skipweave._target_`` to :class:`SkipweaveCallback`, so selecting the profile is all
it takes: no change to the app. Hydra calls :meth:`SkipweaveCallback.on_job_start` with the job's
composed config (for every job of a ``--multirun`` sweep too) right before the task function.

Hydra turns an exception raised by a callback into a mere warning and runs the task anyway. A weave
that fails must stop the run, so failures leave as ``SystemExit`` (which Hydra's ``except Exception``
does not catch) carrying a one-paragraph message: Python prints it to stderr and exits with status 1.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hydra.experimental.callback import Callback

logger = logging.getLogger(__name__)


class SkipweaveCallback(Callback):
    """Weave the ``skip`` plan of each Hydra job at its start; unweave at its end.

    Args:
        profile: for apps whose primary config is a dataclass schema (``+skip=<name>`` cannot add a
            ``skip`` key there), the profile to compose when the job starts; set by the
            ``+skipweave=<name>`` config group. ``None`` (the ``+skip=<name>`` route): read the job
            config's own ``skip`` node.
        overrides: with ``profile``, overrides in Hydra's command-line syntax applied to it.
    """

    def __init__(self, profile: str | None = None, overrides: Sequence[str] = ()) -> None:
        self.profile = profile
        self.overrides = [str(o) for o in overrides]

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """Weave the job's plan; on any failure stop the run with a clear message.

        Raises:
            SystemExit: the plan is invalid, a non-optional target does not resolve, or weaving fails.
        """
        from skipweave.config import load_skip_config
        from skipweave.config.legacy import relevant_config
        from skipweave.config.profiles import compose_profile
        from skipweave.integrations.startup import failure_message, weave_plan

        plan = None
        where = f"+skipweave={self.profile}" if self.profile else _selected_profile(config)
        try:
            source: Any = relevant_config(config)
            if self.profile is not None:
                source = compose_profile(self.profile, overrides=self.overrides, base=source)
            plan = load_skip_config(source)
            weave_plan(plan)
        except Exception as exc:  # noqa: BLE001 - every failure must stop the run, not become a warning
            logger.debug("skipweave: weave failed", exc_info=True)
            raise SystemExit(failure_message(exc, plan, where=where)) from None

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """Unweave, closing what the job recorded, so the next job of a sweep starts clean."""
        import sys

        api = sys.modules.get("skipweave.api")
        if api is not None:
            api.unweave()


def _selected_profile(config: Any) -> str:
    try:
        choice = config.hydra.runtime.choices.get("skip")
    except Exception:  # noqa: BLE001 - only used to word a message
        choice = None
    return f"+skip={choice}" if choice else ""
