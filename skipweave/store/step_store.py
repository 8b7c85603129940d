"""The step store of one role: record entries atomically, serve only complete and valid ones.

Guarantees (each has a test):

- A reader never sees a partial entry: payload files are written under temporary names, fsynced
  and renamed into place, the manifest last. Payload names carry a fresh token, so replacing an
  entry never touches the files an older manifest points at.
- An entry whose size or checksum does not match its manifest is never served.
- Concurrent writers of one entry (threads or processes) end with exactly one committed copy:
  writers of a part serialise on its file lock (``filelock``, :func:`part_lock`) and the later one keeps the
  committed entry.
- A step left incomplete by an interrupted run (fewer calls committed than the step makes, and
  never closed) is moved to ``_set_aside/`` before anything is recorded for it again, so old and
  new data never mix.
- Nothing leaves the dump dir: namespace, role, target and shard are checked single names, no folder
  below the root is a symlink (:func:`skipweave.store.paths.inside`), no file is opened through one.
- An entry is judged by :func:`skipweave.store.manifest.check_manifest`, the same function ``skipweave
  verify``/``gc``/``ls`` use.
- What a record reports is what happened: the manifest's rename is the commit; bookkeeping after it that
  fails is reported as such, and a folder moved or removed while an entry was written is detected (the
  write is abandoned and its temporary files removed through the open folder).
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import filelock
import safetensors  # noqa: F401 - its version goes into every manifest (library_versions)

from skipweave.store import jsonio
from skipweave.store.atomic import fsync_dir, sync_files, tmp_name, write_bytes_atomic
from skipweave.store.layout import (
    MANIFEST_SUFFIX,
    MAX_PACK_CALLS,
    PACK_SUFFIX,
    PART_SUFFIX,
    SET_ASIDE_DIR,
    TMP_PREFIX,
    EntryKey,
    changes_stamp,
    folder_stamp,
    list_steps,
    manifest_path,
    pack_stem,
    parse_manifest_name,
    parse_pack_name,
    parse_payload_name,
    part_path,
    role_dir,
    touch_changes,
)
from skipweave.store.manifest import (
    EntryInvalid,
    PayloadFile,
    build_manifest,
    bytes_checksum,
    check_manifest,
    read_manifest,
    verify_payload,
)
from skipweave.store.pack import (
    DATA_MAX_BYTES,
    ENTRY_MAX_BYTES,
    JudgedPack,
    build_pack,
    check_pack,
    claims,
    entry_of,
    pack_tensors,
    read_data,
    read_pack,
)
from skipweave.store.paths import UnsafePath, check_name, inside, lock_path, open_dir, open_regular, same_folder
from skipweave.store.writers import Recorded, is_concurrent_other, recorded_of, started_unix, this_writer

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600.0
"""Seconds a writer waits for another writer of the same entry before giving up."""

INDEX_REFRESH_S = 5.0
"""Seconds a role's in-memory index of recorded steps is trusted before it is rebuilt from the folder."""

FOLDER_TTL_S = 1.0
"""Seconds a part folder's checked way (:meth:`StepStore.folder`'s ``lstat`` of every folder below the dump dir) is
reused by :meth:`StepStore.load` while the folder's own stamp is unchanged; then it is checked again whole."""

PACK_CACHE_BYTES = 64 << 20
"""Bytes of verified group data files a store keeps in memory (least recently used dropped first), so the hits of a
group's entries read and verify its data file once."""


_Split = tuple[memoryview, dict[int, tuple[Any, dict[str, Any]]]]
"""A group's verified data section and its spans by call: ``call -> (tree span, tensor spans by name)`` (see
:func:`~skipweave.store.pack.index`)."""


@dataclass(frozen=True)
class Loaded:
    """A served entry: its manifest, the recorded result and the RNG state the real call left."""

    manifest: dict[str, Any]
    result: Any
    rng_state: dict[str, Any] | None
    bytes: int
    effects: dict[str, Any] | None = None
    """The values the target's declared side effects had after the real call (``skip.<role>.effects``)."""
    appended: dict[str, Any] | None = None
    """The declared effects that were lists the real call only appended to, by expression: ``{"n_before": items
    before the call, "tail": the items it appended}`` (such an effect is not in ``effects``); ``None`` when none."""


@dataclass(frozen=True)
class Staged:
    """An entry's payload encoded and ready to write (:meth:`StepStore.stage`).

    Attributes:
        tree: the codec's JSON tree, serialised.
        tensors: flat ``name -> tensor`` mapping (contiguous CPU tensors; owned copies after :meth:`owned`).
        pickled: some value was pickled (``allow_pickle``).
        nbytes: bytes the entry's payload files take (the tree and the tensor file), about the memory a pending
            write holds.
    """

    tree: bytes
    tensors: dict[str, Any]
    pickled: bool
    nbytes: int
    buffers: tuple[Any, ...] = ()
    """The :data:`~skipweave.store.buffers.POOL` buffers the owned copies live in (see :meth:`owned`)."""
    slack: int = 0
    """Bytes of those buffers beyond the copies in them."""

    def owned(self) -> Staged:
        """The same entry owning its tensors (each copied), so the host may change its result in place right after
        (a background write still records the result as it was returned). Costs one copy of the tensors; a large
        one is made into a reused buffer (:mod:`skipweave.store.buffers`), which whoever writes the entry hands
        back once it is written (:meth:`release`)."""
        from skipweave.store.buffers import POOL

        tensors: dict[str, Any] = {}
        buffers: list[Any] = []
        slack = 0
        try:
            for name, tensor in self.tensors.items():
                tensors[name], buffer = POOL.copy(tensor)
                if buffer is not None:
                    buffers.append(buffer)
                    slack += buffer.numel() - tensor.numel() * tensor.element_size()
        except BaseException:  # (out of memory): the buffers taken so far go back
            POOL.give(buffers)
            raise
        return Staged(self.tree, tensors, self.pickled, self.nbytes, tuple(buffers), slack)

    @property
    def held(self) -> int:
        """Bytes of memory the pending entry holds: its payload's, and what its reused buffers hold beyond it."""
        return self.nbytes + self.slack

    def release(self) -> None:
        """Hand this entry's reused buffers back (:meth:`owned`): call once nothing reads its tensors any more."""
        if self.buffers:
            from skipweave.store.buffers import POOL

            POOL.give(self.buffers)


@dataclass(frozen=True)
class EntryMeta:
    """What an entry's manifest says besides its payload (see :meth:`StepStore.record` for each field)."""

    target_path: str
    fingerprint: str
    seconds: float
    replace: bool = False
    concurrent: bool = False
    displace: bool = False
    """A slot another writer filled is kept and the entry goes to the next free call index (``record_own``)."""
    background: bool = False
    """Written by the background writer: no progress bar of its own (``skipweave.flush()`` shows one)."""


@dataclass
class _Written:
    """An entry written under temporary names, not yet committed."""

    key: EntryKey
    made: list[str]
    payload: list[tuple[str, str]]  # (temporary, final) names of the tree and tensor files
    manifest: tuple[str, str]
    files: list[PayloadFile]
    old: dict[str, Any] | None  # the manifest this entry replaces
    group: list[EntryKey] | None = None  # a group file's entries (its manifest is the group file)


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


class StoreMoved(OSError):
    """The folder an entry was being written into was moved or removed meanwhile; nothing was committed."""


class StepStore:
    """Entries of one role under ``{dump_dir}/{namespace}/{role}``.

    Args:
        dump_dir: absolute store root.
        namespace: run identity folder.
        role: role name.
        allow_pickle: let results the safe codec cannot hold be pickled, and load such entries.
        calls_per_step: calls one shard makes per step when known (see :class:`RoleConfig`).
        trusted_classes: ``module:qualname`` classes decoding may construct besides those it approves by
            itself (``skip.<role>.trusted_classes``; see :mod:`skipweave.store.codec`).
        compress: zstd level the tensor file of a new entry is compressed with (``skip.<role>.compress``), or
            ``None``; entries of either form are read.

    Raises:
        ValueError: ``namespace`` or ``role`` is not a single folder name (see
            :func:`~skipweave.store.paths.check_name`).
    """

    def __init__(
        self,
        dump_dir: str,
        namespace: str,
        role: str,
        *,
        allow_pickle: bool = False,
        calls_per_step: int | None = None,
        trusted_classes: tuple[str, ...] = (),
        compress: int | None = None,
    ) -> None:
        self.dump_dir = dump_dir
        self.compress = compress
        self.namespace = check_name("namespace", namespace)
        self.role = check_name("role", role)
        self.allow_pickle = allow_pickle
        self.calls_per_step = calls_per_step
        self.trusted_classes = tuple(trusted_classes)
        self._names: set[str] = set()  # target and shard names already checked
        self._root_id: tuple[int, int] | None = None  # (device, inode) of dump_dir when last seen
        self._unsafe_warned: set[str] = set()
        self._lock = threading.RLock()
        self._writing: set[tuple[int, str, str]] = set()  # parts this process records into
        self._checked: set[tuple[int, str, str]] = set()  # parts checked for interrupted leftovers
        # Parts that held no committed call when this process first prepared a call of them (or that it set aside):
        # whatever they hold since was written by this process or alongside it, none of which serves it.
        self._fresh: set[tuple[int, str, str]] = set()
        # Parts this process recorded into and has not closed; any number may be open at once (async rollouters
        # keep many steps in flight). A part is closed when a call of another step of its (target, shard)
        # is prepared and none of its own calls is still running, else when its last running call ends.
        self._open: set[tuple[int, str, str]] = set()
        self._running: dict[tuple[int, str, str], int] = {}  # part -> its real calls in progress
        self._left: set[tuple[int, str, str]] = set()  # open parts passed by a later call, closed when idle
        # Parts a real call of which raised (Ctrl-C, a preemption's SystemExit, a host error) with no later call
        # of the part succeeding: never marked closed, so the next run judges them by their calls and sets a
        # short one aside instead of serving it mixed with new calls.
        self._failed: dict[tuple[int, str, str], int] = {}  # part -> ticket of its latest failed call
        self._tickets = 0  # real calls started, numbered (call_started): a failure is undone only by a later call
        self._draining = False  # close_all ran: parts still running close when their calls end
        # Parts seen closed -> (inode, mtime in ns) of their folder then, so the repeat actions need not
        # re-read every part file on every call: one stat tells whether anything in the folder was added,
        # replaced or removed since (by any process: a re-record, gc, a deleted step), and then it is re-read.
        self._closed: dict[tuple[int, str, str], tuple[int, int]] = {}
        # (target, shard) -> (role folder stamp, monotonic time built, sorted complete steps): see recorded_steps
        # part -> (folder stamp, its entries' writers and fingerprints, manifest path -> (mtime, size, entry))
        self._entries: dict[tuple[int, str, str], tuple[tuple[int, int] | None, tuple[Recorded, ...],
                                                        dict[str, tuple[int, int, Recorded]]]] = {}
        self._index: dict[tuple[str, str], tuple[tuple[int, int] | None, float, list[int]]] = {}
        # Entries handed to the background writer and not yet committed: part -> call -> its future (done when
        # the write ended, committed or not). Such a part counts as recorded here: a call it serves waits.
        self._pending: dict[tuple[int, str, str], dict[int, concurrent.futures.Future[Any]]] = {}
        # part -> (folder stamp when listed, its group files as (first, last, name), the calls with a manifest of
        # their own); see _packs_of and load
        self._groups: dict[tuple[int, str, str], tuple[tuple[int, int] | None, tuple[tuple[int, int, str], ...],
                                                       frozenset[int]]] = {}
        self._paths: dict[tuple[int, str], str] = {}  # (step, target) -> its folder's path (names checked)
        # (step, target) -> (the folder's stamp, monotonic time) when its way was last checked (folder()); see load
        self._ways: dict[tuple[int, str], tuple[tuple[int, int], float]] = {}
        # group file path -> ((inode, mtime ns, size), judged group, its verified data split by call, or None); LRU
        self._pack_cache: collections.OrderedDict[str, tuple[tuple[int, int, int], JudgedPack, _Split | None]] \
            = collections.OrderedDict()
        _STORES.add(self)

    def pending_add(self, key: EntryKey, future: concurrent.futures.Future[Any]) -> None:
        """An entry of this store was handed to the background writer; ``future`` is done when its write ended."""
        part = (key.step, key.target, key.shard)
        with self._lock:
            self._pending.setdefault(part, {})[key.call] = future
            self._open.add(part)  # now: a call of a later step passes it (and it closes once its writes end)

    def pending_done(self, key: EntryKey) -> None:
        """The background write of ``key`` ended (committed or failed)."""
        part = (key.step, key.target, key.shard)
        with self._lock:
            calls = self._pending.get(part)
            if calls is not None:
                calls.pop(key.call, None)
                if not calls:
                    del self._pending[part]

    def wait_pending(self, step: int, target: str, shard: str, *, skip: Collection[int] = ()) -> None:
        """Wait until this process's background writes into a part have ended, but those of calls in ``skip``
        (the caller's own recordings, which it never serves to itself): a replay of an entry still being written
        reads it once committed."""
        with self._lock:
            waiting = [f for call, f in self._pending.get((step, target, shard), {}).items() if call not in skip]
        for future in waiting:
            with contextlib.suppress(Exception):
                future.result()

    def _after_fork(self) -> None:
        """In a forked child: the parent's background writes are the parent's (never waited for here)."""
        self._lock = threading.RLock()
        self._pending = {}

    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        """Return the :class:`EntryKey` of a call of this role.

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

    def _folder_path(self, step: int, target: str) -> str:
        """The path of a step's target folder (joined once; what :meth:`folder` returns, unchecked)."""
        path = self._paths.get((step, target))
        if path is None:
            if len(self._paths) > 4096:
                self._paths.clear()
            path = self._paths[(step, target)] = os.path.join(
                role_dir(self.dump_dir, self.namespace, self.role), str(step), target)
        return path

    def stamp(self, step: int, target: str) -> tuple[int, int] | None:
        """The :func:`~skipweave.store.layout.folder_stamp` of a step's target folder now (one ``lstat``).

        A replay takes it once, after waiting for this process's pending writes, and hands it to
        :meth:`part_calls` and :meth:`load`, so the caches both keep by the folder's stamp are judged against the
        same look at the folder.
        """
        return folder_stamp(self._folder_path(step, target))

    def _checked_folder(self, step: int, target: str,
                        stamp: tuple[int, int] | None = None) -> tuple[str, tuple[int, int] | None]:
        """:meth:`folder` and the folder's stamp (``stamp`` when given, else taken now): the way is checked again
        whole when the folder's stamp changed since it was last checked, or :data:`FOLDER_TTL_S` after (one
        ``lstat`` instead of one per folder below the dump dir).

        Raises:
            UnsafePath: a folder on the way is a symlink or a file.
        """
        path = self._folder_path(step, target)
        if stamp is None:
            stamp = folder_stamp(path)
        now = time.monotonic()
        with self._lock:
            seen = self._ways.get((step, target))
        if stamp is not None and seen is not None and seen[0] == stamp and now - seen[1] < FOLDER_TTL_S:
            return path, stamp
        folder = self.folder(step, target)  # stamp taken before: a change made meanwhile shows at the next call
        if stamp is not None:
            with self._lock:
                if len(self._ways) > 4096:
                    self._ways.clear()
                self._ways[(step, target)] = (stamp, now)
        return folder, stamp

    def _warn_unsafe(self, exc: OSError) -> None:
        text = str(exc)
        with self._lock:
            if text in self._unsafe_warned:
                return
            self._unsafe_warned.add(text)
        logger.warning("skipweave: role %s: %s; it is ignored (nothing is read from or written to it)",
                       self.role, text)

    # ------------------------------------------------------------------ reading
    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        """Return the committed calls of a part and whether its writer closed it.

        A part behind a symlinked or misplaced folder has nothing committed (a WARNING says so once).
        """
        self.key(step, target, shard, 0)
        part = (step, target, shard)
        stamp = folder_stamp(self._folder_path(step, target))
        try:
            folder = self.folder(step, target)
            names = os.listdir(folder)
        except UnsafePath as exc:
            self._warn_unsafe(exc)
            return PartInfo((), False)
        except FileNotFoundError:  # (NotADirectoryError: the dump dir itself is a file -- the store is unusable)
            with self._lock:
                self._groups.pop(part, None)
            return PartInfo((), False)
        own, groups = calls_in(names, shard)
        with self._lock:
            if len(self._groups) > 4096:
                self._groups.clear()
            self._groups[part] = (stamp, groups, frozenset(own))
        calls = sorted(own.union(*(range(first, last + 1) for first, last, _ in groups)))
        closed = False
        if shard + PART_SUFFIX in names:
            with contextlib.suppress(OSError, ValueError, RecursionError, AttributeError):
                with open(open_regular(os.path.join(folder, shard + PART_SUFFIX)), encoding="utf-8") as fh:
                    closed = json.loads(fh.read(1 << 16)).get("state") == "closed"
        return PartInfo(tuple(calls), closed)

    def part_calls(self, step: int, target: str, shard: str, *,
                   stamp: tuple[int, int] | None = None) -> tuple[Recorded, ...]:
        """The committed entries of a part with their writer and input fingerprint, sorted by call index.

        Kept until the part's folder changes (one ``lstat`` per call); after a change only manifests that are
        new or changed (by size or modification time) are read again, so a step of many calls costs one read
        per record, not one per entry. Only the calls the folder's listing shows a manifest of their own for are
        looked at (a grouped call has none: its summary comes from its group file). An unreadable manifest is
        left out here; serving it would fail its judgement anyway.

        Args:
            stamp: the folder's :meth:`stamp`, when the caller took it just now (a replay takes one for its whole
                read, see :meth:`load`); taken here when ``None``.
        """
        part = (step, target, shard)
        if stamp is None:
            stamp = folder_stamp(self._folder_path(step, target))
        with self._lock:
            seen = self._entries.get(part)
        if seen is not None and stamp is not None and seen[0] == stamp:
            return seen[1]
        known = seen[2] if seen is not None else {}
        files: dict[str, tuple[int, int, Recorded]] = {}
        calls = self.part_info(step, target, shard).calls
        with self._lock:
            listed = self._groups.get(part)
        groups = listed[1] if listed is not None else ()
        with_manifest = listed[2].intersection(calls) if listed is not None else frozenset()
        grouped = {c for first, last, _ in groups for c in range(first, last + 1)}
        own: set[int] = set()
        for call in sorted(with_manifest):
            path = manifest_path(self.dump_dir, self.key(step, target, shard, call))
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
            except (EntryInvalid, OSError):
                continue
        packed: list[Recorded] = []
        if grouped - own:
            claimed = claims(groups)
            for first, last, name in groups:
                try:
                    judged, _ = self._open_pack(self.key(step, target, shard, first), first, last, name)
                except (EntryInvalid, OSError):
                    continue
                packed += [recorded_of(m, c) for c, m in judged.entries.items() if c not in own and claimed[c] == 1]
        entries = tuple(sorted([*(f[2] for f in files.values()), *packed], key=lambda r: r.call))
        with self._lock:
            if len(self._entries) > 4096:  # bounded: a long run does not keep every step's summary
                self._entries.clear()
            self._entries[part] = (stamp, entries, files)
        return entries

    def expected_calls(self, target: str, shard: str) -> int:
        """Calls one shard makes per step: ``calls_per_step``, else the most seen in a closed part, else 1."""
        if self.calls_per_step is not None:
            return self.calls_per_step
        best = 0
        for step in list_steps(self.dump_dir, self.namespace, self.role)[-8:]:
            info = self.part_info(step, target, shard)
            if info.closed:
                best = max(best, info.contiguous)
        return best or 1

    def is_complete(self, step: int, target: str, shard: str) -> bool:
        """True when a part may be served: closed by its writer, or holding every expected call."""
        part = (step, target, shard)
        with self._lock:
            if part in self._writing or part in self._pending:
                return True
            seen = self._closed.get(part)
        stamp = folder_stamp(self._folder_path(step, target))
        if seen is not None and seen == stamp:
            return True
        # stamp taken before reading: a change made while reading shows at the next call
        info = self.part_info(step, target, shard)
        with self._lock:
            self._closed.pop(part, None)
            if info.calls and info.closed and stamp is not None:
                self._closed[part] = stamp
        if not info.calls:
            return False
        return info.closed or info.contiguous >= self.expected_calls(target, shard)

    def recorded_steps(self, target: str, shard: str) -> list[int]:
        """Sorted steps holding a complete recording of ``target`` for ``shard``.

        Kept in memory per (target, shard), so a ``repeat*`` decision costs the same with 10 or 10,000
        recorded steps: this process's own records, closes and set-asides update the index; one ``lstat`` of
        the role folder, whose modification time every skipweave writer and ``gc`` bump
        (:func:`~skipweave.store.layout.touch_changes`), shows another writer's change; and the index is
        rebuilt at least every :data:`INDEX_REFRESH_S` seconds anyway, for changes made by hand (or within
        one tick of a coarse file-system clock). A step the index serves that is
        gone meanwhile is a plain miss (the entry is looked up when served).
        """
        stamp = changes_stamp(self.dump_dir, self.namespace, self.role)
        now = time.monotonic()
        with self._lock:
            index = self._index.get((target, shard))
            pending = [p[0] for p in self._pending if p[1] == target and p[2] == shard] if self._pending else []
            if index is not None and index[0] == stamp and now - index[1] < INDEX_REFRESH_S:
                return sorted({*index[2], *pending}) if pending else index[2]
        steps = [s for s in list_steps(self.dump_dir, self.namespace, self.role) if self.is_complete(s, target, shard)]
        with self._lock:
            self._index[(target, shard)] = (stamp, now, steps)
        return sorted({*steps, *pending}) if pending else steps

    def _index_add(self, step: int, target: str, shard: str) -> None:
        with self._lock:
            index = self._index.get((target, shard))
            if index is not None and step not in index[2]:
                steps = list(index[2])
                bisect.insort(steps, step)
                self._index[(target, shard)] = (index[0], index[1], steps)

    def _touch(self) -> None:
        """Bump the role folder's stamp for other processes; this store's indexes, already up to date with the
        change (``_index_add``/``_index_drop``), move to the new stamp unless something else changed first."""
        before = changes_stamp(self.dump_dir, self.namespace, self.role)
        touch_changes(self.dump_dir, self.namespace, self.role)
        after = changes_stamp(self.dump_dir, self.namespace, self.role)
        with self._lock:
            for k, (stamp, built, steps) in list(self._index.items()):
                if stamp == before:
                    self._index[k] = (after, built, steps)

    def _index_drop(self, target: str, shard: str) -> None:
        with self._lock:
            self._index.pop((target, shard), None)

    def load(self, key: EntryKey, *, stamp: tuple[int, int] | None = None) -> Loaded:
        """Read, judge, verify and decode one entry.

        ``stamp``: the folder's :meth:`stamp`, when the caller took it just now (and read the part's entries with
        it, see :meth:`part_calls`); taken here when ``None``.

        Raises:
            FileNotFoundError: the entry was never committed.
            EntryRefused: the entry holds pickled data and ``allow_pickle`` is off.
            EntryInvalid: the manifest is unreadable, belongs to another entry or lists foreign files, a
                payload file is missing, not a regular file, truncated or corrupt, or the tree is unreadable.
            UnsafePath: a folder on the way is a symlink or a file.
            codec.CodecError: the payload cannot be decoded here (e.g. a class this process does not
                approve, see :mod:`skipweave.store.codec`).
        """
        from skipweave.store import tensorfile  # torch: imported on first use, not by the CLI

        folder, stamp = self._checked_folder(key.step, key.target, stamp)
        with self._lock:
            listed = self._groups.get((key.step, key.target, key.shard))
        if listed is not None and stamp is not None and listed[0] == stamp and key.call not in listed[2]:
            # the folder is as it was listed, and held no manifest of the call's own: served from its group
            return self._load_grouped(key, folder, listed[1])
        where = manifest_path(self.dump_dir, key)
        try:
            manifest = read_manifest(where)
        except FileNotFoundError:
            return self._load_grouped(key, folder)
        judged = check_manifest(manifest, where, key, allow_pickle=self.allow_pickle)
        # Each file is read once, into memory, and verified there: what is checked is what is served.
        tree_bytes = _read_verified(os.path.join(folder, judged.tree["name"]), judged.tree)
        label = f"skipweave: replaying {self.role} step {key.step}"
        tensors = tensorfile.read(os.path.join(folder, judged.tensors["name"]), size=int(judged.tensors["bytes"]),
                                  checksum=str(judged.tensors["checksum"]), desc=label)
        return self._decode(where, judged.manifest, tree_bytes, tensors, judged.tree["bytes"] + judged.tensors["bytes"])

    def _decode(self, where: str, manifest: dict[str, Any], tree_bytes: bytes, tensors: dict[str, Any],
                size: int) -> Loaded:
        """Decode a verified entry's tree and tensors into what :meth:`load` returns."""
        from skipweave.store import codec

        try:
            tree = jsonio.loads(tree_bytes)
        except (ValueError, RecursionError) as exc:
            raise EntryInvalid(f"payload of {where} is unreadable: {exc}") from exc
        payload = codec.decode(tree, tensors, allow_pickle=self.allow_pickle, trusted=self.trusted_classes)
        if not isinstance(payload, dict) or "result" not in payload:
            raise EntryInvalid(f"payload of {where} holds no recorded result")
        rng = payload.get("rng")
        effects = payload.get("effects")
        appended = payload.get("appended")
        return Loaded(manifest, payload["result"], rng if isinstance(rng, dict) else None, size,
                      effects if isinstance(effects, dict) else None,
                      appended if isinstance(appended, dict) else None)

    def _packs_of(self, step: int, target: str, shard: str) -> tuple[tuple[int, int, str], ...]:
        """The group files of a part as ``(first, last, name)``, listed again only when the folder changed."""
        stamp = folder_stamp(self._folder_path(step, target))
        with self._lock:
            seen = self._groups.get((step, target, shard))
        if seen is not None and stamp is not None and seen[0] == stamp:
            return seen[1]
        self.part_info(step, target, shard)
        with self._lock:
            return self._groups.get((step, target, shard), (None, ()))[1]

    def _covering(self, key: EntryKey, groups: tuple[tuple[int, int, str], ...] | None = None
                  ) -> tuple[int, int, str] | None:
        """The one group file holding ``key``'s call, ``None`` when none does (among ``groups`` when given: the part's
        group files as listed, see :meth:`_packs_of`).

        Raises:
            EntryInvalid: two group files claim the call (no writer makes that): neither serves it.
        """
        if groups is None:
            groups = self._packs_of(key.step, key.target, key.shard)
        found = [g for g in groups if g[0] <= key.call <= g[1]]
        if len(found) > 1:
            raise EntryInvalid(f"call {key.call} of {key.target} step {key.step} shard {key.shard} is claimed by "
                               f"{len(found)} group files ({', '.join(g[2] for g in found)}): none is served")
        return found[0] if found else None

    def _open_pack(self, key: EntryKey, first: int, last: int, name: str, *, folder: str | None = None,
                   data: bool = False) -> tuple[JudgedPack, _Split | None]:
        """Read and judge a group file (and, with ``data``, read and verify its data file), kept in memory while
        the file is unchanged (same inode, modification time and size).

        Raises:
            FileNotFoundError: the group file is gone.
            EntryInvalid: the group file or its data file is unsound (see :func:`~skipweave.store.pack.check_pack`).
            UnsafePath: a folder on the way is a symlink or a file.
        """

        folder = folder or self.folder(key.step, key.target)
        path = os.path.join(folder, name)
        st = os.lstat(path)
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._pack_cache.get(path)
            if cached is not None and cached[0] == ident and (cached[2] is not None or not data):
                self._pack_cache.move_to_end(path)
                return cached[1], cached[2]
        judged = cached[1] if cached is not None and cached[0] == ident else check_pack(read_pack(path), path, key,
                                                                                          first, last)
        tensors = None
        if data:
            tensors = read_data(folder, judged, first, last)
        with self._lock:
            self._pack_cache[path] = (ident, judged, tensors)
            self._pack_cache.move_to_end(path)
            held = sum(int(c[1].data["bytes"]) for c in self._pack_cache.values() if c[2] is not None)
            while held > PACK_CACHE_BYTES and len(self._pack_cache) > 1:
                _, dropped = self._pack_cache.popitem(last=False)
                held -= int(dropped[1].data["bytes"]) if dropped[2] is not None else 0
        return judged, tensors

    def _load_grouped(self, key: EntryKey, folder: str,
                      groups: tuple[tuple[int, int, str], ...] | None = None) -> Loaded:
        """:meth:`load` of an entry that has no manifest of its own: from the group file holding its call (among
        ``groups`` when given, see :meth:`_covering`)."""
        group = self._covering(key, groups)
        if group is None:
            raise FileNotFoundError(manifest_path(self.dump_dir, key))
        first, last, name = group
        from skipweave.store.tensorfile import tensor_at

        judged, opened = self._open_pack(key, first, last, name, folder=folder, data=True)
        manifest = entry_of(judged, key, allow_pickle=self.allow_pickle)
        assert opened is not None
        section, by_call = opened
        if key.call not in by_call:
            raise EntryInvalid(f"group {judged.path} holds no tree for call {key.call}")
        tree_span, spans = by_call[key.call]
        tree_bytes = bytes(section[tree_span[0]:tree_span[1]])
        own = {n: tensor_at(section, span) for n, span in spans.items()}  # owned copies: the group stays as read
        size = len(tree_bytes) + sum(t.numel() * t.element_size() for t in own.values())
        return self._decode(f"{judged.path} (call {key.call})", manifest, tree_bytes, own, size)

    # ------------------------------------------------------------------ writing
    def prepare_part(self, step: int, target: str, shard: str) -> None:
        """Before a call of a part: close this shard's other open parts that are idle, set aside leftovers.

        A part holding calls from an interrupted run (not closed, fewer calls than expected, not
        written by this process) is moved to ``_set_aside/`` with a log line, once per process.
        """
        part = (step, target, shard)
        with self._lock:
            for other in [p for p in self._open if p[0] != step and p[1] == target and p[2] == shard]:
                if self._running.get(other, 0):
                    self._left.add(other)  # still being recorded (concurrent steps): closed when its calls end
                else:
                    self.close_part(*other)
            if part in self._writing or part in self._checked:
                return
            self._checked.add(part)
        info = self.part_info(step, target, shard)
        if not info.calls:
            with self._lock:
                self._fresh.add(part)
        elif not self.is_complete(step, target, shard):
            me, started = this_writer(), started_unix()

            def taken_up() -> bool:  # another writer of this run records into it: not an interrupted run's leftover
                return any(is_concurrent_other(r, me, started) for r in self.part_calls(step, target, shard))

            if taken_up():
                return
            if self.set_aside(step, target, shard, reason=(
                f"{len(info.calls)} of {self.expected_calls(target, shard)} calls committed and never closed"
            ), unless=lambda: self.is_complete(step, target, shard) or taken_up()) is not None:
                with self._lock:
                    self._fresh.add(part)

    def fresh(self, step: int, target: str, shard: str) -> bool:
        """True when the part held nothing when this process first prepared a call of it (or was set aside by
        it): its entries are this process's own recordings or those of writers running alongside it, none of
        which serves this process, so a call of it need not read the part to know it is a miss."""
        with self._lock:
            return (step, target, shard) in self._fresh

    def _aside(self, name: str) -> str:
        """Create and return ``{role}/_set_aside/{name}``, refusing a symlinked ``_set_aside``."""
        return inside(self.dump_dir, self.namespace, self.role, SET_ASIDE_DIR, name, create=True)

    def set_aside(self, step: int, target: str, shard: str, *, reason: str,
                  unless: Callable[[], bool] | None = None) -> str | None:
        """Move a part's files to ``_set_aside/{step}-{target}-{shard}-{stamp}/``; return that folder.

        ``unless`` is asked under the part's lock, which every writer of the part holds while it commits: when it
        says True (the part was completed or taken up by another writer since the caller looked), nothing is moved
        and ``None`` is returned.

        Raises:
            UnsafePath: the part's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
        """
        self.key(step, target, shard, 0)
        with self._lock:
            self._closed.pop((step, target, shard), None)
        self._index_drop(target, shard)
        folder = self.folder(step, target)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
        with part_lock(folder, shard):
            if unless is not None and unless():
                return None
            try:
                names = [n for n in os.listdir(folder) if n.startswith(shard + "-") or n == shard + PART_SUFFIX]
            except FileNotFoundError:
                return None
            if not names:
                return None
            dest = self._aside(f"{step}-{target}-{shard}-{stamp}")
            for n in names:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(os.path.join(folder, n), os.path.join(dest, n))
            fsync_dir(folder)
        self._touch()
        logger.warning(
            "skipweave: role %s target %s step %d shard %s was left incomplete by an interrupted run (%s); "
            "set aside to %s and recording it afresh",
            self.role, target, step, shard, reason, dest,
        )
        return dest

    def record(
        self,
        key: EntryKey,
        result: Any,
        *,
        target_path: str,
        fingerprint: str,
        rng_state: dict[str, Any] | None,
        seconds: float,
        replace: bool = False,
        concurrent: bool = False,
        effects: dict[str, Any] | None = None,
    ) -> int:
        """Commit one entry atomically into the slot ``key`` names.

        The commit is the rename of the manifest into place. Everything before it is written under
        temporary or fresh names through the open target folder, so a failure (full disk, a folder moved
        away) removes every file it made, wherever the folder went. Bookkeeping after the commit (the
        folder's fsync, removing a replaced entry's files, the part state) that fails is logged as a
        WARNING and does not undo the commit.

        Args:
            key: the entry.
            result: the live result to store.
            target_path: the target's configured path (kept in the manifest).
            fingerprint: input fingerprint of the call.
            rng_state: RNG state after the real call (:func:`skipweave.store.rng.capture_rng_state`).
            seconds: wall time of the real call, in seconds.
            replace: overwrite an existing committed entry (corrupt entry, fingerprint regenerate).
            concurrent: another thread of this process called the target at this step meanwhile (kept in the
                manifest: such a part is matched by inputs only, see :mod:`skipweave.policy.matching`).
            effects: values of the target's declared side effects after the real call, by expression.

        Returns:
            Bytes written, or 0 when another writer had already committed the entry (it is kept).

        Raises:
            codec.CodecError: the result cannot be encoded (nothing is written).
            UnsafePath: a folder on the way is a symlink or a file (nothing is written).
            StoreMoved: the target folder was moved or removed while the entry was written (nothing is
                committed, no temporary file is left).
            OSError: the disk refused a write (no partial entry is left; an older entry is intact).
        """
        meta = EntryMeta(target_path, fingerprint, seconds, replace, concurrent)
        nbytes, _ = self.commit(key, self.stage(result, rng_state=rng_state, effects=effects), meta)
        return nbytes

    def record_own(
        self,
        key: EntryKey,
        result: Any,
        *,
        target_path: str,
        fingerprint: str,
        rng_state: dict[str, Any] | None,
        seconds: float,
        replace: bool = False,
        concurrent: bool = False,
        effects: dict[str, Any] | None = None,
    ) -> tuple[int, EntryKey]:
        """Like :meth:`record`, but a slot another writer already filled is kept and the entry goes to the next
        free call index of its part: every writer's result is recorded, none is dropped.

        Returns:
            Bytes written and the key the entry was committed under.

        Raises:
            the same as :meth:`record`.
        """
        meta = EntryMeta(target_path, fingerprint, seconds, replace, concurrent, displace=True)
        return self.commit(key, self.stage(result, rng_state=rng_state, effects=effects), meta)

    def stage(self, result: Any, *, rng_state: dict[str, Any] | None,
              effects: dict[str, Any] | None = None, appended: dict[str, Any] | None = None) -> Staged:
        """Encode a result (with its RNG state and effects) into what :meth:`commit` writes.

        Args:
            result: the live result.
            rng_state: RNG state after the real call (:func:`skipweave.store.rng.capture_rng_state`).
            effects: values of the target's declared side effects after the real call, by expression.
            appended: declared effects that are lists the real call only appended to, by expression:
                ``{"n_before": int, "tail": list}`` (see :attr:`Loaded.appended`); stored apart from ``effects``
                so no recorded value is ever taken for one.

        Returns:
            The staged entry; its tensors may share memory with ``result`` (see :meth:`Staged.owned`), its tree
            is serialised already (the codec's tree may hold the host's objects).

        Raises:
            codec.CodecError: the result cannot be encoded.
        """
        from skipweave.store import codec, tensorfile

        payload: dict[str, Any] = {"result": result, "rng": rng_state}
        if effects is not None:
            payload["effects"] = effects
        if appended:
            payload["appended"] = appended
        encoded = codec.encode(payload, allow_pickle=self.allow_pickle, trusted=self.trusted_classes)
        tree = jsonio.dumps(encoded.tree)  # now: the tree may hold host objects
        return Staged(tree, encoded.tensors, encoded.pickled, len(tree) + tensorfile.file_size(encoded.tensors))

    def commit(self, key: EntryKey, staged: Staged, meta: EntryMeta) -> tuple[int, EntryKey]:
        """Write and commit one staged entry (see :meth:`record`; ``meta.displace`` as in :meth:`record_own`).

        Returns:
            Bytes written (0 when another writer's entry was kept) and the key committed under.

        Raises:
            the same as :meth:`record`, but for the codec's errors (already raised by :meth:`stage`).
        """
        self._watch_root()
        folder = self.folder(key.step, key.target, create=True)
        while True:
            with part_lock(folder, key.shard):
                dir_fd = open_dir(folder)
                try:
                    written = self._write(dir_fd, folder, key, staged, meta, sync=True)
                    outcome = None if written is None else self._publish(dir_fd, folder, written)
                finally:
                    os.close(dir_fd)
            if outcome is not None or not meta.displace:
                break
            taken = self.part_info(key.step, key.target, key.shard).calls
            key = dataclasses.replace(key, call=max([key.call, *taken]) + 1)  # the next free slot
        self._committed([key])
        if outcome is None:
            return 0, key
        nbytes, leftovers = outcome
        self._bookkeep([key], {key: leftovers})
        return nbytes, key

    def commit_many(self, items: list[tuple[EntryKey, Staged, EntryMeta]]
                    ) -> list[tuple[int, EntryKey] | BaseException | None]:
        """Commit several staged entries with one group sync: every payload and manifest is written unsynced,
        then flushed to disk at once (:func:`~skipweave.store.atomic.sync_files`), and only then is each
        manifest renamed into place (each entry's commit). What one entry costs falls from three fsyncs to a
        share of one; the commit rule is :meth:`commit`'s.

        Keys must name distinct entries. The parts' locks are taken in sorted order and held until the commits.

        Returns:
            Per item, in order: ``(bytes, key)`` as :meth:`commit` returns; the exception that item failed with
            (nothing of it is left); or ``None`` when its slot holds another writer's entry and the item is to be
            displaced (:meth:`commit` with ``displace``).
        """
        self._watch_root()
        results: list[tuple[int, EntryKey] | BaseException | None] = [None] * len(items)
        order = sorted(range(len(items)), key=lambda i: (items[i][0].step, items[i][0].target, items[i][0].stem))
        committed: list[EntryKey] = []
        leftovers: dict[EntryKey, list[str]] = {}
        fds: dict[str, int] = {}
        folders: dict[tuple[int, str], str] = {}  # (step, target) -> its checked folder, once per group
        held: set[tuple[str, str]] = set()  # (folder, shard) of the part locks taken
        with contextlib.ExitStack() as locks:
            try:
                written: list[tuple[list[int], int, str, _Written]] = []
                parts: dict[tuple[str, str], list[int]] = {}  # (folder, shard) -> its items, in sorted order
                for i in order:
                    key = items[i][0]
                    try:
                        folder = folders.get((key.step, key.target)) or self.folder(key.step, key.target,
                                                                                     create=True)
                        folders[(key.step, key.target)] = folder
                        if (folder, key.shard) not in held:  # each part's lock once, in sorted order
                            locks.enter_context(part_lock(folder, key.shard))
                            held.add((folder, key.shard))
                        if folder not in fds:
                            fds[folder] = open_dir(folder)
                    except Exception as exc:
                        results[i] = exc
                        continue
                    parts.setdefault((folder, key.shard), []).append(i)
                for (folder, _shard), part_items in parts.items():
                    groups, singles = self._plan_groups([items[i] for i in part_items])
                    for group in groups:
                        run = [part_items[j] for j in group]
                        try:
                            grouped = self._write_group(fds[folder], folder, [items[i] for i in run], sync=False)
                        except Exception as exc:
                            for i in run:
                                results[i] = exc
                            continue
                        written.append((run, fds[folder], folder, grouped))
                    for i in (part_items[j] for j in singles):
                        key, staged, meta = items[i]
                        try:
                            w = self._write(fds[folder], folder, key, staged, meta, sync=False)
                        except Exception as exc:
                            results[i] = exc
                            continue
                        if w is not None:
                            written.append(([i], fds[folder], folder, w))
                        elif not meta.displace:
                            results[i] = (0, key)
                try:
                    sync_files([(fd, name) for _, fd, _, w in written for name in w.made])
                except OSError as exc:
                    for run, fd, _, w in written:
                        _remove(fd, w.made)
                        for i in run:
                            results[i] = exc
                    written = []
                for run, fd, folder, w in written:
                    try:
                        nbytes, left = self._publish(fd, folder, w, sync=False)
                    except Exception as exc:
                        for i in run:
                            results[i] = exc
                        continue
                    for i in run:
                        key = items[i][0]
                        results[i] = (items[i][1].nbytes if w.group is not None else nbytes, key)
                        committed.append(key)
                        leftovers[key] = list(left)
                for folder, fd in fds.items():  # the renames of every entry of the folder, flushed at once
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        for key in committed:
                            if folders[(key.step, key.target)] == folder:
                                leftovers[key].append(f"the folder's fsync ({type(exc).__name__}: {exc})")
            finally:
                for fd in fds.values():
                    os.close(fd)
        self._committed([r[1] for r in results if isinstance(r, tuple)])
        self._bookkeep(committed, leftovers)
        return results

    def _plan_groups(self, items: list[tuple[EntryKey, Staged, EntryMeta]]) -> tuple[list[list[int]], list[int]]:
        """Split one part's items (the caller holds its lock) into groups of at least two small entries with
        contiguous free call indices (each within :data:`~skipweave.store.pack.DATA_MAX_BYTES` and
        :data:`~skipweave.store.layout.MAX_PACK_CALLS`) and the rest, written as single entries. Returns the
        groups and the singles as indices into ``items``."""
        key = items[0][0]
        taken = set(self.part_info(key.step, key.target, key.shard).calls) if len(items) > 1 else set()
        small = sorted((i for i, (k, staged, meta) in enumerate(items)
                        if k.call not in taken and not meta.replace and staged.nbytes <= ENTRY_MAX_BYTES),
                       key=lambda i: items[i][0].call)
        groups: list[list[int]] = []
        run: list[int] = []
        size = 0
        for i in small:
            k, staged, _ = items[i]
            if run and (k.call != items[run[-1]][0].call + 1 or len(run) >= MAX_PACK_CALLS
                        or size + staged.nbytes > DATA_MAX_BYTES):
                groups.append(run)
                run, size = [], 0
            run.append(i)
            size += staged.nbytes
        groups.append(run)
        groups = [g for g in groups if len(g) > 1]
        grouped = {i for g in groups for i in g}
        return groups, [i for i in range(len(items)) if i not in grouped]

    def _committed(self, kept: list[EntryKey]) -> None:
        """Count the parts of entries now committed (or another writer's kept) as this process's, servable and
        open."""
        with self._lock:  # only now: a failed write leaves no part of this process's to close at exit
            for key in kept:
                self._writing.add((key.step, key.target, key.shard))
                self._open.add((key.step, key.target, key.shard))
        for key in kept:
            self._index_add(key.step, key.target, key.shard)  # a part this process writes is servable

    def _bookkeep(self, committed: list[EntryKey], leftovers: dict[EntryKey, list[str]]) -> None:
        """After commits: each part's state once (one role stamp bump each), and a WARNING per entry whose
        bookkeeping failed (committed and servable all the same)."""
        parts: dict[tuple[int, str, str], EntryKey] = {}
        for key in committed:
            parts.setdefault((key.step, key.target, key.shard), key)
        for key in parts.values():
            try:
                if self._part_state(key) == "open":  # already open (a group commit per wake): no file rewritten
                    self._touch()
                else:
                    self._write_part(key, "open")
            except OSError as exc:
                leftovers.setdefault(key, []).append(f"its part state ({type(exc).__name__}: {exc})")
        for key, left in leftovers.items():
            if left:
                logger.warning("skipweave: recorded %s (committed and servable), but could not update %s",
                               key, "; ".join(left))

    def _write(self, dir_fd: int, folder: str, key: EntryKey, staged: Staged, meta: EntryMeta, *,
               sync: bool) -> _Written | None:
        """Write one entry's payload and manifest under temporary names in the folder open as ``dir_fd`` (the
        caller holds the part's lock); each file is fsynced when ``sync``, else the caller syncs them.

        Returns ``None`` when a valid entry is already committed there (and ``meta.replace`` is off). A failure
        removes every file it made.
        """
        final_manifest = manifest_path(self.dump_dir, key)
        manifest_name = os.path.basename(final_manifest)
        old: dict[str, Any] | None = None
        if os.path.lexists(final_manifest):
            try:
                old = read_manifest(final_manifest)
                if not meta.replace:
                    check_manifest(old, final_manifest, key, allow_pickle=True)
                    verify_payload(folder, old, checksums=False)
                    return None
            except (EntryInvalid, FileNotFoundError):
                old = None
        elif not meta.replace and self._grouped_sound(folder, key):
            return None
        token = uuid.uuid4().hex[:8]
        tree_name = f"{key.stem}.{token}.tree.json"
        made: list[str] = []  # names in the folder this write created, removed if it does not commit
        try:
            tmp_tree = _tmp_in(folder, tree_name)
            made.append(tmp_tree)
            _write_new(dir_fd, tmp_tree, staged.tree, sync=sync)
            desc = None if meta.background else f"skipweave: recording {self.role} step {key.step}"
            tmp_tensors, tensor_name, tensor_bytes, tensor_sum = self._write_tensors(
                dir_fd, folder, f"{key.stem}.{token}.tensors.safetensors", staged.tensors, made, desc=desc, sync=sync)
            files = [
                PayloadFile(tree_name, len(staged.tree), bytes_checksum(staged.tree)),
                PayloadFile(tensor_name, tensor_bytes, tensor_sum),
            ]
            manifest = build_manifest(
                role=self.role, target=key.target, target_path=meta.target_path, step=key.step, call=key.call,
                shard=key.shard, fingerprint=meta.fingerprint, files=files, pickled=staged.pickled,
                seconds=meta.seconds, concurrent=meta.concurrent,
            )
            tmp_manifest = _tmp_in(folder, manifest_name)
            made.append(tmp_manifest)
            _write_new(dir_fd, tmp_manifest, json.dumps(manifest, indent=1).encode(), sync=sync)
        except BaseException:
            _remove(dir_fd, made)
            raise
        return _Written(key, made, [(tmp_tree, tree_name), (tmp_tensors, tensor_name)], (tmp_manifest, manifest_name),
                        files, old)

    def _write_tensors(self, dir_fd: int, folder: str, plain_name: str, tensors: dict[str, Any], made: list[str], *,
                       desc: str | None, sync: bool) -> tuple[str, str, int, str]:
        """Write a tensor file (compressed with ``compress``, plainly when it compresses too well for a reader)
        under a temporary name, appended to ``made``; return ``(temporary, final name, bytes, checksum)``."""
        from skipweave.store import tensorfile

        compress = self.compress
        while True:  # safetensors bytes streamed from the tensors' memory, checksummed on that memory
            final = plain_name + ("" if compress is None else tensorfile.COMPRESSED_SUFFIX)
            tmp = _tmp_in(folder, final)
            made.append(tmp)
            try:
                nbytes, checksum = tensorfile.write(tmp, tensors, desc=desc, dir_fd=dir_fd, sync=sync,
                                                    compress=compress)
                return tmp, final, nbytes, checksum
            except tensorfile.TooCompressible:  # (all zeros, say) a reader would refuse it: plainly instead
                _remove(dir_fd, [made.pop()])
                compress = None

    def _grouped_sound(self, folder: str, key: EntryKey) -> bool:
        """True when a group file holds ``key``'s call and is sound (its data file checked by size): the slot is
        taken. A call claimed by two group files, or by an unsound one, counts as free (its own manifest, written
        next, is what serves it)."""
        try:
            group = self._covering(key)
            if group is None:
                return False
            judged, _ = self._open_pack(key, *group)
            verify_payload(folder, {"payload": [judged.data]}, checksums=False)
        except (EntryInvalid, OSError):
            return False
        return True

    def _write_group(self, dir_fd: int, folder: str, items: list[tuple[EntryKey, Staged, EntryMeta]], *,
                     sync: bool) -> _Written:
        """Write the entries of calls ``first..last`` of one part (contiguous, in order, slots free) as one group: its
        data file and its group file, under temporary names (see :mod:`skipweave.store.pack`). A failure removes
        every file it made."""
        keys = [k for k, _, _ in items]
        first, last = keys[0].call, keys[-1].call
        stem = pack_stem(keys[0].shard, first, last)
        made: list[str] = []
        try:
            tensors = pack_tensors([(k.call, staged.tree, staged.tensors) for k, staged, _ in items])
            tmp_data, data_name, data_bytes, data_sum = self._write_tensors(
                dir_fd, folder, f"{stem}.{uuid.uuid4().hex[:8]}.pack.safetensors", tensors, made, desc=None, sync=sync)
            data = PayloadFile(data_name, data_bytes, data_sum)
            writer = this_writer().as_manifest()  # once for the group: one process wrote every entry of it
            manifests = [build_manifest(
                role=self.role, target=k.target, target_path=meta.target_path, step=k.step, call=k.call,
                shard=k.shard, fingerprint=meta.fingerprint, files=[data], pickled=staged.pickled,
                seconds=meta.seconds, concurrent=meta.concurrent, writer=writer,
            ) for k, staged, meta in items]
            group = build_pack(role=self.role, target=keys[0].target, step=keys[0].step, shard=keys[0].shard,
                               first=first, last=last, data=data, entries=manifests)
            tmp_group = _tmp_in(folder, stem + PACK_SUFFIX)
            made.append(tmp_group)
            _write_new(dir_fd, tmp_group, jsonio.dumps(group), sync=sync)
        except BaseException:
            _remove(dir_fd, made)
            raise
        return _Written(keys[0], made, [(tmp_data, data_name)], (tmp_group, stem + PACK_SUFFIX), [data], None,
                        group=keys)

    def _publish(self, dir_fd: int, folder: str, w: _Written, *, sync: bool = True) -> tuple[int, list[str]]:
        """Rename a written entry's payload, then its manifest (the commit), into place; fsync the folder (unless
        ``sync`` is off: the caller fsyncs it once for several entries) and remove a replaced entry's payload.
        Returns the bytes written and what bookkeeping failed.

        Raises:
            StoreMoved: the folder was moved or removed meanwhile (every file made is removed).
            OSError: a rename failed (every file made is removed).
        """
        made = list(w.made)
        try:
            for tmp, final in w.payload:
                os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                made[made.index(tmp)] = final
            if not same_folder(folder, dir_fd):
                raise StoreMoved(
                    f"{folder} was moved or removed while {w.key} was being written; nothing was recorded "
                    "and no temporary file was left"
                )
            os.replace(*w.manifest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the commit
        except BaseException:
            _remove(dir_fd, made)
            raise
        leftovers: list[str] = []
        if sync:
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                leftovers.append(f"the folder's fsync ({type(exc).__name__}: {exc})")
        if w.old is not None:  # the replaced entry's payload is no longer referenced
            names = {final for _, final in w.payload}
            for item in w.old.get("payload", []):
                old_name = item.get("name") if isinstance(item, dict) else None
                parsed = parse_payload_name(old_name) if isinstance(old_name, str) else None
                if parsed is not None and parsed[0] == w.key.stem and old_name not in names:
                    with contextlib.suppress(OSError):
                        os.unlink(str(old_name), dir_fd=dir_fd)
        return sum(f.bytes for f in w.files), leftovers

    def _watch_root(self) -> None:
        """Make the dump dir when missing; WARN when it vanished or was replaced since this store last saw it."""
        with self._lock:  # one look at a time: a thread must not take the folder another just made for a new one
            ident = _identity(self.dump_dir)
            if ident is None:
                os.makedirs(self.dump_dir, exist_ok=True)
                new = _identity(self.dump_dir)
            else:
                new = ident
            seen, self._root_id = self._root_id, new
        if seen is not None and (ident is None or seen != new):  # removed (a new folder may reuse the inode)
            logger.warning(
                "skipweave: role %s: the dump dir %s was %s since this run last wrote to it; what was recorded "
                "there before is gone from it, new recordings go to the new folder",
                self.role, self.dump_dir, "removed" if ident is None else "replaced by another folder",
            )

    def discard(self, key: EntryKey, *, reason: str) -> None:
        """Move an unusable entry's manifest and payload to ``_set_aside/`` so it is never served again.

        An entry without a manifest of its own is served from a group file: the group files claiming its call go,
        with their data files (the group's other calls are then misses, recorded afresh). Logs one WARNING naming
        the entry, the reason and where it went.

        Raises:
            UnsafePath: the entry's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
            OSError: the files could not be moved (e.g. a read-only dump dir).
        """
        with self._lock:
            self._closed.pop((key.step, key.target, key.shard), None)
        self._index_drop(key.target, key.shard)
        folder = self.folder(key.step, key.target)
        with part_lock(folder, key.shard):
            dest = self._aside(f"{key.step}-{key.target}-{key.stem}-unusable-{uuid.uuid4().hex[:6]}")
            names = os.listdir(folder)
            stems = [key.stem]
            if key.stem + MANIFEST_SUFFIX not in names:
                stems += [pack_stem(key.shard, first, last) for first, last, _ in calls_in(names, key.shard)[1]
                          if first <= key.call <= last]
            for n in names:
                if n.startswith(tuple(stem + "." for stem in stems)) and not n.startswith(TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(os.path.join(folder, n), os.path.join(dest, n))
        self._touch()
        logger.warning("skipweave: entry %s not served (%s); moved to %s, running live and recording it afresh",
                       key, reason, dest)

    def call_started(self, step: int, target: str, shard: str) -> int:
        """A real call that will be recorded into this part began (keeps the part open while it runs, and while
        its entry is written in the background). Returns its ticket, for :meth:`call_ended`."""
        part = (step, target, shard)
        with self._lock:
            self._running[part] = self._running.get(part, 0) + 1
            self._tickets += 1
            return self._tickets

    def call_ended(self, step: int, target: str, shard: str, *, failed: bool = False, ticket: int = 0) -> None:
        """That call ended (its entry committed, when written in the background); the part closes now if a later
        call (or :meth:`close_all`) passed it meanwhile.

        Args:
            failed: the real call raised (anything, ``KeyboardInterrupt`` and ``SystemExit`` included): the
                part is not marked closed until a call of it that started later succeeds (an earlier call whose
                entry is committed after the failure does not count).
            ticket: what :meth:`call_started` returned for the call (0: unknown, counted as the latest).
        """
        part = (step, target, shard)
        with self._lock:
            if failed:
                self._failed[part] = max(self._failed.get(part, 0), ticket or self._tickets)
            elif not ticket or ticket > self._failed.get(part, 0):
                self._failed.pop(part, None)
            left = self._running.get(part, 0) - 1
            if left > 0:
                self._running[part] = left
                return
            self._running.pop(part, None)
            if part in self._open and (part in self._left or self._draining):
                self.close_part(*part)

    def close_part(self, step: int, target: str, shard: str) -> None:
        """Mark a part this process recorded as complete (the process moved past its step or stops).

        Left open instead (the next run judges it by its calls) when a call of it failed and none succeeded
        since, or when it holds fewer calls than ``calls_per_step``.
        """
        part = (step, target, shard)
        with self._lock:
            self._open.discard(part)
            self._left.discard(part)
            self._writing.discard(part)
            failed = part in self._failed
        if failed:
            logger.info("skipweave: role %s target %s step %d shard %s left open: a call of it failed",
                        self.role, target, step, shard)
            return
        if self.calls_per_step is not None and self.part_info(step, target, shard).contiguous < self.calls_per_step:
            return
        with contextlib.suppress(OSError):
            self._write_part(self.key(step, target, shard, 0), "closed")

    def close_all(self) -> None:
        """Close every part this process left open, of any number of steps (at unweave and interpreter exit).

        A part with a call still running (a daemon thread, a task outliving an unweave) is not closed now: it
        closes when that call ends, or stays open if the process ends first.
        """
        with self._lock:
            self._draining = True
            parts = sorted(p for p in self._open if not self._running.get(p, 0))
        for part in parts:
            self.close_part(*part)

    def _part_state(self, key: EntryKey) -> str | None:
        """The state ``{shard}.part.json`` gives (``open``, ``closed``), ``None`` when it is missing or unreadable."""
        with contextlib.suppress(OSError, ValueError, RecursionError, AttributeError):
            with open(open_regular(part_path(self.dump_dir, key)), encoding="utf-8") as fh:
                state = json.loads(fh.read(1 << 16)).get("state")
                return state if isinstance(state, str) else None
        return None

    def _write_part(self, key: EntryKey, state: str) -> None:
        folder = self.folder(key.step, key.target)
        if not os.path.isdir(folder):  # the dump dir went away: never recreate folders just for the state
            raise FileNotFoundError(f"{folder} no longer exists")
        info = self.part_info(key.step, key.target, key.shard)
        data = {"state": state, "calls": info.contiguous, "updated_unix": time.time(), "pid": os.getpid()}
        write_bytes_atomic(part_path(self.dump_dir, key), json.dumps(data).encode())
        self._touch()


_STORES: weakref.WeakSet[StepStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def part_lock(folder: str, shard: str, *, timeout: float = LOCK_TIMEOUT_S) -> filelock.FileLock:
    """The file lock (``.{shard}.part.lock`` in the part's folder, kept) every writer of a part holds while it commits
    an entry of the part, sets the part aside or removes anything of it: the store's writers, ``record`` and the
    background writer alike, and ``skipweave gc``. One lock per part, not per entry: a group commit of many small
    entries takes one lock, and creates no lock file per entry.

    Args:
        folder: the part's folder (its step and target).
        shard: the part's shard, e.g. ``r0``.
        timeout: seconds to wait for it before ``filelock.Timeout``.
    """
    return filelock.FileLock(lock_path(folder, f".{shard}.part.lock"), timeout=timeout)


def calls_in(names: Collection[str], shard: str) -> tuple[set[int], tuple[tuple[int, int, str], ...]]:
    """The calls of ``shard`` with a manifest of their own among a folder's names, and its group files as
    ``(first, last, name)``."""
    own: set[int] = set()
    groups: list[tuple[int, int, str]] = []
    for n in names:
        if n.endswith(MANIFEST_SUFFIX):
            if (parsed := parse_manifest_name(n)) is not None and parsed[0] == shard:
                own.add(parsed[1])
        elif n.endswith(PACK_SUFFIX) and (grouped := parse_pack_name(n)) is not None and grouped[0] == shard:
            groups.append((grouped[1], grouped[2], n))
    return own, tuple(sorted(groups))


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _tmp_in(folder: str, final_name: str) -> str:
    """A fresh temporary name (no folder) for a file that becomes ``final_name``."""
    return os.path.basename(tmp_name(folder, final_name))


def _remove(dir_fd: int, names: list[str]) -> None:
    """Remove files this write made in the folder open as ``dir_fd`` (those already gone are skipped)."""
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)


def _write_new(dir_fd: int, name: str, data: bytes, *, sync: bool = True) -> None:
    """Create ``name`` in the folder open as ``dir_fd`` (never an existing file or a symlink), write, fsync
    (unless ``sync`` is off: the caller syncs it)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read_verified(path: str, item: dict[str, Any]) -> bytes:
    """Read a small payload file whole and check it against its manifest item (size, checksum)."""
    try:
        with open(open_regular(path), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size != item.get("bytes"):
                raise EntryInvalid(f"payload {path} has {size} bytes, manifest says {item.get('bytes')}")
            data = fh.read()
    except UnsafePath as exc:
        raise EntryInvalid(f"payload {path} is not a file skipweave wrote: {exc}") from None
    except OSError:
        raise EntryInvalid(f"payload {path} is missing") from None
    if len(data) != size:
        raise EntryInvalid(f"payload {path} changed size while being read")
    if bytes_checksum(data) != item.get("checksum"):
        raise EntryInvalid(f"payload {path} does not match its checksum {item.get('checksum')}")
    return data


__all__ = ["EntryInvalid", "EntryMeta", "Loaded", "Staged", "MANIFEST_SUFFIX", "PartInfo", "StepStore", "StoreMoved",
           "calls_in", "part_lock"]
