"""verl's convention for telling a result's origin: ``meta_info["skipweave"]`` of a ``DataProto``.

verl's trainers (and a user's code) read ``out.meta_info.get("skipweave", {})`` without importing skipweave, to
tell a replayed batch from a generated one. Importing this module registers :func:`note_meta_info` as a result
note of the proxy (:data:`skipweave.weaving.notes.RESULT_NOTES`); :func:`skipweave.integrations.register_builtin`
does that.
"""

from __future__ import annotations

from typing import Any

from skipweave.weaving.notes import RESULT_NOTES


def note_meta_info(result: Any, status: str, step: int | None, served: int | None) -> None:
    """Put ``{"status", "step", "served_step"}`` under ``meta_info["skipweave"]`` of a DataProto-like result.

    Args:
        result: the call's result; one without a ``meta_info`` dict (or a dict subclass) is left untouched.
        status: ``"bypass"``, ``"hit"`` or ``"miss"``.
        step: the call's step, ``None`` when it has none.
        served: the step whose recording served a hit, else ``None``.

    Raises:
        Exception: whatever reading ``result.meta_info`` raises other than ``AttributeError`` (the host's own).
    """
    meta = getattr(result, "meta_info", None)
    if type(meta) is dict or isinstance(meta, dict):
        meta["skipweave"] = {"status": status, "step": step, "served_step": served}


RESULT_NOTES.add(note_meta_info)

__all__ = ["note_meta_info"]
