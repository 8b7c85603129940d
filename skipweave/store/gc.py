"""What ``skipweave gc`` removes, and the removal itself: what no run serves as it is -- and, with incomplete parts,
what a resume would serve.

:func:`plan_gc` lists, from a :class:`~skipweave.store.scan.DumpScan`, the incomplete parts, corrupt entries and
leftovers (see :mod:`skipweave.store.scan`), then the ``.runs`` marks of runs that ended
(:func:`skipweave.store.runs.ended_runs` says which); :func:`plan_retention_gc` the whole steps a retention rule
selects (``--keep-last``, ``--max-bytes``). :func:`apply_gc` removes one item. Entries are judged again
(:func:`skipweave.store.validity.check_entry`) right before they are removed, under the file lock their writer
takes, so a complete, valid entry is never removed, also when a run replaces or completes one meanwhile. Anything a
running writer may still own (incomplete parts, set-aside folders, run marks) is kept while it is younger than
``min_age``; temporary and orphan payload files are judged as a run's upkeep judges them
(:func:`skipweave.store.upkeep.leftover_kept`: a temporary file of a writer that ended on this host goes at any age,
one of a writer still running here stays at any age, any other stays while younger than ``min_age``). Nothing outside
the dump dir is touched, and no symlink is followed.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from dataclasses import dataclass

import filelock

from skipweave.store import runs
from skipweave.store.format.layout import (
    GROUP_SUFFIX,
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    TMP_PREFIX,
    group_stem,
    parse_group_name,
    touch_role,
)
from skipweave.store.fs import is_real_dir, remove_tree
from skipweave.store.leftovers import LeftoverKind, size_and_mtime
from skipweave.store.retention import KeepRule, StepRemoval, plan_retention, remove_step, role_lock
from skipweave.store.scan import DumpScan, EntryScan, PartScan, Status
from skipweave.store.step_store import calls_in, part_lock
from skipweave.store.upkeep import leftover_kept, remove_orphan
from skipweave.store.validity import check_entry

__all__ = ["LOCK_WAIT_S", "GcAction", "GcKind", "apply_gc", "hold_role_locks", "plan_gc", "plan_retention_gc",
           "without_removed_steps"]

LOCK_WAIT_S = 2.0
"""Seconds gc waits for a writer's lock before leaving the item alone."""



class GcKind(str, enum.Enum):
    """What a gc action removes."""

    CORRUPT_ENTRY = "corrupt_entry"
    INCOMPLETE_PART = "incomplete_part"
    TEMPORARY = "temporary"
    ORPHAN = "orphan"
    SET_ASIDE = "set_aside"
    TRASH = "trash"
    RUN_MARKS = "run_marks"
    RETENTION = "retention"
    FOREIGN = "foreign"
    """Never removed: a part holding entries of a format version this skipweave does not read (listed as kept)."""


@dataclass
class GcAction:
    """One thing gc removes (or would remove) and what became of it.

    Attributes:
        kind: what is removed.
        path: the manifest (corrupt entry), target folder (incomplete part), file or folder (a set-aside one, or
            a run's folder of marks).
        files: every path the action removes.
        bytes: their total size.
        reason: why it is garbage.
        where: short human label of the entry, part or run (``run {id}``), else ``None``.
        outcome: ``would_remove`` (dry run), ``removed``, ``skipped`` (left alone for safety) or ``failed``.
        detail: why it was skipped or failed.
        part: the part of an incomplete part or corrupt entry, else ``None``.
        entry: the corrupt entry, else ``None``.
        modified: newest modification time of what is removed (unix seconds), against ``min_age``.
        removal: the step a retention action removes (:mod:`skipweave.store.retention`), else ``None``.
        kept: why the plan keeps it, whatever :func:`apply_gc` would find (a run folder holding a driver's mark,
            whose run is not known to have ended), else ``None``.
    """

    kind: GcKind
    path: str
    files: list[str]
    bytes: int
    reason: str
    where: str | None = None
    outcome: str = "would_remove"
    detail: str | None = None
    part: PartScan | None = None
    entry: EntryScan | None = None
    modified: float = 0.0
    removal: StepRemoval | None = None
    kept: str | None = None


def plan_gc(result: DumpScan) -> list[GcAction]:
    """List what gc removes: incomplete parts, corrupt entries, leftovers, then ended runs' marks. Nothing is touched.

    A run folder that age alone would take but that holds a driver's mark is listed as kept (``outcome="skipped"``,
    ``kept`` and ``detail`` say why). A corrupt entry inside an incomplete part goes with its part. Orphan payload
    files written for an entry that is removed go with that entry. Complete, valid entries never appear. What gc
    leaves alone under ``.runs`` (symlinks, files, odd names) is added to ``result.ignored``.
    """
    actions: list[GcAction] = []
    owner: dict[tuple[str, str], GcAction] = {}  # (folder, stem) -> the action removing that entry
    for part in result.parts:
        if part.holds_foreign:
            # written by a skipweave that reads more than this one: nothing of the part is judged here, so nothing
            # of it goes (its corrupt siblings included: a newer writer may name its files in ways this code cannot)
            actions.append(_foreign_kept(part))
            continue
        if not part.complete:
            files = list(dict.fromkeys(os.path.join(part.folder, n) for e in part.entries for n in e.files))
            files += [part.part_file] if part.part_file else []
            reasons = [part.incomplete_reason or "incomplete"]
            reasons += [f"call {e.key.call} is corrupt: {e.reason}" for e in part.entries if e.reason]
            reasons += [note] if (note := _resume_note(part)) else []
            action = GcAction(
                GcKind.INCOMPLETE_PART, part.folder, files, sum(size_and_mtime(f)[0] for f in files),
                "; ".join(reasons), where=part.where, part=part, modified=part.modified,
            )
            actions.append(action)
            owner.update({(part.folder, _stem_of(e)): action for e in part.entries})
            continue
        grouped: set[str] = set()  # group files already removed by an action: shared by their entries
        for e in part.entries:
            if e.status is Status.CORRUPT and e.path not in grouped:
                if e.path.endswith(GROUP_SUFFIX):
                    grouped.add(e.path)
                action = GcAction(
                    GcKind.CORRUPT_ENTRY, e.path, [os.path.join(part.folder, n) for n in e.files],
                    sum(size_and_mtime(os.path.join(part.folder, n))[0] for n in e.files),
                    e.reason or "corrupt", where=f"{part.where} call {e.key.call}", part=part, entry=e,
                    modified=e.modified,
                )
                actions.append(action)
                owner[(part.folder, _stem_of(e))] = action
    for x in result.leftovers:
        entry_action = owner.get((os.path.dirname(x.path), x.stem or ""))
        if x.kind is LeftoverKind.ORPHAN and entry_action is not None:
            entry_action.files.append(x.path)
            entry_action.bytes += x.bytes
            continue
        kind = GcKind(x.kind.value)
        actions.append(GcAction(kind, x.path, [x.path], x.bytes, _LEFTOVER_REASONS[kind], modified=x.modified))
    ended, ignored = runs.ended_runs(result.dump_dir)
    result.ignored.extend(i for i in ignored if i not in result.ignored)  # (planned twice: listed once)
    for r in ended:
        if r.kept is not None:
            actions.append(GcAction(GcKind.RUN_MARKS, r.path, [r.path], r.bytes, f"run may have ended: {r.reason}",
                                    where=f"run {r.run}", outcome="skipped", detail=r.kept, modified=r.modified,
                                    kept=r.kept))
            continue
        actions.append(GcAction(GcKind.RUN_MARKS, r.path, [r.path], r.bytes, f"run ended: {r.reason}",
                                where=f"run {r.run}", modified=r.modified))
    return actions


def _foreign_kept(part: PartScan) -> GcAction:
    """The action that lists a part holding foreign entries as kept, whatever its age or completeness."""
    from skipweave.store.foreign import describe

    found = list({e.path: e.foreign for e in part.entries if e.foreign is not None}.values())  # a group: one file
    why = "this skipweave does not read that format version: the part is kept as it is (upgrade skipweave to use it)"
    files = list(dict.fromkeys(os.path.join(part.folder, n) for e in part.entries for n in e.files))
    return GcAction(GcKind.FOREIGN, part.folder, files, sum(size_and_mtime(f)[0] for f in files),
                    f"holds {describe(found)}", where=part.where, outcome="skipped", detail=why, part=part,
                    modified=part.modified, kept=why)


def plan_retention_gc(result: DumpScan, rule: KeepRule, *, namespace: str | None = None, role: str | None = None,
                      min_age: float, now: float | None = None) -> list[GcAction]:
    """The whole steps ``rule`` removes, as gc actions (kind ``retention``), role by role: the judgement a run's
    retention makes (:func:`~skipweave.store.retention.plan_retention`). Nothing is touched.

    Args:
        result: the scan of the dump dir (its roles are the ones with a part).
        rule: the rule, applied to each role separately.
        namespace, role: only this namespace or role (``None``: every one).
        min_age: seconds since its last change during which a part that is not closed, whose writer cannot be
            asked, keeps its step.
        now: the time to judge ages by (unix seconds).

    Returns:
        One action per step the rule selects, oldest first within each role; one that stays all the same (pinned,
        or busy: a writer may still be adding to it) has ``outcome="skipped"`` and ``detail`` says why.
    """
    actions = []
    roles = dict.fromkeys((p.namespace, p.role) for p in result.parts)
    for ns, name in roles:
        if (namespace is not None and ns != namespace) or (role is not None and name != role):
            continue
        plan = plan_retention(result.store(ns, name), rule, min_age=min_age, now=now)
        for item in sorted(plan.remove + plan.kept, key=lambda i: i.step):
            actions.append(GcAction(GcKind.RETENTION, item.folder, [item.folder], item.bytes,
                                    item.reason, where=item.where, outcome=item.outcome,
                                    detail=item.detail, removal=item))
    return actions


def without_removed_steps(actions: list[GcAction], retention: list[GcAction]) -> list[GcAction]:
    """``actions`` but those below a step folder one of ``retention`` removes (they go with the step)."""
    folders = tuple(a.path + os.sep for a in retention if a.outcome != "skipped")
    return [a for a in actions if not folders or not a.path.startswith(folders)]


def hold_role_locks(dump_dir: str, retention: list[GcAction], held: contextlib.ExitStack) -> None:
    """Take the lock of each role ``retention`` removes steps of (``{role}/.retention.lock``, the one process that
    cleans a role), kept by ``held``; a role another process cleans (its lock held :data:`LOCK_WAIT_S`) keeps its
    steps: their actions are marked skipped."""
    by_role: dict[tuple[str, str], list[GcAction]] = {}
    for a in retention:
        if a.removal is not None and a.outcome != "skipped":
            by_role.setdefault((a.removal.namespace, a.removal.role), []).append(a)
    for (ns, name), group in by_role.items():
        try:
            held.enter_context(role_lock(dump_dir, ns, name, timeout=LOCK_WAIT_S))
        except (filelock.Timeout, OSError) as exc:
            why = "another process is cleaning this role (its .retention.lock is held)" \
                if isinstance(exc, filelock.Timeout) else f"its .retention.lock cannot be taken ({exc})"
            for a in group:
                a.outcome, a.detail = "skipped", why


_LEFTOVER_REASONS = {
    GcKind.TEMPORARY: "temporary file of a write that never finished",
    GcKind.ORPHAN: "payload file no manifest refers to (its writer stopped before committing)",
    GcKind.SET_ASIDE: "set aside by a run (interrupted part or corrupt entry); never served",
    GcKind.TRASH: "a step retention was removing when it stopped; never served",
}


def _resume_note(part: PartScan) -> str | None:
    """What removing the incomplete ``part`` costs a resume (docs/format.md "Completeness"), ``None`` when nothing.

    A run resumes a short part when a step makes more than one call and every entry of the part has a readable
    manifest with an input fingerprint (:meth:`skipweave.store.resume.Resumes.matchable`; its role must also match
    calls by inputs, which gc cannot see): its entries then serve the calls with the same inputs.
    """
    sound = sum(1 for e in part.entries if e.reason is None)
    expected = part.expected_calls if part.expected_calls is not None else len(part.entries)  # unknown: as parts.py
    if not sound or expected <= 1:
        return None  # nothing a resume would serve
    if not all(isinstance(fp := (e.manifest or {}).get("input_fingerprint"), str) and fp for e in part.entries):
        return ("no run resumes it (an entry has no input fingerprint or no readable manifest): a run sets it aside "
                "and records the step afresh")
    return ("removing it loses what a resume would serve: a run whose calls are matched by inputs resumes the part, "
            + ("its entry serving the call" if sound == 1 else f"its {sound} entries serving the calls")
            + " with the same inputs")


def _stem_of(entry: EntryScan) -> str:
    """The stem of the files an entry's removal takes: its own (``r0-0003``), or its group's (``r0-0000-0063``)."""
    name = os.path.basename(entry.path)
    return name[: -len(GROUP_SUFFIX)] if parse_group_name(name) is not None else entry.key.stem


def apply_gc(result: DumpScan, action: GcAction, *, min_age: float, dry_run: bool, now: float | None = None) -> None:
    """Carry out (or, with ``dry_run``, only vet) one action; set its ``outcome`` and ``detail``.

    Items a running writer may still own (all but corrupt entries) are skipped while younger than
    ``min_age`` seconds. Entries are checked again under their writer lock right before removal: an entry
    that has become complete and valid meanwhile is skipped. Never raises for a single item: an
    ``OSError`` sets ``outcome="failed"``.
    """
    now = time.time() if now is None else now
    if action.kind is GcKind.RETENTION and action.outcome == "skipped":
        return  # kept by the plan (busy, or its role is cleaned by another process): said so already
    if action.kept is not None:  # kept by the plan whatever its age (a driver's mark): said why
        action.outcome, action.detail = "skipped", action.kept
        return
    if action.kind in (GcKind.TEMPORARY, GcKind.ORPHAN):  # the judgement a run's upkeep makes (store.upkeep)
        why = leftover_kept(LeftoverKind(action.kind.value), action.path, action.modified, min_age=min_age, now=now)
        if why is not None:
            action.outcome, action.detail = "skipped", why
            return
    # A corrupt entry is never served, and a trash folder is written by nobody: either goes at any age.
    elif action.kind not in (GcKind.CORRUPT_ENTRY, GcKind.TRASH, GcKind.RETENTION) and now - action.modified < min_age:
        action.outcome = "skipped"
        age = now - action.modified
        action.detail = runs.young_run_marks(age, min_age) if action.kind is GcKind.RUN_MARKS else (
            f"modified {age:.0f} s ago, less than --min-age {min_age:.0f} s; a run may still be writing it")
        return
    if dry_run:
        action.outcome = "would_remove"
        return
    try:
        skipped = _REMOVERS[action.kind](result, action, min_age, now)
        if not skipped and action.part is not None:  # runs reading this role re-read its recorded steps
            touch_role(result.dump_dir, action.part.namespace, action.part.role)
    except filelock.Timeout:
        skipped = "a writer holds its lock"
    except Exception as exc:  # OSError, or whatever a crafted tree provokes: this item fails, gc goes on
        action.outcome, action.detail = "failed", f"{type(exc).__name__}: {exc}"
        return
    action.outcome, action.detail = ("skipped", skipped) if skipped else ("removed", None)


def _unlink_stem(folder: str, stem: str) -> None:
    """Remove the manifest and every payload file of one entry (the caller holds its part's lock).

    Symlinks are removed themselves (never their targets); a folder planted at a payload's name is removed
    with its contents (it lies inside the dump dir: :func:`~skipweave.store.fs.remove_tree` follows no symlink).
    """
    for n in os.listdir(folder):
        if n.startswith(stem + ".") and not n.startswith(TMP_PREFIX):
            path = os.path.join(folder, n)
            with contextlib.suppress(FileNotFoundError):
                remove_tree(path)


def _part_lock(folder: str, shard: str) -> filelock.FileLock:
    return part_lock(folder, shard, timeout=LOCK_WAIT_S)


def _remove_corrupt_entry(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    assert action.entry is not None and action.part is not None
    folder, stem = action.part.folder, _stem_of(action.entry)
    with _part_lock(folder, action.part.shard):
        try:
            validity = check_entry(action.path, checksums=True, allow_pickle=result.allow_pickle,
                                  key=action.entry.key)
        except FileNotFoundError:
            return "already gone"
        if validity.reason is None or validity.refused:
            return "valid again (a writer replaced it)"
        _unlink_stem(folder, stem)
    _drop_empty_part(action.part)
    return None


def _drop_empty_part(part: PartScan) -> None:
    """After its last entry was removed, remove a part's state file and the folders left empty, so that
    ``verify`` passes right after one ``gc``."""
    with _part_lock(part.folder, part.shard):
        try:
            names = os.listdir(part.folder)
        except FileNotFoundError:
            return
        own, groups = calls_in(names, part.shard)
        if own or groups:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(part.folder, part.shard + PART_SUFFIX))
    for folder in (part.folder, os.path.dirname(part.folder)):  # target, then step folder
        for n in os.listdir(folder) if os.path.isdir(folder) else []:
            if n.endswith(".lock") and n.startswith("."):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, n))
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only when empty


def _remove_incomplete_part(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    part = action.part
    assert part is not None
    store = result.store(part.namespace, part.role)
    with _part_lock(part.folder, part.shard):
        if store.is_complete(part.step, part.target, part.shard):
            return "complete now (a writer finished it)"
        own, groups = calls_in(os.listdir(part.folder), part.shard)
        stems = [store.key(part.step, part.target, part.shard, c).stem for c in sorted(own)]
        group_stems = [group_stem(part.shard, first, last) for first, last, _ in groups]
        newest = max([size_and_mtime(os.path.join(part.folder, s + MANIFEST_SUFFIX))[1] for s in stems]
                     + [size_and_mtime(os.path.join(part.folder, s + GROUP_SUFFIX))[1] for s in group_stems]
                     + [size_and_mtime(part.part_file or "")[1]])
        stems += group_stems
        if now - newest < min_age:
            return "a writer added to it meanwhile"
        for stem in stems:  # under the part's lock, which every writer of the part takes
            _unlink_stem(part.folder, stem)
        for path in action.files:  # orphans of removed entries; the part file last
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    _drop_empty_part(part)
    return None


def _remove_file(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    try:
        remove_tree(action.path)  # a file, or a folder planted at its name
    except FileNotFoundError:
        return "already gone"
    return None


def _remove_orphan(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    return remove_orphan(action.path, lock_timeout=LOCK_WAIT_S)  # judged again under its part's lock


def _remove_run_marks(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    return runs.remove_ended(action.path, min_age=min_age, now=now)  # judged again: the run may have come back


def _remove_tree(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    if not os.path.lexists(action.path):
        return "already gone"
    if not is_real_dir(os.path.dirname(action.path)):  # its _set_aside became a symlink meanwhile
        return "its folder is no longer a real folder of the dump dir"
    remove_tree(action.path)
    return None


def _remove_retained(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    # Judged again under every part lock of the step (its busy rule is the age rule here: no --min-age check first).
    assert action.removal is not None
    item = action.removal
    remove_step(result.store(item.namespace, item.role), item, lock_timeout=LOCK_WAIT_S, min_age=min_age, now=now)
    if item.outcome == "failed":
        raise OSError(item.detail)
    return item.detail if item.outcome == "skipped" else None


_REMOVERS = {
    GcKind.CORRUPT_ENTRY: _remove_corrupt_entry,
    GcKind.INCOMPLETE_PART: _remove_incomplete_part,
    GcKind.TEMPORARY: _remove_file,
    GcKind.ORPHAN: _remove_orphan,
    GcKind.SET_ASIDE: _remove_tree,
    GcKind.TRASH: _remove_tree,
    GcKind.RUN_MARKS: _remove_run_marks,
    GcKind.RETENTION: _remove_retained,
}

