"""Errors raised while reading a skip configuration."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A ``skip`` configuration value is not allowed.

    The message always names the full key (e.g. ``skip.rollout.action``), the value found and what
    is allowed, so a user can fix the command line without reading skipweave's code.

    Attributes:
        key: dotted key of the offending value, e.g. ``"skip.rollout.steps"``.
        value: the value found.
        allowed: human readable description of what is allowed.
    """

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"{key}={_shown(value)} is not allowed: {allowed}")


def _shown(value: Any) -> str:
    """``repr(value)``; an integer past Python's limit of digits for decimal text (``10**5000``) by its size."""
    try:
        return repr(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
