"""The bypass screen: verl's bypass and step conventions reduced to one attribute read and two dict lookups.

A target called often (per sample, per micro-batch) pays the proxy's decision on every call, most of
them bypasses. When a role reads its validation flag and its step from the same dict-valued attribute of
the same argument -- verl's ``meta_info["validate"]`` and ``meta_info["global_steps"]`` of the first
argument, the defaults -- the proxy can settle the common bypasses (a validation call, a step outside
``steps``) with ``getattr`` and ``dict.get`` instead of the general path through
:mod:`skipweave.policy.access`.

The screen only ever *settles* a bypass when the general path would bypass too; anything unusual (the
flag holds something other than ``True``/``False``/``None``, the step is not a plain ``int``, the
argument is a ``Mapping``, passed by keyword, ...) is left to the general path. :func:`screen_for` says
whether a role has that shape and what to read; the proxy inlines the reads.
"""

from __future__ import annotations

import functools
from collections.abc import Container, Mapping
from dataclasses import dataclass

from skipweave.config.schema import BypassConfig, BypassKind, StepSet, StepSourceConfig, StepSourceKind

MAX_STEP_SET = 4096
"""Largest selection of several ranges turned into a ``frozenset`` (one per distinct ``steps``, shared by the
targets using it); one range becomes a ``range`` (constant size), more and larger keep the range check."""


@dataclass(frozen=True)
class Screen:
    """What the proxy reads to settle a bypass without the general path.

    Attributes:
        index: position in the call's ``args`` (``self``/``cls`` removed) of the argument to read.
        attr: attribute of that argument holding a ``dict``, e.g. ``meta_info``.
        flag: key whose value ``True`` makes the call a bypass (``validate``), or ``None`` when the role
            bypasses nothing by argument (``bypass.when: never``).
        step_key: key holding the call's step (``global_steps``), or ``None`` when the step cannot be
            screened (another step source) or every step is eligible (``steps: all``).
        eligible: the role's eligible steps: a ``range`` for one range, a ``frozenset`` for several holding at
            most :data:`MAX_STEP_SET` steps, else the :class:`StepSet`.
    """

    index: int
    attr: str
    flag: str | None
    step_key: str | None
    eligible: Container[int]


def _arg_index(ref: int | str, positions: Mapping[str, int] | None) -> int | None:
    if isinstance(ref, int):
        return ref if ref >= 0 else None
    if positions is not None and ref in positions:
        return positions[ref]  # passed by keyword instead: args is shorter and the screen steps aside
    return None


def _two_parts(path: str) -> tuple[str, str] | None:
    parts = path.split(".")
    if len(parts) != 2 or not all(parts) or any(p.lstrip("-").isdigit() for p in parts):
        return None
    return parts[0], parts[1]


@functools.lru_cache(maxsize=64)
def _eligible(steps: StepSet) -> Container[int]:
    """A container answering ``int in it`` in C for the screen (``steps`` itself loops in Python)."""
    ranges = steps.ranges or ()
    if len(ranges) == 1:
        return range(ranges[0][0], ranges[0][1] + 1)
    if sum(hi - lo + 1 for lo, hi in ranges) <= MAX_STEP_SET:
        return frozenset(s for lo, hi in ranges for s in range(lo, hi + 1))
    return steps


def screen_for(
    bypass: BypassConfig, step: StepSourceConfig, steps: StepSet, positions: Mapping[str, int] | None = None
) -> Screen | None:
    """Return the :class:`Screen` of a role, or ``None`` when its bypass and step cannot be screened.

    Screenable: ``bypass.when`` is ``arg`` with one two-part path (``meta_info.validate``) or ``never``;
    the step source is ``auto`` or ``arg`` with a two-part path on the same argument and attribute; at
    least one of the two can settle a bypass (a flag, or a ``steps`` selection narrower than ``all``).

    Args:
        bypass: the role's bypass settings.
        step: the role's step source.
        steps: the role's eligible steps.
        positions: parameter name -> index in ``args``, for arguments named rather than numbered.
    """
    flag_at: tuple[int, str] | None = None
    flag: str | None = None
    if bypass.when is BypassKind.ARG:
        if len(bypass.paths) != 1:
            return None
        parts = _two_parts(bypass.paths[0])
        index = _arg_index(bypass.arg, positions)
        if parts is None or index is None:
            return None
        flag_at, flag = (index, parts[0]), parts[1]
    elif bypass.when is not BypassKind.NEVER:
        return None  # a callable predicate must see every call
    step_at: tuple[int, str] | None = None
    step_key: str | None = None
    if steps.ranges is not None and step.source in (StepSourceKind.AUTO, StepSourceKind.ARG):
        parts = _two_parts(step.path)
        index = _arg_index(step.arg, positions)
        if parts is not None and index is not None:
            step_at, step_key = (index, parts[0]), parts[1]
    if flag_at is not None and step_at is not None and flag_at != step_at:
        step_at, step_key = None, None  # two different places: screen the flag alone
    where = flag_at or step_at
    if where is None:
        return None
    return Screen(where[0], where[1], flag, step_key, _eligible(steps) if step_key is not None else frozenset())
