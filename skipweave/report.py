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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from skipweave import failures, lifecycle
from skipweave.env import SUMMARY_ENV

logger = logging.getLogger("skipweave")

HIT, MISS, BYPASS = "hit", "miss", "bypass"
BYPASS_LINE = "skipweave bypass role=%s target=%s step=%s"
"""The DEBUG line of a bypass (arguments: role, target, step), also written by the proxies' fronts."""


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
        _warn_silent_targets(role, names, targets, expected, unreached if stops else None)
        _warn_validation_only(role, names, targets, expected)
        _judge_role(role, names, targets, expected)
    if stops:  # one line: the targets after the call that stopped the run were never reached, not misnamed
        after = ("targets woven but never called, not reached before it: " + ", ".join(unreached) if unreached
                 else "every woven target was called")
        logger.warning("skipweave: the run met a replay-only call no recording serves (ReplayMissing): %s%s; %s",
                       stops[0], f" (and {more} more such call(s))" if more else "", after)
    failures.plan_ended()


def _warn_silent_targets(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                         expected: dict[tuple[str, str], Expected], unreached: list[str] | None = None) -> None:
    """The exit WARNINGs of one role: targets no process of the run called; a role with no eligible call.

    ``unreached``: a call of the run raised ReplayMissing: the targets never called are added to this list (said
    in one line with it) instead of being warned about one by one."""
    any_called = any_eligible = False
    for target in names:
        counts = targets.get((role, target), TargetCounters())
        exp = expected.get((role, target))
        called = counts.called or (exp is not None and exp.elsewhere("called"))
        any_called = any_called or called
        any_eligible = any_eligible or counts.eligible or (exp is not None and exp.elsewhere("eligible"))
        why = exp.unwoven() if exp is not None and not called else None
        if why and exp is not None and exp.elsewhere("woven"):
            why = None  # another process of the run (a Ray worker) wove it
        if why == "":
            continue  # optional, and its host is not in this program
        if why is not None:
            logger.warning(
                "skipweave: role %s target %s (%s) was never woven: %s; nothing was recorded or replayed for it "
                "(key skip.%s.targets.%s)", role, target, exp.path if exp else "?", why, role, target,
            )
            if judges_run():
                failures.note(failures.NEVER_WOVEN, role, f"skip.{role}.targets.{target}",
                              f"target {target} ({exp.path if exp else '?'}) was never woven")
        elif not called and exp is not None and unreached is not None:
            unreached.append(f"role {role} target {target} ({exp.path})")
        elif not called and exp is not None:
            logger.warning(
                "skipweave: role %s target %s (%s) was woven but never called in this run; check that the path "
                "names the method the trainer really calls (an override in a subclass, a copy taken by "
                "'from module import name' before weaving, or a method of another class run by the workers)",
                role, target, exp.path,
            )
    if any_called and not any_eligible and any(r == role for r, _ in expected):
        steps = next((e.steps for (r, _), e in expected.items() if r == role), "?")
        unread = failures.unread_of(role)
        if unread:
            calls = sum(targets.get((role, t), TargetCounters()).bypasses for t in names)
            _warn_unread(role, unread, calls, steps)
            return
        logger.warning(
            "skipweave: role %s: none of its calls was eligible, so nothing was recorded or replayed: each was a "
            "validation call or its step lies outside skip.%s.steps=%s; check the steps and skip.%s.step "
            "(where the step is read) and skip.%s.bypass", role, role, steps, role, role,
        )


def _warn_unread(role: str, unread: list[failures.Finding], calls: int, steps: str) -> None:
    """The closing WARNING of a role none of whose calls was eligible because its step or bypass could not be read:
    names the key, the expression and what it raised, on how many of the role's calls (in this process)."""
    causes = "; ".join(f"{f.text} (on {f.count} of its {max(calls, f.count)} calls)" for f in unread)
    rest = "" if sum(f.count for f in unread) >= calls else (
        f"; the others were validation calls or their step lies outside skip.{role}.steps={steps}")
    logger.warning("skipweave: role %s: none of its calls was eligible, so nothing was recorded or replayed: %s%s; "
                   "fix %s", role, causes, rest, ", ".join(dict.fromkeys(f.key for f in unread)))


def _judge_role(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                expected: dict[tuple[str, str], Expected]) -> None:
    """Note a role that records or replays (every action but ``verify``) and did neither in this run, as a finding of
    :mod:`skipweave.failures` (the WARNINGs before it, or a record failure's, said why). Judged by the run's first
    process only (:func:`judges_run`). Calls of this process count first; a process with no eligible call of the role
    (a driver whose workers make the calls) reads the run marks of the others."""
    own = [e for (r, _), e in expected.items() if r == role]
    if not own or not any(e.records for e in own) or not judges_run():
        return
    counts = [targets.get((role, t), TargetCounters()) for t in names]
    if any(c.hits or c.stored > 0 for c in counts):
        return
    if any(c.eligible for c in counts):
        if any(e.elsewhere("recorded") for e in own):  # another process recorded while these calls' records failed
            return
    elif any(e.elsewhere("eligible") or e.elsewhere("recorded") for e in own):
        return
    failures.note(failures.DID_NOTHING, role, f"skip.{role}", f"role {role} recorded and replayed nothing")


def judges_run() -> bool:
    """Whether this process judges the run as a whole (a target never woven, a role that did nothing) for
    :mod:`skipweave.failures`: it made the run id (the first process; it ends after the others and reads their marks).
    A process that inherited it (a subprocess, a Ray worker, a ``torchrun`` rank) warns as ever, but its view is its
    own and may come before the others' calls: it notes only the failures of its own calls."""
    from skipweave.store.identity import made_here

    return made_here() is not None


def _warn_validation_only(role: str, names: list[str], targets: dict[tuple[str, str], TargetCounters],
                          expected: dict[tuple[str, str], Expected]) -> None:
    """The exit WARNING of a role whose calls reached the store, every one as a validation call: its bypass rule
    took them all (verl's reward rule on a trainer whose batches lack ``global_token_num``), so they were kept apart
    from training calls and no training call was ever recorded or replayed, run after run."""
    mine = [(targets.get((role, t), TargetCounters()), expected.get((role, t))) for t in names]
    if not any(exp is not None for _, exp in mine):
        return
    if any(c.training or (e is not None and e.elsewhere("training")) for c, e in mine):
        return
    if not any(c.validation or (e is not None and e.elsewhere("validation")) for c, e in mine):
        return
    rule = next((e.bypass for _, e in mine if e is not None and e.bypass), f"skip.{role}.bypass")
    logger.warning(
        "skipweave: role %s: none of its calls was a training call: the bypass rule %s took every one for a "
        "validation call, so they were kept apart (shard val_<shard>: recorded for, and served only in, replay-only "
        "runs) and no training call was recorded or replayed; if they are training calls, set skip.%s.bypass to "
        "what tells this trainer's validation calls apart (skip.%s.bypass.expr=...), or skip.%s.bypass=null when "
        "it has none (docs/phases.md#a-trainer-that-is-not-verl)", role, rule, role, role, role)
