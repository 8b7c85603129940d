"""Bypass predicates: calls that always run live, record nothing and advance no counter.

The default follows verl: a call whose first argument has ``meta_info["validate"]`` truthy is a
validation pass and is never recorded or replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from skipweave.config.schema import BypassConfig, BypassKind
from skipweave.policy.access import MISSING, get_arg, get_path


def truthy(value: Any) -> bool:
    """Whether a bypass flag is set: ``True``, a truthy value, or an array with any element set (numpy, torch);
    a value whose truth cannot be told (it raises) is not set."""
    if value is MISSING or value is None or value is False:
        return False
    if value is True:
        return True
    if hasattr(value, "any") and callable(value.any):  # numpy / torch arrays: any element set
        try:
            return bool(value.any())
        except (TypeError, ValueError):
            return False
    try:
        return bool(value)
    except (TypeError, ValueError):
        return False


def describe_bypass(cfg: BypassConfig, key: str) -> str:
    """The bypass rule ``cfg`` as a person reads it in a message, under its config ``key`` (``skip.reward.bypass``):
    ``skip.reward.bypass.expr="..."``, ``skip.rollout.bypass (meta_info.validate of argument 0)``."""
    if cfg.when is BypassKind.EXPR:
        return f"{key}.expr={cfg.expr!r}"
    if cfg.when is BypassKind.CALLABLE:
        return f"{key}.callable={cfg.callable}"
    if cfg.when is BypassKind.NEVER:
        return f"{key} (never; a proxy class of the target decides)"
    if not cfg.paths:
        return f"{key} (never: no bypass.paths)"
    return f"{key} ({' or '.join(cfg.paths)} of argument {cfg.arg!r})"


def make_bypass(
    cfg: BypassConfig, resolve: Callable[[str], Any], positions: Mapping[str, int] | None = None
) -> Callable[[tuple[Any, ...], Mapping[str, Any]], bool]:
    """Build the predicate ``(args, kwargs) -> bool`` for one role.

    Args:
        cfg: the role's bypass settings.
        resolve: turns ``pkg.mod:fn`` into the function (for ``when: callable``).
        positions: parameter name -> position, so ``arg: prompts`` also finds a positional ``prompts``.

    Raises:
        ImportError, AttributeError: the configured callable does not resolve.
    """
    if cfg.when in (BypassKind.NEVER, BypassKind.EXPR):  # an expression is evaluated by the proxy (over self)
        return lambda args, kwargs: False
    if cfg.when is BypassKind.CALLABLE:
        assert cfg.callable is not None
        fn = resolve(cfg.callable)
        return lambda args, kwargs: bool(fn(args, kwargs))
    ref, paths = cfg.arg, cfg.paths
    if not paths:  # bypass.when=arg with no paths (the default when no convention names one): never
        return lambda args, kwargs: False

    def predicate(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        arg = get_arg(args, kwargs, ref, positions)
        if arg is MISSING:
            return False
        for p in paths:
            if truthy(get_path(arg, p)):
                return True
        return False

    return predicate
