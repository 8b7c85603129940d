"""Pytest configuration of the example tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by the example tests."""
    config.addinivalue_line(
        "markers",
        "skipweave: needs skipweave installed with its Hydra plugin, so that `+skip=rollout_cache` resolves",
    )
