"""Actors and a task of the host application; each ``generate`` leaves a marker file when it really runs.

The markers let a test tell a replayed call (no marker) from a live one, across processes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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


def inner_rollout(batch: dict[str, Any], count_dir: str) -> dict[str, Any]:
    """A target called inside an actor method (as a TaskRunner's ``run()`` calls its rollouts)."""
    mark_live_call(count_dir, "inner", batch)
    return sample("inner", batch)


@contextmanager
def slow_writer(seconds: float) -> Iterator[None]:
    """Every commit of this worker's background writer takes ``seconds`` longer, so a recording is still
    pending right after its call returns."""
    from skipweave.store.step_store import StepStore

    saved = StepStore.commit, StepStore.commit_many

    def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return saved[0](self, *args, **kwargs)

    def commit_many(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return saved[1](self, *args, **kwargs)

    StepStore.commit, StepStore.commit_many = commit, commit_many  # type: ignore[method-assign]
    try:
        yield
    finally:
        StepStore.commit, StepStore.commit_many = saved  # type: ignore[method-assign]


def _pending() -> int:
    from skipweave.store.write_behind import WRITER

    return WRITER.pending()[0]


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

    def loop(self, steps: list[int], count_dir: str) -> dict[str, Any]:
        """Call ``inner_rollout`` once from a thread this method starts, then once per step here; report the
        writer's pending entries after each call (the writer is slowed)."""
        with slow_writer(0.3):
            thread = threading.Thread(target=inner_rollout, args=({"meta_info": {"global_steps": steps[0]}},
                                                                  count_dir))
            thread.start()
            thread.join()
            out = {"thread": _pending(), "method": []}
            for step in steps[1:]:
                inner_rollout({"meta_info": {"global_steps": step}}, count_dir)
                out["method"].append(_pending())
        return out

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

    async def loop_async(self, steps: list[int], count_dir: str) -> list[int]:
        """Call ``inner_rollout`` once per step on the actor's event loop; the writer's pending entries after each."""
        out = []
        with slow_writer(0.3):
            for step in steps:
                await asyncio.sleep(0)
                inner_rollout({"meta_info": {"global_steps": step}}, count_dir)
                out.append(_pending())
        return out


class AsyncWorker(AsyncBase):
    """An async actor (``async def`` methods run on the actor's event loop) inheriting its target."""


def rollout_task(batch: dict[str, Any], count_dir: str) -> dict[str, Any]:
    """A module function made a task with ``ray.remote(rollout_task)``."""
    mark_live_call(count_dir, "task", batch)
    return sample("task", batch)
