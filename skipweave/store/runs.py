"""Marks a run's processes leave each other in the dump dir: which targets were called, and which eligibly.

The process that prints the exit summary (the driver) rarely makes the calls itself: verl's rollouts run in
Ray workers, which Ray ends without running ``atexit``. So the first call of a target in a process, and its
first eligible call, leave an empty file::

    {dump_dir}/.runs/{run}/{namespace}/{role}/{target}.called
                                              {target}.eligible
                                              {target}.training    (its first training call that reached the store)
                                              {target}.validation  (and its first validation call)

and a process warns that a target was never called only when no process of its run left the mark since it
started (a mark older than the process is another, earlier run sharing the run id). The CLI's ``ls`` and
``verify`` skip ``.runs``; the files are a few bytes per target and run.

The marks are read only while their run runs (each process reads them at its own exit), so they are bounded:

- the first call a process records leaves ``{target}.recorded`` too (:data:`RECORDED`);
- the process that made the run id (:func:`~skipweave.store.identity.made_here`) names itself in
  ``.runs/{run}/.owner.json`` (:data:`OWNER`: host, pid, pid namespace, process start, boot id; :func:`claim`), and at
  its exit, after its summary read the marks (:func:`release`), removes ``.runs/{run}`` when no process of the
  run recorded anything, else writes ``ended_unix`` into that file;
- ``skipweave gc`` removes the folders of runs that ended (:func:`ended_runs`, :func:`remove_ended`): the
  owner file says the run ended; or its owner ran on this host, in this pid namespace and boot, and that process is
  gone (its pid is free, or now another process's: the start time differs); or, when that cannot be checked
  (another host or container, no readable owner file), nothing in the folder changed for
  :data:`RUN_MAX_AGE_S` -- unless the folder holds a Ray driver's mark (:mod:`skipweave.store.shared_mark`): such
  a folder goes only once its run is known to have ended, and gc lists it as kept meanwhile (``kept`` of
  :class:`EndedRun`); gc on the owner's host (in its container) removes it once the owner is gone. ``gc`` then
  still keeps a folder in which anything changed less than ``--min-age`` ago.

Age alone never proves that a run of this host ended: its processes mark only their first calls, and a run lasts
days. What removing the marks of a run that still runs can cost is a false "never called" warning, in a process of
the run that outlived the first one (a subprocess nobody waited for) and called less than the others; never an entry
or a replay. Removing a driver's mark would cost more -- every worker the run starts afterwards (a restarted actor in
a job of several days) would find its dump dir not shared (``DumpDirNotShared`` with ``require_shared: true``, a
false WARNING without) -- so age never takes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

from skipweave.store import identity, shared_mark
from skipweave.store.atomic import tmp_name
from skipweave.store.fs import (
    RUNS,
    UnsafePath,
    check_name,
    inside,
    is_real_dir,
    name_problem,
    open_regular,
    remove_tree,
)

logger = logging.getLogger(__name__)

CALLED, ELIGIBLE, RECORDED, WOVEN = "called", "eligible", "recorded", "woven"
TRAINING, VALIDATION = "training", "validation"
"""Marks of a target's first training call and first validation call that reached the store (a role whose every
call its bypass rule took for a validation call is named at exit)."""
OWNER = ".owner.json"
"""File of a run's folder naming the process that made the run id (a hidden name: never a namespace's)."""
RUN_MAX_AGE_S = 7 * 24 * 3600.0
"""Seconds without any change after which gc takes a run folder whose owner it cannot check for ended."""
_OWNER_MAX_BYTES = 4096  # an owner file is ~150 bytes: a bigger one is not skipweave's, and is not read whole
_PID_MAX = 2**31  # os.kill raises OverflowError beyond a C int

_lock = threading.Lock()
_claims: dict[tuple[str, str], bool] = {}  # (absolute dump dir, run) -> its owner file was written
_claims_pid = 0  # the process the claims are of (a forked child inherits them, and must not act on them)


def mark(dump_dir: str, namespace: str, role: str, run: str, target: str, kind: str) -> None:
    """Leave (or refresh) the mark ``kind`` of ``target`` for ``run``; never raises (a failure is logged at DEBUG).

    Args:
        dump_dir, namespace, role: the role's store.
        run: the run id (:func:`skipweave.store.identity.run_id`).
        target: the target's name.
        kind: :data:`CALLED`, :data:`ELIGIBLE`, :data:`RECORDED`, :data:`WOVEN` (a process wove the target),
            :data:`TRAINING` or :data:`VALIDATION`.
    """
    try:
        os.makedirs(dump_dir, exist_ok=True)  # the first call of a run may come before any record made it
        folder = inside(dump_dir, RUNS, check_name("run", run), namespace, role, create=True)
        _own(dump_dir, run)
        path = os.path.join(folder, f"{check_name('target', target)}.{kind}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0),
                     0o644)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:  # a read-only or odd dump dir: the summary may then warn in vain
        logger.debug("skipweave: could not mark %s %s of role %s: %s", target, kind, role, exc)


def marked(dump_dir: str, namespace: str, role: str, run: str, target: str, kind: str, *, since: float) -> bool:
    """True when a process of ``run`` left the mark ``kind`` of ``target`` at or after ``since`` (epoch seconds)."""
    with contextlib.suppress(OSError, ValueError, UnsafePath):
        folder = inside(dump_dir, RUNS, check_name("run", run), namespace, role)
        st = os.lstat(os.path.join(folder, f"{check_name('target', target)}.{kind}"))
        return st.st_mtime >= since - 1.0  # one second of slack for coarse file-system clocks
    return False


# ---------------------------------------------------------------------------------------------- the run's owner
def claim(dump_dir: str, run: str) -> None:
    """Make this process the owner of ``run``'s marks in ``dump_dir``; never raises (a failure is logged at DEBUG).

    Call it in the process that made the run id (:func:`~skipweave.store.identity.made_here`), for each dump dir
    it weaves, and have :func:`release` run at its exit. The owner file (:data:`OWNER`) is written now into a
    dump dir that exists (weaving creates no dump dir), else at this process's first mark there or at
    :func:`release`; gc reads it to tell that the run still lives.
    """
    global _claims_pid
    key = (os.path.abspath(dump_dir), run)
    with _lock:
        if _claims_pid != os.getpid():
            _claims.clear()
            _claims_pid = os.getpid()
        if key in _claims:
            return
        _claims[key] = False
    if os.path.isdir(key[0]):
        _write_owner(key)


def release() -> None:
    """At the exit of the process that made the run id, after its summary read the marks: end its claims.

    For each dump dir of :func:`claim`: when no process of the run left a :data:`RECORDED` mark, the run's
    folder ``.runs/{run}`` is removed (a replay, or a run that recorded nothing, leaves nothing behind); else the
    owner file gets ``ended_unix``, so that gc, on any host, removes the marks once ``--min-age`` has passed.
    Does nothing in another process (a forked child). Never raises (a failure is logged at DEBUG).
    """
    with _lock:
        if _claims_pid != os.getpid():
            return
        keys = list(_claims)
        _claims.clear()  # a mark left later (a lingering thread) writes no owner file again
    for key in keys:
        try:
            folder = inside(key[0], RUNS, check_name("run", key[1]))
            if not is_real_dir(folder):
                continue
            files, _, _ = _walk(folder)
            if any(f.endswith("." + RECORDED) for f in files):
                _write_owner(key, ended=time.time())
            else:
                remove_tree(folder)
        except (OSError, ValueError) as exc:
            logger.debug("skipweave: could not clean up the marks of run %s under %s: %s", key[1], key[0], exc)


def _own(dump_dir: str, run: str) -> None:
    """In the owner, at a mark: write the owner file of a dump dir that did not exist at :func:`claim`."""
    if _claims and _claims_pid == os.getpid() and _claims.get((os.path.abspath(dump_dir), run)) is False:
        _write_owner((os.path.abspath(dump_dir), run))


def _write_owner(key: tuple[str, str], *, ended: float | None = None) -> None:
    """Write (replace) the owner file of ``key`` = (dump dir, run); never raises."""
    dump_dir, run = key
    tmp = ""
    try:
        folder = inside(dump_dir, RUNS, check_name("run", run), create=True)
        me = identity.this_process()
        doc = {"host": me.host, "pid": me.pid, "pid_namespace": me.pid_namespace, "process_start": me.start,
               "boot_id": me.boot, "ended_unix": ended}
        tmp = tmp_name(folder, OWNER)  # then a rename: gc never reads half a file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(folder, OWNER))
    except (OSError, ValueError) as exc:  # a read-only or odd dump dir: gc then judges the run by age
        logger.debug("skipweave: could not name the owner of run %s under %s: %s", run, dump_dir, exc)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return
    with _lock:
        if key in _claims:
            _claims[key] = True


# ---------------------------------------------------------------------------------------------- gc
@dataclass(frozen=True)
class EndedRun:
    """The folder of a run that has ended, what gc removes; or (``kept``) one gc keeps though age would take it.

    Attributes:
        run: the run id (the folder's name).
        path: the folder, ``{dump_dir}/.runs/{run}``.
        bytes: the size of the files in it.
        modified: the newest modification time of anything in it (seconds since the epoch).
        reason: why the run is known to have ended, for people; when ``kept``, why age would count it ended.
        kept: ``None``, else why gc keeps it all the same (it holds a driver's mark and its run is not known to
            have ended), for people.
    """

    run: str
    path: str
    bytes: int
    modified: float
    reason: str
    kept: str | None = None


@dataclass(frozen=True)
class _Owner:
    process: identity.Process
    ended: float | None


def ended_runs(dump_dir: str, *, now: float | None = None,
               max_age: float = RUN_MAX_AGE_S) -> tuple[list[EndedRun], list[tuple[str, str]]]:
    """List the run folders of ``dump_dir`` whose run has ended (the rule: module docstring), and those gc keeps
    though age alone would take them (``kept``: a driver's mark in them). Nothing is touched.

    Args:
        dump_dir: the store root.
        now: the time to judge ages against (seconds since the epoch; default: now).
        max_age: seconds without a change after which a run whose owner cannot be checked counts as ended.

    Returns:
        ``(ended, ignored)``: the ended (and kept) runs, by name; and ``(path, why)`` of what gc leaves alone below
        ``.runs`` -- symlinks (never followed), files, names skipweave never writes, folders it cannot read.
        Never raises for what it finds: the dump dir is untrusted input.
    """
    now = time.time() if now is None else now
    root = os.path.join(dump_dir, RUNS)
    try:
        mode = os.lstat(root).st_mode
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [(root, f"cannot be read ({exc.strerror or exc})")]
    if stat.S_ISLNK(mode):
        return [], [(root, "a symlink (never followed)")]
    if not stat.S_ISDIR(mode):
        return [], [(root, "a file where skipweave keeps its run marks")]
    ended: list[EndedRun] = []
    ignored: list[tuple[str, str]] = []
    try:
        with os.scandir(root) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        return [], [(root, f"cannot be read ({exc.strerror or exc})")]
    for entry in entries:
        if entry.is_symlink():
            ignored.append((entry.path, "a symlink (never followed)"))
        elif not entry.is_dir(follow_symlinks=False):
            ignored.append((entry.path, "a file where a run's folder belongs"))
        elif name_problem(entry.name) is not None:
            ignored.append((entry.path, "a folder name skipweave never writes"))
        else:
            try:
                why, kept, size, newest = _judge(entry.path, now, max_age)
            except OSError as exc:
                ignored.append((entry.path, f"cannot be read ({exc.strerror or exc})"))
                continue
            if why is not None:
                ended.append(EndedRun(entry.name, entry.path, size, newest, why, kept))
    return ended, ignored


def remove_ended(path: str, *, min_age: float, now: float | None = None,
                 max_age: float = RUN_MAX_AGE_S) -> str | None:
    """Remove one folder :func:`ended_runs` listed, judging it again first; symlinks in it are removed, never followed.

    Args:
        path: the run's folder.
        min_age: keep it when anything in it changed less than this many seconds ago (a process of the run
            that outlived its owner may still read the marks at its exit).
        now: the time to judge ages against (seconds since the epoch; default: now).
        max_age: as in :func:`ended_runs`.

    Returns:
        ``None`` when removed, else why it was kept.

    Raises:
        OSError: something in it could not be removed.
    """
    now = time.time() if now is None else now
    if not is_real_dir(os.path.dirname(path)):
        return f"its {RUNS} folder is no longer a real folder of the dump dir"
    if not os.path.lexists(path):
        return "already gone"
    if not is_real_dir(path):
        return "no longer a real folder"
    why, kept, _, newest = _judge(path, now, max_age)
    if why is None:
        return "its run is no longer known to have ended"
    if kept is not None:
        return kept
    if now - newest < min_age:
        return young_run_marks(now - newest, min_age)
    remove_tree(path)
    return None


def young_run_marks(age: float, min_age: float) -> str:
    """Why gc keeps the marks of a run that ended but changed ``age`` seconds ago, less than ``min_age``: one
    statement (the run ended, yet a process of it may still be about), never "the run ended" beside "a run may still
    be writing it"."""
    return (f"their run ended, but something in them changed {age:.0f} s ago, less than --min-age {min_age:.0f} s: a "
            "process of the run that outlived its first one may still read or leave marks there")


def _judge(folder: str, now: float, max_age: float) -> tuple[str | None, str | None, int, float]:
    """``(why the run of ``folder`` ended or None while it may live, why gc keeps it all the same or None, bytes in
    it, newest change in it)``.

    Raises:
        OSError: the folder cannot be read.
    """
    _, size, newest = _walk(folder)
    owner = _read_owner(os.path.join(folder, OWNER))
    if owner is not None and owner.ended is not None:
        return "its first process wrote at its exit that the run ended", None, size, newest
    running = identity.process_running(owner.process) if owner is not None else None
    if running is True:
        return None, None, size, newest
    if owner is not None and running is False:
        return f"its first process (pid {owner.process.pid} on this host) is gone", None, size, newest
    if now - newest < max_age:
        return None, None, size, newest  # its owner cannot be asked: it may run for days yet
    if owner is None:
        who, asker = "it names no first process", None
    elif owner.process.host != platform.node():
        who, asker = f"its first process ran on host {owner.process.host!r}", f"on host {owner.process.host!r}"
    elif owner.process.pid_namespace != identity.pid_namespace():
        who, asker = "its first process ran in another pid namespace (container) of this host", "in that container"
    else:
        who, asker = ("its first process ran on a host of this name under another boot (an earlier one, or another "
                      "machine of the same name)", None)
    why = f"{who}, and nothing in it changed for {(now - newest) / 86400:.1f} days"
    if not shared_mark.holds_mark(folder):
        return why, None, size, newest
    # A driver's mark: a worker the run starts days later (a restarted actor) checks it, so age is no proof here.
    kept = (f"it holds the Ray driver's mark {shared_mark.SHARED_MARK}, which workers its run starts later still "
            "check; ")
    kept += (f"gc {asker} removes it once the run's first process is gone" if asker is not None else
             "no owner file will say that its run ended: remove the folder by hand once it has")
    return why, kept, size, newest


def _read_owner(path: str) -> _Owner | None:
    """The owner file at ``path``, ``None`` when missing, not a regular file or not one skipweave wrote."""
    try:
        fd = open_regular(path)  # never a symlink: a planted one could name any process
        try:
            data = os.read(fd, _OWNER_MAX_BYTES + 1)
        finally:
            os.close(fd)
        doc = json.loads(data) if len(data) <= _OWNER_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    host, pid, ns, start, boot, ended = (doc.get(k) for k in ("host", "pid", "pid_namespace", "process_start",
                                                               "boot_id", "ended_unix"))
    if not (isinstance(host, str) and type(pid) is int and 0 < pid < _PID_MAX and isinstance(ns, str)):
        return None
    process = identity.Process(host, pid, ns, start if type(start) is int else None,
                               boot if isinstance(boot, str) and boot else None)  # (no boot_id: an older owner file)
    return _Owner(process, _time_or_none(ended))


def _time_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _walk(folder: str) -> tuple[list[str], int, float]:
    """Every non-folder path below ``folder`` (a symlink is one, never followed), their total size (bytes), and
    the newest modification time of anything in it, ``folder`` included (seconds since the epoch).

    Iterative: a crafted folder nested thousands deep does not exhaust the stack.

    Raises:
        OSError: ``folder`` or a folder in it cannot be listed.
    """
    files: list[str] = []
    size, newest = 0, os.lstat(folder).st_mtime
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile
                    continue
                newest = max(newest, st.st_mtime)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                else:
                    files.append(entry.path)
                    size += st.st_size
    return files, size, newest


__all__ = ["CALLED", "ELIGIBLE", "OWNER", "RECORDED", "RUN_MAX_AGE_S", "TRAINING", "VALIDATION", "WOVEN", "EndedRun",
           "claim", "ended_runs", "mark", "marked", "release", "remove_ended", "young_run_marks"]
