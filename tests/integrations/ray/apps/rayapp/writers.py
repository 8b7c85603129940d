"""Actors for the many-writers test: ``Plain`` plus a method that says where the actor runs.

``NoRank`` only adds :meth:`NoRank.where`; its ``generate`` is ``Plain.generate`` itself (inherited), so the
target ``rayapp.workers:Plain.generate`` reaches it. ``Ranked`` defines a ``generate`` of its own (same body as
``Plain``'s) so that it can be a second target of the role, with entries in a folder apart.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from rayapp.workers import Plain, mark_live_call, sample


class NoRank(Plain):
    """``Plain`` and :meth:`where`; made an actor without ``RANK``."""

    def where(self) -> dict[str, Any]:
        """The node, process and skipweave run of this actor."""
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "rank": os.environ.get("RANK"),
            "local_rank": os.environ.get("LOCAL_RANK"),
            "run": os.environ.get("SKIPWEAVE_RUN"),
            "has_plan": "SKIPWEAVE_PLAN" in os.environ,
        }


class Ranked(NoRank):
    """Made an actor with ``RANK=i``; its own ``generate`` is the role's second target."""

    def generate(self, batch: dict[str, Any]) -> dict[str, Any]:
        mark_live_call(self.count_dir, self.name, batch)
        return sample(self.name, batch)
