"""Config adapters: how a host integration adds its own keys to reading an app's config.

A host may keep skip settings of its own outside ``skip`` (verl's legacy ``actor_rollout_ref.rollout.skip*``
keys) or imply defaults (verl's run identity as the namespace). The config layer names no host: it declares
:data:`CONFIG_ADAPTERS`, and an integration registers a :class:`ConfigAdapter` there
(:mod:`skipweave.integrations.verl.config`). Adapters run in registration order (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skipweave import hooks
from skipweave.config.containers import plain
from skipweave.config.env_keys import add_named_parts


@dataclass(frozen=True)
class ConfigAdapter:
    """One host's part in reading an app's config.

    Attributes:
        name: what it adapts, for messages (``"verl legacy keys"``).
        relevant: ``relevant(cfg) -> dict``: the parts of the app's whole config (a mapping or OmegaConf
            ``DictConfig``) the adapter reads besides ``skip``, as plain containers nested as in ``cfg``; ``{}``
            when it reads none. Only these parts are resolved (see :func:`relevant_config`).
        adapt: ``adapt(container) -> container``: the app's config as plain containers, keys left unset already
            dropped from every role, in; a new mapping whose ``skip`` node holds what the host's keys mean, out.
            May warn; raises :class:`~skipweave.config.errors.ConfigError` for a host key's bad value.
    """

    name: str
    relevant: Callable[[Mapping[str, Any]], dict[str, Any]]
    adapt: Callable[[dict[str, Any]], dict[str, Any]]


CONFIG_ADAPTERS = hooks.Registry[ConfigAdapter]("config adapter")
"""The adapters :func:`skipweave.config.load_skip_config` and :func:`relevant_config` apply, in order."""


def relevant_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Return the parts of an app's whole config that skipweave reads: ``skip``, what the adapters read, and the keys
    the roles' ``fingerprint.env`` names.

    Resolving the whole config of a large app (verl's holds hundreds of keys, some interpolating
    values that exist only inside a running job) would fail or waste time; only these parts are read.

    Args:
        cfg: a mapping or OmegaConf ``DictConfig``.

    Returns:
        A new mapping of plain containers (OmegaConf nodes converted, interpolations resolved) holding
        ``skip`` (if present) and each adapter's parts (e.g. verl's legacy keys and run identity), those present.
    """
    out: dict[str, Any] = {}
    if "skip" in cfg:
        out["skip"] = plain(cfg["skip"])
    for adapter in CONFIG_ADAPTERS:
        _merge(out, adapter.relevant(cfg))
    return add_named_parts(out, cfg, out.get("skip"))


def _merge(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Merge ``part`` into ``into``, nested mappings key by key (two adapters may read keys of one node)."""
    for name, value in part.items():
        if isinstance(value, Mapping) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        else:
            into[name] = dict(value) if isinstance(value, Mapping) else value


__all__ = ["CONFIG_ADAPTERS", "ConfigAdapter", "relevant_config"]
