"""What this process knows of itself as a Ray worker, shared by the worker, actor and failure modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig
    from skipweave.integrations.ray.failures import WorkerWeaveError

MAIN_PREFIXES = ("__main__.", "__main__:")
"""Target paths in the driver's script: in a worker ``__main__`` is Ray's ``default_worker``, not the script."""


@dataclass
class WorkerState:
    """This process as a Ray worker.

    Attributes:
        active: this process is a Ray worker that ran ``worker_setup``.
        plan: the full plan, ``__main__`` targets included (``None`` until woven).
        failure: why weaving this worker failed, once it did.
        loaders_patched: Ray's actor-class loaders and executors are wrapped.
        refused: ``"module|attr"`` of each target given a refusal hook.
    """

    active: bool = False
    plan: SkipConfig | None = None
    failure: WorkerWeaveError | None = None
    loaders_patched: bool = False
    refused: set[str] = field(default_factory=set)


WORKER = WorkerState()
"""This process's state as a Ray worker."""


def in_main(path: str) -> bool:
    """True when target ``path`` names the driver's script (``__main__.X`` / ``__main__:X``)."""
    return path.startswith(MAIN_PREFIXES)


__all__ = ["MAIN_PREFIXES", "WORKER", "WorkerState", "in_main"]
