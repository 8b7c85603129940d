"""Turn an application's whole config (mapping or OmegaConf node) into a validated :class:`SkipConfig`."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from skipweave.config.adapters import CONFIG_ADAPTERS
from skipweave.config.containers import MISSING, plain
from skipweave.config.env_keys import resolve_env
from skipweave.config.errors import ConfigError
from skipweave.config.parse import parse_skip
from skipweave.config.schema import SkipConfig

NULL_MEANS_DEFAULT = (
    "convention",
    "enable",
    "action",
    "steps",
    "record_steps",
    "dump_dir",
    "namespace",
    "shard",
    "restore_rng",
    "allow_pickle",
    "calls_per_step",
    "targets",
)
"""Role keys that a ``null`` (or ``???``) leaves at their default: dropped before adapters fill them."""


def to_container(cfg: Any) -> dict[str, Any]:
    """Return ``cfg`` as plain nested dicts/lists, resolving OmegaConf interpolations.

    Args:
        cfg: ``None``, a ``Mapping`` or an OmegaConf ``DictConfig``.

    Raises:
        ConfigError: ``cfg`` is neither.
    """
    if cfg is None:
        return {}
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        container = OmegaConf.to_container(cfg, resolve=True)
        if not isinstance(container, dict):
            raise ConfigError("<config>", type(cfg).__name__, "a mapping with a top-level 'skip' node")
        return container  # type: ignore[return-value]
    if isinstance(cfg, Mapping):
        return {str(k): plain(v) for k, v in cfg.items()}
    raise ConfigError("<config>", type(cfg).__name__, "a mapping or OmegaConf DictConfig with a top-level 'skip' node")


def drop_unset(container: dict[str, Any]) -> dict[str, Any]:
    """Return ``container`` with the keys of :data:`NULL_MEANS_DEFAULT` that a role leaves ``null`` or ``???``
    dropped, so that an adapter may fill them and the schema's default applies otherwise (``container`` is not
    modified; a ``skip`` that is no mapping is left for :func:`parse_skip` to report)."""
    skip = container.get("skip")
    if not isinstance(skip, Mapping):
        return container
    roles = {
        name: {k: v for k, v in role.items() if not ((v is None or v == MISSING) and k in NULL_MEANS_DEFAULT)}
        if isinstance(role, Mapping) else role
        for name, role in skip.items()
    }
    return {**container, "skip": roles}


FOLLOWED_KEYS = ("dump_dir", "namespace", "steps")
"""What a role with ``follows: <role>`` takes from that role when it leaves them unset: the step's store and steps."""

FOLLOWED_FINGERPRINT_KEYS = ("env",)
"""What such a role takes from the followed role's ``fingerprint`` when its own leaves them unset (absent, ``null`` or
``???``): the config keys whose values belong to every entry's environment, so that a replayed phase notices the
same change of model or sampling settings its rollout does. ``env: []`` keeps a role's own (none)."""


def check_follows(container: dict[str, Any]) -> None:
    """Check that every role's ``follows`` names another role of the config.

    A phase profile composed without a rollout profile still has a ``rollout`` role: each phase profile declares
    ``skip.rollout``'s store keys (``???``), so the shipped profiles and their combinations pass.

    Raises:
        ConfigError: key ``skip.<role>.follows``, naming the value and the roles the config has: a typo
            (``follows: rollouts``) would otherwise leave the role on skipweave's default store, apart from the
            step's other phases, with no word said.
    """
    skip = container.get("skip")
    if not isinstance(skip, Mapping):
        return
    for name, role in skip.items():
        leader = role.get("follows") if isinstance(role, Mapping) else None
        if leader is None or leader == MISSING:
            continue
        others = [str(r) for r in skip if r != name]
        if not isinstance(leader, str) or leader not in others:
            has = ", ".join(repr(r) for r in others) or "none"
            why = " (not itself)" if leader == name else ""
            close = difflib.get_close_matches(leader, others, n=1) if isinstance(leader, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"skip.{name}.follows", leader,
                              f"another role of the config{why}, whose dump_dir, namespace, steps and fingerprint.env "
                              f"this one takes where it leaves them unset; the config's other roles: {has}{hint}")


def _unset(value: Any) -> bool:
    return value is None or value == MISSING


def _taken(leader: Mapping[str, Any], role: Mapping[str, Any]) -> dict[str, Any]:
    """What ``role`` takes from ``leader``: the :data:`FOLLOWED_KEYS` it leaves out, and the
    :data:`FOLLOWED_FINGERPRINT_KEYS` of ``fingerprint`` it leaves unset (as a whole new ``fingerprint``)."""
    taken = {k: leader[k] for k in FOLLOWED_KEYS if k in leader and k not in role}
    theirs, mine = leader.get("fingerprint"), role.get("fingerprint")
    if isinstance(theirs, Mapping) and (mine is None or isinstance(mine, Mapping)):
        mine = mine or {}
        fields = {k: theirs[k] for k in FOLLOWED_FINGERPRINT_KEYS if not _unset(theirs.get(k)) and _unset(mine.get(k))}
        if fields:
            taken["fingerprint"] = {**mine, **fields}
    return taken


def follow_roles(container: dict[str, Any]) -> dict[str, Any]:
    """Return ``container`` with each role that names another in ``follows`` given that role's
    :data:`FOLLOWED_KEYS` it leaves unset, and its ``fingerprint`` :data:`FOLLOWED_FINGERPRINT_KEYS` (``container``
    is not modified). Run after the adapters, so that what they filled in (verl's legacy ``dump_dir``, its run
    identity as ``namespace``) is followed too.

    Raises:
        ConfigError: a ``follows`` that names no other role of the config (:func:`check_follows`).
    """
    check_follows(container)
    skip = container.get("skip")
    if not isinstance(skip, Mapping):
        return container
    roles = dict(skip)
    for _ in range(len(roles)):  # a chain (a follows b follows c) settles in as many passes as it has links
        changed = False
        for name, role in list(roles.items()):
            leader = roles.get(role.get("follows")) if isinstance(role, Mapping) and isinstance(
                role.get("follows"), str) else None
            if isinstance(leader, Mapping) and leader is not role:
                taken = _taken(leader, role)
                if taken:
                    roles[name], changed = {**role, **taken}, True
        if not changed:
            break
    return {**container, "skip": roles}


def load_skip_config(cfg: Any) -> SkipConfig:
    """Validate the ``skip`` node of an application config, after the registered config adapters.

    Args:
        cfg: the application's whole config; other nodes are read only by the adapters.

    Returns:
        The validated :class:`SkipConfig`; a config with no ``skip`` at all means every role disabled.
        The adapters (:data:`~skipweave.config.adapters.CONFIG_ADAPTERS`) may fill a role's keys: verl's
        remaps its legacy keys, gives a role that leaves ``namespace`` unset verl's run identity and reads
        verl's shipped ``steps: []`` as unset (see :mod:`skipweave.integrations.verl.config`). A role with
        ``follows`` then takes the followed role's unset ``dump_dir``, ``namespace``, ``steps`` and
        ``fingerprint.env`` (:func:`follow_roles`). The keys a role's ``fingerprint.env`` names are read from ``cfg``
        here, once (:func:`~skipweave.config.env_keys.resolve_env`).

    Raises:
        ConfigError: a bad value, naming the key, the value and what is allowed; a key ``fingerprint.env`` names that
            ``cfg`` does not have; a ``follows`` naming no other role of the config.

    Warns:
        Whatever an adapter warns, e.g. verl's ``SkipweaveDeprecationWarning`` for a legacy key.
    """
    container = resolve_env(drop_unset(to_container(cfg)))
    for adapter in CONFIG_ADAPTERS:
        container = adapter.adapt(container)
    return parse_skip(follow_roles(container).get("skip"))
