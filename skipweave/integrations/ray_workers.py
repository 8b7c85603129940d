"""Ray worker propagation: every Ray worker process of a job weaves the driver's plan at start-up.

verl runs its trainer and its rollouts inside Ray actors, which live in worker processes of their
own: a patch made in the driver never reaches them. This module carries the woven plan to them.

Driver side (:func:`propagate`, called by :func:`skipweave.weave`):
    ``ray.init`` is wrapped (now, or from a post-import hook on ``ray`` so that ``import skipweave``
    never imports Ray). The wrapper merges into the application's own ``runtime_env`` the env var
    ``SKIPWEAVE_PLAN`` (the plan as JSON) and ``worker_process_setup_hook`` = the *dotted* path of
    :func:`worker_setup` (Ray kills every worker when given ``pkg.mod:fn``). The app's env vars and
    working_dir are kept; an app hook of its own is chained through another env var.

Worker side (:func:`worker_setup`, run by Ray in every worker before any task):
    the plan is woven before user code runs. Three things the plain weaver cannot do alone:

    - Ray puts the driver's script directory and working directory on ``sys.path`` only before the
      first task, after the setup hook; they are added here first, or targets there would not resolve.
    - An actor never runs the module's class methods: Ray copies every method of an actor class onto
      a generated subclass (each in a tracing closure holding the method found at ``ray.remote()``
      time) and ships that subclass *by value*; cloudpickle strips the driver's wrapper on the way.
      Classes decorated ``@ray.remote`` or defined in ``__main__`` are rebuilt by value entirely. So
      Ray's actor-class loader is wrapped: each class it loads gets the plan's targets woven onto it
      before Ray reads its methods.
    - A woven module function handed to ``ray.remote`` must still pickle: wrapt proxies refuse to.
      skipweave's wrappers pickle by reference (module and qualified name), so the worker finds its
      own woven function (:func:`install_pickle_support`).

Failures:
    A setup hook that raises makes Ray kill the worker (tasks then fail with a bare
    ``WorkerCrashedError`` after their retries). :func:`worker_setup` never raises for a failed
    weave: it logs the error with the worker (pid, node) and the target, and every later call of a
    target in that worker raises :class:`WorkerWeaveError` instead of silently running live. Ray
    hands that error to the driver's ``ray.get`` (as a ``RayTaskError`` that is also a
    :class:`WorkerWeaveError`), which stops the job with a clear message.
"""

from __future__ import annotations

import base64
import copyreg
import dataclasses
import importlib
import inspect
import json
import logging
import os
import sys
import threading
import types
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import wrapt

from skipweave.store.identity import RUN_ENV, RUN_STARTED_ENV, run_id, run_started
from skipweave.weaving.unpatch import remove_wrapper

if TYPE_CHECKING:
    from skipweave.config.schema import RoleConfig, SkipConfig, TargetSpec

logger = logging.getLogger(__name__)

PLAN_ENV = "SKIPWEAVE_PLAN"
"""Env var holding the woven plan (``{"skip": {...}}`` as JSON) in every Ray worker of the job."""

APP_HOOK_ENV = "SKIPWEAVE_APP_SETUP_HOOK"
"""Env var holding the dotted path of the application's own ``worker_process_setup_hook``."""

APP_HOOK_PICKLE_ENV = "SKIPWEAVE_APP_SETUP_HOOK_PICKLE"
"""Env var holding the application's own setup hook, a callable, as base64 cloudpickle."""

SETUP_HOOK = "skipweave.integrations.ray_workers.worker_setup"
"""Dotted path given to Ray as ``worker_process_setup_hook`` (a ``pkg.mod:fn`` path kills every worker)."""

MAX_PICKLED_HOOK_BYTES = 64 * 1024
"""Largest pickled app hook carried in an env var (Linux caps one env string at 128 KiB)."""

_MAIN_PREFIXES = ("__main__.", "__main__:")
_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")


class WorkerWeaveError(RuntimeError):
    """Weaving failed inside a Ray worker; raised by every later call of a target in that worker.

    Attributes:
        target: the target path whose weave failed (``None`` when the failure is not one target's).
        worker: the worker's identity (pid, node, actor when known).
    """

    def __init__(self, message: str, *, target: str | None = None, worker: str = "") -> None:
        super().__init__(message)
        self.target = target
        self.worker = worker

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles the exception to hand it to the driver; keep the keyword attributes.
        return (_rebuild_error, (type(self), str(self), self.target, self.worker))


def _rebuild_error(
    cls: type[WorkerWeaveError], message: str, target: str | None, worker: str
) -> WorkerWeaveError:
    return cls(message, target=target, worker=worker)


# ---------------------------------------------------------------------------------------------- driver


@dataclass
class _DriverState:
    plan: str | None = None  # the plan as JSON text, None when nothing is propagated
    init_handle: Any = None  # our wrapper on ray.init
    init_owner: Any = None  # the ray module it was installed on
    ray_hook_registered: bool = False


@dataclass
class _WorkerState:
    active: bool = False  # this process is a Ray worker that ran worker_setup
    plan: SkipConfig | None = None  # the full plan, ``__main__`` targets included
    failure: WorkerWeaveError | None = None
    loaders_patched: bool = False
    refused: set[str] = field(default_factory=set)


_DRIVER = _DriverState()
_WORKER = _WorkerState()
_lock = threading.RLock()
_pickle_installed = False


def propagate(plan_json: Mapping[str, Any]) -> None:
    """Make every Ray worker started by a later ``ray.init`` of this process weave ``plan_json``.

    Called by :func:`skipweave.weave` after a successful weave whose plan has enabled roles. Idempotent.
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
            if not _WORKER.active:
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
    runtime_env: Mapping[str, Any] | None, plan: str, *, job_config: Any = None
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

    Raises:
        TypeError: the app's hook is neither a string nor a callable.
        ValueError: the app's callable hook pickles to more than :data:`MAX_PICKLED_HOOK_BYTES`.
    """
    if runtime_env is None and job_config is not None:
        runtime_env = getattr(job_config, "runtime_env", None) or None
    merged: dict[str, Any] = dict(runtime_env or {})
    env_vars = dict(merged.get("env_vars") or {})
    env_vars[PLAN_ENV] = plan
    env_vars.setdefault(RUN_ENV, run_id())  # the workers are writers of the driver's run (store.writers)
    env_vars.setdefault(RUN_STARTED_ENV, repr(run_started()))
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
    """Ray's ``RAY_RUNTIME_ENV_HOOK``, set as ``skipweave.integrations.ray_workers.runtime_env_hook``.

    An alternative to wrapping ``ray.init`` for drivers skipweave cannot weave before their
    ``ray.init``: Ray applies it to the final runtime_env inside ``ray.init``. The plan is the one
    woven in this process, else the ``SKIPWEAVE_PLAN`` env var; without either the runtime_env is
    returned unchanged.
    """
    plan = _DRIVER.plan or os.environ.get(PLAN_ENV)
    if not plan:
        return runtime_env
    return merge_runtime_env(runtime_env, plan)


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
    if plan is None or _WORKER.active:
        return wrapped(*args, **kwargs)
    kwargs = dict(kwargs)
    kwargs["runtime_env"] = merge_runtime_env(
        kwargs.get("runtime_env"), plan, job_config=kwargs.get("job_config")
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
            "RAY_RUNTIME_ENV_HOOK=skipweave.integrations.ray_workers.runtime_env_hook and %s=<plan JSON> in "
            "its environment, so that its ray.init merges the plan itself.", PLAN_ENV,
        )


def _importable_path(fn: Any) -> str | None:
    """``module:qualname`` when ``fn`` is reachable by import in another process, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found = _import_by_path(module, qualname)
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


def _import_by_path(module: str, qualname: str) -> Any:
    """Import ``module`` and walk ``qualname`` (``Class.attr`` allowed)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------- pickling


def install_pickle_support() -> None:
    """Let skipweave's wrappers be pickled (by reference), e.g. a woven function handed to ``ray.remote``.

    wrapt's proxies refuse to pickle. A wrapper of skipweave pickles as "import ``module``, take
    ``qualname``", so the process that unpickles it gets its own object at that path: the woven one
    in a woven Ray worker. Other tools' wrappers keep wrapt's refusal. Registered once, through
    :mod:`copyreg` (cloudpickle and the standard pickler both consult it for this type).
    """
    global _pickle_installed
    if not _pickle_installed:
        copyreg.pickle(wrapt.FunctionWrapper, _reduce_function_wrapper)
        _pickle_installed = True


def _reduce_function_wrapper(obj: Any) -> tuple[Any, ...]:
    if not _is_skipweave_wrapper(obj):
        raise NotImplementedError("object proxy must define __reduce__()")  # wrapt's own answer
    return (_import_by_path, (obj.__module__, obj.__qualname__))


def _is_skipweave_wrapper(obj: Any) -> bool:
    """True when ``obj`` (or a wrapt wrapper under it) is a skipweave proxy or refusal."""
    proxy_mod = sys.modules.get("skipweave.weaving.proxy")
    seen = 0
    while isinstance(obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)) and seen < 32:
        wrapper = getattr(obj, "_self_wrapper", None)
        if isinstance(wrapper, _Refusal) or (proxy_mod is not None and proxy_mod.proxy_of(wrapper) is not None):
            return True
        obj, seen = getattr(obj, "__wrapped__", None), seen + 1
    return False


# ---------------------------------------------------------------------------------------------- worker


def worker_setup() -> None:
    """Ray's ``worker_process_setup_hook``: weave ``SKIPWEAVE_PLAN`` here, then run the app's own hook.

    Never raises for a failed weave (Ray would kill the worker and tasks would fail with no reason):
    the failure is logged with the worker and the target, and every call of a target in this
    worker raises :class:`WorkerWeaveError`. The app's own hook runs after the weave; an error there
    keeps Ray's own behaviour (the worker stops, naming the hook).
    """
    _WORKER.active = True
    from skipweave.store import write_behind

    # Ray ends its workers with SIGTERM and, a fraction of a second later, SIGKILL, running no exit handler: a
    # recording still pending then would be lost. So a worker writes behind only within a task or actor method,
    # which returns once its recordings are committed (_patch_executors), and writes through elsewhere.
    write_behind.write_through("a Ray worker, which Ray ends without running exit handlers")
    try:
        _weave_this_worker()
    except Exception as exc:  # noqa: BLE001 - reported through WorkerWeaveError, never raised here
        from skipweave.weaving.resolve import TargetNotFound

        _fail(exc, target=exc.path if isinstance(exc, TargetNotFound) else None)
    _run_app_hook()


def _weave_this_worker() -> None:
    text = os.environ.get(PLAN_ENV)
    if not text:
        logger.debug("skipweave: %s is not set in this Ray worker; nothing to weave", PLAN_ENV)
        return
    from skipweave import api
    from skipweave.config.loader import load_skip_config

    _add_driver_code_paths()
    _stand_down_launcher_bootstrap()
    _join_the_jobs_run()
    plan = load_skip_config(json.loads(text))
    _WORKER.plan = plan
    _patch_actor_class_loaders()
    # ``__main__`` here is Ray's default_worker, not the driver's script: classes defined in the
    # driver's ``__main__`` arrive by value and are woven when Ray loads them (see _after_class_load).
    api.weave(_without_main_targets(plan))
    logger.debug("skipweave: Ray worker %s woven", _worker_identity())


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
    bootstrap = sys.modules.get("skipweave.integrations.launcher.bootstrap")
    deferred = getattr(bootstrap, "DeferredWeave", None)
    if deferred is None:
        return
    import wrapt.importer

    registry: dict[str, list[Any]] = getattr(wrapt.importer, "_post_import_hooks", {})
    for hooks in list(registry.values()):
        for hook in hooks:
            if isinstance(hook, deferred):
                hook.done = True


def _without_main_targets(plan: SkipConfig) -> SkipConfig:
    from skipweave.config.schema import SkipConfig

    roles = {
        name: dataclasses.replace(role, targets=tuple(t for t in role.targets if not _in_main(t.path)))
        for name, role in plan.roles.items()
    }
    return SkipConfig(roles)


def _in_main(path: str) -> bool:
    return path.startswith(_MAIN_PREFIXES)


def _run_app_hook() -> None:
    path = os.environ.get(APP_HOOK_ENV)
    pickled = os.environ.get(APP_HOOK_PICKLE_ENV)
    if not path and not pickled:
        return
    if path:
        module, sep, qualname = path.partition(":")
        if not sep:
            module, _, qualname = path.rpartition(".")
        hook = _import_by_path(module, qualname)
    else:
        from ray import cloudpickle

        hook = cloudpickle.loads(base64.b64decode(pickled or ""))
    try:
        hook()
    except Exception as exc:
        raise RuntimeError(f"the application's own worker_process_setup_hook {path or hook!r} raised "
                           f"(chained after skipweave's)") from exc


# ---------------------------------------------------------------------------------------------- by value


def _patch_actor_class_loaders() -> None:
    if _WORKER.loaders_patched:
        return
    _WORKER.loaders_patched = True
    manager: Any = None
    try:
        from ray._private.function_manager import FunctionActorManager as manager
    except ImportError:
        pass
    missing = [n for n in _LOADERS if not hasattr(manager, n)]
    for name in _LOADERS:
        if name not in missing:
            wrapt.wrap_function_wrapper(manager, name, _after_class_load)
    _patch_executors(manager)
    if missing:
        logger.warning(
            "skipweave: this Ray version has no FunctionActorManager.%s; targets that are actor methods are "
            "not woven in its workers (tasks of module functions still are)", "/".join(missing),
        )


def _patch_executors(manager: Any) -> None:
    """Run every Ray task and actor method of this worker within a write-behind scope
    (:func:`skipweave.store.write_behind.scoped`): what it records is written behind it, and it returns to its
    caller once that is committed. Ray makes each actor method's executor in ``_make_actor_method_executor``
    (when it loads the class) and hands a task's function out of ``get_execution_info``."""
    hooks = {"_make_actor_method_executor": _scoped_method_executor, "get_execution_info": _scoped_task}
    absent = [name for name in hooks if not hasattr(manager, name)]
    for name, hook in hooks.items():
        if name not in absent:
            wrapt.wrap_function_wrapper(manager, name, hook)
    if absent:
        logger.info("skipweave: this Ray version has no FunctionActorManager.%s; recordings of its tasks or actor "
                    "methods are written before each call returns", "/".join(absent))


def _scoped_method_executor(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    def bind(method_name: str, method: Any) -> tuple[str, Any]:
        return method_name, method

    from skipweave.store import write_behind

    method_name, method = bind(*args, **kwargs)
    if not method_name.startswith("__ray"):  # Ray's own methods (__ray_ready__, __ray_terminate__, ...)
        method = write_behind.scoped(method)
    return wrapped(method_name, method)


_SCOPED_TASKS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _scoped_task(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from skipweave.store import write_behind

    info = wrapped(*args, **kwargs)
    function = getattr(info, "function", None)
    if function is None or hasattr(function, "method"):  # an actor method's executor: scoped when it was made
        return info
    try:
        scoped = _SCOPED_TASKS.get(function)
        if scoped is None:
            scoped = _SCOPED_TASKS[function] = write_behind.scoped(function)
    except TypeError:  # not weak-referenceable
        scoped = write_behind.scoped(function)
    return info._replace(function=scoped)


def _after_class_load(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    cls = wrapped(*args, **kwargs)
    if isinstance(cls, type) and _WORKER.plan is not None:
        _weave_loaded_class(cls)
    return cls


def _class_targets(cls: type) -> Iterator[tuple[RoleConfig, TargetSpec, str]]:
    """Yield ``(role, target, method name)`` for each target of the plan that is a method of ``cls``.

    ``cls`` is the class Ray loaded; the user's class is ``cls.__ray_actor_class__`` (Ray's generated
    subclass points back at it). A target ``Cls.method`` applies when ``Cls`` is the user's class or
    one of its bases up to the one that defines ``method`` (a target on a base class method reaches
    the subclasses that inherit it, as it does in the driver).
    """
    assert _WORKER.plan is not None
    user = getattr(cls, "__ray_actor_class__", cls)
    for role in _WORKER.plan.enabled_roles:
        for target in role.targets:
            prefix, _, attr = target.path.replace(":", ".").rpartition(".")
            for klass in user.__mro__:
                if f"{klass.__module__}.{klass.__qualname__}" == prefix:
                    yield role, target, attr
                    break
                if attr in vars(klass):
                    break  # the method comes from here; classes further up do not supply it


def _weave_loaded_class(cls: type) -> None:
    for role, target, attr in _class_targets(cls):
        try:
            current = inspect.getattr_static(cls, attr)
        except AttributeError:
            if not target.optional:
                _fail(LookupError(f"class {cls.__qualname__} loaded by Ray has no attribute '{attr}'"),
                      target=target.path)
            continue
        if _already_woven(current):
            continue
        if _WORKER.failure is None:
            try:
                _apply_to_class(role, target, cls, attr)
                continue
            except Exception as exc:  # noqa: BLE001 - reported through WorkerWeaveError
                _fail(exc, target=target.path)
        _install_refusal(cls, attr, target.path)


def _already_woven(method: Any) -> bool:
    """True when ``method`` is woven, or is Ray's wrapper around a woven method.

    Ray copies every method of an actor class onto its own subclass, wrapped in a tracing closure
    that holds the method it found at ``ray.remote()`` time. That method is woven when the class came
    by reference from a module the worker's weave patched (a driver that did not weave); it is the
    plain function when the class or the driver's woven method came by value.
    """
    if _is_skipweave_wrapper(method):
        return True
    for cell in getattr(method, "__closure__", None) or ():
        try:
            if _is_skipweave_wrapper(cell.cell_contents):
                return True
        except ValueError:  # an empty cell
            continue
    return False


def _apply_to_class(role: RoleConfig, target: TargetSpec, cls: type, attr: str) -> None:
    """Weave one target onto a class object that is not reachable through its module.

    Uses the weaver's internals (``_apply``, ``_lock``, ``_state``) so the patch is made exactly as
    the weaver makes its own and is removed by :func:`skipweave.unweave`. A public
    ``Weaver.weave_object(owner, role, target)`` would replace this (see docs/ray.md).
    """
    from skipweave.weaving.resolve import ResolvedPath
    from skipweave.weaving.weaver import WEAVER, Patch

    holder = types.SimpleNamespace(loaded=cls)
    patch = Patch(role, target, ResolvedPath(target.path, cls.__module__, f"loaded.{attr}"))
    with WEAVER._lock:
        WEAVER._apply(patch, holder)
        WEAVER._state.patches.append(patch)
    logger.debug("skipweave: wove %s onto the class Ray loaded in worker %s", target.path, os.getpid())


# ---------------------------------------------------------------------------------------------- failures


class _Refusal:
    """wrapt wrapper installed on a target of a worker whose weave failed: every call raises."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        failure = _WORKER.failure
        where = _worker_identity(with_call=True)
        raise WorkerWeaveError(
            f"skipweave refused to run {self.target} in Ray worker {where}: weaving this worker failed "
            f"at start-up, so the call would have run live and recorded nothing. {failure}",
            target=failure.target if failure else None, worker=where,
        )


def _fail(exc: BaseException, *, target: str | None) -> None:
    """Record and log a failed weave; refuse every target of the plan in this worker from now on."""
    worker = _worker_identity()
    message = f"skipweave could not weave Ray worker {worker}"
    if target:
        message += f" at target '{target}'"
    message += f": {type(exc).__name__}: {exc}"
    if target:
        message += (". Make the target importable in Ray workers (PYTHONPATH, runtime_env working_dir or "
                    "py_modules) or mark it optional (targets: {name: {path: ..., optional: true}})")
    error = WorkerWeaveError(message, target=target, worker=worker)
    logger.error("%s", error, exc_info=(type(exc), exc, exc.__traceback__))
    with _lock:
        if _WORKER.failure is None:
            _WORKER.failure = error
    _refuse_all_targets()


def _refuse_all_targets() -> None:
    """Install refusals on every target of the plan, now or at its module's first import."""
    from skipweave.weaving.resolve import TargetNotFound, split_path

    plan = _WORKER.plan
    if plan is None:
        return
    for role in plan.enabled_roles:
        for target in role.targets:
            if _in_main(target.path):
                continue  # refused when Ray loads the class (_weave_loaded_class)
            try:
                rpath = split_path(target.path, may_import=not target.optional)
            except TargetNotFound:
                continue  # nothing to refuse: the module does not exist here
            key = f"{rpath.module}|{rpath.attr}"
            if key in _WORKER.refused:
                continue
            _WORKER.refused.add(key)
            hook = _refusal_hook(rpath.module, rpath.attr, target.path)
            wrapt.register_post_import_hook(hook, rpath.module)


def _refusal_hook(module_name: str, attr_path: str, target_path: str) -> Any:
    def on_import(module: Any) -> None:
        from skipweave.weaving.resolve import ResolvedPath, resolve_owner

        try:
            owner, attr = resolve_owner(module, ResolvedPath(target_path, module_name, attr_path))
            _install_refusal(owner, attr, target_path)
        except Exception as exc:  # noqa: BLE001 - never break the host's import
            logger.debug("skipweave: no refusal installed on %s: %s", target_path, exc)

    return on_import


def _install_refusal(owner: Any, attr: str, target_path: str) -> None:
    current = inspect.getattr_static(owner, attr, None)
    if isinstance(getattr(current, "_self_wrapper", None), _Refusal):
        return
    wrapt.wrap_function_wrapper(owner, attr, _Refusal(target_path))


def _worker_identity(*, with_call: bool = False) -> str:
    """``pid=… node=<ip> (<node id>)`` plus, inside a call, the actor or task running it."""
    parts = [f"pid={os.getpid()}"]
    try:
        import ray

        ctx = ray.get_runtime_context()
        parts.append(f"node={ray.util.get_node_ip_address()} ({ctx.get_node_id()[:12]})")
        if with_call:
            actor = ctx.get_actor_id()
            if actor:
                name = ctx.get_actor_name()
                parts.append(f"actor={name + ' ' if name else ''}{actor[:12]}")
            task = ctx.get_task_function_name() or ctx.get_task_name()
            if task:
                parts.append(f"task={task}")
    except Exception:  # noqa: BLE001 - identity is best effort
        pass
    return " ".join(parts)


__all__ = [
    "APP_HOOK_ENV",
    "APP_HOOK_PICKLE_ENV",
    "PLAN_ENV",
    "SETUP_HOOK",
    "WorkerWeaveError",
    "install_pickle_support",
    "merge_runtime_env",
    "propagate",
    "runtime_env_hook",
    "stop",
    "worker_setup",
]
