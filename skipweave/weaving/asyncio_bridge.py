"""The async side of a proxy: ``async def`` targets and sync-or-await helpers awaited by their caller.

An ``async`` target's proxy returns an awaitable on every path, replays included. So does an eligible call of a plain
``def`` that hands back an awaitable whose value skipweave may take (:func:`resolvable`: a coroutine, an asyncio
future): the proxy hands the caller a coroutine that awaits it and records its value, marked ``returned:
"awaitable"``; a replay of such an entry is again a coroutine, served when awaited (the RNG state and declared effects
restored then, where the live awaitable would have left them, as for an ``async`` target). A plain ``def`` whose
``__wrapped__`` chain holds an ``async def`` is a sync-or-await helper such as verl's ``auto_await``: it runs the
coroutine to completion when called plainly but hands it back when its caller's frame is a coroutine. For such
targets the proxy follows the same rule from the caller's frame (:func:`awaited_by_caller`) and calls the helper
from a coroutine frame of its own when the caller is one, so the helper keeps making the choice it would make
without skipweave.

Store work stays off the event loop: the serving step is chosen in one chooser thread, in the order the calls came
(:func:`chooser`); entries are read, and live results staged, in worker threads. See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from skipweave import lifecycle, report
from skipweave.store.format.manifest import RETURNED_AWAITABLE
from skipweave.weaving.calls import LIVE_ONLY, NOT_SERVED, Call, Unserved
from skipweave.weaving.notes import annotate

if TYPE_CHECKING:
    from skipweave.weaving.context import TargetContext
    from skipweave.weaving.record import Recorder, Snapshot

CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR
"""Code flags of a frame whose calls are awaited (a coroutine's, an async generator's)."""


def wraps_coroutine_function(func: Any) -> bool:
    """True when ``func`` is a plain function wrapping an ``async def`` (verl's ``auto_await`` shape: it runs the
    coroutine when called plainly and hands it back to an awaiting caller)."""
    if inspect.iscoroutinefunction(func):
        return False
    seen = 0
    inner = getattr(func, "__wrapped__", None)
    while inner is not None and seen < 16:
        if inspect.iscoroutinefunction(inner):
            return True
        inner, seen = getattr(inner, "__wrapped__", None), seen + 1
    return False


def resolvable(result: Any) -> bool:
    """Whether a plain ``def`` target's result is an awaitable whose value the proxy may await and record in its place:
    a coroutine object. The caller can only await a coroutine (or pass it to something that awaits it), so handing
    back another coroutine that awaits it and records the value changes nothing the caller can see.

    Any other awaitable is handed back untouched and not recorded
    (:meth:`~skipweave.weaving.record.Recorder.record_live`
    says so): an asyncio future or ``Task`` has methods and identity a host uses (``done()``, ``add_done_callback``,
    ``cancel()``, ``asyncio.wait({fut})``, which refuses coroutines), which a coroutine in its place would break, even
    in the recording run; a Ray ``ObjectRef`` is a handle to work running elsewhere that the host may pass on without
    ever awaiting it."""
    return type(result) is types.CoroutineType


def awaited_by_caller(depth: int = 2) -> bool:
    """The frame ``depth`` levels up is a coroutine's (its call will be awaited), as ``auto_await`` judges."""
    return bool(sys._getframe(depth).f_code.co_flags & CORO_FLAGS)


_choosers: list[concurrent.futures.ThreadPoolExecutor] = []  # the one chooser of this process, once started
_chooser_lock = threading.Lock()


def chooser() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that chooses the serving step of ``async`` calls (file stats, off every event loop), one
    call after another in the order they came: a single worker keeps the order the loop's own choice had."""
    if not _choosers:
        with _chooser_lock:
            if not _choosers:
                _choosers.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="skipweave-choose"))
    return _choosers[0]


os.register_at_fork(after_in_child=_choosers.clear)  # the parent's thread does not exist in a forked child


class AsyncBridge:
    """The awaitable helpers of one woven target: recording an awaited result off the event loop, and the bypasses of
    calls whose result is awaited (the paths that settle an awaited call are the call engine's,
    :class:`~skipweave.weaving.engine.CallEngine`).

    Args:
        ctx: the target's context.
        recorder: the target's recorder.
    """

    def __init__(self, ctx: TargetContext, recorder: Recorder) -> None:
        self.ctx = ctx
        self.recorder = recorder

    async def finish_awaitable(self, awaitable: Awaitable[Any], d: Call, t0: float,
                               outcome: Unserved = NOT_SERVED) -> Any:
        """Await the awaitable (:func:`resolvable`) a plain ``def`` target handed back from its real call, then record
        its result, marked as the value of an awaitable (``returned: "awaitable"``, replayed as one); ``outcome``: why
        no recording served it (see :meth:`~skipweave.weaving.record.Recorder.record_live`)."""
        try:
            result = await awaitable
        except BaseException:
            self.ctx.ledger.give_back(d)
            self.recorder.call_ended(d, failed=True)
            raise
        if not d.work.enter():
            outcome = LIVE_ONLY  # the process exits meanwhile: the result goes back unrecorded
        try:
            return await self.after_live_off_loop(result, d, time.perf_counter() - t0, returned=RETURNED_AWAITABLE,
                                                  outcome=outcome)
        finally:
            d.work.leave()

    async def after_live_off_loop(self, result: Any, d: Call, seconds: float, returned: str | None = None,
                                  outcome: Unserved = NOT_SERVED) -> Any:
        """Record an ``async`` target's result without blocking its event loop: the RNG state and the declared
        effects are taken now, on the loop (what the real call left, before another task moves them); encoding
        and the copy handed to the background writer (or, writing through, the whole write) run in a worker
        thread while the loop serves other tasks. The caller gets the result once it is staged, so nothing it
        does to it afterwards reaches the recording. ``returned``: the manifest's (see :meth:`finish_awaitable`);
        ``outcome``: why no recording served it (see :meth:`~skipweave.weaving.record.Recorder.record_live`)."""
        recorder = self.recorder
        if d.no_store or not outcome.record:  # nothing to stage (and at exit no worker thread to stage it in)
            return recorder.after_live(result, d, seconds, outcome=outcome)
        try:
            snapshot: Snapshot | None = recorder.snapshot(d)
        except Exception:  # noqa: BLE001 - taken again in the worker, where the record's failure is reported
            snapshot = None
        d.work.leave()  # (the worker thread is joined before the exit steps run)
        try:
            return await off_loop(None, recorder.after_live, result, d, seconds, snapshot, returned, outcome,
                                  work=d.work)
        except ExitBegan:
            return recorder.after_live(result, d, seconds, outcome=LIVE_ONLY)

    async def bridged_bypass(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                             step: int | None) -> Any:
        """A bypass of an awaited sync-or-await helper: called from this coroutine's frame, so the helper hands
        back its coroutine, which is awaited here."""
        result = wrapped(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        annotate(result, report.BYPASS, step, None, self.ctx.note)
        return result

    async def annotated_awaitable(self, awaitable: Awaitable[Any], step: int | None) -> Any:
        """The result of a bypassed plain ``def`` that handed back its coroutine, noted once awaited."""
        result = await awaitable
        annotate(result, report.BYPASS, step, None, self.ctx.note)
        return result


class ExitBegan(Exception):
    """Work that had to run in this thread could not take its hold: the process's exit began."""


EXIT_BEGAN: Any = object()
"""What a read that could not run stands for (see :func:`off_loop`)."""


async def off_loop(executor: concurrent.futures.Executor | None, fn: Callable[..., Any], *args: Any,
                   work: lifecycle.Work | None = None) -> Any:
    """``fn(*args)`` in a worker thread of ``executor`` (``None``: the loop's default), off the event loop; in
    this thread, holding ``work``, when the interpreter is shutting down, since the executors take no work then
    (an ``async`` target called from a daemon thread's loop or a host's ``atexit`` handler).

    Raises:
        ExitBegan: ``fn`` had to run here and ``work`` could not be held (the exit steps began).
    """
    loop = asyncio.get_running_loop()
    try:
        future = loop.run_in_executor(executor, fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
        if work is not None and not work.enter():
            raise ExitBegan from None
        try:
            return fn(*args)
        finally:
            if work is not None:
                work.leave()
    return await future


__all__ = ["AsyncBridge", "CORO_FLAGS", "awaited_by_caller", "chooser", "off_loop", "resolvable",
           "wraps_coroutine_function"]
