"""Reading a value out of a call's arguments by a dotted path (attributes, dict keys, list indices)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

MISSING: Any = object()
"""Sentinel returned when a path does not exist."""


@functools.lru_cache(maxsize=256)
def _split(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _isinstance(obj: Any, abc_cls: type) -> bool:
    """``isinstance`` against an ABC, False when the ABC cannot check (a class made unhashable by its metaclass)."""
    try:
        return isinstance(obj, abc_cls)
    except TypeError:
        return False


def get_path(obj: Any, path: str) -> Any:
    """Follow ``path`` (``a.b.0.c``) through attributes, mapping keys and sequence indices.

    Each part is tried as a mapping key first, then as an attribute, then as an integer index.

    Returns:
        The value, or :data:`MISSING` when any part does not exist.
    """
    cur = obj
    if not path:
        return cur
    for part in _split(path):
        if type(cur) is dict:  # the hot path (verl's meta_info): no ABC check
            cur = cur.get(part, MISSING)
            if cur is MISSING:
                return MISSING
            continue
        if _isinstance(cur, Mapping):
            if part in cur:
                cur = cur[part]
                continue
            return MISSING
        nxt = getattr(cur, part, MISSING)
        if nxt is MISSING and part.lstrip("-").isdigit() and _isinstance(cur, Sequence):
            try:
                nxt = cur[int(part)]
            except IndexError:
                return MISSING
        if nxt is MISSING:
            return MISSING
        cur = nxt
    return cur


def get_arg(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], ref: int | str, positions: Mapping[str, int] | None = None
) -> Any:
    """Return argument ``ref``: a position (int), or a parameter name (str) passed by keyword or by position.

    The same parameter is found however the host passes it: ``arg: 0`` finds ``prompts`` in
    ``generate(batch)`` and in ``generate(prompts=batch)``, ``arg: step`` finds ``step`` in ``f(b, 3)``
    and ``f(b, step=3)``.

    Args:
        positions: parameter name -> index in ``args`` (``self``/``cls`` already removed), from the
            target's signature; lets ``arg: step`` find ``step`` when the host passes it positionally,
            and ``arg: 0`` find the first parameter when the host passes it by keyword.

    Returns:
        The value, or :data:`MISSING`.
    """
    if isinstance(ref, int):
        if ref < len(args):
            return args[ref]
        if kwargs and positions:  # the parameter at that position, passed by keyword: f(prompts=batch)
            for name, index in positions.items():
                if index == ref:
                    return kwargs.get(name, MISSING)
        return MISSING
    if ref in kwargs:
        return kwargs[ref]
    if positions is not None and ref in positions and positions[ref] < len(args):
        return args[positions[ref]]
    return MISSING
