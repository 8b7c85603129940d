"""Coexistence with verl's own ``SkipManager``: exactly one mechanism acts on each rollout role.

verl 0.9.1 ships a ``SkipManager`` that reads the same top-level ``skip`` section as skipweave
(``skip.rollout``, ``skip.async_rollout``, ``skip.rollout_tq``) and decorates the same entry points.
With ``+skip=rollout_cache`` composed into verl's ``ppo_trainer`` config, both would act on
``rollout``, and verl would fail parsing the section: its ``SkipManagerConfig`` is a structured
config that knows ``enable``, ``dump_dir``, ``steps`` and ``action`` only, with ``steps`` a list and
``action`` one of ``cache``/``repeat``.

skipweave therefore wraps ``SkipManager.init(config)`` in every process that weaves a plan (a
post-import hook: verl is never imported for it). The wrapper hands verl a copy of the config whose
``skip`` section verl can parse:

- a verl role that skipweave acts on (an enabled skipweave role of the same name, or one of whose
  targets is that verl role's entry point) is passed to verl disabled;
- skipweave's own keys (``targets``, ``namespace``, ``step`` …) are removed from every role, and
  values verl rejects are replaced by verl's defaults (``steps: all`` → ``[]``, ``action:
  repeat_last`` → ``cache``) for the roles verl keeps;
- roles skipweave does not act on keep verl's own settings, so verl's SkipManager still serves them.

This happens after each weave and unweave of the process (:data:`COEXISTENCE`, a weave hook the verl integration
registers when verl is installed: every process that weaves loads it, a Ray worker running verl's trainer too).

One log line (WARNING, so that it shows in verl's logs) per verl role that either mechanism acts on
says which one does. The host's own config object is never
modified (verl's V1 trainer reads ``config.skip.rollout_tq.enable`` to leave out its async warm-up
batches, exactly as with verl's own skip).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import wrapt

from skipweave.weaving.unpatch import remove_wrapper

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig

logger = logging.getLogger(__name__)

SKIP_MANAGER_MODULE = "verl.utils.skip.skip_manager"
"""The module defining verl's ``SkipManager``."""

VERL_ROLE_OF_TARGET: dict[str, str] = {
    "verl.experimental.agent_loop.agent_loop.AgentLoopManager.generate_sequences": "rollout",
    "verl.experimental.fully_async_policy.fully_async_rollouter.FullyAsyncAgentLoopManager.generate_sequences_single": (
        "async_rollout"
    ),
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._add_batch_to_generate": "rollout_tq",
    "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.sample": "rollout_tq",
    "verl.trainer.ppo.v1.replay_buffer.ReplayBufferAsync.sample": "rollout_tq",
}
"""verl's entry points decorated by its ``SkipManager``, and the verl role each belongs to."""

VERL_ROLES = ("rollout", "async_rollout", "rollout_tq")
"""verl 0.9.1's skip roles (read from ``SkipManagerConfig`` at run time when verl is present)."""

_VERL_ACTIONS = ("cache", "repeat")
_VERL_DEFAULTS: dict[str, Any] = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}


@dataclasses.dataclass
class _State:
    plan: SkipConfig | None = None
    hook_registered: bool = False
    handle: Any = None  # our FunctionWrapper on SkipManager.init
    owner: Any = None


_STATE = _State()
_lock = threading.RLock()


def taken_roles(plan: SkipConfig | None) -> dict[str, str]:
    """Return ``{verl role: skipweave role}`` for the verl roles the woven ``plan`` acts on."""
    taken: dict[str, str] = {}
    if plan is None:
        return taken
    for role in plan.enabled_roles:
        if role.role in VERL_ROLES:
            taken.setdefault(role.role, role.role)
        for target in role.targets:
            verl_role = VERL_ROLE_OF_TARGET.get(target.path.replace(":", "."))
            if verl_role is not None:
                taken.setdefault(verl_role, role.role)
    return taken


def follow(plan: SkipConfig | None) -> None:
    """Track the plan woven in this process (``None``: unwoven); wrap ``SkipManager.init`` while one is.

    Called after each weave and unweave (:class:`Coexistence`). Imports nothing of verl: the
    wrapper is installed when verl's ``skip_manager`` module is imported, or now if it already is.
    A ``SkipManager`` initialised before the weave has the roles skipweave takes switched off now.
    """
    import sys

    with _lock:
        _STATE.plan = plan if plan is not None and plan.enabled_roles else None
        if _STATE.plan is None:
            _unwrap()
            return
        module = sys.modules.get(SKIP_MANAGER_MODULE)
        if module is not None:
            _wrap(module)
            _disable_live_instances(module)
        elif not _STATE.hook_registered:
            wrapt.register_post_import_hook(_on_import, SKIP_MANAGER_MODULE)
            _STATE.hook_registered = True


def _on_import(module: Any) -> None:
    with _lock:
        if _STATE.plan is not None:
            _wrap(module)


def _wrap(module: Any) -> None:
    owner = getattr(module, "SkipManager", None)
    if owner is None or _STATE.handle is not None:
        return
    _STATE.handle = wrapt.wrap_function_wrapper(owner, "init", _init_wrapper)
    _STATE.owner = owner
    logger.debug("skipweave: wrapped verl's SkipManager.init")


def _unwrap() -> None:
    handle, owner = _STATE.handle, _STATE.owner
    _STATE.handle = _STATE.owner = None
    if handle is None:
        return
    if remove_wrapper(owner, "init", handle) is not None:
        logger.debug("skipweave: SkipManager.init stays wrapped under another wrapper (passes through now)")


def _init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with _lock:
        plan = _STATE.plan
    if plan is None:  # unwoven since: verl alone
        return wrapped(*args, **kwargs)
    config = args[0] if args else kwargs.get("config")
    taken = taken_roles(plan)
    try:
        handed = verl_view(config, taken)
    except Exception as exc:  # noqa: BLE001 - never break verl's start-up over a log-worthy oddity
        logger.warning("skipweave: could not prepare verl's skip section (%s: %s); verl's SkipManager sees it "
                       "unchanged", type(exc).__name__, exc)
        return wrapped(*args, **kwargs)
    result = wrapped(handed, *args[1:], **{k: v for k, v in kwargs.items() if k != "config"})
    _log_owners(config, taken)
    return result


def verl_view(config: Any, taken: Mapping[str, str]) -> Any:
    """Return a copy of verl's ``config`` whose ``skip`` section verl's ``SkipManagerConfig`` accepts.

    Roles in ``taken`` are disabled for verl; every role keeps only the keys verl knows, with values
    verl rejects replaced by its defaults. ``config`` itself is not modified.

    Args:
        config: verl's whole config (an OmegaConf ``DictConfig``).
        taken: ``{verl role: skipweave role}`` (see :func:`taken_roles`).
    """
    from omegaconf import OmegaConf, open_dict

    skip = OmegaConf.select(config, "skip", default=None)
    if skip is None:
        return config
    raw = OmegaConf.to_container(skip, resolve=True) if OmegaConf.is_config(skip) else dict(skip)
    assert isinstance(raw, dict)
    handed = copy.copy(config)
    with open_dict(handed):
        handed.skip = sanitize_skip({str(k): v for k, v in raw.items()}, taken)
    return handed


def sanitize_skip(raw: Mapping[str, Any], taken: Mapping[str, str]) -> dict[str, Any]:
    """Return verl's view of a ``skip`` mapping (plain containers); see :func:`verl_view`."""
    fields = _verl_fields()
    out: dict[str, Any] = {k: v for k, v in raw.items() if k.startswith("_") and k.endswith("_")}
    for role, known in fields.items():
        node = raw.get(role)
        if node is None or isinstance(node, bool):
            node = {"enable": bool(node)} if isinstance(node, bool) else {}
        if not isinstance(node, Mapping):
            node = {}
        kept = {k: v for k, v in node.items() if k in known}
        if "_target_" in node and "_target_" in known:
            kept["_target_"] = node["_target_"]
        for key, default in _VERL_DEFAULTS.items():
            if key in known and not _valid(key, kept.get(key)):
                kept[key] = copy.copy(default)
        if role in taken:
            kept["enable"] = False
        out[role] = kept
    return out


def _valid(key: str, value: Any) -> bool:
    if key == "enable":
        return isinstance(value, bool)
    if key == "dump_dir":
        return isinstance(value, str) and value not in ("", "???")
    if key == "steps":
        return isinstance(value, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    if key == "action":
        return value in _VERL_ACTIONS
    return True


def _verl_fields() -> dict[str, set[str]]:
    """Return ``{role: field names}`` of verl's ``SkipManagerConfig`` (verl is imported by now)."""
    try:
        from verl.utils.skip.config import SkipManagerConfig

        roles: dict[str, set[str]] = {}
        for f in dataclasses.fields(SkipManagerConfig):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                roles[f.name] = {g.name for g in dataclasses.fields(default)}
        if roles:
            return roles
    except Exception as exc:  # noqa: BLE001 - another verl layout: fall back to 0.9.1's
        logger.debug("skipweave: verl's SkipManagerConfig not introspectable (%s); assuming verl 0.9.1's", exc)
    return {role: {"_target_", *_VERL_DEFAULTS} for role in VERL_ROLES}


def _log_owners(config: Any, taken: Mapping[str, str]) -> None:
    from omegaconf import OmegaConf

    for role in VERL_ROLES:
        verl_enabled = OmegaConf.select(config, f"skip.{role}.enable", default=False) is True
        # WARNING level: verl's runs log at WARNING, and which mechanism acts must be visible.
        if role in taken:
            logger.warning(
                "skipweave: verl role '%s' is recorded and replayed by skipweave (skip.%s); verl's own "
                "SkipManager is switched off for it", role, taken[role],
            )
        elif verl_enabled:
            logger.warning("skipweave: verl role '%s' is served by verl's own SkipManager (no enabled skipweave "
                           "role acts on it)", role)


def _disable_live_instances(module: Any) -> None:
    """Switch off verl's skip instances of the roles skipweave takes, when verl initialised them already."""
    manager = getattr(module, "SkipManager", None)
    instances = getattr(manager, "skip_instances", None)
    if not isinstance(instances, dict):
        return
    for role, by in taken_roles(_STATE.plan).items():
        instance = instances.get(role)
        if instance is not None and getattr(instance, "enable", False):
            instance.enable = False
            logger.warning("skipweave: verl role '%s' is recorded and replayed by skipweave (skip.%s); verl's own "
                           "SkipManager, initialised before the weave, is switched off for it", role, by)


class Coexistence:
    """The weave hook that hands each verl role to exactly one of skipweave and verl's ``SkipManager``."""

    def on_weave(self, plan: SkipConfig) -> None:
        """Follow ``plan``: verl's ``SkipManager`` leaves the roles it acts on to skipweave (:func:`follow`)."""
        follow(plan)

    def on_unweave(self) -> None:
        """Nothing is woven: verl's ``SkipManager`` is left alone again."""
        follow(None)


COEXISTENCE = Coexistence()
"""The :class:`Coexistence` the verl integration registers."""
