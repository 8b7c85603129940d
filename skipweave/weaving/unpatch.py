"""Removing one of skipweave's wrapt wrappers, shared by the weaver and the host integrations (light: wrapt only)."""

from __future__ import annotations

from typing import Any

import wrapt


def remove_wrapper(owner: Any, attr: str, handle: Any) -> str | None:
    """Remove the wrapper ``handle`` installed on ``owner.attr``; spliced out if other wrapt wrappers sit above.

    Args:
        owner: the class or module the wrapper was installed on.
        attr: the attribute name.
        handle: the wrapper object returned when it was installed (matched by identity).

    Returns:
        ``None`` when removed (or already gone); otherwise why it could not be: a non-wrapt wrapper (e.g. a
        ``functools.wraps`` closure) sits above it, so the caller must make its wrapper a pass-through.
    """
    try:
        wrapt.unwrap_object(owner, attr, handle, missing_ok=True)
    except wrapt.WrapperNotOutermostError as exc:
        return str(exc)
    return None
