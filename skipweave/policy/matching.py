"""Which recorded entry of a part serves a call: by its inputs first, by call order only for a lone writer.

A part is the entries of one (step, target, shard). The proxy numbers a process's calls of a step
``0, 1, …`` in the order they arrive (the call's *position*). When one writer made every entry of the part
and no two of its threads overlapped, position ``k`` is served entry ``k``, as verl's ``SkipManager`` does.
When several writers share the shard (Ray actors or processes without their own ``RANK``, threads of one
process), arrival order says nothing about who is who, in the recording run or the next: then a call is
served only an entry recorded for the same inputs (same fingerprint), and a call whose inputs match none
is a miss that records its own entry. A part an interrupted run left short is matched the same way when this
process resumes it (:mod:`skipweave.store.resume`). Entries a concurrent writer made are never served
(:func:`skipweave.store.identity.is_concurrent_other`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

from skipweave.store.format.versions import FINGERPRINT_RULES
from skipweave.store.identity import Recorded, Writer, is_concurrent_other, is_other_of_run


@dataclass(frozen=True)
class Match:
    """The outcome of :func:`match_call`.

    Attributes:
        call: the entry's call index, or ``None`` for a miss.
        exact: the entry was recorded for the same inputs (no fingerprint check is left to do).
        shared: the part holds entries of several writers (or of overlapping threads).
        others: entries not served because a concurrent writer made them.
    """

    call: int | None
    exact: bool
    shared: bool
    others: int


def is_shared(recorded: Sequence[Recorded]) -> bool:
    """True when the part's entries come from more than one process or from threads that overlapped."""
    writers = {None if r.writer is None else r.writer[1:] for r in recorded}  # (host, pid): one process, any run
    return len(writers) > 1 or any(r.concurrent for r in recorded)


@dataclass(frozen=True)
class PartView:
    """What matching needs of a part's entries, judged once per version of the part (:func:`view_of`).

    Attributes:
        shared: the part holds entries of several writers (see :func:`match_call`).
        others: entries not served because a concurrent writer made them.
        by_call: the usable entries by call index.
        by_fingerprint: fingerprint rule -> input fingerprint -> call indices of usable entries recorded with it
            under that rule, ascending (rules in :data:`~skipweave.store.format.versions.FINGERPRINT_RULES` order:
            a part of today's entries holds only ``signature``).
    """

    shared: bool
    others: int
    by_call: Mapping[int, Recorded]
    by_fingerprint: Mapping[str, Mapping[str, tuple[int, ...]]]


def view_of(recorded: Sequence[Recorded], *, me: Writer, started: float) -> PartView:
    """Judge a part's entries once: whose they are, which may serve this process (``me``, started at ``started``,
    seconds since the epoch), and an index by call and by fingerprint, so a call's match costs O(1) however
    many entries the part holds (per-sample recording: thousands)."""
    # Another process of this very run (ended or not) is another writer, however few entries the part holds:
    # it is matched by inputs only, never by its position (children of one launcher, Ray actors of one job).
    shared = is_shared(recorded) or any(is_other_of_run(r, me) for r in recorded)
    usable = [r for r in recorded if not is_concurrent_other(r, me, started)]
    by_fp: dict[str, dict[str, list[int]]] = {rule: {} for rule in FINGERPRINT_RULES}
    for r in usable:
        if r.fingerprint:
            by_fp.setdefault(r.rule, {}).setdefault(r.fingerprint, []).append(r.call)
    return PartView(shared, len(recorded) - len(usable), {r.call: r for r in usable},
                    {rule: {fp: tuple(sorted(calls)) for fp, calls in fps.items()}
                     for rule, fps in by_fp.items() if fps})


def match_call(
    recorded: Sequence[Recorded] | PartView,
    position: int,
    fingerprint: Callable[[str], str],
    claimed: Container[int],
    *,
    same_step: bool,
    me: Writer,
    started: float,
    inputs_only: bool = False,
) -> Match:
    """Choose the entry of a part that serves one call.

    Args:
        recorded: the part's committed entries, sorted by call index (or their :func:`view_of`).
        position: the call's position among this process's calls of its step (from 0).
        fingerprint: returns the call's input fingerprint under a rule (one of :data:`~skipweave.store.format.
            versions.FINGERPRINT_RULES`, ``""`` when it has none under it); called only for the rules of entries that
            could match by it, so a part of ``signature`` entries never asks for the ``arguments`` digest.
        claimed: call indices this process already served or recorded at this step (never served twice).
        same_step: the part is the call's own step (``cache``, or a ``repeat*`` hit on its own step); for
            another step (a ``repeat*`` serving step) inputs differ by nature and only call order matches.
        me: this process as a writer.
        started: when this process started (seconds since the epoch).
        inputs_only: match by input fingerprint only, as a part of several writers (a part an interrupted run left
            short that this process resumes, :mod:`skipweave.store.resume`: the calls of the resuming run need not
            come in the order of the interrupted one's).

    Returns:
        A :class:`Match`: the exact-input entry with the lowest index when there is one (an entry is compared with
        the call's fingerprint under the entry's own rule, :attr:`Recorded.rule`); else, for a part of one
        writer, the entry at ``position``; else no entry.
    """
    view = recorded if isinstance(recorded, PartView) else view_of(recorded, me=me, started=started)
    shared, others = view.shared or inputs_only, view.others
    if same_step and view.by_fingerprint:
        best: int | None = None
        for rule, by_fp in view.by_fingerprint.items():  # each entry compared by the rule it was recorded with
            fp = fingerprint(rule)
            for call in by_fp.get(fp, ()) if fp else ():
                if call not in claimed:
                    if best is None or call < best:
                        best = call
                    break
        if best is not None:
            return Match(best, True, shared, others)
    if not shared and position in view.by_call and not (same_step and position in claimed):
        return Match(position, False, shared, others)
    return Match(None, False, shared, others)


__all__ = ["Match", "PartView", "is_shared", "match_call", "view_of"]
