"""The accounts a run keeps of its woven targets: the process's totals, each target's counters, and what each
woven target is expected to do (read by :mod:`skipweave.report` as calls happen and by :mod:`skipweave.closing`
when a plan ends).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Counters", "Expected", "TargetCounters"]


@dataclass
class Counters:
    """Totals of this process since weaving (or the last :func:`reset`).

    Attributes:
        hits, misses, bypasses: calls served from the store, called through and recorded, run live.
        bytes_read, bytes_written: payload bytes.
        seconds_saved: generation seconds recorded for the entries served (the live cost avoided).
        record_failures: records that failed and left the live result in place.
    """

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds_saved: float = 0.0
    record_failures: int = 0


@dataclass
class TargetCounters:
    """Totals of one (role, target) in this process, for the per-role summary.

    Attributes:
        hits, misses, bypasses, record_failures: as in :class:`Counters`.
        seconds_saved: generation seconds the hits avoided.
        called, eligible: a call (an eligible one: not bypassed) was seen; its first one left a run mark.
        recorded: a call was handed to the store to be recorded; its first one left a run mark (a run that
            recorded keeps its marks until ``skipweave gc``, see :mod:`skipweave.store.runs`).
        stored: records handed to the store and not failed since (a record the background writer fails later is
            taken back): whether the role recorded anything at all.
        training, validation: a training call (a validation call: one the bypass rule took, of a role that records,
            replays or verifies them) reached the store; the first of each left a run mark.
    """

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    record_failures: int = 0
    seconds_saved: float = 0.0
    called: bool = False
    eligible: bool = False
    recorded: bool = False
    stored: int = 0
    training: bool = False
    validation: bool = False


@dataclass
class Expected:
    """A woven target the exit summary accounts for.

    Attributes:
        path: the configured target path.
        steps: the role's ``steps``, as configured (for the nothing-eligible warning).
        mark: ``mark(kind)`` leaves a run mark (``"called"``/``"eligible"``/``"recorded"``) for the other
            processes.
        elsewhere: ``elsewhere(kind)`` says whether another process of the run left that mark.
        unwoven: ``unwoven()`` says why this process never wove the target: ``None`` when it did, ``""`` when it
            need not (an optional target whose host is not in the program).
        records: its role records or replays (every action but ``verify``): a run in which the role did neither
            is a failure of a strict run.
        bypass: the role's bypass rule as a person reads it (``skip.reward.bypass.expr='...'``), for the warning
            about a role whose every call the rule took for a validation call.
    """

    path: str
    steps: str
    mark: Callable[[str], None] = field(default=lambda kind: None)
    elsewhere: Callable[[str], bool] = field(default=lambda kind: False)
    unwoven: Callable[[], str | None] = field(default=lambda: None)
    records: bool = True
    bypass: str = ""
