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
from skipweave.weaving.proxy import SkipProxy, proxy_of

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
    return proxy_of(getattr(value, "_self_wrapper", None)) is not None


_CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _bridge(func: Any) -> bool:
    """A plain ``def`` around an ``async def`` (verl's ``auto_await``): it runs the coroutine when called
    plainly and hands it back when awaited, deciding by its caller's frame."""
    if inspect.iscoroutinefunction(func):
        return False
    inner, seen = getattr(func, "__wrapped__", None), 0
    while inner is not None and seen < 16:
        if inspect.iscoroutinefunction(inner):
            return True
        inner, seen = getattr(inner, "__wrapped__", None), seen + 1
    return False


def awaited_by_caller(depth: int = 2) -> bool:
    """The frame ``depth`` levels up is a coroutine's (its call will be awaited), as ``auto_await`` judges."""
    import sys

    frame = sys._getframe(depth)
    return bool(frame.f_code.co_flags & _CORO_FLAGS)


async def ready(value: Any) -> Any:
    """An awaitable of ``value``."""
    return value


def _returning(value: Any, is_async: bool, bridge: bool = False) -> Callable[..., Any]:
    if is_async:
        async def stub_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            return copy.deepcopy(value)

        return stub_async

    def stub(self: Any, *args: Any, **kwargs: Any) -> Any:
        if bridge and awaited_by_caller():
            return ready(copy.deepcopy(value))
        return copy.deepcopy(value)

    return stub


def _unforeseen(cls: type, name: str, key: str, is_async: bool) -> Callable[..., Any]:
    message = (f"skipweave: replay-only stand-in of {cls.__module__}.{cls.__qualname__}: the host called "
               f"{cls.__qualname__}.{name}, which the profile did not foresee; declare what it returns under "
               f"{key}.methods.{name} (null for a no-op), or name it as a target the role replays")
    if is_async:
        async def unforeseen_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise StubUnforeseen(message)

        return unforeseen_async

    def unforeseen(self: Any, *args: Any, **kwargs: Any) -> Any:
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
    for name in methods:
        if not callable(inspect.getattr_static(cls, name, None)):
            raise StubUnforeseen(f"skipweave: {key}.methods.{name}: {cls.__qualname__} has no method {name!r} "
                                 f"(its methods: {sorted(n for n, v in members.items() if callable(v))[:20]})")
    for name, value in members.items():
        if name in _KEPT_DUNDERS or name in attrs:
            continue
        func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if isinstance(value, property) or not callable(func) or isinstance(value, type):
            continue
        if _is_woven(value):
            continue  # served by the role's proxy
        is_async = inspect.iscoroutinefunction(func)
        if name in methods:
            namespace[name] = _returning(methods[name], is_async, _bridge(func))
        elif name == "__del__":
            namespace[name] = lambda self: None
        else:
            namespace[name] = _unforeseen(cls, name, key, is_async)

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
    obj: Any = object.__new__(made)
    for name, value in attrs.items():
        object.__setattr__(obj, name, copy.deepcopy(value))
    return obj


class StubProxy(SkipProxy):
    """The proxy of a stub target: never calls the target; returns the declared value, or a stand-in when the
    target is a class. The weaver installs it only for roles with ``replay_only``."""

    def __call__(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        spec = self.target.stub
        assert spec is not None
        if not self._counts.called:
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
            value = copy.deepcopy(spec.returns)
        if self.is_async or (self.bridge and awaited_by_caller()):
            return ready(value)
        return value


__all__ = ["StubProxy", "StubUnforeseen", "stand_in"]
