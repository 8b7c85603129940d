"""Retention in a recording process: when :mod:`skipweave.store.retention`'s rule is applied (``skip.<role>.keep``).

A :class:`Retainer` per role runs a round (:func:`~skipweave.store.retention.plan_retention`, then
:func:`~skipweave.store.retention.remove_step` for each step it selects) after the process committed entries of a
step newer than any before, off every recorded call: in the background writer's thread, or a thread of its own for
entries committed in the caller's thread; and once more when the run ends (:meth:`Retainer.final_round`, within
:data:`FINAL_ROUND_S`), so the rule holds on disk after a run whose steps came faster than the rounds. Each round also
removes what interrupted writes left in the role (:func:`skipweave.store.upkeep.clean_role`). Every thread started
here is stopped and joined at the process's end (:func:`stop_rounds`, :data:`skipweave.lifecycle.STOP`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

import filelock

from skipweave import lifecycle
from skipweave.store.format.layout import role_dir
from skipweave.store.fs import is_real_dir, remove_tree
from skipweave.store.retention import KeepRule, StepRemoval, plan_retention, remove_step, role_lock, trash_folders

if TYPE_CHECKING:
    from skipweave.store.role_access import RoleSteps

logger = logging.getLogger(__name__)

FINAL_ROUND_S = 5.0
"""Seconds the round a recording process runs at its end (:meth:`Retainer.final_round`) may take: it waits for the
role's lock and starts removing steps only within them. A step whose removal began is finished (it was renamed to a
trash name first, so even a kill leaves whole steps); the steps it did not reach wait for the next round of any
process, or ``skipweave gc --keep-last``."""


class Retainer:
    """Runs a role's retention in a recording process, after it committed entries of a step newer than any it
    committed before (so once per step, not once per commit: per-sample recording commits thousands of entries a
    step), in the background writer's thread (:meth:`after_commit`) or a thread of its own for an entry committed
    in the caller's thread (:meth:`after_commit_soon`), never in a recorded call's; and once more when the run ends
    (:meth:`final_round`), so the rule holds on disk when the process is gone, also for the steps that came faster
    than the rounds. A round is skipped when another process cleans the role (``.retention.lock`` held) or a part's
    lock is held. Each round also removes what interrupted writes left in the role
    (:func:`skipweave.store.upkeep.clean_role`).

    Args:
        store: the role's store.
        rule: the role's :class:`KeepRule` (an active one).
    """

    def __init__(self, store: RoleSteps, rule: KeepRule) -> None:
        self.store = store
        self.rule = rule
        self._newest: int | None = None  # the newest step a round ran after
        self._latest: int | None = None  # the newest step this process committed
        self._commits = 0  # calls of after_commit with steps: commits this process made
        self._settled = 0  # _commits when the last round that ran whole began
        self._lock = threading.Lock()
        self._soon: tuple[set[int], set[int]] = (set(), set())  # steps, pending steps: what the thread's round is for
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def after_commit(self, steps: Iterable[int], pending: Collection[int] = (), *,
                     stop: Callable[[], bool] | None = None) -> list[StepRemoval]:
        """Run a round when ``steps`` (just committed) hold a step newer than the last round saw.

        Args:
            steps: the steps of the entries just committed. The newest is never removed; the others (one batch of the
                background writer can hold many steps of a fast host) are steps the process moved on from, judged as
                any other (one it still keeps open is held, see :meth:`StepStore.held_steps`).
            pending: steps this process is still writing (never removed).
            stop: polled before each step the round removes; True ends the round there (the process is ending: its
                exit must not wait for deletions, which :meth:`final_round`, the next round or ``skipweave gc``
                finishes).

        Returns:
            What the round removed or kept (empty when no round ran). Never raises: a failure is logged.
        """
        steps = set(steps)
        if not steps:
            return []
        with self._lock:
            newest = max(steps)
            self._commits += 1
            self._latest = newest if self._latest is None else max(self._latest, newest)
            if self._newest is not None and newest <= self._newest:
                return []
            self._newest = newest
            commits = self._commits
        # (and the store's held steps, read when the round runs)
        return self._guarded({newest} | set(pending), stop, commits, lock_timeout=0.0)

    def after_commit_soon(self, steps: Iterable[int], pending: Collection[int] = ()) -> threading.Thread | None:
        """As :meth:`after_commit`, on a thread of its own, for an entry committed in a recorded call's thread (a
        Ray worker outside a task, ``write_buffer: 0``): the call returns without waiting for the round.

        One thread per role at a time, which runs the rounds that came due while it ran (a step that came during a
        round is not dropped), then ends. The process's end stops it after the step it removes and joins it
        (:data:`skipweave.lifecycle.STOP`, :func:`stop_rounds`); :meth:`final_round` ran before.

        Returns:
            The thread that will run the round (started now, or already running), or ``None`` when no round is due (no
            step newer than the last round saw) or the process is ending.
        """
        steps = set(steps)
        with self._lock:
            if not steps or self._stopping.is_set():
                return None
            self._commits += 1  # (counted now: the final round may come before the thread's round)
            self._latest = max(steps) if self._latest is None else max(self._latest, *steps)
            if self._newest is not None and max(steps) <= self._newest:
                return None
            self._soon[0].update(steps)
            self._soon[1].update(pending)
            if self._thread is not None:
                return self._thread
            thread = self._thread = threading.Thread(target=self._soon_rounds, daemon=True,
                                                     name=f"skipweave-retention-{self.store.role}")
            _THREADED.add(self)
            lifecycle.at_exit(lifecycle.STOP, stop_rounds)
        thread.start()
        return thread

    def _soon_rounds(self) -> None:
        while True:
            with self._lock:
                steps, pending = self._soon
                if not steps or self._stopping.is_set():
                    self._thread = None
                    return
                self._soon = (set(), set())
            self.after_commit(steps, pending, stop=self._stopping.is_set)

    def final_round(self, timeout: float = FINAL_ROUND_S) -> list[StepRemoval]:
        """The round at the run's end (unweave, the process's exit), after this process committed everything: when
        this process committed anything since the last round that ran whole, apply the rule once more, so the steps
        that came faster than the rounds (a quick host's, whose rounds were skipped while another ran or cut short
        by the exit) go too. Waits for the role's lock and removes steps only within ``timeout`` seconds
        (:data:`FINAL_ROUND_S`). The newest step this process committed is not removed.

        Returns:
            What the round removed or kept (empty when none was due or ran). Never raises: a failure is logged.
        """
        with self._lock:
            if self._commits == self._settled or self._latest is None:
                return []
            commits, latest = self._commits, self._latest
        deadline = time.monotonic() + timeout
        return self._guarded({latest}, lambda: time.monotonic() > deadline, commits,
                             lock_timeout=max(0.0, deadline - time.monotonic()))

    def after_fork(self) -> None:
        """In a forked child: the parent's thread of rounds is not here, and its lock may have been held."""
        self._lock = threading.Lock()
        self._thread = None
        self._soon = (set(), set())
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Stop this retainer's thread (:meth:`after_commit_soon`) after the step it removes, and join it."""
        self._stopping.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _guarded(self, protect: set[int], stop: Callable[[], bool] | None, commits: int, *,
                 lock_timeout: float) -> list[StepRemoval]:
        try:
            done, whole = self._round(protect, stop, lock_timeout=lock_timeout)
        except Exception:  # noqa: BLE001 - a failed cleanup must never stop the writer or the host
            logger.exception("skipweave: role %s: retention round failed", self.store.role)
            return []
        if whole:
            with self._lock:
                self._settled = max(self._settled, commits)
        return done

    def _round(self, protect: set[int], stop: Callable[[], bool] | None = None, *,
               lock_timeout: float = 0.0) -> tuple[list[StepRemoval], bool]:
        """One round; returns what it removed or kept, and whether it ran whole (not skipped, not cut short)."""
        store = self.store
        rdir = role_dir(store.dump_dir, store.namespace, store.role)
        if not is_real_dir(rdir):
            return [], True
        lock = role_lock(store.dump_dir, store.namespace, store.role, timeout=lock_timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            logger.debug("skipweave: role %s: another process cleans it; this round is skipped", store.role)
            return [], False
        try:
            protect = protect | store.held_steps()  # read under the role lock: what this process writes or resumes now
            plan = plan_retention(store, self.rule, protect=protect)
            for item in plan.remove:
                if stop is not None and stop():
                    item.outcome, item.detail = "skipped", "the process is ending"
                    continue
                remove_step(store, item, lock_timeout=0, protect=protect)
            for trash in trash_folders(store.dump_dir, store.namespace, store.role):  # a killed round's leftovers
                if stop is not None and stop():
                    break
                with contextlib.suppress(OSError):
                    remove_tree(trash)
        finally:
            lock.release()
        done = [i for i in plan.remove if i.outcome == "removed"]
        if done:
            logger.info("skipweave: role %s: removed %d recorded step(s) (%s; %d bytes) under skip.%s.keep",
                        store.role, len(done), ", ".join(str(i.step) for i in done), sum(i.bytes for i in done),
                        store.role)
        for item in plan.remove + plan.kept:
            if item.outcome in ("skipped", "failed"):
                logger.debug("skipweave: role %s step %d kept this round: %s", store.role, item.step, item.detail)
        whole = not (stop is not None and stop())
        if whole:
            from skipweave.store.upkeep import clean_role  # (here: upkeep builds on this module)

            clean_role(store.dump_dir, store.namespace, store.role, stop=stop)
        return plan.remove + plan.kept, whole


_THREADED: weakref.WeakSet[Retainer] = weakref.WeakSet()  # retainers that started a thread of rounds


def stop_rounds() -> None:
    """Stop and join every thread of rounds (:meth:`Retainer.after_commit_soon`) of this process: at its end
    (:data:`skipweave.lifecycle.STOP`), before the interpreter finalizes."""
    for retainer in list(_THREADED):
        retainer.stop()


def _after_fork_in_child() -> None:
    _THREADED.clear()  # the parent's threads are not in the child (each store resets its retainer, see after_fork)


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["FINAL_ROUND_S", "Retainer", "stop_rounds"]
