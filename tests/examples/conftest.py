"""Pytest configuration of the example tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by the example tests."""
    config.addinivalue_line(
        "markers",
        # (not `skipweave`: that marker is the pytest plugin's, skipweave.testing.pytest_plugin)
        "hydra_plugin: needs skipweave installed with its Hydra plugin, so that `+skip=rollout_cache` resolves",
    )
