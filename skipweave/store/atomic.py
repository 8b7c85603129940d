"""Atomic file commits: write under a temporary name, fsync, rename into place.

A reader sees either nothing or the whole file, also when the writer is SIGKILLed at any instant
(POSIX ``rename`` within one folder is atomic). Temporary names start with ``.tmp-`` so readers
and ``skipweave gc`` can tell them apart, and name the process writing them::

    .tmp-{token}.{pid}.{start}.{place}-{final name}

``token``: 8 fresh hex digits; ``pid`` and ``start`` (clock ticks since boot, ``0`` when unknown) the writer's;
``place``: :func:`skipweave.store.identity.place`, a hash of its host name, boot id and pid namespace. So a run's
upkeep and ``skipweave gc`` (:mod:`skipweave.store.upkeep`) can tell that the writer of a temporary file left on this
machine has ended (:func:`tmp_writer`), and remove the file at once, while one a running writer may still commit is
kept. Names of the older form ``.tmp-{12 hex digits}-{final name}`` name no writer.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from skipweave.store.format.layout import TMP_PREFIX
from skipweave.store.fs import open_nofollow
from skipweave.store.identity import PLACE_DIGITS, place, running_at, this_process

_TMP_RE = re.compile(r"^\.tmp-[0-9a-f]{8}\.(?P<pid>[1-9][0-9]{0,9})\.(?P<start>0|[1-9][0-9]{0,19})"
                     rf"\.(?P<place>[0-9a-f]{{{PLACE_DIGITS}}})-.", re.ASCII | re.DOTALL)


@dataclass(frozen=True)
class TmpWriter:
    """The process a temporary file's name says is writing it.

    Attributes:
        place: its :func:`~skipweave.store.identity.place` tag (host name, boot id, pid namespace).
        pid: its process id.
        start: its start (clock ticks since boot), ``None`` when unknown.
    """

    place: str
    pid: int
    start: int | None

    def running(self) -> bool | None:
        """Whether the writer still runs: True or False on its machine (same place), ``None`` elsewhere
        (:func:`skipweave.store.identity.running_at`)."""
        return running_at(self.place, self.pid, self.start)


def tmp_name(folder: str, final_name: str) -> str:
    """Return a unique temporary path in ``folder`` for a file that will become ``final_name``; its name says which
    process writes it (module docstring)."""
    me = this_process()
    return os.path.join(folder, f"{TMP_PREFIX}{os.urandom(4).hex()}.{me.pid}.{me.start or 0}.{place()}-{final_name}")


def tmp_writer(name: str) -> TmpWriter | None:
    """The writer a temporary file's name (no folder) names; ``None`` for a name of the older form, or none of
    skipweave's."""
    m = _TMP_RE.match(name)
    if m is None:
        return None
    start = int(m.group("start"))
    return TmpWriter(m.group("place"), int(m.group("pid")), start or None)


def tmp_name_in(folder: str, final_name: str) -> str:
    """A fresh temporary file name (no folder) in ``folder`` for a file that becomes ``final_name``."""
    return os.path.basename(tmp_name(folder, final_name))


def fsync_dir(folder: str) -> None:
    """Flush a folder's entries (the renames in it) to disk; ignored where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_files(files: list[tuple[int, str]]) -> None:
    """Flush several files to disk at once: ``(dir_fd, name)`` pairs, each a file in the folder open as ``dir_fd``.

    On Linux one ``syncfs`` of their file system flushes them all (a few files cost about what one fsync
    does, where fsyncing each costs one journal commit apiece); elsewhere, or when ``syncfs`` fails, each file
    is fsynced. ``syncfs`` also flushes what other programs wrote to that file system meanwhile: it is for a
    background writer, where that wait holds up nobody.

    Raises:
        OSError: a file could not be opened or flushed.
    """
    if not files:
        return
    if len(files) > 3:
        devices: dict[int, int] = {}
        for dir_fd, _ in files:
            devices.setdefault(os.fstat(dir_fd).st_dev, dir_fd)
        if all(_syncfs(fd) for fd in devices.values()):  # one per file system the files are on
            return
    for dir_fd, name in files:
        fd = open_nofollow(name, os.O_RDONLY, dir_fd=dir_fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _syncfs(fd: int) -> bool:
    """``syncfs(fd)`` where the C library has it; False when it does not or the call failed."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else False
        except OSError:
            _LIBC = False
    fn = getattr(_LIBC, "syncfs", None) if _LIBC else None
    return fn is not None and fn(fd) == 0


_LIBC: Any = None


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary name, fsync, rename).

    Raises:
        OSError: the write failed; nothing is left behind and an existing ``path`` is untouched.
    """
    folder = os.path.dirname(path)
    tmp = tmp_name(folder, os.path.basename(path))
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["TmpWriter", "fsync_dir", "sync_files", "tmp_name", "tmp_name_in", "tmp_writer", "write_bytes_atomic"]
