"""Turn an application's whole config (mapping or OmegaConf node) into a validated :class:`SkipConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skipweave.config.containers import plain
from skipweave.config.errors import ConfigError
from skipweave.config.legacy import remap_legacy
from skipweave.config.schema import SkipConfig, parse_skip


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


def load_skip_config(cfg: Any) -> SkipConfig:
    """Validate the ``skip`` node of an application config, remapping legacy verl keys first.

    Args:
        cfg: the application's whole config; other nodes are read only for legacy keys.

    Returns:
        The validated :class:`SkipConfig`; a config with no ``skip`` at all means every role disabled.
        In a verl config, a role that leaves ``namespace`` unset gets verl's run identity, and verl's
        shipped ``steps: []`` reads as unset (see :mod:`skipweave.integrations.verl.namespace`).

    Raises:
        ConfigError: a bad value, naming the key, the value and what is allowed.
    """
    from skipweave.integrations.verl.namespace import apply_verl_defaults  # pure, imports nothing heavy

    container = apply_verl_defaults(remap_legacy(to_container(cfg)))
    return parse_skip(container.get("skip"))
