"""Actor classes Ray ships by value, woven as Ray loads them; tasks and actor methods within a write-behind scope.

An actor never runs the module's class methods: Ray copies every method of an actor class onto a generated
subclass (each in a tracing closure holding the method found at ``ray.remote()`` time) and ships that subclass
*by value*; cloudpickle strips the driver's wrapper on the way. Classes decorated ``@ray.remote`` or defined in
``__main__`` are rebuilt by value entirely. So Ray's actor-class loader is wrapped: each class it loads gets the
plan's targets woven onto it (:meth:`skipweave.weaving.weaver.Weaver.weave_object`) before Ray reads its methods.

Reads Ray's internal ``FunctionActorManager`` (``ray._private``): Ray offers no public hook at class load.
"""

from __future__ import annotations

import inspect
import logging
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import wrapt

from skipweave.integrations.ray.failures import fail, install_refusal
from skipweave.integrations.ray.pickling import is_skipweave_wrapper
from skipweave.integrations.ray.state import WORKER

if TYPE_CHECKING:
    from skipweave.config.schema import RoleConfig, TargetSpec

logger = logging.getLogger(__name__)

_LOADERS = ("_load_actor_class_from_gcs", "_load_actor_class_from_local")


def patch_actor_class_loaders() -> None:
    """Wrap Ray's actor-class loaders (each class loaded is woven) and executors (each task and actor method
    writes behind, within a scope), once per process. A Ray version without them is logged, not an error."""
    if WORKER.loaders_patched:
        return
    WORKER.loaders_patched = True
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
    if isinstance(cls, type) and WORKER.plan is not None:
        _weave_loaded_class(cls)
    return cls


def _class_targets(cls: type) -> Iterator[tuple[RoleConfig, TargetSpec, str]]:
    """Yield ``(role, target, method name)`` for each target of the plan that is a method of ``cls``.

    ``cls`` is the class Ray loaded; the user's class is ``cls.__ray_actor_class__`` (Ray's generated
    subclass points back at it). A target ``Cls.method`` applies when ``Cls`` is the user's class or
    one of its bases up to the one that defines ``method`` (a target on a base class method reaches
    the subclasses that inherit it, as it does in the driver).
    """
    assert WORKER.plan is not None
    user = getattr(cls, "__ray_actor_class__", cls)
    for role in WORKER.plan.enabled_roles:
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
                fail(LookupError(f"class {cls.__qualname__} loaded by Ray has no attribute '{attr}'"),
                      target=target.path)
            continue
        if _already_woven(current):
            continue
        if WORKER.failure is None:
            try:
                _apply_to_class(role, target, cls, attr)
                continue
            except Exception as exc:  # noqa: BLE001 - reported through WorkerWeaveError
                fail(exc, target=target.path)
        install_refusal(cls, attr, target.path)


def _already_woven(method: Any) -> bool:
    """True when ``method`` is woven, or is Ray's wrapper around a woven method.

    Ray copies every method of an actor class onto its own subclass, wrapped in a tracing closure
    that holds the method it found at ``ray.remote()`` time. That method is woven when the class came
    by reference from a module the worker's weave patched (a driver that did not weave); it is the
    plain function when the class or the driver's woven method came by value.
    """
    if is_skipweave_wrapper(method):
        return True
    for cell in getattr(method, "__closure__", None) or ():
        try:
            if is_skipweave_wrapper(cell.cell_contents):
                return True
        except ValueError:  # an empty cell
            continue
    return False


def _apply_to_class(role: RoleConfig, target: TargetSpec, cls: type, attr: str) -> None:
    """Weave one target onto a class object that is not reachable through its module; :func:`skipweave.unweave`
    removes it with the weaver's own patches."""
    from skipweave.weaving.weaver import WEAVER

    WEAVER.weave_object(role, target, cls, attr)
    logger.debug("skipweave: wove %s onto the class Ray loaded in worker %s", target.path, os.getpid())


__all__ = ["patch_actor_class_loaders"]
