"""Read a whole dump dir for people and tools: every entry, part and leftover, judged as a run would.

:func:`scan` walks ``{dump_dir}/{namespace}/{role}/{step}/{target}/`` (see :mod:`skipweave.store.format.layout`)
into plain dataclasses, judging every entry with :func:`skipweave.store.validity.check_entry` (the function a run's
checks come from) and every part with :meth:`~skipweave.store.step_store.StepStore.is_complete`, so ``skipweave
ls`` and ``skipweave verify`` never disagree with what a run would serve. :mod:`skipweave.store.gc` plans its
removals from a scan.

Vocabulary:

- an **entry** is one committed manifest (or one call of a group file of small entries) with its payload files;
  its status is ``complete`` (valid and its part may be served), ``incomplete`` (valid, but its part may not be
  served), ``refused`` (sound, but it holds pickled data and pickle is not allowed: a run sets it aside, gc keeps
  it), ``foreign`` (of a format version this skipweave does not read, newer or unknown: never served, never
  touched, by runs and every command alike) or ``corrupt`` (the manifest is unreadable or belongs to another
  entry, lists files not its own, or a payload file is missing, not a regular file, truncated or fails its
  checksum);
- an **ignored** name is one skipweave never writes (a symlink, a file where a folder belongs, a folder
  not named like a step): it is listed, never followed, read or removed;
- a **part** is one (step, target, shard): the unit the runtime serves or sets aside;
- a **leftover** is a file or folder no reader ever looks at: a ``temporary`` file (``.tmp-*``, a write
  that never finished), an ``orphan`` payload file (renamed into place, but the writer died before its
  manifest), a ``set_aside`` folder (parts an interrupted run or a corrupt entry left behind) or a ``trash`` folder
  (a step retention renamed to ``.trash-{step}-{token}`` and was deleting when it stopped,
  :mod:`skipweave.store.retention`).

The ``.runs`` marks of runs (:mod:`skipweave.store.runs`) are skipped.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from skipweave.store.errors import EntryForeign
from skipweave.store.format.layout import (
    GROUP_SUFFIX,
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    SET_ASIDE_DIR,
    TMP_PREFIX,
    EntryKey,
    group_stem,
    parse_group_name,
    parse_manifest_name,
    role_dir,
)
from skipweave.store.format.manifest import seconds_of
from skipweave.store.fs import is_real_dir, is_step_name, name_problem
from skipweave.store.leftovers import Leftover, LeftoverKind, size_and_mtime, tree_size
from skipweave.store.parts import calls_committed
from skipweave.store.retention import is_trash_name
from skipweave.store.step_store import StepStore
from skipweave.store.validity import (
    Validity,
    check_entry,
    check_group,
    group_data_names,
    payload_names,
    payload_stem,
)

__all__ = [
    "DumpScan",
    "EntryScan",
    "PartScan",
    "Status",
    "find_dump_dir_hint",
    "scan",
]

_HINT_MAX_FOLDERS = 5000


class Status(str, enum.Enum):
    """Status of an entry or a part."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    REFUSED = "refused"
    FOREIGN = "foreign"
    CORRUPT = "corrupt"


# ---------------------------------------------------------------------------------------------- dataclasses
@dataclass
class EntryScan:
    """One committed manifest and its payload.

    Attributes:
        key: the entry's identity, from where its manifest sits.
        path: the manifest's path.
        status: complete, incomplete, refused, foreign or corrupt (see the module docstring).
        reason: why the entry is corrupt, refused or foreign, else ``None``.
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
    foreign: EntryForeign | None = None
    """Why the entry is foreign (its ``version`` and ``writer``: the skipweave that wrote it), else ``None``."""

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


@dataclass
class PartScan:
    """One (step, target, shard) of a role.

    Attributes:
        namespace, role, target, step, shard: where the part sits.
        folder: the target folder holding the part's files.
        entries: committed entries, by call index.
        closed: its writer marked it closed (``{shard}.part.json`` says ``"closed"``).
        complete: the store would serve it (:meth:`StepStore.is_complete`).
        expected_calls: calls a step makes for this target and shard, as the store reckons it; ``None`` when unknown.
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
    expected_calls: int | None
    part_file: str | None
    modified: float

    @property
    def status(self) -> Status:
        """``corrupt`` when any entry is, else ``foreign`` when any entry is, else ``refused`` when any entry is,
        else ``complete`` or ``incomplete`` as the store would judge it."""
        if any(e.status is Status.CORRUPT for e in self.entries):
            return Status.CORRUPT
        if self.holds_foreign:
            return Status.FOREIGN
        if any(e.status is Status.REFUSED for e in self.entries):
            return Status.REFUSED
        return Status.COMPLETE if self.complete else Status.INCOMPLETE

    @property
    def holds_foreign(self) -> bool:
        """Whether the part holds an entry of a format version this skipweave does not read: nothing of it is
        removed or rewritten."""
        return any(e.status is Status.FOREIGN for e in self.entries)

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
            calls_committed(self.contiguous, self.expected_calls)
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

    def store(self, namespace: str, role: str, *, views: bool = False) -> StepStore:
        """Return a :class:`StepStore` of one role of this dump dir (read-only use); ``views``: its ``load`` gives
        read-only views of the recorded objects instead of rebuilding their classes (``skipweave export``)."""
        return StepStore(self.dump_dir, namespace, role, calls_per_step=self.calls_per_step,
                         allow_pickle=self.allow_pickle, views=views)


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
            if is_trash_name(d.name):  # a step retention was removing when it stopped: never served
                size, newest = tree_size(d.path)
                result.leftovers.append(Leftover(LeftoverKind.TRASH, d.path, size, newest))
                continue
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
            size, newest = tree_size(path)
            result.leftovers.append(Leftover(LeftoverKind.SET_ASIDE, path, size, newest))


def _scan_target(result: DumpScan, store: StepStore, step: int, target: str, folder: str) -> None:
    manifests: dict[str, list[tuple[int, str]]] = {}
    part_files: set[str] = set()
    payloads: dict[str, list[str]] = {}
    groups: dict[str, list[tuple[int, int, str]]] = {}  # shard -> its group files as (first, last, name)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(TMP_PREFIX):
            size, mtime = size_and_mtime(path)
            result.leftovers.append(Leftover(LeftoverKind.TEMPORARY, path, size, mtime))
        elif name.startswith("."):
            continue  # lock files: kept, deleting one could let two writers in
        elif (parsed := parse_manifest_name(name)) is not None and name_problem(parsed[0]) is None:
            manifests.setdefault(parsed[0], []).append((parsed[1], name))
        elif name.endswith(PART_SUFFIX) and name_problem(name[: -len(PART_SUFFIX)]) is None:
            part_files.add(name[: -len(PART_SUFFIX)])
        elif (grouped := parse_group_name(name)) is not None and name_problem(grouped[0]) is None:
            groups.setdefault(grouped[0], []).append((grouped[1], grouped[2], name))
        elif name.endswith((MANIFEST_SUFFIX, PART_SUFFIX, GROUP_SUFFIX)):
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
                                          payloads.get(group_stem(shard, first, last), []), own=own,
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
        times = [e.modified for e in entries] + ([size_and_mtime(part_file)[1]] if part_file else [])
        result.parts.append(PartScan(
            namespace=store.namespace, role=store.role, target=target, step=step, shard=shard, folder=folder,
            entries=entries, closed=info.closed, complete=complete,
            expected_calls=store.expected_calls(target, shard), part_file=part_file, modified=max(times, default=0.0),
        ))
    for stem, names in sorted(payloads.items()):
        for name in names:
            if name not in claimed:
                size, mtime = size_and_mtime(os.path.join(folder, name))
                result.leftovers.append(Leftover(LeftoverKind.ORPHAN, os.path.join(folder, name), size, mtime, stem))


def _scan_entry(
    folder: str, key: EntryKey, name: str, stem_payloads: list[str], *, checksums: bool, allow_pickle: bool
) -> EntryScan | None:
    path = os.path.join(folder, name)
    try:
        validity = check_entry(path, checksums=checksums, allow_pickle=allow_pickle, key=key)
    except FileNotFoundError:  # removed between listing and reading
        return None
    manifest, reason = validity.manifest, validity.reason
    referenced = payload_names(manifest)
    # An unreadable manifest cannot say which payload files are its own: they all go with it.
    owned = stem_payloads if referenced is None else [n for n in stem_payloads if n in referenced]
    files = [name, *owned]
    sizes = [size_and_mtime(os.path.join(folder, n)) for n in files]
    return EntryScan(
        key=key, path=path, status=_status(validity), reason=reason, files=files,
        bytes=sum(s for s, _ in sizes), manifest=manifest, modified=max(t for _, t in sizes),
        foreign=validity.foreign,
    )


def _status(validity: Validity) -> Status:
    if validity.foreign is not None:
        return Status.FOREIGN
    return Status.REFUSED if validity.refused else Status.CORRUPT if validity.reason else Status.COMPLETE


def _scan_group(folder: str, key: EntryKey, first: int, last: int, name: str, data_names: list[str], *,
                own: set[int], checksums: bool, allow_pickle: bool) -> list[EntryScan]:
    """The entries of one group file: one per call it holds that has no manifest of its own (such a call is
    served by its manifest). The group's files and bytes are shared out over them."""
    path = os.path.join(folder, name)
    checked = check_group(path, key, first, last, checksums=checksums, allow_pickle=allow_pickle)
    if checked is None:  # removed between listing and reading
        return []
    group, by_call = checked
    referenced = group_data_names(group) if isinstance(group, dict) else None
    files = [name, *(n for n in data_names if referenced is None or n in referenced)]
    sizes = [size_and_mtime(os.path.join(folder, n)) for n in files]
    calls = [c for c in range(first, last + 1) if c not in own]
    out = []
    total = sum(s for s, _ in sizes)
    for i, call in enumerate(calls):
        validity = by_call[call]
        share = total // len(calls) + (total % len(calls) if i == 0 else 0)
        out.append(EntryScan(
            key=dataclasses.replace(key, call=call), path=path, status=_status(validity), reason=validity.reason,
            files=files, bytes=share, manifest=validity.manifest, modified=max(t for _, t in sizes),
            foreign=validity.foreign,
        ))
    return out


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

