"""A role's store read from a bundle: what a run replays from when ``skip.<role>.dump_dir`` names a ``.zip`` file.

:class:`BundleStore` answers the questions the call engine asks a :class:`~skipweave.store.step_store.StepStore`
(which steps are recorded, which calls a part holds, load this entry) from a
:class:`~skipweave.store.bundle.archive.BundleArchive`, the one read-only interface to a bundle; nothing is extracted
and nothing is written beside the bundle. It is a :class:`StepStore` by type only: it shares none of its state and
overrides every public method (``tests/store/bundle`` checks that none is left to the dump dir's code). Everything
that would write raises :class:`BundleReadOnly`: a role whose store is a bundle is replay-only
(:mod:`skipweave.config.parse` makes it so), so a call the bundle does not serve stops the run with
``ReplayMissing``, naming what the bundle holds (:meth:`BundleStore.holdings`).

Every bundle part is complete (``skipweave pack`` takes only parts a run would serve) and closed. An entry is judged
by the dump dir's own functions (:mod:`~skipweave.store.bundle.contents`) and its payload members are checked
against the bundle manifest and the entry's manifest before anything is decoded; an entry that fails is never
served (one WARNING), and the bundle is left as it is.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Collection
from typing import Any

from skipweave.store.bundle.archive import BundleArchive, BundleRefused
from skipweave.store.bundle.contents import BundlePart, Judged, contents, grouped_manifest, judge, where
from skipweave.store.bundle.layout import is_bundle_path
from skipweave.store.cache import ValidatedCache
from skipweave.store.errors import EntryForeign, EntryInvalid
from skipweave.store.folders import Mtime
from skipweave.store.format.group import DATA_READ_MAX
from skipweave.store.format.layout import EntryKey
from skipweave.store.fs import check_name
from skipweave.store.identity import Recorded, recorded_of
from skipweave.store.index import GROUP_CACHE_BYTES, PartInfo
from skipweave.store.read import Loaded, decode_entry
from skipweave.store.retention import StepRemoval
from skipweave.store.staging import EntryMeta, Staged
from skipweave.store.step_store import StepStore

logger = logging.getLogger(__name__)

PAYLOAD_READ_MAX = 1 << 40
"""Most bytes one tensor file of a bundle may decompress to (a compressed entry's ``.zst`` file)."""


class BundleReadOnly(OSError):
    """Something tried to write into a bundle (record, set aside, remove): a bundle is only ever read."""


class BundleStore(StepStore):
    """Entries of one role of a bundle, read in place (see the module docstring).

    Args:
        dump_dir: the bundle file.
        namespace, role: the role's place in it.
        allow_pickle, calls_per_step, trusted_classes, compress, keep, views: as :class:`StepStore` takes them
            (``compress`` and ``keep`` are of no use to a store that records nothing).
        archive: a judged archive of ``dump_dir`` to share (roles of one bundle read one file); opened when ``None``.

    Raises:
        FileNotFoundError: no bundle at ``dump_dir``.
        BundleRefused: the bundle is not one skipweave reads (naming the member and why).
        ValueError: ``namespace`` or ``role`` is not a single folder name.
    """

    def __init__(self, dump_dir: str, namespace: str, role: str, *, allow_pickle: bool = False,
                 calls_per_step: int | None = None, trusted_classes: tuple[str, ...] = (),
                 compress: int | None = None, keep: Any = None, views: bool = False,
                 archive: BundleArchive | None = None) -> None:
        self.dump_dir = os.path.abspath(dump_dir)
        self.namespace = check_name("namespace", namespace)
        self.role = check_name("role", role)
        self.allow_pickle = allow_pickle
        self.calls_per_step = calls_per_step
        self.trusted_classes = tuple(trusted_classes)
        self.compress = compress
        self._views = views
        self._archive = archive if archive is not None else BundleArchive(dump_dir)
        self._held: dict[tuple[int, str, str], BundlePart] = {  # (step, target, shard) -> its part
            (step, target, shard): bp for (ns, r, step, target, shard), bp in contents(self._archive).items()
            if ns == self.namespace and r == self.role}
        self._judged: dict[str, Judged | Exception] = {}
        self._groups: ValidatedCache[str, tuple[memoryview, dict[int, Any]]] = ValidatedCache(
            max_weight=GROUP_CACHE_BYTES, weight=lambda v: len(v[0]))
        self._lock = threading.RLock()
        self._warned: set[EntryKey] = set()

    # ------------------------------------------------------------------ what the bundle holds
    def holdings(self) -> str:
        """What the bundle holds for this role, for a message: ``target gen steps 1-3 (shard r0)``; or that it holds
        nothing of it (and which roles it holds)."""
        by_target: dict[tuple[str, str], list[int]] = {}
        for step, target, shard in self._held:
            by_target.setdefault((target, shard), []).append(step)
        if not by_target:
            roles = sorted({f"{p[0]}/{p[1]}" for p in contents(self._archive)})
            return (f"the bundle holds nothing of namespace {self.namespace} role {self.role} (it holds "
                    f"{', '.join(roles) or 'no part'})")
        return "the bundle holds " + "; ".join(
            f"target {t} steps {_ranges(sorted(steps))} (shard {s})" for (t, s), steps in sorted(by_target.items()))

    def _part(self, step: int, target: str, shard: str) -> BundlePart | None:
        return self._held.get((step, target, shard))

    def _judge(self, bp: BundlePart, call: int) -> Judged:
        head = bp.head_of(call)
        if head is None:
            raise FileNotFoundError(f"{self.dump_dir}: no entry of step {bp.part[2]} target {bp.part[3]} shard "
                                    f"{bp.part[4]} call {call}")
        with self._lock:
            got = self._judged.get(head.name)
        if got is None:
            try:
                got = judge(self._archive, bp, head, allow_pickle=True)
            except (EntryInvalid, EntryForeign, BundleRefused) as exc:
                got = exc
            with self._lock:
                self._judged[head.name] = got
        if isinstance(got, Exception):
            raise got
        return got

    def _manifest_of(self, bp: BundlePart, call: int) -> dict[str, Any]:
        judged = self._judge(bp, call)
        if judged.manifest is not None:
            return judged.manifest.manifest
        return grouped_manifest(judged, bp.key(call), allow_pickle=True)

    # ------------------------------------------------------------------ reading
    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        return EntryKey(self.namespace, self.role, step, check_name("target", target), check_name("shard", shard),
                        call)

    def folder(self, step: int, target: str, *, create: bool = False) -> str:
        if create:
            raise BundleReadOnly(f"{self.dump_dir} is a bundle: nothing is created in it")
        return f"{self.dump_dir}/{self.namespace}/{self.role}/{step}/{target}"

    def folder_mtime(self, step: int, target: str) -> Mtime | None:
        return (0, self._archive.mtime_ns)  # a bundle never changes while it is read (a changed one fails its checks)

    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        bp = self._part(step, target, shard)
        return PartInfo(bp.calls, True) if bp is not None else PartInfo((), False)

    def part_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None) -> tuple[Recorded, ...]:
        bp = self._part(step, target, shard)
        out: list[Recorded] = []
        for call in bp.calls if bp is not None else ():
            try:
                out.append(recorded_of(self._manifest_of(bp, call), call))  # type: ignore[arg-type]
            except (EntryInvalid, EntryForeign, BundleRefused, FileNotFoundError):
                continue
        return tuple(out)

    def foreign_calls(self, step: int, target: str, shard: str, *, mtime: Mtime | None = None
                      ) -> dict[int, EntryForeign]:
        bp = self._part(step, target, shard)
        out: dict[int, EntryForeign] = {}
        for call in bp.calls if bp is not None else ():
            try:
                self._manifest_of(bp, call)  # type: ignore[arg-type]
            except EntryForeign as exc:
                out[call] = exc
            except (EntryInvalid, BundleRefused, FileNotFoundError):
                continue
        return out

    def expect_calls(self, target: str, calls: int) -> None:
        return None

    def expected_calls(self, target: str, shard: str) -> int | None:
        if self.calls_per_step is not None:
            return self.calls_per_step
        counts = [len(bp.calls) for (_s, t, sh), bp in self._held.items() if t == target and sh == shard]
        return max(counts) if counts else None

    def is_complete(self, step: int, target: str, shard: str) -> bool:
        return self._part(step, target, shard) is not None

    def recorded_steps(self, target: str, shard: str) -> list[int]:
        return sorted(step for step, t, sh in self._held if t == target and sh == shard)

    def load(self, key: EntryKey, *, mtime: Mtime | None = None) -> Loaded:
        """Read, judge, verify and decode one entry of the bundle (see :meth:`StepStore.load`; a damaged member is
        :class:`~skipweave.store.errors.EntryInvalid` naming it)."""
        from skipweave.store.format import tensorfile

        bp = self._part(key.step, key.target, key.shard)
        if bp is None or key.call not in bp.calls:
            raise FileNotFoundError(f"{self.dump_dir}: no entry of step {key.step} target {key.target} shard "
                                    f"{key.shard} call {key.call}")
        try:
            judged = self._judge(bp, key.call)
            names = judged.payload_names()
            if judged.manifest is not None:
                from skipweave.store.format.manifest import check_pickle

                checked = judged.manifest
                check_pickle(checked.manifest, where(self._archive, judged.head.name), key,
                             allow_pickle=self.allow_pickle)
                tree = self._member(names[0], checked.tree)
                tensors = self._mapped(names[1], checked.tensors)
                if tensors is None:
                    raw = self._member(names[1], checked.tensors)
                    section, spans = tensorfile.split_whole(raw, path=names[1], limit=PAYLOAD_READ_MAX)
                    tensors = {n: tensorfile.tensor_at(section, sp) for n, sp in spans.items()}
                size = len(tree) + int(checked.tensors["bytes"])
                return decode_entry(where(self._archive, judged.head.name), checked.manifest, bytes(tree),
                                    tensors, size, allow_pickle=self.allow_pickle,
                                    trusted_classes=self.trusted_classes, views=self._views)
            from skipweave.store.format.group import index

            manifest = grouped_manifest(judged, key, allow_pickle=self.allow_pickle)
            assert judged.group is not None
            cached = self._groups.get(names[0], self._archive.mtime_ns)
            if cached is None:  # a group's hits read and verify its data member once (while it stays cached)
                data = self._member(names[0], judged.group.data)
                section, spans = tensorfile.split_whole(data, path=names[0], limit=DATA_READ_MAX)
                cached = (section, index(spans, where(self._archive, judged.head.name)))
                self._groups.put(names[0], self._archive.mtime_ns, cached)
            section, by_call = cached
            if key.call not in by_call:
                raise EntryInvalid(f"group {where(self._archive, judged.head.name)} holds no tree for call {key.call}")
            tree_span, tensor_spans = by_call[key.call]
            tree_bytes = bytes(section[tree_span[0]:tree_span[1]])
            tensors = {n: tensorfile.tensor_at(section, sp) for n, sp in tensor_spans.items()}
            size = len(tree_bytes) + sum(t.numel() * t.element_size() for t in tensors.values())
            return decode_entry(f"{where(self._archive, judged.head.name)} (call {key.call})", manifest, tree_bytes,
                                tensors, size, allow_pickle=self.allow_pickle, trusted_classes=self.trusted_classes,
                                views=self._views)
        except BundleRefused as exc:
            raise EntryInvalid(str(exc)) from None

    def _mapped(self, name: str, item: dict[str, Any]) -> dict[str, Any] | None:
        """A large plain tensor member's tensors built on a private mapping of its bytes, with no copy (as a dump dir's
        large tensor file is read, :mod:`~skipweave.store.format.mapped`): the member verified first (read through,
        nothing kept), its header judged, then mapped. ``None`` when it is not to be mapped (compressed, deflated,
        small, on a file system that is not local, its tensors not aligned in the file, ``SKIPWEAVE_MAP_PAYLOADS=0``,
        or the mapping failed): the caller reads it into memory.

        Raises:
            EntryInvalid: the member is not its manifest's file, fails its checksum, or its header is malformed.
        """
        from skipweave.store.format import mapped, tensorfile
        from skipweave.store.format.safetensors_header import header_length

        member = self._archive.members[name]
        if member.offset is None or name.endswith(tensorfile.COMPRESSED_SUFFIX) \
                or not mapped.mappable(self._archive.fileno(), member.bytes):
            return None
        self._same_file(name, item)
        self._archive.check(name)
        path = where(self._archive, name)
        n = header_length(bytearray(self._archive.read_range(name, 0, 8)), path, room=member.bytes - 8)
        spans = tensorfile.header_spans(self._archive.read_range(name, 8, n), member.bytes - 8 - n, path)
        if not mapped.aligned(spans, member.offset + 8 + n):
            return None
        try:
            mapping, start = self._archive.map_member(name)
        except OSError as exc:  # a limit of this process (map count, address space): the entry is sound
            logger.debug("bundle member %s could not be mapped (%s): read into memory", path, exc)
            return None
        return mapped.tensors_on(mapping, start + 8 + n, spans)

    def _same_file(self, name: str, item: dict[str, Any]) -> None:
        member = self._archive.members[name]
        if member.bytes != item.get("bytes") or member.checksum != item.get("checksum"):
            raise EntryInvalid(f"{where(self._archive, name)} is not the file its manifest lists ({member.bytes} "
                               f"bytes, {member.checksum}; the manifest says {item.get('bytes')}, "
                               f"{item.get('checksum')})")

    def _member(self, name: str, item: dict[str, Any]) -> bytearray:
        """A payload member, checked against the bundle manifest (by :meth:`BundleArchive.read`) and the entry's
        manifest item (size and checksum)."""
        self._same_file(name, item)
        return self._archive.read(name)

    # ------------------------------------------------------------------ parts: nothing to prepare, open or close
    def prepare_part(self, step: int, target: str, shard: str, *, resumable: bool = False) -> None:
        return None

    def is_resumed(self, step: int, target: str, shard: str) -> bool:
        return False

    def resumed_calls(self, step: int, target: str, shard: str) -> frozenset[int]:
        return frozenset()

    def resumed_served(self, step: int, target: str, shard: str, call: int) -> None:
        return None

    def is_fresh(self, step: int, target: str, shard: str) -> bool:
        return False

    def set_aside(self, step: int, target: str, shard: str, *, reason: str,
                  unless: Callable[[], bool] | None = None) -> str | None:
        raise BundleReadOnly(f"{self.dump_dir} is a bundle: step {step} target {target} shard {shard} is not set "
                             f"aside ({reason}); it is never served")

    def discard(self, key: EntryKey, *, reason: str) -> None:
        raise BundleReadOnly(f"{self.dump_dir} is a bundle: entry {key} is not set aside ({reason}); it is never "
                             "served")

    def call_started(self, step: int, target: str, shard: str) -> int:
        return 0

    def call_ended(self, step: int, target: str, shard: str, *, failed: bool = False, number: int = 0) -> None:
        return None

    def close_part(self, step: int, target: str, shard: str) -> None:
        return None

    def close_all(self) -> None:
        return None

    # ------------------------------------------------------------------ writing: never
    def _read_only(self, what: str) -> BundleReadOnly:
        return BundleReadOnly(f"skipweave: role {self.role}: {self.dump_dir} is a bundle, read-only: {what} is not "
                              "possible (a role whose dump_dir is a bundle is replay-only; unpack it with `skipweave "
                              "unpack BUNDLE DUMP_DIR` to record into it)")

    def record(self, key: EntryKey, result: Any, *, target_path: str, fingerprint: str,
               rng_state: dict[str, Any] | None, seconds: float, replace: bool = False, concurrent: bool = False,
               effects: dict[str, Any] | None = None) -> int:
        raise self._read_only(f"recording {key}")

    def stage(self, result: Any, *, rng_state: dict[str, Any] | None, effects: dict[str, Any] | None = None,
              appended: dict[str, Any] | None = None) -> Staged:
        raise self._read_only("recording")

    def commit(self, key: EntryKey, staged: Staged, meta: EntryMeta) -> tuple[int, EntryKey]:
        raise self._read_only(f"recording {key}")

    def commit_many(self, items: list[Any]) -> list[tuple[int, EntryKey] | BaseException | None]:
        raise self._read_only("recording")

    def pending_add(self, key: EntryKey, future: concurrent.futures.Future[Any]) -> None:
        raise self._read_only(f"recording {key}")

    def pending_done(self, key: EntryKey) -> None:
        return None

    def wait_pending(self, step: int, target: str, shard: str, *, skip: Collection[int] = ()) -> None:
        return None

    def after_commit(self, steps: Collection[int], *, stop: Callable[[], bool] | None = None) -> list[StepRemoval]:
        return []

    def held_steps(self) -> set[int]:
        return set()

    def after_commit_soon(self, steps: Collection[int]) -> None:
        return None

    def final_round(self, timeout: float = 0.0) -> list[StepRemoval]:
        return []


def _ranges(steps: list[int]) -> str:
    """``1-3,7`` of sorted steps."""
    out: list[str] = []
    start = prev = None
    for s in steps:
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = s
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


_ARCHIVES: dict[tuple[str, int, int], BundleArchive] = {}
_ARCHIVES_LOCK = threading.Lock()


def shared_archive(path: str) -> BundleArchive:
    """The judged archive of ``path``, shared by every role of the process reading it while the file is unchanged
    (same inode, size and modification time).

    Raises:
        FileNotFoundError: no bundle there.
        BundleRefused: not a bundle skipweave reads.
    """
    path = os.path.abspath(path)
    st = os.stat(path)
    key = (path, st.st_ino, st.st_mtime_ns)
    with _ARCHIVES_LOCK:
        archive = _ARCHIVES.get(key)
        if archive is None:
            archive = _ARCHIVES[key] = BundleArchive(path)
        return archive


def open_role_store(dump_dir: str, namespace: str, role: str, **kwargs: Any) -> StepStore:
    """The store of a role: a :class:`BundleStore` when ``dump_dir`` names a bundle
    (:func:`~skipweave.store.bundle.layout.is_bundle_path`), else a :class:`StepStore`.

    Raises:
        FileNotFoundError: a bundle path with no file.
        BundleRefused: a bundle skipweave does not read.
        ValueError: ``namespace`` or ``role`` is not a single folder name.
    """
    if is_bundle_path(dump_dir):
        return BundleStore(dump_dir, namespace, role, archive=shared_archive(dump_dir), **kwargs)
    return StepStore(dump_dir, namespace, role, **kwargs)


__all__ = ["BundleReadOnly", "BundleStore", "open_role_store", "shared_archive"]
