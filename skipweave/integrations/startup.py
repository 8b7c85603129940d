"""Weaving at a program's start-up, shared by the Hydra callback and the ``skipweave run`` launcher.

What both need beyond :func:`skipweave.weave`: weaving nothing (and importing nothing heavy) when no
role is enabled; proving before the task runs that every non-optional target resolves, even one in a
module the host has not imported yet; and a one-paragraph message that names the key, the value or
the failing part of a target path when that fails.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.config.schema import SkipConfig

logger = logging.getLogger(__name__)


def weave_plan(plan: SkipConfig, *, import_targets: bool = True) -> list[Any]:
    """Weave ``plan``; with ``import_targets``, first import and resolve every non-optional target.

    Resolving first makes a target that cannot resolve fail here, before the host's task runs, rather
    than at the host's own first import of its module; and it fails before the weaver (and with it
    torch) is imported. Optional targets are never imported early: that keeps a profile's declared
    host targets (verl's, say) from pulling their library in.

    Args:
        plan: the validated plan.
        import_targets: import and resolve the non-optional targets before weaving.

    Returns:
        The weaver's patches; ``[]`` without importing the weaver (nor torch) when no role is enabled.

    Raises:
        skipweave.TargetNotFound: a non-optional target does not resolve (names the failing part).
        ImportError: a non-optional target's module fails to import; the message names the target.
    """
    if not plan.enabled_roles:
        if "skipweave.api" in sys.modules:  # an earlier job of a multirun wove something
            sys.modules["skipweave.api"].unweave()
        logger.info("skipweave: no role enabled; nothing woven")
        return []
    if import_targets:
        for role in plan.enabled_roles:
            for target in role.targets:
                if not target.optional:
                    resolve_target(target.path)
    from skipweave.api import weave

    patches = weave(plan)
    if not patches:
        logger.warning(
            "skipweave: role(s) %s enabled but none of their targets exists in this environment (the "
            "profile's host targets are optional); add one with "
            "+skip.<role>.targets.<name>=pkg.mod.Class.method",
            ", ".join(r.role for r in plan.enabled_roles),
        )
        from skipweave import failures, report

        for role in plan.enabled_roles:
            failures.note(failures.DID_NOTHING, role.role, f"skip.{role.role}.targets",
                          f"role {role.role} has no target in this program (its targets are all optional)")
        report.summary_at_exit()
    return list(patches)


def resolve_target(path: str) -> None:
    """Import the module of target ``path`` and check that the attribute path exists in it.

    Raises:
        skipweave.TargetNotFound: the path does not resolve (names the failing part).
        ImportError: the module fails to import; the message names the target.
    """
    from skipweave.weaving.main_script import names_main_script
    from skipweave.weaving.resolve import resolve_owner, split_path

    rpath = split_path(path)
    if names_main_script(rpath.module) is not False:
        return  # the running script's: the weaver resolves it now, or once the script defines it
    try:
        module = importlib.import_module(rpath.module)
    except ImportError as exc:
        raise ImportError(
            f"target '{path}' is in module '{rpath.module}', which fails to import: {exc}"
        ) from exc
    resolve_owner(module, rpath)


def target_key(plan: SkipConfig | None, path: str) -> str | None:
    """Return the config key (``skip.<role>.targets.<name>``) that declares target ``path``, if any."""
    for role in plan.roles.values() if plan is not None else ():
        for target in role.targets:
            if target.path == path:
                return f"skip.{role.role}.targets.{target.name}"
    return None


BEFORE_TASK = "before the task started"
"""When the Hydra callback weaves: in ``on_job_start``, before the task function."""

BEFORE_PROGRAM = "before the program started"
"""When ``skipweave run`` checks the plan: in the launcher, before it starts the command."""

AT_START_UP = "before the program's own code ran"
"""When a ``skipweave run`` process weaves at start-up (a target's package was imported before its code ran)."""


def at_first_import(module: str) -> str:
    """When a ``skipweave run`` process weaves deferred: at the program's first import of ``module``."""
    return f"when the program first imported {module} (its code up to that import had run)"


def at_definition(where: str) -> str:
    """When a target of the main script failed to weave where the script defines it: ``where`` as the main
    script's watch says it (``"the main script's class statement 'Policy' at line 7"``)."""
    return f"at {where} (its code up to there had run)"


def failure_message(
    exc: BaseException, plan: SkipConfig | None = None, *, where: str = "", when: str = BEFORE_TASK
) -> str:
    """Return a one-paragraph explanation of a failed start-up weave, naming key, value or path part.

    Args:
        exc: what :func:`weave_plan` (or config loading) raised.
        plan: the plan, when it was valid, to name the config key of a failing target.
        where: how the user selected skipweave, e.g. ``"+skip=rollout_cache"``, for the hint.
        when: when the run was stopped, so that the message says what of the program had run: one of
            :data:`BEFORE_TASK`, :data:`BEFORE_PROGRAM`, :data:`AT_START_UP`, :func:`at_first_import` or
            :func:`at_definition`.
    """
    from skipweave.weaving.resolve import TargetNotFound

    how = f" ({where})" if where else ""
    if isinstance(exc, ConfigError):
        detail = f"{exc}. Fix {exc.key} on the command line or in the config"
    elif isinstance(exc, TargetNotFound):
        key = target_key(plan, exc.path)
        detail = f"{exc}. Fix {key or 'the target path'}, or mark it {{path: ..., optional: true}}"
    elif isinstance(exc, ImportError):
        detail = f"{exc}. Mark the target {{path: ..., optional: true}} to import it only when the host does"
    else:
        detail = f"{type(exc).__name__}: {exc}"
    return f"skipweave{how}: the run was stopped {when}: {detail}."
