"""Whether skipweave shows progress bars on stderr: one rule for every long operation (a large tensor file written
or read, the background writer's final flush, ``skipweave migrate``).

Imports nothing heavy (no torch): the CLI asks it before it knows whether any tensor is involved.
"""

from __future__ import annotations

import os
import sys

from skipweave.env import PROGRESS_ENV


def bars_enabled() -> bool:
    """Whether progress bars show on stderr at all: ``SKIPWEAVE_PROGRESS=0`` off, ``=1`` on even when stderr is
    not a terminal; unset (or any other value), when stderr is a terminal."""
    env = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


__all__ = ["bars_enabled"]
