"""The step store of one role: record entries atomically, serve only complete and valid ones.

:class:`StepStore` is a facade over parts with one concern each (see docs/architecture.md):

- :mod:`~skipweave.store.folders`: the role's checked names and folders;
- :mod:`~skipweave.store.index`: what the folders hold (each part's calls, group files and entries; the steps
  recorded), kept while they are unchanged;
- :mod:`~skipweave.store.parts`: the life of a part in this process (prepared, open, closed, set aside);
- :mod:`~skipweave.store.resume`: short parts of an interrupted run this process resumes;
- :mod:`~skipweave.store.read`: serving one entry; :mod:`~skipweave.store.staging` and
  :mod:`~skipweave.store.commit`: recording one, or many with one group sync;
- :mod:`~skipweave.store.pending`: the entries handed to the background writer.

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
  new data never mix; or, when its calls can be matched by their inputs, resumed: its entries serve the calls
  they were recorded for, and those no call was served are set aside when the part closes.
- Nothing leaves the dump dir: namespace, role, target and shard are checked single names, no folder
  below the root is a symlink (:func:`skipweave.store.fs.inside`), no file is opened through one.
- An entry is judged by :func:`skipweave.store.format.manifest.check_manifest`, the same function ``skipweave
  verify``/``gc``/``ls`` use.
- What a record reports is what happened: the manifest's rename is the commit; bookkeeping after it that
  fails is reported as such, and a folder moved or removed while an entry was written is detected (the
  write is abandoned and its temporary files removed through the open folder).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import weakref
from collections.abc import Callable, Collection
from typing import Any

import safetensors  # noqa: F401 - its version goes into every manifest (library_versions)

from skipweave.store.commit import Committer
from skipweave.store.errors import EntryForeign, EntryInvalid, StoreMoved
from skipweave.store.folders import Mtime, RoleFolders
from skipweave.store.format.layout import MANIFEST_SUFFIX, EntryKey
from skipweave.store.identity import Recorded
from skipweave.store.index import PartIndex, PartInfo, StepIndex, calls_in
from skipweave.store.parts import PartStates, part_lock
from skipweave.store.pending import PendingWrites
from skipweave.store.read import EntryReader, Loaded
from skipweave.store.resume import set_aside_calls, write_apart
from skipweave.store.retainer import FINAL_ROUND_S, Retainer
from skipweave.store.retention import KeepRule, StepRemoval
from skipweave.store.staging import EntryMeta, Item, Staged, stage

logger = logging.getLogger(__name__)


class StepStore:
    """Entries of one role under ``{dump_dir}/{namespace}/{role}``.

    Args:
        dump_dir: absolute store root.
        namespace: run identity folder.
        role: role name.
        allow_pickle: let results the safe codec cannot hold be pickled, and load such entries.
        calls_per_step: calls one shard makes per step when known (see :class:`RoleConfig`).
        trusted_classes: ``module:qualname`` classes decoding may construct besides those it approves by
            itself (``skip.<role>.trusted_classes``; see :mod:`skipweave.store.format.codec`).
        compress: zstd level the tensor file of a new entry is compressed with (``skip.<role>.compress``), or
            ``None``; entries of either form are read.
        keep: which recorded steps are kept (``skip.<role>.keep``); ``None`` or an inactive rule keeps every step.
            Applied by :meth:`after_commit` (:mod:`skipweave.store.retention`).
        views: :meth:`load` gives read-only views that keep the recorded classes' names instead of rebuilding
            them (:func:`~skipweave.store.format.codec.decode_view`): what ``skipweave diff`` compares. Never for a
            store that serves a host.

    Raises:
        ValueError: ``namespace`` or ``role`` is not a single folder name (see
            :func:`~skipweave.store.fs.check_name`).
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
        keep: KeepRule | None = None,
        views: bool = False,
    ) -> None:
        self._folders = RoleFolders(dump_dir, namespace, role)
        self.dump_dir = dump_dir
        self.namespace = self._folders.namespace
        self.role = self._folders.role
        self.compress = compress
        self.allow_pickle = allow_pickle
        self.calls_per_step = calls_per_step
        self.trusted_classes = tuple(trusted_classes)
        self._lock = threading.RLock()
        self._pending = PendingWrites()
        self._index = PartIndex(self._folders)
        self._steps = StepIndex(self._folders)
        self._parts = PartStates(self._folders, self._index, self._steps, self._pending, calls_per_step, self._lock)
        self._reader = EntryReader(self._folders, self._index, allow_pickle=allow_pickle,
                                   trusted_classes=self.trusted_classes, views=views)
        self._committer = Committer(self._folders, self._index, self._parts, compress=compress)
        self._retainer = Retainer(self, keep) if keep is not None and keep.active else None
        self._parts.settle = self._settle
        _STORES.add(self)

    # ------------------------------------------------------------------ background writes
    def pending_add(self, key: EntryKey, future: concurrent.futures.Future[Any]) -> None:
        """An entry of this store was handed to the background writer; ``future`` is done when its write ended.
        Such a part counts as recorded here (a call it serves waits) and is open."""
        self._pending.add(key, future)
        self._parts.mark_open((key.step, key.target, key.shard))

    def pending_done(self, key: EntryKey) -> None:
        """The background write of ``key`` ended (committed or failed)."""
        self._pending.done(key)

    def wait_pending(self, step: int, target: str, shard: str, *, skip: Collection[int] = ()) -> None:
        """Wait until this process's background writes into a part have ended, but those of calls in ``skip``
        (the caller's own recordings, which it never serves to itself): a replay of an entry still being written
        reads it once committed."""
        self._pending.wait((step, target, shard), skip=skip)

    def after_commit(self, steps: Collection[int], *, stop: Callable[[], bool] | None = None) -> list[StepRemoval]:
        """Entries of ``steps`` were just committed (by the background writer, off any recorded call): apply the
        role's ``keep`` rule when one of them is a step newer than any before (see
        :class:`~skipweave.store.retainer.Retainer`). Those steps, and the ones this process is still writing, are
        never removed. ``stop``: polled between the steps a round removes; True ends the round (the process is ending).
        Returns what the round removed or kept (empty when none ran); never raises."""
        if self._retainer is None:
            return []
        return self._retainer.after_commit(steps, stop=stop)

    def held_steps(self) -> set[int]:
        """Steps this process is still writing (background writes pending), keeps a part of open, or resumes a part
        of: retention (:mod:`skipweave.store.retention`) never removes them."""
        return self._pending.all_steps() | self._parts.held_steps()

    def after_commit_soon(self, steps: Collection[int]) -> None:
        """Entries of ``steps`` were just committed in a recorded call's thread (no background writer): apply the
        role's ``keep`` rule as :meth:`after_commit` does, on a thread of its own, so the call does not wait for
        it. Never raises."""
        if self._retainer is not None:
            self._retainer.after_commit_soon(steps)

    def final_round(self, timeout: float = FINAL_ROUND_S) -> list[StepRemoval]:
        """The run's end (unweave, the process's exit), once every entry is committed and every part closed: apply
        the role's ``keep`` rule once more when this process committed anything since the last round that ran whole
        (:meth:`~skipweave.store.retainer.Retainer.final_round`), within ``timeout`` seconds. Returns what it removed
        or kept; never raises."""
        return self._retainer.final_round(timeout) if self._retainer is not None else []

    def _after_fork(self) -> None:
        """In a forked child: the parent's background writes are the parent's (never waited for here); fresh
        locks (another thread may have held the parent's)."""
        self._lock = self._parts.lock = threading.RLock()
        self._pending.after_fork()
        self._folders.after_fork()
        if self._retainer is not None:
            self._retainer.after_fork()

    # ------------------------------------------------------------------ folders
    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        """Return the :class:`EntryKey` of a call of this role.

        Raises:
            ValueError: ``target`` or ``shard`` is not a single folder name.
        """
        return self._folders.key(step, target, shard, call)

    def folder(self, step: int, target: str, *, create: bool = False) -> str:
        """The target folder of a step, every folder below the dump dir checked to be a real folder.

        Raises:
            UnsafePath: a folder on the way is a symlink or a file.
            OSError: ``create`` and it could not be made.
        """
        return self._folders.folder(step, target, create=create)

    def folder_mtime(self, step: int, target: str) -> Mtime | None:
        """The :func:`~skipweave.store.format.layout.folder_mtime` of a step's target folder now (one ``lstat``).

        A replay takes it once, after waiting for this process's pending writes, and hands it to
        :meth:`part_calls` and :meth:`load`, so what both keep by the folder's mtime is judged against the
        same look at the folder.
        """
        return self._folders.mtime(step, target)

    def holdings(self) -> str:
        """What the store holds of this role, for the message of a replay-only call it cannot serve: empty for a dump
        dir (the message names the folder to look in); a bundle's store names its steps and targets."""
        return ""

    # ------------------------------------------------------------------ reading
    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        """Return the committed calls of a part and whether its writer closed it.

        A part behind a symlinked or misplaced folder has nothing committed (a WARNING says so once).
        """
        return self._index.part_info(step, target, shard)

    def part_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None) -> tuple[Recorded, ...]:
        """The committed entries of a part with their writer and input fingerprint, sorted by call index.

        Kept until the part's folder changes (one ``lstat`` per call); after a change only manifests that are
        new or changed (by size or modification time) are read again, so a step of many calls costs one read
        per record, not one per entry. Only the calls the folder's listing shows a manifest of their own for are
        looked at (a grouped call has none: its summary comes from its group file). An unreadable manifest is
        left out here; serving it would fail its judgement anyway.

        Args:
            mtime: the folder's :meth:`folder_mtime`, when the caller took it just now (a replay takes one for its
                whole read, see :meth:`load`); taken here when ``None``.
        """
        return self._index.part_calls(step, target, shard, mtime=mtime)

    def foreign_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None
                      ) -> dict[int, EntryForeign]:
        """The calls of a part whose entry (or group file) is of a format version this skipweave does not read, each
        with the :class:`~skipweave.store.errors.EntryForeign` that says which version and writer. Such a call is
        never served, and its slot never written (:mod:`skipweave.store.format.versions`); kept as
        :meth:`part_calls` is."""
        return self._index.foreign_calls(step, target, shard, mtime=mtime)

    def expect_calls(self, target: str, calls: int) -> None:
        """Every shard makes ``calls`` calls of ``target`` per step, whatever ``calls_per_step`` says: a host that
        learns its count only at run time (verl's V1 trainer, ``parameter_sync_step`` mini-batches per step) tells
        it here; a part of ``target`` is then complete, and is closed, only with that many calls."""
        self._parts.expect_calls(target, calls)

    def expected_calls(self, target: str, shard: str) -> int | None:
        """Calls one shard makes per step: ``calls_per_step``, else the most seen in a closed part of the newest 8
        steps, else ``None`` (unknown; see :meth:`is_complete`)."""
        return self._parts.expected_calls(target, shard)

    def is_complete(self, step: int, target: str, shard: str) -> bool:
        """True when a part may be served: closed by its writer, or holding every expected call."""
        return self._parts.is_complete(step, target, shard)

    def recorded_steps(self, target: str, shard: str) -> list[int]:
        """Sorted steps holding a complete recording of ``target`` for ``shard``.

        Kept in memory per (target, shard), so a ``repeat*`` decision costs the same with 10 or 10,000
        recorded steps: this process's own records, closes and set-asides update the index; one ``lstat`` of
        the role folder, whose modification time every skipweave writer and ``gc`` move
        (:func:`~skipweave.store.format.layout.touch_role`), shows another writer's change; and the index is
        rebuilt at least every :data:`~skipweave.store.index.INDEX_REFRESH_S` seconds anyway, for changes made by
        hand (or within one tick of a coarse file-system clock). A step the index serves that is gone meanwhile is
        a plain miss (the entry is looked up when served).
        """
        return self._steps.recorded_steps(target, shard, self.is_complete, self._pending.steps(target, shard))

    def load(self, key: EntryKey, *, mtime: Mtime | None = None) -> Loaded:
        """Read, judge, verify and decode one entry.

        ``mtime``: the folder's :meth:`folder_mtime`, when the caller took it just now (and read the part's entries
        with it, see :meth:`part_calls`); taken here when ``None``.

        Raises:
            FileNotFoundError: the entry was never committed.
            EntryRefused: the entry holds pickled data and ``allow_pickle`` is off.
            EntryInvalid: the manifest is unreadable, belongs to another entry or lists foreign files, a
                payload file is missing, not a regular file, truncated or corrupt, or the tree is unreadable.
            UnsafePath: a folder on the way is a symlink or a file.
            codec.CodecError: the payload cannot be decoded here (e.g. a class this process does not
                approve, see :mod:`skipweave.store.format.codec`).
        """
        return self._reader.load(key, mtime=mtime)

    # ------------------------------------------------------------------ parts
    def prepare_part(self, step: int, target: str, shard: str, *, resumable: bool = False) -> None:
        """Before a call of a part: close this shard's other open parts that are idle, resume or set aside leftovers.

        A part holding calls from an interrupted run (not closed, fewer calls than expected, not
        written by this process) is moved to ``_set_aside/`` (by :meth:`set_aside`) with a log line, once per
        process; unless ``resumable`` (the caller matches the target's calls by their inputs: no
        ``fingerprint.include``, no fingerprint shards), a step makes more than one call and every entry of the part
        has an input fingerprint: then the part is resumed (:mod:`~skipweave.store.resume`, :meth:`is_resumed`).
        """
        self._parts.prepare(step, target, shard, self.set_aside, resumable=resumable)

    def is_resumed(self, step: int, target: str, shard: str) -> bool:
        """True while this process resumes the part (see :meth:`prepare_part`): the calls of its step are matched to
        its entries by input fingerprint only, and those that match none are recorded into slots
        :meth:`resumed_calls` does not hold."""
        return self._parts.is_resumed(step, target, shard)

    def resumed_calls(self, step: int, target: str, shard: str) -> frozenset[int]:
        """The calls the interrupted run committed into a part this process resumes (empty for any other part)."""
        return self._parts.resumes.calls((step, target, shard))

    def resumed_served(self, step: int, target: str, shard: str, call: int) -> None:
        """Entry ``call`` of a part this process resumes served one of its calls: kept when the part closes (the
        interrupted run's entries that served none are set aside then)."""
        self._parts.resumes.served((step, target, shard), call)

    def _settle(self, part: tuple[int, str, str], calls: frozenset[int]) -> bool:
        """Set aside the given calls of a resumed part as it closes (one WARNING); False when they could not be."""
        kept: list[bool] = []

        def keep_grouped(keys: list[EntryKey]) -> bool:
            kept.append(write_apart(self, keys))
            return kept[-1]

        self._parts.closed_seen.pop(part)
        dest = set_aside_calls(self._folders, part, calls, lock=part_lock, keep_grouped=keep_grouped)
        self._steps.drop(part[1], part[2])
        self._steps.touch()
        if dest is None:
            return all(kept)  # nothing was left to move (gone meanwhile), or a group could not be kept apart
        logger.warning("skipweave: role %s target %s step %d shard %s: %d entries the interrupted run recorded "
                       "served no call of this run (their inputs differed); set aside to %s as the part closes",
                       self.role, part[1], part[0], part[2], len(calls), dest)
        return True

    def is_fresh(self, step: int, target: str, shard: str) -> bool:
        """True when the part held nothing when this process first prepared a call of it (or was set aside by
        it): its entries are this process's own recordings or those of writers running alongside it, none of
        which serves this process, so a call of it need not read the part to know it is a miss."""
        return self._parts.is_new(step, target, shard)

    def set_aside(self, step: int, target: str, shard: str, *, reason: str,
                  unless: Callable[[], bool] | None = None) -> str | None:
        """Move a part's files to ``_set_aside/{step}-{target}-{shard}-{time}/``; return that folder.

        ``unless`` is asked under the part's lock, which every writer of the part holds while it commits: when it
        says True (the part was completed or taken up by another writer since the caller looked), nothing is moved
        and ``None`` is returned.

        Raises:
            UnsafePath: the part's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
        """
        return self._parts.set_aside(step, target, shard, reason=reason, unless=unless)

    def discard(self, key: EntryKey, *, reason: str) -> None:
        """Move an unusable entry's manifest and payload to ``_set_aside/`` so it is never served again.

        An entry without a manifest of its own is served from a group file: the group files claiming its call go,
        with their data files (the group's other calls are then misses, recorded afresh). Logs one WARNING naming
        the entry, the reason and where it went.

        Raises:
            UnsafePath: the entry's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
            OSError: the files could not be moved (e.g. a read-only dump dir).
        """
        self._parts.discard(key, reason=reason)

    def call_started(self, step: int, target: str, shard: str) -> int:
        """A real call that will be recorded into this part began (keeps the part open while it runs, and while
        its entry is written in the background). Returns its number, for :meth:`call_ended`."""
        return self._parts.call_started(step, target, shard)

    def call_ended(self, step: int, target: str, shard: str, *, failed: bool = False, number: int = 0) -> None:
        """That call ended (its entry committed, when written in the background); the part closes now if a later
        call (or :meth:`close_all`) passed it meanwhile.

        Args:
            failed: the real call raised (anything, ``KeyboardInterrupt`` and ``SystemExit`` included): the
                part is not marked closed until a call of it that started later succeeds (an earlier call whose
                entry is committed after the failure does not count).
            number: what :meth:`call_started` returned for the call (0: unknown, counted as the latest).
        """
        self._parts.call_ended(step, target, shard, failed=failed, number=number)

    def close_part(self, step: int, target: str, shard: str) -> None:
        """Mark a part this process recorded as complete (the process moved past its step or stops).

        Left open instead (the next run judges it by its calls) when a call of it failed and none succeeded
        since, or when it holds fewer calls than ``calls_per_step``.
        """
        self._parts.close(step, target, shard)

    def close_all(self) -> None:
        """Close every part this process left open, of any number of steps (at unweave and interpreter exit).

        A part with a call still running (a daemon thread, a task outliving an unweave) is not closed now: it
        closes when that call ends, or stays open if the process ends first.
        """
        self._parts.close_all()

    # ------------------------------------------------------------------ writing
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
            fingerprint: input fingerprint of the call, taken by the ``arguments`` rule (as passed,
                :func:`~skipweave.weaving.fingerprint.fingerprint`; the manifest says so), or ``""``. A woven call's
                entry is written through :meth:`commit` with its own rule (:class:`EntryMeta`).
            rng_state: RNG state after the real call (:func:`skipweave.weaving.rng.capture_rng_state`).
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

    def stage(self, result: Any, *, rng_state: dict[str, Any] | None,
              effects: dict[str, Any] | None = None, appended: dict[str, Any] | None = None) -> Staged:
        """Encode a result (with its RNG state and effects) into what :meth:`commit` writes.

        Args:
            result: the live result.
            rng_state: RNG state after the real call (:func:`skipweave.weaving.rng.capture_rng_state`).
            effects: values of the target's declared side effects after the real call, by expression.
            appended: declared effects that are lists the real call only appended to, by expression:
                ``{"n_before": int, "tail": list}`` (see :attr:`Loaded.appended`); stored apart from ``effects``
                so no recorded value is ever taken for one.

        Returns:
            The staged entry; its tensors may share memory with ``result`` (see :meth:`Staged.copied`), its tree
            is serialised already (the codec's tree may hold the host's objects).

        Raises:
            codec.CodecError: the result cannot be encoded.
        """
        return stage(result, rng_state=rng_state, effects=effects, appended=appended, allow_pickle=self.allow_pickle,
                     trusted=self.trusted_classes)

    def commit(self, key: EntryKey, staged: Staged, meta: EntryMeta) -> tuple[int, EntryKey]:
        """Write and commit one staged entry (see :meth:`record`). With ``meta.displace``, a slot another writer
        filled is kept and the entry goes to the next free call index of its part.

        Returns:
            Bytes written (0 when another writer's entry was kept) and the key committed under.

        Raises:
            the same as :meth:`record`, but for the codec's errors (already raised by :meth:`stage`).
        """
        return self._committer.commit(key, staged, meta)

    def commit_many(self, items: list[Item]) -> list[tuple[int, EntryKey] | BaseException | None]:
        """Commit several staged entries with one group sync: every payload and manifest is written unsynced,
        then flushed to disk at once (:func:`~skipweave.store.atomic.sync_files`), and only then is each
        manifest renamed into place (each entry's commit). What one entry costs falls from three fsyncs to a
        share of one; the commit rule is :meth:`commit`'s. The small entries of one part with contiguous free
        calls are written as one group (:mod:`skipweave.store.format.group`).

        Keys must name distinct entries. The parts' locks are taken in sorted order and held until the commits.

        Returns:
            Per item, in order: ``(bytes, key)`` as :meth:`commit` returns; the exception that item failed with
            (nothing of it is left); or ``None`` when its slot holds another writer's entry and the item is to be
            displaced (:meth:`commit` with ``displace``).
        """
        return self._committer.commit_many(items)


_STORES: weakref.WeakSet[StepStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["EntryInvalid", "EntryMeta", "Loaded", "MANIFEST_SUFFIX", "PartInfo", "Staged", "StepStore", "StoreMoved",
           "calls_in", "part_lock"]
