"""Stub targets of replay-only runs: what builds or feeds the inference engine is never called.

In a replay-only run (``skip.<role>.replay_only: true``, profile ``rollout_replay``) every rollout is served
from the store, so the engine behind it -- the rollout manager's worker actors, weight syncs, sleep/wake --
need not exist. A target declared with ``stub:`` is woven only in such runs, and its calls never reach the
real code: a function or method returns the declared ``returns`` value; a class (its constructor, as the
host's module names it, e.g. ``tinygrpo.trainer:RolloutManager``) returns a **stand-in**, an instance of a
subclass made for it without running ``__init__``:

- methods the role replays (woven targets of the class) work as on the real object: they are served;
- methods listed under ``stub.methods`` return their declared value (awaitable when the real one is
  ``async``): a ``shutdown`` or a weight sync becomes a no-op;
- attributes listed under ``stub.attrs`` hold their declared value (a fresh copy per stand-in);
- anything else the host calls or reads raises :class:`StubUnforeseen`, naming the class, the member and
  the config key to declare it under: a replay-only run never silently runs engine code on an object
  whose constructor did not run.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from skipweave import report
from skipweave.weaving.proxy import SkipProxy, awaited_by_caller, proxy_of, wraps_coroutine_function
from skipweave.weaving.unpatch import wrapper_of

logger = logging.getLogger(__name__)

_KEPT_DUNDERS = frozenset({"__init__", "__new__", "__getattr__", "__getattribute__", "__setattr__", "__delattr__",
                           "__class__", "__dict__", "__weakref__", "__init_subclass__", "__subclasshook__",
                           "__class_getitem__", "__repr__", "__str__", "__hash__", "__eq__", "__ne__", "__dir__",
                           "__reduce__", "__reduce_ex__", "__sizeof__", "__format__", "__getstate__", "__module__",
                           "__qualname__", "__doc__", "__annotations__", "__slots__"})
"""Members a stand-in keeps from ``object`` or its class (identity, printing, attribute protocol)."""


class StubUnforeseen(RuntimeError):
    """The host used a member of a stand-in (or called a stub) in a way the profile did not declare."""


def _is_woven(value: Any) -> bool:
    return proxy_of(wrapper_of(value)) is not None


async def ready(value: Any) -> Any:
    """An awaitable of ``value``."""
    return value


def _kind(func: Any) -> str:
    """How a callable hands back its result: ``asyncgen``, ``async``, ``bridge`` (sync-or-await) or ``sync``."""
    if inspect.isasyncgenfunction(func):
        return "asyncgen"
    if inspect.iscoroutinefunction(func):
        return "async"
    return "bridge" if wraps_coroutine_function(func) else "sync"


def returning(value: Any, kind: str) -> Callable[..., Any]:
    """A function of any arguments giving a fresh copy of ``value`` the way a callable of ``kind`` would (an
    async generator yields the items of a list value)."""
    if kind == "asyncgen":
        async def stub_gen(*args: Any, **kwargs: Any) -> Any:
            for item in copy.deepcopy(value) if isinstance(value, list) else ([] if value is None else [value]):
                yield item

        return stub_gen
    if kind == "async":
        async def stub_async(*args: Any, **kwargs: Any) -> Any:
            return copy.deepcopy(value)

        return stub_async

    def stub(*args: Any, **kwargs: Any) -> Any:
        if kind == "bridge" and awaited_by_caller():
            return ready(copy.deepcopy(value))
        return copy.deepcopy(value)

    return stub


def _unforeseen(cls: type, name: str, key: str, kind: str) -> Callable[..., Any]:
    message = (f"skipweave: replay-only stand-in of {cls.__module__}.{cls.__qualname__}: the host called "
               f"{cls.__qualname__}.{name}, which the profile did not foresee; declare what it returns under "
               f"{key}.methods.{name} (null for a no-op), or name it as a target the role replays")
    if kind in ("async", "asyncgen"):
        async def unforeseen_async(*args: Any, **kwargs: Any) -> Any:
            raise StubUnforeseen(message)

        return unforeseen_async

    def unforeseen(*args: Any, **kwargs: Any) -> Any:
        raise StubUnforeseen(message)

    return unforeseen


def stand_in(cls: type, methods: Mapping[str, Any], attrs: Mapping[str, Any], key: str) -> Any:
    """Make a stand-in instance of ``cls`` (see the module docstring); ``__init__`` is not run.

    Args:
        cls: the class the host constructs.
        methods: method name -> the value it returns (deep-copied per call).
        attrs: attribute name -> its value (deep-copied per stand-in).
        key: the config key of the stub (``skip.<role>.targets.<name>.stub``), for messages.

    Raises:
        StubUnforeseen: ``methods`` names something that is not a method of ``cls``.
        TypeError: ``cls`` cannot be subclassed (``final`` C types).
    """
    namespace: dict[str, Any] = {}
    members: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):  # object's own members stay
        members.update(vars(klass))

    def is_method(value: Any) -> bool:
        func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        return callable(func) and not isinstance(value, type)

    for name in methods:
        if name in _KEPT_DUNDERS or not is_method(members.get(name)):
            raise StubUnforeseen(f"skipweave: {key}.methods.{name}: {cls.__qualname__} has no method {name!r} a "
                                 f"stand-in may answer (its methods: "
                                 f"{sorted(n for n, v in members.items() if is_method(v) and n[:2] != '__')[:20]})")
    for name, value in members.items():
        if name in _KEPT_DUNDERS:
            continue
        if name in attrs:
            if hasattr(value, "__set__") or hasattr(value, "__get__"):  # a property or slot: the value goes in
                namespace[name] = None  # the instance's own dict, past a plain class attribute
            continue
        if isinstance(value, property) or (hasattr(value, "__get__") and hasattr(value, "__set__")
                                           and not is_method(value)):
            namespace[name] = _unforeseen_property(cls, name, key)  # its getter is the class's own code
            continue
        if not is_method(value) or _is_woven(value):
            continue  # plain class data stays readable; a replayed method is served by the role's proxy
        wrap = classmethod if isinstance(value, classmethod) else staticmethod if isinstance(value, staticmethod) \
            else None
        func = value.__func__ if wrap is not None else value
        if name in methods:
            made_fn = returning(methods[name], _kind(func))
        elif name == "__del__":
            made_fn = returning(None, "sync")
        else:
            made_fn = _unforeseen(cls, name, key, _kind(func))
        namespace[name] = wrap(made_fn) if wrap is not None else made_fn

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocol probes (copy, pickle, numpy) see a plain missing attribute
        raise StubUnforeseen(
            f"skipweave: replay-only stand-in of {cls.__module__}.{cls.__qualname__}: the host read "
            f"{cls.__qualname__}.{name}, which the profile did not foresee (its constructor never ran); declare "
            f"its value under {key}.attrs.{name}")

    namespace["__getattr__"] = __getattr__
    namespace["__module__"] = cls.__module__
    namespace["__qualname__"] = f"{cls.__qualname__}StandIn"
    made = type(f"{cls.__name__}StandIn", (cls,), namespace)
    obj: Any = _bare_instance(made)
    for name, value in attrs.items():
        object.__setattr__(obj, name, copy.deepcopy(value))
    return obj


def _bare_instance(made: type) -> Any:
    """An instance of ``made`` with no constructor of the host's run: ``object.__new__``, or the ``__new__`` of
    the built-in type it derives from (a ``dict`` subclass)."""
    try:
        return object.__new__(made)
    except TypeError:
        for base in made.__mro__:
            if base.__module__ == "builtins" and base is not object and "__new__" in vars(base):
                return base.__new__(made)  # type: ignore[call-overload]
        raise


def _unforeseen_property(cls: type, name: str, key: str) -> property:
    def getter(self: Any) -> Any:
        raise StubUnforeseen(
            f"skipweave: replay-only stand-in of {cls.__module__}.{cls.__qualname__}: the host read "
            f"{cls.__qualname__}.{name}, which the profile did not foresee (its constructor never ran); declare "
            f"its value under {key}.attrs.{name}")

    return property(getter)


class StubProxy(SkipProxy):
    """The proxy of a stub target: never calls the target; returns the declared value, or a stand-in when the
    target is a class. The weaver installs it only for roles with ``replay_only``."""

    def __call__(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        spec = self.target.stub
        assert spec is not None
        if not self.counts.called:
            report.first_call(self.role.role, self.target.name, eligible=True)
            logger.info("skipweave: replay-only role %s: %s is a stub, never called (%s)", self.role.role,
                        self.target.path, "a stand-in instance" if isinstance(wrapped, type) else
                        f"returns {spec.returns!r}")
        key = f"skip.{self.role.role}.targets.{self.target.name}.stub"
        if isinstance(wrapped, type):
            value = stand_in(wrapped, dict(spec.methods), dict(spec.attrs), key)
        elif spec.stand_in:  # a factory method: a stand-in of its class (``cls`` of a classmethod)
            owner = instance if isinstance(instance, type) else type(instance)
            if instance is None or owner is type(None):
                raise StubUnforeseen(f"skipweave: {key}.stand_in: {self.target.path} is not a method, so it has "
                                     "no class to stand in for; name the class itself as the target")
            value = stand_in(owner, dict(spec.methods), dict(spec.attrs), key)
        else:
            if inspect.isasyncgenfunction(getattr(wrapped, "__func__", wrapped)):
                return returning(spec.returns, "asyncgen")()
            value = copy.deepcopy(spec.returns)
        if self.is_async or (self.bridge and awaited_by_caller()):
            return ready(value)
        return value


__all__ = ["StubProxy", "StubUnforeseen", "stand_in"]
