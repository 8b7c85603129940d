"""Every path check and every no-follow open of the store: names that stay one folder level, folders that are never
symlinks, files opened without following one.

A dump dir is untrusted input (a teammate's folder on NFS, a copy from another cluster). Two rules keep
every read, write, move and delete of the store inside the root it was given:

* **Names are single components.** Every name that becomes a path component -- namespace, role, target,
  shard (``RANK``), set-aside folder -- is checked by :func:`check_name`: ASCII letters, digits, ``_``,
  ``-`` and ``.``, starting with a letter, a digit or ``_``. ``..``, ``/``, absolute paths, empty names,
  hidden names and non-ASCII digits (``"²".isdigit()`` is True) are refused.
* **No symlink below the root is followed.** skipweave never creates a symlink in a dump dir, so one it
  finds was put there by someone else. :func:`inside` checks every folder below the root with ``lstat``
  (a real folder, not a link) before it is used, and files are opened with ``O_NOFOLLOW``
  (:func:`open_regular`, :func:`open_payload`; new files with :func:`open_new`); ``rename`` and ``unlink`` act on
  a link itself, never on its target. The root itself may be a symlink (``/data/rollouts -> /mnt/nfs/...`` is the
  user's own choice).

These checks are made on each use; they do not defend against another process swapping a folder for a
symlink between the check and the use (the threat is a crafted folder at rest, see docs/format.md).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from typing import BinaryIO

from skipweave.store.errors import EntryInvalid, UnsafePath

NAME_MAX = 200
"""Longest name accepted for a path component (file systems allow 255 bytes; suffixes are added)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z", re.ASCII)  # \Z: '$' would accept a final '\n'
_STEP_RE = re.compile(r"^(?:0|-?[1-9][0-9]*)\Z", re.ASCII)  # exactly what str(step) writes: no '007', no '-0'
SET_ASIDE = "_set_aside"
"""Folder of a role holding set-aside parts and entries (the one name below a role that is not a step)."""
RUNS = ".runs"
"""Dump-dir folder of the marks a run's processes leave each other (:mod:`skipweave.store.runs`); the CLI skips it."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a path component of a dump dir, or ``None`` when it can.

    Args:
        value: the candidate name (a role, target, namespace or shard label).

    Returns:
        A short reason for people (e.g. ``"contains '/'"``), or ``None`` for a valid name.
    """
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    if len(value) > NAME_MAX:
        return f"is longer than {NAME_MAX} characters"
    if value in (".", ".."):
        return "is a relative folder reference"
    if not _NAME_RE.match(value):
        return "may hold only ASCII letters, digits, '_', '-' and '.', starting with a letter, digit or '_'"
    return None


NAME_RULE = "a single folder name of ASCII letters, digits, '_', '-' and '.' (starting with a letter, digit or '_')"
"""The rule of :func:`name_problem` in words, for error messages."""


def check_name(kind: str, value: object) -> str:
    """Return ``value`` when it is a valid path component, else raise.

    Args:
        kind: what the name is, for the message (e.g. ``"target"``, ``"skip.rollout.namespace"``).
        value: the name.

    Raises:
        ValueError: naming ``kind``, the value and the rule (:data:`NAME_RULE`).
    """
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"{kind} {value!r} {problem}; expected {NAME_RULE}")
    assert isinstance(value, str)
    return value


def is_step_name(name: str) -> bool:
    """True when ``name`` is a step folder's name as ``str(step)`` writes it (ASCII digits, an optional ``-``,
    no leading zero): the only step folders a run ever reads, so the CLI judges exactly those too."""
    return _STEP_RE.match(name) is not None


def is_real_dir(path: str) -> bool:
    """True when ``path`` is a folder and not a symlink (``lstat``); False when missing or anything else."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def inside(root: str, *parts: str, create: bool = False) -> str:
    """Join ``parts`` below ``root``, checking that each folder on the way is a real folder.

    Args:
        root: the dump dir (may itself be a symlink; it is not checked).
        parts: path components below it, each a single name (checked with :func:`check_name`).
        create: make missing folders (as ``os.makedirs``); otherwise a missing one is fine and the
            check stops there (nothing below it exists either).

    Returns:
        ``os.path.join(root, *parts)``.

    Raises:
        ValueError: a part is not a single valid name.
        UnsafePath: a folder on the way is a symlink or a file.
        OSError: ``create`` and a folder could not be made.
    """
    for part in parts:
        if part not in (SET_ASIDE, RUNS) and not is_step_name(part):
            check_name("path component", part)
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:  # nothing below a missing folder exists either
                return os.path.join(root, *parts)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{path} is a symlink; skipweave never follows symlinks inside a dump dir")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{path} is not a folder (a file sits where skipweave keeps a folder)")
    return path


def open_regular(path: str, flags: int = os.O_RDONLY, *, dir_fd: int | None = None) -> int:
    """Open an existing regular file without following a symlink; return its descriptor.

    Raises:
        FileNotFoundError: no such file.
        UnsafePath: ``path`` is a symlink, a folder or another non-regular file.
        OSError: any other failure to open it.
    """
    try:  # lstat first: opening a FIFO planted at the name would block until a writer appears
        mode = os.lstat(path, dir_fd=dir_fd).st_mode
    except FileNotFoundError:
        raise
    if stat.S_ISLNK(mode):
        raise UnsafePath(f"{path} is a symlink; skipweave never follows symlinks inside a dump dir")
    if not stat.S_ISREG(mode):
        raise UnsafePath(f"{path} is not a regular file")
    fd = open_nofollow(path, flags | _NONBLOCK, dir_fd=dir_fd)  # (a symlink swapped in meanwhile is refused)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file")
    return fd


def open_nofollow(path: str, flags: int, mode: int = 0o644, *, dir_fd: int | None = None) -> int:
    """``os.open`` that never follows a symlink at ``path`` itself (``O_NOFOLLOW``, ``O_CLOEXEC``): the one open
    every file of a dump dir goes through.

    Args:
        path: the file (relative to ``dir_fd`` when given).
        flags: ``os.O_*`` flags to add.
        mode: permission bits of a file ``O_CREAT`` makes.
        dir_fd: an open folder ``path`` is relative to.

    Raises:
        UnsafePath: ``path`` is a symlink, or a folder where a file is expected.
        OSError: any other failure to open it (``FileNotFoundError`` included).
    """
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise UnsafePath(f"{path} is a symlink; skipweave never follows symlinks inside a dump dir") from None
        if isinstance(exc, IsADirectoryError):
            raise UnsafePath(f"{path} is a folder where a file is expected") from None
        raise


def open_new(name: str, *, dir_fd: int | None = None, exclusive: bool = True) -> int:
    """Create a file to write (mode 0644) without following a symlink; return its descriptor.

    Args:
        name: the file (relative to ``dir_fd`` when given).
        dir_fd: an open folder ``name`` is relative to.
        exclusive: refuse an existing file (``O_EXCL``); otherwise an existing one is truncated.

    Raises:
        FileExistsError: ``exclusive`` and the file exists.
        UnsafePath: ``name`` is a symlink or a folder.
        OSError: any other failure to create it.
    """
    return open_nofollow(name, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC), dir_fd=dir_fd)


def write_new(dir_fd: int, name: str, data: bytes, *, sync: bool = True) -> None:
    """Create ``name`` in the folder open as ``dir_fd`` (never an existing file or a symlink), write ``data``, fsync
    it (unless ``sync`` is off: the caller syncs it).

    Raises:
        OSError: the file exists, or the write or fsync failed (the partial file is left for the caller).
    """
    fd = open_new(name, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_names(dir_fd: int, names: list[str]) -> None:
    """Remove files from the folder open as ``dir_fd`` (those already gone, or that cannot be removed, are
    skipped): what a write that did not commit made."""
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


def open_payload(path: str, size: object) -> BinaryIO:
    """Open a payload file to read (unbuffered), refusing what skipweave did not write: a symlink, a folder, a FIFO or
    another non-regular file, and a file whose size is not the ``size`` its manifest gives.

    Args:
        path: the payload file.
        size: its size in bytes according to its manifest (any value: one that is not the file's size refuses it).

    Returns:
        The open file; the caller closes it.

    Raises:
        EntryInvalid: the file is missing, unreadable, not a file skipweave wrote, or of another size.
    """
    try:
        fh = open(open_regular(path), "rb", buffering=0)  # noqa: SIM115 - the caller closes it
    except UnsafePath as exc:
        raise EntryInvalid(f"payload {path} is not a file skipweave wrote: {exc}") from None
    except FileNotFoundError:
        raise EntryInvalid(f"payload {path} is missing") from None
    except OSError as exc:
        raise EntryInvalid(f"payload {path} is unreadable: {exc}") from exc
    try:
        actual = os.fstat(fh.fileno()).st_size  # before reading: the manifest's size is only a claim
    except OSError as exc:
        fh.close()
        raise EntryInvalid(f"payload {path} is unreadable: {exc}") from exc
    if actual != size:
        fh.close()
        raise EntryInvalid(f"payload {path} has {actual} bytes, manifest says {size}")
    return fh


def open_dir(path: str) -> int:
    """Open a real folder (not a symlink) for ``dir_fd`` use; return its descriptor.

    Raises:
        UnsafePath: ``path`` is a symlink or not a folder.
        OSError: it cannot be opened.
    """
    try:
        return open_nofollow(path, os.O_RDONLY | _DIRECTORY)
    except NotADirectoryError:
        raise UnsafePath(f"{path} is not a folder") from None


def same_folder(path: str, fd: int) -> bool:
    """True when ``path`` still names the folder open as ``fd`` (it was not renamed, removed or replaced)."""
    try:
        a, b = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def dump_dir_problem(path: str) -> tuple[str | None, str | None]:
    """Judge a dump dir before a run uses it: ``(unusable, read_only)`` reasons for people, ``None`` when fine.

    ``unusable``: the path, or a folder above it, is a file (nothing can ever be recorded or replayed).
    ``read_only``: it (or the nearest existing folder above it) cannot be written by this process: replays
    work, nothing will be recorded or set aside.
    """
    probe = os.path.abspath(path)
    if os.path.islink(probe) and not os.path.exists(probe):
        return f"{probe} is a symlink to nothing ({os.readlink(probe)})", None
    while True:
        try:
            st = os.stat(probe)
        except FileNotFoundError:
            parent = os.path.dirname(probe)
            if parent == probe:
                return None, None
            probe = parent
            continue
        except NotADirectoryError:
            return f"a folder above {path} is a file", None
        except OSError as exc:
            return None, f"{probe} cannot be inspected ({exc.strerror or exc})"
        break
    if not stat.S_ISDIR(st.st_mode):
        return (f"{probe} is a file, not a folder", None) if probe == os.path.abspath(path) else (
            f"{probe}, a folder above it, is a file", None)
    if not os.access(probe, os.W_OK | os.X_OK):
        return None, f"{probe} is not writable by this process"
    return None, None


def lock_path(folder: str, name: str) -> str:
    """The path of a lock file ``name`` in ``folder``, with anything but a regular file at that name removed.

    Older ``filelock`` releases open the lock file without ``O_NOFOLLOW`` (and truncate it): a planted link
    would make a writer truncate a file outside the dump dir; a folder at the name would make every lock
    fail, so the entry could never be healed. Lock names are skipweave's own (``.{shard}.part.lock``): a symlink
    there is removed itself (never its target), a folder with what it holds (:func:`remove_tree` follows no
    symlink), both inside the dump dir.
    """
    path = os.path.join(folder, name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if not stat.S_ISREG(mode):
        with contextlib.suppress(FileNotFoundError):
            remove_tree(path)
    return path


def remove_tree(path: str) -> None:
    """Remove a file, a symlink (itself) or a real folder with everything below it, without recursion.

    Symlinks below are removed themselves, never followed; a folder nested thousands deep (which makes
    ``shutil.rmtree`` raise ``RecursionError`` on Python 3.11) is removed all the same.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        OSError: something could not be removed.
    """
    if not is_real_dir(path):
        os.unlink(path)
        return
    stack = [path]
    while stack:
        folder = stack[-1]
        subfolders = []
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    subfolders.append(entry.path)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        if subfolders:
            stack.extend(subfolders)
        else:
            os.rmdir(folder)
            stack.pop()


__all__ = [
    "NAME_MAX",
    "NAME_RULE",
    "RUNS",
    "SET_ASIDE",
    "UnsafePath",
    "check_name",
    "dump_dir_problem",
    "inside",
    "is_real_dir",
    "is_step_name",
    "lock_path",
    "name_problem",
    "open_dir",
    "open_new",
    "open_nofollow",
    "open_payload",
    "open_regular",
    "remove_names",
    "remove_tree",
    "same_folder",
    "write_new",
]
