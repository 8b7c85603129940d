"""Is each role's dump dir the same storage in every process of a job? The driver marks, each worker checks once.

A process that starts workers elsewhere (a Ray driver, at ``ray.init``) calls :func:`leave_marks`: a mark with a
fresh token in each dump dir of its plan (:mod:`skipweave.store.shared_mark`), and the ``{dump_dir: token}`` it
returns goes to the workers with the plan. A worker hands it to :func:`expect_marks` after its weave. Then the
first eligible call of each target in that worker (:meth:`skipweave.weaving.calls.CallLedger.choose_first`, the
call's first store work) asks :func:`check`: the mark is looked for once per process and dump dir, and when it is
not there,

- one WARNING per dump dir names the path, the worker (:func:`expect_marks`' ``where``: the Ray node) and what to
  set: what this worker records lands where the driver and the next run never look;
- a role with ``require_shared: true`` raises :class:`DumpDirNotShared` instead, from every call of its targets,
  before the target runs.

A process that was handed no marks (no Ray, the driver itself) pays one empty-dict test per target, at its first
eligible call; later calls never come here (the caller tests the target's ``eligible`` counter first).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from skipweave.store import shared_mark
from skipweave.store.fs import name_problem
from skipweave.store.identity import run_id

if TYPE_CHECKING:
    from skipweave.config.schema import RoleConfig

logger = logging.getLogger(__name__)


class DumpDirNotShared(RuntimeError):
    """A role with ``require_shared: true`` was called in a process whose dump dir is not the driver's folder.

    Raised by every eligible call of the role's targets in that process, before the target runs. In a Ray job the
    driver's ``ray.get`` raises it (as a ``RayTaskError`` that is also a :class:`DumpDirNotShared`).

    Attributes:
        role: the role's name.
        dump_dir: the dump dir as the failing process sees it.
        where: the failing process (pid, Ray node, host).
    """

    def __init__(self, message: str, *, role: str = "", dump_dir: str = "", where: str = "") -> None:
        super().__init__(message)
        self.role, self.dump_dir, self.where = role, dump_dir, where


_lock = threading.Lock()
_expected: dict[str, str] = {}  # dump dir -> the token the driver wrote there
_where = ""
_run = ""  # the driver's run id
_verdicts: dict[str, str | None] = {}  # dump dir -> why it is not the driver's folder, None when it is
_token = ""  # this process's token as a driver (one per process: a second ray.init marks with the same one)


def leave_marks(dump_dirs: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Write this process's mark into each of ``dump_dirs`` (the driver, before its workers start), under this
    process's run id (:func:`~skipweave.store.identity.run_id`).

    Args:
        dump_dirs: the absolute dump dirs of the plan's enabled roles.

    Returns:
        ``(marked, failed)``: ``{dump_dir: token}`` of the dump dirs marked, for :func:`expect_marks` in the
        workers; and ``{dump_dir: why}`` of those that could not be (a read-only dump dir), which the workers
        then do not check. Never raises.
    """
    global _token
    with _lock:
        if not _token:
            _token = secrets.token_hex(16)
        token = _token
    marked: dict[str, str] = {}
    failed: dict[str, str] = {}
    for dump_dir in dict.fromkeys(dump_dirs):
        try:
            shared_mark.write_mark(dump_dir, run_id(), token)
        except (OSError, ValueError) as exc:
            failed[dump_dir] = f"{type(exc).__name__}: {exc}"
        else:
            marked[dump_dir] = token
    return marked, failed


def expect_marks(run: str, marks: Mapping[str, str], *, where: str) -> None:
    """Make this process check, at its first eligible call per dump dir, that the driver's mark is there.

    Args:
        run: the driver's run id, under which it left the marks.
        marks: ``{dump_dir: token}`` as :func:`leave_marks` returned it in the driver (entries whose token is not
            32 hex digits are ignored: the mapping came through the environment).
        where: this process for people, e.g. ``pid=12 node=10.0.0.2 (3f2a...) host=gpu-7``.
    """
    global _where, _run
    with _lock:
        _expected.clear()
        _verdicts.clear()
        if name_problem(run) is None:  # (a run id that names no folder: nothing to look for)
            _expected.update({d: t for d, t in marks.items() if isinstance(d, str) and shared_mark.is_token(t)})
        _where, _run = where, run


def check(role: RoleConfig) -> None:
    """At the first eligible call of one of ``role``'s targets in this process: is its dump dir the driver's?

    Looks for the mark once per dump dir and process, and warns once per dump dir (module docstring).

    Args:
        role: the called target's role.

    Raises:
        DumpDirNotShared: the mark is not there and ``role.require_shared`` is true (every call, until one passes).
    """
    if not _expected:
        return
    dump_dir = role.dump_dir
    token = _expected.get(dump_dir)
    if token is None:
        return
    with _lock:
        known = dump_dir in _verdicts
        problem = _verdicts.get(dump_dir)
    if not known:
        problem = shared_mark.mark_problem(dump_dir, _run, token)
        with _lock:
            first = dump_dir not in _verdicts
            _verdicts[dump_dir] = problem
        if problem is not None and first and not role.require_shared:
            logger.warning("%s", _message(role, problem) + f"; or set skip.{role.role}.require_shared: true to make "
                           "this an error")
    if problem is None:
        return
    if role.require_shared:
        raise DumpDirNotShared(_message(role, problem) + f" (skip.{role.role}.require_shared is true, so the call "
                               "did not run)", role=role.role, dump_dir=dump_dir, where=_where)


def _message(role: RoleConfig, problem: str) -> str:
    return (f"skipweave: role {role.role}: dump_dir {role.dump_dir} in worker {_where} is not the folder the driver "
            f"uses ({problem}): what this worker records there, the driver and the next run's workers on other "
            f"nodes never see. Put the dump dir on storage every node mounts at the same path (NFS or another "
            f"shared file system) and set skip.{role.role}.dump_dir to it")


__all__ = ["DumpDirNotShared", "check", "expect_marks", "leave_marks"]
