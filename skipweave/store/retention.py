"""Retention of recorded steps: which whole steps of one role go (``skip.<role>.keep``, ``skipweave gc --keep-last``),
and their crash-safe removal.

One judgement for the run and the CLI: :func:`plan_retention` lists the steps a :class:`KeepRule` selects in one
``{dump_dir}/{namespace}/{role}``, :func:`remove_step` removes one of them, and
:class:`~skipweave.store.retainer.Retainer` runs both in a recording process after it committed a new step, and once
more at the run's end. The rule:

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
import time
import uuid
from collections.abc import Collection, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import filelock

from skipweave.store.atomic import fsync_dir
from skipweave.store.foreign import describe, foreign_in_step
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
    from skipweave.store.role_access import RoleSteps

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


def plan_retention(store: RoleSteps, rule: KeepRule, *, protect: Collection[int] = (), min_age: float = OPEN_PART_AGE_S,
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


def _measure(store: RoleSteps, step: int) -> _Step | None:
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


def _blocked(store: RoleSteps, step: int, rule: KeepRule, protect: Collection[int], min_age: float,
             now: float) -> str | None:
    """Why a step may not be removed now, else ``None``."""
    if step in rule.pin:
        return "pinned"
    if step in protect:
        return "just written by this process"
    return foreign(store, step) or busy(store, step, min_age=min_age, now=now)


def foreign(store: RoleSteps, step: int) -> str | None:
    """Why a step holds entries of a format version this skipweave does not read, else ``None``: such a step is
    never removed, whatever the rule (a newer skipweave wrote it, and only it can judge it)."""
    found = foreign_in_step(os.path.join(role_dir(store.dump_dir, store.namespace, store.role), str(step)))
    return f"holds {describe(found)}, which this skipweave does not read" if found else None


def busy(store: RoleSteps, step: int, *, min_age: float, now: float | None = None) -> str | None:
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


def _parts(store: RoleSteps, step: int) -> list[tuple[str, str, str]]:
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


def remove_step(store: RoleSteps, item: StepRemoval, *, lock_timeout: float, min_age: float = OPEN_PART_AGE_S,
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
            why = foreign(store, item.step) or busy(store, item.step, min_age=min_age, now=now)
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


def role_lock(dump_dir: str, namespace: str, role: str, *, timeout: float) -> filelock.FileLock:
    """The lock of the one process cleaning a role (``{role}/.retention.lock``), for ``skipweave gc``.

    Args:
        timeout: seconds to wait for it before ``filelock.Timeout``.
    """
    return filelock.FileLock(os.path.join(role_dir(dump_dir, namespace, role), RETENTION_LOCK), timeout=timeout)


__all__ = ["OPEN_PART_AGE_S", "RETENTION_LOCK", "TRASH_PREFIX", "KeepRule", "RetentionPlan", "StepRemoval", "busy",
           "foreign", "is_trash_name", "plan_retention", "remove_step", "role_lock", "trash_folders"]
