"""The call ledger of one woven target: which call of its step each call is, and which real calls are running.

A call the gate found eligible gets its step's next call index in its shard (:meth:`CallLedger.decide`); a call
whose real call raised gives its index back for the next call of the step (nothing was recorded). The ledger
also knows the real calls running now, per step and shard: two of them running at once make both *concurrent*
(their part is then matched by inputs only), and under single flight (``repeat*`` actions) a call that a running
call's recording will serve waits for it instead of generating too (:meth:`CallLedger.choose`). See
docs/architecture.md for the path of one call.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import heapq
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from skipweave import lifecycle, report
from skipweave.config.errors import ConfigError
from skipweave.config.schema import RoleConfig, ShardKind, TargetSpec
from skipweave.store.errors import EntryForeign
from skipweave.store.format.versions import ARGUMENTS, SIGNATURE
from skipweave.weaving import shared_dirs
from skipweave.weaving.fingerprint import fingerprint, signature_fingerprint
from skipweave.weaving.notes import RESULT_NOTES
from skipweave.weaving.shards import VALIDATION_SHARD, shard_label, shared_shard_advice

if TYPE_CHECKING:
    from skipweave.report import TargetCounters
    from skipweave.store.step_store import StepStore
    from skipweave.weaving.binding import Binding
    from skipweave.weaving.rng import RngMarks

logger = logging.getLogger(__name__)

RUNNING_HERE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("skipweave_active",
                                                                               default=frozenset())
"""Ids of the proxies whose real call is running in this context: a nested call of the same target (recursion)
runs live."""


@dataclass(frozen=True, slots=True)
class Unserved:
    """The outcome of a call that no recording serves, as the replayer returns it (:meth:`~skipweave.weaving.replay.
    Replayer.read_entry`, :meth:`~skipweave.weaving.replay.Replayer.serve`) and the live path takes it: why, and what
    its live run does."""

    why: str = ""
    """Why the entry found for it was not served, for people (a replay-only run's message, a verify report's
    ``reason``); ``""``: none was found."""
    record: bool = True
    """Its live result is recorded (``False``: it runs live and records nothing)."""
    replace: bool = False
    """Recorded in place of an entry that was set aside or regenerated."""
    slot: int | None = None
    """The call index of the entry it was matched to (see :mod:`skipweave.policy.matching`), where its live result
    is recorded; ``None``: none, its own position."""


NOT_SERVED = Unserved()
"""No recording serves the call: it runs live and is recorded at its own position."""

LIVE_ONLY = Unserved(record=False)
"""The call runs live and records nothing."""


@dataclass(frozen=True, slots=True)
class Hit:
    """A call a recording served (:meth:`~skipweave.weaving.replay.Replayer.serve`)."""

    value: Any
    """What the host gets."""


class Call:
    """One call the gate let through, from its call index to the end of its record: its decision (index, shard,
    fingerprint) and lookup (the serving step), kept by the ledger, and its running real call; its outcome is a value
    (:class:`Unserved`, :class:`Hit`), not a field.

    ``call`` is its position among this process's calls of its step. ``fp`` is its input
    fingerprint under ``fp_rule``, the rule its entry is recorded with (``signature``, or ``arguments`` when the
    target has no signature or the call does not bind to it), ``None`` until taken; ``fp_arguments`` its fingerprint
    under the ``arguments`` rule, taken only when an entry of that rule (format 1) is compared with it
    (:meth:`CallLedger.fingerprint`).
    """

    __slots__ = ("step", "call", "shard", "served", "fp", "fp_rule", "fp_arguments", "inputs", "no_store",
                 "start_number", "waits_for", "done", "thread", "concurrent", "instance", "waited",
                 "validation", "rng_before", "lists_before", "effects_open", "work")

    def __init__(self, step: int, call: int, shard: str, served: int | None) -> None:
        self.step, self.call, self.shard, self.served = step, call, shard, served
        self.fp: str | None = None
        self.fp_rule = ARGUMENTS
        self.fp_arguments: str | None = None
        # (args, kwargs) of a call of a fingerprint shard, until its serving step is chosen: see CallLedger.choose
        self.inputs: tuple[tuple[Any, ...], Mapping[str, Any]] | None = None
        self.no_store = False  # the lookup (or the exit, during its real call) decided it records nothing
        # while the store counts it as running in its part: its number among the calls the store saw start, else 0
        self.start_number = 0
        self.waits_for: Call | None = None  # single flight: the running call whose recording will serve this one
        self.done: concurrent.futures.Future[None] | None = None  # set when this real call and its record end
        self.thread = 0
        self.concurrent = False  # another thread ran a real call of the same step meanwhile
        self.instance: Any = None  # the bound instance (``self`` of expressions: echo, effects)
        self.waited = False  # single flight waited for another call already (never twice)
        self.validation = False  # a validation call (recorded apart: shard val_<shard>, never served to training)
        self.rng_before: RngMarks | None = None  # the generators' marks right before the real call (restore_rng)
        # declared effects that were lists right before the real call: expression -> (the list, its items then)
        self.lists_before: dict[str, tuple[list[Any], list[Any]]] | None = None
        self.effects_open = 0  # its number among the target's real calls with effects, until they are taken
        self.work = lifecycle.Work()  # its hold on skipweave's own work, which the process's exit waits for

    def fingerprint_taken(self, rule: str) -> str | None:
        """Its input fingerprint under ``rule`` as already taken (:meth:`CallLedger.fingerprint` takes it), ``None``
        when not taken yet; ``""`` when it has none under ``rule``."""
        if self.fp is None:
            return None
        if rule == self.fp_rule:
            return self.fp
        return self.fp_arguments if rule == ARGUMENTS else ""


class StepChoice(Protocol):
    """What the ledger asks of the role's action (:class:`~skipweave.weaving.actions.CallAction`) when it chooses a
    call's serving step."""

    @property
    def records(self) -> bool:
        """A miss is recorded and the store written (else the store is only read)."""

    def own_step_only(self, validation: bool) -> bool:
        """Only the call's own step may serve it (no scan of the recorded steps, no single flight)."""

    def serving_step(self, step: int, recorded: Sequence[int], validation: bool = False) -> int | None:
        """The recorded step that serves a call at ``step``, or ``None``."""


class CallLedger:
    """Call indices, claimed entries and running real calls of one woven target.

    Args:
        role, target: the config of the (role, target) pair.
        store: the role's store.
        counts: the target's counters (:func:`skipweave.report.for_target`).
        binding: how a call binds to the target's signature (``None``: calls are fingerprinted as passed).
        action: the role's action (:class:`StepChoice`), which chooses the serving step.

    Attributes:
        lock: guards the ledger (and the declared effects' counts, see :class:`~skipweave.weaving.effects.
            DeclaredEffects`).
        running: real calls of the target in progress, in any thread: the front leaves every call to the
            proxy's general path while one runs (a nested call must see the recursion guard).
        indices: (step, shard) -> the next call index to hand out.
    """

    def __init__(self, role: RoleConfig, target: TargetSpec, store: StepStore, counts: TargetCounters,
                 binding: Binding | None, action: StepChoice) -> None:
        self.role, self.target, self.store, self.counts = role, target, store, counts
        self.binding, self.action = binding, action
        self.lock = threading.Lock()
        self.running = 0
        self.indices: dict[tuple[int, str], int] = {}
        self.free: dict[tuple[int, str], list[int]] = {}  # indices given back by calls that raised, lowest first
        # (step, shard) -> slots this process served or recorded at that step: never served to it again
        self.claimed: dict[tuple[int, str], set[int]] = {}
        self.cursor: dict[tuple[int, str], int] = {}  # (step, shard) -> no free slot below it (free_slot)
        # (step, shard) -> this process's real calls of that step now running (single flight, thread overlap)
        self.in_flight: dict[tuple[int, str], list[Call]] = {}
        self.validation_calls = 0
        self.shared_warned = False
        self._fp_ignore: tuple[str, ...] | None = None
        self.include_warned = False

    # ------------------------------------------------------------------ call indices
    def take_index(self, step: int, shard: str) -> int:
        """The call index of a new call of ``step`` in ``shard``: the lowest given back, else the next."""
        with self.lock:
            free = self.free.get((step, shard))
            if free:
                return heapq.heappop(free)
            call = self.indices.get((step, shard), 0)
            self.indices[(step, shard)] = call + 1
            return call

    def give_back(self, d: Call) -> None:
        """The real call raised: its call index is reused by the next call of the step (nothing was recorded)."""
        with self.lock:
            heapq.heappush(self.free.setdefault((d.step, d.shard), []), d.call)

    def next_validation_step(self) -> int:
        """The number of a validation call whose step the step source cannot tell: 1, 2, ..."""
        with self.lock:
            self.validation_calls += 1
            return self.validation_calls

    def claim(self, step: int, shard: str, slot: int) -> None:
        """Entry ``slot`` of ``step`` was served to or recorded by this process: never serve it to it again."""
        with self.lock:
            self.claimed.setdefault((step, shard), set()).add(slot)

    def unclaim(self, step: int, shard: str, slot: int) -> None:
        """Entry ``slot`` of ``step`` may serve this process again (a verified call that read it raised: the call
        that takes its index next compares with it)."""
        with self.lock:
            self.claimed.get((step, shard), set()).discard(slot)

    def claimed_at(self, step: int, shard: str) -> Collection[int]:
        """The slots claimed at ``step``: the live set, not a copy (one per hit, of up to a step's calls); only
        asked for membership, which is safe while another thread adds to it."""
        return self.claimed.get((step, shard), ())

    # ------------------------------------------------------------------ the decision
    def decide(self, step: int, args: tuple[Any, ...], kwargs: Mapping[str, Any],
               validation: bool = False) -> Call:
        """Give a call its step's next call index and shard (the serving step is chosen next: :meth:`choose_first`,
        which touches the dump dir, so an ``async`` call does it in a thread)."""
        role = self.role
        fp, rule = None, ARGUMENTS
        if role.shard is ShardKind.FINGERPRINT:
            fp, rule = self.digest(args, kwargs)
            shard = "f" + fp[:16]
        else:
            try:
                shard = shard_label(role.shard)
            except ConfigError as exc:  # RANK changed after the weave checked it: never fail the training call
                logger.warning("skipweave: role %s target %s step %d: %s; running live without recording",
                               role.role, self.target.name, step, exc)
                d = Call(step, 0, "r0", None)
                d.no_store = True
                return d
        if validation:
            shard = VALIDATION_SHARD + shard
        d = Call(step, self.take_index(step, shard), shard, None)
        d.fp, d.fp_rule, d.validation = fp, rule, validation
        if rule == SIGNATURE:  # its format-1 shard is looked for only when its own serves nothing (choose)
            d.inputs = (args, kwargs)
        return d

    def choose_first(self, d: Call) -> EntryForeign | None:
        """A call's first store work: the check that the dump dir is the driver's (once per process and dump dir),
        its first-call mark (now, not at its hit or miss: a call that raises was still called) and the serving step's
        choice (:meth:`choose`, whose value it returns).

        Raises:
            DumpDirNotShared: the role has ``require_shared`` and its dump dir is not the driver's folder
                (:mod:`skipweave.weaving.shared_dirs`); the target's ``eligible`` counter then stays unset, so every
                later call asks again and raises too.
        """
        counts = self.counts
        if not counts.eligible:
            shared_dirs.check(self.role)
            report.first_call(self.role.role, self.target.name, eligible=True)
        if not (counts.validation if d.validation else counts.training):  # for the validation-only exit warning
            report.call_kind(self.role.role, self.target.name, validation=d.validation)
        return self.choose(d)

    def choose(self, d: Call) -> EntryForeign | None:
        """Choose the step that serves ``d`` (``d.served``), or wait for one being recorded (``d.waits_for``).

        Returns:
            The entry of a format version this skipweave does not read that ``d``'s own position holds, when ``d`` is
            to run live and be recorded (the caller hands it to :meth:`~skipweave.weaving.replay.Replayer.foreign`:
            ``d`` then runs live and records nothing, as a call that position would have served does; recorded
            elsewhere, its entry would serve a later run's call in place of the one the foreign entry holds); else
            ``None``.
        """
        role, target, store, action = self.role, self.target.name, self.store, self.action
        step, shard = d.step, d.shard
        own = action.own_step_only(d.validation)
        try:
            if action.records:  # an action that only reads the store (verify) changes nothing in it
                store.prepare_part(step, target, shard, resumable=self.resumable(d))
            if own:  # only this very step can serve: no scan of the store
                recorded = [step] if store.is_complete(step, target, shard) else []
            else:
                recorded = store.recorded_steps(target, shard)
            served = action.serving_step(step, recorded, d.validation)
            inputs, d.inputs = d.inputs, None
            if served is None and inputs is not None:
                served = self._format1_shard(d, *inputs)
                shard = d.shard
        except Exception as exc:  # an unreadable dump dir never fails the training call
            logger.warning("skipweave: role %s target %s step %d: the store under %s is unusable (%s: %s); "
                           "running live without recording", role.role, target, step, store.dump_dir,
                           type(exc).__name__, exc)
            d.no_store = True
            return None
        d.served = served
        if not action.records:  # served or compared with the recording, if any; never recorded, never in flight
            return None
        if d.validation and not role.replay_only:  # recorded for a replay-only run, never served here
            mine = (step, shard) in self.claimed or (step, shard) in self.in_flight  # this run is recording it
            if served is not None and not mine:
                d.served, d.no_store = None, True  # recorded by an earlier run: live, not again
                return None
            d.served = None
        elif served is not None:
            return None
        try:
            foreign = store.foreign_calls(d.step, target, d.shard).get(d.call)
        except OSError:  # read again, and judged, when the entry is committed
            foreign = None
        if foreign is not None:
            return foreign
        with self.lock:  # one lock for the look and the registration: two calls never both decide to generate
            if not own and role.single_flight and not d.waited:
                d.waits_for = self._recording_that_serves(d, recorded)
            if d.waits_for is None:
                self.register(d)
        return None

    def _format1_shard(self, d: Call, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int | None:
        """For a call of a fingerprint shard (``shard: fingerprint``) that nothing serves under its signature digest:
        the shard named by its as-passed digest, where format 1 recorded the same input, when a step there serves it.
        ``d`` then moves to that shard (its call index taken there); its entries are compared by their own rule.
        Returns the serving step, or ``None`` (``d`` stays where it is).

        Raises:
            OSError, UnsafePath: the store is unusable (as :meth:`choose`'s own look).
        """
        fp = self.fingerprint(d, args, kwargs, ARGUMENTS)
        if not fp:
            return None
        legacy = (VALIDATION_SHARD if d.validation else "") + "f" + fp[:16]
        target, store, action = self.target.name, self.store, self.action
        if action.records:
            store.prepare_part(d.step, target, legacy, resumable=False)
        if action.own_step_only(d.validation):
            recorded = [d.step] if store.is_complete(d.step, target, legacy) else []
        else:
            recorded = store.recorded_steps(target, legacy)
        served = action.serving_step(d.step, recorded, d.validation)
        if served is not None:
            self.give_back(d)  # its index in the shard it leaves serves the next call there
            d.shard, d.call = legacy, self.take_index(d.step, legacy)
        return served

    def resumable(self, d: Call) -> bool:
        """Whether a short part an interrupted run left at ``d``'s step may be resumed (:mod:`skipweave.store.resume`):
        its entries are then matched to calls by input fingerprint, which identifies a call only when it hashes all of
        its inputs (no ``fingerprint.include``: a phase hashing only the fields it reads gives one digest to calls that
        differ elsewhere) and the shard is not itself the fingerprint (every call of such a part has the same one).
        Validation calls are recorded apart and never resumed."""
        role = self.role
        return not d.validation and not role.fingerprint.include and role.shard is not ShardKind.FINGERPRINT

    def free_slot(self, step: int, shard: str, taken: Collection[int]) -> int:
        """Claim and return the lowest call index of ``step`` that is neither claimed by this process nor in
        ``taken`` (the slots of a resumed part the interrupted run holds): where a live call of a resumed part is
        recorded, so it never lands on an entry a later call of the step may still be served."""
        with self.lock:
            claimed = self.claimed.setdefault((step, shard), set())
            slot = self.cursor.get((step, shard), 0)
            while slot in claimed or slot in taken:
                slot += 1
            claimed.add(slot)
            self.cursor[(step, shard)] = slot + 1  # both sets only grow while a part is resumed
            return slot

    def _recording_that_serves(self, d: Call, recorded: list[int]) -> Call | None:
        """Single flight for the ``repeat*`` actions (caller holds the lock): a running call of this process whose
        recording the action would serve ``d`` from once committed (e.g. step 1 still generating when steps 2-5
        arrive), else None."""
        pending = {
            s: x for (s, shard), running in self.in_flight.items() if shard == d.shard and s != d.step
            for x in running if x.call == d.call and not x.no_store
        }
        if not pending:
            return None
        choice = self.action.serving_step(d.step, sorted(set(recorded) | set(pending)))
        return pending.get(choice) if choice is not None and choice not in recorded else None

    # ------------------------------------------------------------------ running real calls
    def register(self, d: Call) -> None:
        """Count ``d`` among the real calls of its step now running (caller holds :attr:`lock`); another call
        already running there (another thread's, or another asyncio task's) makes both *concurrent*: their part is
        then matched by inputs only, since the order they started in need not repeat."""
        if d.done is not None or d.no_store:
            return
        d.thread = threading.get_ident()
        d.done = concurrent.futures.Future()
        running = self.in_flight.setdefault((d.step, d.shard), [])
        for other in running:  # threads, or asyncio tasks of one thread: their order need not repeat
            other.concurrent = d.concurrent = True
        running.append(d)

    def unregister(self, d: Call) -> None:
        """``d`` no longer runs: drop it from the running calls and wake the single-flight waiters (they choose
        again, now that its record is done or it failed)."""
        with self.lock:
            running = self.in_flight.get((d.step, d.shard), [])
            if d in running:
                running.remove(d)
            if not running:
                self.in_flight.pop((d.step, d.shard), None)
        self.release_waiters(d)

    @staticmethod
    def release_waiters(d: Call) -> None:
        """Single-flight waiters of ``d`` stop waiting (they choose again) while ``d`` itself goes on."""
        if d.done is not None and not d.done.done():
            d.done.set_result(None)

    # ------------------------------------------------------------------ inputs and writers
    def fingerprint(self, d: Call, args: tuple[Any, ...], kwargs: Mapping[str, Any], rule: str | None = None) -> str:
        """The input fingerprint of ``d`` under ``rule`` (one of :data:`~skipweave.store.format.versions.
        FINGERPRINT_RULES`; ``None``: the call's own rule, ``d.fp_rule``, the one its entry is recorded with), taken
        once per rule and kept on ``d``. ``""`` when the inputs cannot be fingerprinted, or not under ``rule`` (a
        ``signature`` digest of a call that does not bind to the signature: nothing recorded under that rule is its).

        Take it before the real call (the host may change its inputs in place): the ``arguments`` digest of a call
        whose own rule is ``signature`` is taken only when an entry of that rule (format 1) is compared with it,
        which a replay and a verify run do before the call.
        """
        if d.fp is None:
            try:
                d.fp, d.fp_rule = self.digest(args, kwargs)
            except Exception as exc:  # e.g. inputs nested too deep: never fail the training call
                self._unfingerprinted(exc)
                d.fp = ""
        if rule is None or rule == d.fp_rule:
            return d.fp
        if rule != ARGUMENTS:
            return ""
        if d.fp_arguments is None:
            try:
                d.fp_arguments = self.arguments_digest(args, kwargs)
            except Exception as exc:  # as above
                self._unfingerprinted(exc)
                d.fp_arguments = ""
        return d.fp_arguments

    def _unfingerprinted(self, exc: Exception) -> None:
        """The inputs could not be fingerprinted (``exc``): a WARNING, and the call goes on without a fingerprint."""
        logger.warning("skipweave: role %s target %s: inputs cannot be fingerprinted (%s: %s); "
                       "the entry is recorded without a fingerprint", self.role.role,
                       self.target.name, type(exc).__name__, exc)

    def digest(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """The input fingerprint of a call under its own rule, and that rule: ``signature`` (its arguments bound to
        the target's signature, :func:`~skipweave.weaving.fingerprint.signature_fingerprint`) when the weaver gave
        the target a :attr:`~skipweave.weaving.context.TargetContext.binding` and the call binds to it, else
        ``arguments`` (:meth:`arguments_digest`).

        Raises:
            ValueError, RecursionError: the inputs cannot be fingerprinted.
        """
        binding = self.binding
        if binding is not None:
            include = self.role.fingerprint.include or None
            fp = signature_fingerprint(binding, args, kwargs, ignore=self._ignored(), include=include,
                                       on_unmatched=None if include is None or self.include_warned
                                       else self.warn_unmatched)
            if fp is not None:
                return fp, SIGNATURE
        return self.arguments_digest(args, kwargs), ARGUMENTS

    def arguments_digest(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The input fingerprint of a call under the ``arguments`` rule (as passed, format 1's): positional arguments
        by index, keyword arguments by name (:func:`~skipweave.weaving.fingerprint.fingerprint`).

        Raises:
            ValueError, RecursionError: the inputs cannot be fingerprinted.
        """
        include = self.role.fingerprint.include or None
        return fingerprint(args, kwargs, ignore=self._ignored(), include=include,
                           on_unmatched=None if include is None or self.include_warned else self.warn_unmatched)

    def _ignored(self) -> tuple[str, ...]:
        """The role's ``fingerprint.ignore`` paths with skipweave's own result notes on any argument (``*.meta_info.
        skipweave*`` and the ``note`` of every role of the woven plan): a phase whose input is an earlier phase's
        result (rewards of a rollout) sees the same inputs whether that result was replayed or recorded live, and
        only the note would tell them apart. Built at the first call, then kept."""
        ignore = self._fp_ignore
        if ignore is None:
            keys = tuple(dict.fromkeys(k for k in (*RESULT_NOTES.role_keys, self.role.note) if k))
            notes = tuple(p for attribute, key in RESULT_NOTES.current()
                          for p in (f"*.{attribute}.{key}*", *(f"*.{attribute}.{k}" for k in keys)))
            ignore = self._fp_ignore = tuple(dict.fromkeys((*self.role.fingerprint.ignore, *notes)))
        return ignore

    def warn_unmatched(self) -> None:
        """Once per target: ``fingerprint.include`` named no part of a call's inputs, so all of them were hashed."""
        self.include_warned = True
        role = self.role
        logger.warning("skipweave: role %s target %s: skip.%s.fingerprint.include %s names no part of the call's "
                       "inputs; the whole inputs are fingerprinted instead (name the fields the call reads, e.g. "
                       "'*.batch.input_ids' of a batch passed first or by keyword)", role.role,
                       self.target.name, role.role, list(role.fingerprint.include))

    def warn_shared(self, d: Call, what: str) -> None:
        """Once per target: several writers share this shard, so calls are matched by their inputs only."""
        if self.shared_warned:
            return
        self.shared_warned = True
        role = self.role
        who, fix = shared_shard_advice(role)
        logger.warning(
            "skipweave: role %s target %s step %d: shard %s %s; %s. A call is served only a recording made for "
            "the same inputs and recorded afresh otherwise, never another writer's result; %s "
            "(docs/ray.md#several-writers-of-one-target)",
            role.role, self.target.name, d.step, d.shard, what, who, fix,
        )


__all__ = ["Call", "CallLedger", "Hit", "LIVE_ONLY", "NOT_SERVED", "RUNNING_HERE", "StepChoice", "Unserved"]
