"""The public functions behind ``skipweave.weave``, ``unweave``, ``set_step`` and ``counters``.

:func:`weave` is one of the entry points that assemble the system: it loads the integrations of the environment
(once per process, :func:`skipweave.integrations.discovery.load_integrations`) before it reads a config, so that
their config adapters, host types, result notes and weave hooks take part. What a host integration does beside the
weave (propagate the plan to Ray workers, coexist with verl's own ``SkipManager``) is such a weave hook
(:data:`skipweave.weaving.weave_hooks.WEAVE_HOOKS`); this module names no integration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skipweave.config.loader import load_skip_config
from skipweave.config.schema import SkipConfig
from skipweave.integrations.discovery import load_integrations
from skipweave.policy.steps import set_step
from skipweave.report import counters
from skipweave.weaving import weave_hooks
from skipweave.weaving.weaver import WEAVER, Patch

__all__ = ["counters", "load_integrations", "set_step", "unweave", "weave", "woven_plan"]


def weave(
    cfg: Any = None,
    *,
    profile: str | Sequence[str] | None = None,
    overrides: Sequence[str] = (),
) -> list[Patch]:
    """Patch every target of every enabled role (loading the integrations of the environment first, once per
    process).

    Args:
        cfg: the application's whole config — a mapping or OmegaConf ``DictConfig`` with a top-level
            ``skip`` node (other nodes are read for legacy verl keys), or a :class:`SkipConfig`.
        profile: a profile composed with Hydra on top of ``cfg`` (or instead of it): a shipped name
            (``"rollout_cache"``), a path to a YAML file (``"./my_profile.yaml"``: ends in ``.yaml``/``.yml``
            or holds a ``/``; relative to the working folder, ``~`` expanded) or a name found as
            ``<name>.yaml`` in a folder of ``SKIPWEAVE_PROFILE_PATH`` (a path wins, then the search path,
            then the shipped names). Several — a list, or one comma-separated string — compose in order,
            later ones winning. See :func:`skipweave.config.profiles.compose_profile`.
        overrides: Hydra command-line style overrides applied with ``profile``, winning over every
            profile (e.g. ``["skip.rollout.dump_dir=/tmp/d", "+skip.rollout.targets.gen=pkg.mod:Gen.run"]``).

    Returns:
        The patches, applied or waiting for their module's first import. Weaving the plan already
        woven is a no-op (no double wrap); another plan replaces the current one.

    Raises:
        skipweave.ConfigError: a bad value (naming key, value and what is allowed), a profile that is
            found nowhere or a profile file that is missing, not valid YAML or holds a top-level key besides
            ``skip`` and ``defaults`` (key ``profile``); nothing is patched.
        skipweave.weaving.resolve.TargetNotFound: a non-optional target does not resolve; nothing is patched.
    """
    load_integrations()  # first: their config adapters read cfg, their profiles may be selected
    if profile is not None:
        from skipweave.config.profiles import compose_profile

        cfg = compose_profile(profile, overrides=overrides, base=cfg)
    elif overrides:
        raise TypeError("overrides= needs profile=; put plain values into cfg instead")
    plan = cfg if isinstance(cfg, SkipConfig) else load_skip_config(cfg)
    patches = WEAVER.weave(plan)
    weave_hooks.woven(plan)  # the integrations follow the plan (e.g. into the workers of a cluster)
    return patches


def unweave() -> None:
    """Remove every skipweave patch of this process and restore the originals exactly."""
    WEAVER.unweave()
    weave_hooks.unwoven()


def woven_plan() -> SkipConfig | None:
    """Return the plan currently woven in this process, or ``None``."""
    return WEAVER.plan
