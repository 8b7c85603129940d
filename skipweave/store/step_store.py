"""The step store of one role: record entries atomically, serve only complete and valid ones.

Guarantees (each has a test):

- A reader never sees a partial entry: payload files are written under temporary names, fsynced
  and renamed into place, the manifest last. Payload names carry a fresh token, so replacing an
  entry never touches the files an older manifest points at.
- An entry whose size or checksum does not match its manifest is never served.
- Concurrent writers of one entry (threads or processes) end with exactly one committed copy:
  writers serialise on a file lock (``filelock``) and the later one keeps the committed entry.
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
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import filelock
import safetensors  # noqa: F401 - its version goes into every manifest (library_versions)

from skipweave.store.atomic import fsync_dir, tmp_name, write_bytes_atomic
from skipweave.store.layout import (
    MANIFEST_SUFFIX,
    PART_SUFFIX,
    SET_ASIDE_DIR,
    TMP_PREFIX,
    EntryKey,
    changes_stamp,
    folder_stamp,
    list_steps,
    manifest_path,
    parse_manifest_name,
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
from skipweave.store.paths import UnsafePath, check_name, inside, lock_path, open_dir, open_regular, same_folder
from skipweave.store.writers import Recorded, is_concurrent_other, recorded_of, started_unix, this_writer

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600.0
"""Seconds a writer waits for another writer of the same entry before giving up."""

INDEX_REFRESH_S = 5.0
"""Seconds a role's in-memory index of recorded steps is trusted before it is rebuilt from the folder."""


@dataclass(frozen=True)
class Loaded:
    """A served entry: its manifest, the recorded result and the RNG state the real call left."""

    manifest: dict[str, Any]
    result: Any
    rng_state: dict[str, Any] | None
    bytes: int
    effects: dict[str, Any] | None = None
    """The values the target's declared side effects had after the real call (``skip.<role>.effects``)."""


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
    ) -> None:
        self.dump_dir = dump_dir
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
        # Parts this process recorded into and has not closed; any number may be open at once (async rollouters
        # keep many steps in flight). A part is closed when a call of another step of its (target, shard)
        # is prepared and none of its own calls is still running, else when its last running call ends.
        self._open: set[tuple[int, str, str]] = set()
        self._running: dict[tuple[int, str, str], int] = {}  # part -> its real calls in progress
        self._left: set[tuple[int, str, str]] = set()  # open parts passed by a later call, closed when idle
        # Parts a real call of which raised (Ctrl-C, a preemption's SystemExit, a host error) with no later call
        # of the part succeeding: never marked closed, so the next run judges them by their calls and sets a
        # short one aside instead of serving it mixed with new calls.
        self._failed: set[tuple[int, str, str]] = set()
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
        try:
            folder = self.folder(step, target)
            names = os.listdir(folder)
        except UnsafePath as exc:
            self._warn_unsafe(exc)
            return PartInfo((), False)
        except FileNotFoundError:  # (NotADirectoryError: the dump dir itself is a file -- the store is unusable)
            return PartInfo((), False)
        calls = sorted(
            parsed[1] for n in names if (parsed := parse_manifest_name(n)) is not None and parsed[0] == shard
        )
        closed = False
        if shard + PART_SUFFIX in names:
            with contextlib.suppress(OSError, ValueError, RecursionError, AttributeError):
                with open(open_regular(os.path.join(folder, shard + PART_SUFFIX)), encoding="utf-8") as fh:
                    closed = json.loads(fh.read(1 << 16)).get("state") == "closed"
        return PartInfo(tuple(calls), closed)

    def part_calls(self, step: int, target: str, shard: str) -> tuple[Recorded, ...]:
        """The committed entries of a part with their writer and input fingerprint, sorted by call index.

        Kept until the part's folder changes (one ``lstat`` per call); after a change only manifests that are
        new or changed (by size or modification time) are read again, so a step of many calls costs one read
        per record, not one per entry. An unreadable manifest is left out here; serving it would fail its
        judgement anyway.
        """
        part = (step, target, shard)
        stamp = folder_stamp(os.path.join(role_dir(self.dump_dir, self.namespace, self.role), str(step), target))
        with self._lock:
            seen = self._entries.get(part)
        if seen is not None and stamp is not None and seen[0] == stamp:
            return seen[1]
        known = seen[2] if seen is not None else {}
        files: dict[str, tuple[int, int, Recorded]] = {}
        for call in self.part_info(step, target, shard).calls:
            path = manifest_path(self.dump_dir, self.key(step, target, shard, call))
            try:
                st = os.lstat(path)
            except OSError:
                continue
            old = known.get(path)
            if old is not None and old[:2] == (st.st_mtime_ns, st.st_size):
                files[path] = old
                continue
            try:
                files[path] = (st.st_mtime_ns, st.st_size, recorded_of(read_manifest(path), call))
            except (EntryInvalid, OSError):
                continue
        entries = tuple(sorted((f[2] for f in files.values()), key=lambda r: r.call))
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
            if part in self._writing:
                return True
            seen = self._closed.get(part)
        stamp = folder_stamp(os.path.join(role_dir(self.dump_dir, self.namespace, self.role), str(step), target))
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
            if index is not None and index[0] == stamp and now - index[1] < INDEX_REFRESH_S:
                return index[2]
        steps = [s for s in list_steps(self.dump_dir, self.namespace, self.role) if self.is_complete(s, target, shard)]
        with self._lock:
            self._index[(target, shard)] = (stamp, now, steps)
        return steps

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

    def load(self, key: EntryKey) -> Loaded:
        """Read, judge, verify and decode one entry.

        Raises:
            FileNotFoundError: the entry was never committed.
            EntryRefused: the entry holds pickled data and ``allow_pickle`` is off.
            EntryInvalid: the manifest is unreadable, belongs to another entry or lists foreign files, a
                payload file is missing, not a regular file, truncated or corrupt, or the tree is unreadable.
            UnsafePath: a folder on the way is a symlink or a file.
            codec.CodecError: the payload cannot be decoded here (e.g. a class this process does not
                approve, see :mod:`skipweave.store.codec`).
        """
        from skipweave.store import codec, tensorfile  # torch: imported on first use, not by the CLI

        folder = self.folder(key.step, key.target)
        where = manifest_path(self.dump_dir, key)
        judged = check_manifest(read_manifest(where), where, key, allow_pickle=self.allow_pickle)
        # Each file is read once, into memory, and verified there: what is checked is what is served.
        tree_bytes = _read_verified(os.path.join(folder, judged.tree["name"]), judged.tree)
        label = f"skipweave: replaying {self.role} step {key.step}"
        tensors = tensorfile.read(os.path.join(folder, judged.tensors["name"]), size=int(judged.tensors["bytes"]),
                                  checksum=str(judged.tensors["checksum"]), desc=label)
        try:
            tree = json.loads(tree_bytes)
        except (ValueError, RecursionError) as exc:
            raise EntryInvalid(f"payload of {where} is unreadable: {exc}") from exc
        payload = codec.decode(tree, tensors, allow_pickle=self.allow_pickle, trusted=self.trusted_classes)
        if not isinstance(payload, dict) or "result" not in payload:
            raise EntryInvalid(f"payload of {where} holds no recorded result")
        rng = payload.get("rng")
        effects = payload.get("effects")
        size = judged.tree["bytes"] + judged.tensors["bytes"]
        return Loaded(judged.manifest, payload["result"], rng if isinstance(rng, dict) else None, size,
                      effects if isinstance(effects, dict) else None)

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
        if info.calls and not self.is_complete(step, target, shard):
            me, started = this_writer(), started_unix()
            if any(is_concurrent_other(r, me, started) for r in self.part_calls(step, target, shard)):
                return  # another writer of this run records into it right now: not an interrupted run's leftover
            self.set_aside(step, target, shard, reason=(
                f"{len(info.calls)} of {self.expected_calls(target, shard)} calls committed and never closed"
            ))

    def _aside(self, name: str) -> str:
        """Create and return ``{role}/_set_aside/{name}``, refusing a symlinked ``_set_aside``."""
        return inside(self.dump_dir, self.namespace, self.role, SET_ASIDE_DIR, name, create=True)

    def set_aside(self, step: int, target: str, shard: str, *, reason: str) -> str | None:
        """Move a part's files to ``_set_aside/{step}-{target}-{shard}-{stamp}/``; return that folder.

        Raises:
            UnsafePath: the part's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
        """
        self.key(step, target, shard, 0)
        with self._lock:
            self._closed.pop((step, target, shard), None)
        self._index_drop(target, shard)
        folder = self.folder(step, target)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
        with filelock.FileLock(lock_path(folder, f".{shard}.part.lock"), timeout=LOCK_TIMEOUT_S):
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
        nbytes, _ = self._record(key, result, target_path=target_path, fingerprint=fingerprint,
                                 rng_state=rng_state, seconds=seconds, replace=replace, concurrent=concurrent,
                                 effects=effects, displace=False)
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
        return self._record(key, result, target_path=target_path, fingerprint=fingerprint, rng_state=rng_state,
                            seconds=seconds, replace=replace, concurrent=concurrent, effects=effects,
                            displace=True)

    def _record(self, key: EntryKey, result: Any, *, target_path: str, fingerprint: str,
                rng_state: dict[str, Any] | None, seconds: float, replace: bool, concurrent: bool,
                effects: dict[str, Any] | None, displace: bool) -> tuple[int, EntryKey]:
        self._watch_root()
        folder = self.folder(key.step, key.target, create=True)
        while True:
            with filelock.FileLock(lock_path(folder, f".{key.stem}.lock"), timeout=LOCK_TIMEOUT_S):
                dir_fd = open_dir(folder)
                try:
                    outcome = self._commit(dir_fd, folder, key, result, target_path=target_path,
                                           fingerprint=fingerprint, rng_state=rng_state, seconds=seconds,
                                           replace=replace, concurrent=concurrent, effects=effects)
                finally:
                    os.close(dir_fd)
            if outcome is not None or not displace:
                break
            taken = self.part_info(key.step, key.target, key.shard).calls
            key = dataclasses.replace(key, call=max([key.call, *taken]) + 1)  # the next free slot
        with self._lock:  # only now: a failed write leaves no part of this process's to close at exit
            self._writing.add((key.step, key.target, key.shard))
            self._open.add((key.step, key.target, key.shard))
        self._index_add(key.step, key.target, key.shard)  # a part this process writes is servable
        if outcome is None:
            return 0, key
        nbytes, leftovers = outcome
        try:
            self._write_part(key, "open")
        except OSError as exc:
            leftovers.append(f"its part state ({type(exc).__name__}: {exc})")
        if leftovers:
            logger.warning("skipweave: recorded %s (committed and servable), but could not update %s",
                           key, "; ".join(leftovers))
        return nbytes, key

    def _commit(self, dir_fd: int, folder: str, key: EntryKey, result: Any, *, target_path: str, fingerprint: str,
                rng_state: dict[str, Any] | None, seconds: float, replace: bool,
                concurrent: bool, effects: dict[str, Any] | None = None) -> tuple[int, list[str]] | None:
        """Write and commit one entry in the folder open as ``dir_fd`` (the caller holds the entry lock).

        Returns ``None`` when a valid entry was already committed (and ``replace`` is off), else the bytes
        written and what bookkeeping after the commit failed (for the caller's WARNING).
        """
        final_manifest = manifest_path(self.dump_dir, key)
        manifest_name = os.path.basename(final_manifest)
        old: dict[str, Any] | None = None
        if os.path.lexists(final_manifest):
            try:
                old = read_manifest(final_manifest)
                if not replace:
                    check_manifest(old, final_manifest, key, allow_pickle=True)
                    verify_payload(folder, old, checksums=False)
                    return None
            except (EntryInvalid, FileNotFoundError):
                old = None
        from skipweave.store import codec, tensorfile

        payload: dict[str, Any] = {"result": result, "rng": rng_state}
        if effects is not None:
            payload["effects"] = effects
        encoded = codec.encode(payload, allow_pickle=self.allow_pickle,
                               trusted=self.trusted_classes)
        token = uuid.uuid4().hex[:8]
        tree_name = f"{key.stem}.{token}.tree.json"
        tensor_name = f"{key.stem}.{token}.tensors.safetensors"
        tree_bytes = json.dumps(encoded.tree, separators=(",", ":")).encode()
        made: list[str] = []  # names in the folder this write created, removed if it does not commit
        try:
            tmp_tree = _tmp_in(folder, tree_name)
            made.append(tmp_tree)
            _write_new(dir_fd, tmp_tree, tree_bytes)
            tmp_tensors = _tmp_in(folder, tensor_name)
            made.append(tmp_tensors)
            # safetensors bytes streamed from the tensors' memory, checksummed on that memory, fsynced
            tensor_bytes, tensor_sum = tensorfile.write(
                tmp_tensors, encoded.tensors, desc=f"skipweave: recording {self.role} step {key.step}",
                dir_fd=dir_fd,
            )
            files = [
                PayloadFile(tree_name, len(tree_bytes), bytes_checksum(tree_bytes)),
                PayloadFile(tensor_name, tensor_bytes, tensor_sum),
            ]
            for tmp, final in ((tmp_tree, tree_name), (tmp_tensors, tensor_name)):
                os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                made[made.index(tmp)] = final
            manifest = build_manifest(
                role=self.role, target=key.target, target_path=target_path, step=key.step, call=key.call,
                shard=key.shard, fingerprint=fingerprint, files=files, pickled=encoded.pickled,
                seconds=seconds, concurrent=concurrent,
            )
            tmp_manifest = _tmp_in(folder, manifest_name)
            made.append(tmp_manifest)
            _write_new(dir_fd, tmp_manifest, json.dumps(manifest, indent=1).encode())
            if not same_folder(folder, dir_fd):
                raise StoreMoved(
                    f"{folder} was moved or removed while {key} was being written; nothing was recorded "
                    "and no temporary file was left"
                )
            os.replace(tmp_manifest, manifest_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the commit
        except BaseException:
            for name in made:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
            raise
        leftovers: list[str] = []
        try:
            os.fsync(dir_fd)
        except OSError as exc:
            leftovers.append(f"the folder's fsync ({type(exc).__name__}: {exc})")
        if old is not None:  # the replaced entry's payload is no longer referenced
            for item in old.get("payload", []):
                old_name = item.get("name") if isinstance(item, dict) else None
                parsed = parse_payload_name(old_name) if isinstance(old_name, str) else None
                if parsed is not None and parsed[0] == key.stem and old_name not in (tree_name, tensor_name):
                    with contextlib.suppress(OSError):
                        os.unlink(str(old_name), dir_fd=dir_fd)
        return sum(f.bytes for f in files), leftovers

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

        Logs one WARNING naming the entry, the reason and where it went.

        Raises:
            UnsafePath: the entry's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
            OSError: the files could not be moved (e.g. a read-only dump dir).
        """
        with self._lock:
            self._closed.pop((key.step, key.target, key.shard), None)
        self._index_drop(key.target, key.shard)
        folder = self.folder(key.step, key.target)
        with filelock.FileLock(lock_path(folder, f".{key.stem}.lock"), timeout=LOCK_TIMEOUT_S):
            dest = self._aside(f"{key.step}-{key.target}-{key.stem}-unusable-{uuid.uuid4().hex[:6]}")
            for n in os.listdir(folder):
                if n.startswith(key.stem + ".") and not n.startswith(TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(os.path.join(folder, n), os.path.join(dest, n))
        self._touch()
        logger.warning("skipweave: entry %s not served (%s); moved to %s, running live and recording it afresh",
                       key, reason, dest)

    def call_started(self, step: int, target: str, shard: str) -> None:
        """A real call that will be recorded into this part began (keeps the part open while it runs)."""
        part = (step, target, shard)
        with self._lock:
            self._running[part] = self._running.get(part, 0) + 1

    def call_ended(self, step: int, target: str, shard: str, *, failed: bool = False) -> None:
        """That call ended; the part closes now if a later call (or :meth:`close_all`) passed it meanwhile.

        Args:
            failed: the real call raised (anything, ``KeyboardInterrupt`` and ``SystemExit`` included): the
                part is not marked closed until a later call of it succeeds.
        """
        part = (step, target, shard)
        with self._lock:
            if failed:
                self._failed.add(part)
            else:
                self._failed.discard(part)
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

    def _write_part(self, key: EntryKey, state: str) -> None:
        folder = self.folder(key.step, key.target)
        if not os.path.isdir(folder):  # the dump dir went away: never recreate folders just for the state
            raise FileNotFoundError(f"{folder} no longer exists")
        info = self.part_info(key.step, key.target, key.shard)
        data = {"state": state, "calls": info.contiguous, "updated_unix": time.time(), "pid": os.getpid()}
        write_bytes_atomic(part_path(self.dump_dir, key), json.dumps(data).encode())
        self._touch()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _tmp_in(folder: str, final_name: str) -> str:
    """A fresh temporary name (no folder) for a file that becomes ``final_name``."""
    return os.path.basename(tmp_name(folder, final_name))


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Create ``name`` in the folder open as ``dir_fd`` (never an existing file or a symlink), write, fsync."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
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


__all__ = ["EntryInvalid", "Loaded", "MANIFEST_SUFFIX", "PartInfo", "StepStore", "StoreMoved"]
