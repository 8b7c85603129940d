"""Turn an application's whole config (mapping or OmegaConf node) into a validated :class:`SkipConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skipweave.config.adapters import CONFIG_ADAPTERS
from skipweave.config.containers import MISSING, plain
from skipweave.config.env_keys import resolve_env
from skipweave.config.errors import ConfigError
from skipweave.config.parse import parse_skip
from skipweave.config.schema import SkipConfig

NULL_MEANS_DEFAULT = (
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


def follow_roles(container: dict[str, Any]) -> dict[str, Any]:
    """Return ``container`` with each role that names another in ``follows`` given that role's
    :data:`FOLLOWED_KEYS` it leaves unset (``container`` is not modified). Run after the adapters, so that what they
    filled in (verl's legacy ``dump_dir``, its run identity as ``namespace``) is followed too; a role that follows
    one the config does not have keeps its defaults."""
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
                taken = {k: leader[k] for k in FOLLOWED_KEYS if k in leader and k not in role}
                if taken:
                    roles[name], changed = {**taken, **role}, True
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
        ``follows`` then takes the followed role's unset ``dump_dir``, ``namespace`` and ``steps``. The keys a role's
        ``fingerprint.env`` names are read from ``cfg`` here, once (:func:`~skipweave.config.env_keys.resolve_env`).

    Raises:
        ConfigError: a bad value, naming the key, the value and what is allowed; a key ``fingerprint.env`` names that
            ``cfg`` does not have.

    Warns:
        Whatever an adapter warns, e.g. verl's ``SkipweaveDeprecationWarning`` for a legacy key.
    """
    container = resolve_env(drop_unset(to_container(cfg)))
    for adapter in CONFIG_ADAPTERS:
        container = adapter.adapt(container)
    return parse_skip(follow_roles(container).get("skip"))
