"""verl's convention for telling a result's origin: ``meta_info["skipweave"]`` of a ``DataProto``.

verl's trainers (and a user's code) read ``out.meta_info.get("skipweave", {})`` without importing skipweave, to
tell a replayed batch from a generated one: ``{"status": "hit" | "miss" | "bypass", "step", "served_step"}``.
The verl integration registers :data:`META_INFO` as a result note of the proxy
(:data:`skipweave.weaving.notes.RESULT_NOTES`) when it is loaded, also where verl is not installed (trainers shaped
like verl's read it too).
"""

from __future__ import annotations

from skipweave.weaving.notes import ResultNote

META_INFO = ResultNote("meta_info", "skipweave")
"""Every result with a ``meta_info`` dict (a verl ``DataProto``) carries its call's fate under ``"skipweave"``."""

__all__ = ["META_INFO"]
