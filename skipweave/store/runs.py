"""Marks a run's processes leave each other in the dump dir: which targets were called, and which eligibly.

The process that prints the exit summary (the driver) rarely makes the calls itself: verl's rollouts run in
Ray workers, which Ray ends without running ``atexit``. So the first call of a target in a process, and its
first eligible call, leave an empty file::

    {dump_dir}/.runs/{run}/{namespace}/{role}/{target}.called
                                              {target}.eligible

and a process warns that a target was never called only when no process of its run left the mark since it
started (a mark older than the process is another, earlier run sharing the run id). The CLI skips ``.runs``;
the files are a few bytes per target and run.
"""

from __future__ import annotations

import contextlib
import logging
import os

from skipweave.store.paths import RUNS, UnsafePath, check_name, inside

logger = logging.getLogger(__name__)

CALLED, ELIGIBLE = "called", "eligible"


def mark(dump_dir: str, namespace: str, role: str, run: str, target: str, kind: str) -> None:
    """Leave (or refresh) the mark ``kind`` of ``target`` for ``run``; never raises (a failure is logged at DEBUG).

    Args:
        dump_dir, namespace, role: the role's store.
        run: the run id (:func:`skipweave.store.writers.run_id`).
        target: the target's name.
        kind: :data:`CALLED` or :data:`ELIGIBLE`.
    """
    try:
        os.makedirs(dump_dir, exist_ok=True)  # the first call of a run may come before any record made it
        folder = inside(dump_dir, RUNS, check_name("run", run), namespace, role, create=True)
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


__all__ = ["CALLED", "ELIGIBLE", "mark", "marked"]
