"""The frozen context of one woven target: what every part of its call engine reads, built once at weave time.

A :class:`TargetContext` names the (role, target) pair, its store, its call ledger, its action, its declared effects,
its environment, the binding of its signature and the hook that shapes what a hit hands the host. The parts that settle
a call (:mod:`~skipweave.weaving.replay`, :mod:`~skipweave.weaving.record`, :mod:`~skipweave.weaving.asyncio_bridge`,
:mod:`~skipweave.weaving.engine`, :mod:`~skipweave.weaving.verifier`) receive it instead of the proxy, so the engine
has a direction: the proxy (:mod:`~skipweave.weaving.proxy`) assembles the context and the parts, and no part reads
anything back out of the proxy. docs/architecture.md follows one call through them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skipweave.weaving.environment import live_environment

if TYPE_CHECKING:
    from skipweave.config.schema import RoleConfig, TargetSpec
    from skipweave.report import TargetCounters
    from skipweave.store.step_store import StepStore
    from skipweave.weaving.actions import CallAction
    from skipweave.weaving.binding import Binding
    from skipweave.weaving.calls import CallLedger
    from skipweave.weaving.effects import DeclaredEffects

OnReplay = Callable[[Any, tuple[Any, ...], Mapping[str, Any]], Any]
"""The echo hook ``(recorded result, args, kwargs) -> what a hit hands the host`` (a proxy subclass's ``on_replay``)."""


class LiveEnvironment:
    """What a target's calls run with in this process (:func:`~skipweave.weaving.environment.live_environment` of the
    function the weaver patched): computed at the first call that records or replays, then kept (two threads racing
    compute equal values; the lock only keeps the work from being done twice). Recorded in each new entry's
    manifest; never changed.

    Args:
        role, target: the config of the pair.
        original: the function the weaver patched (``None`` for a target woven otherwise): whose source and package
            belong to the environment.
    """

    __slots__ = ("role", "target", "original", "_value", "_lock")

    def __init__(self, role: RoleConfig, target: TargetSpec, original: Callable[..., Any] | None) -> None:
        self.role, self.target, self.original = role, target, original
        self._value: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def value(self) -> dict[str, Any]:
        """The environment (a dict as :func:`~skipweave.weaving.environment.live_environment` builds it)."""
        env = self._value
        if env is None:
            with self._lock:
                env = self._value
                if env is None:
                    env = self._value = live_environment(self.role, self.target, self.original)
        return env


@dataclass(frozen=True, slots=True)
class TargetContext:
    """What the call engine of one (role, target) pair reads, fixed at weave time.

    Attributes:
        role: the validated role config.
        target: the target spec.
        store: the role's :class:`~skipweave.store.step_store.StepStore`.
        ledger: its calls' indices and running real calls (:class:`~skipweave.weaving.calls.CallLedger`).
        action: the role's action (:class:`~skipweave.weaving.actions.CallAction`): how a call's serving step is
            chosen, whether a miss is recorded, how the call is served and what is reported.
        effects: the role's declared effects and echoes (:class:`~skipweave.weaving.effects.DeclaredEffects`).
        counts: this target's counters (:func:`skipweave.report.for_target`).
        environment: what its calls run with (:class:`LiveEnvironment`).
        binding: how a call's arguments bind to the target's signature (:func:`~skipweave.weaving.binding.
            binding_of`); ``None``: calls are fingerprinted by the ``arguments`` rule.
        on_replay: the echo hook (:data:`OnReplay`): what a hit hands the host.
    """

    role: RoleConfig
    target: TargetSpec
    store: StepStore
    ledger: CallLedger
    action: CallAction[Any]
    effects: DeclaredEffects
    counts: TargetCounters
    environment: LiveEnvironment
    binding: Binding | None
    on_replay: OnReplay

    @property
    def note(self) -> str | None:
        """The role's ``note`` (the key its results are noted under; ``None``: the host's own)."""
        return self.role.note


__all__ = ["LiveEnvironment", "OnReplay", "TargetContext"]
