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
from skipweave.policy.access import MISSING, _plain, _plain_token, compile_arg, compile_reader
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
        base = _arg_paths(cfg, positions)
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
        read_self = compile_reader(cfg.path)

        def by_attr(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
            value = read_self(instance)
            return value if type(value) is int else general(instance, args, kwargs)

        return by_attr
    if kind in (StepSourceKind.ARG, StepSourceKind.AUTO):
        read = compile_reader(cfg.path)
        index = _position(cfg.arg, positions)
        by_number = isinstance(cfg.arg, int)  # as in bypassed1 above
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

    ``steps`` is the role's :class:`StepSet`, or any container a proxy subclass uses instead. Where the
    bypass paths and the step are read from the call's arguments or instance (``bypass.when: arg``,
    ``step.source: arg|auto|attr``), ``first`` is one generated function reading each shared prefix once
    (:func:`_fused`); otherwise it applies the two compiled functions in turn.
    """
    bypassed = compile_bypass(cfg, predicate, own=own, expr=expr, expr_interpreted=expr_interpreted,
                              positions=positions, defaults=defaults, compiled=compiled)
    step_of = compile_step(source, positions, defaults, compiled)
    eligible = eligible_steps(steps) if isinstance(steps, StepSet) else steps

    def first(instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if bypassed is not None and bypassed(instance, args, kwargs):
            return BYPASS
        return step_of(instance, args, kwargs)

    if compiled:
        paths = own and cfg.when is BypassKind.ARG
        extra: list[CallFn] = []
        if not own or cfg.when is BypassKind.CALLABLE:
            extra.append(lambda instance, args, kwargs: predicate(args, kwargs))
        if expr is not None and expr_interpreted is not None:
            extra.append(_by_expression(expr, positions, defaults, expr_interpreted))
        fused = _fused(cfg if paths else None, extra, source, step_of, first, positions)
        if fused is not None:
            first = fused
    return Gate(first, eligible, bypassed, step_of)


class _Slow(Exception):
    """Raised inside a fused gate for a shape its straight-line reads do not settle (the general gate does)."""


def _fused(paths: BypassConfig | None, extra: list[CallFn], source: StepSource,
           step_of: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], int], general: Callable[..., Any],
           positions: Mapping[str, int] | None) -> Callable[..., Any] | None:
    """Generate ``first`` as one function: argument fetches and dotted reads inline, shared prefixes read once.

    A read settles only the plain shapes (a ``dict`` part, an object of a class known not to be a Mapping,
    a bypass flag that is ``True``/``False``/``None``/absent, a step that is an ``int``); anything else
    goes to ``general`` (the bypass stage) or ``step_of`` (the step stage). ``None`` when neither the
    bypass nor the step is read by a path (nothing to fuse).
    """
    cfg = source.cfg
    # Where a path is read: ("self",) for the bound instance, ("arg", ref) for an argument (ref as configured:
    # an int position, or a parameter name, which may be any string, "self" and "1" included).
    step_path: tuple[tuple[Any, ...], str] | None = None
    if type(source) is StepSource and cfg.source in (StepSourceKind.ARG, StepSourceKind.AUTO, StepSourceKind.ATTR):
        step_path = (("self",), cfg.path) if cfg.source is StepSourceKind.ATTR else (("arg", cfg.arg), cfg.path)
    bypass_paths = [(("arg", paths.arg), p) for p in paths.paths] if paths is not None else []
    every = bypass_paths + ([step_path] if step_path else [])
    if not every or any(not path or any(p.lstrip("-").isdigit() for p in path.split(".")) for _, path in every):
        return None
    env: dict[str, Any] = {"MISSING": MISSING, "BYPASS": BYPASS, "_Slow": _Slow, "known": _plain,
                           "token": _plain_token, "get_token": abc.get_cache_token, "general": general,
                           "step_of": step_of}
    for i, fn in enumerate(extra):
        env[f"extra{i}"] = fn
    names: dict[tuple[Any, ...], str] = {}

    def fetch(where: tuple[Any, ...], out: list[str], pad: str) -> str:
        key = (where, ())
        if key in names:
            return names[key]
        var = names[key] = f"v{len(names)}"
        if where == ("self",):
            out.append(f"{pad}{var} = instance")
            return var
        raw = where[1]
        index = raw if type(raw) is int else (positions or {}).get(str(raw), -1)
        if type(index) is not int or index < 0:
            out.append(f"{pad}raise _Slow")
            return var
        keyword_free = "" if type(raw) is int else " and not kwargs"
        out.append(f"{pad}if len(args) > {index}{keyword_free}:")
        out.append(f"{pad}    {var} = args[{index}]")
        out.append(f"{pad}else:")
        out.append(f"{pad}    raise _Slow")
        return var

    def read(where: tuple[Any, ...], path: str, out: list[str], pad: str) -> str:
        var = fetch(where, out, pad)
        parts = tuple(path.split("."))
        for n in range(1, len(parts) + 1):
            key = (where, parts[:n])
            if key in names:
                var = names[key]
                continue
            new = names[key] = f"v{len(names)}"
            part = parts[n - 1]
            out += [f"{pad}if type({var}) is dict:",
                    f"{pad}    {new} = {var}.get({part!r}, MISSING)",
                    f"{pad}elif {var} is MISSING:",
                    f"{pad}    {new} = MISSING",
                    f"{pad}elif known.get(type({var})) and token[0] == get_token():",
                    f"{pad}    {new} = getattr({var}, {part!r}, MISSING)",
                    f"{pad}else:",
                    f"{pad}    raise _Slow"]
            var = new
        return var

    lines = ["def first(instance, args, kwargs):"]
    if bypass_paths:
        body: list[str] = []
        for ref, path in bypass_paths:
            var = read(ref, path, body, "        ")
            body += [f"        if {var} is True:",
                     "            return BYPASS",
                     f"        if not ({var} is None or {var} is False or {var} is MISSING):",
                     "            raise _Slow"]
        lines += ["    try:", *body, "    except (TypeError, _Slow):", "        return general(instance, args, kwargs)"]
    for i in range(len(extra)):
        lines += [f"    if extra{i}(instance, args, kwargs):", "        return BYPASS"]
    if step_path is not None:
        body = []
        var = read(step_path[0], step_path[1], body, "        ")
        body += [f"        if type({var}) is int:", f"            return {var}"]
        lines += ["    try:", *body, "    except (TypeError, _Slow):", "        pass"]
    lines.append("    return step_of(instance, args, kwargs)")
    exec(compile("\n".join(lines) + "\n", "<skipweave gate>", "exec"), env)  # noqa: S102 - our own text
    fused: Callable[..., Any] = env["first"]
    fused.source = "\n".join(lines)  # type: ignore[attr-defined]
    return fused


__all__ = ["BYPASS", "CallFn", "Gate", "MAX_STEP_SET", "compile_bypass", "compile_gate", "compile_step",
           "eligible_steps"]
