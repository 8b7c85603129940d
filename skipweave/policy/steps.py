"""Step sources: where the training step of a call comes from.

The default, ``auto``, reads the step at ``step.path`` of the first argument when a path is set and the call has it
there (a role following verl's convention sets ``meta_info.global_steps``), else the step given to :func:`set_step`,
else a per-process call counter starting at 1. Other sources cover hosts that keep the step elsewhere
(``self.state.global_step`` in TRL-style trainers, sample ids such as ``sample_<epoch>_<index>``, or an explicit
:func:`set_step` call in the host's loop).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping
from typing import Any

from skipweave.config.schema import StepSourceConfig, StepSourceKind
from skipweave.policy.access import MISSING, get_arg, get_path
from skipweave.policy.expressions import Expression, ExpressionFailed

logger = logging.getLogger(__name__)

_explicit_step: int | None = None


class StepError(RuntimeError):
    """The configured step source gave no usable step for a call (the message names the key and what it found)."""


def set_step(step: int | None) -> None:
    """Set the current step for every role whose step source is ``set_step`` (verl's ``SkipManager`` style).

    Args:
        step: the training step (1-based in verl), or ``None`` to clear it.

    Raises:
        TypeError: ``step`` is not an int or None.
    """
    global _explicit_step
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"set_step expects an int or None, got {step!r}")
    _explicit_step = step


def get_step() -> int | None:
    """Return the step last given to :func:`set_step`, or ``None``."""
    return _explicit_step


def _as_step(value: Any) -> int | None:
    if value is MISSING or value is None or isinstance(value, bool):
        return None
    try:
        if hasattr(value, "item"):  # numpy / torch scalars
            value = value.item()
            if isinstance(value, bool):  # np.bool_ / a bool tensor: a flag, not a step (as Python's True)
                return None
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return int(value)  # an int subclass (IntEnum) as a plain int: `in range(...)` stays a C check
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    except (TypeError, ValueError):
        return None
    return None


class StepSource:
    """Compute the step of one call from a :class:`StepSourceConfig`.

    The call counter is per process and per source (one source per woven target and role) and
    only advances on calls that are not bypassed (the proxy calls :meth:`step_for` only then).
    """

    def __init__(self, cfg: StepSourceConfig, positions: Mapping[str, int] | None = None, *, name: str = "",
                 key: str = "skip.<role>.step") -> None:
        self.cfg = cfg
        self.positions = positions
        self.name = name
        self.key = key
        self._warned = False
        self._counter = itertools.count(1)
        self._pattern = re.compile(cfg.pattern) if cfg.pattern else None
        self.expression = (Expression(f"{key}.expr", cfg.expr, params=tuple(positions or ()))
                      if cfg.expr is not None else None)
        self.defaults: Mapping[str, Any] = {}  # parameter defaults of the target, for the expression

    def next_count(self) -> int:
        """Advance and return this source's call counter (1, 2, ...; thread-safe: one C call under the GIL)."""
        return next(self._counter)

    def step_for(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
        """Return the step of a call.

        Args:
            instance: the bound instance (``None`` for functions and static methods).
            args, kwargs: the call's arguments, as the host passed them.

        Raises:
            StepError: the source is ``arg``/``attr``/``regex``/``set_step``/``expr`` and gives nothing usable;
                the message names the key, the source and what it found.
        """
        cfg = self.cfg
        kind = cfg.source
        if kind is StepSourceKind.EXPR:
            assert self.expression is not None
            try:
                value = self.expression.evaluate(instance, args, kwargs, self.positions, defaults=self.defaults)
            except ExpressionFailed as exc:
                raise StepError(str(exc)) from None
            step = _as_step(value)
            if step is None:
                raise StepError(f"{self.key}.expr {cfg.expr!r} gave {_show(value)}, not an integer step")
            return step
        if kind is StepSourceKind.AUTO:
            if cfg.path is not None:
                step = _as_step(get_path(get_arg(args, kwargs, cfg.arg, self.positions), cfg.path))
                if step is not None:
                    return step
            if _explicit_step is not None:
                return _explicit_step
            if not self._warned:
                self._warned = True
                if cfg.path is not None:
                    logger.warning(
                        "skipweave: %s: argument %r has no '%s'; counting calls as steps (1, 2, …). If your step "
                        "lives elsewhere, set step.source (arg, attr, regex, expr or set_step)", self.name or "target",
                        cfg.arg, cfg.path,
                    )
                else:
                    logger.warning(
                        "skipweave: %s: no step source set and skipweave.set_step() not called; counting calls as "
                        "steps (1, 2, …). If your calls carry their step, set %s (source arg, attr, regex or expr, "
                        "or convention for a host's)", self.name or "target", self.key,
                    )
            return self.next_count()
        if kind is StepSourceKind.COUNTER:
            return self.next_count()
        if kind is StepSourceKind.SET_STEP:
            if _explicit_step is None:
                raise StepError(f"{self.key}.source=set_step, but skipweave.set_step(n) was never called")
            return _explicit_step
        if kind is StepSourceKind.ATTR:
            value = get_path(instance, cfg.path or "")
            step = _as_step(value)
            if step is None:
                raise StepError(f"{self.key}.path '{cfg.path}' (source attr) on {_held(instance)} gave "
                                f"{_show(value)}")
            return step
        arg = get_arg(args, kwargs, cfg.arg, self.positions)
        value = get_path(arg, cfg.path or "")
        if kind is StepSourceKind.REGEX:
            assert self._pattern is not None
            text = value if isinstance(value, str) else None
            match = self._pattern.search(text) if text is not None else None
            step = _as_step(match.group(1)) if match else None
            if step is None:
                raise StepError(
                    f"{self.key}.pattern {self._pattern.pattern!r} on argument {cfg.arg!r}{_at(cfg.path)} "
                    f"found no step in {_show(value)}"
                )
            return step
        step = _as_step(value)
        if step is None:
            where = "the call has no such argument" if arg is MISSING else f"argument {cfg.arg!r} is {_held(arg)}"
            named = f"{self.key}.path '{cfg.path}'" if cfg.path else f"{self.key}.arg {cfg.arg!r}"
            raise StepError(f"{named} (source arg) gave {_show(value)}, not an integer; {where}")
        return step


    def peek(self, instance: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int | None:
        """The step of a call if the source tells it without counting (a validation call, which must not
        advance the call counter), else ``None``: ``counter``, ``auto`` with no step on the call (and no
        :func:`set_step`), or a source that gives nothing usable."""
        cfg = self.cfg
        if cfg.source is StepSourceKind.COUNTER:
            return None
        if cfg.source is StepSourceKind.AUTO:
            step = (None if cfg.path is None
                    else _as_step(get_path(get_arg(args, kwargs, cfg.arg, self.positions), cfg.path)))
            return step if step is not None else _explicit_step
        try:
            return StepSource.step_for(self, instance, args, kwargs)
        except StepError:
            return None


def _at(path: str | None) -> str:
    """Where in the argument a step is read, for a message: `` path 'x.y'``, or nothing for the argument itself."""
    return f" path '{path}'" if path else ""


def _show(value: Any) -> str:
    return "nothing (path missing)" if value is MISSING else repr(value)[:80]


def _held(obj: Any) -> str:
    """What an object offers to a path, for a message: its type and its first keys or attributes."""
    if obj is None:
        return "None"
    if isinstance(obj, Mapping):
        names = [str(k) for k in list(obj)[:12]]
        return f"a {type(obj).__name__} with keys {names}"
    try:
        names = [k for k in vars(obj) if not k.startswith("_")][:12]
    except TypeError:
        return f"a {type(obj).__name__}"
    return f"a {type(obj).__name__} with attributes {names}"
