"""What a role's folders hold, kept in memory while they are unchanged: each part's calls and group files, its
entries' writers and fingerprints, and the steps recorded.

Part of :class:`~skipweave.store.step_store.StepStore`. Every value is kept with the modification time of the folder it
was read from (:class:`~skipweave.store.cache.ValidatedCache`), so a replay hit costs one ``lstat``; any change to a
folder, by any process (a re-record, ``gc``, a deleted step), makes it read again.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from skipweave.store.cache import ValidatedCache
from skipweave.store.errors import EntryForeign, EntryInvalid, UnsafePath
from skipweave.store.folders import Mtime, RoleFolders
from skipweave.store.format import jsonio
from skipweave.store.format.group import CheckedGroup, check_group, claims, read_data, read_group
from skipweave.store.format.layout import (
    GROUP_SUFFIX,
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    EntryKey,
    list_steps,
    manifest_path,
    parse_group_name,
    parse_manifest_name,
    role_mtime,
    touch_role,
)
from skipweave.store.format.manifest import read_manifest
from skipweave.store.fs import open_regular
from skipweave.store.identity import Recorded, recorded_of

INDEX_REFRESH_S = 5.0
"""Seconds a role's in-memory index of recorded steps is trusted before it is rebuilt from the folder."""

GROUP_CACHE_BYTES = 64 << 20
"""Bytes of verified group data files a store keeps in memory (least recently used dropped first), so the hits of a
group's entries read and verify its data file once."""

GroupFile = tuple[int, int, str]
"""A group file of a part: ``(first call, last call, file name)``."""

Split = tuple[memoryview, dict[int, tuple[Any, dict[str, Any]]]]
"""A group's verified data section and its spans by call: ``call -> (tree span, tensor spans by name)`` (see
:func:`~skipweave.store.format.group.index`)."""

Part = tuple[int, str, str]
"""A part: ``(step, target, shard)``."""


@dataclass(frozen=True)
class PartInfo:
    """What is committed for one (step, target, shard): call indices and whether it was closed."""

    calls: tuple[int, ...]
    closed: bool

    @property
    def contiguous(self) -> int:
        """Number of calls 0..n-1 committed without a gap."""
        n = 0
        for c in self.calls:
            if c != n:
                break
            n += 1
        return n


@dataclass(frozen=True)
class Listing:
    """A part's files as its folder lists them: its group files and the calls with a manifest of their own."""

    groups: tuple[GroupFile, ...]
    own: frozenset[int]


def calls_in(names: Collection[str], shard: str) -> tuple[set[int], tuple[GroupFile, ...]]:
    """The calls of ``shard`` with a manifest of their own among a folder's names, and its group files as
    ``(first, last, name)``."""
    own: set[int] = set()
    groups: list[GroupFile] = []
    for n in names:
        if n.endswith(MANIFEST_SUFFIX):
            if (parsed := parse_manifest_name(n)) is not None and parsed[0] == shard:
                own.add(parsed[1])
        elif n.endswith(GROUP_SUFFIX) and (grouped := parse_group_name(n)) is not None and grouped[0] == shard:
            groups.append((grouped[1], grouped[2], n))
    return own, tuple(sorted(groups))


def part_state(path: str) -> str | None:
    """The state a ``{shard}.part.json`` gives (``open``, ``closed``); ``None`` when it is missing or unreadable."""
    try:
        with open(open_regular(path), "rb") as fh:
            state = jsonio.loads(fh.read(1 << 16)).get("state")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return state if isinstance(state, str) else None


_PartCalls = tuple[tuple[Recorded, ...], dict[str, tuple[int, int, Recorded]], dict[int, EntryForeign]]


class PartIndex:
    """Each part's listing, group files and entry summaries, kept while its folder is unchanged."""

    def __init__(self, folders: RoleFolders) -> None:
        self._folders = folders
        self._listings: ValidatedCache[Part, Listing] = ValidatedCache()
        # part -> (its entries' summaries, manifest path -> (mtime ns, size, summary), its foreign calls): see
        # part_calls
        self._entries: ValidatedCache[Part, _PartCalls] = ValidatedCache()
        # group file path -> (checked group, its verified data split by call, or None), by (inode, mtime ns, size)
        self._groups: ValidatedCache[str, tuple[CheckedGroup, Split | None]] = ValidatedCache(
            max_weight=GROUP_CACHE_BYTES, weight=lambda v: int(v[0].data["bytes"]) if v[1] is not None else 0)

    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        """The committed calls of a part and whether its writer closed it (see
        :meth:`~skipweave.store.step_store.StepStore.part_info`)."""
        return self._list(step, target, shard)[0]

    def _list(self, step: int, target: str, shard: str) -> tuple[PartInfo, Listing | None]:
        self._folders.key(step, target, shard, 0)
        part = (step, target, shard)
        mtime = self._folders.mtime(step, target)
        try:
            folder = self._folders.folder(step, target)
            names = os.listdir(folder)
        except UnsafePath as exc:
            self._folders.warn_unsafe(exc)
            return PartInfo((), False), None
        except FileNotFoundError:  # (NotADirectoryError: the dump dir itself is a file -- the store is unusable)
            self._listings.pop(part)
            return PartInfo((), False), None
        own, groups = calls_in(names, shard)
        listing = Listing(groups, frozenset(own))
        self._listings.put(part, mtime, listing)
        calls = sorted(own.union(*(range(first, last + 1) for first, last, _ in groups)))
        closed = shard + PART_SUFFIX in names and part_state(os.path.join(folder, shard + PART_SUFFIX)) == "closed"
        return PartInfo(tuple(calls), closed), listing

    def listing(self, part: Part, mtime: Mtime | None) -> Listing | None:
        """The part's listing when its folder is as it was listed (``mtime``), else ``None``."""
        return self._listings.get(part, mtime)

    def groups_of(self, step: int, target: str, shard: str) -> tuple[GroupFile, ...]:
        """The group files of a part, listed again only when the folder changed."""
        listing = self._listings.get((step, target, shard), self._folders.mtime(step, target))
        if listing is None:
            listing = self._list(step, target, shard)[1]
        return listing.groups if listing is not None else ()

    def covering(self, key: EntryKey, groups: tuple[GroupFile, ...] | None = None) -> GroupFile | None:
        """The one group file holding ``key``'s call, ``None`` when none does (among ``groups`` when given: the part's
        group files as listed).

        Raises:
            EntryInvalid: two group files claim the call (no writer makes that): neither serves it.
        """
        if groups is None:
            groups = self.groups_of(key.step, key.target, key.shard)
        found = [g for g in groups if g[0] <= key.call <= g[1]]
        if len(found) > 1:
            raise EntryInvalid(f"call {key.call} of {key.target} step {key.step} shard {key.shard} is claimed by "
                               f"{len(found)} group files ({', '.join(g[2] for g in found)}): none is served")
        return found[0] if found else None

    def open_group(self, key: EntryKey, first: int, last: int, name: str, *, folder: str | None = None,
                   data: bool = False) -> tuple[CheckedGroup, Split | None]:
        """Read and check a group file (and, with ``data``, read and verify its data file), kept in memory while
        the file is unchanged (same inode, modification time and size).

        Raises:
            FileNotFoundError: the group file is gone.
            EntryInvalid: the group file or its data file is unsound (see
            :func:`~skipweave.store.format.group.check_group`).
            UnsafePath: a folder on the way is a symlink or a file.
        """
        folder = folder or self._folders.folder(key.step, key.target)
        path = os.path.join(folder, name)
        st = os.lstat(path)
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._groups.get(path, ident)
        if cached is not None and (cached[1] is not None or not data):
            return cached
        checked = cached[0] if cached is not None else check_group(read_group(path), path, key, first, last)
        split = read_data(folder, checked, first, last) if data else None
        self._groups.put(path, ident, (checked, split))
        return checked, split

    def part_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None) -> tuple[Recorded, ...]:
        """The committed entries of a part with their writer and input fingerprint, sorted by call index (see
        :meth:`~skipweave.store.step_store.StepStore.part_calls`)."""
        if mtime is None:
            mtime = self._folders.mtime(step, target)
        return self._part_calls((step, target, shard), mtime)[0]

    def foreign_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None
                      ) -> dict[int, EntryForeign]:
        """The calls of a part held by an entry (or group file) of a format version this skipweave does not read,
        each with why (see :class:`~skipweave.store.errors.EntryForeign`); kept as :meth:`part_calls` is."""
        if mtime is None:
            mtime = self._folders.mtime(step, target)
        return self._part_calls((step, target, shard), mtime)[2]

    def _part_calls(self, part: Part, mtime: Mtime | None) -> _PartCalls:
        step, target, shard = part
        hit = self._entries.get(part, mtime)
        if hit is not None:
            return hit
        last = self._entries.last(part)
        known = last[1][1] if last is not None else {}
        files: dict[str, tuple[int, int, Recorded]] = {}
        foreign: dict[int, EntryForeign] = {}
        info, listing = self._list(step, target, shard)
        groups = listing.groups if listing is not None else ()
        with_manifest = listing.own.intersection(info.calls) if listing is not None else frozenset()
        grouped = {c for first, last_call, _ in groups for c in range(first, last_call + 1)}
        own: set[int] = set()
        for call in sorted(with_manifest):
            path = manifest_path(self._folders.dump_dir, self._folders.key(step, target, shard, call))
            try:
                st = os.lstat(path)
            except OSError:
                continue
            own.add(call)
            old = known.get(path)
            if old is not None and old[:2] == (st.st_mtime_ns, st.st_size):
                files[path] = old
                continue
            try:
                files[path] = (st.st_mtime_ns, st.st_size, recorded_of(read_manifest(path), call))
            except EntryForeign as exc:  # serves no call here: not an entry of the part, but its slot is taken
                foreign[call] = exc
            except (EntryInvalid, OSError):
                continue
        in_groups: list[Recorded] = []
        if grouped - own:
            claimed = claims(groups)
            for first, last_call, name in groups:
                try:
                    checked, _ = self.open_group(self._folders.key(step, target, shard, first), first, last_call, name)
                except EntryForeign as exc:
                    foreign.update({c: exc for c in range(first, last_call + 1) if c not in own})
                    continue
                except (EntryInvalid, OSError):
                    continue
                in_groups += [recorded_of(m, c) for c, m in checked.entries.items()
                              if c not in own and claimed[c] == 1]
        entries = tuple(sorted([*(f[2] for f in files.values()), *in_groups], key=lambda r: r.call))
        value = (entries, files, foreign)
        self._entries.put(part, mtime, value)
        return value


class StepIndex:
    """The steps holding a complete recording, per (target, shard), kept while the role folder's mtime is unchanged
    (every skipweave writer and ``gc`` move it, :func:`~skipweave.store.format.layout.touch_role`) and at most
    :data:`INDEX_REFRESH_S` seconds (for changes made by hand)."""

    def __init__(self, folders: RoleFolders) -> None:
        self._folders = folders
        self._steps: ValidatedCache[tuple[str, str], list[int]] = ValidatedCache()

    def recorded_steps(self, target: str, shard: str, is_complete: Callable[[int, str, str], bool],
                       pending: list[int]) -> list[int]:
        """Sorted steps holding a complete recording of ``target`` for ``shard`` (``is_complete`` judges a step when
        the index is rebuilt), with the ``pending`` ones (being written by this process)."""
        f = self._folders
        mtime = role_mtime(f.dump_dir, f.namespace, f.role)
        steps = self._steps.get((target, shard), mtime, max_age=INDEX_REFRESH_S)
        if steps is None:
            steps = [s for s in list_steps(f.dump_dir, f.namespace, f.role) if is_complete(s, target, shard)]
            self._steps.put((target, shard), mtime, steps)
        return sorted({*steps, *pending}) if pending else steps

    def add(self, step: int, target: str, shard: str) -> None:
        """This process made ``step`` complete (servable) for ``(target, shard)``."""
        last = self._steps.last((target, shard))
        if last is not None and step not in last[1]:
            steps = list(last[1])
            bisect.insort(steps, step)
            self._steps.update((target, shard), steps)

    def drop(self, target: str, shard: str) -> None:
        """Forget ``(target, shard)``'s steps: rebuilt at the next look."""
        self._steps.pop((target, shard))

    def touch(self) -> None:
        """Move the role folder's mtime for other processes; this index, already up to date with the change
        (:meth:`add`, :meth:`drop`), moves to the new mtime unless something else changed it first."""
        f = self._folders
        before = role_mtime(f.dump_dir, f.namespace, f.role)
        touch_role(f.dump_dir, f.namespace, f.role)
        self._steps.revalidate(before, role_mtime(f.dump_dir, f.namespace, f.role))


__all__ = ["GROUP_CACHE_BYTES", "INDEX_REFRESH_S", "GroupFile", "Listing", "PartIndex", "PartInfo", "Split",
           "StepIndex", "calls_in", "part_state"]
