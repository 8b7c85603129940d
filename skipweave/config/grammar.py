"""The grammar of config expressions: what text is an expression, which names it reads, its compiled function.

Config validates an expression where it is written (a syntax error is a :class:`ConfigError` naming the key,
before anything is woven); the policy layer evaluates it on calls (:mod:`skipweave.policy.expressions`). Both
go through :func:`compile_expression`, so the two never disagree on what an expression is. This module
imports only the standard library and :mod:`skipweave.config.errors`: it is the part of expressions that
config may know (see docs/architecture.md).

Each expression becomes a function of exactly the names it reads: ``self``, ``args``, ``kwargs``, ``result``,
any parameter of the target by name, and any other name that is not a builtin's. Python's builtins are
available to it. A profile is code, as a Hydra ``_target_`` is: expressions run in the host process with the
host's privileges.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from skipweave.config.errors import ConfigError

RESERVED = ("self", "args", "kwargs", "result")
"""Names every expression may use besides the target's parameters."""


@dataclass(frozen=True)
class CompiledExpression:
    """One expression, parsed and compiled.

    Attributes:
        key: the config key it came from, e.g. ``skip.rollout.step.expr``.
        text: the expression, stripped.
        names: the names it reads, sorted; ``fn`` takes them in this order.
        fn: ``fn(*values_of_names)`` -> the expression's value.
        owner: for an assignable expression, the function giving the object assigned into (``a`` of ``a.b`` or
            ``a[k]``); ``None`` otherwise.
        attr: the attribute assigned (``b`` of ``a.b``), ``None`` for an item or a plain expression.
        item: for an item (``a[k]``), the function giving ``k``; ``None`` otherwise.
    """

    key: str
    text: str
    names: tuple[str, ...]
    fn: Callable[..., Any]
    owner: Callable[..., Any] | None = None
    attr: str | None = None
    item: Callable[..., Any] | None = None


def compile_expression(key: str, text: Any, *, assignable: bool = False,
                       params: Iterable[str] = ()) -> CompiledExpression:
    """Parse and compile one config expression.

    Args:
        key: the config key it came from (for messages).
        text: the Python expression (any value: a non-string is refused).
        assignable: the expression must name something a value can be assigned to (an attribute ``a.b`` or an
            item ``a[k]``), as ``effects`` and echo destinations do.
        params: the target's parameter names: one that is also a builtin's name (``type``, ``input``) means the
            parameter, as it would in the target's own body.

    Raises:
        ConfigError: ``text`` is not a string holding one Python expression (naming ``key``), or is not
            assignable when ``assignable`` is set.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(key, text, "a Python expression, e.g. 'self.state.global_step'")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(key, text, f"a Python expression (syntax error: {exc.msg})") from None
    stripped = text.strip()
    body = tree.body
    if assignable and not isinstance(body, (ast.Attribute, ast.Subscript)):
        raise ConfigError(key, text, "an attribute or an item to assign to, e.g. 'self.state.tokens_seen' or "
                                     "\"result['request_id']\"")
    names = _free_names(stripped, frozenset(params))
    filename = f"<{key}>"
    fn = _compile(body, names, filename)
    if not assignable:
        return CompiledExpression(key, stripped, names, fn)
    assert isinstance(body, (ast.Attribute, ast.Subscript))
    owner = _compile(body.value, names, filename)
    if isinstance(body, ast.Attribute):
        return CompiledExpression(key, stripped, names, fn, owner, attr=body.attr)
    return CompiledExpression(key, stripped, names, fn, owner, item=_compile(body.slice, names, filename))


def check_expression(key: str, value: Any, *, assignable: bool = False) -> str | None:
    """Validate a config expression as the proxy will compile it; return its text, ``None`` when unset.

    Raises:
        ConfigError: as :func:`compile_expression`.
    """
    if value is None:
        return None
    return compile_expression(key, value, assignable=assignable).text


def _free_names(text: str, params: frozenset[str]) -> tuple[str, ...]:
    """The names ``text`` reads from outside, in any of its scopes (a comprehension's own variables are not;
    the same name read outside the comprehension is): the reserved ones, the target's ``params``, and any
    other name that is not a builtin's."""
    table = symtable.symtable(f"lambda: (\n{text}\n)", "<expression>", "exec")
    found: set[str] = set()

    def walk(scope: symtable.SymbolTable) -> None:
        for child in scope.get_children():
            for sym in child.get_symbols():
                if sym.is_global() and sym.is_referenced():
                    found.add(sym.get_name())
            walk(child)

    walk(table)
    return tuple(sorted(n for n in found if n in RESERVED or n in params or not hasattr(builtins, n)))


def _compile(node: ast.expr, names: Sequence[str], filename: str) -> Callable[..., Any]:
    """A function of ``names`` (in order) returning ``node``'s value."""
    fn = ast.Expression(ast.Lambda(
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=node,
    ))
    ast.fix_missing_locations(fn)
    made: Callable[..., Any] = eval(compile(fn, filename, "eval"), {"__builtins__": builtins})  # noqa: S307
    return made


__all__ = ["RESERVED", "CompiledExpression", "check_expression", "compile_expression"]
