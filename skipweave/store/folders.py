"""Where a role's entries live: its checked names and folders, and the modification times that tell a change.

Part of :class:`~skipweave.store.step_store.StepStore` (see there for the whole). Every folder below the dump dir is
checked to be a real folder before use (:func:`~skipweave.store.fs.inside`); a replay hit re-checks the way only when
the folder changed, or :data:`FOLDER_TTL_S` after the last check, so it costs one ``lstat``.
"""

from __future__ import annotations

import logging
import os
import threading

from skipweave.store.cache import ValidatedCache
from skipweave.store.format.layout import SET_ASIDE_DIR, EntryKey, folder_mtime, role_dir
from skipweave.store.fs import check_name, inside

logger = logging.getLogger(__name__)

FOLDER_TTL_S = 1.0
"""Seconds a part folder's checked way (:meth:`RoleFolders.folder`'s ``lstat`` of every folder below the dump dir) is
reused by a replay while the folder's own modification time is unchanged; then it is checked again whole."""

Mtime = tuple[int, int]
"""A folder's inode and modification time in ns (:func:`~skipweave.store.format.layout.folder_mtime`)."""


class RoleFolders:
    """The folders of one role under ``{dump_dir}/{namespace}/{role}``.

    Args:
        dump_dir: absolute store root.
        namespace: run identity folder.
        role: role name.

    Raises:
        ValueError: ``namespace`` or ``role`` is not a single folder name (:func:`~skipweave.store.fs.check_name`).
    """

    def __init__(self, dump_dir: str, namespace: str, role: str) -> None:
        self.dump_dir = dump_dir
        self.namespace = check_name("namespace", namespace)
        self.role = check_name("role", role)
        self._names: set[str] = set()  # target and shard names already checked
        self._root_id: tuple[int, int] | None = None  # (device, inode) of dump_dir when last seen
        self._unsafe_warned: set[str] = set()
        self._lock = threading.Lock()
        self._paths: ValidatedCache[tuple[int, str], str] = ValidatedCache()  # (step, target) -> its folder's path
        # (step, target) -> the folder's path when its way was last checked whole, kept by its mtime then
        self._checked: ValidatedCache[tuple[int, str], str] = ValidatedCache()

    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        """The :class:`~skipweave.store.format.layout.EntryKey` of a call of this role.

        Raises:
            ValueError: ``target`` or ``shard`` is not a single folder name.
        """
        if target not in self._names:
            check_name("target", target)
            self._names.add(target)
        if shard not in self._names:
            check_name("shard", shard)
            self._names.add(shard)
        return EntryKey(self.namespace, self.role, step, target, shard, call)

    def folder(self, step: int, target: str, *, create: bool = False) -> str:
        """The target folder of a step, every folder below the dump dir checked to be a real folder.

        Raises:
            UnsafePath: a folder on the way is a symlink or a file.
            OSError: ``create`` and it could not be made.
        """
        return inside(self.dump_dir, self.namespace, self.role, str(step), target, create=create)

    def path(self, step: int, target: str) -> str:
        """The path of a step's target folder (what :meth:`folder` returns, unchecked; joined once)."""
        path = self._paths.get((step, target), 0)
        if path is None:
            path = os.path.join(role_dir(self.dump_dir, self.namespace, self.role), str(step), target)
            self._paths.put((step, target), 0, path)
        return path

    def mtime(self, step: int, target: str) -> Mtime | None:
        """The :func:`~skipweave.store.format.layout.folder_mtime` of a step's target folder now (one ``lstat``)."""
        return folder_mtime(self.path(step, target))

    def checked(self, step: int, target: str, mtime: Mtime | None = None) -> tuple[str, Mtime | None]:
        """:meth:`folder` and the folder's mtime (``mtime`` when given, else taken now): the way is checked again
        whole when the folder changed since it was last checked, or :data:`FOLDER_TTL_S` after.

        Raises:
            UnsafePath: a folder on the way is a symlink or a file.
        """
        path = self.path(step, target)
        if mtime is None:
            mtime = folder_mtime(path)
        if self._checked.get((step, target), mtime, max_age=FOLDER_TTL_S) is not None:
            return path, mtime
        folder = self.folder(step, target)  # mtime taken before: a change made meanwhile shows at the next call
        self._checked.put((step, target), mtime, folder)
        return folder, mtime

    def set_aside_folder(self, name: str) -> str:
        """Create and return ``{role}/_set_aside/{name}``, refusing a symlinked ``_set_aside``.

        Raises:
            UnsafePath: ``_set_aside`` (or a folder above it) is a symlink or a file.
        """
        return inside(self.dump_dir, self.namespace, self.role, SET_ASIDE_DIR, name, create=True)

    def warn_unsafe(self, exc: OSError) -> None:
        """Log once per reason that a folder was ignored because it is unsafe."""
        text = str(exc)
        with self._lock:
            if text in self._unsafe_warned:
                return
            self._unsafe_warned.add(text)
        logger.warning("skipweave: role %s: %s; it is ignored (nothing is read from or written to it)",
                       self.role, text)

    def watch_root(self) -> None:
        """Make the dump dir when missing; WARN when it vanished or was replaced since this store last saw it."""
        with self._lock:  # one look at a time: a thread must not take the folder another just made for a new one
            ident = _device_inode(self.dump_dir)
            if ident is None:
                os.makedirs(self.dump_dir, exist_ok=True)
                new = _device_inode(self.dump_dir)
            else:
                new = ident
            seen, self._root_id = self._root_id, new
        if seen is not None and (ident is None or seen != new):  # removed (a new folder may reuse the inode)
            logger.warning(
                "skipweave: role %s: the dump dir %s was %s since this run last wrote to it; what was recorded "
                "there before is gone from it, new recordings go to the new folder",
                self.role, self.dump_dir, "removed" if ident is None else "replaced by another folder",
            )

    def after_fork(self) -> None:
        """In a forked child: a lock of its own (another thread may have held the parent's)."""
        self._lock = threading.Lock()


def _device_inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


__all__ = ["FOLDER_TTL_S", "Mtime", "RoleFolders"]
