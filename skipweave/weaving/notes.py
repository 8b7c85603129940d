"""Result notes: where a host's convention wants each result to say how skipweave settled its call.

The proxy knows no host, yet a host may want every result to carry its call's fate (verl's trainers read
``meta_info["skipweave"]``, see :mod:`skipweave.integrations.verl.meta_info`). An integration declares that as a
:class:`ResultNote` -- the result's attribute that holds a dict, and the key to write in it -- and registers it in
:data:`RESULT_NOTES`. The proxy writes ``{"status", "step", "served_step"}`` there into every result it hands
back: bypasses, hits and misses alike (see docs/architecture.md).

A note is data, not a callable, because the front of a plain ``def`` target writes it inline on every bypassed
call: a Python call per result cost the per-call bypass rows of ``bench/run.py --only calls`` 110-160 ns (12-16 %
of their value; issue 29 holds them within 10 %).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from skipweave import hooks


@dataclass(frozen=True)
class ResultNote:
    """Write a call's fate under ``getattr(result, attribute)[key]`` of every result whose ``attribute`` is a dict.

    Attributes:
        attribute: the name of the result's attribute that holds a dict (``"meta_info"``); results without it, or
            with a value that is not a ``dict`` (or subclass), are left untouched.
        key: the key written into that dict (``"skipweave"``).
    """

    attribute: str
    key: str


class NoteRegistry(hooks.Registry[ResultNote]):
    """The registry of result notes; keeps :attr:`places`, every note as an ``(attribute, key)`` pair, current.

    The front of a plain ``def`` target reads :attr:`places` on every bypassed call (one attribute read), instead
    of a walk of the registry.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._places_lock = threading.Lock()
        self.places: tuple[tuple[str, str], ...] = ()
        """Every registered note as ``(attribute, key)``, in registration order."""
        self.role_keys: tuple[str, ...] = ()
        """The keys the woven plan's roles write instead (``skip.<role>.note``), set at weave: every role's note is
        left out of input fingerprints, wherever a phase's input carries an earlier phase's result."""

    def add(self, item: ResultNote) -> ResultNote:
        """Register ``item`` (see :meth:`hooks.Registry.add`); returns it.

        Raises:
            TypeError: ``item`` is not a :class:`ResultNote`.
        """
        if not isinstance(item, ResultNote):
            raise TypeError(f"a result note is a ResultNote(attribute, key), not {type(item).__name__}")
        with self._places_lock:
            super().add(item)
            self._refresh()
        return item

    def remove(self, item: ResultNote) -> None:
        """Unregister ``item``; absent is fine."""
        with self._places_lock:
            super().remove(item)
            self._refresh()

    def current(self) -> tuple[tuple[str, str], ...]:
        """:attr:`places` (what the integrations loaded in this process registered)."""
        return self.places

    def _refresh(self) -> None:
        self.places = tuple((note.attribute, note.key) for note in self._items)


RESULT_NOTES: NoteRegistry = NoteRegistry("result note")
"""Where results carry their call's fate (host conventions, registered by integrations)."""


def annotate(result: Any, status: str, step: int | None, served: int | None, key: str | None = None) -> None:
    """Write how the call that gave ``result`` was settled into every place a registered :class:`ResultNote` names.

    Args:
        result: what the call hands back (live or replayed).
        status: ``"bypass"``, ``"hit"`` or ``"miss"`` (see :mod:`skipweave.report`).
        step: the call's step, ``None`` when it has none.
        served: the step whose recording served a hit, else ``None``.
        key: the role's own key (``skip.<role>.note``) written instead of each note's, or ``None`` for the notes'.
            Roles whose results a host merges (verl's ``DataProto.union`` of a step's phases, which refuses two
            different values under one key) each write under a key of their own.

    Raises:
        Exception: whatever reading the result's attribute raises other than ``AttributeError`` (the host's own).
    """
    for attribute, note_key in RESULT_NOTES.current():
        out = getattr(result, attribute, None)
        if isinstance(out, dict):
            out[key or note_key] = {"status": status, "step": step, "served_step": served}


__all__ = ["NoteRegistry", "RESULT_NOTES", "ResultNote", "annotate"]
