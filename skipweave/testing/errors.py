"""What a marked test's plan raises: a wrong marker, or a test that cannot run (or bless) in its mode."""

from __future__ import annotations


class MarkerError(ValueError):
    """A ``skipweave`` marker's arguments are wrong; the message names the argument, its value and what is allowed."""


class GoldenError(RuntimeError):
    """A marked test cannot run in its mode (no recording to replay); the message says what to do."""
