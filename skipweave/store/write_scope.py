"""Write scopes: the background recordings made within one unit of the host's work, so the unit can end only once
they are committed (see :func:`skipweave.store.write_behind.scope`, which opens one, and
:mod:`skipweave.integrations.ray.actors`, which runs every Ray task and actor method in one).

A scope lives in a context variable: the asyncio tasks and ``to_thread`` calls started within it belong to it (they
copy the context); a thread started within it and left running belongs to no scope once it closed.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from typing import Any


class Scope:
    """The recordings handed to the writer within one unit of the host's work (a Ray task or actor method), so
    that unit can end only once they are committed. See :func:`~skipweave.store.write_behind.scope`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: list[concurrent.futures.Future[Any]] = []
        self.open = True

    def add(self, future: concurrent.futures.Future[Any]) -> bool:
        """Count a recording handed over in this scope, so leaving it waits for it. False when the scope closed
        already (a thread or task the unit started and left running):
        :meth:`~skipweave.store.write_behind.WriteBehind.submit` then waits for the recording itself where the
        process writes through."""
        with self._lock:
            if self.open:
                self._futures.append(future)
            return self.open

    def close(self) -> list[concurrent.futures.Future[Any]]:
        """End the scope: later recordings of its context write through; returns the ones to wait for."""
        with self._lock:
            self.open = False
            futures, self._futures = self._futures, []
        return futures


_CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("skipweave_write_scope", default=None)


def current() -> Scope | None:
    """The scope this context runs in, ``None`` outside any."""
    return _CURRENT.get()


def enter() -> tuple[Scope, contextvars.Token[Scope | None]] | None:
    """Open a scope for this context; ``None`` within another one (the outermost waits). Pass the result to
    :func:`leave`."""
    if _CURRENT.get() is not None:
        return None  # within another scope: the outermost waits
    scope = Scope()
    return scope, _CURRENT.set(scope)


def leave(entered: tuple[Scope, contextvars.Token[Scope | None]] | None) -> list[concurrent.futures.Future[Any]]:
    """Close the scope :func:`enter` opened (nothing when it opened none); returns the recordings to wait for."""
    if entered is None:
        return []
    scope, token = entered
    _CURRENT.reset(token)
    return scope.close()


__all__ = ["Scope", "current", "enter", "leave"]
