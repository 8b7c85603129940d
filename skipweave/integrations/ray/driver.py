"""Driver side of Ray propagation: a later ``ray.init`` of this process makes every worker weave the plan.

After each weave (:class:`RayPropagation`, a weave hook the Ray integration registers) ``ray.init`` is wrapped, now
or from a post-import hook on ``ray`` so that ``import skipweave`` never imports Ray. The wrapper merges into the
application's own ``runtime_env`` the env var ``SKIPWEAVE_PLAN`` (the plan as JSON) and ``worker_process_setup_hook`` =
:data:`SETUP_HOOK`, the *dotted* path of :func:`skipweave.integrations.ray.worker.worker_setup` (Ray kills every
worker when given ``pkg.mod:fn``). The app's env vars and working_dir are kept; an app hook of its own is chained
through another env var. :func:`runtime_env_hook` does the same merge for Ray's ``RAY_RUNTIME_ENV_HOOK``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import wrapt

from skipweave.config.errors import ConfigError
from skipweave.env import APP_HOOK_ENV, APP_HOOK_PICKLE_ENV, PLAN_ENV, RUN_ENV, RUN_STARTED_ENV, SHARED_MARKS_ENV
from skipweave.integrations.ray.pickling import import_by_path, install_pickle_support
from skipweave.integrations.ray.state import WORKER
from skipweave.store.identity import run_id, run_started
from skipweave.weaving.unpatch import remove_wrapper

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig

logger = logging.getLogger(__name__)

SETUP_HOOK = "skipweave.integrations.ray.worker.worker_setup"
"""Dotted path given to Ray as ``worker_process_setup_hook`` (a ``pkg.mod:fn`` path kills every worker)."""

MAX_PICKLED_HOOK_BYTES = 64 * 1024
"""Largest pickled app hook carried in an env var (Linux caps one env string at 128 KiB)."""


@dataclass
class _DriverState:
    plan: str | None = None  # the plan as JSON text, None when nothing is propagated
    init_handle: Any = None  # our wrapper on ray.init
    init_owner: Any = None  # the ray module it was installed on
    ray_hook_registered: bool = False


_DRIVER = _DriverState()
_lock = threading.RLock()


def propagate(plan_json: Mapping[str, Any]) -> None:
    """Make every Ray worker started by a later ``ray.init`` of this process weave ``plan_json``.

    Called after a successful weave whose plan has enabled roles (:class:`RayPropagation`). Idempotent.
    Ray is not imported here: when it is not imported yet, ``ray.init`` is wrapped on its first import.

    Args:
        plan_json: the woven plan, ``SkipConfig.to_config()`` (``{"skip": {...}}``).
    """
    text = json.dumps(plan_json, sort_keys=True, default=str)
    with _lock:
        _DRIVER.plan = text
        install_pickle_support()
        ray = sys.modules.get("ray")
        if ray is not None and hasattr(ray, "init"):
            _patch_ray_init(ray)
            if not WORKER.active:
                _warn_if_initialized(ray)
        elif not _DRIVER.ray_hook_registered:
            wrapt.register_post_import_hook(_on_ray_import, "ray")
            _DRIVER.ray_hook_registered = True


def stop() -> None:
    """Stop propagating: a later ``ray.init`` starts workers that do not weave; ``ray.init`` is unwrapped."""
    with _lock:
        _DRIVER.plan = None
        handle, owner = _DRIVER.init_handle, _DRIVER.init_owner
        _DRIVER.init_handle = _DRIVER.init_owner = None
        if handle is None:
            return
        if remove_wrapper(owner, "init", handle) is not None:
            # Another tool wrapped ray.init above us with a non-wrapt wrapper; ours now passes through.
            logger.debug("skipweave: ray.init stays wrapped under another wrapper (a pass-through now)")


def merge_runtime_env(
    runtime_env: Mapping[str, Any] | None, plan: str, *, job_config: Any = None,
    shared_marks: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Return a copy of the app's runtime_env that also makes every worker weave ``plan``.

    The app's fields (``env_vars``, ``working_dir``, ``pip``, …) are kept. An app
    ``worker_process_setup_hook`` is chained: a string or an importable function by its path in
    ``SKIPWEAVE_APP_SETUP_HOOK``, any other callable (lambda, closure, ``__main__`` function) as a
    cloudpickle in ``SKIPWEAVE_APP_SETUP_HOOK_PICKLE``. Merging an already merged env changes nothing
    but the plan.

    Args:
        runtime_env: what the app passed to ``ray.init`` (a dict or ``ray.runtime_env.RuntimeEnv``), or None.
        plan: the plan as JSON text.
        job_config: the app's ``JobConfig``; its runtime_env is the base when ``runtime_env`` is None
            (``ray.init``'s ``runtime_env`` argument replaces the job config's).
        shared_marks: ``{dump_dir: token}`` of the marks this driver left (:func:`leave_shared_marks`), handed to
            the workers with this driver's run id in ``SKIPWEAVE_SHARED_MARKS`` (``{"run": ..., "tokens": {...}}``),
            so that each checks its dump dirs are the driver's folders.

    Raises:
        TypeError: the app's hook is neither a string nor a callable.
        ValueError: the app's callable hook pickles to more than :data:`MAX_PICKLED_HOOK_BYTES`.
    """
    if runtime_env is None and job_config is not None:
        runtime_env = getattr(job_config, "runtime_env", None) or None
    merged: dict[str, Any] = dict(runtime_env or {})
    env_vars = dict(merged.get("env_vars") or {})
    env_vars[PLAN_ENV] = plan
    env_vars.setdefault(RUN_ENV, run_id())  # the workers are writers of the driver's run (store.identity)
    env_vars.setdefault(RUN_STARTED_ENV, repr(run_started()))
    if shared_marks:
        env_vars[SHARED_MARKS_ENV] = json.dumps({"run": run_id(), "tokens": dict(shared_marks)}, sort_keys=True)
    app_hook = merged.get("worker_process_setup_hook")
    if app_hook is not None and app_hook != SETUP_HOOK:
        env_vars.pop(APP_HOOK_ENV, None)
        env_vars.pop(APP_HOOK_PICKLE_ENV, None)
        if isinstance(app_hook, str):
            env_vars[APP_HOOK_ENV] = app_hook
        elif callable(app_hook):
            path = _importable_path(app_hook)
            if path is not None:
                env_vars[APP_HOOK_ENV] = path
            else:
                env_vars[APP_HOOK_PICKLE_ENV] = _pickle_hook(app_hook)
        else:
            raise TypeError(f"runtime_env['worker_process_setup_hook'] must be a dotted path or a callable, "
                            f"got {type(app_hook).__name__}")
    merged["env_vars"] = env_vars
    merged["worker_process_setup_hook"] = SETUP_HOOK
    return merged


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``, set as ``skipweave.integrations.ray.driver.runtime_env_hook``.

    An alternative to wrapping ``ray.init`` for drivers skipweave cannot weave before their
    ``ray.init``: Ray applies it to the final runtime_env inside ``ray.init``. The plan is the one
    woven in this process, else the ``SKIPWEAVE_PLAN`` env var; without either the runtime_env is
    returned unchanged.
    """
    plan = _DRIVER.plan or os.environ.get(PLAN_ENV)
    if not plan:
        return runtime_env
    return merge_runtime_env(runtime_env, plan, shared_marks=leave_shared_marks(plan))


def leave_shared_marks(plan: str) -> dict[str, str]:
    """Leave this driver's mark in each dump dir of ``plan``'s enabled roles, before its workers start.

    Each worker then looks for it at its first eligible call per dump dir (:mod:`skipweave.weaving.shared_dirs`): a
    dump dir that is another folder on the worker's node gets a WARNING there, or refuses the role's calls with
    ``require_shared``. A dump dir the mark cannot be written into (read-only) is not checked, with a WARNING here.

    Args:
        plan: the plan as JSON text.

    Returns:
        ``{dump_dir: token}`` of the dump dirs marked.

    Raises:
        ConfigError: a role with ``require_shared: true`` has a dump dir the mark cannot be written into (its workers
            could never tell that it is the driver's folder), before any worker starts.
    """
    from skipweave.config.loader import load_skip_config
    from skipweave.weaving.shared_dirs import leave_marks

    if WORKER.active:  # a Ray worker starting a job of its own: its driver's marks stand
        return {}
    try:
        roles = load_skip_config(json.loads(plan)).enabled_roles
    except Exception as exc:  # noqa: BLE001 - the workers fail on the same plan, with their own message
        logger.debug("skipweave: no shared-path marks: the plan does not load here (%s)", exc)
        return {}
    marked, failed = leave_marks(r.dump_dir for r in roles)
    for dump_dir, why in failed.items():
        strict = [r.role for r in roles if r.dump_dir == dump_dir and r.require_shared]
        if strict:
            raise ConfigError(f"skip.{strict[0]}.require_shared", True,
                              f"a dump_dir the driver can leave its mark in, so that every Ray worker can tell it "
                              f"is the driver's folder ({dump_dir}: {why}); set require_shared: false to record "
                              f"without the check")
        logger.warning("skipweave: could not leave the driver's mark in dump_dir %s (%s): the Ray workers of this job "
                       "cannot check that it is the folder they use", dump_dir, why)
    return marked


def _on_ray_import(module: Any) -> None:
    with _lock:
        if _DRIVER.plan is not None:
            _patch_ray_init(module)


def _patch_ray_init(ray: Any) -> None:
    if _DRIVER.init_handle is not None and _in_wrapper_chain(ray.init, _DRIVER.init_handle):
        return
    _DRIVER.init_handle = wrapt.wrap_function_wrapper(ray, "init", _ray_init_wrapper)
    _DRIVER.init_owner = ray


def _in_wrapper_chain(obj: Any, handle: Any) -> bool:
    seen = 0
    while obj is not None and seen < 32:
        if obj is handle:
            return True
        obj, seen = getattr(obj, "__wrapped__", None), seen + 1
    return False


def _ray_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    plan = _DRIVER.plan
    if plan is None or WORKER.active:
        return wrapped(*args, **kwargs)
    kwargs = dict(kwargs)
    kwargs["runtime_env"] = merge_runtime_env(
        kwargs.get("runtime_env"), plan, job_config=kwargs.get("job_config"), shared_marks=leave_shared_marks(plan)
    )
    logger.info("skipweave: ray.init merges the woven plan into the job's runtime_env; every Ray worker "
                "weaves it at start-up (worker_process_setup_hook=%s)", SETUP_HOOK)
    return wrapped(*args, **kwargs)


def _warn_if_initialized(ray: Any) -> None:
    try:
        initialized = bool(ray.is_initialized())
    except Exception:  # a half-imported or stubbed ray
        return
    if not initialized:
        return
    if os.environ.get(PLAN_ENV):
        # `skipweave run` put the plan in this process's environment: workers of a cluster this
        # process started inherit it (and the launcher's bootstrap) and weave on their own.
        logger.info(
            "skipweave: ray.init() ran before skipweave.weave(); Ray workers started by this process "
            "inherit %s from `skipweave run` and weave it, but workers of a cluster joined with "
            "ray.init(address=...) do not: weave before ray.init to reach those too", PLAN_ENV,
        )
    else:
        logger.warning(
            "skipweave: ray.init() ran before skipweave.weave(): the Ray workers of this job do not weave "
            "the plan, so their actors and tasks run live and record nothing (only this driver is woven). "
            "Weave before ray.init: call skipweave.weave(cfg) first, or start the app with `skipweave run "
            "...` or the Hydra profile (+skip=...), which weave before the app starts; or start the app with "
            "RAY_RUNTIME_ENV_HOOK=skipweave.integrations.ray.driver.runtime_env_hook and %s=<plan JSON> in "
            "its environment, so that its ray.init merges the plan itself.", PLAN_ENV,
        )


def _importable_path(fn: Any) -> str | None:
    """``module:qualname`` when ``fn`` is reachable by import in another process, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found = import_by_path(module, qualname)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is fn else None


def _pickle_hook(fn: Any) -> str:
    from ray import cloudpickle

    data = cloudpickle.dumps(fn)
    if len(data) > MAX_PICKLED_HOOK_BYTES:
        raise ValueError(
            f"runtime_env['worker_process_setup_hook'] {fn!r} pickles to {len(data)} bytes, more than the "
            f"{MAX_PICKLED_HOOK_BYTES} skipweave can chain through an env var; pass it as a dotted path "
            f"'pkg.mod.fn' instead"
        )
    return base64.b64encode(data).decode("ascii")


class RayPropagation:
    """The weave hook that makes the Ray workers of a later ``ray.init`` weave the plan woven here.

    A plan without enabled roles stops an earlier propagation, so that workers never weave a stale plan.
    """

    def on_weave(self, plan: SkipConfig) -> None:
        """Propagate ``plan`` (or stop propagating when it enables no role)."""
        if plan.enabled_roles:
            propagate(plan.to_config())
        else:
            stop()

    def on_unweave(self) -> None:
        """Stop propagating; ``ray.init`` is unwrapped."""
        stop()


RAY_PROPAGATION = RayPropagation()
"""The :class:`RayPropagation` the Ray integration registers (:data:`skipweave.integrations.ray.INTEGRATION`)."""

__all__ = ["MAX_PICKLED_HOOK_BYTES", "RAY_PROPAGATION", "SETUP_HOOK", "RayPropagation", "leave_shared_marks",
           "merge_runtime_env", "propagate", "runtime_env_hook", "stop"]
