"""``skipweave unpack``: a bundle's entries into a dump dir, each committed as a run commits one.

The bundle is judged whole and every member read and checked (sizes, checksums, the checksum of the whole) before
anything is written. Then, part by part, under the part's lock (:func:`~skipweave.store.parts.part_lock`, the lock
every writer of a part takes):

- a part the dump dir already holds byte for byte (every file of the bundle's part is there with the same bytes) is
  skipped; a part the dump dir holds anything else of (another entry, group or payload of that shard) is refused, and
  nothing of that part is written: an unpack never replaces what a run recorded;
- otherwise each entry is written as a run commits one: its payload files under temporary names, synced and renamed,
  then its manifest (or group file), whose rename is the entry's commit; the part file last.

Every folder is made below the dump dir through :func:`~skipweave.store.fs.inside` (no symlink followed) and every
file created with ``O_EXCL | O_NOFOLLOW`` in its folder: nothing is written outside the dump dir.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skipweave.store.atomic import fsync_dir, tmp_name_in
from skipweave.store.bundle.archive import BundleArchive, BundleRefused
from skipweave.store.bundle.contents import BundlePart, check_whole_entries, contents, judge
from skipweave.store.errors import EntryForeign, EntryInvalid
from skipweave.store.format.layout import touch_role
from skipweave.store.fs import inside, open_dir, open_new, open_regular, remove_names
from skipweave.store.parts import part_lock


class UnpackConflict(Exception):
    """The dump dir already holds something else at a part of the bundle: nothing of that part was written."""


@dataclass
class UnpackResult:
    """What :func:`unpack` did: parts written, parts already there, bytes written, wall time."""

    written: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0


def _label(bp: BundlePart) -> str:
    namespace, role, step, target, shard = bp.part
    return f"{namespace}/{role} {target} step {step} shard {shard}"


def unpack(bundle: str, dump_dir: str, *, progress: Callable[[int], Any] | None = None) -> UnpackResult:
    """Write every part of ``bundle`` into ``dump_dir`` (see the module docstring).

    Args:
        bundle: the bundle file.
        dump_dir: the dump dir (made when missing).
        progress: called with each chunk's size while the bundle is verified (a bar's ``update``).

    Returns:
        The :class:`UnpackResult`.

    Raises:
        FileNotFoundError: no bundle.
        BundleRefused: the bundle is not one skipweave reads, or a member fails its checks (nothing is written).
        UnpackConflict: a part the dump dir holds other files of (the parts before it are written, it and the
            parts after it are not).
        UnsafePath: a folder of the dump dir on the way is a symlink or a file.
        OSError: a write failed (the entry being written leaves no file behind).
    """
    started = time.monotonic()
    result = UnpackResult()
    with BundleArchive(bundle) as archive:
        archive.verify(progress)
        parts = contents(archive)
        check_whole_entries(archive, parts)
        plans = []
        for bp in parts.values():
            entries = []
            for head in bp.heads:
                try:
                    judged = judge(archive, bp, head, allow_pickle=True)
                except EntryForeign as exc:
                    raise BundleRefused(f"member {head.name!r} of bundle {archive.path} is foreign ({exc}); unpack "
                                        "it with the skipweave that reads its version") from None
                except EntryInvalid as exc:
                    raise BundleRefused(f"member {head.name!r} of bundle {archive.path} is no valid entry ({exc}); "
                                        "nothing of the bundle is written") from None
                entries.append((head.name, judged.payload_names()))
            plans.append((bp, entries))
        os.makedirs(dump_dir, exist_ok=True)
        for bp, entries in plans:
            namespace, role, step, target, shard = bp.part
            folder = inside(dump_dir, namespace, role, str(step), target, create=True)
            names = [n for head_name, payloads in entries for n in [*payloads, head_name]]
            if bp.part_file is not None:
                names.append(bp.part_file)
            with part_lock(folder, shard):
                state = _state(archive, folder, shard, names)
                if state == "present":
                    result.present.append(_label(bp))
                    continue
                if state is not None:
                    raise UnpackConflict(f"skipweave unpack: {_label(bp)}: {folder} already holds {state}; unpack "
                                         "never replaces what is there (remove the part, or unpack into another "
                                         f"dump dir); {len(result.written)} part(s) before it were written")
                for head_name, payloads in entries:
                    result.bytes += _commit(archive, folder, [*payloads, head_name])
                if bp.part_file is not None:
                    result.bytes += _commit(archive, folder, [bp.part_file])
            touch_role(dump_dir, namespace, role)
            result.written.append(_label(bp))
    result.seconds = time.monotonic() - started
    return result


def _state(archive: BundleArchive, folder: str, shard: str, names: list[str]) -> str | None:
    """``None`` when the folder holds nothing of the part's shard, ``"present"`` when it holds exactly the bundle's
    files of it with the same bytes, else what it holds (for the message)."""
    from skipweave.store.bundle.contents import where

    prefix = (f"{shard}-", f"{shard}.")
    theirs = {n for n in os.listdir(folder) if n.startswith(prefix) and not n.startswith(".")}
    if not theirs:
        return None
    mine = {n.rsplit("/", 1)[1]: n for n in names}
    if theirs != set(mine):
        extra = sorted(theirs - set(mine)) or sorted(set(mine) - theirs)
        return f"other files of shard {shard} ({', '.join(extra[:3])})"
    for file, name in mine.items():
        if file.endswith(".part.json"):
            continue  # (a part file says closed or open: its bytes carry a time)
        member = archive.members[name]
        try:
            with open(open_regular(os.path.join(folder, file)), "rb") as fh:
                same = os.fstat(fh.fileno()).st_size == member.bytes and _checksum(fh) == member.checksum
        except OSError:
            same = False
        if not same:
            return f"a different {file} than {where(archive, name)}"
    return "present"


def _checksum(fh: Any) -> str:
    from skipweave.store.format.manifest import checksum_digest, new_hasher

    hasher = new_hasher()
    while chunk := fh.read(8 << 20):
        hasher.update(chunk)
    return checksum_digest(hasher)


def _commit(archive: BundleArchive, folder: str, names: list[str]) -> int:
    """Write members into ``folder`` as one commit: each under a temporary name, synced, then renamed in order (the
    last, a manifest or group file, is the commit). Returns the bytes written; leaves no file when it fails."""
    dir_fd = open_dir(folder)
    made: list[str] = []
    try:
        staged = []
        total = 0
        for name in names:
            final = name.rsplit("/", 1)[1]
            tmp = tmp_name_in(folder, final)
            fd = open_new(tmp, dir_fd=dir_fd)
            made.append(tmp)
            try:
                def write(chunk: memoryview | bytes, fd: int = fd) -> None:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                archive.copy_to(name, write)
                os.fsync(fd)
            finally:
                os.close(fd)
            staged.append((tmp, final))
            total += archive.members[name].bytes
        for tmp, final in staged:
            os.rename(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            made.remove(tmp)
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
        return total
    except BaseException:
        remove_names(dir_fd, made)
        raise
    finally:
        os.close(dir_fd)
        fsync_dir(folder)


__all__ = ["UnpackConflict", "UnpackResult", "unpack"]
