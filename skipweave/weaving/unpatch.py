"""Removing one of skipweave's wrapt wrappers, and telling one from other tools' wrappers; shared by the weaver
and the host integrations (light: wrapt only)."""

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


def wrapper_of(obj: Any) -> Any:
    """Return the wrapper function of a wrapt ``FunctionWrapper`` or ``BoundFunctionWrapper``, else ``None``.

    Tells skipweave's wrappers from other tools' (compare with :func:`skipweave.weaving.proxy.proxy_of`). wrapt
    offers no public accessor for it: it keeps it in the wrapper's ``_self_wrapper`` attribute (wrapt names what
    a proxy keeps for itself ``_self_*``), and this is the one place skipweave reads that attribute.

    Args:
        obj: any object; one that is no wrapt function wrapper gives ``None``.
    """
    if isinstance(obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        return getattr(obj, "_self_wrapper", None)
    return None
