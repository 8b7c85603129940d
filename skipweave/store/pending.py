"""The entries of one store handed to the background writer and not yet committed.

Part of :class:`~skipweave.store.step_store.StepStore`. A part with such an entry counts as recorded in this process
(a call it serves waits for the write, see :meth:`PendingWrites.wait`); the writer itself is
:mod:`skipweave.store.write_behind`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Collection
from typing import Any

from skipweave.store.format.layout import EntryKey

Part = tuple[int, str, str]
"""A part: ``(step, target, shard)``."""


class PendingWrites:
    """Entries handed to the background writer, by part and call, each with the future that is done once its write
    ended (committed or not)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[Part, dict[int, concurrent.futures.Future[Any]]] = {}

    def add(self, key: EntryKey, future: concurrent.futures.Future[Any]) -> None:
        """``key`` was handed to the background writer; ``future`` is done when its write ended."""
        with self._lock:
            self._parts.setdefault((key.step, key.target, key.shard), {})[key.call] = future

    def done(self, key: EntryKey) -> None:
        """The background write of ``key`` ended (committed or failed)."""
        part = (key.step, key.target, key.shard)
        with self._lock:
            calls = self._parts.get(part)
            if calls is not None:
                calls.pop(key.call, None)
                if not calls:
                    del self._parts[part]

    def wait(self, part: Part, *, skip: Collection[int] = ()) -> None:
        """Wait until the writes into ``part`` have ended, but those of calls in ``skip``."""
        with self._lock:
            waiting = [f for call, f in self._parts.get(part, {}).items() if call not in skip]
        for future in waiting:
            with contextlib.suppress(Exception):
                future.result()

    def has(self, part: Part) -> bool:
        """Whether an entry of ``part`` is being written."""
        return part in self._parts

    def steps(self, target: str, shard: str) -> list[int]:
        """Steps of ``(target, shard)`` with an entry being written."""
        if not self._parts:
            return []
        with self._lock:
            return [p[0] for p in self._parts if p[1] == target and p[2] == shard]

    def all_steps(self) -> set[int]:
        """Steps of any target and shard with an entry being written."""
        with self._lock:
            return {p[0] for p in self._parts}

    def after_fork(self) -> None:
        """In a forked child: the parent's background writes are the parent's (never waited for here)."""
        self._lock = threading.Lock()
        self._parts = {}


__all__ = ["Part", "PendingWrites"]
