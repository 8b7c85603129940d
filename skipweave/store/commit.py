"""Committing entries atomically: payload under temporary names, fsynced, renamed; the manifest's rename last.

Part of :class:`~skipweave.store.step_store.StepStore`. Everything before the commit is written under temporary or
fresh names through the open target folder, so a failure (full disk, a folder moved away) removes every file it made,
wherever the folder went. Payload names carry a fresh token, so replacing an entry never touches the files an older
manifest points at. Writers of a part serialise on its lock (:func:`~skipweave.store.parts.part_lock`); the later
one keeps the committed entry. Several entries commit with one group sync (:meth:`Committer.commit_many`), the small
ones of a part as one group (:mod:`skipweave.store.format.group`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from dataclasses import dataclass
from typing import Any

from skipweave.store.atomic import sync_files, tmp_name_in
from skipweave.store.errors import EntryForeign, EntryInvalid, StoreMoved
from skipweave.store.folders import RoleFolders
from skipweave.store.format import jsonio
from skipweave.store.format.group import DATA_MAX_BYTES, ENTRY_MAX_BYTES, build_group, group_tensors
from skipweave.store.format.layout import (
    GROUP_SUFFIX,
    MAX_GROUP_CALLS,
    EntryKey,
    group_stem,
    manifest_path,
    parse_payload_name,
)
from skipweave.store.format.manifest import (
    PayloadFile,
    build_manifest,
    bytes_checksum,
    check_manifest,
    read_manifest,
    verify_payload,
)
from skipweave.store.fs import open_dir, remove_names, same_folder, write_new
from skipweave.store.identity import this_writer
from skipweave.store.index import PartIndex
from skipweave.store.parts import PartStates, part_lock
from skipweave.store.staging import EntryMeta, Item, Staged


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


class Committer:
    """Writes and commits the entries of one role.

    Args:
        folders: the role's folders.
        parts: the role's part index.
        states: the role's part states (told of every commit).
        compress: zstd level of new tensor files, or ``None``.
    """

    def __init__(self, folders: RoleFolders, parts: PartIndex, states: PartStates, *, compress: int | None) -> None:
        self._folders = folders
        self._parts = parts
        self._states = states
        self.compress = compress

    def commit(self, key: EntryKey, staged: Staged, meta: EntryMeta) -> tuple[int, EntryKey]:
        """Write and commit one staged entry (see :meth:`~skipweave.store.step_store.StepStore.commit`)."""
        self._folders.watch_root()
        folder = self._folders.folder(key.step, key.target, create=True)
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
            taken = self._parts.part_info(key.step, key.target, key.shard).calls
            key = dataclasses.replace(key, call=max([key.call, *taken]) + 1)  # the next free slot
        self._states.committed([key])
        if outcome is None:
            return 0, key
        nbytes, leftovers = outcome
        self._states.mark_recorded([key], {key: leftovers})
        return nbytes, key

    def commit_many(self, items: list[Item]) -> list[tuple[int, EntryKey] | BaseException | None]:
        """Commit several staged entries with one group sync (see
        :meth:`~skipweave.store.step_store.StepStore.commit_many`)."""
        self._folders.watch_root()
        results: list[tuple[int, EntryKey] | BaseException | None] = [None] * len(items)
        order = sorted(range(len(items)), key=lambda i: (items[i][0].step, items[i][0].target, items[i][0].stem))
        committed: list[EntryKey] = []
        leftovers: dict[EntryKey, list[str]] = {}
        fds: dict[str, int] = {}
        folders: dict[tuple[int, str], str] = {}  # (step, target) -> its checked folder, once per call of this
        locked: set[tuple[str, str]] = set()  # (folder, shard) of the part locks taken
        with contextlib.ExitStack() as locks:
            try:
                written: list[tuple[list[int], int, str, _Written]] = []
                parts: dict[tuple[str, str], list[int]] = {}  # (folder, shard) -> its items, in sorted order
                for i in order:
                    key = items[i][0]
                    try:
                        folder = folders.get((key.step, key.target)) or self._folders.folder(key.step, key.target,
                                                                                             create=True)
                        folders[(key.step, key.target)] = folder
                        if (folder, key.shard) not in locked:  # each part's lock once, in sorted order
                            locks.enter_context(part_lock(folder, key.shard))
                            locked.add((folder, key.shard))
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
                        remove_names(fd, w.made)
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
        self._states.committed([r[1] for r in results if isinstance(r, tuple)])
        self._states.mark_recorded(committed, leftovers)
        return results

    def _plan_groups(self, items: list[Item]) -> tuple[list[list[int]], list[int]]:
        """Split one part's items (the caller holds its lock) into groups of at least two small entries with
        contiguous free call indices (each within :data:`~skipweave.store.format.group.DATA_MAX_BYTES` and
        :data:`~skipweave.store.format.layout.MAX_GROUP_CALLS`) and the rest, written as single entries. Returns the
        groups and the singles as indices into ``items``."""
        key = items[0][0]
        taken = set(self._parts.part_info(key.step, key.target, key.shard).calls) if len(items) > 1 else set()
        small = sorted((i for i, (k, staged, meta) in enumerate(items)
                        if k.call not in taken and not meta.replace and staged.nbytes <= ENTRY_MAX_BYTES),
                       key=lambda i: items[i][0].call)
        groups: list[list[int]] = []
        run: list[int] = []
        size = 0
        for i in small:
            k, staged, _ = items[i]
            if run and (k.call != items[run[-1]][0].call + 1 or len(run) >= MAX_GROUP_CALLS
                        or size + staged.nbytes > DATA_MAX_BYTES):
                groups.append(run)
                run, size = [], 0
            run.append(i)
            size += staged.nbytes
        groups.append(run)
        groups = [g for g in groups if len(g) > 1]
        grouped = {i for g in groups for i in g}
        return groups, [i for i in range(len(items)) if i not in grouped]

    def _write(self, dir_fd: int, folder: str, key: EntryKey, staged: Staged, meta: EntryMeta, *,
               sync: bool) -> _Written | None:
        """Write one entry's payload and manifest under temporary names in the folder open as ``dir_fd`` (the
        caller holds the part's lock); each file is fsynced when ``sync``, else the caller syncs them.

        Returns ``None`` when a valid entry is already committed there (and ``meta.replace`` is off). A failure
        removes every file it made.
        """
        final_manifest = manifest_path(self._folders.dump_dir, key)
        manifest_name = os.path.basename(final_manifest)
        old: dict[str, Any] | None = None
        if os.path.lexists(final_manifest):
            try:
                old = read_manifest(final_manifest)
                if not meta.replace:
                    check_manifest(old, final_manifest, key, allow_pickle=True)
                    verify_payload(folder, old, checksums=False)
                    return None
            except EntryForeign:  # a newer skipweave's entry: never written over, not even by ``replace``
                return None
            except (EntryInvalid, FileNotFoundError):
                old = None
        elif (held := self._group_holds(folder, key)) is not None and (held == "foreign" or not meta.replace):
            return None
        token = uuid.uuid4().hex[:8]
        tree_name = f"{key.stem}.{token}.tree.json"
        made: list[str] = []  # names in the folder this write created, removed if it does not commit
        try:
            tmp_tree = tmp_name_in(folder, tree_name)
            made.append(tmp_tree)
            write_new(dir_fd, tmp_tree, staged.tree, sync=sync)
            desc = None if meta.background else f"skipweave: recording {self._folders.role} step {key.step}"
            tmp_tensors, tensor_name, tensor_bytes, tensor_sum = self._write_tensors(
                dir_fd, folder, f"{key.stem}.{token}.tensors.safetensors", staged.tensors, made, desc=desc, sync=sync)
            files = [
                PayloadFile(tree_name, len(staged.tree), bytes_checksum(staged.tree)),
                PayloadFile(tensor_name, tensor_bytes, tensor_sum),
            ]
            manifest = build_manifest(
                role=self._folders.role, target=key.target, target_path=meta.target_path, step=key.step,
                call=key.call, shard=key.shard, fingerprint=meta.fingerprint, files=files, pickled=staged.pickled,
                seconds=meta.seconds, concurrent=meta.concurrent, environment=meta.environment,
                returned=meta.returned,
                fingerprint_rule=meta.fingerprint_rule,
            )
            tmp_manifest = tmp_name_in(folder, manifest_name)
            made.append(tmp_manifest)
            write_new(dir_fd, tmp_manifest, jsonio.dumps_spaced(manifest, indent=1), sync=sync)
        except BaseException:
            remove_names(dir_fd, made)
            raise
        return _Written(key, made, [(tmp_tree, tree_name), (tmp_tensors, tensor_name)], (tmp_manifest, manifest_name),
                        files, old)

    def _write_tensors(self, dir_fd: int, folder: str, plain_name: str, tensors: dict[str, Any], made: list[str], *,
                       desc: str | None, sync: bool) -> tuple[str, str, int, str]:
        """Write a tensor file (compressed with ``compress``, plainly when it compresses too well for a reader)
        under a temporary name, appended to ``made``; return ``(temporary, final name, bytes, checksum)``."""
        from skipweave.store.format import tensorfile

        compress = self.compress
        while True:  # safetensors bytes streamed from the tensors' memory, checksummed on that memory
            final = plain_name + ("" if compress is None else tensorfile.COMPRESSED_SUFFIX)
            tmp = tmp_name_in(folder, final)
            made.append(tmp)
            try:
                nbytes, checksum = tensorfile.write(tmp, tensors, desc=desc, dir_fd=dir_fd, sync=sync,
                                                    compress=compress)
                return tmp, final, nbytes, checksum
            except tensorfile.TooCompressible:  # (all zeros, say) a reader would refuse it: plainly instead
                remove_names(dir_fd, [made.pop()])
                compress = None

    def _group_holds(self, folder: str, key: EntryKey) -> str | None:
        """``"sound"`` when a group file holds ``key``'s call and is sound (its data file checked by size): the slot
        is taken; ``"foreign"`` when the group file holding it is of a format version this skipweave does not read:
        the slot is never written, not even by ``replace``; ``None`` when the slot is free. A call claimed by two
        group files, or by an unsound one, counts as free (its own manifest, written next, is what serves it)."""
        try:
            group = self._parts.covering(key)
            if group is None:
                return None
            checked, _ = self._parts.open_group(key, *group)
            verify_payload(folder, {"payload": [checked.data]}, checksums=False)
        except EntryForeign:
            return "foreign"
        except (EntryInvalid, OSError):
            return None
        return "sound"

    def _write_group(self, dir_fd: int, folder: str, items: list[Item], *, sync: bool) -> _Written:
        """Write the entries of calls ``first..last`` of one part (contiguous, in order, slots free) as one group: its
        data file and its group file, under temporary names (see :mod:`skipweave.store.format.group`). A failure removes
        every file it made."""
        keys = [k for k, _, _ in items]
        first, last = keys[0].call, keys[-1].call
        stem = group_stem(keys[0].shard, first, last)
        made: list[str] = []
        try:
            tensors = group_tensors([(k.call, staged.tree, staged.tensors) for k, staged, _ in items])
            tmp_data, data_name, data_bytes, data_sum = self._write_tensors(
                dir_fd, folder, f"{stem}.{uuid.uuid4().hex[:8]}.pack.safetensors", tensors, made, desc=None, sync=sync)
            data = PayloadFile(data_name, data_bytes, data_sum)
            writer = this_writer().as_manifest()  # once for the group: one process wrote every entry of it
            role = self._folders.role
            manifests = [build_manifest(
                role=role, target=k.target, target_path=meta.target_path, step=k.step, call=k.call,
                shard=k.shard, fingerprint=meta.fingerprint, files=[data], pickled=staged.pickled,
                seconds=meta.seconds, concurrent=meta.concurrent, writer=writer, environment=meta.environment,
                returned=meta.returned,
                fingerprint_rule=meta.fingerprint_rule,
            ) for k, staged, meta in items]
            group = build_group(role=role, target=keys[0].target, step=keys[0].step, shard=keys[0].shard,
                                first=first, last=last, data=data, entries=manifests)
            tmp_group = tmp_name_in(folder, stem + GROUP_SUFFIX)
            made.append(tmp_group)
            write_new(dir_fd, tmp_group, jsonio.dumps(group), sync=sync)
        except BaseException:
            remove_names(dir_fd, made)
            raise
        return _Written(keys[0], made, [(tmp_data, data_name)], (tmp_group, stem + GROUP_SUFFIX), [data], None,
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
            remove_names(dir_fd, made)
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


__all__ = ["Committer", "Item"]  # Item: defined in staging, kept here for its importers
