"""Actions as objects: one class per value of ``skip.<role>.action``, which says all a call engine asks of it.

An action says

- how it chooses the serving step of a call (:meth:`CallAction.serving_step`; the step choice itself is
  :func:`skipweave.policy.actions.choose_step`'s), and whether that needs the store's recorded steps
  (:meth:`CallAction.own_step_only`);
- whether it writes the store (:attr:`CallAction.records`: a miss is recorded, an unusable entry set aside, a part
  prepared) and whether validation calls go to the store (:attr:`CallAction.takes_validation`);
- how a call whose serving step is chosen is served, and what is reported of it (:meth:`CallAction.sync_call` and
  :meth:`CallAction.async_call`, given the target's call engine).

The replaying actions (``cache``, ``repeat``, ``repeat_cycle``, ``repeat_last``) live in
:mod:`~skipweave.weaving.engine`, beside the replay-or-record path they share; ``verify`` is
:class:`~skipweave.weaving.verifier.Verify`. A class names its action with ``kind=`` and is registered by it
(:func:`action_for`), so a new action is one class in one module (docs/architecture.md, "Adding an action").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from skipweave.config.schema import Action, RoleConfig
from skipweave.policy.actions import choose_step

if TYPE_CHECKING:
    from skipweave.weaving.calls import Call

E = TypeVar("E")
"""The call engine an action serves calls through (:class:`~skipweave.weaving.engine.CallEngine`)."""

ACTIONS: dict[Action, type[CallAction[Any]]] = {}
"""``skip.<role>.action`` -> the class serving it, filled by each class's ``kind=`` (see :func:`action_for`)."""


class CallAction(Generic[E]):
    """What a role's action does with its eligible calls (one instance per woven target, see :func:`action_for`).

    Subclass with ``class Mine(CallAction[CallEngine], kind=Action.MINE)``: the class is then what
    :func:`action_for` builds for a role whose action is ``mine``.

    Args:
        role: the validated role config.

    Attributes:
        records: a miss is recorded, and the store is written (parts prepared, unusable entries set aside); ``False``
            for an action that only reads the store (verify).
        takes_validation: validation calls (the bypass let them through) go to the store even when the role neither
            records nor replays them (``record_validation``, ``replay_only``).
        validation_fate: what becomes of a call the bypass takes for a validation call, for messages (``""``: as the
            role's ``record_validation`` and ``replay_only`` say).
    """

    kind: ClassVar[Action]
    records: ClassVar[bool] = True
    takes_validation: ClassVar[bool] = False
    validation_fate: ClassVar[str] = ""

    def __init_subclass__(cls, kind: Action | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind is not None:
            cls.kind = kind
            ACTIONS[kind] = cls

    def __init__(self, role: RoleConfig) -> None:
        self.role = role

    # ------------------------------------------------------------------ choosing the serving step
    def own_step_only(self, validation: bool) -> bool:
        """Whether only the call's own step may serve it (no scan of the store's recorded steps, no single flight);
        always so for a validation call (recorded apart, matched as ``cache`` matches)."""
        return validation

    def serving_step(self, step: int, recorded: Sequence[int], validation: bool = False) -> int | None:
        """The recorded step that serves a call at ``step`` (``recorded``: sorted steps with a complete recording of
        its target and shard), or ``None``: it runs live (and is recorded when :attr:`records`)."""
        kind = Action.CACHE if self.own_step_only(validation) else self.kind
        return choose_step(kind, step, recorded, self.role.record_steps)

    # ------------------------------------------------------------------ serving
    def sync_call(self, engine: E, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  d: Call) -> Any:
        """Serve ``d``, a plain call whose serving step is chosen (``d.served``), in the host's thread; return what
        the host gets."""
        raise NotImplementedError(f"{type(self).__name__}.sync_call")

    async def async_call(self, engine: E, wrapped: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any], d: Call, maybe_sync: bool) -> Any:
        """Serve ``d``, an awaited call whose serving step is chosen, from a coroutine (store work off the event loop);
        ``maybe_sync``: the target is a sync-or-await helper, whose result is awaited only when it is awaitable."""
        raise NotImplementedError(f"{type(self).__name__}.async_call")


def action_class(role: RoleConfig) -> type[CallAction[Any]]:
    """The class serving ``role``'s action (its class attributes, :attr:`~CallAction.records` and the like, answer
    without building one).

    Raises:
        ValueError: no class serves the role's action (its module was never imported: the proxy imports those of
            skipweave's own actions).
    """
    cls = ACTIONS.get(role.action)
    if cls is None:
        raise ValueError(f"skip.{role.role}.action: no class serves action {role.action.value!r} (known: "
                         f"{', '.join(sorted(a.value for a in ACTIONS))}); a new action registers with kind=")
    return cls


def action_for(role: RoleConfig) -> CallAction[Any]:
    """The action object of one woven target of ``role`` (one per target: an action may keep per-target state, as
    verify's warnings said once).

    Raises:
        ValueError: no class serves the role's action (see :func:`action_class`).
    """
    return action_class(role)(role)


__all__ = ["ACTIONS", "CallAction", "action_class", "action_for"]
