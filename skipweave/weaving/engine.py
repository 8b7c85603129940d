"""The call engine of one woven target: settles the calls its gate found eligible, in the host's thread or awaited.

Per call, in this order::

    decision   the ledger gives the call its index and shard      (CallLedger.decide)
    lookup     the serving step is chosen, or a running call       (CallLedger.choose_first / choose)
               whose recording will serve it is waited for
    outcome    the role's action serves it                         (CallAction.sync_call / async_call)

The replaying actions (``cache``, ``repeat``, ``repeat_cycle``, ``repeat_last``: :class:`Replaying`) share one
outcome: the entry is read and served (hit, :class:`~skipweave.weaving.replay.Replayer`), else the call runs live
and is recorded (miss, :class:`~skipweave.weaving.record.Recorder`); ``verify`` has its own
(:class:`~skipweave.weaving.verifier.Verify`). The engine reads its target's frozen
:class:`~skipweave.weaving.context.TargetContext`; the proxy (:mod:`~skipweave.weaving.proxy`) builds both, runs the
gate and hands eligible calls here. docs/architecture.md follows one call through them.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from skipweave import lifecycle, report
from skipweave.config.schema import Action
from skipweave.store.format.manifest import RETURNED_AWAITABLE
from skipweave.store.format.versions import reader_of
from skipweave.weaving.actions import CallAction
from skipweave.weaving.asyncio_bridge import EXIT_BEGAN, AsyncBridge, ExitBegan, chooser, off_loop, resolvable
from skipweave.weaving.calls import NOT_SERVED, Call, Hit, Unserved
from skipweave.weaving.context import TargetContext
from skipweave.weaving.notes import annotate
from skipweave.weaving.record import Recorder
from skipweave.weaving.replay import Read, Replayer
from skipweave.weaving.shared_dirs import DumpDirNotShared


class CallEngine:
    """Settles the eligible calls of one woven target (see the module docstring).

    Args:
        ctx: the target's context.
        is_async: the target is a coroutine function (every path hands back an awaitable).

    Attributes:
        ctx: the context; ``ledger``, ``action``: its ledger and action, read on every call.
        replayer, recorder, bridge: the parts that replay, record, and run the awaitable helpers.
    """

    def __init__(self, ctx: TargetContext, *, is_async: bool) -> None:
        self.ctx = ctx
        self.is_async = is_async
        self.ledger = ctx.ledger
        self.action = ctx.action
        self.replayer = Replayer(ctx)
        self.recorder = Recorder(ctx)
        self.bridge = AsyncBridge(ctx, self.recorder)

    # ------------------------------------------------------------------ decision and lookup
    def eligible_call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any], step: int, awaited: bool = False, validation: bool = False) -> Any:
        """Settle a call its gate found eligible at ``step``: replay it (hit) or call through and record (miss), or
        whatever the role's action does with it.

        ``validation``: a validation call, recorded under its own shard; served only in a replay-only run.
        Returns the result (an awaitable for ``async`` targets, awaited bridges, and plain ``def`` targets that hand
        back a coroutine or an asyncio future, on a hit as on a miss).

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
            FingerprintMismatch: the entry was made for other inputs and ``on_mismatch`` is ``error``.
        """
        if self.is_async or awaited:
            # Decided when the coroutine starts, not now: one never awaited (cancelled before it ran, dropped)
            # then takes no call index and no single-flight slot that later calls would wait on for good.
            return self.eligible_async(wrapped, args, kwargs, step, instance, maybe_sync=not self.is_async,
                                       validation=validation)
        work = lifecycle.Work()
        if not work.enter():  # the process exits: no work of ours may still run in torch
            return self.live_bypass(wrapped, args, kwargs, step)
        try:
            d = self.ledger.decide(step, args, kwargs, validation)
            try:
                unserved = self.lookup(d, first=True)
            except DumpDirNotShared:
                self.ledger.give_back(d)  # the call never ran: its index serves the next call of the step
                raise
            d.instance, d.work = instance, work
            if unserved is not None:
                return self.live_call(wrapped, args, kwargs, d, unserved)
            return self.sync_call(wrapped, args, kwargs, d)
        finally:
            work.leave()

    def lookup(self, d: Call, first: bool = False) -> Unserved | None:
        """Choose the serving step of ``d`` (with ``first``, its first store work too:
        :meth:`~skipweave.weaving.calls.CallLedger.choose_first`). Returns ``None``, or, when an entry of a format
        this skipweave does not read holds its own position, the outcome: it runs live, recording nothing
        (:meth:`~skipweave.weaving.replay.Replayer.foreign`), whatever the action.

        Raises:
            DumpDirNotShared: see :meth:`~skipweave.weaving.calls.CallLedger.choose_first`.
            ForeignRecording: ``skip.<role>.on_foreign`` is ``error`` and such an entry holds its position.
        """
        foreign = self.ledger.choose_first(d) if first else self.ledger.choose(d)
        return None if foreign is None else self.replayer.foreign(d, foreign)

    def sync_call(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], d: Call) -> Any:
        """Settle ``d``, a plain call: wait for the running call that serves it (single flight), then let the action
        serve it (see :meth:`eligible_call`)."""
        if d.waits_for is not None:  # single flight: wait for the running call that will serve this one
            other, d.waits_for = d.waits_for, None
            if other.done is not None and other.thread != threading.get_ident() and not report.loop_running():
                # (in a thread that runs that call or an event loop, waiting here could never end: run live)
                d.work.leave()  # waiting is no work of ours: exit need not wait for the other call
                try:
                    other.done.result()
                finally:
                    exiting = not d.work.enter()
                if exiting:
                    return self.stand_aside(wrapped, args, kwargs, d)
                d.waited = True  # waits once: if that call recorded nothing, this one runs live, not in a queue
                unserved = self.lookup(d)
                if unserved is not None:
                    return self.live_call(wrapped, args, kwargs, d, unserved)
        return self.action.sync_call(self, wrapped, args, kwargs, d)

    async def eligible_async(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                             step: int, instance: Any, maybe_sync: bool = False, validation: bool = False) -> Any:
        """Settle an eligible call when awaited (:meth:`eligible_call`): its call index and single-flight slot are
        taken when the coroutine starts, so one never awaited takes none.

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
        """
        work = lifecycle.Work()
        if not work.enter():  # the process exits: no work of ours may still run in torch
            return await self.live_bypass(wrapped, args, kwargs, step, awaited=True)
        try:
            ledger = self.ledger
            d = ledger.decide(step, args, kwargs, validation)
            d.instance, d.work = instance, work
            try:  # the serving step's choice (stats, the part's files) off the loop, in the order the calls came
                # (no hold while awaiting: a task never resumed must not keep the exit waiting; the worker threads
                # are joined before the exit steps run)
                work.leave()
                unserved = await off_loop(chooser(), self.lookup, d, True)
                if unserved is None and d.waits_for is not None:  # single flight (see sync_call); awaiting yields
                    other, d.waits_for = d.waits_for, None
                    if other.done is not None:
                        await asyncio.wrap_future(other.done)
                        d.waited = True
                        unserved = await off_loop(chooser(), self.lookup, d)
            except BaseException:  # cancelled while choosing or waiting: its call index goes back, nothing ran
                ledger.give_back(d)
                ledger.unregister(d)
                raise
            if unserved is not None:
                if not work.enter():
                    return await self.stand_aside(wrapped, args, kwargs, d, awaited=True)
                return await self.live_async(wrapped, args, kwargs, d, unserved, maybe_sync)
            return await self.action.async_call(self, wrapped, args, kwargs, d, maybe_sync)
        finally:
            work.leave()

    # ------------------------------------------------------------------ outcomes every action shares
    def live_call(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], d: Call,
                  outcome: Unserved = NOT_SERVED) -> Any:
        """Run ``d``, a plain call no recording served (``outcome`` says why and whether it records), live and record
        it. Returns its result; when the target handed back an awaitable whose value may be recorded
        (:func:`~skipweave.weaving.asyncio_bridge.resolvable`: a coroutine), a coroutine that awaits it and records
        its value, replayed as an awaitable.

        Raises:
            ReplayMissing: the role is replay-only (nothing serves the call).
        """
        ledger = self.ledger
        if self.ctx.role.replay_only:
            self.replayer.missing(d, outcome)
        ledger.fingerprint(d, args, kwargs)  # before the call: the host may mutate its inputs
        t0 = time.perf_counter()
        with self.recorder.real_call(d, outcome):
            result = wrapped(*args, **kwargs)
        if resolvable(result):  # a plain def that hands back its coroutine
            ledger.release_waiters(d)  # it may never be awaited: no later call may wait for it
            return self.bridge.finish_awaitable(result, d, t0, outcome)
        return self.recorder.after_live(result, d, time.perf_counter() - t0, outcome=outcome)

    async def live_async(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], d: Call,
                         outcome: Unserved, maybe_sync: bool) -> Any:
        """Run ``d``, an awaited call no recording served (``outcome``: why, and whether it records), from this
        coroutine's frame and record it (staged off the event loop); ``maybe_sync``: see
        :meth:`~skipweave.weaving.actions.CallAction.async_call`.

        Raises:
            ReplayMissing: the role is replay-only (nothing serves the call).
        """
        if self.ctx.role.replay_only:
            self.replayer.missing(d, outcome)
        self.ledger.fingerprint(d, args, kwargs)
        t0 = time.perf_counter()
        with self.recorder.real_call(d, outcome):
            result = wrapped(*args, **kwargs)  # called from this coroutine's frame
            if not maybe_sync or inspect.isawaitable(result):
                result = await result
        return await self.bridge.after_live_off_loop(result, d, time.perf_counter() - t0, outcome=outcome)

    def live_bypass(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    step: int | None, awaited: bool = False) -> Any:
        """Run the call live, record nothing, count it as a bypass at ``step`` (``None``: it has none); with
        ``awaited``, from a coroutine frame (an awaited sync-or-await helper): returns an awaitable."""
        ctx = self.ctx
        report.event(report.BYPASS, role=ctx.role.role, target=ctx.target.name, step=step)
        if awaited:
            return self.bridge.bridged_bypass(wrapped, args, kwargs, step)
        result = wrapped(*args, **kwargs)
        if type(result) is types.CoroutineType:  # a plain def that handed back its coroutine
            return self.bridge.annotated_awaitable(result, step)
        annotate(result, report.BYPASS, step, None, ctx.note)
        return result

    def stand_aside(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    d: Call, awaited: bool = False) -> Any:
        """The process began to exit while ``d`` waited for another call: it takes no call index and runs live."""
        self.ledger.give_back(d)
        self.ledger.unregister(d)
        return self.live_bypass(wrapped, args, kwargs, d.step, awaited)

    async def served_when_awaited(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                                  d: Call, read: Read, t0: float) -> Any:
        """Serve ``read``, an entry recorded from an awaitable a plain ``def`` target handed back, once the caller
        awaits: the RNG state and declared effects are restored then, where the live awaitable would have left them
        (``c = target(); random.random(); await c`` draws as it did live). When the entry is not served after all
        (other inputs with ``on_mismatch: regenerate``, an unusable RNG state), the call runs live here and is
        recorded (:meth:`live_call`).

        Raises:
            FingerprintMismatch: the entry was made for other inputs or environment and the policy is ``error``.
            ReplayMissing: the role is replay-only and the entry could not be served.
        """
        if not d.work.enter():  # the process exits: no work of ours may still run in torch
            result = self.stand_aside(wrapped, args, kwargs, d)
        else:
            try:
                served = self.replayer.serve(d, read, args, kwargs, t0)
                if isinstance(served, Hit):
                    return served.value
                result = self.live_call(wrapped, args, kwargs, d, served)
            finally:
                d.work.leave()  # (awaiting is no work of ours)
        return await result if resolvable(result) else result


class Replaying(CallAction[CallEngine]):
    """The replaying actions' outcome: the recording of the serving step serves the call (hit), else it runs live and
    is recorded (miss). Subclasses say which recorded step serves (:meth:`~CallAction.serving_step`)."""

    def sync_call(self, engine: CallEngine, wrapped: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], d: Call) -> Any:
        """Replay ``d`` or call through and record it. An entry recorded from an awaitable the target handed back
        (``returned: "awaitable"``) is replayed as a coroutine, served when awaited
        (:meth:`CallEngine.served_when_awaited`).

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
            FingerprintMismatch: the entry was made for other inputs and ``on_mismatch`` is ``error``.
        """
        replayer = engine.replayer
        t0 = time.perf_counter()
        read = replayer.read_entry(d, args, kwargs)
        if not isinstance(read, Unserved) and reader_of(read[2].manifest).returned(
                read[2].manifest) == RETURNED_AWAITABLE:
            # the live call handed back an awaitable: so does its replay, served when the caller awaits it
            return engine.served_when_awaited(wrapped, args, kwargs, d, read, t0)
        served = replayer.serve(d, read, args, kwargs, t0)
        if isinstance(served, Hit):
            return served.value
        return engine.live_call(wrapped, args, kwargs, d, served)

    async def async_call(self, engine: CallEngine, wrapped: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any], d: Call, maybe_sync: bool) -> Any:
        """Replay ``d`` (the entry read in a worker thread) or call it through from this coroutine's frame and record
        it (staged off the event loop).

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
            FingerprintMismatch: the entry was made for other inputs and ``on_mismatch`` is ``error``.
        """
        ledger, replayer, work = engine.ledger, engine.replayer, d.work
        t0 = time.perf_counter()
        try:
            read = await off_loop(None, replayer.read_entry, d, args, kwargs, work=work)  # side by side
        except ExitBegan:
            read = EXIT_BEGAN
        except BaseException:  # cancelled while reading: its call index goes back, nothing ran
            ledger.give_back(d)
            ledger.unregister(d)
            raise
        if read is EXIT_BEGAN or not work.enter():
            return await engine.stand_aside(wrapped, args, kwargs, d, awaited=True)
        served = replayer.serve(d, read, args, kwargs, t0)
        if isinstance(served, Hit):
            return served.value
        return await engine.live_async(wrapped, args, kwargs, d, served, maybe_sync)


class Cache(Replaying, kind=Action.CACHE):
    """``cache``: only the entry recorded for the call's very step serves it (no scan of the store, no single
    flight)."""

    def own_step_only(self, validation: bool) -> bool:
        """Always: only the call's own step serves it."""
        return True


class Repeat(Replaying, kind=Action.REPEAT):
    """``repeat``: this step if recorded, else the nearest earlier recorded step, else the nearest later one."""


class RepeatCycle(Replaying, kind=Action.REPEAT_CYCLE):
    """``repeat_cycle``: this step if recorded, else the recorded steps in turn."""


class RepeatLast(Replaying, kind=Action.REPEAT_LAST):
    """``repeat_last``: this step if recorded, else the last recorded step."""


__all__ = ["Cache", "CallEngine", "Repeat", "RepeatCycle", "RepeatLast", "Replaying"]
