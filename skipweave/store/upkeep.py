"""What interrupted writes leave behind, and who removes it: the one judgement of temporary and orphan payload files,
for a run's upkeep and ``skipweave gc`` alike, and a run's upkeep of its roles.

A writer killed in the middle of a commit (:mod:`skipweave.store.commit`) leaves ``.tmp-`` files, and, killed between
a payload's rename and its manifest's, an *orphan* payload file: never read, but as large as the entry (a preempted
week-long job keeps gigabytes of them). :func:`leftover_kept` decides whether one may go:

- a temporary file whose name says its writer (:func:`skipweave.store.atomic.tmp_writer`) ran on this machine (same
  host name, boot and pid namespace) goes as soon as that process has ended (its pid is free, or another process's:
  the start time differs), at any age; it stays, at any age, while that process runs: it may still commit it;
- any other (a writer on another host of a shared store, in another container, an older skipweave's name that names
  no writer, and every orphan payload file, whose name names none) goes once it was not modified for ``min_age``
  seconds: :data:`TEMPORARY_AGE_S` in a run, ``--min-age`` in gc;
- an orphan goes only under its part's lock (every writer of the part commits under it, so a writer that renamed a
  payload has renamed its manifest too by the time the lock is had), when still no manifest or group file lists it,
  and never from a part holding an entry of a foreign format version (:func:`holds_foreign`): a newer skipweave's
  files are not this code's to judge.

A run's upkeep (:func:`start`) walks each role it weaves once (per process and run) on a daemon thread of its own,
and again with every retention round (:class:`~skipweave.store.retainer.Retainer`), finding leftovers by their names
(:func:`~skipweave.store.leftovers.role_leftovers`); it stops after :data:`UPKEEP_MAX_S` seconds, or at once when the
process ends (the thread is joined before the interpreter finalizes), and logs what it removed at INFO.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import filelock

from skipweave import lifecycle
from skipweave.store.atomic import tmp_writer
from skipweave.store.errors import EntryInvalid
from skipweave.store.foreign import describe, foreign_in
from skipweave.store.format.group import read_group
from skipweave.store.format.layout import GROUP_SUFFIX, MANIFEST_SUFFIX, parse_group_data_name, parse_group_name
from skipweave.store.format.manifest import read_manifest
from skipweave.store.fs import remove_tree
from skipweave.store.identity import run_id
from skipweave.store.leftovers import Leftover, LeftoverKind, role_leftovers
from skipweave.store.parts import part_lock
from skipweave.store.retention import OPEN_PART_AGE_S
from skipweave.store.validity import group_data_names, payload_names, payload_stem

logger = logging.getLogger(__name__)

TEMPORARY_AGE_S = OPEN_PART_AGE_S
"""Seconds without a change after which a run removes a temporary file whose writer it cannot ask (another host of a
shared store, another container, a name that names no writer) and an orphan payload file: one hour, ``skipweave
gc``'s default ``--min-age``. No write of skipweave's leaves a file unchanged that long before its commit."""

UPKEEP_MAX_S = 10.0
"""Seconds a run's upkeep of one role takes at most; what it has not reached by then waits for the next one."""

__all__ = ["TEMPORARY_AGE_S", "UPKEEP_MAX_S", "Cleaned", "clean_role", "holds_foreign", "leftover_kept",
           "remove_orphan", "start", "stop"]


def leftover_kept(kind: LeftoverKind, path: str, modified: float, *, min_age: float, now: float,
                  age_name: str = "--min-age") -> str | None:
    """Why a temporary or orphan payload file must stay, ``None`` when it may go (the rule: module docstring).

    Args:
        kind: :attr:`LeftoverKind.TEMPORARY` or :attr:`LeftoverKind.ORPHAN`.
        path: the file.
        modified: its modification time (unix seconds).
        min_age: seconds without a change after which a file whose writer cannot be asked goes.
        now: the time to judge ages by (unix seconds).
        age_name: how ``min_age`` is called in the reason (``--min-age`` for gc).

    Returns:
        ``None``, or why it stays, for people.
    """
    writer = tmp_writer(os.path.basename(path)) if kind is LeftoverKind.TEMPORARY else None
    if writer is not None:
        running = writer.running()
        if running:
            return f"its writer (pid {writer.pid} on this host) is still running"
        if running is False:
            return None  # its writer ended: nobody commits it, whatever its age
    if now - modified < min_age:
        who = "its writer runs elsewhere (another host, container or boot)" if writer is not None \
            else "a run may still be writing it"
        return f"modified {now - modified:.0f} s ago, less than {age_name} {min_age:.0f} s; {who}"
    return None


def holds_foreign(folder: str, shard: str) -> str | None:
    """Why the part ``shard`` of ``folder`` holds an entry of a format version this code does not read (its manifest or
    group file, :class:`~skipweave.store.errors.EntryForeign`), else ``None``: nothing of such a part is removed as
    an orphan."""
    found = foreign_in(folder, shard)
    return f"its part holds {describe(found)}" if found else None


def remove_orphan(path: str, *, lock_timeout: float) -> str | None:
    """Remove one orphan payload file under its part's lock, judged again there; ``None`` when removed, else why not.

    Kept: a manifest or group file of its stem lists it now (a writer committed meanwhile), or its manifest cannot
    be read (it may list it), or its part holds a foreign entry (:func:`holds_foreign`).

    Args:
        path: the payload file (an entry's tree or tensor file, or a group's data file).
        lock_timeout: seconds to wait for the part's lock.

    Raises:
        filelock.Timeout: a writer holds the part's lock.
        OSError: it could not be removed.
    """
    folder, name = os.path.split(path)
    stem = payload_stem(name) or name
    grouped = parse_group_data_name(name) is not None
    parsed = parse_group_name(stem + GROUP_SUFFIX) if grouped else None
    shard = parsed[0] if parsed is not None else stem.rsplit("-", 1)[0]
    with part_lock(folder, shard, timeout=lock_timeout):
        foreign = holds_foreign(folder, shard)
        if foreign is not None:
            return foreign + ": nothing of it is removed"
        manifest_file = os.path.join(folder, stem + (GROUP_SUFFIX if grouped else MANIFEST_SUFFIX))
        if os.path.exists(manifest_file):
            try:
                referenced = group_data_names(read_group(manifest_file)) if grouped \
                    else payload_names(read_manifest(manifest_file))
            except EntryInvalid:
                referenced = None
            if referenced is None or name in referenced:
                return "a manifest refers to it now"
        try:
            remove_tree(path)  # a file, or a folder planted at its name
        except FileNotFoundError:
            return "already gone"
    return None


@dataclass
class Cleaned:
    """What one upkeep of a role did.

    Attributes:
        temporary, orphan: files of each kind removed.
        bytes: their total size.
        kept: ``(path, why)`` of the leftovers that stay.
        finished: the walk reached every folder of the role (not cut short by its time bound or the process's end).
    """

    temporary: int = 0
    orphan: int = 0
    bytes: int = 0
    kept: list[tuple[str, str]] = field(default_factory=list)
    finished: bool = True


def clean_role(dump_dir: str, namespace: str, role: str, *, stop: Callable[[], bool] | None = None,
               max_seconds: float = UPKEEP_MAX_S, min_age: float = TEMPORARY_AGE_S, lock_timeout: float = 0.0,
               now: float | None = None) -> Cleaned:
    """Remove the temporary and orphan payload files of one role that :func:`leftover_kept` lets go; log at INFO how
    many and how many bytes.

    Args:
        dump_dir, namespace, role: the role.
        stop: polled before each folder and each removal; True ends the upkeep there (the process is ending).
        max_seconds: the upkeep ends after this many seconds, wherever it is.
        min_age: as :func:`leftover_kept`'s.
        lock_timeout: seconds to wait for a part's lock before an orphan of it is left for the next upkeep.
        now: the time to judge ages by (unix seconds), default now.

    Returns:
        The :class:`Cleaned`. Never raises: a failure is logged at DEBUG and the file left for the next upkeep.
    """
    deadline = time.monotonic() + max_seconds
    now = time.time() if now is None else now
    done = Cleaned()

    def over() -> bool:
        return time.monotonic() > deadline or (stop is not None and stop())

    for x in role_leftovers(dump_dir, namespace, role, stop=over):
        if over():
            break
        why = leftover_kept(x.kind, x.path, x.modified, min_age=min_age, now=now, age_name="a run's age limit")
        if why is None:
            why = _remove(x, lock_timeout)
        if why is not None:
            done.kept.append((x.path, why))
            continue
        done.bytes += x.bytes
        if x.kind is LeftoverKind.TEMPORARY:
            done.temporary += 1
        else:
            done.orphan += 1
    done.finished = not over()
    if done.temporary or done.orphan:
        logger.info("skipweave: role %s: removed %d file(s) that interrupted writes left (%d temporary, %d orphan "
                    "payload; %d bytes) under %s", role, done.temporary + done.orphan, done.temporary, done.orphan,
                    done.bytes, dump_dir)
    if done.kept:
        logger.debug("skipweave: role %s: kept %d leftover file(s) a writer may still own, e.g. %s: %s", role,
                     len(done.kept), *done.kept[0])
    if not done.finished:
        logger.debug("skipweave: role %s: upkeep stopped before the end (%.0f s at most, or the process is ending)",
                     role, max_seconds)
    return done


def _remove(x: Leftover, lock_timeout: float) -> str | None:
    """Remove one leftover the judgement let go; ``None`` when removed, else why not."""
    try:
        if x.kind is LeftoverKind.ORPHAN:
            return remove_orphan(x.path, lock_timeout=lock_timeout)
        remove_tree(x.path)  # a temporary file (or a folder planted at its name): nothing else refers to it
    except FileNotFoundError:
        return "already gone"
    except filelock.Timeout:
        return "a writer holds its part's lock"
    except Exception as exc:  # noqa: BLE001 - OSError, or what a crafted folder provokes: the next upkeep retries
        return f"{type(exc).__name__}: {exc}"
    return None


# ---------------------------------------------------------------------------------------------- the run's upkeep
_lock = threading.Lock()
_queue: list[tuple[str, str, str]] = []
_started: set[tuple[str, str, str, str]] = set()  # (dump dir, namespace, role, run id) an upkeep was queued for
_thread: threading.Thread | None = None
_stopping = threading.Event()


def start(dump_dir: str, namespace: str, role: str) -> None:
    """Have the role's leftovers removed (:func:`clean_role`) on the upkeep thread, once per role and run in this
    process: a thread of its own, off every call of the host's, which the process's end stops and joins
    (:data:`skipweave.lifecycle.STOP`). Does nothing when the role has no folder yet, or once the process is ending."""
    dump_dir = os.path.abspath(dump_dir)
    key = (dump_dir, namespace, role, run_id())
    global _thread
    with _lock:
        if key in _started or _stopping.is_set():
            return
        _started.add(key)
        if not os.path.isdir(os.path.join(dump_dir, namespace, role)):
            return  # nothing recorded yet: nothing left behind
        _queue.append(key[:3])
        if _thread is not None and _thread.is_alive():
            return
        _thread = threading.Thread(target=_run, name="skipweave-upkeep", daemon=True)
        lifecycle.at_exit(lifecycle.STOP, stop)
        _thread.start()


def _run() -> None:
    global _thread
    while True:
        with _lock:
            if not _queue or _stopping.is_set():
                _thread = None
                return
            dump_dir, namespace, role = _queue.pop(0)
        try:
            clean_role(dump_dir, namespace, role, stop=_stopping.is_set)
        except Exception:  # noqa: BLE001 - an upkeep's bug must never reach the host
            logger.exception("skipweave: role %s: upkeep failed", role)


def stop() -> None:
    """Stop the upkeep thread and join it (at the process's end, before the interpreter finalizes): a walk under way
    ends before its next file. Upkeep asked for afterwards does not run."""
    _stopping.set()
    with _lock:
        thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def _after_fork_in_child() -> None:
    global _lock, _thread, _stopping
    _lock = threading.Lock()  # the parent's thread, and whatever lock it held, are not in the child
    _thread = None
    _queue.clear()  # (the parent walks those; the child's own roles are queued by its own weave)
    _stopping = threading.Event()


os.register_at_fork(after_in_child=_after_fork_in_child)
