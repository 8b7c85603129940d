"""One cache helper for the store: values kept while what they were read from is unchanged.

A store keeps what it learnt from the dump dir (a folder's listing, a part's entries, the steps recorded, a judged
group file) so a replay hit costs one ``lstat`` instead of a folder's worth of reads. Each value is kept with a
*validator*: what the source looked like when the value was read (a folder's inode and modification time, a file's
inode, modification time and size). A value is served only while the caller's fresh look at the source gives an
equal validator (and, with ``max_age``, for at most that many seconds). Bounded by entries (the oldest stored goes
first) and, with ``weight``, by the sum of the values' weights (then least recently used goes first).
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_ENTRIES = 4096
"""Entries a cache keeps by default: a long run does not keep every step's summary."""


class ValidatedCache(Generic[K, V]):
    """A bounded mapping ``key -> (validator, value)``, thread-safe.

    Args:
        max_entries: most entries kept; storing one more drops the oldest stored (least recently used, with
            ``max_weight``).
        max_weight: most total weight kept (``weight`` of each value); ``None`` for no bound.
        weight: the weight of a value (bytes it holds, say); needed with ``max_weight``.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, *, max_weight: int | None = None,
                 weight: Callable[[V], int] | None = None) -> None:
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._weight = weight
        self._lru = max_weight is not None
        self._total = 0
        self._items: collections.OrderedDict[K, tuple[Any, V, float]] = collections.OrderedDict()
        self._lock = threading.Lock()
        _CACHES.add(self)

    def get(self, key: K, validator: Any, *, max_age: float | None = None) -> V | None:
        """The value kept for ``key`` when it was stored with a validator equal to ``validator`` (not ``None``: a
        source that is gone validates nothing) and, with ``max_age``, less than that many seconds ago; else ``None``.
        """
        if validator is None:
            return None
        item = self._items.get(key)  # (one dict lookup, atomic: a hit takes no lock unless it reorders)
        if item is None or item[0] != validator:
            return None
        if max_age is not None and time.monotonic() - item[2] >= max_age:
            return None
        if self._lru:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
        return item[1]

    def last(self, key: K) -> tuple[Any, V] | None:
        """``(validator, value)`` kept for ``key`` whether or not it is still valid (to update a value in part),
        else ``None``."""
        item = self._items.get(key)
        return None if item is None else (item[0], item[1])

    def put(self, key: K, validator: Any, value: V) -> None:
        """Keep ``value`` for ``key`` as read when its source gave ``validator`` (``None``: forget ``key`` instead)."""
        with self._lock:
            self._drop_locked(key)
            if validator is None:
                return
            self._items[key] = (validator, value, time.monotonic())
            if self._weight is not None:
                self._total += self._weight(value)
            while len(self._items) > 1 and (len(self._items) > self._max_entries or (
                    self._max_weight is not None and self._total > self._max_weight)):
                self._drop_locked(next(iter(self._items)))

    def update(self, key: K, value: V) -> None:
        """Replace the value kept for ``key`` (absent: nothing happens), keeping its validator and age: the caller
        made the change the new value reflects."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._drop_locked(key)
                self._items[key] = (item[0], value, item[2])
                if self._weight is not None:
                    self._total += self._weight(value)

    def pop(self, key: K) -> None:
        """Forget ``key``; absent is fine."""
        with self._lock:
            self._drop_locked(key)

    def revalidate(self, old: Any, new: Any) -> None:
        """Move every value stored with validator ``old`` to ``new``: the caller changed the source itself and its
        values already reflect the change (no other change may have come between)."""
        with self._lock:
            for key, (validator, value, when) in list(self._items.items()):
                if validator == old:
                    self._items[key] = (new, value, when)

    def keys(self) -> list[K]:
        """The keys kept now, valid or not."""
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._total = 0

    def _drop_locked(self, key: K) -> None:
        item = self._items.pop(key, None)
        if item is not None and self._weight is not None:
            self._total -= self._weight(item[1])

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held the parent's


_CACHES: weakref.WeakSet[ValidatedCache[Any, Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["MAX_ENTRIES", "ValidatedCache"]
