"""The host of the shared-path test: targets that leave a marker file when their body runs, and an actor calling them.

The actor keeps the WARNING lines skipweave logs in its worker, so the test reads the very lines a user's Ray job
shows (Ray forwards worker logs to the driver's console, where a test cannot wait for them reliably).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import ray


def _body(kind: str, batch: dict[str, Any], marker_dir: str) -> dict[str, Any]:
    """A marker file per real call (in a folder every node shares), and a small result."""
    step = batch["meta_info"]["global_steps"]
    with open(os.path.join(marker_dir, f"{kind}-{batch['who']}-s{step}-{uuid.uuid4().hex[:6]}"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    return {"who": batch["who"], "step": step, "pid": os.getpid()}


def generate_local(batch: dict[str, Any], marker_dir: str) -> dict[str, Any]:
    """The target of the role whose dump dir is node-local."""
    return _body("local", batch, marker_dir)


def generate_required(batch: dict[str, Any], marker_dir: str) -> dict[str, Any]:
    """The target of the node-local role with ``require_shared``."""
    return _body("required", batch, marker_dir)


def generate_shared(batch: dict[str, Any], marker_dir: str) -> dict[str, Any]:
    """The target of the role whose dump dir every node shares."""
    return _body("shared", batch, marker_dir)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Caller:
    """An actor that calls the woven :func:`generate` and says where it runs and what skipweave warned there."""

    def __init__(self, who: str, marker_dir: str) -> None:
        self.who, self.marker_dir = who, marker_dir
        self.kept = _Keep()
        logging.getLogger("skipweave").addHandler(self.kept)

    def call(self, kind: str, step: int) -> dict[str, Any]:
        """One call of the target of role ``kind`` at ``step`` (it raises what skipweave raises)."""
        target = globals()[f"generate_{kind}"]  # the module's attribute now: the woven one
        return target({"meta_info": {"global_steps": step}, "who": self.who}, self.marker_dir)

    def where(self) -> dict[str, Any]:
        """The actor's node, its working folder, and the skipweave WARNING lines of its worker so far."""
        return {"node": ray.get_runtime_context().get_node_id(), "cwd": os.getcwd(), "pid": os.getpid(),
                "warnings": list(self.kept.lines)}
