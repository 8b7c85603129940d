"""A Ray worker whose weave failed: it says so, and refuses every target call rather than run it live.

A setup hook that raises makes Ray kill the worker (tasks then fail with a bare ``WorkerCrashedError`` after their
retries). So ``worker_setup`` never raises for a failed weave: :func:`fail` logs the error with the worker (pid,
node) and the target, and every later call of a target in that worker raises :class:`WorkerWeaveError`. Ray hands
that error to the driver's ``ray.get`` (as a ``RayTaskError`` that is also a :class:`WorkerWeaveError`), which stops
the job with a clear message. (The exception class lives in :mod:`~skipweave.integrations.ray.state`, beside the
state that holds one, and is this module's public name too.)
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any

import wrapt

from skipweave.integrations.ray.state import WORKER, WorkerWeaveError, in_main
from skipweave.weaving.unpatch import wrapper_of

logger = logging.getLogger(__name__)

_failure_lock = threading.Lock()


class Refusal:
    """wrapt wrapper installed on a target of a worker whose weave failed: every call raises
    :class:`WorkerWeaveError`.

    Args:
        target: the target's configured path.
    """

    def __init__(self, target: str) -> None:
        self.target = target

    def __call__(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        failure = WORKER.failure
        where = worker_identity(with_call=True)
        raise WorkerWeaveError(
            f"skipweave refused to run {self.target} in Ray worker {where}: weaving this worker failed "
            f"at start-up, so the call would have run live and recorded nothing. {failure}",
            target=failure.target if failure else None, worker=where,
        )


def fail(exc: BaseException, *, target: str | None) -> None:
    """Record and log a failed weave; refuse every target of the plan in this worker from now on.

    Args:
        exc: what the weave raised.
        target: the path of the target whose weave failed, ``None`` when the failure is not one target's.
    """
    worker = worker_identity()
    message = f"skipweave could not weave Ray worker {worker}"
    if target:
        message += f" at target '{target}'"
    message += f": {type(exc).__name__}: {exc}"
    if target:
        message += (". Make the target importable in Ray workers (PYTHONPATH, runtime_env working_dir or "
                    "py_modules) or mark it optional (targets: {name: {path: ..., optional: true}})")
    error = WorkerWeaveError(message, target=target, worker=worker)
    logger.error("%s", error, exc_info=(type(exc), exc, exc.__traceback__))
    with _failure_lock:
        if WORKER.failure is None:
            WORKER.failure = error
    refuse_all_targets()


def refuse_all_targets() -> None:
    """Install refusals on every target of the plan (but the ``__main__`` ones), now or at its module's first
    import."""
    from skipweave.weaving.resolve import TargetNotFound, split_path

    plan = WORKER.plan
    if plan is None:
        return
    for role in plan.enabled_roles:
        for target in role.targets:
            if in_main(target.path):
                continue  # refused when Ray loads the class (actors.weave_loaded_class)
            try:
                rpath = split_path(target.path, may_import=not target.optional)
            except TargetNotFound:
                continue  # nothing to refuse: the module does not exist here
            key = f"{rpath.module}|{rpath.attr}"
            if key in WORKER.refused:
                continue
            WORKER.refused.add(key)
            hook = _refusal_hook(rpath.module, rpath.attr, target.path)
            wrapt.register_post_import_hook(hook, rpath.module)


def _refusal_hook(module_name: str, attr_path: str, target_path: str) -> Any:
    def on_import(module: Any) -> None:
        from skipweave.weaving.resolve import ResolvedPath, resolve_owner

        try:
            owner, attr = resolve_owner(module, ResolvedPath(target_path, module_name, attr_path))
            install_refusal(owner, attr, target_path)
        except Exception as exc:  # noqa: BLE001 - never break the host's import
            logger.debug("skipweave: no refusal installed on %s: %s", target_path, exc)

    return on_import


def install_refusal(owner: Any, attr: str, target_path: str) -> None:
    """Wrap ``owner.attr`` in a :class:`Refusal` of ``target_path`` (once)."""
    current = inspect.getattr_static(owner, attr, None)
    if isinstance(wrapper_of(current), Refusal):
        return
    wrapt.wrap_function_wrapper(owner, attr, Refusal(target_path))


def worker_identity(*, with_call: bool = False) -> str:
    """``pid=… node=<ip> (<node id>)`` plus, inside a call, the actor or task running it."""
    parts = [f"pid={os.getpid()}"]
    try:
        import ray

        ctx = ray.get_runtime_context()
        parts.append(f"node={ray.util.get_node_ip_address()} ({ctx.get_node_id()[:12]})")
        if with_call:
            actor = ctx.get_actor_id()
            if actor:
                name = ctx.get_actor_name()
                parts.append(f"actor={name + ' ' if name else ''}{actor[:12]}")
            task = ctx.get_task_function_name() or ctx.get_task_name()
            if task:
                parts.append(f"task={task}")
    except Exception:  # noqa: BLE001 - identity is best effort
        pass
    return " ".join(parts)


__all__ = ["Refusal", "WorkerWeaveError", "fail", "install_refusal", "refuse_all_targets", "worker_identity"]
