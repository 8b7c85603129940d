"""Files and folders of a dump dir that no reader looks at, and the sizes people see of them.

A **leftover** is a ``temporary`` file (``.tmp-*``, a write that never finished), an ``orphan`` payload file
(renamed into place, but the writer died before its manifest), a ``set_aside`` folder (parts an interrupted run or a
corrupt entry left behind) or a ``trash`` folder (a step retention renamed to ``.trash-{step}-{token}`` and was
deleting when it stopped, :mod:`skipweave.store.retention`). :func:`skipweave.store.scan.scan` finds every kind
while it reads a whole dump dir; :func:`role_leftovers` finds the first two by their names alone, cheaply enough
for a run's upkeep (:mod:`skipweave.store.upkeep`).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from skipweave.store.format.layout import (
    GROUP_SUFFIX,
    MANIFEST_SUFFIX,
    TMP_PREFIX,
    parse_group_data_name,
    parse_payload_name,
    role_dir,
)
from skipweave.store.fs import is_real_dir, is_step_name, name_problem

__all__ = ["Leftover", "LeftoverKind", "role_leftovers", "size_and_mtime", "tree_size"]


class LeftoverKind(str, enum.Enum):
    """Kinds of files and folders that no reader looks at."""

    TEMPORARY = "temporary"
    ORPHAN = "orphan"
    SET_ASIDE = "set_aside"
    TRASH = "trash"


@dataclass
class Leftover:
    """A file or folder that no reader looks at (see :class:`LeftoverKind`).

    Attributes:
        kind: temporary, orphan, set_aside or trash.
        path: the file or folder.
        bytes: its size (a folder: the size of every file in it).
        modified: newest modification time in it (unix seconds).
        stem: for an orphan payload file, the stem of the entry it was written for (``r0-0001``).
    """

    kind: LeftoverKind
    path: str
    bytes: int
    modified: float
    stem: str | None = None


def role_leftovers(dump_dir: str, namespace: str, role: str, *,
                   stop: Callable[[], bool] | None = None) -> Iterator[Leftover]:
    """The temporary files and orphan payload files of one role's step folders, found by their names alone: what a
    run's upkeep (:mod:`skipweave.store.upkeep`) removes once their writer is gone.

    Cheaper than :func:`scan` (one listing per folder, no manifest read), and a subset of what it finds: an orphan
    here is a payload file whose entry has no manifest (an entry's tree or tensor file) or whose group has no group
    file (a group's data file) in its folder; :func:`scan` also reads the manifests, and finds the payload files a
    manifest beside them does not list (a replaced entry's, when its writer died before removing them). Set-aside and
    trash folders are not looked into; symlinks are never followed.

    Args:
        dump_dir, namespace, role: the role.
        stop: polled before each target folder; True ends the walk there.

    Yields:
        The leftovers, folder by folder (so a caller may remove each before the walk goes on), kinds ``temporary``
        and ``orphan`` (``stem`` set for an orphan). Never raises for what it finds (a folder that cannot be listed,
        or vanished, is passed over).
    """
    rdir = role_dir(os.path.abspath(dump_dir), namespace, role)
    try:
        with os.scandir(rdir) as it:
            steps = sorted((int(d.name), d.path) for d in it
                           if is_step_name(d.name) and d.is_dir(follow_symlinks=False))
    except OSError:
        return
    for _step, step_dir in steps:
        try:
            with os.scandir(step_dir) as it:
                targets = sorted(d.path for d in it if not d.name.startswith(".") and name_problem(d.name) is None
                                 and d.is_dir(follow_symlinks=False))
        except OSError:
            continue
        for folder in targets:
            if stop is not None and stop():
                return
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            yield from _leftovers_by_name(folder, names)


def _leftovers_by_name(folder: str, names: list[str]) -> list[Leftover]:
    """:func:`role_leftovers` of one target folder, from its names."""
    present = set(names)
    out = []
    for name in sorted(names):
        if name.startswith(TMP_PREFIX):
            kind, stem = LeftoverKind.TEMPORARY, None
        elif (parsed := parse_payload_name(name)) is not None and parsed[0] + MANIFEST_SUFFIX not in present:
            kind, stem = LeftoverKind.ORPHAN, parsed[0]
        elif (group := parse_group_data_name(name)) is not None and group + GROUP_SUFFIX not in present:
            kind, stem = LeftoverKind.ORPHAN, group
        else:
            continue
        path = os.path.join(folder, name)
        size, mtime = size_and_mtime(path)
        out.append(Leftover(kind, path, size, mtime, stem))
    return out


def tree_size(path: str) -> tuple[int, float]:
    """Return (total bytes, newest mtime) of a file or folder (symlinks are not followed)."""
    st = os.lstat(path)
    if not is_real_dir(path):  # a file, or a symlink (its own size: never walked through)
        return st.st_size, st.st_mtime
    size, newest = 0, st.st_mtime
    for folder, _dirs, files in os.walk(path):
        for n in files:
            with contextlib.suppress(OSError):
                fst = os.lstat(os.path.join(folder, n))
                size += fst.st_size
                newest = max(newest, fst.st_mtime)
    return size, newest


def size_and_mtime(path: str) -> tuple[int, float]:
    """Return ``(bytes, modification time in unix seconds)`` of ``path`` itself (a symlink is not followed);
    ``(0, 0.0)`` when it cannot be read (removed meanwhile)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0, 0.0
    return st.st_size, st.st_mtime
