"""What a record keeps of a target's declared side effects (``skip.<role>.effects``), see docs/own_trainer.md.

An effect's value after the real call is kept as a plain copy (containers made plain, so the codec needs no
pickle). A list the call only appended to is kept as the items it appended (:class:`Appended`): a trainer that
appends a metrics dict per call would otherwise store the whole, growing list in every step's entry, and the
store would grow with the square of the steps.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, NamedTuple


class Appended(NamedTuple):
    """A declared effect that was a list the real call only appended to: what the record keeps of it."""

    n_before: int
    """Items the list held before the call."""
    tail: list[Any]
    """The items the call appended (plain copies, see :func:`plain_copy`)."""


def appended_items(before: list[Any], items: list[Any], now: Any) -> list[Any] | None:
    """The items a call appended to the list ``before`` that held ``items`` (a shallow copy taken before the call),
    when ``now`` (the effect's value after it) is that very list, and its first ``len(items)`` items are the same
    objects (by identity) as before; ``None`` for anything else (a new list, one shrunk or with an item replaced).
    An item changed in place is the same object: what the call did inside an older item is not seen."""
    if now is not before:
        return None
    current = list.copy(now)
    n = len(items)
    if len(current) < n or not all(map(operator.is_, current, items)):
        return None
    return current[n:]


def recorded_form(was: tuple[list[Any], list[Any]] | None, value: Any) -> Any:
    """What a record keeps of an effect's ``value`` after the call: :class:`Appended` when it is the list ``was``
    names (``(the list, its items before the call)``, see :meth:`SkipProxy._lists_before`) and the call only
    appended to it, else a plain copy of the whole value."""
    if was is not None:
        tail = appended_items(*was, value)
        if tail is not None:
            return Appended(len(was[1]), plain_copy(tail))
    return plain_copy(value)


def split_appended(effects: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Split a snapshot's effects (:meth:`SkipProxy._effects_after`) into the whole values and the appended items
    in the form the store keeps (``{"n_before": int, "tail": list}`` by expression; ``None`` when none)."""
    if not effects or not any(type(v) is Appended for v in effects.values()):
        return effects, None
    whole = {k: v for k, v in effects.items() if type(v) is not Appended}
    appended = {k: {"n_before": v.n_before, "tail": v.tail} for k, v in effects.items() if type(v) is Appended}
    return whole, appended


def plain_copy(value: Any) -> Any:
    """A copy of ``value`` with mapping and list subclasses made plain (a ``defaultdict`` becomes a ``dict``), so
    the codec stores it without pickle; a replay restores it into the host's own containers, types kept."""
    if isinstance(value, Mapping):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    if type(value) is tuple:
        return tuple(plain_copy(v) for v in value)
    return value


__all__ = ["Appended", "appended_items", "plain_copy", "recorded_form", "split_appended"]
