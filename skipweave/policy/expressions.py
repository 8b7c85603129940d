"""Expressions in the config: Python over ``self``, the target's parameters by name, ``args`` and ``kwargs``.

A profile for a trainer that is not verl-shaped says where its step lives, which calls are not training
calls, which live values a replay must carry and which attributes the target changes::

    step:   {expr: "self.state.global_step"}
    bypass: {expr: "not self.model.training"}
    echo:   {"result.meta_info['uid']": "prompts.meta_info['uid']"}
    effects: ["self._metrics", "self.state.num_input_tokens_seen"]

Each expression is compiled once, when the plan is parsed (a syntax error is a :class:`ConfigError` naming
the key), into a function of exactly the names it uses: ``self`` (the bound instance, ``None`` for a
plain function), ``args``/``kwargs`` (the call's arguments as passed), ``result`` (echo destinations) and
any parameter of the target by name, found whether the host passed it by position or by keyword. Python's
builtins are available (the grammar is :mod:`skipweave.config.grammar`, shared with config's validation).
A profile is code, as a Hydra ``_target_`` is: expressions run in the host process
with the host's privileges; take profiles only from people you would take code from.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any

from skipweave.config.grammar import RESERVED, compile_expression
from skipweave.policy.access import MISSING, get_arg

logger = logging.getLogger(__name__)


class ExpressionFailed(Exception):
    """An expression raised (or named a parameter the call did not pass) while evaluated on a call."""


class Expression:
    """One compiled config expression.

    Args:
        key: the config key it came from, e.g. ``skip.rollout.step.expr`` (for messages).
        text: the Python expression.
        assignable: the expression must name something a value can be assigned to (an attribute
            ``a.b`` or an item ``a[k]``), as ``effects`` and echo destinations do.
        params: the target's parameter names: one that is also a builtin's name (``type``, ``input``) means the
            parameter, as it would in the target's own body.

    Raises:
        ConfigError: ``text`` is not a string holding one Python expression (naming ``key``), or is not
            assignable when ``assignable`` is set.
    """

    def __init__(self, key: str, text: Any, *, assignable: bool = False, params: Iterable[str] = ()) -> None:
        compiled = compile_expression(key, text, assignable=assignable, params=params)
        self.key, self.text, self.names = compiled.key, compiled.text, compiled.names
        self._fn = compiled.fn
        self._owner = compiled.owner
        self._attr = compiled.attr
        self._item = compiled.item
        self._warned = False
        self._lock = threading.Lock()

    def _values(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                positions: Mapping[str, int] | None, result: Any, defaults: Mapping[str, Any]) -> list[Any]:
        out = []
        for name in self.names:
            if name == "self":
                out.append(instance)
            elif name == "args":
                out.append(args)
            elif name == "kwargs":
                out.append(kwargs)
            elif name == "result":
                out.append(result)
            else:
                value = get_arg(args, kwargs, name, positions)
                if value is MISSING:
                    value = defaults.get(name, MISSING)
                if value is MISSING:
                    raise ExpressionFailed(f"the call passed no argument {name!r}")
                out.append(value)
        return out

    def evaluate(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 positions: Mapping[str, int] | None = None, *, result: Any = None,
                 defaults: Mapping[str, Any] | None = None) -> Any:
        """Evaluate over one call.

        ``positions`` maps parameter names to their index in ``args``; ``defaults`` gives the value of a
        parameter the call did not pass (the target's signature defaults).

        Raises:
            ExpressionFailed: the expression raised, or used a parameter the call did not pass; the message
                names the key, the expression, the error and the type of ``self``.
        """
        try:
            return self._fn(*self._values(instance, args, kwargs, positions, result, defaults or {}))
        except ExpressionFailed as exc:
            raise ExpressionFailed(self._explain(instance, str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - whatever the host's objects raise, reported for the config
            raise ExpressionFailed(self._explain(instance, f"{type(exc).__name__}: {exc}")) from None

    def bind(self, positions: Mapping[str, int] | None,
             defaults: Mapping[str, Any]) -> Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any]:
        """Return ``fast(instance, args, kwargs)``: the expression's value with its parameter lookups compiled in.

        For the proxies' hot path. It gives what :meth:`evaluate` gives, but raises the host's own exception
        (or :class:`ExpressionFailed` for a parameter the call did not pass) without the config-naming message:
        on any exception, call :meth:`evaluate` for the message. ``result`` is ``None`` in it.
        """
        env: dict[str, Any] = {"_fn": self._fn, "_absent": _absent}
        values = []
        for name in self.names:
            if name == "self":
                values.append("instance")
            elif name in ("args", "kwargs"):
                values.append(name)
            elif name == "result":
                values.append("None")
            else:  # an identifier (a free name of a parsed expression): safe to write into the source
                index = positions.get(name) if positions is not None else None
                if name in defaults:
                    env[f"_d_{name}"] = defaults[name]
                    fallback = f"_d_{name}"
                else:
                    fallback = f"_absent({name!r})"
                by_position = f"args[{index}] if len(args) > {index} else " if index is not None else ""
                values.append(f"(kwargs[{name!r}] if {name!r} in kwargs else {by_position}{fallback})")
        source = f"def fast(instance, args, kwargs):\n    return _fn({', '.join(values)})\n"
        exec(compile(source, f"<{self.key}>", "exec"), env)  # noqa: S102 - our own text over checked names
        fast: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any] = env["fast"]
        return fast

    def assign(self, value: Any, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
               positions: Mapping[str, int] | None = None, *, result: Any = None,
               defaults: Mapping[str, Any] | None = None) -> None:
        """Put ``value`` where the (assignable) expression points, in place when both are containers.

        A mapping already there is updated in place (its type kept: a ``defaultdict`` stays one, nested
        mappings are restored the same way), a list is refilled in place; anything else is assigned.

        Raises:
            ExpressionFailed: as :meth:`evaluate`.
        """
        assert self._owner is not None
        try:
            values = self._values(instance, args, kwargs, positions, result, defaults or {})
            owner = self._owner(*values)
            if self._attr is not None:
                current = getattr(owner, self._attr, MISSING)
                if not restore_in_place(current, value):
                    setattr(owner, self._attr, value)
            else:
                assert self._item is not None
                item = self._item(*values)
                try:
                    current = owner[item]
                except (KeyError, IndexError, TypeError):
                    current = MISSING
                if not restore_in_place(current, value):
                    owner[item] = value
        except ExpressionFailed as exc:
            raise ExpressionFailed(self._explain(instance, str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - reported for the config, never a traceback through skipweave
            raise ExpressionFailed(self._explain(instance, f"{type(exc).__name__}: {exc}")) from None

    def warn_once(self, exc: ExpressionFailed, then: str) -> None:
        """Log one WARNING for this expression's first failure (later ones at DEBUG); ``then`` says what the
        proxy does instead."""
        with self._lock:
            first, self._warned = not self._warned, True
        (logger.warning if first else logger.debug)("skipweave: %s; %s", exc, then)

    def _explain(self, instance: Any, what: str) -> str:
        on = "a plain function (self is None)" if instance is None else f"an instance of {type(instance).__name__}"
        return f"{self.key} {self.text!r} failed on {on}: {what}"


def _absent(name: str) -> Any:
    raise ExpressionFailed(f"the call passed no argument {name!r}")


def restore_in_place(current: Any, value: Any) -> bool:
    """Make ``current`` hold ``value`` without replacing it, when both are mappings or both sequences.

    Returns False (nothing done) otherwise, so the caller assigns. Nested containers present on both sides (a mapping's
    value under the same key, a sequence's item at the same index) are restored in place too, so references the host
    holds to them (and their types) survive. A key a ``defaultdict`` lacks gets a fresh value of its
    ``default_factory``, filled in place, so it has the type the host's own access would have made (a bounded deque of
    a ``defaultdict(lambda: deque(maxlen=n))``), not the plain list of the recording; a factory that raises gives the
    recorded value as it is (the restore is never left half done). A ``deque`` is emptied and extended, which keeps
    its ``maxlen`` (it takes no slice assignment). A container met again below itself (a cycle, on either side) is
    restored once.
    """
    return _restore(current, value, set())


def _restore(current: Any, value: Any, seen: set[tuple[int, int]]) -> bool:
    pair = (id(current), id(value))
    if pair in seen:  # a cycle: restored (or being restored) above
        return True
    if isinstance(current, MutableMapping) and isinstance(value, Mapping):
        seen.add(pair)
        for key in [k for k in current if k not in value]:
            del current[key]
        factory = current.default_factory if isinstance(current, defaultdict) else None
        for key, item in value.items():
            if key in current:
                if _restore(current[key], item, seen):
                    continue
            elif factory is not None:
                fresh = _fresh(factory)
                if fresh is not None and _restore(fresh, item, seen):
                    current[key] = fresh
                    continue
            current[key] = item
        return True
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return False
    if not isinstance(current, (deque, MutableSequence)):
        return False
    seen.add(pair)
    items = list(value)
    for i, item in enumerate(items[:len(current)]):
        if _restore(current[i], item, seen):
            items[i] = current[i]  # the host's own container, now holding the recorded value
    if isinstance(current, deque):
        current.clear()
        current.extend(items)
    else:
        current[:] = items
    return True


def _fresh(factory: Any) -> Any:
    """A ``defaultdict``'s ``factory()``, or ``None`` when it raises (the recorded value is then taken as it is)."""
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - the host's own callable: whatever it raises, the restore goes on
        logger.debug("skipweave: a defaultdict factory raised %s: %s; the recorded value is restored as it is",
                     type(exc).__name__, exc)
        return None


def parse_expression(key: str, value: Any, *, assignable: bool = False) -> Expression | None:
    """``None`` for an unset value, else the compiled :class:`Expression` (see there for the errors)."""
    return None if value is None else Expression(key, value, assignable=assignable)


__all__ = ["Expression", "ExpressionFailed", "RESERVED", "parse_expression", "restore_in_place"]
