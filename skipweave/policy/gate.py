"""The gate of a target: whether a call is bypassed, its step and whether that step is eligible, compiled once.

Every call of a woven target passes its gate before anything else; most calls of a target called per sample
or per micro-batch end there (validation, steps outside ``steps``). :func:`compile_gate` builds, at weave
time, the three functions for the role's configured sources -- a bypass predicate, a step function and the
eligible steps -- specialised to the shape at hand: argument lookups resolved to positions, dotted paths
to ``dict.get``/``getattr`` chains (:func:`~skipweave.policy.access.compile_reader`), expressions to
functions of the call (:meth:`~skipweave.policy.expressions.Expression.bind`), one range of steps to a
``range``. The proxy's general path and its fast front both use the same gate, so there is one decision.

Each compiled function only answers when the interpreted form (:func:`~skipweave.policy.bypass.make_bypass`,
:meth:`~skipweave.policy.steps.StepSource.step_for`, :meth:`Expression.evaluate`) would answer the same; on
anything unusual (a value that is not a plain ``int``/``bool``, an exception) it hands the call to the
interpreted form, which also writes the config-naming messages. A proxy subclass that replaces the bypass
predicate or the step source gets a gate around its replacement.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.config.schema import BypassConfig, BypassKind, StepSet, StepSourceKind
from skipweave.policy.access import MISSING, PLAIN, compile_arg, compile_reader
from skipweave.policy.bypass import truthy
from skipweave.policy.expressions import Expression
from skipweave.policy.steps import StepSource

CallFn = Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any]
"""``fn(instance, args, kwargs)``: the bound instance (``None`` for a function) and the call's arguments."""

MAX_STEP_SET = 4096
"""Largest selection of several ranges turned into a ``frozenset``; one range becomes a ``range`` (constant
size), more and larger keep :class:`StepSet`'s own check."""


BYPASS: Any = type("Bypass", (), {"__repr__": lambda self: "BYPASS", "__slots__": ()})()
"""What :attr:`Gate.first` returns for a call that is bypassed before any step is read (validation)."""


@dataclass(frozen=True)
class Gate:
    """The compiled first decision of one target's calls.

    Attributes:
        first: ``first(instance, args, kwargs) -> int | BYPASS``: :data:`BYPASS` for a call that runs live
            without a step (validation), else the call's step; raises
            :class:`~skipweave.policy.steps.StepError` when the step source gives nothing usable. A call
            counter advances once per call that is not bypassed.
        eligible: the eligible steps (``step in eligible``), or ``None`` when every step is.
        bypassed: the bypass predicate ``first`` applies (``None``: ``bypass.when: never``), on its own.
        step_of: the step function ``first`` applies, on its own.
    """

    first: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any]
    eligible: Container[int] | None
    bypassed: CallFn | None
    step_of: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], int]


@functools.lru_cache(maxsize=64)
def eligible_steps(steps: StepSet) -> Container[int] | None:
    """``None`` for every step, else a container answering ``int in it`` in C where it can (a ``range`` for one
    range, a ``frozenset`` of at most :data:`MAX_STEP_SET` steps), else ``steps`` itself."""
    ranges = steps.ranges
    if ranges is None:
        return None
    if len(ranges) == 1:
        return range(ranges[0][0], ranges[0][1] + 1)
    if sum(hi - lo + 1 for lo, hi in ranges) <= MAX_STEP_SET:
        return frozenset(s for lo, hi in ranges for s in range(lo, hi + 1))
    return steps


def _position(ref: int | str, positions: Mapping[str, int] | None) -> int:
    """Where argument ``ref`` sits in ``args`` when passed by position, or ``-1`` (keyword only, unknown)."""
    if isinstance(ref, int):
        return ref
    return positions.get(ref, -1) if positions is not None else -1


def _arg_paths(cfg: BypassConfig, positions: Mapping[str, int] | None) -> CallFn:
    """``bypass.when: arg``: any of ``paths`` truthy on argument ``arg`` (as :func:`make_bypass`)."""
    arg = compile_arg(cfg.arg, positions)
    readers = tuple(compile_reader(p) for p in cfg.paths)

    def bypassed(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        obj = arg(args, kwargs)
        if obj is MISSING:
            return False
        for read in readers:
            value = read(obj)
            if value is True:
                return True
            if value is None or value is False or value is MISSING:
                continue
            if truthy(value):
                return True
        return False

    return bypassed


def _by_expression(expr: Expression, positions: Mapping[str, int] | None, defaults: Mapping[str, Any],
                   interpreted: CallFn) -> CallFn:
    """``bypass.expr``: the bound expression's truth; on any exception the interpreted form (which warns)."""
    fast = expr.bind(positions, defaults)

    def bypassed(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        try:
            value = fast(instance, args, kwargs)
            return value if type(value) is bool else bool(value)
        except Exception:  # noqa: BLE001 - the interpreted form names the key and warns once
            return bool(interpreted(instance, args, kwargs))

    return bypassed


def compile_bypass(cfg: BypassConfig, predicate: Callable[[tuple[Any, ...], Mapping[str, Any]], bool], *,
                   own: bool, expr: Expression | None, expr_interpreted: CallFn | None,
                   positions: Mapping[str, int] | None, defaults: Mapping[str, Any],
                   compiled: bool = True) -> CallFn | None:
    """Build a gate's bypass predicate.

    Args:
        cfg: the role's bypass settings.
        predicate: the proxy's ``(args, kwargs) -> bool`` predicate (:func:`make_bypass`'s, or a subclass's).
        own: ``predicate`` is :func:`make_bypass`'s for ``cfg`` (so ``cfg`` may be compiled instead).
        expr, expr_interpreted: the role's ``bypass.expr`` and its interpreted form (warns, then bypasses),
            or ``None`` for both.
        positions, defaults: the target's parameter positions (``self`` removed) and signature defaults.
        compiled: ``False`` builds the interpreted gate (a reference for tests, or a subclass's choice).
    """
    if not (own and compiled):
        base: CallFn | None = lambda instance, args, kwargs: predicate(args, kwargs)  # noqa: E731
    elif cfg.when is BypassKind.ARG:
        base = _arg_paths(cfg, positions) if cfg.paths else None  # no paths: no call is bypassed
    elif cfg.when is BypassKind.CALLABLE:
        base = lambda instance, args, kwargs: predicate(args, kwargs)  # noqa: E731
    else:  # never; expr (below)
        base = None
    if expr is None or expr_interpreted is None:
        return base
    by_expr = _by_expression(expr, positions, defaults, expr_interpreted) if compiled else expr_interpreted
    if base is None:
        return by_expr
    first = base
    return lambda instance, args, kwargs: first(instance, args, kwargs) or by_expr(instance, args, kwargs)


def compile_step(source: StepSource, positions: Mapping[str, int] | None, defaults: Mapping[str, Any],
                 compiled: bool = True) -> Callable[[Any, tuple[Any, ...], Mapping[str, Any]], int]:
    """Build a gate's step function from a step source.

    A plain ``int`` read on the fast path is the step; anything else (a float, a tensor, a string, nothing)
    goes to :meth:`StepSource.step_for`, which converts it, falls back (``auto``) or raises ``StepError``.
    A subclass of :class:`StepSource`, ``regex`` and ``set_step`` sources use ``step_for`` directly.
    """
    general = source.step_for
    if not compiled or type(source) is not StepSource:
        return general
    cfg = source.cfg
    kind = cfg.source
    if kind is StepSourceKind.COUNTER:
        count = source.next_count
        return lambda instance, args, kwargs: count()
    if kind is StepSourceKind.EXPR:
        assert cfg.expr is not None
        assert source.expression is not None
        fast = source.expression.bind(positions, defaults)

        def by_expr(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
            try:
                value = fast(instance, args, kwargs)
            except Exception:  # noqa: BLE001 - step_for names the key in its StepError
                return general(instance, args, kwargs)
            return value if type(value) is int else general(instance, args, kwargs)

        return by_expr
    if kind is StepSourceKind.ATTR:
        read_self = compile_reader(cfg.path or "")  # (the config refuses step.source=attr without a path)

        def by_attr(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
            value = read_self(instance)
            return value if type(value) is int else general(instance, args, kwargs)

        return by_attr
    if kind is StepSourceKind.AUTO and cfg.path is None:
        return general  # no argument read: set_step's step or the call counter
    if kind in (StepSourceKind.ARG, StepSourceKind.AUTO):
        read = compile_reader(cfg.path or "")
        index = _position(cfg.arg, positions)
        by_number = isinstance(cfg.arg, int)  # a name read by position only while no keyword could be it
        if index < 0:
            return general

        def by_arg(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
            value = read(args[index]) if len(args) > index and (by_number or not kwargs) else MISSING
            return value if type(value) is int else general(instance, args, kwargs)

        return by_arg
    return general


def compile_gate(cfg: BypassConfig, predicate: Callable[[tuple[Any, ...], Mapping[str, Any]], bool], *,
                 own: bool, expr: Expression | None, expr_interpreted: CallFn | None, source: StepSource,
                 steps: StepSet | Container[int], positions: Mapping[str, int] | None,
                 defaults: Mapping[str, Any], compiled: bool = True) -> Gate:
    """Build a target's :class:`Gate` (arguments as :func:`compile_bypass` and :func:`compile_step`).

    ``steps`` is the role's :class:`StepSet`, or any container a proxy subclass uses instead. ``first`` applies
    the two compiled functions in turn.
    """
    bypassed = compile_bypass(cfg, predicate, own=own, expr=expr, expr_interpreted=expr_interpreted,
                              positions=positions, defaults=defaults, compiled=compiled)
    step_of = compile_step(source, positions, defaults, compiled)
    eligible = eligible_steps(steps) if isinstance(steps, StepSet) else steps

    if bypassed is None:
        return Gate(step_of, eligible, bypassed, step_of)
    checked = bypassed
    if compiled and own and cfg.when is BypassKind.ARG and expr is None:
        shared = _one_argument(cfg, source, positions, bypassed, step_of)
        if shared is not None:
            return Gate(shared, eligible, bypassed, step_of)

    if expr is None and (not (own and compiled) or cfg.when is BypassKind.CALLABLE):
        # the predicate itself, not the lambda around it: one call less per call (bench/run.py
        # ``calls.method_shape_callable_bypass``, 40-60 ns of its 2x-wrapt budget, Dec 2026)
        def first_by_predicate(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
            if predicate(args, kwargs):
                return BYPASS
            return step_of(instance, args, kwargs)

        return Gate(first_by_predicate, eligible, bypassed, step_of)

    def first(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if checked(instance, args, kwargs):
            return BYPASS
        return step_of(instance, args, kwargs)

    return Gate(first, eligible, bypassed, step_of)


def _one_argument(cfg: BypassConfig, source: StepSource, positions: Mapping[str, int] | None, bypassed: CallFn,
                  step_of: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], int]) -> Callable[..., Any] | None:
    """``first`` for flags and a step read from one argument (verl's convention: ``meta_info.validate`` and
    ``meta_info.global_steps``): the argument and the paths' shared prefix are read once, a one-part rest of a
    ``dict`` with ``dict.get``. Needed by bench/run.py's ``calls.bypass_step_not_eligible`` rows: in an A/B on
    the loaded machine (bench/calls.py, old and new trees alternating, Dec 2026), reading the flag and the step
    separately added 1.49x (function) and 1.63x (method) what a generated (exec'd) function reading the prefix
    once added; this closure 0.95x and 0.76x. ``None`` when the shape is another.

    Anything not settled here (a flag neither ``True``/``False``/``None``/absent, a step that is not an ``int``,
    the argument passed by keyword) goes to the two compiled functions, which give the interpreted answer.
    """
    step = source.cfg
    if type(source) is not StepSource or step.source not in (StepSourceKind.ARG, StepSourceKind.AUTO):
        return None
    index = _position(cfg.arg, positions)
    if step.arg != cfg.arg or index < 0 or not cfg.paths or step.path is None:
        return None
    parts = [tuple(p.split(".")) for p in (*cfg.paths, step.path)]
    if any(not all(p) or any(x.lstrip("-").isdigit() for x in p) for p in parts):  # get_path's own rules
        return None
    prefix: tuple[str, ...] = ()
    while all(len(p) > len(prefix) + 1 for p in parts) and len({p[len(prefix)] for p in parts}) == 1:
        prefix += (parts[0][len(prefix)],)
    read_prefix = compile_reader(".".join(prefix)) if prefix else (lambda obj: obj)
    rests = [p[len(prefix):] for p in parts]
    flag_readers = tuple(compile_reader(".".join(r)) for r in rests[:-1])
    read_step = compile_reader(".".join(rests[-1]))
    one_part = all(len(r) == 1 for r in rests)
    flag_keys = tuple(r[0] for r in rests[:-1])
    # one flag (verl's ``validate``) is read without a loop: the loop was a fifth of what this function adds to a
    # validation call (bench/run.py ``calls.bypass_validation``, Dec 2026)
    flag_key = flag_keys[0] if len(flag_keys) == 1 else None
    step_key = rests[-1][0]
    by_number = isinstance(cfg.arg, int)
    # a one-part prefix (verl's ``meta_info``) is read here, not through a reader: the reader's call and loop were
    # a third of what this function adds to a bypassed call (bench/calls.py, Dec 2026: 330 ns against 230 ns)
    attribute = prefix[0] if len(prefix) == 1 else None
    known, token, get_token = PLAIN.known, PLAIN.token, abc.get_cache_token

    def two_stage(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if bypassed(instance, args, kwargs):
            return BYPASS
        return step_of(instance, args, kwargs)

    def first(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if len(args) <= index or not (by_number or not kwargs):
            return two_stage(instance, args, kwargs)
        node = args[index]
        try:
            if attribute is None:
                node = read_prefix(node)
            elif type(node) is dict:
                node = node.get(attribute, MISSING)
            elif known.get(type(node)) and token[0] == get_token():
                node = getattr(node, attribute, MISSING)
            else:
                node = read_prefix(node)
        except TypeError:  # a class made unhashable by its metaclass: the reader's own answer
            node = read_prefix(args[index])
        if node is MISSING:
            return step_of(instance, args, kwargs)
        if one_part and type(node) is dict:
            if flag_key is not None:
                flag = node.get(flag_key)
                if flag is True:
                    return BYPASS
                if not (flag is None or flag is False):
                    return two_stage(instance, args, kwargs)
            else:
                for key in flag_keys:
                    flag = node.get(key)
                    if flag is True:
                        return BYPASS
                    if not (flag is None or flag is False):
                        return two_stage(instance, args, kwargs)
            value = node.get(step_key)
        else:
            for read in flag_readers:
                flag = read(node)
                if flag is True:
                    return BYPASS
                if not (flag is None or flag is False or flag is MISSING):
                    return two_stage(instance, args, kwargs)
            value = read_step(node)
        return value if type(value) is int else step_of(instance, args, kwargs)

    return first


__all__ = ["BYPASS", "CallFn", "Gate", "MAX_STEP_SET", "compile_bypass", "compile_gate", "compile_step",
           "eligible_steps"]
