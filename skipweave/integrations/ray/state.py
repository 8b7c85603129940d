"""What this process knows of itself as a Ray worker, shared by the worker, actor and failure modules, and the error a
worker whose weave failed raises (:class:`WorkerWeaveError`, here beside the state that holds one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig

MAIN_PREFIXES = ("__main__.", "__main__:")
"""Target paths in the driver's script: in a worker ``__main__`` is Ray's ``default_worker``, not the script."""


class WorkerWeaveError(RuntimeError):
    """Weaving failed inside a Ray worker; raised by every later call of a target in that worker.

    Attributes:
        target: the target path whose weave failed (``None`` when the failure is not one target's).
        worker: the worker's identity (pid, node, actor when known).
    """

    def __init__(self, message: str, *, target: str | None = None, worker: str = "") -> None:
        super().__init__(message)
        self.target = target
        self.worker = worker

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles the exception to hand it to the driver; keep the keyword attributes.
        return (_rebuild_error, (type(self), str(self), self.target, self.worker))


def _rebuild_error(
    cls: type[WorkerWeaveError], message: str, target: str | None, worker: str
) -> WorkerWeaveError:
    return cls(message, target=target, worker=worker)


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


__all__ = ["MAIN_PREFIXES", "WORKER", "WorkerState", "WorkerWeaveError", "in_main"]
