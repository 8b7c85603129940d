"""Result notes: what a host's convention asks the proxy to write into each result it hands back.

The proxy knows no host, yet a host may want every result to say how skipweave settled its call (verl's
trainers read ``meta_info["skipweave"]``, see :mod:`skipweave.integrations.verl.meta_info`). An integration
registers a :data:`ResultNote` in :data:`RESULT_NOTES`; the proxy calls it with every result it hands back:
bypasses, hits and misses alike (see docs/architecture.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from skipweave import hooks

ResultNote = Callable[[Any, str, "int | None", "int | None"], None]
"""``note(result, status, step, served)``: ``status`` is ``"bypass"``, ``"hit"`` or ``"miss"`` (see
:mod:`skipweave.report`), ``step`` the call's step (``None`` when it has none), ``served`` the step whose recording
served a hit (else ``None``). A note leaves results of other shapes untouched and should cost little: it runs on
every bypassed call."""


class NoteRegistry(hooks.Registry[ResultNote]):
    """The registry of result notes, which keeps :attr:`note`, all of them as one callable, current.

    The bypass path of a plain ``def`` target calls :attr:`note` on every call: one attribute read and one call,
    instead of a walk of the registry (``bench/run.py --only calls``, the per-call bypass rows).
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._notes: tuple[ResultNote, ...] = ()
        self._notes_lock = threading.Lock()
        self._loaded = False
        self.note: ResultNote | None = None
        """Every registered note as one callable (the note itself when there is one), ``None`` when none."""

    def add(self, item: ResultNote) -> ResultNote:
        """Register ``item`` (see :meth:`hooks.Registry.add`); returns it."""
        with self._notes_lock:
            super().add(item)
            if item not in self._notes:
                self._combine(self._notes + (item,))
        return item

    def remove(self, item: ResultNote) -> None:
        """Unregister ``item``; absent is fine."""
        with self._notes_lock:
            super().remove(item)
            self._combine(tuple(note for note in self._notes if note != item))

    def current(self) -> ResultNote | None:
        """:attr:`note`, once the shipped integrations registered theirs."""
        if not self._loaded:
            self.items()
            self._loaded = True
        return self.note

    def _combine(self, notes: tuple[ResultNote, ...]) -> None:
        self._notes = notes
        if not notes:
            self.note = None
        elif len(notes) == 1:
            self.note = notes[0]
        else:
            def every(result: Any, status: str, step: int | None, served: int | None) -> None:
                for note in notes:
                    note(result, status, step, served)

            self.note = every


RESULT_NOTES: NoteRegistry = NoteRegistry("result note")
"""Notes the proxy writes into every result it hands back (host conventions, registered by integrations)."""


def annotate(result: Any, status: str, step: int | None, served: int | None) -> None:
    """Have every registered :data:`ResultNote` note how the call that gave ``result`` was settled.

    Args:
        result: what the call hands back (live or replayed).
        status: ``"bypass"``, ``"hit"`` or ``"miss"``.
        step: the call's step, ``None`` when it has none.
        served: the step whose recording served a hit, else ``None``.
    """
    note = RESULT_NOTES.current()
    if note is not None:
        note(result, status, step, served)


__all__ = ["NoteRegistry", "RESULT_NOTES", "ResultNote", "annotate"]
