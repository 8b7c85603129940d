"""The life of a part (the calls of one step, target and shard) in this process: prepared, recorded into, closed,
or set aside when an interrupted run left it incomplete.

Part of :class:`~skipweave.store.step_store.StepStore`. Any number of parts may be open at once (async rollouters keep
many steps in flight). A part is closed (``{shard}.part.json`` says ``closed``) when a call of another step of its
(target, shard) is prepared and none of its own calls is still running, else when its last running call ends; a part
a call of which failed is left open, so the next run judges it by its calls. A short part an interrupted run left is
set aside, or resumed when its calls can be matched by their inputs (:mod:`~skipweave.store.resume`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable

import filelock

from skipweave.store.atomic import fsync_dir, write_bytes_atomic
from skipweave.store.cache import ValidatedCache
from skipweave.store.folders import RoleFolders
from skipweave.store.foreign import describe, foreign_in
from skipweave.store.format import jsonio
from skipweave.store.format.layout import (
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    TMP_PREFIX,
    EntryKey,
    group_stem,
    list_steps,
    part_path,
    role_dir,
)
from skipweave.store.fs import lock_path
from skipweave.store.identity import is_concurrent_other, is_other_of_run, started_unix, this_writer
from skipweave.store.index import PartIndex, PartInfo, StepIndex, calls_in, part_state
from skipweave.store.pending import Part, PendingWrites
from skipweave.store.resume import Resumes

logger = logging.getLogger(__name__)

RECENT_MAX_AGE_S = 1.0
"""Longest time (seconds) the role's newest steps are trusted without listing its folder again (a step folder made in
the same mtime tick as the last listing shows within it)."""

LOCK_TIMEOUT_S = 600.0
"""Seconds a writer waits for another writer of the same part before giving up."""


def part_lock(folder: str, shard: str, *, timeout: float = LOCK_TIMEOUT_S) -> filelock.FileLock:
    """The file lock (``.{shard}.part.lock`` in the part's folder, kept) every writer of a part holds while it commits
    an entry of the part, sets the part aside or removes anything of it: the store's writers, the background writer
    and ``skipweave gc`` alike. One lock per part, not per entry: a group commit of many small entries takes one lock,
    and creates no lock file per entry.

    Args:
        folder: the part's folder (its step and target).
        shard: the part's shard, e.g. ``r0``.
        timeout: seconds to wait for it before ``filelock.Timeout``.
    """
    return filelock.FileLock(lock_path(folder, f".{shard}.part.lock"), timeout=timeout)


def calls_committed(calls: int, expected: int | None) -> str:
    """How a part never closed reads in messages: ``3 of 4 calls committed and never closed``, or with ``expected``
    unknown (``None``, see :meth:`PartStates.expected_calls`) ``3 calls committed (calls per step unknown) and never
    closed``."""
    if expected is None:
        return f"{calls} call{'s' if calls != 1 else ''} committed (calls per step unknown) and never closed"
    return f"{calls} of {expected} calls committed and never closed"


class PartStates:
    """Which parts this process prepares, records into, keeps open and closes; and whether a part may be served.

    Args:
        folders: the role's folders.
        parts: the role's part index.
        steps: the role's index of recorded steps.
        pending: the role's entries being written in the background.
        calls_per_step: calls one shard makes per step, when known.
        lock: the store's lock (reentrant: closing a part reads it).
    """

    def __init__(self, folders: RoleFolders, parts: PartIndex, steps: StepIndex, pending: PendingWrites,
                 calls_per_step: int | None, lock: threading.RLock) -> None:
        self._folders = folders
        self._parts = parts
        self._steps = steps
        self._pending = pending
        self.calls_per_step = calls_per_step
        self._expected: dict[str, int] = {}  # target -> calls per step a host told at run time (expect_calls)
        self.lock = lock
        self._writing: set[Part] = set()  # parts this process records into
        self._checked: set[Part] = set()  # parts checked for interrupted leftovers
        self._checking: dict[Part, threading.Event] = {}  # parts being checked now: set once judged
        # Parts that held no committed call when this process first prepared a call of them (or that it set aside):
        # whatever they hold since was written by this process or alongside it, none of which serves it.
        self._new: set[Part] = set()
        self._open: set[Part] = set()  # parts this process recorded into and has not closed
        self._running: dict[Part, int] = {}  # part -> its real calls in progress
        self._passed: set[Part] = set()  # open parts a call of a later step passed: closed once idle
        # Parts a real call of which raised (Ctrl-C, a preemption's SystemExit, a host error) with no later call
        # of the part succeeding: never marked closed, so the next run judges them by their calls and sets a
        # short one aside instead of serving it mixed with new calls.
        self._failed: dict[Part, int] = {}  # part -> number of its latest failed call (see call_started)
        self._calls_started = 0  # real calls started: a failure is undone only by a call started after it
        self._draining = False  # close_all ran: parts still running close when their calls end
        # Parts seen closed, kept by their folder's mtime then: the repeat actions need not re-read every part file
        # on every call (one lstat tells whether anything in the folder changed since, by any process).
        self.closed_seen: ValidatedCache[Part, bool] = ValidatedCache()
        # The role's newest steps, kept by the role folder's mtime (a step added or removed changes it) for at most
        # RECENT_MAX_AGE_S: expected_calls asks for every part a scan judges, and listing the role folder each time
        # made a scan of N steps take N listings of N names.
        self._recent: ValidatedCache[str, list[int]] = ValidatedCache(max_entries=4)
        self.resumes = Resumes(lock)  # short parts of an interrupted run this process resumes
        # Sets the given calls of a part aside when a resumed part closes (the store's
        # :meth:`~skipweave.store.step_store.StepStore.set_aside_calls`); returns False when it could not.
        self.settle: Callable[[Part, frozenset[int]], bool] | None = None

    def mark_open(self, part: Part) -> None:
        """An entry of ``part`` was handed to the background writer: a call of a later step passes it (and it closes
        once its writes end)."""
        with self.lock:
            self._open.add(part)

    def expect_calls(self, target: str, calls: int) -> None:
        """Every shard makes ``calls`` calls of ``target`` per step (over ``calls_per_step``); see
        :meth:`~skipweave.store.step_store.StepStore.expect_calls`."""
        self._expected[target] = calls

    def known_calls(self, target: str) -> int | None:
        """Calls one shard makes per step of ``target`` when told (:meth:`expect_calls`, else ``calls_per_step``)."""
        return self._expected.get(target, self.calls_per_step)

    def expected_calls(self, target: str, shard: str) -> int | None:
        """Calls one shard makes per step: as told (:meth:`known_calls`), else the most seen in a closed part of the
        newest 8 steps, else ``None`` (unknown: nothing told, no closed part, e.g. retention removed them)."""
        known = self.known_calls(target)
        if known is not None:
            return known
        best = 0
        for step in self._recent_steps():
            info = self._parts.part_info(step, target, shard)
            if info.closed:
                best = max(best, info.contiguous)
        return best or None

    def _recent_steps(self) -> list[int]:
        """The newest 8 steps with a folder under the role (see :func:`list_steps`), listed again once the role
        folder's mtime changed or :data:`RECENT_MAX_AGE_S` passed."""
        f = self._folders
        path = role_dir(f.dump_dir, f.namespace, f.role)
        try:
            st = os.stat(path)
            validator: tuple[int, int] | None = (st.st_mtime_ns, st.st_ino)
        except OSError:
            validator = None
        recent = self._recent.get(path, validator, max_age=RECENT_MAX_AGE_S)
        if recent is None:
            recent = list_steps(f.dump_dir, f.namespace, f.role)[-8:]
            self._recent.put(path, validator, recent)
        return recent

    def is_complete(self, step: int, target: str, shard: str) -> bool:
        """True when a part may be served: closed by its writer, or holding every expected call; when the calls a step
        makes are unknown (:meth:`expected_calls`), only a part of one call (call 0) that was never closed: a part of
        more calls never closed may be a step a killed run left short, which is resumed by inputs or set aside, never
        served by position."""
        part = (step, target, shard)
        with self.lock:
            if part in self._writing or self._pending.has(part) or self.resumes.holds(part):
                return True
        mtime = self._folders.mtime(step, target)
        if self.closed_seen.get(part, mtime):
            return True
        # mtime taken before reading: a change made while reading shows at the next call
        info = self._parts.part_info(step, target, shard)
        if info.calls and info.closed:
            self.closed_seen.put(part, mtime, True)
        else:
            self.closed_seen.pop(part)
        if not info.calls:
            return False
        if info.closed:
            return True
        expected = self.expected_calls(target, shard)
        if expected is None:
            return info.calls == (0,)
        return info.contiguous >= expected

    def prepare(self, step: int, target: str, shard: str, set_aside: Callable[..., str | None], *,
                resumable: bool = False) -> None:
        """Before a call of a part: close this shard's other open parts that are idle, resume or set aside leftovers
        (with ``set_aside``, :meth:`set_aside`'s signature); see
        :meth:`~skipweave.store.step_store.StepStore.prepare_part`.
        """
        part = (step, target, shard)
        with self.lock:
            for other in [p for p in self._open if p[0] != step and p[1] == target and p[2] == shard]:
                if self._running.get(other, 0):
                    self._passed.add(other)  # still being recorded (concurrent steps): closed when its calls end
                else:
                    self.close(*other)
            checking = self._checking.get(part)
            if checking is None and (part in self._writing or part in self._checked):
                return
            if checking is None:
                self._checked.add(part)
                checking = self._checking[part] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:
            # another thread judges the part now: its calls wait for the verdict (a call deciding before the part is
            # resumed or set aside would take the leftovers for a recording of its own run, or record beside them)
            checking.wait()
            return
        try:
            self._judge(part, set_aside, resumable)
        finally:
            with self.lock:
                self._checking.pop(part, None)
            checking.set()

    def _judge(self, part: Part, set_aside: Callable[..., str | None], resumable: bool) -> None:
        """:meth:`prepare`'s first look at a part in this process: new, complete, or an interrupted run's leftover to
        resume or set aside."""
        step, target, shard = part
        info = self._parts.part_info(step, target, shard)
        if not info.calls:
            with self.lock:
                self._new.add(part)
        elif not self.is_complete(step, target, shard):
            me, started = this_writer(), started_unix()

            def taken_up() -> bool:  # another writer of this run records into it: not an interrupted run's leftover
                return any(is_concurrent_other(r, me, started) for r in self._parts.part_calls(step, target, shard))

            if taken_up():
                return
            if found := self._parts.foreign_calls(step, target, shard):
                # a newer skipweave's entries: neither resumed nor set aside; its calls run live, the free slots
                # are recorded into
                logger.info("skipweave: role %s target %s step %d shard %s is incomplete and holds %s; it is left "
                            "as it is", self._folders.role, target, step, shard, describe(list(found.values())))
                return
            if resumable and self._resume(part, info.calls):
                return
            reason = calls_committed(len(info.calls), self.expected_calls(target, shard))
            if set_aside(step, target, shard, reason=reason,
                         unless=lambda: self.is_complete(step, target, shard) or taken_up()) is not None:
                with self.lock:
                    self._new.add(part)

    def _resume(self, part: Part, calls: tuple[int, ...]) -> bool:
        """Resume a short part an interrupted run left (see :mod:`~skipweave.store.resume`) when a step makes more than
        one call and every entry carries an input fingerprint; True when it is resumed."""
        step, target, shard = part
        expected = self.expected_calls(target, shard)
        # a step of one call has nothing to resume; unknown: the part's own calls show a step makes several
        if (expected if expected is not None else len(calls)) <= 1 \
                or not self.resumes.matchable(self._parts.part_calls(step, target, shard), calls):
            return False
        self.resumes.adopt(part, calls)
        self._steps.add(step, target, shard)  # servable to the calls of its step (as a part this process writes)
        logger.info("skipweave: role %s target %s step %d shard %s was left incomplete by an interrupted run (%s); "
                    "resuming it: each entry serves the call with its inputs, the other calls run live",
                    self._folders.role, target, step, shard, calls_committed(len(calls), expected))
        return True

    def held_steps(self) -> set[int]:
        """Steps with a part this process records into, keeps open or resumes: retention never removes them."""
        with self.lock:
            return {p[0] for p in self._writing | self._open} | self.resumes.steps()

    def is_resumed(self, step: int, target: str, shard: str) -> bool:
        """True while this process resumes the part (:mod:`~skipweave.store.resume`): its entries serve the calls of
        their own step by inputs only."""
        return self.resumes.holds((step, target, shard))

    def is_new(self, step: int, target: str, shard: str) -> bool:
        """True when the part held nothing when this process first prepared a call of it (or was set aside by it)."""
        with self.lock:
            return (step, target, shard) in self._new

    def set_aside(self, step: int, target: str, shard: str, *, reason: str,
                  unless: Callable[[], bool] | None = None) -> str | None:
        """Move a part's files to ``_set_aside/{step}-{target}-{shard}-{time}/``; see
        :meth:`~skipweave.store.step_store.StepStore.set_aside`."""
        self._folders.key(step, target, shard, 0)
        self.closed_seen.pop((step, target, shard))
        self.resumes.forget((step, target, shard))
        self._steps.drop(target, shard)
        folder = self._folders.folder(step, target)
        when = time.strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
        with part_lock(folder, shard):
            if unless is not None and unless():
                return None
            try:
                names = [n for n in os.listdir(folder) if n.startswith(shard + "-") or n == shard + PART_SUFFIX]
            except FileNotFoundError:
                return None
            if not names:
                return None
            if found := foreign_in(folder, shard, names):  # kept as it is, whatever this code thinks of the part
                logger.warning("skipweave: role %s target %s step %d shard %s is not set aside (%s): it holds %s",
                               self._folders.role, target, step, shard, reason, describe(found))
                return None
            dest = self._folders.set_aside_folder(f"{step}-{target}-{shard}-{when}")
            for n in names:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(os.path.join(folder, n), os.path.join(dest, n))
            fsync_dir(folder)
        self._steps.touch()
        logger.warning(
            "skipweave: role %s target %s step %d shard %s was left incomplete by an interrupted run (%s); "
            "set aside to %s and recording it afresh",
            self._folders.role, target, step, shard, reason, dest,
        )
        return dest

    def discard(self, key: EntryKey, *, reason: str) -> None:
        """Move an unusable entry's files to ``_set_aside/``; see :meth:`~skipweave.store.step_store.StepStore.discard`.
        """
        self.closed_seen.pop((key.step, key.target, key.shard))
        self._steps.drop(key.target, key.shard)
        folder = self._folders.folder(key.step, key.target)
        with part_lock(folder, key.shard):
            dest = self._folders.set_aside_folder(
                f"{key.step}-{key.target}-{key.stem}-unusable-{uuid.uuid4().hex[:6]}")
            names = os.listdir(folder)
            stems = [key.stem]
            if key.stem + MANIFEST_SUFFIX not in names:
                stems += [group_stem(key.shard, first, last) for first, last, _ in calls_in(names, key.shard)[1]
                          if first <= key.call <= last]
            for n in names:
                if n.startswith(tuple(stem + "." for stem in stems)) and not n.startswith(TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(os.path.join(folder, n), os.path.join(dest, n))
        self._steps.touch()
        logger.warning("skipweave: entry %s not served (%s); moved to %s, running live and recording it afresh",
                       key, reason, dest)

    def call_started(self, step: int, target: str, shard: str) -> int:
        """A real call that will be recorded into this part began; returns its number, for :meth:`call_ended`."""
        part = (step, target, shard)
        with self.lock:
            self._running[part] = self._running.get(part, 0) + 1
            self._calls_started += 1
            return self._calls_started

    def call_ended(self, step: int, target: str, shard: str, *, failed: bool = False, number: int = 0) -> None:
        """That call ended; see :meth:`~skipweave.store.step_store.StepStore.call_ended` (``number``: what
        :meth:`call_started` returned, 0 when unknown)."""
        part = (step, target, shard)
        with self.lock:
            if failed:
                self._failed[part] = max(self._failed.get(part, 0), number or self._calls_started)
            elif not number or number > self._failed.get(part, 0):
                self._failed.pop(part, None)
            running = self._running.get(part, 0) - 1
            if running > 0:
                self._running[part] = running
                return
            self._running.pop(part, None)
            if part in self._open and (part in self._passed or self._draining):
                self.close(*part)

    def close(self, step: int, target: str, shard: str) -> None:
        """Mark a part this process recorded as complete; see
        :meth:`~skipweave.store.step_store.StepStore.close_part`."""
        part = (step, target, shard)
        with self.lock:
            self._open.discard(part)
            self._passed.discard(part)
            self._writing.discard(part)
            failed = part in self._failed
        if failed:
            logger.info("skipweave: role %s target %s step %d shard %s left open: a call of it failed",
                        self._folders.role, target, step, shard)
            return
        known = self.known_calls(target)
        info = self._parts.part_info(step, target, shard)
        if self.resumes.holds(part):
            if not self._settle_resumed(part, info, known):
                return
        elif known is not None and info.contiguous < known:
            return
        with contextlib.suppress(OSError):
            self._write_state(self._folders.key(step, target, shard, 0), "closed")

    def _settle_resumed(self, part: Part, info: PartInfo, known: int | None) -> bool:
        """Before a resumed part is closed: set aside the interrupted run's entries that served no call of this
        process (their inputs differed). False when the part stays open: it would hold fewer calls than a step makes
        without them, or they could not be moved (the next run resumes it again)."""
        unclaimed = self.resumes.unclaimed(part)
        if known is not None and len(set(info.calls) - unclaimed) < known:
            return False
        me = this_writer()
        if unclaimed and any(is_other_of_run(r, me) for r in self._parts.part_calls(*part)):
            # another process of this run records into the part too and may have been served what this one was
            # not: nothing is moved (a part of several writers is matched by inputs only)
            logger.info("skipweave: role %s target %s step %d shard %s: %d entries of the interrupted run served no "
                        "call of this process; kept, other processes of this run write into the part",
                        self._folders.role, part[1], part[0], part[2], len(unclaimed))
        elif unclaimed:
            try:
                if self.settle is None or not self.settle(part, unclaimed):
                    return False
            except Exception as exc:  # e.g. a symlinked _set_aside: left open, never mixed into a closed part
                logger.warning("skipweave: role %s target %s step %d shard %s: the %d entries of the interrupted run "
                               "no call was served could not be set aside (%s: %s); the part is left open",
                               self._folders.role, part[1], part[0], part[2], len(unclaimed), type(exc).__name__, exc)
                return False
        self.resumes.forget(part)
        return True

    def close_all(self) -> None:
        """Close every part this process left open, but those with a call still running (they close when it ends)."""
        with self.lock:
            self._draining = True
            parts = sorted(p for p in self._open if not self._running.get(p, 0))
        for part in parts:
            self.close(*part)

    def committed(self, kept: list[EntryKey]) -> None:
        """Count the parts of entries now committed (or another writer's kept) as this process's, servable and
        open."""
        with self.lock:  # only now: a failed write leaves no part of this process's to close at exit
            for key in kept:
                self._writing.add((key.step, key.target, key.shard))
                self._open.add((key.step, key.target, key.shard))
        for key in kept:
            self._steps.add(key.step, key.target, key.shard)  # a part this process writes is servable

    def mark_recorded(self, committed: list[EntryKey], leftovers: dict[EntryKey, list[str]]) -> None:
        """After commits: each part's state once (one role mtime bump each), and a WARNING per entry whose
        bookkeeping failed (committed and servable all the same)."""
        parts: dict[Part, EntryKey] = {}
        for key in committed:
            parts.setdefault((key.step, key.target, key.shard), key)
        for key in parts.values():
            try:
                if part_state(part_path(self._folders.dump_dir, key)) == "open":
                    self._steps.touch()  # already open (a group commit per wake): no file rewritten
                else:
                    self._write_state(key, "open")
            except OSError as exc:
                leftovers.setdefault(key, []).append(f"its part state ({type(exc).__name__}: {exc})")
        for key, left in leftovers.items():
            if left:
                logger.warning("skipweave: recorded %s (committed and servable), but could not update %s",
                               key, "; ".join(left))

    def _write_state(self, key: EntryKey, state: str) -> None:
        folder = self._folders.folder(key.step, key.target)
        if not os.path.isdir(folder):  # the dump dir went away: never recreate folders just for the state
            raise FileNotFoundError(f"{folder} no longer exists")
        info = self._parts.part_info(key.step, key.target, key.shard)
        data = {"state": state, "calls": info.contiguous, "updated_unix": time.time(), "pid": os.getpid()}
        write_bytes_atomic(part_path(self._folders.dump_dir, key), jsonio.dumps_spaced(data))
        self._steps.touch()


__all__ = ["LOCK_TIMEOUT_S", "PartStates", "calls_committed", "part_lock"]
