"""Skip proxies: the wrapt wrapper that decides, per call, to bypass, replay or call through and record.

One :class:`SkipProxy` serves one (role, target) pair. Its decision path::

    bypass predicate (validation) ──► run live, record nothing, advance no counter
    step from the step source ──► not in ``steps`` ──► run live
    call index within (step, shard) ──► action picks the serving step ──► replay (hit)
                                                                  └──► call through + record (miss)

Async targets (``async def``, or anything ``inspect.iscoroutinefunction`` reports as such) get a
proxy that returns an awaitable on every path, replays included. A plain ``def`` whose ``__wrapped__``
chain holds an ``async def`` is a sync-or-await helper such as verl's ``auto_await``: it runs the
coroutine to completion when called plainly but hands it back when its caller's frame is a
coroutine. For such targets (``bridge=True``) the proxy follows the same rule from the caller's frame
and calls the helper from a coroutine frame of its own when the caller is one, so the helper keeps
making the choice it would make without skipweave.

Every call first passes the target's :class:`~skipweave.policy.gate.Gate` (bypass, step, eligibility,
compiled at weave time for the role's sources). What wrapt installs is :meth:`SkipProxy.wrapper`: for a
plain ``def`` target, a front function that runs the gate and settles bypasses inline (one Python call
over wrapt's own pass-through) and hands eligible calls to the proxy's decision; for ``async`` and
bridged targets, and subclasses that replace ``__call__``, the proxy itself. Both paths give the same
decision, counters and annotation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import heapq
import inspect
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from typing import Any

from skipweave import lifecycle, report
from skipweave.config.errors import ConfigError
from skipweave.config.schema import Action, OnMismatch, RoleConfig, ShardKind, TargetSpec
from skipweave.policy.actions import choose_step
from skipweave.policy.expressions import Expression, ExpressionFailed
from skipweave.policy.gate import BYPASS, Gate, compile_gate
from skipweave.policy.matching import Match, PartView, match_call, view_of
from skipweave.policy.steps import StepError, StepSource
from skipweave.store import codec
from skipweave.store.fs import UnsafePath
from skipweave.store.identity import is_concurrent_other, started_unix, this_writer
from skipweave.store.manifest import EntryInvalid, seconds_of
from skipweave.store.step_store import EntryMeta, StepStore
from skipweave.store.write_behind import WRITER
from skipweave.weaving.effects import recorded_form, split_appended
from skipweave.weaving.fingerprint import fingerprint
from skipweave.weaving.rng import RngMarks, capture_rng_state, prepare_rng_state, rng_changes, rng_marks

logger = logging.getLogger(__name__)

_ACTIVE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("skipweave_active", default=frozenset())
"""Proxies whose real call is running in this context: a nested call of the same target (recursion) runs live."""

_CORO_FLAGS = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


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


def awaited_by_caller(depth: int = 2) -> bool:
    """The frame ``depth`` levels up is a coroutine's (its call will be awaited), as ``auto_await`` judges."""
    return bool(sys._getframe(depth).f_code.co_flags & _CORO_FLAGS)


class FingerprintMismatch(RuntimeError):
    """A replayed entry was recorded for other inputs and ``fingerprint.on_mismatch`` is ``error``."""


class _Decision:
    """What the proxy decided for one non-bypassed call.

    ``call`` is the call's position among this process's calls of its step; ``slot`` the call index of the
    entry it is served or recorded under (see :mod:`skipweave.policy.matching`), ``None`` until chosen.
    """

    __slots__ = ("step", "call", "shard", "served", "fp", "replace", "no_store", "running", "slot", "wait",
                 "done", "thread", "concurrent", "instance", "waited", "validation", "unserved", "rng_before",
                 "lists_before", "opened", "work")

    def __init__(self, step: int, call: int, shard: str, served: int | None) -> None:
        self.step, self.call, self.shard, self.served = step, call, shard, served
        self.fp: str | None = None
        self.replace = False
        self.no_store = False
        self.running = 0  # the store counts this call as running in its part: call_started's ticket, else 0
        self.slot: int | None = None
        self.wait: _Decision | None = None  # single flight: the running call whose recording will serve this one
        self.done: concurrent.futures.Future[None] | None = None  # set when this real call and its record end
        self.thread = 0
        self.concurrent = False  # another thread ran a real call of the same step meanwhile
        self.instance: Any = None  # the bound instance (``self`` of expressions: echo, effects)
        self.waited = False  # single flight waited for another call already (never twice)
        self.validation = False  # a validation call (recorded apart: shard val_<shard>, never served to training)
        self.unserved = ""  # why the entry found for this call was not served (for a replay-only run's message)
        self.rng_before: RngMarks | None = None  # the generators' marks right before the real call (restore_rng)
        # declared effects that were lists right before the real call: expression -> (the list, its items then)
        self.lists_before: dict[str, tuple[list[Any], list[Any]]] | None = None
        self.opened = 0  # its number among the target's real calls with effects, until its effects are taken; else 0
        self.work = lifecycle.Work()  # its hold on skipweave's own work, which the process's exit waits for


class ReplayMissing(RuntimeError):
    """A replay-only role (``skip.<role>.replay_only``) met a call no recording serves: the run stops here
    instead of generating. The message names the role, target, step, call index and dump dir."""


VIEW_TTL_S = 1.0
"""Seconds a part's judged entries (:class:`~skipweave.policy.matching.PartView`) are reused while it is unchanged."""

VALIDATION_SHARD = "val_"
"""Prefix of the shard label validation calls are recorded under (``val_r0``): apart from training calls."""


def annotate(result: Any, status: str, step: int | None, served: int | None) -> None:
    """Put ``{"status", "step", "served_step"}`` under ``meta_info["skipweave"]`` of a DataProto-like result.

    Hosts read it without importing skipweave (e.g. ``out.meta_info.get("skipweave", {})``); results
    without a ``meta_info`` dict are left untouched.
    """
    meta = getattr(result, "meta_info", None)
    if isinstance(meta, dict):
        meta["skipweave"] = {"status": status, "step": step, "served_step": served}


RANK_VARIABLES = ("RANK", "LOCAL_RANK")
"""Environment variables that give a process its writer identity, first set wins: ``RANK`` (torchrun, verl's
worker groups) and ``LOCAL_RANK`` (single-node launchers that set only it)."""


def rank_of_process() -> tuple[str, str] | None:
    """The ``(variable, value)`` that names this process as a writer, or ``None`` when no rank is set."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    return None


def shard_label(kind: ShardKind) -> str:
    """Return this process's shard label: ``r<RANK>`` for ``auto``/``rank``, ``r0`` for ``none``.

    The rank is ``RANK``, else ``LOCAL_RANK``, else 0 (see :data:`RANK_VARIABLES`). (``fingerprint`` shards are
    labelled from the call's inputs by the proxy itself.)

    Raises:
        ConfigError: the rank is set to something other than ASCII digits (the label becomes a file name in
            the dump dir; ``"../x"`` or ``"²"`` must never reach it).
    """
    if kind is ShardKind.NONE:
        return "r0"
    found = rank_of_process()
    if found is None:
        return "r0"
    name, rank = found
    if not (rank.isascii() and rank.isdigit() and len(rank) <= 9):
        raise ConfigError(name, rank, "a whole number of at most 9 digits (the writer's rank, as torchrun and "
                                      "verl set it), or unset")
    return f"r{int(rank)}"


class SkipProxy:
    """The wrapt wrapper of one target of one role.

    Args:
        role: the validated role config.
        target: the target spec.
        store: the role's :class:`StepStore`.
        bypass: predicate ``(args, kwargs) -> bool`` (see :mod:`skipweave.policy.bypass`).
        is_async: the target is a coroutine function.
        bridge: the target is a sync-or-await helper around a coroutine function (see above).
        positions: parameter name -> position in the call's ``args`` (``self``/``cls`` removed).

    A proxy set inactive (``active = False``) passes every call straight through; unweave does that
    when another tool's non-wrapt wrapper sits above ours and the patch cannot be spliced out.

    Subclasses (host integrations) may replace ``bypass`` or ``step_source`` (in ``__init__``; the gate is
    built around the replacement at the first call or at weave), ``on_replay`` or ``__call__`` (a proxy that
    does is installed itself, with no front). ``compiled_gate = False`` builds the interpreted gate.
    """

    compiled_gate: bool = True
    """Build the gate specialised to the role's sources (:mod:`skipweave.policy.gate`); ``False``: the
    interpreted predicate and :meth:`StepSource.step_for` (the same decisions, slower)."""

    def __init__(
        self,
        role: RoleConfig,
        target: TargetSpec,
        store: StepStore,
        bypass: Callable[[tuple[Any, ...], Mapping[str, Any]], bool],
        *,
        is_async: bool,
        bridge: bool = False,
        positions: Mapping[str, int] | None = None,
    ) -> None:
        self.role = role
        self.target = target
        self.store = store
        self.bypass = bypass
        self.is_async = is_async
        self.bridge = bridge
        self._on = [True]  # shared with the front (a list: the closure sees every change)
        self._running = [0]  # real calls in progress, in any thread (shared with the front)
        self.steps = role.steps
        self.step_source = StepSource(role.step, positions, name=f"role {role.role} target {target.name}",
                                      key=f"skip.{role.role}.step")
        self.positions = positions
        self._defaults: Mapping[str, Any] = {}
        key = f"skip.{role.role}"
        params = tuple(positions or ())
        self._bypass_expr = (Expression(f"{key}.bypass.expr", role.bypass.expr, params=params)
                             if role.bypass.expr else None)
        self._effects = tuple(Expression(f"{key}.effects[{i}]", text, assignable=True, params=params)
                              for i, text in enumerate(role.effects))
        self._echo = tuple((Expression(f"{key}.echo[{dest!r}]", dest, assignable=True, params=params),
                            Expression(f"{key}.echo[{dest!r}]", source, params=params))
                           for dest, source in role.echo)
        self._step_warned = False
        self._counts = report.for_target(role.role, target.name)
        self._own_bypass = bypass  # a subclass that replaces self.bypass gets a gate around its predicate
        self._validation = role.record_validation or role.replay_only  # validation calls go to the store too
        self._validation_calls = 0
        self._gate: Gate | None = None
        self._calls: dict[tuple[int, str], int] = {}
        self._free: dict[tuple[int, str], list[int]] = {}
        # (step, shard) -> slots this process served or recorded at that step: never served to it again
        self._claimed: dict[tuple[int, str], set[int]] = {}
        # (step, shard) -> this process's real calls of that step now running (single flight, thread overlap)
        self._inflight: dict[tuple[int, str], list[_Decision]] = {}
        self._shared_warned = False
        self._tail_warned: set[str] = set()  # effects a replay appended to a list of another length than run 1's
        self._opened = 0  # real calls with effects started so far (see _open_call)
        self._open = 0  # ... whose effects are not taken yet
        self._views: dict[tuple[int, str], tuple[tuple[Any, ...], PartView, float]] = {}
        self._lock = threading.Lock()

    @property
    def defaults(self) -> Mapping[str, Any]:
        """Parameter name -> default of the target's signature (set by the weaver): what an expression naming
        a parameter the call did not pass reads."""
        return self._defaults

    @defaults.setter
    def defaults(self, value: Mapping[str, Any]) -> None:
        self._defaults = dict(value)
        self.step_source.defaults = self._defaults
        self._gate = None

    @property
    def active(self) -> bool:
        """False once unweave has turned this proxy into a pass-through."""
        return self._on[0]

    @active.setter
    def active(self, value: bool) -> None:
        self._on[0] = bool(value)

    @property
    def gate(self) -> Gate:
        """The target's compiled first decision (built once from ``bypass``, ``step_source`` and ``steps``)."""
        gate = self._gate
        if gate is None:
            gate = self._gate = compile_gate(
                self.role.bypass, self.bypass, own=self.bypass is self._own_bypass, expr=self._bypass_expr,
                expr_interpreted=self._bypassed_by_expr if self._bypass_expr is not None else None,
                source=self.step_source, steps=self.steps, positions=self.positions, defaults=self._defaults,
                compiled=self.compiled_gate)
        return gate

    def wrapper(self) -> Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]:
        """Return the wrapt wrapper to install: the front (see the module docstring) or the proxy itself.

        :func:`proxy_of` maps either back to the proxy.
        """
        if self.is_async or self.bridge or type(self).__call__ is not SkipProxy.__call__:
            return self
        return _front(self, self.gate)

    # ------------------------------------------------------------------ wrapt entry point
    def __call__(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not self._on[0] or id(self) in _ACTIVE.get():
            return wrapped(*args, **kwargs)
        # A sync-or-await helper awaited by its caller must be called from a coroutine frame, bypasses too.
        awaited = self.bridge and bool(sys._getframe(1).f_code.co_flags & _CORO_FLAGS)
        gate = self.gate
        try:
            step = gate.first(instance, args, kwargs)
        except Exception as exc:  # never fail the training call, never record under a wrong step
            self._step_failed(exc)
            return self._live_bypass(wrapped, args, kwargs, None, awaited)
        if step is BYPASS:
            if self._validation:
                return self.validation_call(wrapped, instance, args, kwargs, awaited)
            return self._live_bypass(wrapped, args, kwargs, None, awaited)
        if gate.eligible is None or step in gate.eligible:
            return self.eligible_call(wrapped, instance, args, kwargs, step, awaited)
        return self._live_bypass(wrapped, args, kwargs, step, awaited)

    def eligible_call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any], step: int, awaited: bool = False, validation: bool = False) -> Any:
        """Settle a call its gate found eligible at ``step``: replay it (hit) or call through and record (miss).

        ``validation``: a validation call, recorded under its own shard; served only in a replay-only run.
        Returns the result (an awaitable for ``async`` targets and awaited bridges).

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
        """
        if self.is_async or awaited:
            # Decided when the coroutine starts, not now: one never awaited (cancelled before it ran, dropped)
            # then takes no call index and no single-flight slot that later calls would wait on for good.
            return self._async_path(wrapped, args, kwargs, step, instance, maybe_sync=not self.is_async,
                                    validation=validation)
        work = lifecycle.Work()
        if not work.enter():  # the process exits: no work of ours may still run in torch
            return self._live_bypass(wrapped, args, kwargs, step)
        try:
            decision = self._decide(step, args, kwargs, validation)
            decision.instance, decision.work = instance, work
            return self._sync_path(wrapped, args, kwargs, decision)
        finally:
            work.leave()

    def validation_call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any], awaited: bool = False) -> Any:
        """A call the bypass let through (validation), when the role records or replays them
        (``record_validation``, ``replay_only``): keyed by its step when the step source can tell it without
        counting, else by the number of validation calls so far (1, 2, ...); live and recorded in a recording
        run (once per step and call), served in a replay-only run."""
        step = self.step_source.peek(instance, args, kwargs)
        if step is None:
            with self._lock:
                self._validation_calls += 1
                step = self._validation_calls
        elif self.gate.eligible is not None and step not in self.gate.eligible:
            return self._live_bypass(wrapped, args, kwargs, step, awaited)
        return self.eligible_call(wrapped, instance, args, kwargs, step, awaited, validation=True)

    def _bypassed_by_expr(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        assert self._bypass_expr is not None
        try:
            return bool(self._bypass_expr.evaluate(instance, args, kwargs, self.positions, defaults=self.defaults))
        except ExpressionFailed as exc:
            self._bypass_expr.warn_once(exc, "such calls run live and are not recorded")
            return True
        except Exception as exc:  # noqa: BLE001 - its truth value raised (e.g. a tensor of several values)
            self._bypass_expr.warn_once(ExpressionFailed(
                f"{self._bypass_expr.key} {self._bypass_expr.text!r} gave a value with no truth value "
                f"({type(exc).__name__}: {exc})"), "such calls run live and are not recorded")
            return True

    def _step_failed(self, exc: Exception) -> None:
        """The gate found no usable step (:class:`StepError`), or reading the call raised (a property of the
        host's, a bypass callable): the call runs live, unrecorded, with one WARNING.

        Raises:
            ReplayMissing: the role is replay-only (such a call could only run live).
        """
        if not isinstance(exc, StepError):
            exc = StepError(f"reading the step or the bypass of the call raised {type(exc).__name__}: {exc} "
                            f"(skip.{self.role.role}.step, skip.{self.role.role}.bypass)")
        if self.role.replay_only:
            raise ReplayMissing(f"skipweave: replay-only role {self.role.role} target {self.target.name} "
                                f"({self.target.path}): {exc}; a replay-only run cannot serve a call whose step "
                                "it cannot tell") from None
        if self._step_warned:
            logger.debug("skipweave: role %s target %s: %s", self.role.role, self.target.name, exc)
            return
        self._step_warned = True
        logger.warning("skipweave: role %s target %s: %s; such calls run live and are not recorded",
                       self.role.role, self.target.name, exc)

    # ------------------------------------------------------------------ paths
    def _live_bypass(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     step: int | None, awaited: bool = False) -> Any:
        report.event(report.BYPASS, role=self.role.role, target=self.target.name, step=step)
        if awaited:
            return self._bridged_bypass(wrapped, args, kwargs, step)
        result = wrapped(*args, **kwargs)
        if type(result) is types.CoroutineType:  # a plain def that handed back its coroutine
            return self._annotated_awaitable(result, step)
        annotate(result, report.BYPASS, step, None)
        return result

    async def _bridged_bypass(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                              step: int | None) -> Any:
        result = wrapped(*args, **kwargs)  # called from this coroutine's frame: the helper hands back its coroutine
        if inspect.isawaitable(result):
            result = await result
        annotate(result, report.BYPASS, step, None)
        return result

    async def _annotated_awaitable(self, awaitable: Awaitable[Any], step: int | None) -> Any:
        result = await awaitable
        annotate(result, report.BYPASS, step, None)
        return result

    def _sync_path(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   d: _Decision) -> Any:
        if d.wait is not None:  # single flight: wait for the running call that will serve this one
            other, d.wait = d.wait, None
            if other.done is not None and other.thread != threading.get_ident() and not report.loop_running():
                # (in a thread that runs that call or an event loop, waiting here could never end: run live)
                d.work.leave()  # waiting is no work of ours: exit need not wait for the other call
                try:
                    other.done.result()
                finally:
                    exiting = not d.work.enter()
                if exiting:
                    return self._stand_aside(wrapped, args, kwargs, d)
                d.waited = True  # waits once: if that call recorded nothing, this one runs live, not in a queue
                self._choose(d)
        found, value = self._try_replay(d, args, kwargs)
        if found:
            return value
        if self.role.replay_only:
            self._missing(d)
        self._fingerprint(d, args, kwargs)  # before the call: the host may mutate its inputs
        t0 = time.perf_counter()
        with self._real_call(d):
            result = wrapped(*args, **kwargs)
        if type(result) is types.CoroutineType:  # a plain def that hands back its coroutine
            self._release_waiters(d)  # it may never be awaited: no later call may wait for it
            return self._finish_awaitable(result, d, t0)
        return self._after_live(result, d, time.perf_counter() - t0)

    async def _finish_awaitable(self, awaitable: Awaitable[Any], d: _Decision, t0: float) -> Any:
        try:
            result = await awaitable
        except BaseException:
            self._give_back(d)
            self._call_ended(d, failed=True)
            raise
        if not d.work.enter():
            d.no_store = True
        try:
            return await self._after_live_off_loop(result, d, time.perf_counter() - t0)
        finally:
            d.work.leave()

    def _stand_aside(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     d: _Decision, awaited: bool = False) -> Any:
        """The process began to exit while ``d`` waited for another call: it takes no call index and runs live."""
        self._give_back(d)
        self._unregister(d)
        return self._live_bypass(wrapped, args, kwargs, d.step, awaited)

    async def _async_path(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                          step: int, instance: Any, maybe_sync: bool = False, validation: bool = False) -> Any:
        work = lifecycle.Work()
        if not work.enter():  # the process exits: no work of ours may still run in torch
            return await self._live_bypass(wrapped, args, kwargs, step, awaited=True)
        try:
            return await self._async_call(wrapped, args, kwargs, step, instance, maybe_sync, validation, work)
        finally:
            work.leave()

    async def _async_call(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                          step: int, instance: Any, maybe_sync: bool, validation: bool, work: lifecycle.Work) -> Any:
        d = self._decide(step, args, kwargs, validation, choose=False)
        d.instance, d.work = instance, work
        t0 = time.perf_counter()
        try:  # the serving step's choice (stats, the part's files) off the loop, in the order the calls came
            # (no hold while awaiting: a task never resumed must not keep the exit waiting; the worker threads are
            # joined before the exit steps run)
            work.leave()
            await _off_loop(_chooser(), self._choose_first, d)
            if d.wait is not None:  # single flight (see _sync_path); awaiting yields: any thread's call may end
                other, d.wait = d.wait, None
                if other.done is not None:
                    await asyncio.wrap_future(other.done)
                    d.waited = True
                    await _off_loop(_chooser(), self._choose, d)
            t0 = time.perf_counter()
            try:
                read = await _off_loop(None, self._read_entry, d, args, kwargs, work=work)  # reads side by side
            except _ExitBegan:
                read = _EXIT_BEGAN
        except BaseException:  # cancelled while choosing or waiting: its call index goes back, nothing ran
            self._give_back(d)
            self._unregister(d)
            raise
        if read is _EXIT_BEGAN or not work.enter():
            return await self._stand_aside(wrapped, args, kwargs, d, awaited=True)
        found, value = self._serve(d, read, args, kwargs, t0)
        if found:
            return value
        if self.role.replay_only:
            self._missing(d)
        self._fingerprint(d, args, kwargs)
        t0 = time.perf_counter()
        with self._real_call(d):
            result = wrapped(*args, **kwargs)  # called from this coroutine's frame
            if not maybe_sync or inspect.isawaitable(result):
                result = await result
        return await self._after_live_off_loop(result, d, time.perf_counter() - t0)

    def _choose_first(self, d: _Decision) -> None:
        """An ``async`` call's first store work, in the chooser thread (:func:`_chooser`): its first-call mark and
        the serving step's choice, made in the order the calls came (single flight: the first call of a batch
        of steps generates, the later ones wait for it)."""
        if not self._counts.eligible:
            report.first_call(self.role.role, self.target.name, eligible=True)
        self._choose(d)

    # ------------------------------------------------------------------ hooks for host integrations
    def on_replay(self, result: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Return what a hit hands the host; ``result`` is the freshly decoded recording.

        The echo hook: a subclass (named by ``targets.<name>.proxy``) copies per-run values from the live
        inputs into the replayed result here, e.g. verl's random ``uid`` per sample, which the host
        later checks against its own copy. The generic proxy returns ``result`` unchanged.
        """
        return result

    # ------------------------------------------------------------------ decision and store
    def _decide(self, step: int, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                validation: bool = False, choose: bool = True) -> _Decision:
        """Give a call its step's next call index and shard; with ``choose``, also note its first eligible call
        and choose the serving step (both touch the dump dir: an ``async`` call does them in a thread)."""
        fp = None
        if self.role.shard is ShardKind.FINGERPRINT:
            fp = fingerprint(args, kwargs, ignore=self.role.fingerprint.ignore)
            shard = "f" + fp[:16]
        else:
            try:
                shard = shard_label(self.role.shard)
            except ConfigError as exc:  # RANK changed after the weave checked it: never fail the training call
                logger.warning("skipweave: role %s target %s step %d: %s; running live without recording",
                               self.role.role, self.target.name, step, exc)
                decision = _Decision(step, 0, "r0", None)
                decision.no_store = True
                return decision
        if validation:
            shard = VALIDATION_SHARD + shard
        with self._lock:
            free = self._free.get((step, shard))
            if free:
                call = heapq.heappop(free)
            else:
                call = self._calls.get((step, shard), 0)
                self._calls[(step, shard)] = call + 1
        decision = _Decision(step, call, shard, None)
        decision.fp, decision.validation = fp, validation
        if choose:
            if not self._counts.eligible:  # now, not at its hit or miss: a call that raises was still called
                report.first_call(self.role.role, self.target.name, eligible=True)
            self._choose(decision)
        return decision

    def _choose(self, d: _Decision) -> None:
        """Choose the step that serves ``d`` (``d.served``), or wait for one being recorded (``d.wait``)."""
        step, shard = d.step, d.shard
        action = Action.CACHE if d.validation else self.role.action  # a validation call: its own step only
        try:
            self.store.prepare_part(step, self.target.name, shard)
            if action is Action.CACHE:  # only this very step can serve: no scan of the store
                recorded = [step] if self.store.is_complete(step, self.target.name, shard) else []
            else:
                recorded = self.store.recorded_steps(self.target.name, shard)
            served = choose_step(action, step, recorded, self.role.record_steps)
        except Exception as exc:  # an unreadable dump dir never fails the training call
            logger.warning("skipweave: role %s target %s step %d: the store under %s is unusable (%s: %s); "
                           "running live without recording", self.role.role, self.target.name, step,
                           self.store.dump_dir, type(exc).__name__, exc)
            d.no_store = True
            return
        d.served = served
        if d.validation and not self.role.replay_only:  # recorded for a replay-only run, never served here
            mine = (step, shard) in self._claimed or (step, shard) in self._inflight  # this run is recording it
            if served is not None and not mine:
                d.served, d.no_store = None, True  # recorded by an earlier run: live, not again
                return
            d.served = None
        elif served is not None:
            return
        with self._lock:  # one lock for the look and the registration: two calls never both decide to generate
            if action is not Action.CACHE and self.role.single_flight and not d.waited:
                d.wait = self._recording_that_serves(d, recorded)
            if d.wait is None:
                self._register(d)

    def _recording_that_serves(self, d: _Decision, recorded: list[int]) -> _Decision | None:
        """Single flight for the ``repeat*`` actions (caller holds the lock): a running call of this process whose
        recording the action would serve ``d`` from once committed (e.g. step 1 still generating when steps 2-5
        arrive), else None."""
        pending = {
            s: x for (s, shard), running in self._inflight.items() if shard == d.shard and s != d.step
            for x in running if x.call == d.call and not x.no_store
        }
        if not pending:
            return None
        choice = choose_step(self.role.action, d.step, sorted(set(recorded) | set(pending)), self.role.record_steps)
        return pending.get(choice) if choice is not None and choice not in recorded else None

    def _register(self, d: _Decision) -> None:
        """Count ``d`` among the real calls of its step now running (caller holds the lock); another call already
        running there (another thread's, or another asyncio task's) makes both *concurrent*: their part is then
        matched by inputs only, since the order they started in need not repeat."""
        if d.done is not None or d.no_store:
            return
        d.thread = threading.get_ident()
        d.done = concurrent.futures.Future()
        running = self._inflight.setdefault((d.step, d.shard), [])
        for other in running:  # threads, or asyncio tasks of one thread: their order need not repeat
            other.concurrent = d.concurrent = True
        running.append(d)

    @contextlib.contextmanager
    def _real_call(self, d: _Decision) -> Iterator[None]:
        """Around the target's real call: nested calls of it run live (recursion guard, and the
        front leaves every call to ``__call__`` while one runs); if it raises, its call index is given back."""
        token = _ACTIVE.set(_ACTIVE.get() | {id(self)})
        with self._lock:
            self._running[0] += 1
            self._register(d)  # a call that became a miss only when its entry could not be served
            alone = self._open_call(d) if self._effects else False
        if not d.no_store:
            d.running = self.store.call_started(d.step, self.target.name, d.shard)
            if alone:
                d.lists_before = self._lists_before(d)
            if self.role.restore_rng:
                try:
                    d.rng_before = rng_marks()  # last: what the call changes is recorded (see _snapshot)
                except Exception as exc:  # (a broken CUDA setup): never fail the call; the whole state is tried after
                    logger.debug("skipweave: RNG marks before %s failed (%s: %s)", self.target.name,
                                 type(exc).__name__, exc)
        d.work.leave()  # the host's own call: exit does not wait for it
        try:
            yield
        except BaseException:
            self._give_back(d)
            self._call_ended(d, failed=True)
            raise
        finally:
            if not d.work.enter():
                d.no_store = True  # the process exits meanwhile: the result goes back unrecorded
            with self._lock:
                self._running[0] -= 1
            _ACTIVE.reset(token)

    def _call_ended(self, d: _Decision, failed: bool = False) -> None:
        if d.opened:  # failed, or ended without its effects taken
            self._close_call(d)
        if d.running:
            ticket, d.running = d.running, 0
            try:
                self.store.call_ended(d.step, self.target.name, d.shard, failed=failed, ticket=ticket)
            finally:
                self._unregister(d)

    def _release_waiters(self, d: _Decision) -> None:
        """Single-flight waiters of ``d`` stop waiting (they choose again) while ``d`` itself goes on."""
        if d.done is not None and not d.done.done():
            d.done.set_result(None)

    def _unregister(self, d: _Decision) -> None:
        """``d`` no longer runs: drop it from the running calls and wake the single-flight waiters (they choose
        again, now that its record is done or it failed)."""
        with self._lock:
            running = self._inflight.get((d.step, d.shard), [])
            if d in running:
                running.remove(d)
            if not running:
                self._inflight.pop((d.step, d.shard), None)
        self._release_waiters(d)

    def _give_back(self, d: _Decision) -> None:
        """The real call raised: its call index is reused by the next call of the step (nothing was recorded)."""
        with self._lock:
            heapq.heappush(self._free.setdefault((d.step, d.shard), []), d.call)

    def _missing(self, d: _Decision) -> None:
        """Stop a replay-only run at a call no recording serves (its call index goes back: nothing ran)."""
        self._give_back(d)
        self._unregister(d)
        what = "validation call" if d.validation else "call"
        if d.unserved:
            raise ReplayMissing(
                f"skipweave: replay-only role {self.role.role} target {self.target.name} ({self.target.path}): the "
                f"recording of step {d.step} {what} {d.call} (shard {d.shard}) in dump dir {self.store.dump_dir} "
                f"cannot be served: {d.unserved}")
        raise ReplayMissing(
            f"skipweave: replay-only role {self.role.role} target {self.target.name} ({self.target.path}): no "
            f"recording serves step {d.step} {what} {d.call} (shard {d.shard}) in dump dir {self.store.dump_dir} "
            f"(namespace {self.store.namespace}); record it first with a recording run over the same steps "
            f"(e.g. +skip=rollout_cache{' with record_validation' if d.validation else ''}), or narrow "
            f"skip.{self.role.role}.steps")

    def _fingerprint(self, d: _Decision, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        if d.fp is None:
            try:
                d.fp = fingerprint(args, kwargs, ignore=self.role.fingerprint.ignore)
            except Exception as exc:  # e.g. inputs nested too deep: never fail the training call
                logger.warning("skipweave: role %s target %s: inputs cannot be fingerprinted (%s: %s); "
                               "the entry is recorded without a fingerprint", self.role.role, self.target.name,
                               type(exc).__name__, exc)
                d.fp = ""
        return d.fp

    def _try_replay(self, d: _Decision, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[bool, Any]:
        """Serve ``d`` from the store if an entry serves it: ``(True, result)``, else ``(False, None)``."""
        t0 = time.perf_counter()
        return self._serve(d, self._read_entry(d, args, kwargs), args, kwargs, t0)

    def _read_entry(self, d: _Decision, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> tuple[Any, Any, Any] | None:
        """The file I/O of a replay (match the call to an entry, read and decode it): ``(match, key, loaded)``,
        or ``None`` when nothing is served (``d`` says why). Touches no host object: an ``async`` target runs it
        in a worker thread, off the event loop."""
        if d.served is None or d.no_store:
            return None
        matched = self._match(d, args, kwargs)
        match, stamp = matched if matched is not None else (None, None)
        if match is None or match.call is None:
            d.served = None
            return None
        d.slot = match.call
        key = self.store.key(d.served, self.target.name, d.shard, match.call)
        try:
            return match, key, self.store.load(key, stamp=stamp)
        except FileNotFoundError:  # removed since the part was read: a plain miss, recorded at the call's position
            d.served = d.slot = None
        except UnsafePath as exc:  # a symlink or a file where a folder should be: never touched
            logger.warning("skipweave: entry %s is not served: %s; running live without recording", key, exc)
            d.served, d.no_store = None, True
        except (EntryInvalid, codec.CodecError) as exc:
            self._unusable(d, key, str(exc))
        except OSError as exc:
            logger.warning("skipweave: entry %s is unreadable (%s); running live without recording", key, exc)
            d.served, d.no_store = None, True
        except Exception as exc:  # whatever a crafted or damaged entry provokes: a miss, never the host's error
            self._unusable(d, key, f"{type(exc).__name__}: {exc}")
        return None

    def _serve(self, d: _Decision, read: tuple[Any, Any, Any] | None, args: tuple[Any, ...],
               kwargs: Mapping[str, Any], t0: float) -> tuple[bool, Any]:
        """The rest of a replay, in the host's thread: fingerprint check, RNG state, echo and effects, counters."""
        if read is None:
            return False, None
        match, key, loaded = read
        recorded_fp = loaded.manifest.get("input_fingerprint")  # "" for entries imported without their inputs
        if (not match.exact and d.served == d.step and recorded_fp
                and recorded_fp != self._fingerprint(d, args, kwargs)):
            policy = self.role.fingerprint.on_mismatch
            where = f"role {self.role.role} target {self.target.name} step {d.step} call {d.call}"
            if policy is OnMismatch.ERROR:
                raise FingerprintMismatch(
                    f"{where}: the recorded entry was made for other inputs "
                    f"(recorded {loaded.manifest.get('input_fingerprint')}, live {d.fp}); set "
                    f"skip.{self.role.role}.fingerprint.on_mismatch=warn or regenerate, or add the differing "
                    f"fields to skip.{self.role.role}.fingerprint.ignore"
                )
            if policy is OnMismatch.REGENERATE:
                logger.warning("skipweave: %s: inputs differ from the recording; regenerating", where)
                d.served = None
                d.replace = True
                return False, None
            logger.warning(
                "skipweave: %s: inputs differ from the recording (fingerprint %s vs %s); serving the "
                "recording anyway (fingerprint.on_mismatch=warn)",
                where, loaded.manifest.get("input_fingerprint"), d.fp,
            )
        try:  # the recorded RNG state is checked now and restored last: a replay that fails changes nothing
            restore_rng = (prepare_rng_state(loaded.rng_state) if self.role.restore_rng and loaded.rng_state
                           else None)
            result = self.on_replay(loaded.result, args, kwargs)
        except Exception as exc:  # a malformed RNG state, or a result the echo hook cannot use
            self._unusable(d, key, f"it cannot be replayed here ({type(exc).__name__}: {exc})")
            return False, None
        if self._echo or self._effects:
            try:
                self._restore(d, loaded, result, args, kwargs)
            except ExpressionFailed as exc:  # the config does not fit this call: run it live, keep the entry
                logger.warning("skipweave: entry %s is not served: %s; running live without recording", key, exc)
                d.served, d.no_store, d.unserved = None, True, str(exc)
                return False, None
        if restore_rng is not None:
            restore_rng()
        annotate(result, report.HIT, d.step, d.served)
        report.event(
            report.HIT, role=self.role.role, target=self.target.name, step=d.step, served=d.served,
            nbytes=loaded.bytes, seconds=time.perf_counter() - t0,
            saved=seconds_of(loaded.manifest), call=match.call,
        )
        return True, result

    def _match(self, d: _Decision, args: tuple[Any, ...],
               kwargs: Mapping[str, Any]) -> tuple[Match, tuple[int, int] | None] | None:
        """The entry of the serving step's part that serves ``d`` (see :mod:`skipweave.policy.matching`) and the
        part folder's stamp the part was read with (for :meth:`StepStore.load`); ``None`` when the part cannot be
        read (the call runs live without recording)."""
        assert d.served is not None
        same = d.served == d.step
        if same and self.store.fresh(d.step, self.target.name, d.shard):
            return Match(None, False, False, 0), None  # recorded afresh by this run: nothing in it serves this call
        # the live set, not a copy (one per hit, of up to a step's calls): only asked for membership below, which
        # is safe while another thread adds to it (a slot claimed meanwhile is then seen, as it should be)
        claimed: Collection[int] = self._claimed.get((d.step, d.shard), ()) if same else ()
        try:
            # an entry this process still writes in the background is read once committed (not this proxy's own
            # recordings of the step: never served to it)
            self.store.wait_pending(d.served, self.target.name, d.shard, skip=claimed)
            # one look at the folder, after the wait (what was pending is committed now), for the part and the load
            stamp = self.store.stamp(d.served, self.target.name)
            entries = self.store.part_calls(d.served, self.target.name, d.shard, stamp=stamp)
        except Exception as exc:  # a symlinked or unreadable folder: never fail the training call
            logger.warning("skipweave: role %s target %s step %d: the recordings of step %d are unreadable "
                           "(%s: %s); running live without recording", self.role.role, self.target.name,
                           d.step, d.served, type(exc).__name__, exc)
            d.no_store = True
            return None
        match = match_call(self._view(d.served, d.shard, entries), d.call, lambda: self._fingerprint(d, args, kwargs),
                           claimed, same_step=same, me=this_writer(), started=started_unix())
        if match.call is None and (match.shared or match.others):
            if not same and match.shared:
                what = (f"holds recordings of several writers, so step {d.served} cannot serve step {d.step} "
                        f"(action {self.role.action.value} serves another step by call order only)")
            elif match.shared:
                what = "holds recordings of several writers"
            else:
                what = "is being recorded by another writer of this run"
            self._warn_shared(d, what)
        elif match.call is not None and same:
            self._claim(d.step, d.shard, match.call)
        return match, stamp

    def _view(self, step: int, shard: str, entries: tuple[Any, ...]) -> PartView:
        """The part's :class:`PartView`, judged again when its entries changed (``part_calls`` hands back the same
        tuple while the folder is unchanged) or after :data:`VIEW_TTL_S` (a concurrent writer may have ended)."""
        now = time.monotonic()
        with self._lock:
            seen = self._views.get((step, shard))
        if seen is not None and seen[0] is entries and now - seen[2] < VIEW_TTL_S:
            return seen[1]
        view = view_of(entries, me=this_writer(), started=started_unix())
        with self._lock:
            if len(self._views) > 4096:  # bounded: a long run does not keep every step's view
                self._views.clear()
            self._views[(step, shard)] = (entries, view, now)
        return view

    def _taken_by_concurrent(self, key: Any) -> bool:
        """The slot ``key`` names holds an entry a concurrent writer made (so the record moved to another)."""
        me, started = this_writer(), started_unix()
        return any(r.call == key.call and is_concurrent_other(r, me, started)
                   for r in self.store.part_calls(key.step, key.target, key.shard))

    def _claim(self, step: int, shard: str, slot: int) -> None:
        with self._lock:
            self._claimed.setdefault((step, shard), set()).add(slot)

    def _warn_shared(self, d: _Decision, what: str) -> None:
        """Once per proxy: several writers share this shard, so calls are matched by their inputs only."""
        if self._shared_warned:
            return
        self._shared_warned = True
        rank = rank_of_process()
        if rank is None and self.role.shard in (ShardKind.AUTO, ShardKind.RANK):
            who = ("this process has no RANK, so skipweave guesses its identity: Ray actors, processes or threads "
                   "without a RANK of their own share shard r0")
            fix = ("give each writer its own RANK (e.g. .options(runtime_env={'env_vars': {'RANK': str(i)}}) for "
                   "Ray actor i) so its calls match by call order")
        else:
            who = "threads (or processes with one RANK) call this target at the same step"
            fix = ("give each process its own RANK, and call the target from one thread per process, to match by "
                   "call order")
        logger.warning(
            "skipweave: role %s target %s step %d: shard %s %s; %s. A call is served only a recording made for "
            "the same inputs and recorded afresh otherwise, never another writer's result; %s "
            "(docs/ray.md#several-writers-of-one-target)",
            self.role.role, self.target.name, d.step, d.shard, what, who, fix,
        )

    def _open_call(self, d: _Decision) -> bool:
        """Count a real call of a target with effects as running until its effects are taken (caller holds the
        lock). Returns whether it runs alone: no other real call of the target is between its start and its
        effects. Only such a call may record a list's appended items: those of calls running beside it (async
        tasks, threads) would land in its tail too."""
        alone = self._open == 0
        self._open += 1
        self._opened += 1
        d.opened = self._opened
        return alone

    def _close_call(self, d: _Decision) -> bool:
        """End what :meth:`_open_call` counted (once per call). Returns whether no other real call started since
        ``d`` did: with its start alone, nothing but ``d`` ran beside it."""
        with self._lock:
            if not d.opened:
                return False
            own = self._opened == d.opened
            self._open -= 1
            d.opened = 0
        return own

    def _lists_before(self, d: _Decision) -> dict[str, tuple[list[Any], list[Any]]] | None:
        """The declared effects that are lists right before a recorded real call that runs alone (see
        :meth:`_open_call`): expression -> (the list, a shallow copy of its items), what :meth:`_effects_after`
        compares with to tell a call that only appended. ``None`` when none is a list. One pointer copy per list
        (holding its items keeps their ids theirs); an expression that fails is left to :meth:`_effects_after`,
        which reports it."""
        out: dict[str, tuple[list[Any], list[Any]]] = {}
        for effect in self._effects:
            try:
                value = effect.evaluate(d.instance, (), {}, None)
            except ExpressionFailed:
                continue
            if isinstance(value, list):
                out[effect.text] = (value, list.copy(value))  # list's own copy: a subclass's overrides not called
        return out or None

    def _effects_after(self, d: _Decision) -> dict[str, Any]:
        """The values of the declared side effects now, after the real call (containers as plain copies); a list
        the call only appended to as its new items alone (:func:`~skipweave.weaving.effects.recorded_form`)."""
        out: dict[str, Any] = {}
        before = (d.lists_before if self._close_call(d) else None) or {}  # another call ran beside it: whole values
        for effect in self._effects:
            try:
                value = effect.evaluate(d.instance, (), {}, None)
            except ExpressionFailed as exc:
                effect.warn_once(exc, "it is not recorded, and a replay of such a call cannot restore it")
                continue
            out[effect.text] = recorded_form(before.get(effect.text), value)
        return out

    def _restore(self, d: _Decision, loaded: Any, result: Any, args: tuple[Any, ...],
                 kwargs: Mapping[str, Any]) -> None:
        """On a hit: copy the echo values into ``result``, put the recorded side effects back (a list recorded as
        the items the call appended gets them appended).

        Raises:
            ExpressionFailed: an echo or effect expression failed on this call (nothing of the host changed
                yet when an echo fails: echoes run first), or an effect recorded as appended items is no list
                here (nothing of the host changed yet either).
        """
        for dest, source in self._echo:
            dest.assign(source.evaluate(d.instance, args, kwargs, self.positions, defaults=self.defaults),
                        d.instance, args, kwargs, self.positions, result=result, defaults=self.defaults)
        recorded = loaded.effects or {}
        lists = self._lists_to_extend(d, loaded.appended or {}, args, kwargs)  # checked before anything changes
        for effect in self._effects:
            if effect.text in lists:
                self._append_recorded(effect, lists[effect.text], loaded.appended[effect.text], d.served)
            elif effect.text in recorded:
                effect.assign(recorded[effect.text], d.instance, args, kwargs, self.positions, defaults=self.defaults)
            else:
                effect.warn_once(ExpressionFailed(f"{effect.key} {effect.text!r} is not in the recording of step "
                                                  f"{d.served} (recorded before it was declared, or it failed "
                                                  "then)"), "the replay leaves it as it is")

    def _lists_to_extend(self, d: _Decision, appended: Mapping[str, Any], args: tuple[Any, ...],
                         kwargs: Mapping[str, Any]) -> dict[str, list[Any]]:
        """The live lists a replay appends recorded items to, by expression: every declared effect the entry
        recorded as appended items (:attr:`~skipweave.store.step_store.Loaded.appended`).

        Raises:
            ExpressionFailed: an effect's expression fails, its live value is no list to append to, or its
                recording is not ``{"n_before": int, "tail": list}`` (a payload no skipweave writes).
        """
        out: dict[str, list[Any]] = {}
        for effect in self._effects:
            if effect.text not in appended:
                continue
            item = appended[effect.text]
            if not (isinstance(item, dict) and type(item.get("n_before")) is int
                    and isinstance(item.get("tail"), list)):
                raise ExpressionFailed(f"{effect.key} {effect.text!r}: the recording of step {d.served} holds "
                                       f"{type(item).__name__} where appended items are expected")
            live = effect.evaluate(d.instance, args, kwargs, self.positions, defaults=self.defaults)
            if not isinstance(live, list):
                raise ExpressionFailed(f"{effect.key} {effect.text!r} is {type(live).__name__} here: the recording "
                                       f"of step {d.served} holds items the real call appended to a list")
            out[effect.text] = live
        return out

    def _append_recorded(self, effect: Expression, live: list[Any], item: Mapping[str, Any],
                         served: int | None) -> None:
        """Append an entry's recorded items to the live list, in place (the host's references and the list's type
        kept). A list of another length than the recording's before the call gets them all the same, what the
        call added; one WARNING per effect says so, since the list then differs from run 1's."""
        if len(live) != item["n_before"]:
            with self._lock:
                first = effect.text not in self._tail_warned
                self._tail_warned.add(effect.text)
            (logger.warning if first else logger.debug)(
                "skipweave: %s %r held %d items before the call where the recording's held %d (step %s): the %d "
                "items the real call appended are appended, and the list differs from run 1's (later such "
                "replays at DEBUG)", effect.key, effect.text, len(live), item["n_before"], served, len(item["tail"]))
        live.extend(item["tail"])

    def _unusable(self, d: _Decision, key: Any, reason: str) -> None:
        """An entry that cannot be served: set it aside (one WARNING from the store) and re-record it live."""
        d.unserved = reason
        try:
            self.store.discard(key, reason=reason)
            d.replace = True
        except Exception as exc:  # a read-only cache or a symlinked _set_aside: leave it, run live, record nothing
            logger.warning("skipweave: entry %s is not served (%s) and could not be set aside (%s); running "
                           "live without recording", key, reason, exc)
            d.no_store = True
        d.served = None

    def _after_live(self, result: Any, d: _Decision, seconds: float,
                    snapshot: tuple[Any, dict[str, Any] | None] | None = None) -> Any:
        handed_over = False
        try:
            result, handed_over = self._record_live(result, d, seconds, snapshot)
            return result
        finally:
            if not handed_over:
                self._call_ended(d)

    def _snapshot(self, d: _Decision) -> tuple[Any, dict[str, Any] | None]:
        """What a record keeps of the host besides the result, taken right after the real call: the state of the
        generators the call changed (see :func:`~skipweave.weaving.rng.rng_changes`) and the declared effects'
        values."""
        if not self.role.restore_rng:
            rng = None
        elif d.rng_before is not None:  # only the generators the call changed (restored alone on replay)
            rng = rng_changes(d.rng_before)
        else:
            rng = capture_rng_state()
        return rng, (self._effects_after(d) if self._effects else None)

    async def _after_live_off_loop(self, result: Any, d: _Decision, seconds: float) -> Any:
        """Record an ``async`` target's result without blocking its event loop: the RNG state and the declared
        effects are taken now, on the loop (what the real call left, before another task moves them); encoding
        and the copy handed to the background writer (or, writing through, the whole write) run in a worker
        thread while the loop serves other tasks. The caller gets the result once it is staged, so nothing it
        does to it afterwards reaches the recording."""
        if d.no_store:  # nothing to stage (and at exit no worker thread to stage it in)
            return self._after_live(result, d, seconds)
        try:
            snapshot: tuple[Any, dict[str, Any] | None] | None = self._snapshot(d)
        except Exception:  # noqa: BLE001 - taken again in the worker, where the record's failure is reported
            snapshot = None
        d.work.leave()  # (the worker thread is joined before the exit steps run)
        try:
            return await _off_loop(None, self._after_live, result, d, seconds, snapshot, work=d.work)
        except _ExitBegan:
            d.no_store = True
            return self._after_live(result, d, seconds)

    def _record_live(self, result: Any, d: _Decision, seconds: float,
                     snapshot: tuple[Any, dict[str, Any] | None] | None = None) -> tuple[Any, bool]:
        """Record a live result: staged (encoded, tensors copied) and handed to the background writer, or
        written here (write-through, or an entry larger than ``write_buffer``). Returns the result and whether
        the writer took it (it then ends the call in the store once committed, see :meth:`_written`)."""
        try:
            key: Any = self.store.key(d.step, self.target.name, d.shard, d.call if d.slot is None else d.slot)
        except ValueError as exc:  # a name that cannot be a folder of the dump dir: never fail the call
            logger.warning("skipweave: not recording role %s target %s step %d: %s", self.role.role,
                           self.target.name, d.step, exc)
            key, d.no_store = None, True
        nbytes = 0
        slot = d.call if d.slot is None else d.slot
        if not d.no_store and inspect.isawaitable(result):
            # e.g. a Ray ObjectRef or an asyncio Future: a handle to work still running, not its result
            logger.warning("skipweave: not recording %s: %s returned %s, a handle to a result still being "
                           "computed; weave the function that produces the data instead", key,
                           self.target.path, type(result).__name__)
            d.no_store = True
        status = report.BYPASS if d.validation else report.MISS  # a validation call ran live, as always
        if d.no_store:
            report.event(status, role=self.role.role, target=self.target.name, step=d.step,
                         nbytes=0, seconds=seconds, call=d.call)
            annotate(result, status, d.step, None)
            return result, False
        handed_over = False
        try:
            rng, effects = snapshot if snapshot is not None else self._snapshot(d)
            effects, appended = split_appended(effects)
            staged = self.store.stage(result, rng_state=rng, effects=effects, appended=appended)
            meta = EntryMeta(self.target.path, d.fp or "", seconds, d.replace, d.concurrent, displace=True,
                             background=True)
            budget = self.role.write_buffer
            if WRITER.behind() and 0 < staged.nbytes <= budget:
                staged = staged.owned()  # the host may change its result in place as soon as it has it
                self._claim(d.step, d.shard, key.call)  # never served to this process's own later calls
                WRITER.submit(self.store, key, staged, meta, budget=budget,
                              on_done=lambda outcome: self._written(d, key, outcome, counted=staged.nbytes))
                handed_over = True
                nbytes = staged.nbytes
                # Only now, the entry pending: a later call of the step is not concurrent with this one, and
                # single-flight waiters choose again and wait for the pending entry.
                self._unregister(d)
            else:
                nbytes, committed = self.store.commit(key, staged, meta)
                self._written(d, key, (nbytes, committed), end=False)
                slot = committed.call
        except codec.PickleRefused as exc:
            report.record_failed(self.role.role, self.target.name)
            logger.warning("skipweave: not recording %s: %s", key, exc)
        except Exception as exc:  # a failed record never fails the training call
            self._written(d, key, exc, end=False)
        report.event(status, role=self.role.role, target=self.target.name, step=d.step,
                     nbytes=nbytes, seconds=seconds, call=slot)
        annotate(result, status, d.step, None)
        return result, handed_over

    def _written(self, d: _Decision, key: Any, outcome: Any, *, end: bool = True, counted: int = 0) -> None:
        """A record of ``d`` ended (in the background writer's thread when ``end``: the call then ends in the
        store, so its part closes only once its entries are committed). ``counted``: bytes already counted as
        written when the entry was handed over (taken back if it failed)."""
        try:
            if isinstance(outcome, BaseException):
                report.record_failed(self.role.role, self.target.name, uncounted=counted)
                logger.warning(
                    "skipweave: recording %s under %s failed (%s: %s); the live result %s and nothing partial "
                    "was left", key, self.store.dump_dir, type(outcome).__name__, outcome,
                    "was returned" if end else "is returned",
                )
                return
            committed = outcome[1]
            self._claim(d.step, d.shard, committed.call)
            if committed.call != key.call and self._taken_by_concurrent(key):
                self._warn_shared(d, f"already held call {key.call} from another writer of this run")
        finally:
            if end:
                self._call_ended(d)


class _ExitBegan(Exception):
    """Work that had to run in this thread could not take its hold: the process's exit began."""


async def _off_loop(executor: concurrent.futures.Executor | None, fn: Callable[..., Any], *args: Any,
                    work: lifecycle.Work | None = None) -> Any:
    """``fn(*args)`` in a worker thread of ``executor`` (``None``: the loop's default), off the event loop; in
    this thread, holding ``work``, when the interpreter is shutting down, since the executors take no work then
    (an ``async`` target called from a daemon thread's loop or a host's ``atexit`` handler).

    Raises:
        _ExitBegan: ``fn`` had to run here and ``work`` could not be held (the exit steps began).
    """
    loop = asyncio.get_running_loop()
    try:
        future = loop.run_in_executor(executor, fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
        if work is not None and not work.enter():
            raise _ExitBegan from None
        try:
            return fn(*args)
        finally:
            if work is not None:
                work.leave()
    return await future


_EXIT_BEGAN: Any = object()

_CHOOSERS: list[concurrent.futures.ThreadPoolExecutor] = []
_CHOOSER_LOCK = threading.Lock()


def _chooser() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that chooses the serving step of ``async`` calls (file stats, off every event loop), one
    call after another in the order they came: a single worker keeps the order the loop's own choice had."""
    if not _CHOOSERS:
        with _CHOOSER_LOCK:
            if not _CHOOSERS:
                _CHOOSERS.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="skipweave-choose"))
    return _CHOOSERS[0]


os.register_at_fork(after_in_child=_CHOOSERS.clear)  # the parent's thread does not exist in a forked child


def proxy_of(wrapper: Any) -> SkipProxy | None:
    """Return the :class:`SkipProxy` behind a wrapt wrapper's ``_self_wrapper``, or ``None`` if not ours."""
    if isinstance(wrapper, SkipProxy):
        return wrapper
    proxy = getattr(wrapper, "skipweave_proxy", None)
    return proxy if isinstance(proxy, SkipProxy) else None


def _front(proxy: SkipProxy, gate: Gate) -> Callable[..., Any]:
    """Build the front of a plain ``def`` target: its gate, bypasses settled inline, eligible calls to the proxy.

    Every name the hot path reads is a closure cell (no attribute lookups on the proxy), the bypass count goes
    straight into :data:`report.COUNTERS`, and the result is annotated as :meth:`SkipProxy._live_bypass`
    does. While one of the proxy's real calls runs, every call goes through ``__call__`` (a nested call must
    see the recursion guard). The DEBUG line per bypass is written when the ``skipweave`` logger was at
    DEBUG at weave time (the proxy's own path asks on every call).
    """
    call, eligible_call = proxy.__call__, proxy.eligible_call
    on, running = proxy._on, proxy._running
    first, eligible = gate.first, gate.eligible
    counters, log = report.COUNTERS, report.logger
    counts, first_call = report.for_target(proxy.role.role, proxy.target.name), report.first_call
    log_each = log.isEnabledFor(logging.DEBUG)
    role, target = proxy.role.role, proxy.target.name
    coroutine, bypass, validation = types.CoroutineType, BYPASS, proxy._validation

    def front(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if running[0] or not on[0]:
            return call(wrapped, instance, args, kwargs)
        try:
            step = first(instance, args, kwargs)
        except Exception as exc:  # as SkipProxy.__call__
            proxy._step_failed(exc)
            return proxy._live_bypass(wrapped, args, kwargs, None)
        if step is bypass:
            if validation:
                return proxy.validation_call(wrapped, instance, args, kwargs)
            step = None
        elif eligible is None or step in eligible:
            return eligible_call(wrapped, instance, args, kwargs, step)
        counters.bypasses += 1
        counts.bypasses += 1
        if not counts.called:
            first_call(role, target, eligible=False)
        if log_each:
            log.debug(report.BYPASS_LINE, role, target, step)
        result = wrapped(*args, **kwargs)
        if type(result) is coroutine:  # a plain def that handed back its coroutine
            return proxy._annotated_awaitable(result, step)
        out = getattr(result, "meta_info", None)
        if type(out) is dict:
            out["skipweave"] = {"status": "bypass", "step": step, "served_step": None}
        elif out is not None:
            annotate(result, report.BYPASS, step, None)
        return result

    front.skipweave_proxy = proxy  # type: ignore[attr-defined]
    return front
