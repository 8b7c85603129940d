"""The one registry through which integrations plug into the generic layers (see docs/architecture.md).

The generic layers (``config``, ``policy``, ``weaving``, ``store``, ``verify``) name no host: they never import
``skipweave.integrations``, verl, Ray or tensordict. What a host adds -- a result type the codec stores (verl's
``DataProto``, tensordict's ``TensorDict``), a config adapter (verl's legacy keys and run namespace), something to
do when a plan is woven or unwoven (propagate it to Ray workers, hand roles over from verl's ``SkipManager``) --
is registered by the integration in a :class:`Registry` that the generic layer declares and reads (each layer
declares the registries it consumes, next to the type of their items; this module gives them one mechanism).

A registry is passive: reading it loads nothing. The integrations are loaded, once per process, by the entry
points that assemble the system -- :func:`skipweave.weave`, the ``skipweave`` command, the Hydra callback, the
``skipweave run`` bootstrap, a Ray worker's set-up -- through
:func:`skipweave.integrations.discovery.load_integrations`; a program that uses a generic layer on its own (reads a
store with :mod:`skipweave.store.scan`, say) calls that function first if it wants the hosts' types. An earlier
design loaded them the first time a registry was read, which made every generic layer a client of verl and Ray at
run time (``list(HOST_TYPES)`` imported 40 modules) while no import-time check could see it.

This module imports nothing of skipweave's, so every layer may import it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered set of items of one kind of hook, filled by the integrations a process loaded.

    Args:
        name: what the items are, for messages (``"host type"``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: list[T] = []
        self._lock = threading.Lock()

    def add(self, item: T) -> T:
        """Register ``item`` (again registering an equal item does nothing); returns it, so it can decorate."""
        with self._lock:
            if item not in self._items:
                self._items.append(item)
        return item

    def remove(self, item: T) -> None:
        """Unregister ``item``; absent is fine."""
        with self._lock:
            if item in self._items:
                self._items.remove(item)

    def items(self) -> tuple[T, ...]:
        """Every registered item, in registration order (the integrations' load order)."""
        return tuple(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self._items)} items)"


__all__ = ["Registry"]
