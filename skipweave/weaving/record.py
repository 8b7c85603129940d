"""Record of one call: run the host's real call, then stage its result and commit it, or hand it to the writer.

Around the real call (:meth:`Recorder.real_call`) the call counts as running (recursion guard, single flight,
the part's running calls in the store), and what a record keeps besides the result is marked: the RNG
generators' state before the call and the declared effects' lists. After it, the result is staged (encoded,
tensors copied) and handed to the background writer, or written here (write-through, or an entry larger than
``write_buffer``); the outcome is counted and the call ends in the store once its entry is committed
(:meth:`Recorder.written`). A failed record never fails the host's call: it is counted, and the first of its kind
in the process is a WARNING that says what to do (:func:`record_failure`). See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipweave import failures, report
from skipweave.store.format import codec
from skipweave.store.identity import is_concurrent_other, started_unix, this_writer
from skipweave.store.step_store import EntryMeta
from skipweave.store.write_behind import WRITER
from skipweave.weaving.calls import NOT_SERVED, RUNNING_HERE, Call, Unserved
from skipweave.weaving.effects import split_appended
from skipweave.weaving.notes import annotate
from skipweave.weaving.rng import capture_rng_state, rng_changes, rng_marks

if TYPE_CHECKING:
    from skipweave.weaving.context import TargetContext

logger = logging.getLogger(__name__)

Snapshot = tuple[Any, "dict[str, Any] | None"]
"""What a record keeps of the host besides the result: ``(rng state, declared effects)``."""


@dataclass(frozen=True)
class Delivery:
    """How a host's result reaches the store: the adapter between a host and :meth:`Recorder.record_live`.

    The default (:data:`AS_RETURNED`) records what the target returned, under the target's own name, with the state
    of the host the call changed (RNG generators, declared effects). A host whose call hands its result over
    elsewhere records through the same Recorder with a delivery of its own: verl's TransferQueue trainer
    (:mod:`skipweave.integrations.verl.tq`), whose ``sample`` returns keys while the trajectories live in the TQ
    service, records what it reads back from there, under one store target for every proxy of the role.

    Attributes:
        store_target: the store target the entries go under (``None``: the target's own name).
        recorded: ``(result, call) -> the value recorded`` (``None``: the result itself). Called in the recording's
            ``try``: what it raises is a failed record (counted and said once), never the host's error.
        host_state: the record keeps the RNG state and the declared effects the call left (see
            :meth:`Recorder.snapshot`).
    """

    store_target: str | None = None
    recorded: Callable[[Any, Call], Any] | None = None
    host_state: bool = True


AS_RETURNED = Delivery()
"""The result the target returned, recorded under its own name, with the host state it left."""


class Recorder:
    """Runs the real calls of one woven target and records their results into its store.

    Args:
        ctx: the target's context (its role, target, store, ledger and declared effects).
        delivery: how a host's result reaches the store (:class:`Delivery`).
    """

    def __init__(self, ctx: TargetContext, delivery: Delivery = AS_RETURNED) -> None:
        self.ctx = ctx
        self.delivery = delivery
        self.store_target = delivery.store_target or ctx.target.name

    @contextlib.contextmanager
    def real_call(self, d: Call, outcome: Unserved = NOT_SERVED) -> Iterator[None]:
        """Around the target's real call: nested calls of it run live (recursion guard, and the front leaves every
        call to the proxy's general path while one runs); if it raises, its call index is given back. The host's
        own call is no work of skipweave's: the process's exit does not wait for it (:mod:`skipweave.lifecycle`).
        ``outcome``: why no recording served it (:class:`~skipweave.weaving.calls.Unserved`): a call that records
        nothing (``record`` false) is not counted among the step's running calls."""
        ctx = self.ctx
        ledger, effects = ctx.ledger, ctx.effects
        record = outcome.record and not d.no_store
        token = RUNNING_HERE.set(RUNNING_HERE.get() | {id(ctx)})
        with ledger.lock:
            ledger.running += 1
            if record:
                ledger.register(d)  # a call that became a miss only when its entry could not be served
            alone = effects.open_call(d) if effects.effects else False
        if record:
            d.start_number = ctx.store.call_started(d.step, self.store_target, d.shard)
            if alone:
                d.lists_before = effects.lists_before(d)
            if ctx.role.restore_rng:
                try:
                    d.rng_before = rng_marks()  # last: what the call changes is recorded (see snapshot)
                except Exception as exc:  # (a broken CUDA setup): never fail the call; the whole state is tried after
                    logger.debug("skipweave: RNG marks before %s failed (%s: %s)", ctx.target.name,
                                 type(exc).__name__, exc)
        d.work.leave()  # the host's own call: exit does not wait for it
        try:
            yield
        except BaseException:
            ledger.give_back(d)
            self.call_ended(d, failed=True)
            raise
        finally:
            if not d.work.enter():
                d.no_store = True  # the process exits meanwhile: the result goes back unrecorded
            with ledger.lock:
                ledger.running -= 1
            RUNNING_HERE.reset(token)

    def call_ended(self, d: Call, failed: bool = False) -> None:
        """``d`` ended (its record committed, failed or not made): it ends in the store's part and the ledger."""
        ctx = self.ctx
        if d.effects_open:  # failed, or ended without its effects taken
            ctx.effects.close_call(d)
        if d.start_number:
            number, d.start_number = d.start_number, 0
            try:
                ctx.store.call_ended(d.step, self.store_target, d.shard, failed=failed, number=number)
            finally:
                ctx.ledger.unregister(d)

    def snapshot(self, d: Call) -> Snapshot:
        """What a record keeps of the host besides the result, taken right after the real call: the state of the
        generators the call changed (see :func:`~skipweave.weaving.rng.rng_changes`) and the declared effects'
        values."""
        ctx = self.ctx
        if not ctx.role.restore_rng:
            rng = None
        elif d.rng_before is not None:  # only the generators the call changed (restored alone on replay)
            rng = rng_changes(d.rng_before)
        else:
            rng = capture_rng_state()
        return rng, (ctx.effects.after_call(d) if ctx.effects.effects else None)

    def after_live(self, result: Any, d: Call, seconds: float, snapshot: Snapshot | None = None,
                   returned: str | None = None, outcome: Unserved = NOT_SERVED) -> Any:
        """Record ``result`` of ``d``'s real call (``seconds`` long) and return it; the call ends here unless the
        background writer took the entry (it ends the call once committed). ``returned``, ``outcome``: see
        :meth:`record_live`."""
        handed_over = False
        try:
            result, handed_over = self.record_live(result, d, seconds, snapshot, returned, outcome)
            return result
        finally:
            if not handed_over:
                self.call_ended(d)

    def record_live(self, result: Any, d: Call, seconds: float, snapshot: Snapshot | None = None,
                    returned: str | None = None, outcome: Unserved = NOT_SERVED) -> tuple[Any, bool]:
        """Record a live result: staged (encoded, tensors copied) and handed to the background writer, or
        written here (write-through, or an entry larger than ``write_buffer``). Returns the result and whether
        the writer took it (it then ends the call in the store once committed, see :meth:`written`).

        ``returned``: :data:`~skipweave.store.format.manifest.RETURNED_AWAITABLE` when ``result`` is the value of an
        awaitable a plain ``def`` target handed back (the manifest says so; a replay hands back an awaitable). A result
        that is itself awaitable (a Ray ``ObjectRef``; an asyncio future an ``async`` target returned) is a handle to
        work still running: handed back untouched and not recorded, with a WARNING.

        ``outcome``: why no recording served it (:class:`~skipweave.weaving.calls.Unserved`): whether it records, at
        which slot (``None``: its own position; a free one in a resumed part) and whether in place of another entry."""
        ctx, delivery, name = self.ctx, self.delivery, self.store_target
        role, target, store, ledger = ctx.role, ctx.target, ctx.store, ctx.ledger
        record, slot = outcome.record and not d.no_store, outcome.slot
        if slot is None and record and store.is_resumed(d.step, name, d.shard):
            # a part an interrupted run left short: recorded into a slot none of its entries holds (each of them may
            # still serve a later call of the step), not at the call's position
            slot = ledger.free_slot(d.step, d.shard, store.resumed_calls(d.step, name, d.shard))
        if slot is None:
            slot = d.call
        try:
            key: Any = store.key(d.step, name, d.shard, slot)
        except ValueError as exc:  # a name that cannot be a folder of the dump dir: never fail the call
            logger.warning("skipweave: not recording role %s target %s step %d: %s", role.role,
                           target.name, d.step, exc)
            key, record = None, False
        nbytes = 0
        if record and inspect.isawaitable(result):
            # e.g. a Ray ObjectRef (see asyncio_bridge.resolvable): a handle to work still running, not its result
            logger.warning("skipweave: not recording %s: %s returned %s, a handle to a result still being "
                           "computed; weave the function that produces the data instead", key,
                           target.path, type(result).__name__)
            record = False
        status = report.BYPASS if d.validation else report.MISS  # a validation call ran live, as always
        if not record:
            report.event(status, role=role.role, target=target.name, step=d.step,
                         nbytes=0, seconds=seconds, call=d.call)
            annotate(result, status, d.step, None, role.note)
            return result, False
        handed_over = False
        try:
            if snapshot is None:
                snapshot = self.snapshot(d) if delivery.host_state else (None, None)
            rng, effects = snapshot
            effects, appended = split_appended(effects)
            value = result if delivery.recorded is None else delivery.recorded(result, d)
            staged = store.stage(value, rng_state=rng, effects=effects, appended=appended)
            meta = EntryMeta(target.path, d.fp or "", seconds, outcome.replace, d.concurrent, displace=True,
                             background=True, environment=ctx.environment.value(), returned=returned,
                             fingerprint_rule=d.fp_rule)
            budget = role.write_buffer
            if WRITER.behind() and 0 < staged.nbytes <= budget:
                staged = staged.copied()  # the host may change its result in place as soon as it has it
                ledger.claim(d.step, d.shard, key.call)  # never served to this process's own later calls
                WRITER.submit(store, key, staged, meta, budget=budget,
                              on_done=lambda outcome: self.written(d, key, outcome, counted=staged.nbytes))
                handed_over = True
                nbytes = staged.nbytes
                # Only now, the entry pending: a later call of the step is not concurrent with this one, and
                # single-flight waiters choose again and wait for the pending entry.
                ledger.unregister(d)
            else:
                nbytes, committed = store.commit(key, staged, meta)
                self.written(d, key, (nbytes, committed), end=False)
                slot = committed.call
                store.after_commit_soon((committed.step,))  # retention (skip.<role>.keep), off this call
        except codec.PickleRefused as exc:
            record_failure(role.role, target.name, store.dump_dir, key, exc, what=f"not recording {_entry(key)}: {exc}")
        except Exception as exc:  # a failed record never fails the training call
            self.written(d, key, exc, end=False)
        report.event(status, role=role.role, target=target.name, step=d.step,
                     nbytes=nbytes, seconds=seconds, call=slot)
        annotate(result, status, d.step, None, role.note)
        return result, handed_over

    def written(self, d: Call, key: Any, outcome: Any, *, end: bool = True, counted: int = 0) -> None:
        """A record of ``d`` ended (in the background writer's thread when ``end``: the call then ends in the
        store, so its part closes only once its entries are committed). ``outcome``: ``(nbytes, committed
        key)`` or the exception the record raised; ``counted``: bytes already counted as written when the entry
        was handed over (taken back if it failed)."""
        ctx = self.ctx
        try:
            if isinstance(outcome, BaseException):
                record_failure(ctx.role.role, ctx.target.name, ctx.store.dump_dir, key, outcome,
                               then=f"the live result {'was' if end else 'is'} returned and nothing partial was left",
                               uncounted=counted)
                return
            committed = outcome[1]
            ctx.ledger.claim(d.step, d.shard, committed.call)
            if committed.call != key.call and self._taken_by_concurrent(key):
                ctx.ledger.warn_shared(d, f"already held call {key.call} from another writer of this run")
        finally:
            if end:
                self.call_ended(d)

    def _taken_by_concurrent(self, key: Any) -> bool:
        """The slot ``key`` names holds an entry a concurrent writer made (so the record moved to another)."""
        me, started = this_writer(), started_unix()
        return any(r.call == key.call and is_concurrent_other(r, me, started)
                   for r in self.ctx.store.part_calls(key.step, key.target, key.shard))


def record_failure(role: str, target: str, dump_dir: str, key: Any, exc: BaseException, *, then: str = "",
                   what: str = "", uncounted: int = 0) -> None:
    """Count a record that failed and say so: the first failure of its kind in this process (an ``OSError`` by dump
    dir and errno, anything else by role and type: :func:`skipweave.failures.record_failed`) is a WARNING naming the
    path, the error and what to do; the later ones are DEBUG lines, counted in the exit summary (``record_failures``).
    A dump dir that cannot be written fails every step's record the same way: one WARNING, not one per step.

    Args:
        role, target: the names of the config.
        dump_dir: the role's dump dir.
        key: the entry's key (an :class:`~skipweave.store.format.layout.EntryKey`).
        exc: what the record raised.
        then: what became of the call, for the message.
        what: the message's first clause, when not "recording ... under ... failed (...); <then>".
        uncounted: see :func:`skipweave.report.record_failed`.
    """
    report.record_failed(role, target, uncounted=uncounted)
    first = failures.record_failed(role, dump_dir, exc)
    what = what or f"recording {_entry(key)} under {dump_dir} failed ({failures.error_text(exc)}); {then}"
    if not first:
        logger.debug("skipweave: %s", what)
        return
    logger.warning("skipweave: %s; %slater failures like it are logged at DEBUG and counted in the exit summary "
                   "(record_failures=N)", what, _remedy(role, dump_dir, exc))


_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def _remedy(role: str, dump_dir: str, exc: BaseException) -> str:
    """What to do about a failed record, as a clause ending in "; " (empty when the error says it itself)."""
    if not isinstance(exc, OSError):
        return ""
    if exc.errno in _NOT_WRITABLE:
        return (f"make {dump_dir} writable by this process or set skip.{role}.dump_dir to a folder it can write (a "
                f"store that is only replayed may stay read-only: skip.{role}.replay_only=true records nothing); ")
    if exc.errno in _NO_SPACE:
        return (f"free space under {dump_dir} (`skipweave gc {dump_dir} --keep-last N --yes` removes old steps) or set "
                f"skip.{role}.dump_dir to another disk; ")
    return f"check {dump_dir} (skip.{role}.dump_dir); "


def _entry(key: Any) -> str:
    """An entry key for people: ``role rollout target gen step 3 call 0``."""
    try:
        return f"role {key.role} target {key.target} step {key.step} call {key.call}"
    except AttributeError:
        return str(key)


__all__ = ["AS_RETURNED", "Delivery", "Recorder", "Snapshot", "record_failure"]
