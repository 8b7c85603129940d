"""The driver's mark in a dump dir: is the folder a worker records into the very one the driver sees?

A ``dump_dir`` such as ``~/.verl/rollout_dump`` or ``/tmp/...`` names a different folder on every node of a
multi-node job: workers on one node record where the driver, and the next run's workers on other nodes, never
look. So the process that starts the job (a Ray driver, at ``ray.init``) writes, for each dump dir of its plan::

    {dump_dir}/.runs/{run}/.shared.json     {"token": <32 hex digits>, "host": ..., "pid": ..., "written_unix": ...}

and hands the token to its workers; a worker that does not find that file with that token in its own dump dir
(:func:`mark_problem`) is not looking at the driver's folder. The token is fresh per driver process, so a copy of
the folder, or a node-local folder left by an earlier run with the same run id, does not pass for the driver's.

The mark lives in the run's folder of :mod:`skipweave.store.runs`, so it shares its lifecycle: removed at the
driver's exit when no process of the run recorded anything, else by ``skipweave gc`` once the run is known to have
ended -- never by age alone, as other run folders are (:func:`holds_mark`: workers a long job restarts days later
check it again); ``ls`` and ``verify`` skip ``.runs``. A mark read from disk is untrusted: it is opened without
following a symlink, read up to :data:`_MAX_BYTES`, and only a JSON object whose ``token`` is 32 hex digits counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import time

from skipweave.store.atomic import tmp_name
from skipweave.store.errors import UnsafePath
from skipweave.store.fs import RUNS, check_name, inside, open_new, open_regular

SHARED_MARK = ".shared.json"
"""File name of the driver's mark in ``{dump_dir}/.runs/{run}/`` (a hidden name: never a namespace's)."""
_MAX_BYTES = 4096  # a mark is ~120 bytes: a bigger file is not skipweave's, and is not read whole
_TOKEN_RE = re.compile(r"^[0-9a-f]{32}\Z", re.ASCII)


def is_token(value: object) -> bool:
    """True when ``value`` has the form of a mark's token (a string of 32 lowercase hex digits)."""
    return isinstance(value, str) and _TOKEN_RE.match(value) is not None


def mark_path(dump_dir: str, run: str) -> str:
    """``{dump_dir}/.runs/{run}/.shared.json``.

    Raises:
        ValueError: ``run`` is not a valid folder name.
    """
    return os.path.join(dump_dir, RUNS, check_name("run", run), SHARED_MARK)


def write_mark(dump_dir: str, run: str, token: str) -> str:
    """Write (replace) the mark of ``run`` with ``token`` into ``dump_dir``, creating the folders it needs.

    Written under a temporary name and renamed: a reader on another node sees the whole file or none.

    Args:
        dump_dir: the store root (absolute).
        run: the run id (:func:`skipweave.store.identity.run_id`).
        token: 32 lowercase hex digits (e.g. ``secrets.token_hex(16)``).

    Returns:
        The mark's path.

    Raises:
        ValueError: ``run`` is not a valid folder name, or ``token`` not 32 hex digits.
        UnsafePath: a folder on the way is a symlink or a file.
        OSError: the folders or the file could not be written (a read-only dump dir).
    """
    if not is_token(token):
        raise ValueError(f"a shared-path token must be 32 lowercase hex digits, got {token!r}")
    check_name("run", run)  # before anything is made
    os.makedirs(dump_dir, exist_ok=True)
    folder = inside(dump_dir, RUNS, run, create=True)
    doc = {"token": token, "host": platform.node(), "pid": os.getpid(), "written_unix": time.time()}
    tmp = tmp_name(folder, SHARED_MARK)
    try:
        fd = open_new(tmp)
        try:
            os.write(fd, json.dumps(doc).encode())
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(folder, SHARED_MARK))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return os.path.join(folder, SHARED_MARK)


def mark_problem(dump_dir: str, run: str, token: str) -> str | None:
    """Why ``dump_dir`` here is not the folder in which the driver wrote ``token`` for ``run``; ``None`` when it is.

    Never raises for what it finds on disk (a crafted file is one more reason, never an exception).

    Args:
        dump_dir: the store root as this process sees it.
        run: the run id.
        token: the token the driver handed this process.

    Returns:
        A reason for people, e.g. ``"the folder does not exist on this node"``, or ``None``.
    """
    if not os.path.isdir(dump_dir):
        return "the folder does not exist here"
    try:
        path = mark_path(dump_dir, run)
        inside(dump_dir, RUNS, run)  # no symlinked .runs or run folder
        found = _token_at(path)
    except FileNotFoundError:
        return f"the driver's mark {RUNS}/{run}/{SHARED_MARK} is not in it"
    except (OSError, ValueError, UnsafePath) as exc:
        return f"the driver's mark {RUNS}/{run}/{SHARED_MARK} cannot be read ({exc})"
    if found is None:
        return f"{RUNS}/{run}/{SHARED_MARK} in it is not a mark skipweave wrote"
    if found != token:
        return (f"{RUNS}/{run}/{SHARED_MARK} in it holds another driver's token (a copy of the folder, or one an "
                "earlier run with the same run id left on this node)")
    return None


def holds_mark(folder: str) -> bool:
    """True when the run's folder ``folder`` (``{dump_dir}/.runs/{run}``) may hold a driver's mark its workers check.

    True for a mark skipweave wrote, and for a :data:`SHARED_MARK` file that cannot be read here (another user's:
    a worker may read it); false when there is none, or what is there is no mark (a symlink, a folder, a FIFO, junk
    content), which no worker would accept either. Never raises: the folder is untrusted input.
    """
    try:
        return _token_at(os.path.join(folder, SHARED_MARK)) is not None
    except (FileNotFoundError, UnsafePath):
        return False
    except (OSError, ValueError):
        return True  # unreadable to this process, not shown to be no mark: keep what a worker may yet check


def _token_at(path: str) -> str | None:
    """The token of the mark at ``path``, ``None`` when the file is not a mark skipweave wrote.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafePath: a symlink, a folder or another non-regular file is there.
        OSError: it cannot be read.
    """
    fd = open_regular(path)
    try:
        data = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data) if len(data) <= _MAX_BYTES else None
    except (ValueError, RecursionError):
        doc = None
    found = doc.get("token") if isinstance(doc, dict) else None
    return found if is_token(found) else None


__all__ = ["SHARED_MARK", "holds_mark", "is_token", "mark_path", "mark_problem", "write_mark"]
