"""The Hydra callback a profile registers: weave the job's ``skip`` plan before the task runs.

Every profile (``conf/skip/<name>.yaml``) includes ``conf/skipweave/callback.yaml``, which sets
``hydra.callbacks.skipweave._target_`` to :class:`SkipweaveCallback`; so selecting a profile is all
it takes, with no change to the app. Hydra calls :meth:`SkipweaveCallback.on_job_start` with each
job's composed config (every job of a ``--multirun`` sweep too) right before the task function.

The plan is read from the job config's ``skip`` node (the ``+skip=<name>`` route) merged with, for
apps whose dataclass schema has no room for ``skip``, the callback's own node
``hydra.callbacks.skipweave.skip`` (the ``+skipweave=<name>`` route, which keys win).

Hydra turns an exception raised by a callback into a mere warning and runs the task anyway. A weave
that fails must stop the run, so failures leave as ``SystemExit`` (which Hydra's ``except Exception``
does not catch) carrying a one-paragraph message: Python prints it to stderr and exits with status 1.

A strict plan (``+skip.strict=true``) is judged when each job ends (:meth:`SkipweaveCallback.on_job_end`, after the
unweave that closes the job's summary): a job whose task completed but in which skipweave failed at something
(:mod:`skipweave.failures`) gets one ERROR line naming each failure and its key, and once Hydra's run, or every job
of a sweep, completed, the run ends with ``SystemExit(STRICT_EXIT)`` (exit status 4). A task that raised, or called
``sys.exit``, keeps the status Hydra gives it: Hydra calls no ``on_run_end`` then (nor ``on_multirun_end`` after a
failed job). Code the app runs after its ``@hydra.main`` function returns does not run in a strict run that failed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from hydra.experimental.callback import Callback

logger = logging.getLogger(__name__)

CALLBACK_NODE = "hydra.callbacks.skipweave"
"""Where the profiles register the callback; its ``skip`` child is the dataclass-schema route."""


class SkipweaveCallback(Callback):
    """Weave the ``skip`` plan of each Hydra job at its start; unweave at its end.

    Args:
        **params: the callback node's other keys (its ``skip`` child, on the ``+skipweave=`` route),
            re-read from each job's config in :meth:`on_job_start` so that every job sees its own values.
    """

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.strict = False  # the job woven last has a strict plan
        self.strict_failed = False  # a job whose task completed failed the strict plan it had

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """Weave the job's plan; on any failure stop the run with a clear message.

        Raises:
            SystemExit: the plan is invalid, a non-optional target does not resolve, or weaving fails.
        """
        from skipweave.config import load_skip_config
        from skipweave.integrations.discovery import load_integrations
        from skipweave.integrations.startup import failure_message, weave_plan

        load_integrations()  # before the config is read: the integrations' config adapters take part
        plan = None
        try:
            _refuse_off_integration_profile(config)
            plan = load_skip_config(reports_in_output_dir(job_skip_config(config)))
            self.strict = plan.strict
            weave_plan(plan)
        except Exception as exc:  # noqa: BLE001 - every failure must stop the run, not become a warning
            logger.debug("skipweave: weave failed", exc_info=True)
            raise SystemExit(failure_message(exc, plan, where=_selection(config))) from None

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        """Unweave, closing what the job recorded, so that the next job of a sweep starts clean; judge a strict plan.

        The job's findings (:func:`skipweave.failures.take`) are taken whatever the plan: their WARNINGs were logged
        as they happened, and the next job of a sweep is judged on its own.
        """
        from hydra.core.utils import JobStatus

        from skipweave import failures

        api = sys.modules.get("skipweave.api")
        if api is not None:
            api.unweave()
        found = failures.take()
        if self.strict and found and getattr(job_return, "status", None) is JobStatus.COMPLETED:
            self.strict_failed = True
            logger.error("skipweave%s: strict run failed: %s; the run ends with exit status %d once Hydra's run "
                         "completed", _where(config), failures.describe(found), failures.STRICT_EXIT)

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        """End a run whose job failed its strict plan with :data:`~skipweave.failures.STRICT_EXIT`.

        Raises:
            SystemExit: the job's task completed, and skipweave failed at something its strict plan asked for.
        """
        self._end_strict()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """End a sweep (every job of which completed) with :data:`~skipweave.failures.STRICT_EXIT` when a job failed its
        strict plan.

        Raises:
            SystemExit: as :meth:`on_run_end`.
        """
        self._end_strict()

    def _end_strict(self) -> None:
        if self.strict_failed:
            from skipweave.failures import STRICT_EXIT

            self.strict_failed = False
            raise SystemExit(STRICT_EXIT)


def _refuse_off_integration_profile(config: Any) -> None:
    """Hydra composed the profile of an integration that this process did not load after all (a part of it failed to
    load; Hydra's search path saw only its declaration): its targets would be woven without the host types, adapters
    and hooks they were written for.

    Raises:
        ConfigError: key ``+skip``, naming the profile, the integration and why it is off.
    """
    from omegaconf import OmegaConf

    from skipweave.config.errors import ConfigError
    from skipweave.config.profiles import integration_sources, resolve_profile

    choice = OmegaConf.select(config, "hydra.runtime.choices.skip", default=None)
    if not choice or not any(choice in source.names() for source in integration_sources(off=True)):
        return
    try:
        resolve_profile(choice)  # held elsewhere too (a file of the profile path, a loaded integration): that one
    except ConfigError as exc:
        raise ConfigError("+skip", choice, exc.allowed if isinstance(exc, ConfigError) else str(exc)) from None


def job_skip_config(config: Any) -> dict[str, Any]:
    """Return what skipweave reads of a job's config: ``skip`` (with the callback node's ``skip`` merged
    over it), the legacy verl keys and the keys ``fingerprint.env`` names, as plain containers.
    """
    from omegaconf import OmegaConf

    from skipweave.config.adapters import relevant_config
    from skipweave.config.env_keys import add_named_parts

    source = relevant_config(config)
    extra = OmegaConf.select(config, f"{CALLBACK_NODE}.skip", default=None)
    if extra is not None:
        own = OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else extra
        source["skip"] = _merge(source.get("skip"), own)
        add_named_parts(source, config, own)  # the app keys the callback node's fingerprint.env names
    return source


def reports_in_output_dir(source: dict[str, Any]) -> dict[str, Any]:
    """Give each verify role that names no ``report`` the file ``skipweave-verify.jsonl`` in the job's output folder
    (``hydra.runtime.output_dir``, beside ``.hydra/`` and the job's log), where a Hydra user looks for what a run
    wrote. ``source``: :func:`job_skip_config`'s mapping, changed in place and returned."""
    from hydra.core.hydra_config import HydraConfig

    skip = source.get("skip")
    if not isinstance(skip, dict) or not HydraConfig.initialized():
        return source
    output_dir = HydraConfig.get().runtime.output_dir
    for name, role in list(skip.items()):
        if isinstance(role, Mapping) and role.get("action") == "verify" and role.get("report") in (None, "???"):
            skip[name] = {**role, "report": os.path.join(output_dir, "skipweave-verify.jsonl")}
    return source


def _merge(base: Any, top: Any, path: tuple[str, ...] = ()) -> Any:
    """``top`` (the callback node's ``skip``) over ``base`` (the job's); a ``null`` the callback node holds where null
    means "unset" (a role's ``dump_dir``, ``namespace``, ``steps``, ...; ``fingerprint.on_mismatch``) leaves the
    job's own value: the profiles' twins null what Hydra would refuse as ``???`` there, and must not erase the app's."""
    if isinstance(base, Mapping) and isinstance(top, Mapping):
        out = dict(base)
        for key, value in top.items():
            where = (*path, str(key))
            if value is None and key in base and _null_means_unset(where):
                continue
            out[key] = _merge(base.get(key), value, where)
        return out
    return top


def _null_means_unset(path: tuple[str, ...]) -> bool:
    """Whether ``null`` at ``path`` (role, key, ...) below ``skip`` reads as "unset" (see ``NULL_MEANS_DEFAULT``)."""
    from skipweave.config.loader import NULL_MEANS_DEFAULT

    return (len(path) == 2 and path[1] in NULL_MEANS_DEFAULT) or path[1:] == ("fingerprint", "on_mismatch")


def _where(config: Any) -> str:
    """`` (+skip=rollout_cache)`` or ``""``, for a message."""
    try:
        selection = _selection(config)
    except Exception:  # noqa: BLE001 - only words of a message
        return ""
    return f" ({selection})" if selection else ""


def _selection(config: Any) -> str:
    """Return how the user selected skipweave (``+skip=rollout_cache``), to word a message."""
    from omegaconf import OmegaConf

    for group in ("skip", "skipweave"):
        choice = OmegaConf.select(config, f"hydra.runtime.choices.{group}", default=None)
        if choice:
            return f"+{group}={choice}"
    return ""
