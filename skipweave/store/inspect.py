"""Read a whole dump dir for people and tools: what is recorded, what is broken, what gc may remove.

:func:`scan` walks ``{dump_dir}/{namespace}/{role}/{step}/{target}/`` (see :mod:`skipweave.store.layout`)
into plain dataclasses, judging every entry with the same functions the runtime uses
(:func:`~skipweave.store.manifest.read_manifest`, :func:`~skipweave.store.manifest.verify_payload`,
:meth:`~skipweave.store.step_store.StepStore.is_complete`), so ``skipweave ls`` and ``skipweave verify``
never disagree with what a run would serve.

Vocabulary:

- an **entry** is one committed manifest with its payload files; its status is ``complete`` (valid and its
  part may be served), ``incomplete`` (valid, but its part may not be served), ``refused`` (sound, but it
  holds pickled data and pickle is not allowed: a run sets it aside, gc keeps it) or ``corrupt`` (the
  manifest is unreadable or belongs to another entry, lists foreign files, or a payload file is missing,
  not a regular file, truncated or fails its checksum) -- judged by
  :func:`~skipweave.store.manifest.check_manifest`, the function a run uses;
- an **ignored** name is one skipweave never writes (a symlink, a file where a folder belongs, a folder
  not named like a step): it is listed, never followed, read or removed;
- a **part** is one (step, target, shard): the unit the runtime serves or sets aside;
- a **leftover** is a file or folder no reader ever looks at: a ``temporary`` file (``.tmp-*``, a write
  that never finished), an ``orphan`` payload file (renamed into place, but the writer died before its
  manifest) or a ``set_aside`` folder (parts an interrupted run or a corrupt entry left behind).

:func:`plan_gc` and :func:`apply_gc` remove what is broken. Entries are judged again right before they are
removed, under the file lock their writer takes, so a complete, valid entry is never removed, also when a
run replaces or completes one meanwhile. Anything a running writer may still own (temporary and orphan
files, incomplete parts, set-aside folders) is kept while it is younger than ``min_age``. They also remove the
``.runs`` marks of runs that ended (:func:`skipweave.store.runs.ended_runs` says which), which :func:`scan` skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import filelock

from skipweave.store import runs
from skipweave.store.fs import is_real_dir, is_step_name, name_problem, remove_tree
from skipweave.store.group import check_group as check_pack
from skipweave.store.group import claims, entry_of, read_data
from skipweave.store.group import read_group as read_pack
from skipweave.store.layout import GROUP_SUFFIX as PACK_SUFFIX
from skipweave.store.layout import (
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    SET_ASIDE_DIR,
    TMP_PREFIX,
    EntryKey,
    key_of_manifest,
    parse_manifest_name,
    parse_payload_name,
    role_dir,
)
from skipweave.store.layout import group_stem as pack_stem
from skipweave.store.layout import parse_group_data_name as parse_pack_data_name
from skipweave.store.layout import parse_group_name as parse_pack_name
from skipweave.store.layout import touch_role as touch_changes
from skipweave.store.manifest import (
    EntryInvalid,
    EntryRefused,
    check_manifest,
    read_manifest,
    seconds_of,
    verify_payload,
)
from skipweave.store.step_store import StepStore, calls_in, part_lock

__all__ = [
    "DumpScan",
    "EntryScan",
    "GcAction",
    "GcKind",
    "Leftover",
    "LeftoverKind",
    "PartScan",
    "Status",
    "Verdict",
    "apply_gc",
    "check_entry",
    "find_dump_dir_hint",
    "human_bytes",
    "human_time",
    "payload_names",
    "payload_stem",
    "plan_gc",
    "plural",
    "scan",
]

_HINT_MAX_FOLDERS = 5000

LOCK_WAIT_S = 2.0
"""Seconds gc waits for a writer's lock before leaving the item alone."""


class Status(str, enum.Enum):
    """Status of an entry or a part."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    REFUSED = "refused"
    CORRUPT = "corrupt"


class LeftoverKind(str, enum.Enum):
    """Kinds of files and folders that no reader looks at."""

    TEMPORARY = "temporary"
    ORPHAN = "orphan"
    SET_ASIDE = "set_aside"


# ---------------------------------------------------------------------------------------------- dataclasses
@dataclass
class EntryScan:
    """One committed manifest and its payload.

    Attributes:
        key: the entry's identity, from where its manifest sits.
        path: the manifest's path.
        status: complete, incomplete or corrupt (see the module docstring).
        reason: why the entry is corrupt, else ``None``.
        files: names (in the target folder) of the manifest and of the payload files it owns that exist.
        bytes: total size of ``files``.
        manifest: the parsed manifest, ``None`` when it is unreadable.
        modified: newest modification time of ``files`` (unix seconds).
    """

    key: EntryKey
    path: str
    status: Status
    reason: str | None
    files: list[str]
    bytes: int
    manifest: dict[str, Any] | None
    modified: float

    @property
    def created_unix(self) -> float | None:
        """Creation time from the manifest (unix seconds), if known."""
        value = (self.manifest or {}).get("created_unix")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            return float(value) if math.isfinite(value) else None
        except OverflowError:  # an int beyond a float's range: not a time a clock gives
            return None

    @property
    def generation_seconds(self) -> float:
        """Wall time of the real call that produced the entry (0 when unknown)."""
        return seconds_of(self.manifest or {})

    def as_dict(self) -> dict[str, Any]:
        """Return the entry as a JSON-ready mapping (the ``entry`` object documented in docs/cli.md)."""
        return {
            "call": self.key.call,
            "status": self.status.value,
            "path": self.path,
            "bytes": self.bytes,
            "created": (self.manifest or {}).get("created"),
            "created_unix": self.created_unix,
            "generation_seconds": self.generation_seconds,
            "reason": self.reason,
        }


@dataclass
class PartScan:
    """One (step, target, shard) of a role.

    Attributes:
        namespace, role, target, step, shard: where the part sits.
        folder: the target folder holding the part's files.
        entries: committed entries, by call index.
        closed: its writer marked it closed (``{shard}.part.json`` says ``"closed"``).
        complete: the store would serve it (:meth:`StepStore.is_complete`).
        expected_calls: calls a step makes for this target and shard, as the store reckons it.
        part_file: path of ``{shard}.part.json`` when it exists.
        modified: newest modification time of the part's files (unix seconds).
    """

    namespace: str
    role: str
    target: str
    step: int
    shard: str
    folder: str
    entries: list[EntryScan]
    closed: bool
    complete: bool
    expected_calls: int
    part_file: str | None
    modified: float

    @property
    def status(self) -> Status:
        """``corrupt`` when any entry is, else ``refused`` when any entry is, else ``complete`` or ``incomplete``
        as the store would judge it."""
        if any(e.status is Status.CORRUPT for e in self.entries):
            return Status.CORRUPT
        if any(e.status is Status.REFUSED for e in self.entries):
            return Status.REFUSED
        return Status.COMPLETE if self.complete else Status.INCOMPLETE

    @property
    def where(self) -> str:
        """Short human label, e.g. ``default/rollout gen step 3 shard r0``."""
        return f"{self.namespace}/{self.role} {self.target} step {self.step} shard {self.shard}"

    @property
    def incomplete_reason(self) -> str | None:
        """Why the store would not serve the part, or ``None`` when it would."""
        if self.complete:
            return None
        if not self.entries:
            return "no entry committed"
        return (
            f"{self.contiguous} of {self.expected_calls} calls committed and never closed"
            if self.contiguous == len(self.entries)
            else f"calls {[e.key.call for e in self.entries]} committed (a gap) and never closed"
        )

    @property
    def contiguous(self) -> int:
        """Number of calls 0..n-1 committed without a gap."""
        n = 0
        for e in self.entries:
            if e.key.call != n:
                break
            n += 1
        return n

    @property
    def bytes(self) -> int:
        """Bytes of every entry of the part."""
        return sum(e.bytes for e in self.entries)

    @property
    def created_unix(self) -> float | None:
        """Earliest creation time of the part's entries (unix seconds)."""
        times = [t for e in self.entries if (t := e.created_unix) is not None]
        return min(times) if times else None

    def as_dict(self) -> dict[str, Any]:
        """Return the part as a JSON-ready mapping (the ``part`` object documented in docs/cli.md)."""
        first = min(self.entries, key=lambda e: e.created_unix or float("inf")) if self.entries else None
        return {
            "step": self.step,
            "shard": self.shard,
            "status": self.status.value,
            "closed": self.closed,
            "expected_calls": self.expected_calls,
            "entries": len(self.entries),
            "entries_by_status": _count(e.status for e in self.entries),
            "bytes": self.bytes,
            "created": (first.manifest or {}).get("created") if first else None,
            "created_unix": self.created_unix,
            "modified_unix": self.modified,
            "generation_seconds": sum(e.generation_seconds for e in self.entries),
            "path": self.folder,
            "reason": self.incomplete_reason if self.status is Status.INCOMPLETE else None,
        }


@dataclass
class Leftover:
    """A file or folder that no reader looks at (see :class:`LeftoverKind`).

    Attributes:
        kind: temporary, orphan or set_aside.
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

    def as_dict(self) -> dict[str, Any]:
        """Return the leftover as a JSON-ready mapping (the ``leftover`` object documented in docs/cli.md)."""
        return {"kind": self.kind.value, "path": self.path, "bytes": self.bytes, "modified_unix": self.modified}


@dataclass
class DumpScan:
    """Everything under one dump dir.

    Attributes:
        dump_dir: the absolute dump dir.
        parts: every part, ordered by namespace, role, target, step and shard.
        leftovers: temporary files, orphan payload files and set-aside folders.
        checksums: whether payload checksums were checked (else sizes only).
        calls_per_step: the value given to the stores, ``None`` to let them learn it.
        allow_pickle: entries holding pickled data are judged as a run with ``allow_pickle=true`` would.
        ignored: names skipweave never writes (symlinks, files where folders belong, folders not named like
            steps), each ``(path, why)``; never followed, read or removed.
    """

    dump_dir: str
    parts: list[PartScan] = field(default_factory=list)
    leftovers: list[Leftover] = field(default_factory=list)
    checksums: bool = False
    calls_per_step: int | None = None
    allow_pickle: bool = False
    ignored: list[tuple[str, str]] = field(default_factory=list)

    def entries(self) -> Iterator[EntryScan]:
        """Yield every entry of every part."""
        for part in self.parts:
            yield from part.entries

    def store(self, namespace: str, role: str) -> StepStore:
        """Return a :class:`StepStore` of one role of this dump dir (read-only use)."""
        return StepStore(self.dump_dir, namespace, role, calls_per_step=self.calls_per_step,
                         allow_pickle=self.allow_pickle)

    def totals(self) -> dict[str, Any]:
        """Return the ``totals`` object documented in docs/cli.md."""
        return {
            "parts": len(self.parts),
            "parts_by_status": _count(p.status for p in self.parts),
            "entries": sum(len(p.entries) for p in self.parts),
            "entries_by_status": _count(e.status for e in self.entries()),
            "bytes": sum(p.bytes for p in self.parts),
            "leftovers": len(self.leftovers),
            "leftover_bytes": sum(x.bytes for x in self.leftovers),
        }

    def tree(self) -> list[dict[str, Any]]:
        """Return the nested ``namespaces`` list documented in docs/cli.md (namespaces > roles > targets > parts)."""
        out: list[dict[str, Any]] = []
        index: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for p in self.parts:
            ns_key, role_key, target_key = (p.namespace,), (p.namespace, p.role), (p.namespace, p.role, p.target)
            if ns_key not in index:
                roles: list[dict[str, Any]] = []
                out.append({"name": p.namespace, "roles": roles})
                index[ns_key] = roles
            if role_key not in index:
                targets: list[dict[str, Any]] = []
                index[ns_key].append({"name": p.role, "targets": targets})
                index[role_key] = targets
            if target_key not in index:
                parts: list[dict[str, Any]] = []
                index[role_key].append({"name": p.target, "parts": parts})
                index[target_key] = parts
            index[target_key].append(p.as_dict())
        return out


def _count(statuses: Iterable[Status]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for s in statuses:
        counts[s.value] += 1
    return counts


# ---------------------------------------------------------------------------------------------- scanning
def scan(dump_dir: str, *, checksums: bool = False, calls_per_step: int | None = None,
         allow_pickle: bool = False) -> DumpScan:
    """Walk a dump dir and judge every entry, part and leftover, as a run would.

    Args:
        dump_dir: the store root (``skip.<role>.dump_dir``).
        checksums: check every payload file's checksum (reads all bytes); else check sizes only.
        calls_per_step: calls one shard makes per step, for every role; ``None`` lets the store learn it
            from closed steps, as a run without ``calls_per_step`` does.
        allow_pickle: judge entries holding pickled data as a run with ``allow_pickle=true`` would
            (else they are ``refused``).

    Returns:
        The :class:`DumpScan`.

    Raises:
        FileNotFoundError: ``dump_dir`` does not exist.
        NotADirectoryError: ``dump_dir`` is not a folder.
        PermissionError: a folder cannot be listed.
    """
    dump_dir = os.path.abspath(dump_dir)
    if not os.path.exists(dump_dir):
        raise FileNotFoundError(f"{dump_dir} does not exist")
    if not os.path.isdir(dump_dir):
        raise NotADirectoryError(f"{dump_dir} is not a folder")
    result = DumpScan(dump_dir, checksums=checksums, calls_per_step=calls_per_step, allow_pickle=allow_pickle)
    for namespace in _subdirs(result, dump_dir):
        for role in _subdirs(result, os.path.join(dump_dir, namespace)):
            _scan_role(result, namespace, role)
    return result


def _subdirs(result: DumpScan, folder: str) -> list[str]:
    """Real sub-folders of ``folder`` with valid names; symlinks and stray names go to
    ``result.ignored`` (hidden names, e.g. lock files, are skipped silently)."""
    names = []
    with os.scandir(folder) as it:
        for d in it:
            if d.name.startswith("."):
                continue
            if d.is_symlink():
                result.ignored.append((d.path, "a symlink (never followed)"))
            elif not d.is_dir(follow_symlinks=False):
                continue  # files at this level are looked at by the caller, if at all
            elif name_problem(d.name) is None:
                names.append(d.name)
            else:
                result.ignored.append((d.path, "a folder name skipweave never writes"))
    return sorted(names, key=_natural)


def _natural(name: str) -> list[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]


def _scan_role(result: DumpScan, namespace: str, role: str) -> None:
    store = result.store(namespace, role)
    rdir = role_dir(result.dump_dir, namespace, role)
    steps = []
    with os.scandir(rdir) as it:
        for d in it:
            if d.name.startswith(".") or (d.name == SET_ASIDE_DIR and not d.is_symlink()):
                continue
            if d.is_symlink():
                result.ignored.append((d.path, "a symlink (never followed)"))
            elif is_step_name(d.name) and d.is_dir(follow_symlinks=False):
                steps.append(int(d.name))
            else:
                why = "a file where a step folder belongs" if is_step_name(d.name) else "a name skipweave never writes"
                result.ignored.append((d.path, why))
    for step in sorted(steps):
        step_dir = os.path.join(rdir, str(step))
        for target in _subdirs(result, step_dir):
            _scan_target(result, store, step, target, os.path.join(step_dir, target))
    aside = os.path.join(rdir, SET_ASIDE_DIR)
    if is_real_dir(aside):
        for name in sorted(os.listdir(aside)):
            path = os.path.join(aside, name)
            size, newest = _tree_size(path)
            result.leftovers.append(Leftover(LeftoverKind.SET_ASIDE, path, size, newest))


def _tree_size(path: str) -> tuple[int, float]:
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


def _stat(path: str) -> tuple[int, float]:
    try:
        st = os.lstat(path)
    except OSError:
        return 0, 0.0
    return st.st_size, st.st_mtime


def _scan_target(result: DumpScan, store: StepStore, step: int, target: str, folder: str) -> None:
    manifests: dict[str, list[tuple[int, str]]] = {}
    part_files: set[str] = set()
    payloads: dict[str, list[str]] = {}
    groups: dict[str, list[tuple[int, int, str]]] = {}  # shard -> its group files as (first, last, name)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(TMP_PREFIX):
            size, mtime = _stat(path)
            result.leftovers.append(Leftover(LeftoverKind.TEMPORARY, path, size, mtime))
        elif name.startswith("."):
            continue  # lock files: kept, deleting one could let two writers in
        elif (parsed := parse_manifest_name(name)) is not None and name_problem(parsed[0]) is None:
            manifests.setdefault(parsed[0], []).append((parsed[1], name))
        elif name.endswith(PART_SUFFIX) and name_problem(name[: -len(PART_SUFFIX)]) is None:
            part_files.add(name[: -len(PART_SUFFIX)])
        elif (grouped := parse_pack_name(name)) is not None and name_problem(grouped[0]) is None:
            groups.setdefault(grouped[0], []).append((grouped[1], grouped[2], name))
        elif name.endswith((MANIFEST_SUFFIX, PART_SUFFIX, PACK_SUFFIX)):
            result.ignored.append((path, "a name skipweave never writes"))
        elif (stem := payload_stem(name)) is not None:
            payloads.setdefault(stem, []).append(name)
    claimed: set[str] = set()
    for shard in sorted(set(manifests) | part_files | set(groups), key=_natural):
        entries = []
        for call, name in sorted(manifests.get(shard, [])):
            key = store.key(step, target, shard, call)
            entry = _scan_entry(folder, key, name, payloads.get(key.stem, []), checksums=result.checksums,
                                allow_pickle=result.allow_pickle)
            if entry is not None:
                claimed.update(entry.files)
                entries.append(entry)
        own = {e.key.call for e in entries}
        for first, last, name in groups.get(shard, []):
            grouped_entries = _scan_group(folder, store.key(step, target, shard, first), first, last, name,
                                          payloads.get(pack_stem(shard, first, last), []), own=own,
                                          checksums=result.checksums, allow_pickle=result.allow_pickle)
            for entry in grouped_entries:
                claimed.update(entry.files)
            entries += grouped_entries
        entries.sort(key=lambda e: e.key.call)
        info = store.part_info(step, target, shard)
        complete = store.is_complete(step, target, shard)
        for e in entries:
            if e.status is Status.COMPLETE:
                e.status = Status.COMPLETE if complete else Status.INCOMPLETE
        part_file = os.path.join(folder, shard + PART_SUFFIX) if shard in part_files else None
        times = [e.modified for e in entries] + ([_stat(part_file)[1]] if part_file else [])
        result.parts.append(PartScan(
            namespace=store.namespace, role=store.role, target=target, step=step, shard=shard, folder=folder,
            entries=entries, closed=info.closed, complete=complete,
            expected_calls=store.expected_calls(target, shard), part_file=part_file, modified=max(times, default=0.0),
        ))
    for stem, names in sorted(payloads.items()):
        for name in names:
            if name not in claimed:
                size, mtime = _stat(os.path.join(folder, name))
                result.leftovers.append(Leftover(LeftoverKind.ORPHAN, os.path.join(folder, name), size, mtime, stem))


def _scan_entry(
    folder: str, key: EntryKey, name: str, stem_payloads: list[str], *, checksums: bool, allow_pickle: bool
) -> EntryScan | None:
    path = os.path.join(folder, name)
    try:
        verdict = check_entry(path, checksums=checksums, allow_pickle=allow_pickle, key=key)
    except FileNotFoundError:  # removed between listing and reading
        return None
    manifest, reason = verdict.manifest, verdict.reason
    referenced = payload_names(manifest)
    # An unreadable manifest cannot say which payload files are its own: they all go with it.
    owned = stem_payloads if referenced is None else [n for n in stem_payloads if n in referenced]
    files = [name, *owned]
    sizes = [_stat(os.path.join(folder, n)) for n in files]
    status = Status.REFUSED if verdict.refused else Status.CORRUPT if reason else Status.COMPLETE
    return EntryScan(
        key=key, path=path, status=status, reason=reason, files=files,
        bytes=sum(s for s, _ in sizes), manifest=manifest, modified=max(t for _, t in sizes),
    )


def _scan_group(folder: str, key: EntryKey, first: int, last: int, name: str, data_names: list[str], *,
                own: set[int], checksums: bool, allow_pickle: bool) -> list[EntryScan]:
    """The entries of one group file: one per call it holds that has no manifest of its own (such a call is
    served by its manifest). The group's files and bytes are shared out over them."""
    path = os.path.join(folder, name)
    verdicts = check_group(path, key, first, last, checksums=checksums, allow_pickle=allow_pickle)
    if verdicts is None:  # removed between listing and reading
        return []
    group, by_call = verdicts
    referenced = _group_data(group) if isinstance(group, dict) else None
    files = [name, *(n for n in data_names if referenced is None or n in referenced)]
    sizes = [_stat(os.path.join(folder, n)) for n in files]
    calls = [c for c in range(first, last + 1) if c not in own]
    out = []
    total = sum(s for s, _ in sizes)
    for i, call in enumerate(calls):
        verdict = by_call[call]
        reason = verdict.reason
        status = Status.REFUSED if verdict.refused else Status.CORRUPT if reason else Status.COMPLETE
        share = total // len(calls) + (total % len(calls) if i == 0 else 0)
        out.append(EntryScan(
            key=dataclasses.replace(key, call=call), path=path, status=status, reason=reason, files=files,
            bytes=share, manifest=verdict.manifest, modified=max(t for _, t in sizes),
        ))
    return out


def check_group(path: str, key: EntryKey, first: int, last: int, *, checksums: bool,
                allow_pickle: bool = False) -> tuple[Any, dict[int, Verdict]] | None:
    """Judge every entry of a group file the way :meth:`StepStore.load` would, without decoding it: the group
    (:func:`~skipweave.store.pack.check_pack`), its data file (its size; with ``checksums`` every byte and its
    header, each call's tree included, :func:`~skipweave.store.pack.read_data`), each call against the folder's
    other group files (a call two of them claim, with no manifest of its own, is served by neither), then each
    entry's pickle against ``allow_pickle``.

    Returns:
        The parsed group file (``None`` when unreadable) and a :class:`Verdict` per call ``first..last``; ``None``
        when the group file does not exist.
    """
    try:
        group = read_pack(path)
    except FileNotFoundError:
        return None
    except EntryInvalid as exc:
        return None, {c: Verdict(None, str(exc)) for c in range(first, last + 1)}
    folder = os.path.dirname(path)
    try:
        judged = check_pack(group, path, key, first, last)
        if checksums:
            read_data(folder, judged, first, last)
        else:
            verify_payload(folder, {"payload": [judged.data]}, checksums=False)
    except EntryInvalid as exc:
        entries = group.get("entries")
        return group, {c: Verdict(entries[c - first] if isinstance(entries, list) and len(entries) > c - first
                                  and isinstance(entries[c - first], dict) else None, str(exc))
                       for c in range(first, last + 1)}
    try:
        own, groups = calls_in(os.listdir(folder), key.shard)
    except OSError:
        own, groups = set(), ()
    claimed = claims(groups, (first, last))
    out: dict[int, Verdict] = {}
    for call, manifest in judged.entries.items():
        if claimed[call] > 1 and call not in own:
            out[call] = Verdict(manifest, f"call {call} is claimed by {claimed[call]} group files: none is served")
            continue
        try:
            entry_of(judged, dataclasses.replace(key, call=call), allow_pickle=allow_pickle)
            out[call] = Verdict(manifest, None)
        except EntryRefused as exc:
            out[call] = Verdict(manifest, str(exc), refused=True)
    return group, out


def payload_stem(name: str) -> str | None:
    """Return the entry stem (``r0-0001``) of a payload file name, or the group stem (``r0-0000-0063``) of a group's
    data file, or ``None`` when it is neither."""
    parsed = parse_payload_name(name)
    return parsed[0] if parsed else parse_pack_data_name(name)


def payload_names(manifest: dict[str, Any] | None) -> set[str] | None:
    """Return the payload file names a manifest lists, or ``None`` when it lists none readable."""
    if manifest is None or not isinstance(manifest.get("payload"), list):
        return None
    names = {item.get("name") for item in manifest["payload"] if isinstance(item, dict)}
    return {n for n in names if isinstance(n, str)}


@dataclass(frozen=True)
class Verdict:
    """How :func:`check_entry` judged one entry.

    Attributes:
        manifest: the parsed manifest, ``None`` when it is unreadable.
        reason: why the entry would not be served, ``None`` when it would.
        refused: the entry is sound but holds pickled data and pickle is not allowed (``reason`` says so).
    """

    manifest: dict[str, Any] | None
    reason: str | None
    refused: bool = False


def check_entry(path: str, *, checksums: bool, allow_pickle: bool = False, key: EntryKey | None = None) -> Verdict:
    """Judge one committed entry the way :meth:`StepStore.load` would, without decoding it.

    The same judgement (:func:`~skipweave.store.manifest.check_manifest`: identity, payload names, pickle)
    and the same payload checks (regular files, sizes, and with ``checksums`` every byte).

    Args:
        path: the manifest.
        checksums: also compare each payload file's checksum (reads every byte).
        allow_pickle: judge as a run with ``allow_pickle=true`` (else a pickled entry is refused).
        key: the entry the manifest is read for; default: the one its place implies.

    Returns:
        The :class:`Verdict`.

    Raises:
        FileNotFoundError: the manifest does not exist.
    """
    grouped = parse_pack_name(os.path.basename(path))
    if grouped is not None and key is not None:  # a grouped entry: its group file judged for its call
        verdicts = check_group(path, key, grouped[1], grouped[2], checksums=checksums, allow_pickle=allow_pickle)
        if verdicts is None:
            raise FileNotFoundError(path)
        return verdicts[1].get(key.call, Verdict(None, f"group {path} holds no call {key.call}"))
    try:
        manifest = read_manifest(path)
    except EntryInvalid as exc:
        return Verdict(None, str(exc))
    key = key or key_of_manifest(path)
    if key is None:
        return Verdict(manifest, f"manifest {path} does not sit at an entry's place in a dump dir "
                                 "({namespace}/{role}/{step}/{target}/{shard}-{call}.manifest.json)")
    try:
        check_manifest(manifest, path, key, allow_pickle=allow_pickle)
    except EntryRefused as exc:
        try:
            verify_payload(os.path.dirname(path), manifest, checksums=checksums)
        except EntryInvalid as bad:
            return Verdict(manifest, str(bad))
        return Verdict(manifest, str(exc), refused=True)
    except EntryInvalid as exc:
        return Verdict(manifest, str(exc))
    try:
        verify_payload(os.path.dirname(path), manifest, checksums=checksums)
    except EntryInvalid as exc:
        return Verdict(manifest, str(exc))
    return Verdict(manifest, None)


def find_dump_dir_hint(path: str) -> str | None:
    """Return the dump dir that the first manifest found below ``path`` implies, when it is not ``path``.

    Helps a person who passed a parent of the dump dir, or a namespace, role or step folder. Looks
    at most six folder levels down (and at most a few thousand folders) and ignores set-aside folders.
    """
    path = os.path.abspath(path)
    base = path.rstrip(os.sep).count(os.sep)
    for visited, (folder, dirs, files) in enumerate(os.walk(path)):
        if visited >= _HINT_MAX_FOLDERS:  # a home folder or a disk root: give up rather than crawl it
            return None
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != SET_ASIDE_DIR)
        if folder.count(os.sep) - base >= 6:
            dirs[:] = []
        if any(n.endswith(MANIFEST_SUFFIX) and not n.startswith(".") for n in files):
            implied = folder
            for _ in range(4):  # target -> step -> role -> namespace -> dump dir
                implied = os.path.dirname(implied)
            return None if implied == path else implied
    return None


# ---------------------------------------------------------------------------------------------- gc
class GcKind(str, enum.Enum):
    """What a gc action removes."""

    CORRUPT_ENTRY = "corrupt_entry"
    INCOMPLETE_PART = "incomplete_part"
    TEMPORARY = "temporary"
    ORPHAN = "orphan"
    SET_ASIDE = "set_aside"
    RUN_MARKS = "run_marks"


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

    def as_dict(self) -> dict[str, Any]:
        """Return the action as a JSON-ready mapping (the ``action`` object documented in docs/cli.md)."""
        return {
            "kind": self.kind.value, "path": self.path, "where": self.where, "files": self.files,
            "bytes": self.bytes, "reason": self.reason, "outcome": self.outcome, "detail": self.detail,
        }


def plan_gc(result: DumpScan) -> list[GcAction]:
    """List what gc removes: incomplete parts, corrupt entries, leftovers, then ended runs' marks. Nothing is touched.

    A corrupt entry inside an incomplete part goes with its part. Orphan payload files written for an
    entry that is removed go with that entry. Complete, valid entries never appear. What gc leaves alone under
    ``.runs`` (symlinks, files, odd names) is added to ``result.ignored``.
    """
    actions: list[GcAction] = []
    owner: dict[tuple[str, str], GcAction] = {}  # (folder, stem) -> the action removing that entry
    for part in result.parts:
        if not part.complete:
            files = list(dict.fromkeys(os.path.join(part.folder, n) for e in part.entries for n in e.files))
            files += [part.part_file] if part.part_file else []
            reasons = [part.incomplete_reason or "incomplete"]
            reasons += [f"call {e.key.call} is corrupt: {e.reason}" for e in part.entries if e.reason]
            action = GcAction(
                GcKind.INCOMPLETE_PART, part.folder, files, sum(_stat(f)[0] for f in files), "; ".join(reasons),
                where=part.where, part=part, modified=part.modified,
            )
            actions.append(action)
            owner.update({(part.folder, _stem_of(e)): action for e in part.entries})
            continue
        grouped: set[str] = set()  # group files already removed by an action: shared by their entries
        for e in part.entries:
            if e.status is Status.CORRUPT and e.path not in grouped:
                if e.path.endswith(PACK_SUFFIX):
                    grouped.add(e.path)
                action = GcAction(
                    GcKind.CORRUPT_ENTRY, e.path, [os.path.join(part.folder, n) for n in e.files],
                    sum(_stat(os.path.join(part.folder, n))[0] for n in e.files),
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
        actions.append(GcAction(GcKind.RUN_MARKS, r.path, [r.path], r.bytes, f"run ended: {r.reason}",
                                where=f"run {r.run}", modified=r.modified))
    return actions


_LEFTOVER_REASONS = {
    GcKind.TEMPORARY: "temporary file of a write that never finished",
    GcKind.ORPHAN: "payload file no manifest refers to (its writer stopped before committing)",
    GcKind.SET_ASIDE: "set aside by a run (interrupted part or corrupt entry); never served",
}


def _stem_of(entry: EntryScan) -> str:
    """The stem of the files an entry's removal takes: its own (``r0-0003``), or its group's (``r0-0000-0063``)."""
    name = os.path.basename(entry.path)
    return name[: -len(PACK_SUFFIX)] if parse_pack_name(name) is not None else entry.key.stem


def apply_gc(result: DumpScan, action: GcAction, *, min_age: float, dry_run: bool, now: float | None = None) -> None:
    """Carry out (or, with ``dry_run``, only vet) one action; set its ``outcome`` and ``detail``.

    Items a running writer may still own (all but corrupt entries) are skipped while younger than
    ``min_age`` seconds. Entries are checked again under their writer lock right before removal: an entry
    that has become complete and valid meanwhile is skipped. Never raises for a single item: an
    ``OSError`` sets ``outcome="failed"``.
    """
    now = time.time() if now is None else now
    if action.kind is not GcKind.CORRUPT_ENTRY and now - action.modified < min_age:
        action.outcome = "skipped"
        action.detail = (
            f"modified {now - action.modified:.0f} s ago, less than --min-age {min_age:.0f} s; "
            "a run may still be writing it"
        )
        return
    if dry_run:
        action.outcome = "would_remove"
        return
    try:
        skipped = _REMOVERS[action.kind](result, action, min_age, now)
        if not skipped and action.part is not None:  # runs reading this role re-read its recorded steps
            touch_changes(result.dump_dir, action.part.namespace, action.part.role)
    except filelock.Timeout:
        skipped = "a writer holds its lock"
    except Exception as exc:  # OSError, or whatever a crafted tree provokes: this item fails, gc goes on
        action.outcome, action.detail = "failed", f"{type(exc).__name__}: {exc}"
        return
    action.outcome, action.detail = ("skipped", skipped) if skipped else ("removed", None)


def _unlink_stem(folder: str, stem: str) -> None:
    """Remove the manifest and every payload file of one entry (the caller holds its part's lock).

    Symlinks are removed themselves (never their targets); a folder planted at a payload's name is removed
    with its contents (it lies inside the dump dir: :func:`~skipweave.store.paths.remove_tree` follows no symlink).
    """
    for n in os.listdir(folder):
        if n.startswith(stem + ".") and not n.startswith(TMP_PREFIX):
            path = os.path.join(folder, n)
            with contextlib.suppress(FileNotFoundError):
                remove_tree(path)


def _entry_lock(folder: str, stem: str) -> filelock.FileLock:
    # The lock of the entry's (or group's) part, which every writer of the part holds (StepStore's part_lock).
    grouped = parse_pack_name(stem + PACK_SUFFIX)
    return part_lock(folder, grouped[0] if grouped else stem.rsplit("-", 1)[0], timeout=LOCK_WAIT_S)


def _part_lock(folder: str, shard: str) -> filelock.FileLock:
    return part_lock(folder, shard, timeout=LOCK_WAIT_S)


def _remove_corrupt_entry(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    assert action.entry is not None and action.part is not None
    folder, stem = action.part.folder, _stem_of(action.entry)
    with _part_lock(folder, action.part.shard):
        try:
            verdict = check_entry(action.path, checksums=True, allow_pickle=result.allow_pickle,
                                  key=action.entry.key)
        except FileNotFoundError:
            return "already gone"
        if verdict.reason is None or verdict.refused:
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
        group_stems = [pack_stem(part.shard, first, last) for first, last, _ in groups]
        newest = max([_stat(os.path.join(part.folder, s + MANIFEST_SUFFIX))[1] for s in stems]
                     + [_stat(os.path.join(part.folder, s + PACK_SUFFIX))[1] for s in group_stems]
                     + [_stat(part.part_file or "")[1]])
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
    folder, name = os.path.split(action.path)
    stem = payload_stem(name) or name
    grouped = parse_pack_data_name(name) is not None
    with _entry_lock(folder, stem):
        manifest_file = os.path.join(folder, stem + (PACK_SUFFIX if grouped else MANIFEST_SUFFIX))
        if os.path.exists(manifest_file):
            try:
                referenced = _group_data(read_pack(manifest_file)) if grouped \
                    else payload_names(read_manifest(manifest_file))
            except EntryInvalid:
                referenced = None
            if referenced is None or name in referenced:
                return "a manifest refers to it now"
        try:
            remove_tree(action.path)  # a file, or a folder planted at its name
        except FileNotFoundError:
            return "already gone"
    return None


def _group_data(group: dict[str, Any]) -> set[str] | None:
    """The data file name a group file refers to, ``None`` when it names none readable."""
    data = group.get("data")
    name = data.get("name") if isinstance(data, dict) else None
    return {name} if isinstance(name, str) else None


def _remove_run_marks(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    return runs.remove_ended(action.path, min_age=min_age, now=now)  # judged again: the run may have come back


def _remove_tree(result: DumpScan, action: GcAction, min_age: float, now: float) -> str | None:
    if not os.path.lexists(action.path):
        return "already gone"
    if not is_real_dir(os.path.dirname(action.path)):  # its _set_aside became a symlink meanwhile
        return "its folder is no longer a real folder of the dump dir"
    remove_tree(action.path)
    return None


_REMOVERS = {
    GcKind.CORRUPT_ENTRY: _remove_corrupt_entry,
    GcKind.INCOMPLETE_PART: _remove_incomplete_part,
    GcKind.TEMPORARY: _remove_file,
    GcKind.ORPHAN: _remove_orphan,
    GcKind.SET_ASIDE: _remove_tree,
    GcKind.RUN_MARKS: _remove_run_marks,
}


# ---------------------------------------------------------------------------------------------- display
def human_bytes(n: int) -> str:
    """Return ``n`` bytes as ``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def plural(n: int, one: str, many: str | None = None) -> str:
    """Return ``"1 entry"`` / ``"3 entries"``: ``n`` and the word in the right number."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def human_time(unix: float | None) -> str:
    """Return a unix time as local ``YYYY-MM-DD HH:MM:SS``, or ``-`` when unknown."""
    try:
        return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))
    except (OverflowError, ValueError, OSError):  # a crafted time: not one a clock gives
        return "-"
