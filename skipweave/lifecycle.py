"""The end of a process: what skipweave does at exit, in one fixed order, before the interpreter finalizes.

A woven run must end as the unwoven one would. Python runs ``atexit`` handlers while the interpreter is still
whole; after them it finalizes, and a daemon thread that then wants the GIL back is ended on the spot with
``pthread_exit``. If that thread was inside torch at the time (freeing a tensor releases the GIL), the forced
unwind meets a C++ ``noexcept`` frame and the process aborts with "terminate called without an active
exception" (exit status 134), after a run that did everything right. So no thread of skipweave's may still run
when the handlers are done: each piece that starts one registers how to finish it here, and the one handler
runs those steps in order:

1. :data:`FINISH` -- finish what was recorded: pending background writes committed, parts marked complete;
2. :data:`STOP` -- stop and join every thread skipweave started (the background writer, mark writers), and let go
   of the memory they kept (copy buffers), while torch is still whole;
3. :data:`REPORT` -- the exit summary and its warnings, which count what the steps before it finished.

The handler is registered when this module is first imported (by the first piece that registers a step), so it
runs after the ``atexit`` handlers the host registers later: a host handler that still calls a target records
as usual. A step registered again (same function) runs once. A ``multiprocessing`` child ends with
``os._exit`` and runs no ``atexit``: :func:`in_multiprocessing_children` has the pieces that must run there too
run from ``multiprocessing``'s own finalizers.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

FINISH, STOP, REPORT = 0, 1, 2
"""The exit steps, in the order they run."""

_lock = threading.Lock()
_steps: dict[int, list[Callable[[], object]]] = {FINISH: [], STOP: [], REPORT: []}
_ran = False


def at_exit(step: int, fn: Callable[[], object]) -> None:
    """Run ``fn()`` at interpreter exit in step ``step`` (:data:`FINISH`, :data:`STOP` or :data:`REPORT`); the
    functions of one step run in the order they were registered, each once however often it is registered.

    Raises:
        ValueError: ``step`` is not one of the three.
    """
    if step not in _steps:
        raise ValueError(f"exit step {step!r}: one of FINISH={FINISH}, STOP={STOP}, REPORT={REPORT}")
    with _lock:
        if fn not in _steps[step]:
            _steps[step].append(fn)


def run_exit_steps() -> None:
    """Run every registered exit step, in order; once per process (a later call does nothing). An exception of one
    function is logged and the others still run: the host's own exit status is not skipweave's to change."""
    global _ran
    with _lock:
        if _ran:
            return
        _ran = True
        plan = [list(_steps[step]) for step in (FINISH, STOP, REPORT)]
    for fns in plan:
        for fn in fns:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one piece's failure must not keep the others from finishing
                logger.exception("skipweave: at exit, %s failed", getattr(fn, "__qualname__", fn))


_MP_HOOKED_PID: int | None = None


def in_multiprocessing_children(fn: Callable[[], object]) -> None:
    """Also run ``fn()`` when this process is a ``multiprocessing`` child that ends (``os._exit`` after the
    module's finalizers, no ``atexit``). Registers once per process: the registry of finalizers is the child's
    own, cleared when it starts."""
    global _MP_HOOKED_PID
    if _MP_HOOKED_PID == os.getpid():
        return
    _MP_HOOKED_PID = os.getpid()
    from multiprocessing import util

    util.Finalize(None, fn, exitpriority=100)


def _after_fork_in_child() -> None:
    global _ran, _lock
    _lock = threading.Lock()  # another thread may have held the parent's
    _ran = False  # a forked child ends on its own (its steps are the parent's registrations, run for the child)


atexit.register(run_exit_steps)
os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["FINISH", "REPORT", "STOP", "at_exit", "in_multiprocessing_children", "run_exit_steps"]
