"""Worker side of Ray propagation: Ray runs :func:`worker_setup` in every worker, before any task.

The plan the driver put in ``SKIPWEAVE_PLAN`` is woven before user code runs. What the plain weave cannot do
alone is done around it: Ray puts the driver's script directory and working directory on ``sys.path`` only before
the first task, after the setup hook, so they are added here first, or targets there would not resolve; actor
classes Ray ships by value are woven as Ray loads them (:mod:`~skipweave.integrations.ray.actors`); a failed weave
is reported, never raised (:mod:`~skipweave.integrations.ray.failures`).

:data:`skipweave.integrations.ray.driver.SETUP_HOOK` is this module's dotted path to :func:`worker_setup`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import platform
import sys
from typing import TYPE_CHECKING, Any

from skipweave.env import APP_HOOK_ENV, APP_HOOK_PICKLE_ENV, PLAN_ENV, RUN_ENV, SHARED_MARKS_ENV
from skipweave.integrations.ray.actors import patch_actor_class_loaders
from skipweave.integrations.ray.failures import fail, worker_identity
from skipweave.integrations.ray.pickling import import_by_path
from skipweave.integrations.ray.state import WORKER, in_main

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig

logger = logging.getLogger(__name__)


def worker_setup() -> None:
    """Ray's ``worker_process_setup_hook``: weave ``SKIPWEAVE_PLAN`` here, then run the app's own hook.

    Never raises for a failed weave (Ray would kill the worker and tasks would fail with no reason):
    the failure is logged with the worker and the target, and every call of a target in this
    worker raises :class:`~skipweave.integrations.ray.failures.WorkerWeaveError`. The app's own hook runs after
    the weave; an error there keeps Ray's own behaviour (the worker stops, naming the hook).
    """
    WORKER.active = True
    from skipweave.store import write_behind

    # Ray ends its workers with SIGTERM and, a fraction of a second later, SIGKILL, running no exit handler: a
    # recording still pending then would be lost. So a worker writes behind only within a task or actor method,
    # which returns once its recordings are committed (see ray.actors), and writes through elsewhere.
    write_behind.write_through("a Ray worker, which Ray ends without running exit handlers")
    try:
        _weave_this_worker()
    except Exception as exc:  # noqa: BLE001 - reported through WorkerWeaveError, never raised here
        from skipweave.weaving.resolve import TargetNotFound

        fail(exc, target=exc.path if isinstance(exc, TargetNotFound) else None)
    _run_app_hook()


def _weave_this_worker() -> None:
    text = os.environ.get(PLAN_ENV)
    if not text:
        logger.debug("skipweave: %s is not set in this Ray worker; nothing to weave", PLAN_ENV)
        return
    from skipweave import api
    from skipweave.config.loader import load_skip_config
    from skipweave.integrations.discovery import load_integrations

    load_integrations()  # before the plan is read (config adapters), as the driver did
    _add_driver_code_paths()
    _stand_down_launcher_bootstrap()
    _join_the_jobs_run()
    plan = load_skip_config(json.loads(text))
    WORKER.plan = plan
    patch_actor_class_loaders()
    # ``__main__`` here is Ray's default_worker, not the driver's script: classes defined in the
    # driver's ``__main__`` arrive by value and are woven when Ray loads them (see ray.actors).
    api.weave(_without_main_targets(plan))
    _expect_shared_marks()
    logger.debug("skipweave: Ray worker %s woven", worker_identity())


def _expect_shared_marks() -> None:
    """Have this worker look for the driver's marks in its dump dirs at its first calls (see docs/ray.md#several-nodes).

    ``SKIPWEAVE_SHARED_MARKS`` comes from the driver's ``ray.init`` (:func:`~skipweave.integrations.ray.driver.
    leave_shared_marks`); a value that is not the expected JSON is ignored (nothing is checked), with a DEBUG line.
    """
    from skipweave.weaving.shared_dirs import expect_marks

    text = os.environ.get(SHARED_MARKS_ENV)
    if not text:
        return
    try:
        doc = json.loads(text)
        run, tokens = doc["run"], doc["tokens"]
        if not isinstance(run, str) or not isinstance(tokens, dict):
            raise TypeError("expected {'run': str, 'tokens': {dump_dir: token}}")
    except (ValueError, KeyError, TypeError) as exc:
        logger.debug("skipweave: %s is not usable (%s); the dump dirs are not checked", SHARED_MARKS_ENV, exc)
        return
    expect_marks(run, tokens, where=f"{worker_identity()} host={platform.node()}")


def _join_the_jobs_run() -> None:
    """Without the driver's run id (a job whose driver did not weave), the Ray job id names the run: every
    worker of one job is then a writer of the same run."""
    if os.environ.get(RUN_ENV):
        return
    try:
        import ray

        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - not in a Ray worker after all: this process makes its own run id
        return
    if job:
        os.environ[RUN_ENV] = f"ray-job-{job}"


def _add_driver_code_paths() -> None:
    """Put the driver's code paths on ``sys.path`` now; Ray adds them only before the first task."""
    try:
        import ray

        worker: Any = ray._private.worker.global_worker
        job_config = worker.core_worker.get_job_config()
        paths = [*job_config.code_search_path, *job_config.py_driver_sys_path]
    except Exception as exc:  # noqa: BLE001 - best effort; targets then resolve on the worker's own path
        logger.debug("skipweave: could not read the driver's code paths: %s", exc)
        return
    for path in paths:
        path = os.path.dirname(path) if os.path.isfile(path) else path
        if path and path not in sys.path:
            sys.path.insert(0, path)


def _stand_down_launcher_bootstrap() -> None:
    """Cancel the deferred weave ``skipweave run``'s bootstrap registered in this worker, if any.

    Under ``skipweave run`` every Python process, Ray workers included, also registers a weave for the
    first import of a target's top-level package. In a Ray worker this hook weaves (and also reaches
    classes Ray ships by value), and two weaves must not meet: the bootstrap's fires from inside this
    weave (resolving a target imports its parent package) and stacks a second proxy on the target.
    """
    bootstrap = sys.modules.get("skipweave.integrations.launcher.bootstrap")  # not under `skipweave run`: none
    if bootstrap is not None:
        bootstrap.stand_down()


def _without_main_targets(plan: SkipConfig) -> SkipConfig:
    roles = {
        name: dataclasses.replace(role, targets=tuple(t for t in role.targets if not in_main(t.path)))
        for name, role in plan.roles.items()
    }
    return dataclasses.replace(plan, roles=roles)


def _run_app_hook() -> None:
    path = os.environ.get(APP_HOOK_ENV)
    pickled = os.environ.get(APP_HOOK_PICKLE_ENV)
    if not path and not pickled:
        return
    if path:
        module, sep, qualname = path.partition(":")
        if not sep:
            module, _, qualname = path.rpartition(".")
        hook = import_by_path(module, qualname)
    else:
        from ray import cloudpickle

        hook = cloudpickle.loads(base64.b64decode(pickled or ""))
    try:
        hook()
    except Exception as exc:
        raise RuntimeError(f"the application's own worker_process_setup_hook {path or hook!r} raised "
                           f"(chained after skipweave's)") from exc


__all__ = ["worker_setup"]
