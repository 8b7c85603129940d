"""Verify of one call (``action: verify``): run it live, compare its result with the recording that would serve it.

The recording is found as a replay finds it (the serving step is the call's own, as ``cache`` chooses; the entry is
matched by call index and input fingerprint, :meth:`~skipweave.weaving.replay.Replayer.read_entry`); it is read
before the live call, whose inputs the host may change. The live result is compared with the recording as a replay
would hand it over (after the role's echo, e.g. verl's per-run ``uid``) under ``skip.<role>.compare``
(:mod:`skipweave.verify.compare`); the outcome goes to the run's report file, one JSON line per call
(:mod:`skipweave.verify.report`), and to the log: a WARNING per diverging call, INFO for the others. When the
recording's environment (the target's source, engine packages, ``fingerprint.env`` keys) differs from this process's,
the line lists what changed, and the description of a divergence names it as a likely cause.

Then ``skip.<role>.serve`` says what the host gets: the ``live`` result, or the ``recorded`` one, served exactly as a
replay serves it (RNG state, echo, declared effects), so everything downstream stays as in the recording run.
``on_diverge: error`` raises :class:`Diverged` in the host's call at the first diverging one.

A verify run records nothing: a call with no recording runs live and is reported ``unrecorded``, so verifying on a
changed engine never mixes its results into the recording it is checked against. Validation calls are compared with
the validation recordings (shard ``val_<shard>``), never with training ones. At a target's first compared call, a
``compare.fields`` rule that names no field of either result is a WARNING (:mod:`skipweave.verify.rules`). At exit
each process logs one summary line per role: counts by status (a call the host retried counted once), the first
divergence, and the report's path.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from skipweave import lifecycle, report
from skipweave.config.compare import rule_form
from skipweave.config.schema import Action, OnDiverge, RoleConfig, Serve
from skipweave.config.values import default_report_path
from skipweave.store.format.environment import Change, changes_from, identical
from skipweave.store.format.versions import fingerprint_rule
from skipweave.verify.compare import DIVERGED, IDENTICAL, compare
from skipweave.verify.report import UNRECORDED, ReportFile, Tally, describe, record
from skipweave.verify.rules import field_sample, unmatched_rules
from skipweave.weaving.actions import CallAction
from skipweave.weaving.asyncio_bridge import EXIT_BEGAN, ExitBegan, off_loop, resolvable
from skipweave.weaving.calls import LIVE_ONLY, Call, Hit, Unserved
from skipweave.weaving.engine import CallEngine
from skipweave.weaving.notes import RESULT_NOTES, annotate
from skipweave.weaving.replay import Read, recording_profile

logger = logging.getLogger(__name__)

VERIFY = "verify"
"""The status a verified call's result notes carry (``meta_info["skipweave"]["status"]`` of a verl batch)."""


class Diverged(RuntimeError):
    """A verified call's live result differs from its recording and ``skip.<role>.on_diverge`` is ``error``.

    The message names the role, target, step, call and the first diverging field (with its position and values);
    ``line`` is the call's report line (:mod:`skipweave.verify.report`).
    """

    def __init__(self, message: str, line: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.line = dict(line or {})

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries (Ray) whole
        return (type(self), (str(self), self.line))


_reports: dict[str, ReportFile] = {}
_tallies: dict[tuple[str, str], Tally] = {}  # (role, report path) -> this process's verified calls
_lock = threading.Lock()
_summary_registered = False


def report_file(path: str) -> ReportFile:
    """The process's one :class:`ReportFile` for ``path``."""
    with _lock:
        found = _reports.get(path)
        if found is None:
            found = _reports[path] = ReportFile(path)
        return found


def _count(role: str, path: str, line: Mapping[str, Any]) -> None:
    global _summary_registered
    with _lock:
        _tallies.setdefault((role, path), Tally()).add(line)
        register = not _summary_registered
        _summary_registered = True
    if register:
        lifecycle.at_exit(lifecycle.REPORT, log_summary)


def tallies() -> dict[tuple[str, str], Tally]:
    """This process's verified calls so far: ``(role, report path) -> Tally`` (a copy)."""
    with _lock:
        return {k: Tally(dict(v.counts), v.first) for k, v in _tallies.items()}


def log_summary() -> None:
    """Log one line per verify role of this process: counts by status, the first divergence, the report's path.
    Runs at interpreter exit (a WARNING when some call diverged or had nothing to be compared with, else INFO)."""
    for (role, path), tally in tallies().items():
        level = logging.WARNING if tally.counts.get(DIVERGED) or tally.counts.get(UNRECORDED) else logging.INFO
        report.logger.log(level, "skipweave verify summary role=%s: %s; report: %s", role, tally.summary(), path)


def split(found: Read | Unserved) -> tuple[Read | None, str, int | None]:
    """What :meth:`~skipweave.weaving.replay.Replayer.read_entry` found, as a verified call reads it: the recording
    (``None``: none read), why one found was not read (``""``: none), and the call index of the entry it was matched
    to (claimed: given back when the live call raises)."""
    if isinstance(found, Unserved):
        return None, found.why, found.slot
    return found, "", found[0].call


class Verify(CallAction[CallEngine], kind=Action.VERIFY):
    """The ``verify`` action: each eligible call runs live and is compared with the recording of its own step, which
    ``serve`` may hand back in its place; the store is only read (see the module docstring).

    Args:
        role: the role config (``report``, ``compare``, ``serve``, ``on_diverge``).
    """

    records = False
    takes_validation = True
    validation_fate = ("such calls are taken for validation calls: compared with the validation recordings (shard "
                       "val_<shard>)")

    def __init__(self, role: RoleConfig) -> None:
        super().__init__(role)
        self.path = role.report or default_report_path()
        self.warned_unrecorded = self.warned_empty = False
        # the result notes (verl's meta_info["skipweave"]) tell each call's own fate, never what the call computed
        self.spec = role.compare.ignoring(tuple(f"{attribute}.{role.note or key}"
                                                for attribute, key in RESULT_NOTES.current()))
        self._rules_checked = False  # the compare.fields rules were checked against a compared pair (once)
        self._rules_lock = threading.Lock()

    def own_step_only(self, validation: bool) -> bool:
        """Always: a call is compared with the recording of its own step (matched as ``cache`` matches)."""
        return True

    # ------------------------------------------------------------------ the two paths
    def sync_call(self, engine: CallEngine, wrapped: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], d: Call) -> Any:
        """Verify a plain call: read its recording, run it live, compare, hand back what ``serve`` says.

        Raises:
            Diverged: it diverged and ``on_diverge`` is ``error``.
            FingerprintMismatch: ``serve: recorded``, the recording was made for other inputs and
                ``fingerprint.on_mismatch`` is ``error``.
        """
        engine.ledger.fingerprint(d, args, kwargs)  # before the call: the host may mutate its inputs
        read, why, slot = split(engine.replayer.read_entry(d, args, kwargs))
        self._fingerprint_as_recorded(engine, d, read, args, kwargs)
        lengths = self._list_lengths(engine, d, read)
        t0 = time.perf_counter()
        with self._gives_back(engine, d, slot), engine.recorder.real_call(d, LIVE_ONLY):  # records nothing
            live = wrapped(*args, **kwargs)
        if resolvable(live):  # a plain def that hands back its coroutine (or an asyncio future): judged once awaited
            return self._judged_when_awaited(engine, live, d, read, why, slot, args, kwargs, t0, lengths)
        expected = self.expected(engine, read, args, kwargs)
        line = self.compare(engine, d, read, why, expected, live)
        return self.finish(engine, d, read, slot, live, line, args, kwargs, t0, lengths)

    def _fingerprint_as_recorded(self, engine: CallEngine, d: Call, read: Read | None, args: tuple[Any, ...],
                                 kwargs: Mapping[str, Any]) -> None:
        """Before the live call (the host may change its inputs in place): take the call's fingerprint under the rule
        its recording's was taken with (a format-1 entry's: as passed), which :meth:`compare` reads."""
        if read is not None:
            engine.ledger.fingerprint(d, args, kwargs, fingerprint_rule(read[2].manifest))

    def _list_lengths(self, engine: CallEngine, d: Call, read: Read | None) -> list[tuple[list[Any], int]] | None:
        """With ``serve: recorded``, the declared list effects' lengths before the live call (see
        :meth:`~skipweave.weaving.effects.DeclaredEffects.drop_appended`)."""
        effects = engine.ctx.effects
        if read is None or self.role.serve is not Serve.RECORDED or not effects.effects:
            return None
        return effects.list_lengths(d)

    async def async_call(self, engine: CallEngine, wrapped: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any], d: Call, maybe_sync: bool) -> Any:
        """Verify an awaited call (its serving step already chosen): the recording read and the comparison run in
        worker threads, off the event loop; the echo, the report and what is served, on it."""
        engine.ledger.fingerprint(d, args, kwargs)
        d.work.leave()
        try:
            found = await off_loop(None, engine.replayer.read_entry, d, args, kwargs, work=d.work)
        except ExitBegan:
            found = EXIT_BEGAN
        except BaseException:  # cancelled while reading: its call index goes back, nothing ran
            engine.ledger.give_back(d)
            raise
        if found is EXIT_BEGAN or not d.work.enter():
            return await engine.stand_aside(wrapped, args, kwargs, d, awaited=True)
        read, why, slot = split(found)
        self._fingerprint_as_recorded(engine, d, read, args, kwargs)
        lengths = self._list_lengths(engine, d, read)
        t0 = time.perf_counter()
        with self._gives_back(engine, d, slot), engine.recorder.real_call(d, LIVE_ONLY):
            live = wrapped(*args, **kwargs)  # called from this coroutine's frame
            if not maybe_sync or inspect.isawaitable(live):
                live = await live
        return await self._judge_off_loop(engine, d, read, why, slot, live, args, kwargs, t0, lengths)

    @contextlib.contextmanager
    def _gives_back(self, engine: CallEngine, d: Call, slot: int | None) -> Iterator[None]:
        """Around the live call: if it raises, the entry it was to be compared with (``slot``) is free again, as its
        call index is (the retry of the step takes both)."""
        try:
            yield
        except BaseException:
            if slot is not None:
                engine.ledger.unclaim(d.step, d.shard, slot)
            raise

    async def _judged_when_awaited(self, engine: CallEngine, awaitable: Awaitable[Any], d: Call, read: Read | None,
                                   why: str, slot: int | None, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                                   t0: float, lengths: list[tuple[list[Any], int]] | None) -> Any:
        try:
            live = await awaitable
        except BaseException:
            engine.ledger.give_back(d)
            if slot is not None:
                engine.ledger.unclaim(d.step, d.shard, slot)
            raise
        if not d.work.enter():
            return live
        try:
            return await self._judge_off_loop(engine, d, read, why, slot, live, args, kwargs, t0, lengths)
        finally:
            d.work.leave()

    async def _judge_off_loop(self, engine: CallEngine, d: Call, read: Read | None, why: str, slot: int | None,
                              live: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], t0: float,
                              lengths: list[tuple[list[Any], int]] | None) -> Any:
        expected = self.expected(engine, read, args, kwargs)
        d.work.leave()
        try:
            line = await off_loop(None, self.compare, engine, d, read, why, expected, live, work=d.work)
        except ExitBegan:
            return live  # the process exits meanwhile: nothing compared, the live result goes back
        if not d.work.enter():
            return live
        return self.finish(engine, d, read, slot, live, line, args, kwargs, t0, lengths)

    # ------------------------------------------------------------------ the steps
    def expected(self, engine: CallEngine, read: Read | None, args: tuple[Any, ...],
                 kwargs: Mapping[str, Any]) -> Any:
        """What a replay would hand the host (the recording after the role's echo); in the host's thread."""
        if read is None:
            return None
        loaded = read[2]
        try:
            return engine.ctx.on_replay(loaded.result, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - the echo does not fit: compare the recording as it is
            logger.debug("skipweave verify: echo of %s failed (%s: %s)", read[1], type(exc).__name__, exc)
            return loaded.result

    def compare(self, engine: CallEngine, d: Call, read: Read | None, why: str, expected: Any,
                live: Any) -> dict[str, Any]:
        """The report line of ``d``: ``live`` compared with ``expected`` under the role's ``compare`` (touches no
        host state: an ``async`` target runs it in a worker thread); ``why``: why the recording found was not read
        (the line's ``reason``)."""
        ctx = engine.ctx
        comparison, inputs = None, "unknown"
        changed: tuple[Change, ...] = ()
        if read is not None:
            manifest = read[2].manifest
            recorded_fp = manifest.get("input_fingerprint")
            live_fp = d.fingerprint_taken(fingerprint_rule(manifest))  # taken before the live call
            if recorded_fp and live_fp:
                inputs = "same" if recorded_fp == live_fp else "differ"
            comparison = compare(expected, live, self.spec)
            changed = self.environment_changes(engine, manifest)
            self.check_rules(engine, d, expected, live)
        return record(role=self.role.role, target=ctx.target.name, step=d.step, call=d.call, shard=d.shard,
                      validation=d.validation, comparison=comparison, inputs=inputs, reason=why,
                      environment=changed)

    def environment_changes(self, engine: CallEngine, manifest: Mapping[str, Any]) -> tuple[Change, ...]:
        """What the recording's environment (target source, engine packages, ``fingerprint.env`` keys) and this
        process's disagree on: named beside a divergence as its likely cause. A verify run serves no recording by
        its environment (``fingerprint.on_env_mismatch`` is a replay's), it only says what changed."""
        live = engine.replayer.live_fields()
        recorded = manifest.get("environment")
        if live is None or recorded is None or identical(recorded, engine.ctx.environment.value()):
            return ()
        return changes_from(recorded, live)

    def check_rules(self, engine: CallEngine, d: Call, expected: Any, live: Any) -> None:
        """At the target's first compared call: one WARNING per ``compare.fields`` rule (``ignore`` aside) that names
        no field of the recorded or the live result (:func:`~skipweave.verify.rules.unmatched_rules`): a typo in
        it would compare that field by the default rule, or, under ``default: ignore``, not at all, with no word
        said. Later calls are not walked again (the walk lists every leaf of both results)."""
        with self._rules_lock:
            if self._rules_checked:
                return
            self._rules_checked = True
        role = self.role
        unmatched = unmatched_rules(role.compare, expected, live)
        for pattern, rule in unmatched:
            logger.warning(
                "skipweave verify: role %s target %s: skip.%s.compare.fields rule %r (%s) names no field of the "
                "recorded or the live result of step %d call %d, so it compares nothing (check its spelling); the "
                "result's fields: %s", role.role, engine.ctx.target.name, role.role, pattern, rule_form(rule),
                d.step, d.call, field_sample(expected, live))

    def finish(self, engine: CallEngine, d: Call, read: Read | None, slot: int | None, live: Any,
               line: dict[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], t0: float,
               lengths: list[tuple[list[Any], int]] | None = None) -> Any:
        """Report ``line``, then hand back what ``serve`` says (in the host's thread); ``slot``: the recording's call
        index (given back with ``on_diverge: error``); ``lengths``: the declared lists' lengths before the live call,
        cut back to before the recording is served.

        Raises:
            Diverged: the call diverged and ``on_diverge`` is ``error``.
        """
        ctx, role = engine.ctx, self.role
        report_file(self.path).append(line)
        _count(role.role, self.path, line)
        text = describe(line)
        if line["status"] == IDENTICAL and not line["fields"] and not self.warned_empty:
            self.warned_empty = True  # a typo in the one field a `default: ignore` spec names compares nothing
            logger.warning("skipweave verify: %s, but no field of the result was compared: skip.%s.compare ignores "
                           "them all; check the paths it names", text, role.role)
        if line["status"] == UNRECORDED and not self.warned_unrecorded:
            self.warned_unrecorded = True  # a mistyped dump dir or namespace must not pass as a quiet run
            logger.warning("skipweave verify: %s; dump dir %s, namespace %s: a verify run compares with what a "
                           "recording run (e.g. %s) left there; check skip.%s.dump_dir and "
                           "namespace (later such calls at INFO)", text, ctx.store.dump_dir, ctx.store.namespace,
                           recording_profile(role.role), role.role)
        elif line["status"] == DIVERGED:
            if role.on_diverge is OnDiverge.ERROR:
                # as a call that raised: its index and its recording go to the retry, which is compared again
                engine.ledger.give_back(d)
                if slot is not None:
                    engine.ledger.unclaim(d.step, d.shard, slot)
                raise Diverged(f"skipweave verify: {text} (skip.{role.role}.on_diverge=error; report: {self.path})",
                               line)
            logger.warning("skipweave verify: %s", text)
        else:
            logger.info("skipweave verify: %s", text)
        if read is not None and role.serve is Serve.RECORDED:
            if lengths:
                ctx.effects.drop_appended(lengths)
            served = engine.replayer.serve(d, read, args, kwargs, t0)
            if isinstance(served, Hit):
                return served.value
            logger.warning("skipweave verify: role %s target %s step %d call %d: the recording cannot be served "
                           "here (see above); the live result is handed back", role.role, ctx.target.name, d.step,
                           d.call)
        annotate(live, VERIFY, d.step, d.served if read is not None else None, self.role.note)
        return live


__all__ = ["Diverged", "VERIFY", "Verify", "log_summary", "report_file", "tallies"]
