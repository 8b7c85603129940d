"""The end of a process: what skipweave does at exit, in one fixed order, before the interpreter finalizes.

A woven run must end as the unwoven one would. Python runs ``atexit`` handlers while the interpreter is still
whole; after them it finalizes, and a daemon thread that then wants the GIL back is ended on the spot with
``pthread_exit``. If that thread was inside torch at the time (freeing a tensor releases the GIL), the forced
unwind meets a C++ ``noexcept`` frame and the process aborts with "terminate called without an active
exception" (exit status 134), after a run that did everything right. So no thread of skipweave's may still run
when the handlers are done: each piece that starts one registers how to finish it here, and the one handler
runs those steps in order:

1. :data:`FINISH` -- first close the door on skipweave's own work in the host's threads (:class:`Work`): a
   daemon thread of the host's that calls a target from now on calls it through, unrecorded, and the step waits
   for the threads already inside skipweave's own work (staging, decoding, RNG capture: torch calls) to leave
   it; then finish what was recorded: pending background writes committed, parts marked complete. (Closed
   first, so that a thread recording without pause cannot keep the flush busy);
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


DRAIN_SECONDS = 10.0
"""How long (seconds) the exit waits for threads inside skipweave's own work to leave it."""

_work = threading.Condition()
_working = 0
_closing = False


class Work:
    """One call's hold on skipweave's own work: what the proxy does besides the host's real call (decide, decode,
    stage, capture RNG state). The exit (:func:`close_work`) waits for every held one to be let go, and refuses new
    holds; a call holds only while it runs such work, never while the host's call runs, nor while it awaits or
    waits for another call (a coroutine never resumed must not keep the exit waiting).
    """

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = False

    def enter(self) -> bool:
        """Take the hold (again). Returns False once the exit steps began: the caller then does no work of its own
        (calls the target through, records nothing), since a daemon thread still inside torch when the interpreter
        finalizes aborts the process."""
        global _working
        if self.held:
            return True
        with _work:
            if _closing:
                return False
            _working += 1
        self.held = True
        return True

    def leave(self) -> None:
        """Let go of the hold, if held."""
        global _working
        if not self.held:
            return
        self.held = False
        with _work:
            _working -= 1
            if _working <= 0:
                _work.notify_all()


def close_work(timeout: float = DRAIN_SECONDS) -> bool:
    """Refuse skipweave's own work from now on and wait up to ``timeout`` seconds for the threads inside it to
    leave. The first :data:`FINISH` step. Returns whether every thread left in time (else a WARNING is logged)."""
    global _closing
    with _work:
        _closing = True
        done = _work.wait_for(lambda: _working <= 0, timeout)
        busy = _working
    if not done:
        logger.warning("skipweave: at exit, %d thread(s) still inside skipweave's own work after %.0f s; the "
                       "process may abort while the interpreter finalizes", busy, timeout)
    return done


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
    global _ran, _lock, _work, _working, _closing
    _lock = threading.Lock()  # another thread may have held the parent's
    _work, _working, _closing = threading.Condition(), 0, False  # the parent's other threads do not exist here
    _ran = False  # a forked child ends on its own (its steps are the parent's registrations, run for the child)


at_exit(FINISH, close_work)  # first of all, see the module docstring
atexit.register(run_exit_steps)
os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["DRAIN_SECONDS", "FINISH", "REPORT", "STOP", "Work", "at_exit", "close_work",
           "in_multiprocessing_children", "run_exit_steps"]
