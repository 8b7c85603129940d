"""Run-time reporting: one log line per hit, miss and bypass, and counters readable from Python.

A host can put :func:`counters` into its own metrics. When the process ends, a summary line is logged for
the process and one per role (calls, hits, misses, bypasses, record failures, seconds saved), with a WARNING
for each woven target no process of the run called, for each role none of whose calls was eligible (naming
the step or bypass that could not be read, when that was why) and for each role whose every call its bypass rule
took for a validation call; a call that raised ReplayMissing is said in one line with the targets the run never
reached after it. Processes of one run see each other's calls through marks in the dump dir
(:mod:`skipweave.store.runs`), so a driver whose targets run in Ray workers does not warn about them. What the
summary finds skipweave failed at (a target never woven, a role that recorded and replayed nothing) is noted in
:mod:`skipweave.failures`, whose verdict a strict run ends with.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import asdict
from typing import Any

from skipweave import closing, failures, lifecycle
from skipweave.accounts import Counters, Expected, TargetCounters
from skipweave.env import SUMMARY_ENV

logger = logging.getLogger("skipweave")

HIT, MISS, BYPASS = "hit", "miss", "bypass"
BYPASS_LINE = "skipweave bypass role=%s target=%s step=%s"
"""The DEBUG line of a bypass (arguments: role, target, step), also written by the proxies' fronts."""


COUNTERS = Counters()
"""The process's counters; one object for the life of the process (:func:`reset` zeroes it in place), so hot
paths may hold a reference to it."""
_lock = threading.Lock()
_summary_registered = False
_TARGETS: dict[tuple[str, str], TargetCounters] = {}
_EXPECTED: dict[tuple[str, str], Expected] = {}
_STOPS: list[str] = []  # where the plan's first call that raised ReplayMissing sat (one item at most)
_stops_more = 0  # and how many more raised it


def for_target(role: str, target: str) -> TargetCounters:
    """The counters of one (role, target), made on first use; one object per pair for the life of the process."""
    counts = _TARGETS.get((role, target))
    if counts is None:
        with _lock:
            counts = _TARGETS.setdefault((role, target), TargetCounters())
    return counts


def steps_text(steps: Any) -> str:
    """A role's ``steps`` as the warnings show it: ``[1,2,3]`` or the configured text (``"5-10"``, ``all``)."""
    return "[" + ",".join(str(x) for x in steps) + "]" if isinstance(steps, list) else str(steps)


def expect(role: str, target: str, expected: Expected) -> None:
    """Account for a woven target in the exit summary (called by the weaver for every target it weaves)."""
    with _lock:
        _EXPECTED[(role, target)] = expected
    _register_summary()


def first_call(role: str, target: str, *, eligible: bool) -> None:
    """Note a target's first call (or first eligible call) in this process and leave the run mark for it."""
    counts = for_target(role, target)
    kinds = []
    if not counts.called:
        counts.called = True
        kinds.append("called")
    if eligible and not counts.eligible:
        counts.eligible = True
        kinds.append("eligible")
    _leave_marks(role, target, kinds)


def call_kind(role: str, target: str, *, validation: bool) -> None:
    """Note that a training call (``validation``: a validation call) of a target reached the store, the first of its
    kind in this process leaving a run mark; called once per kind (the caller checks the flag first)."""
    counts = for_target(role, target)
    kind = "validation" if validation else "training"
    if not getattr(counts, kind):
        setattr(counts, kind, True)
        _leave_marks(role, target, [kind])


def replay_missing(where: str) -> None:
    """Note that a replay-only call found no recording (:class:`~skipweave.weaving.replay.ReplayMissing`, which stops a
    run unless the host catches it); ``where`` names its role, target, step, call and dump dir. The exit summary then
    says so, instead of calling the targets the run never reached "woven but never called"."""
    global _stops_more
    with _lock:
        if _STOPS:
            _stops_more += 1
        else:
            _STOPS.append(where)
    _register_summary()


def replay_missing_noted() -> tuple[str | None, int]:
    """The plan's first replay-only call that found no recording, as :func:`replay_missing` noted it (``None`` when
    none did), and how many more did; read before the plan ends (:func:`end_plan` clears it). A test harness reads it
    to fail a test whose host caught :class:`~skipweave.weaving.replay.ReplayMissing` and went on."""
    with _lock:
        return (_STOPS[0] if _STOPS else None), _stops_more


def _leave_marks(role: str, target: str, kinds: list[str]) -> None:
    expected = _EXPECTED.get((role, target))
    if expected is not None and kinds:
        if loop_running():  # an async target's first call: the mark's file I/O never runs on the event loop
            thread = threading.Thread(target=_mark, args=(expected, kinds), name="skipweave-mark", daemon=True)
            with _lock:
                _MARKERS.append(thread)
            lifecycle.at_exit(lifecycle.STOP, _join_markers)
            thread.start()
        else:
            _mark(expected, kinds)


def _mark(expected: Expected, kinds: list[str]) -> None:
    for kind in kinds:
        expected.mark(kind)


_MARKERS: list[threading.Thread] = []
MARKER_JOIN_S = 10.0
"""Seconds the exit waits at most for the threads still leaving run marks (file I/O on a hung mount)."""


def _join_markers() -> None:
    """At exit: wait for the threads that leave an async target's run marks (a few are started per run)."""
    with _lock:
        threads, _MARKERS[:] = list(_MARKERS), []
    for thread in threads:
        thread.join(MARKER_JOIN_S)


def loop_running() -> bool:
    """An event loop runs in this thread (without importing asyncio: none runs before it is imported)."""
    asyncio = sys.modules.get("asyncio")  # no event loop without asyncio imported
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def counters() -> dict[str, Any]:
    """Return a snapshot of this process's counters as a plain dict."""
    with _lock:
        return asdict(COUNTERS)


def reset() -> None:
    """Zero the counters, per target too (in place: references to :data:`COUNTERS` and to each target's
    :class:`TargetCounters` stay valid)."""
    with _lock:
        for name, value in asdict(Counters()).items():
            setattr(COUNTERS, name, value)
        for counts in _TARGETS.values():
            for name, value in asdict(TargetCounters()).items():
                setattr(counts, name, value)


def event(
    status: str,
    *,
    role: str,
    target: str,
    step: int | None,
    served: int | None = None,
    nbytes: int = 0,
    seconds: float = 0.0,
    saved: float = 0.0,
    call: int | None = None,
) -> None:
    """Count one decision and log it at INFO (bypasses at DEBUG: validation runs every few steps).

    Args:
        status: ``hit``, ``miss`` or ``bypass``.
        role, target: names from the config.
        step: the call's step (``None`` when not computed, e.g. validation).
        served: the recorded step that served a hit.
        nbytes: payload bytes read (hit) or written (miss).
        seconds: wall time of the read (hit) or of the live call (miss).
        saved: generation seconds the hit avoided (the recorded call's own duration).
        call: the call index of the entry served (hit) or recorded (miss) within its step.
    """
    counts = for_target(role, target)
    if status == BYPASS:  # the hot path: no lock (a lost increment under a thread race is acceptable)
        COUNTERS.bypasses += 1
        counts.bypasses += 1
        if not counts.called:
            first_call(role, target, eligible=False)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(BYPASS_LINE, role, target, step)
        return
    _register_summary()
    if not counts.eligible:
        first_call(role, target, eligible=True)
    if status == MISS and nbytes > 0 and not counts.recorded:  # no bytes: nothing was handed to the store
        counts.recorded = True
        _leave_marks(role, target, ["recorded"])
    with _lock:
        if status == HIT:
            COUNTERS.hits += 1
            COUNTERS.bytes_read += nbytes
            COUNTERS.seconds_saved += saved
            counts.hits += 1
            counts.seconds_saved += saved
        elif status == MISS:
            COUNTERS.misses += 1
            COUNTERS.bytes_written += nbytes
            counts.misses += 1
            if nbytes > 0:
                counts.stored += 1
    if status == HIT:
        logger.info(
            "skipweave hit role=%s target=%s step=%s call=%s served_by=%s bytes=%d read_s=%.3f saved_s=%.3f",
            role, target, step, call, served, nbytes, seconds, saved,
        )
    else:
        logger.info(
            "skipweave miss role=%s target=%s step=%s call=%s recorded_bytes=%d call_s=%.3f",
            role, target, step, call, nbytes, seconds,
        )


def record_failed(role: str | None = None, target: str | None = None, *, uncounted: int = 0) -> None:
    """Count a record that failed (the warning itself is logged by the proxy), for its role when given.

    Args:
        uncounted: bytes its miss event counted as written (a background write counts them when handed over),
            taken back from ``bytes_written``; the record is then no longer counted as stored.
    """
    with _lock:
        COUNTERS.record_failures += 1
        COUNTERS.bytes_written -= uncounted
    if role is not None and target is not None:
        counts = for_target(role, target)  # outside the lock: it takes the lock itself for a new pair
        with _lock:
            counts.record_failures += 1
            if uncounted > 0:
                counts.stored -= 1


def summary_at_exit() -> None:
    """Have the exit summary (:func:`log_summary`) run at exit, as every woven target and counted call does: for a
    process whose plan wove nothing that failures of its own (:mod:`skipweave.failures`) must still be reported."""
    _register_summary()


def _register_summary() -> None:
    global _summary_registered
    if not _summary_registered:
        _summary_registered = True
        lifecycle.at_exit(lifecycle.REPORT, log_summary)


def log_summary() -> None:
    """Log the totals of this process and end the plan still woven (:func:`end_plan`), then close with what skipweave
    failed at (:func:`skipweave.failures.close_at_exit`); called at interpreter exit.

    A program that configured no logging at all (no handler on the ``skipweave`` logger or the root logger)
    still gets these lines, on stderr, unless ``SKIPWEAVE_SUMMARY=0``; a program that configured logging
    gets them through its own handlers, at its own levels.
    """
    handler: logging.Handler | None = None
    if not logger.hasHandlers() and os.environ.get(SUMMARY_ENV, "1") != "0":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        before = logger.level
        logger.setLevel(before or logging.INFO)
    try:
        _log_totals_and_end()
    finally:
        if handler is not None:
            logger.removeHandler(handler)
            logger.setLevel(before)


def _log_totals_and_end() -> None:
    c = counters()
    if c["hits"] or c["misses"] or c["bypasses"]:
        logger.info(
            "skipweave summary: hits=%d misses=%d bypasses=%d bytes_read=%d bytes_written=%d "
            "generation_seconds_saved=%.1f record_failures=%d",
            c["hits"], c["misses"], c["bypasses"], c["bytes_read"], c["bytes_written"],
            c["seconds_saved"], c["record_failures"],
        )
    end_plan()
    failures.close_at_exit()


def forget_plan() -> None:
    """Drop the accounts of the targets of a plan whose weave failed, with no summary and no warning (the failure
    says what happened)."""
    with _lock:
        _EXPECTED.clear()


def end_plan() -> None:
    """A woven plan ends (unweave, another plan, interpreter exit): log one summary line per role that had calls,
    and the WARNINGs for targets no process of the run called and roles none of whose calls was eligible; note the
    targets never woven and the roles that recorded and replayed nothing in :mod:`skipweave.failures`.

    The per-target counters then start afresh for the next plan (:data:`COUNTERS` keeps the process totals).
    """
    global _stops_more
    with _lock:
        expected = dict(_EXPECTED)
        _EXPECTED.clear()
        stops, more, _STOPS[:], _stops_more = list(_STOPS), _stops_more, [], 0
        targets = {k: TargetCounters(**asdict(v)) for k, v in _TARGETS.items()}
        for counts in _TARGETS.values():
            for name, value in asdict(TargetCounters()).items():
                setattr(counts, name, value)
    roles: dict[str, list[str]] = {}
    unreached: list[str] = []  # with a ReplayMissing noted: the targets never called, said in one line
    for role, target in [*targets, *expected]:
        if target not in roles.setdefault(role, []):
            roles[role].append(target)
    for role, names in roles.items():
        of_role = [targets.get((role, t), TargetCounters()) for t in names]
        hits, misses, bypasses = (sum(getattr(x, f) for x in of_role) for f in ("hits", "misses", "bypasses"))
        if hits + misses + bypasses:
            logger.info(
                "skipweave summary role=%s: calls=%d hits=%d misses=%d bypasses=%d record_failures=%d "
                "seconds_saved=%.1f", role, hits + misses + bypasses, hits, misses, bypasses,
                sum(x.record_failures for x in of_role), sum(x.seconds_saved for x in of_role),
            )
        closing.warn_silent_targets(role, names, targets, expected, unreached if stops else None)
        closing.warn_validation_only(role, names, targets, expected)
        closing.judge_role(role, names, targets, expected)
    if stops:  # one line: the targets after the call that stopped the run were never reached, not misnamed
        after = ("targets woven but never called, not reached before it: " + ", ".join(unreached) if unreached
                 else "every woven target was called")
        logger.warning("skipweave: the run met a replay-only call no recording serves (ReplayMissing): %s%s; %s",
                       stops[0], f" (and {more} more such call(s))" if more else "", after)
    failures.plan_ended()
