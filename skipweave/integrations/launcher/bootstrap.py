"""Child side of ``skipweave run``: weave the plan from ``SKIPWEAVE_PLAN`` when the host needs it.

Called at start-up of every Python process of the launched program (see ``bootstrap_site``). Weaving
imports the store (and so torch); many processes of a program never touch a target — ``torchrun``'s
own process, Ray's helper processes — so the weave waits for the first import of a target's
top-level package, then runs once for the whole plan. A process that never imports one pays for a
JSON parse and a post-import hook only.

A weave that fails then (a target's class or method does not exist) stops the process with the same
one-paragraph message the Hydra callback gives, and exit status 2. The message says what of the program had
run: nothing of its own when a target's package was already imported at start-up (by ``site`` or the user's
``sitecustomize``), else its code up to the import that triggered the weave.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any, NoReturn

from skipweave.config.parse import parse_skip
from skipweave.config.schema import Action, SkipConfig
from skipweave.env import LOG_LEVEL_ENV, PLAN_ENV, PROGRAM_PID_ENV

logger = logging.getLogger(__name__)

FAILURE_EXIT = 2
"""Exit status of a process whose weave failed."""


def read_plan(environ: Any = None) -> SkipConfig | None:
    """Return the plan in ``SKIPWEAVE_PLAN``, or ``None`` when the variable is unset or empty.

    The integrations are loaded first when there is a plan: its roles name the conventions the integrations declare
    (``convention: verl``), as the parent's did when it wrote the plan.

    Raises:
        skipweave.ConfigError: the JSON is not a valid plan (names the key).
        ValueError: the variable is not JSON, or has no top-level ``skip``.
    """
    raw = (os.environ if environ is None else environ).get(PLAN_ENV, "")
    if not raw.strip():
        return None
    data = json.loads(raw)
    if not isinstance(data, dict) or "skip" not in data:
        raise ValueError(f"{PLAN_ENV} holds no {{'skip': ...}} mapping")
    from skipweave.integrations.discovery import load_integrations

    load_integrations()
    return parse_skip(data["skip"])


def top_module(path: str) -> str:
    """Return the top-level package of a target path (``pkg.mod:Cls.m`` or ``pkg.mod.Cls.m``) -> ``pkg``."""
    return path.partition(":")[0].split(".", 1)[0]


class DeferredWeave:
    """Post-import hook: weave ``plan`` once, at the first import of any target's top-level package."""

    def __init__(self, plan: SkipConfig) -> None:
        self.plan = plan
        self.done = False
        self._lock = threading.Lock()
        self._registering = False  # True while register() runs: a call then comes from the start-up

    def register(self, roots: list[str]) -> None:
        """Hook each top-level package of ``roots``; one already imported runs the weave here, at start-up."""
        import wrapt

        with _registered_lock:
            _registered.append(self)
        self._registering = True
        try:
            for root in roots:
                wrapt.register_post_import_hook(self, root)
        finally:
            self._registering = False

    def cancel(self) -> None:
        """Never weave from now on (the weave has run, or another one takes this process over)."""
        with self._lock:
            self.done = True

    def __call__(self, module: Any) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        from skipweave.integrations.discovery import load_integrations
        from skipweave.integrations.startup import AT_START_UP, at_first_import, failure_message, weave_plan
        from skipweave.weaving.main_script import WATCH

        load_integrations()  # (weave() would too; here, before anything of the plan runs in this process)

        # Read before weaving: the failure message must say what of the program had run by then.
        when = AT_START_UP if self._registering else at_first_import(getattr(module, "__name__", "?"))
        WATCH.on_failure(self.failed_at_definition)  # a target of the script failing at its class statement
        try:
            weave_plan(self.plan)
        except Exception as exc:  # noqa: BLE001 - a failed weave must stop the run
            fail(failure_message(exc, self.plan, where="skipweave run", when=when))

    def failed_at_definition(self, exc: Exception, where: str) -> None:
        """A target of the main script failed to weave where the script defines it (its class lacks the method,
        which only the class statement could tell: it comes from an imported base): stop the program there with
        the start-up message and :data:`FAILURE_EXIT`, as a target of a module stops it at its first import.
        What the program recorded before is committed first (``os._exit`` runs no exit steps)."""
        from skipweave.integrations.startup import at_definition, failure_message
        from skipweave.store.write_behind import flush

        try:
            flush()
        except Exception as flush_exc:  # noqa: BLE001 - the message below matters more than a pending write
            logger.warning("skipweave: pending recordings not committed before stopping: %s", flush_exc)
        fail(failure_message(exc, self.plan, where="skipweave run", when=at_definition(where)))


def account_for_targets(hook: DeferredWeave, plan: SkipConfig) -> None:
    """In the program's first process: have the exit summary name every enabled target that no process of the
    program wove because none imported its package (the weaver accounts for the targets it weaves, and for those
    still waiting once it ran). Quiet about a target another process of the run wove or called (its run marks,
    see :mod:`skipweave.store.runs`), as a Ray driver is about its workers' targets. Imports no torch."""
    from skipweave import report
    from skipweave.accounts import Expected
    from skipweave.store import runs
    from skipweave.store.identity import run_id, run_started

    run, since = run_id(), run_started()  # made here, before any child starts: the program's processes share it
    for role in plan.enabled_roles:
        for target in role.targets:
            if target.optional:
                continue

            def elsewhere(kind: str, role: Any = role, target: Any = target) -> bool:
                return runs.marked(role.dump_dir, role.namespace, role.role, run, target.name, kind, since=since)

            def unwoven(target: Any = target, pid: int = os.getpid()) -> str | None:
                if hook.done or os.getpid() != pid:
                    return None  # the weaver accounts for it (woven, or why not); a forked child says nothing
                return (f"no process of the program imported its package '{top_module(target.path)}' (check the "
                        "path; a class in the script you run is named __main__:Class.method or by the script's "
                        "name)")

            report.expect(role.role, target.name, Expected(
                target.path, report.steps_text(role.steps.to_config()), elsewhere=elsewhere, unwoven=unwoven,
                records=role.action is not Action.VERIFY))


_registered: list[DeferredWeave] = []  # every deferred weave of this process, for stand_down()
_registered_lock = threading.Lock()


def stand_down() -> None:
    """Cancel every deferred weave this process registered, run or not: another weave takes this process over.

    A Ray worker of a program under ``skipweave run`` weaves the plan its driver hands it, and reaches the classes
    Ray ships by value too; two weaves must not meet there (the deferred one would fire from inside the worker's,
    as resolving a target imports its parent package, and stack a second proxy on the target).
    """
    with _registered_lock:
        hooks = list(_registered)
    for hook in hooks:
        hook.cancel()


def fail(message: str) -> NoReturn:
    """Print ``message`` to stderr and end the process at once with :data:`FAILURE_EXIT`.

    ``os._exit``: the failure may surface inside the host's ``import`` statement, in any thread, or
    during interpreter start-up, where ``SystemExit`` would be caught, end one thread only, or abort
    start-up with a traceback.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
    finally:
        os._exit(FAILURE_EXIT)


def show_logs(level: str) -> None:
    """Give the ``skipweave`` logger its own stderr handler at ``level`` (``skipweave run -v``); ``""`` does
    nothing. Its lines then show whatever logging the program configures, and are not repeated by the root
    logger's handlers."""
    if not level or not hasattr(logging, level.upper()):
        return
    log = logging.getLogger("skipweave")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(process)d] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(getattr(logging, level.upper()))
    log.propagate = False


def bootstrap(environ: Any = None) -> DeferredWeave | None:
    """Register the deferred weave of the plan in ``SKIPWEAVE_PLAN``; do nothing without one.

    Returns:
        The hook registered, or ``None`` (no plan, or no enabled role with targets).
    """
    show_logs((os.environ if environ is None else environ).get(LOG_LEVEL_ENV, ""))
    try:
        plan = read_plan(environ)
    except Exception as exc:  # noqa: BLE001 - a corrupt plan must not pass silently
        fail(f"skipweave: {PLAN_ENV} is not a valid plan ({exc}); launch through `skipweave run`.")
    if plan is None or not plan.enabled_roles:
        return None
    hook = DeferredWeave(plan)
    from skipweave.weaving.main_script import MAIN, names_main_script

    # A target in the script itself (train.Cls.m for python train.py) waits for no import: weave at start-up, so
    # that the main script's watch follows the script from its first statement.
    roots = {MAIN if names_main_script(root) is not False else root
             for root in (top_module(t.path) for role in plan.enabled_roles for t in role.targets)}
    if (os.environ if environ is None else environ).get(PROGRAM_PID_ENV) == str(os.getpid()):
        account_for_targets(hook, plan)  # first: the weaver's own accounts, made when it weaves, replace these
    hook.register(sorted(roots))
    logger.debug("skipweave: weave deferred until the first import of %s", ", ".join(sorted(roots)))
    return hook
