"""Actors and a task of the host application; each ``generate`` leaves a marker file when it really runs.

The markers let a test tell a replayed call (no marker) from a live one, across processes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import ray
import torch


def mark_live_call(count_dir: str, who: str, batch: dict[str, Any]) -> None:
    """Leave one marker file per real call in ``count_dir``."""
    step = batch["meta_info"]["global_steps"]
    with open(os.path.join(count_dir, f"{who}-s{step}-{os.getpid()}-{uuid.uuid4().hex[:6]}"), "w") as fh:
        fh.write("live\n")


def sample(who: str, batch: dict[str, Any]) -> dict[str, Any]:
    """A result that differs on every live call (random tensor, pid), so a replay is recognisable."""
    return {
        "who": who,
        "step": batch["meta_info"]["global_steps"],
        "pid": os.getpid(),
        "rank": os.environ.get("RANK"),
        "values": torch.randn(4),
    }


class Plain:
    """A plain class in a module, made an actor at run time with ``ray.remote(Plain)``."""

    def __init__(self, name: str, count_dir: str) -> None:
        self.name, self.count_dir = name, count_dir

    def generate(self, batch: dict[str, Any]) -> dict[str, Any]:
        mark_live_call(self.count_dir, self.name, batch)
        return sample(self.name, batch)

    def stats(self) -> dict[str, Any]:
        import skipweave

        return {"counters": skipweave.counters(), "pid": os.getpid()}

    def env(self) -> dict[str, Any]:
        marker = "wd_marker.txt"
        return {
            "APP_VAR": os.environ.get("APP_VAR"),
            "APP_HOOK_RAN": os.environ.get("APP_HOOK_RAN"),
            "has_plan": "SKIPWEAVE_PLAN" in os.environ,
            "working_dir_marker": open(marker).read().strip() if os.path.exists(marker) else None,
        }


@ray.remote
class Decorated(Plain):
    """A class decorated ``@ray.remote``: ``rayapp.workers.Decorated`` is Ray's ``ActorClass``."""

    def generate(self, batch: dict[str, Any]) -> dict[str, Any]:
        mark_live_call(self.count_dir, self.name, batch)
        return sample(self.name, batch)


class AsyncBase(Plain):
    """Base of an async actor; the target names this base class's method."""

    async def generate(self, batch: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        mark_live_call(self.count_dir, self.name, batch)
        return sample(self.name, batch)

    async def stats(self) -> dict[str, Any]:  # type: ignore[override]
        return Plain.stats(self)


class AsyncWorker(AsyncBase):
    """An async actor (``async def`` methods run on the actor's event loop) inheriting its target."""


def rollout_task(batch: dict[str, Any], count_dir: str) -> dict[str, Any]:
    """A module function made a task with ``ray.remote(rollout_task)``."""
    mark_live_call(count_dir, "task", batch)
    return sample("task", batch)
