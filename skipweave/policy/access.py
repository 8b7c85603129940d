"""Reading a value out of a call's arguments by a dotted path (attributes, dict keys, list indices)."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping, Sequence
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


class PlainClasses:
    """Which classes are certainly not a Mapping, judged once per class: what lets a compiled reader use ``getattr``
    where :func:`get_path` would ask ``isinstance(obj, Mapping)`` per part.

    ``isinstance(obj, Mapping)`` costs ~0.3 µs through the ABC machinery; the answer depends only on the class
    while no ABC registers a class (``abc.get_cache_token()``) and ``obj.__class__`` is its real type (a proxy
    object such as wrapt's ``ObjectProxy`` reports the wrapped object's class, so it is never remembered). Kept for
    the attribute-path rows of bench/run.py (``calls.method_shape_attr_step`` reads ``self.state.global_step``):
    a two-part read takes 1.9-2.3 µs with the per-class answer and 2.9-4.0 µs with ``isinstance`` per part on the
    loaded machine of the measurement (Dec 2026, ``compile_reader`` timed alone), some 15-20 % of that row.

    Attributes:
        known: class -> ``True`` (not a Mapping) or ``False``; a hot path may read it inline as
            ``known.get(type(obj)) and token[0] == abc.get_cache_token()`` (the same dict for good; cleared when
            the token changes, or past :attr:`KEPT` classes).
        token: a one-element list holding the ABC cache token ``known`` was judged under.
    """

    KEPT = 256
    """Classes remembered before starting afresh (bounded: no class kept alive for good by a host that makes
    classes per call)."""

    def __init__(self) -> None:
        self.known: dict[type, bool] = {}
        self.token: list[object] = [abc.get_cache_token()]

    def judge(self, obj: Any) -> bool:
        """True when ``obj`` is certainly not a Mapping (``False`` also when unsure)."""
        kind = type(obj)
        token = abc.get_cache_token()
        if self.token[0] != token:
            self.known.clear()
            self.token[0] = token
        try:
            known = self.known.get(kind)
        except TypeError:  # a class made unhashable by its metaclass
            return False
        if known is not None:
            return known
        if obj.__class__ is not kind:
            return False
        try:
            answer = not isinstance(obj, Mapping)
        except TypeError:
            return False
        if len(self.known) >= self.KEPT:
            self.known.clear()
        self.known[kind] = answer
        return answer


PLAIN = PlainClasses()
"""The process's judgements of which classes are not a Mapping (:func:`compile_reader` and the gate's readers)."""


def compile_reader(path: str) -> Callable[[Any], Any]:
    """Return ``read(obj)``, equal to ``get_path(obj, path)`` but faster on the common shapes.

    Plain ``dict`` parts are ``dict.get``, objects of a class known not to be a Mapping are ``getattr``; any
    part that is neither (a Mapping, a class not judged yet, a numeric part that may index a sequence) and a
    ``TypeError`` (a class that cannot be a dict key) hand the whole path to :func:`get_path`, so the answer
    is always :func:`get_path`'s.
    """
    parts = _split(path) if path else ()
    if not parts or any(p.lstrip("-").isdigit() for p in parts):
        return lambda obj: get_path(obj, path)
    known, token, get_token, judge = PLAIN.known, PLAIN.token, abc.get_cache_token, PLAIN.judge
    if len(parts) == 2:
        # unrolled: the loop was a tenth of the bypass of a target whose step is ``self.state.global_step``
        # (bench/run.py ``calls.method_shape_attr_step``, Dec 2026)
        first, second = parts

        def read_two(obj: Any) -> Any:
            try:
                if type(obj) is dict:
                    cur = obj.get(first, MISSING)
                elif (known.get(type(obj)) and token[0] == get_token()) or judge(obj):
                    cur = getattr(obj, first, MISSING)
                else:
                    return get_path(obj, path)
                if cur is MISSING:
                    return MISSING
                if type(cur) is dict:
                    return cur.get(second, MISSING)
                if (known.get(type(cur)) and token[0] == get_token()) or judge(cur):
                    return getattr(cur, second, MISSING)
            except TypeError:  # the same answer from get_path, or the host's own TypeError again
                pass
            return get_path(obj, path)

        return read_two

    def read(obj: Any) -> Any:
        cur = obj
        try:
            for part in parts:
                if type(cur) is dict:
                    cur = cur.get(part, MISSING)
                elif (known.get(type(cur)) and token[0] == get_token()) or judge(cur):
                    cur = getattr(cur, part, MISSING)
                else:
                    return get_path(obj, path)
                if cur is MISSING:
                    return MISSING
        except TypeError:  # the same answer from get_path, or the host's own TypeError again
            return get_path(obj, path)
        return cur

    return read


def compile_arg(ref: int | str, positions: Mapping[str, int] | None = None) -> Callable[
        [tuple[Any, ...], Mapping[str, Any]], Any]:
    """Return ``arg(args, kwargs)``, equal to ``get_arg(args, kwargs, ref, positions)`` with the lookups of
    ``ref`` in ``positions`` done once."""
    if isinstance(ref, int):
        names = [name for name, index in (positions or {}).items() if index == ref]
        if ref < 0:
            return lambda args, kwargs: get_arg(args, kwargs, ref, positions)
        name = names[0] if names else None

        def by_index(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
            if ref < len(args):
                return args[ref]
            if kwargs and name is not None:
                return kwargs.get(name, MISSING)
            return MISSING

        return by_index
    index = positions.get(ref) if positions is not None else None

    def by_name(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if kwargs and ref in kwargs:
            return kwargs[ref]
        if index is not None and index < len(args):
            return args[index]
        return MISSING

    return by_name
