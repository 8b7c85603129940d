"""Remapping of legacy verl skip keys onto the ``skip.<role>`` schema (filled in by the Hydra issue)."""

from __future__ import annotations

from typing import Any


def remap_legacy(cfg: dict[str, Any]) -> dict[str, Any]:
    """Return ``cfg`` with legacy verl keys folded into ``skip.<role>``; new-style keys win."""
    return cfg
