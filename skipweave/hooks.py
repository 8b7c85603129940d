"""The one registry through which integrations plug into the generic layers (see docs/architecture.md).

The generic layers (``config``, ``policy``, ``weaving``, ``store``) name no host: they never import
``skipweave.integrations``, verl, Ray or tensordict. What a host adds -- a result type the codec stores (verl's
``DataProto``, tensordict's ``TensorDict``), a config adapter (verl's legacy keys and run namespace), something to
do when a plan is woven or unwoven (propagate it to Ray workers, hand roles over from verl's ``SkipManager``) --
is registered by the integration in a :class:`Registry` that the generic layer declares and reads (each layer
declares the registries it consumes, next to the type of their items; this module gives them one mechanism).

The integrations shipped with skipweave register themselves the first time a registry is read
(:func:`skipweave.integrations.register_builtin`), so a process that only replays a store, or the CLI, sees the
same host types as the recording run did. Registering imports nothing of the host: an integration detects its
host's objects by class name and module, and imports the host only when one is met.

This module imports nothing of skipweave's, so every layer may import it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_builtin_lock = threading.RLock()
_builtin_loaded = False
_builtin_loading = False


def _load_builtin() -> None:
    """Have the shipped integrations register themselves, once per process. Another thread reading a registry
    meanwhile waits until they all have (it would else see a registry half filled, e.g. no DataProto host type);
    the loading thread itself reads the registries as they are (an integration's registration may read them)."""
    global _builtin_loaded, _builtin_loading
    if _builtin_loaded:
        return
    with _builtin_lock:
        if _builtin_loaded or _builtin_loading:
            return
        _builtin_loading = True
        try:
            # (by name: the generic layers may not import the integrations package, only ask for it at run time)
            importlib.import_module("skipweave.integrations").register_builtin()
        finally:
            _builtin_loaded, _builtin_loading = True, False


class Registry(Generic[T]):
    """An ordered set of items of one kind of hook; reading it first loads the shipped integrations.

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
        """Every registered item, in registration order (the shipped integrations' first)."""
        _load_builtin()
        return tuple(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self._items)} items)"


__all__ = ["Registry"]
