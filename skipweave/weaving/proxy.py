"""Skip proxies: the wrapt wrapper that decides, per call, to bypass, replay or call through and record.

One :class:`SkipProxy` serves one (role, target) pair. Its decision path::

    bypass predicate (validation) ──► run live, record nothing, advance no counter
    step from the step source ──► not in ``steps`` ──► run live
    call index within (step, shard) ──► action picks the serving step ──► replay (hit)
                                                                  └──► call through + record (miss)

Every call first passes the target's :class:`~skipweave.policy.gate.Gate` (bypass, step, eligibility, compiled at
weave time for the role's sources). What wrapt installs is :meth:`SkipProxy.wrapper`: for a plain ``def`` target,
a front function that runs the gate and settles bypasses inline (one Python call over wrapt's own pass-through)
and hands eligible calls to the proxy; for ``async`` and bridged targets, and subclasses that replace
``__call__``, the proxy itself. Both paths give the same decision, counters and result notes.

The proxy assembles its target's call engine and holds the entry points: at weave time it builds the frozen
:class:`~skipweave.weaving.context.TargetContext` (role, target, store, call ledger, action, declared effects,
environment, binding, echo hook) and the :class:`~skipweave.weaving.engine.CallEngine` that settles eligible calls
with it (the role's action, :mod:`~skipweave.weaving.actions`, serves them: replay or record, or verify). The engine's
parts receive the context, never the proxy, and import nothing of this module. docs/architecture.md follows one call
through them.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping
from typing import Any

from skipweave import failures, report
from skipweave.config.schema import BypassKind, RoleConfig, StepSourceKind, TargetSpec
from skipweave.policy.expressions import Expression, ExpressionFailed
from skipweave.policy.gate import BYPASS, Gate, compile_gate
from skipweave.policy.steps import StepError, StepSource
from skipweave.store.step_store import StepStore
from skipweave.weaving.actions import CallAction, action_for
from skipweave.weaving.asyncio_bridge import CORO_FLAGS, AsyncBridge, awaited_by_caller, wraps_coroutine_function
from skipweave.weaving.binding import Binding
from skipweave.weaving.calls import RUNNING_HERE, CallLedger
from skipweave.weaving.context import LiveEnvironment, TargetContext
from skipweave.weaving.effects import DeclaredEffects
from skipweave.weaving.engine import CallEngine  # (its module registers the replaying actions)
from skipweave.weaving.notes import RESULT_NOTES, annotate
from skipweave.weaving.record import Recorder
from skipweave.weaving.replay import VIEW_TTL_S, EnvironmentMismatch, FingerprintMismatch, Replayer, ReplayMissing
from skipweave.weaving.shards import RANK_VARIABLES, VALIDATION_SHARD, rank_of_process, shard_label
from skipweave.weaving.verifier import Diverged, Verify  # (its module registers the verify action)

logger = logging.getLogger(__name__)


_STEP_KEY = {StepSourceKind.EXPR: "expr", StepSourceKind.ARG: "path", StepSourceKind.ATTR: "path",
             StepSourceKind.REGEX: "pattern", StepSourceKind.SET_STEP: "source"}
"""The key under ``skip.<role>.step`` that a step source which gave no step is read from, for the message."""


class SkipProxy:
    """The wrapt wrapper of one target of one role.

    Args:
        role: the validated role config.
        target: the target spec.
        store: the role's :class:`StepStore`.
        bypass: predicate ``(args, kwargs) -> bool`` (see :mod:`skipweave.policy.bypass`).
        is_async: the target is a coroutine function.
        bridge: the target is a sync-or-await helper around a coroutine function (see
            :mod:`~skipweave.weaving.asyncio_bridge`).
        positions: parameter name -> position in the call's ``args`` (``self``/``cls`` removed).
        original: the function the weaver patched (``None`` for a proxy built otherwise): whose source and package
            belong to the target's environment.
        binding: how a call's arguments bind to the target's signature (:func:`~skipweave.weaving.binding.binding_of`):
            its calls are fingerprinted by the ``signature`` rule; ``None`` (a target without a signature, a proxy
            built otherwise): by the ``arguments`` rule.

    The proxy assembles the target's call engine: the frozen :class:`~skipweave.weaving.context.TargetContext` (role,
    target, store, ledger, action, effects, environment, binding, the :meth:`on_replay` hook), built here once, and
    the :class:`~skipweave.weaving.engine.CallEngine` that settles eligible calls with it. The proxy itself runs the
    gate (bypass, step, eligibility) and hands eligible calls to the engine; no part of the engine reads the proxy.

    A proxy set inactive (``active = False``) passes every call straight through; unweave does that
    when another tool's non-wrapt wrapper sits above ours and the patch cannot be spliced out.

    Subclasses (host integrations) may replace ``bypass`` or ``step_source`` (in ``__init__``; the gate is
    built around the replacement at the first call or at weave), ``on_replay`` or ``__call__`` (a proxy that
    does is installed itself, with no front). ``compiled_gate = False`` builds the interpreted gate.

    Attributes:
        active: False once unweave has turned this proxy into a pass-through (the front reads it on every call).
        context: the target's :class:`~skipweave.weaving.context.TargetContext`.
        engine: the target's :class:`~skipweave.weaving.engine.CallEngine`.
        ledger: its calls' indices and running real calls (the context's, read by the front on every call).
        effects: the role's declared effects and echoes (the context's).
        counts: this target's counters (:func:`skipweave.report.for_target`).
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
        original: Callable[..., Any] | None = None,
        binding: Binding | None = None,
    ) -> None:
        self.role = role
        self.target = target
        self.store = store
        self.bypass = bypass
        self.is_async = is_async
        self.bridge = bridge
        self.active = True
        self.steps = role.steps
        self.step_source = StepSource(role.step, positions, name=f"role {role.role} target {target.name}",
                                      key=f"skip.{role.role}.step")
        self.positions = positions
        self._defaults: Mapping[str, Any] = {}
        params = tuple(positions or ())
        self._bypass_expr = (Expression(f"skip.{role.role}.bypass.expr", role.bypass.expr, params=params)
                             if role.bypass.expr else None)
        self._step_warned = False
        self.counts = report.for_target(role.role, target.name)
        self._own_bypass = bypass  # a subclass that replaces self.bypass gets a gate around its predicate
        action = action_for(role)
        # validation calls go to the store too (recorded apart, replayed, or compared with their recordings)
        self._validation = role.record_validation or role.replay_only or action.takes_validation
        self._bypassed_fate = bypassed_fate(role, action)  # what the WARNING of a failing bypass expression says
        self._gate: Gate | None = None
        self.ledger = CallLedger(role, target, store, self.counts, binding, action)
        self.effects = DeclaredEffects(role, params, positions, self.ledger.lock)
        self.context = TargetContext(role, target, store, self.ledger, action, self.effects, self.counts,
                                     LiveEnvironment(role, target, original), binding, self.on_replay)
        self.engine = CallEngine(self.context, is_async=is_async)
        self._running_id = id(self.context)  # what RUNNING_HERE holds while one of its real calls runs

    @property
    def action(self) -> CallAction[Any]:
        """The role's action (:class:`~skipweave.weaving.actions.CallAction`)."""
        return self.context.action

    @property
    def original(self) -> Callable[..., Any] | None:
        """The function the weaver patched (``None`` for a proxy built otherwise)."""
        return self.context.environment.original

    @property
    def binding(self) -> Binding | None:
        """How a call's arguments bind to the target's signature (``None``: fingerprinted as passed)."""
        return self.context.binding

    @property
    def environment(self) -> dict[str, Any]:
        """What this target's calls run with in this process (:class:`~skipweave.weaving.context.LiveEnvironment`):
        computed at the first call that records or replays, then kept. Recorded in each new entry's manifest."""
        return self.context.environment.value()

    @property
    def replayer(self) -> Replayer:
        """The part that replays its calls (the engine's)."""
        return self.engine.replayer

    @property
    def recorder(self) -> Recorder:
        """The part that records its calls (the engine's)."""
        return self.engine.recorder

    @property
    def async_bridge(self) -> AsyncBridge:
        """The awaitable helpers (the engine's)."""
        return self.engine.bridge

    @property
    def defaults(self) -> Mapping[str, Any]:
        """Parameter name -> default of the target's signature (set by the weaver): what an expression naming
        a parameter the call did not pass reads."""
        return self._defaults

    @defaults.setter
    def defaults(self, value: Mapping[str, Any]) -> None:
        self._defaults = dict(value)
        self.step_source.defaults = self._defaults
        self.effects.defaults = self._defaults
        self._gate = None

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

    @property
    def skipweave_proxy(self) -> SkipProxy:
        """This proxy: what :func:`proxy_of` (and :mod:`~skipweave.weaving.binding`, which may not import this
        module) reads off a wrapt wrapper, the proxy or its front."""
        return self

    # ------------------------------------------------------------------ wrapt entry point
    def __call__(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not self.active or self._running_id in RUNNING_HERE.get():
            return wrapped(*args, **kwargs)
        # A sync-or-await helper awaited by its caller must be called from a coroutine frame, bypasses too.
        awaited = self.bridge and awaited_by_caller()
        gate = self.gate
        try:
            step = gate.first(instance, args, kwargs)
        except Exception as exc:  # never fail the training call, never record under a wrong step
            self._step_failed(exc)
            return self.live_bypass(wrapped, args, kwargs, None, awaited)
        if step is BYPASS:
            if self._validation:
                return self.validation_call(wrapped, instance, args, kwargs, awaited)
            return self.live_bypass(wrapped, args, kwargs, None, awaited)
        if gate.eligible is None or step in gate.eligible:
            return self.engine.eligible_call(wrapped, instance, args, kwargs, step, awaited)
        return self.live_bypass(wrapped, args, kwargs, step, awaited)

    def eligible_call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any], step: int, awaited: bool = False, validation: bool = False) -> Any:
        """Settle a call its gate found eligible at ``step`` (:meth:`~skipweave.weaving.engine.CallEngine.
        eligible_call`).

        Raises:
            ReplayMissing: the role is replay-only and no recording serves the call.
            FingerprintMismatch: the entry was made for other inputs and ``on_mismatch`` is ``error``.
        """
        return self.engine.eligible_call(wrapped, instance, args, kwargs, step, awaited, validation)

    def validation_call(self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                        kwargs: dict[str, Any], awaited: bool = False) -> Any:
        """A call the bypass let through (validation), when the role records or replays them
        (``record_validation``, ``replay_only``): keyed by its step when the step source can tell it without
        counting, else by the number of validation calls so far (1, 2, ...); live and recorded in a recording
        run (once per step and call), served in a replay-only run."""
        step = self.step_source.peek(instance, args, kwargs)
        if step is None:
            step = self.ledger.next_validation_step()
        elif self.gate.eligible is not None and step not in self.gate.eligible:
            return self.live_bypass(wrapped, args, kwargs, step, awaited)
        return self.eligible_call(wrapped, instance, args, kwargs, step, awaited, validation=True)

    def _bypassed_by_expr(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        expr = self._bypass_expr
        assert expr is not None
        try:
            return bool(expr.evaluate(instance, args, kwargs, self.positions, defaults=self.defaults))
        except ExpressionFailed as exc:
            failed = exc
        except Exception as exc:  # noqa: BLE001 - its truth value raised (e.g. a tensor of several values)
            failed = ExpressionFailed(f"{expr.key} {expr.text!r} gave a value with no truth value "
                                      f"({type(exc).__name__}: {exc})")
        expr.warn_once(failed, self._bypassed_fate)
        failures.call_unread(self.role.role, expr.key, str(failed))
        return True

    def _step_failed(self, exc: Exception) -> None:
        """The gate found no usable step (:class:`StepError`), or reading the call raised (a property of the
        host's, a bypass callable): the call runs live, unrecorded, with one WARNING.

        Raises:
            ReplayMissing: the role is replay-only (such a call could only run live).
        """
        key = self._unread_key(exc)
        if not isinstance(exc, StepError):
            exc = StepError(f"reading the step or the bypass of the call raised {type(exc).__name__}: {exc} "
                            f"(skip.{self.role.role}.step, skip.{self.role.role}.bypass)")
        failures.call_unread(self.role.role, key, str(exc))
        if self.role.replay_only:
            report.replay_missing(f"role {self.role.role} target {self.target.name}: its step could not be told")
            raise ReplayMissing(f"skipweave: replay-only role {self.role.role} target {self.target.name} "
                                f"({self.target.path}): {exc}; a replay-only run cannot serve a call whose step "
                                "it cannot tell") from None
        if self._step_warned:
            logger.debug("skipweave: role %s target %s: %s", self.role.role, self.target.name, exc)
            return
        self._step_warned = True
        logger.warning("skipweave: role %s target %s: %s; such calls run live and are not recorded",
                       self.role.role, self.target.name, exc)

    def _unread_key(self, exc: Exception) -> str:
        """The config key to fix for a call whose step or bypass could not be read (``exc``: what the gate raised)."""
        role = self.role.role
        if isinstance(exc, StepError):
            sub = _STEP_KEY.get(self.step_source.cfg.source)
            return f"{self.step_source.key}.{sub}" if sub else self.step_source.key
        if self.role.bypass.when is BypassKind.CALLABLE:
            return f"skip.{role}.bypass.callable"
        return f"skip.{role}.step"

    # ------------------------------------------------------------------ paths
    def live_bypass(self, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    step: int | None, awaited: bool = False) -> Any:
        """Run the call live, record nothing, count it as a bypass at ``step`` (``None``: it has none); with
        ``awaited``, from a coroutine frame (an awaited sync-or-await helper): returns an awaitable
        (:meth:`~skipweave.weaving.engine.CallEngine.live_bypass`)."""
        return self.engine.live_bypass(wrapped, args, kwargs, step, awaited)

    # ------------------------------------------------------------------ hooks for host integrations
    def on_replay(self, result: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Return what a hit hands the host; ``result`` is the freshly decoded recording.

        The echo hook: a subclass (named by ``targets.<name>.proxy``) copies per-run values from the live
        inputs into the replayed result here, e.g. verl's random ``uid`` per sample, which the host
        later checks against its own copy. The generic proxy returns ``result`` unchanged.
        """
        return result


def bypassed_fate(role: RoleConfig, action: CallAction[Any] | None = None) -> str:
    """What becomes of a call the bypass rule takes for a validation call, for a message: it runs live unrecorded,
    unless the role records, replays or verifies validation calls apart from training ones (shard ``val_<shard>``).
    ``action``: the role's (:func:`~skipweave.weaving.actions.action_for` when not given)."""
    if role.replay_only:
        return "such calls are taken for validation calls: served from the validation recordings (shard val_<shard>)"
    fate = (action or action_for(role)).validation_fate
    if fate:
        return fate
    if role.record_validation:
        return ("such calls are taken for validation calls: they run live and are recorded apart from training calls "
                "(shard val_<shard>, served only in replay-only runs)")
    return "such calls run live and are not recorded"


def proxy_of(wrapper: Any) -> SkipProxy | None:
    """Return the :class:`SkipProxy` behind a wrapt wrapper's ``_self_wrapper``, or ``None`` if not ours."""
    proxy = getattr(wrapper, "skipweave_proxy", None)
    return proxy if isinstance(proxy, SkipProxy) else None


def _front(proxy: SkipProxy, gate: Gate) -> Callable[..., Any]:
    """Build the front of a plain ``def`` target: its gate, bypasses settled inline, eligible calls to the proxy.

    Every name the hot path reads is a closure cell or one attribute, the bypass count goes straight into
    :data:`report.COUNTERS`, and the result notes are called as :meth:`SkipProxy.live_bypass` calls them (through
    :attr:`~skipweave.weaving.notes.NoteRegistry.note`). While one of the proxy's real calls runs, every call goes
    through ``__call__`` (a nested call must see the recursion guard). The DEBUG line per bypass is written when
    the ``skipweave`` logger was at DEBUG at weave time (the proxy's own path asks on every call).
    """
    call, eligible_call = proxy.__call__, proxy.engine.eligible_call
    ledger, notes = proxy.ledger, RESULT_NOTES
    # Specialised to the one note registered now (verl's): a loop over the notes cost the bypass rows of bench/run.py
    # ~50 ns per call (Dec 2026); any other set of notes, or a later change to it, goes through notes.annotate.
    places = notes.current()
    one_note = places if len(places) == 1 else None
    attribute, key = places[0] if len(places) == 1 else ("", "")
    note = proxy.role.note
    key = note or key
    first, eligible = gate.first, gate.eligible
    counters, log = report.COUNTERS, report.logger
    counts, first_call = report.for_target(proxy.role.role, proxy.target.name), report.first_call
    log_each = log.isEnabledFor(logging.DEBUG)
    role, target = proxy.role.role, proxy.target.name
    coroutine, bypass, status, validation = types.CoroutineType, BYPASS, report.BYPASS, proxy._validation
    annotated_awaitable = proxy.engine.bridge.annotated_awaitable

    def front(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if ledger.running or not proxy.active:
            return call(wrapped, instance, args, kwargs)
        try:
            step = first(instance, args, kwargs)
        except Exception as exc:  # as SkipProxy.__call__
            proxy._step_failed(exc)
            return proxy.live_bypass(wrapped, args, kwargs, None)
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
            return annotated_awaitable(result, step)
        if notes.places is one_note:  # the note the front was built for, written inline
            out = getattr(result, attribute, None)
            if type(out) is dict or isinstance(out, dict):
                out[key] = {"status": status, "step": step, "served_step": None}
        else:
            annotate(result, status, step, None, note)
        return result

    front.skipweave_proxy = proxy  # type: ignore[attr-defined]
    return front


__all__ = ["CORO_FLAGS", "Diverged", "EnvironmentMismatch", "FingerprintMismatch", "RANK_VARIABLES",
           "ReplayMissing", "SkipProxy", "Verify",
           "VALIDATION_SHARD", "VIEW_TTL_S", "annotate", "awaited_by_caller", "bypassed_fate", "proxy_of",
           "rank_of_process", "shard_label", "wraps_coroutine_function"]
