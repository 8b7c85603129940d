"""What integrations do when a plan is woven or unwoven: the :data:`WEAVE_HOOKS` registry.

:func:`skipweave.weave` weaves the targets of this process, then tells every registered hook the plan; a host
integration follows it there (Ray: make the workers of a later ``ray.init`` weave it too; verl: hand the roles
skipweave takes over from verl's own ``SkipManager``). :func:`skipweave.unweave` tells them that nothing is woven
any more. The weaving layer declares the registry and names no host; each integration adds its hook
(:mod:`skipweave.hooks`, see docs/architecture.md).

Light: imports nothing but :mod:`skipweave.hooks`, so a registration module can import it without the weaver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from skipweave.hooks import Registry

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig


class WeaveHook(Protocol):
    """Something an integration does after each weave and unweave of this process.

    Hooks run in registration order, in the thread that called :func:`skipweave.weave` /
    :func:`skipweave.unweave`; an exception propagates to that caller. Neither method may import its host:
    act at once when the host is imported already, else from a post-import hook.
    """

    def on_weave(self, plan: SkipConfig) -> None:
        """``plan`` is woven in this process (also when it was woven already, or has no enabled role)."""

    def on_unweave(self) -> None:
        """Nothing is woven in this process any more; undo what :meth:`on_weave` set up."""


WEAVE_HOOKS: Registry[WeaveHook] = Registry("weave hook")
"""The hooks :func:`skipweave.weave` and :func:`skipweave.unweave` call; integrations add theirs."""


def woven(plan: SkipConfig) -> None:
    """Tell every registered hook that ``plan`` is woven (see :meth:`WeaveHook.on_weave`)."""
    for hook in WEAVE_HOOKS:
        hook.on_weave(plan)


def unwoven() -> None:
    """Tell every registered hook that nothing is woven any more (see :meth:`WeaveHook.on_unweave`)."""
    for hook in WEAVE_HOOKS:
        hook.on_unweave()


__all__ = ["WEAVE_HOOKS", "WeaveHook", "unwoven", "woven"]
