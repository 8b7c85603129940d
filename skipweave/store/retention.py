"""Retention of recorded steps: which whole steps of one role go (``skip.<role>.keep``, ``skipweave gc --keep-last``),
and their crash-safe removal.

One judgement for the run and the CLI: :func:`plan_retention` lists the steps a :class:`KeepRule` selects in one
``{dump_dir}/{namespace}/{role}``, :func:`remove_step` removes one of them, and :class:`Retainer` runs both in a
recording process after it committed a new step, and once more at the run's end (:meth:`Retainer.final_round`,
bounded by :data:`FINAL_ROUND_S`). The rule:

1. ``last``: every step but the newest ``last`` (by step number) is selected;
2. ``max_bytes``: then the oldest steps left are selected until the role's steps hold at most ``max_bytes``.

Never selected: a pinned step, a step this process has just written or is still writing, and a *busy* step, one
with a part that is not closed whose writer may still be adding to it (its writer runs on this machine, or it
changed less than ``min_age`` seconds ago: a writer elsewhere cannot be asked). Such steps are kept and said so;
the rule then takes the next candidate, so the role may stay above ``max_bytes``.

Removal is crash-safe: under the lock of every part of the step (``part_lock``, the one every writer of a part
holds while it commits), the step is judged again, then its folder is renamed to ``{role}/.trash-{step}-{token}``
in one ``rename``: from that instant no reader finds any of it (readers look only at step-named folders), and a
kill at any later point leaves a trash folder that ``skipweave gc`` removes, never part of a step that is served.
A writer that had the folder open when it moved notices (:class:`~skipweave.store.errors.StoreMoved`) and commits
nothing there. At most one process cleans a role at a time (``{role}/.retention.lock``, never waited for by a run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Container, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import filelock

from skipweave import lifecycle
from skipweave.store.atomic import fsync_dir
from skipweave.store.format.layout import (
    PART_SUFFIX,
    TMP_PREFIX,
    list_steps,
    parse_group_name,
    parse_manifest_name,
    parse_payload_name,
    role_dir,
    touch_role,
)
from skipweave.store.fs import inside, is_real_dir, remove_tree
from skipweave.store.identity import writer_running
from skipweave.store.parts import part_lock

if TYPE_CHECKING:
    from skipweave.store.step_store import StepStore

logger = logging.getLogger(__name__)

TRASH_PREFIX = ".trash-"
"""Name prefix of a step folder being removed (``{role}/.trash-{step}-{token}``): never served, removed by gc."""
RETENTION_LOCK = ".retention.lock"
"""The role folder's lock file held by the one process cleaning the role."""
OPEN_PART_AGE_S = 3600.0
"""Seconds a part that is not closed keeps its step in a run's retention after its last change, when its writer
cannot be asked (another machine): ``skipweave gc``'s default ``--min-age``."""

_TRASH_RE = re.compile(r"^\.trash-(?:0|-?[1-9][0-9]*)-[0-9a-f]{12}\Z", re.ASCII)
_LOCK_RE = re.compile(r"^\.(?P<shard>[A-Za-z0-9_][A-Za-z0-9_\-]*)\.part\.lock\Z", re.ASCII)


def is_trash_name(name: str) -> bool:
    """True for the name of a step folder retention set aside for removal (``.trash-{step}-{12 hex digits}``)."""
    return _TRASH_RE.match(name) is not None


@dataclass(frozen=True)
class KeepRule:
    """Which steps of a role are kept (``skip.<role>.keep``; ``skipweave gc --keep-last/--max-bytes/--pin``).

    Attributes:
        last: keep at most the newest ``last`` steps (a count >= 1), ``None``: no count limit.
        max_bytes: then remove the oldest steps left until the role's steps hold at most this many bytes,
            ``None``: no size limit.
        pin: steps never removed (anything supporting ``in``: a ``StepSet``, a set of ints).
    """

    last: int | None = None
    max_bytes: int | None = None
    pin: Container[int] = ()

    @property
    def active(self) -> bool:
        """Whether the rule removes anything at all (``last`` or ``max_bytes`` set): else every step is kept."""
        return self.last is not None or self.max_bytes is not None


@dataclass
class StepRemoval:
    """One step the rule selects, or one it would select but keeps, and what became of it.

    Attributes:
        namespace, role, step: the step.
        folder: its folder (``{dump_dir}/{namespace}/{role}/{step}``).
        bytes: total size of the files below it (bytes; symlinks count as themselves).
        files: number of files below it.
        reason: why the rule selects it (``beyond the newest 3 steps``, ``role over 1.0 GiB``).
        outcome: ``would_remove`` (dry run), ``removed``, ``skipped`` (kept for safety) or ``failed``.
        detail: why it was kept or failed, else ``None``.
    """

    namespace: str
    role: str
    step: int
    folder: str
    bytes: int
    files: int
    reason: str
    outcome: str = "would_remove"
    detail: str | None = None

    @property
    def where(self) -> str:
        """Short human label, e.g. ``default/rollout step 3``."""
        return f"{self.namespace}/{self.role} step {self.step}"


@dataclass
class RetentionPlan:
    """What :func:`plan_retention` found in one role.

    Attributes:
        namespace, role: the role.
        steps: every step folder, ascending.
        bytes: total bytes of the role's steps.
        remove: the selected steps, oldest first (``outcome`` ``would_remove``).
        kept: steps the rule would select but that stay (``outcome`` ``skipped``, ``detail`` says why).
    """

    namespace: str
    role: str
    steps: list[int] = field(default_factory=list)
    bytes: int = 0
    remove: list[StepRemoval] = field(default_factory=list)
    kept: list[StepRemoval] = field(default_factory=list)


@dataclass
class _Step:
    step: int
    folder: str
    bytes: int
    files: int


def plan_retention(store: StepStore, rule: KeepRule, *, protect: Collection[int] = (), min_age: float = OPEN_PART_AGE_S,
                   now: float | None = None) -> RetentionPlan:
    """Select the whole steps of ``store``'s role that ``rule`` removes; nothing is touched.

    Args:
        store: the role's store (a run's own, or a read-only one of the CLI): its part states and the writers of
            its entries are judged as the store judges them.
        rule: the rule; an inactive one selects nothing.
        protect: steps never selected (those this process just committed or is writing).
        min_age: seconds since its last change during which a part that is not closed, whose writer cannot be
            asked, keeps its step.
        now: the time to judge ages by (unix seconds), default now.

    Returns:
        The :class:`RetentionPlan`.
    """
    now = time.time() if now is None else now
    plan = RetentionPlan(store.namespace, store.role)
    if not rule.active:
        return plan
    steps = [s for s in (_measure(store, step) for step in list_steps(store.dump_dir, store.namespace, store.role))
             if s is not None]
    plan.steps = [s.step for s in steps]
    plan.bytes = sum(s.bytes for s in steps)
    selected: dict[int, str] = {}  # step -> why the rule selects it
    blocked: dict[int, str] = {}  # selected step -> why it stays all the same
    for s in steps[: max(0, len(steps) - rule.last)] if rule.last is not None else []:
        selected[s.step] = f"beyond the newest {rule.last} step{'s' if rule.last != 1 else ''}"
        if (why := _blocked(store, s.step, rule, protect, min_age, now)) is not None:
            blocked[s.step] = why
    total = plan.bytes - sum(s.bytes for s in steps if s.step in selected and s.step not in blocked)
    if rule.max_bytes is not None:
        for s in steps:  # oldest first; a step that must stay is passed over for the next one
            if total <= rule.max_bytes:
                break
            if s.step in selected:
                continue
            selected[s.step] = f"the role's steps hold more than {rule.max_bytes} bytes"
            if (why := _blocked(store, s.step, rule, protect, min_age, now)) is not None:
                blocked[s.step] = why
            else:
                total -= s.bytes
    for s in steps:
        if s.step not in selected:
            continue
        item = StepRemoval(store.namespace, store.role, s.step, s.folder, s.bytes, s.files, selected[s.step])
        if s.step in blocked:
            item.outcome, item.detail = "skipped", blocked[s.step]
            plan.kept.append(item)
        else:
            plan.remove.append(item)
    return plan


def _measure(store: StepStore, step: int) -> _Step | None:
    """Size and file count of a step folder (nothing followed through a symlink); ``None`` when it is gone or is
    no real folder."""
    try:
        folder = inside(store.dump_dir, store.namespace, store.role, str(step))
    except (OSError, ValueError):
        return None
    if not is_real_dir(folder):
        return None
    size = files = 0
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            size += entry.stat(follow_symlinks=False).st_size
                            files += 1
                    except OSError:
                        continue  # removed meanwhile
        except OSError:
            continue
    return _Step(step, folder, size, files)


def _blocked(store: StepStore, step: int, rule: KeepRule, protect: Collection[int], min_age: float,
             now: float) -> str | None:
    """Why a step may not be removed now, else ``None``."""
    if step in rule.pin:
        return "pinned"
    if step in protect:
        return "just written by this process"
    return busy(store, step, min_age=min_age, now=now)


def busy(store: StepStore, step: int, *, min_age: float, now: float | None = None) -> str | None:
    """Why a writer may still be adding to a step, else ``None``: a part of it that is not closed (its
    ``{shard}.part.json`` does not say ``closed``) whose writer runs on this machine, or, when that cannot be told
    (another machine, an entry naming no writer, no entry yet), that changed less than ``min_age`` seconds ago.

    A part whose writers all ended (an interrupted run's) does not keep the step: it is never served anyway.
    """
    now = time.time() if now is None else now
    for target, shard, folder in _parts(store, step):
        if store.part_info(step, target, shard).closed:
            continue
        where = f"target {target} shard {shard} is not closed"
        running = [writer_running(r.writer) for r in store.part_calls(step, target, shard)]
        if any(running):
            return f"{where} and its writer is running"
        if (None in running or not running) and now - _newest(folder, shard) < min_age:
            return f"{where} and changed less than {min_age:.0f} s ago (its writer may still be adding to it)"
    return None


def _parts(store: StepStore, step: int) -> list[tuple[str, str, str]]:
    """``(target, shard, folder)`` of every part of a step that its folder's names show (manifests, groups, part
    files, payloads, temporary files and lock files), sorted (the order locks are taken in)."""
    out: list[tuple[str, str, str]] = []
    try:
        step_dir = inside(store.dump_dir, store.namespace, store.role, str(step))
        targets = sorted(n for n in os.listdir(step_dir) if not n.startswith(".")
                         and is_real_dir(os.path.join(step_dir, n)))
    except (OSError, ValueError):
        return out
    for target in targets:
        folder = os.path.join(step_dir, target)
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for shard in sorted({s for s in (_shard_of(n) for n in names) if s is not None}):
            try:
                store.key(step, target, shard, 0)  # names checked as the store checks them
            except ValueError:  # a name skipweave never writes: removed with the step, no lock to take
                continue
            out.append((target, shard, folder))
    return out


def _shard_of(name: str) -> str | None:
    if (m := _LOCK_RE.match(name)) is not None:
        return m.group("shard")
    if name.startswith(TMP_PREFIX):
        return None
    if name.endswith(PART_SUFFIX):
        return name[: -len(PART_SUFFIX)] or None
    if (parsed := parse_manifest_name(name)) is not None:
        return parsed[0]
    if (grouped := parse_group_name(name)) is not None:
        return grouped[0]
    if (payload := parse_payload_name(name)) is not None:
        return payload[0].rsplit("-", 1)[0]
    return None


def _newest(folder: str, shard: str) -> float:
    """Newest modification time (unix seconds) of a part's files and of its folder."""
    newest = 0.0
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        for entry in it:
            if entry.name.startswith((shard + "-", shard + ".", "." + shard + ".", TMP_PREFIX)):
                with contextlib.suppress(OSError):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    with contextlib.suppress(OSError):
        newest = max(newest, os.lstat(folder).st_mtime)
    return newest


def remove_step(store: StepStore, item: StepRemoval, *, lock_timeout: float, min_age: float = OPEN_PART_AGE_S,
                protect: Collection[int] = (), now: float | None = None) -> None:
    """Remove one selected step crash-safely; set ``item.outcome`` (``removed``, ``skipped`` or ``failed``) and
    ``item.detail``.

    Under the lock of every part of the step (each waited for at most ``lock_timeout`` seconds, else the step is
    kept this round), the step is judged again (:func:`busy`); then its folder is renamed to a trash name and
    deleted. Never raises for the step: an ``OSError`` sets ``failed`` (a trash folder left behind is removed by
    ``skipweave gc``).

    Args:
        store: the role's store.
        item: a step of :attr:`RetentionPlan.remove`.
        lock_timeout: seconds to wait for each part's lock (0: never wait).
        min_age: as :func:`plan_retention`'s.
        protect: steps never removed (as :func:`plan_retention`'s, judged again).
        now: the time to judge ages by (unix seconds), default now.
    """
    if item.step in protect:
        item.outcome, item.detail = "skipped", "just written by this process"
        return
    rdir = role_dir(store.dump_dir, store.namespace, store.role)
    try:
        with contextlib.ExitStack() as locks:
            if not is_real_dir(item.folder) or not is_real_dir(rdir):
                item.outcome, item.detail = "skipped", "already gone"
                return
            for _target, shard, folder in _parts(store, item.step):
                locks.enter_context(part_lock(folder, shard, timeout=lock_timeout))
            why = busy(store, item.step, min_age=min_age, now=now)
            if why is not None:
                item.outcome, item.detail = "skipped", why
                return
            trash = os.path.join(rdir, f"{TRASH_PREFIX}{item.step}-{uuid.uuid4().hex[:12]}")
            os.rename(item.folder, trash)  # the commit of the removal: from here on nothing of the step is served
            fsync_dir(rdir)
        touch_role(store.dump_dir, store.namespace, store.role)  # (the rename moved it too; runs re-read steps)
        remove_tree(trash)
    except filelock.Timeout:
        item.outcome, item.detail = "skipped", "a writer holds the lock of one of its parts"
        return
    except OSError as exc:
        item.outcome, item.detail = "failed", f"{type(exc).__name__}: {exc}"
        return
    item.outcome, item.detail = "removed", None


def trash_folders(dump_dir: str, namespace: str, role: str) -> list[str]:
    """The trash folders (and anything else at a trash name) of a role, sorted."""
    rdir = role_dir(dump_dir, namespace, role)
    try:
        return sorted(os.path.join(rdir, n) for n in os.listdir(rdir) if is_trash_name(n))
    except OSError:
        return []


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

    def __init__(self, store: StepStore, rule: KeepRule) -> None:
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


def role_lock(dump_dir: str, namespace: str, role: str, *, timeout: float) -> filelock.FileLock:
    """The lock of the one process cleaning a role (``{role}/.retention.lock``), for ``skipweave gc``.

    Args:
        timeout: seconds to wait for it before ``filelock.Timeout``.
    """
    return filelock.FileLock(os.path.join(role_dir(dump_dir, namespace, role), RETENTION_LOCK), timeout=timeout)


__all__ = ["FINAL_ROUND_S", "OPEN_PART_AGE_S", "RETENTION_LOCK", "TRASH_PREFIX", "KeepRule", "RetentionPlan",
           "Retainer", "StepRemoval", "busy", "is_trash_name", "plan_retention", "remove_step", "role_lock",
           "stop_rounds", "trash_folders"]
