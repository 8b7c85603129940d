"""Plain containers from OmegaConf nodes, and reading nodes of an app's whole config by dotted path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MISSING = "???"
"""OmegaConf's mark of a missing value, as ``to_container`` leaves it: a key declared but left unset."""


def plain(value: Any) -> Any:
    """Return ``value`` as plain dicts/lists (OmegaConf nodes resolved, keys as strings)."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def node_at(cfg: Mapping[str, Any], dotted: str) -> Mapping[str, Any] | None:
    """Return the mapping (plain or OmegaConf ``DictConfig``) at ``dotted`` inside ``cfg``, or ``None`` when a
    part is missing or not a mapping. Nothing is resolved or converted (an app's unrelated keys may not resolve
    where this runs)."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) and not is_dictconfig(node):
            return None
        node = node.get(part)
    return node if isinstance(node, Mapping) or is_dictconfig(node) else None


def is_dictconfig(node: Any) -> bool:
    """Whether ``node`` is an OmegaConf ``DictConfig`` (told by its class, without importing OmegaConf)."""
    return type(node).__name__ == "DictConfig" and type(node).__module__.startswith("omegaconf")
