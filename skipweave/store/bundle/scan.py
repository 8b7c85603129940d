"""A bundle judged entry by entry, as :func:`skipweave.store.scan.scan` judges a dump dir: what ``skipweave ls`` and
``skipweave verify`` read when given a bundle.

The result is a :class:`~skipweave.store.scan.DumpScan` (its ``dump_dir`` the bundle's path, each entry's ``path``
``BUNDLE/MEMBER``), so every command formats it as it formats a dump dir's. Each entry is judged by the dump dir's own
functions (:func:`~skipweave.store.bundle.contents.judge`); its payload items must be the bundle members the bundle
manifest lists, byte count and checksum alike. With ``checksums``, every member is read and checked against the bundle
manifest, and all of them against the bundle's checksum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from skipweave.store.bundle.archive import BundleArchive, BundleRefused
from skipweave.store.bundle.contents import BundlePart, Judged, contents, grouped_manifest, judge, orphans, where
from skipweave.store.errors import EntryForeign, EntryInvalid, EntryRefused
from skipweave.store.format.manifest import checksum_digest, new_hasher
from skipweave.store.scan import DumpScan, EntryScan, PartScan, Status
from skipweave.store.step_store import StepStore


@dataclasses.dataclass
class BundleScan(DumpScan):
    """A :class:`DumpScan` of a bundle; its :meth:`store` reads the bundle in place."""

    trusted_classes: tuple[str, ...] = ()

    def store(self, namespace: str, role: str, *, views: bool = False) -> StepStore:
        from skipweave.store.bundle.store import BundleStore, shared_archive

        return BundleStore(self.dump_dir, namespace, role, calls_per_step=self.calls_per_step,
                           allow_pickle=self.allow_pickle, views=views, archive=shared_archive(self.dump_dir))


def scan_bundle(path: str, *, checksums: bool = False, calls_per_step: int | None = None,
                allow_pickle: bool = False, progress: Callable[[int], Any] | None = None) -> BundleScan:
    """Judge every entry of a bundle (see the module docstring); ``progress`` is told the bytes of each chunk read
    when ``checksums`` (a bar's ``update``).

    Raises:
        FileNotFoundError: no file at ``path``.
        BundleRefused: the bundle is not one skipweave reads (naming the member and why), or, with ``checksums``, its
            members are whole but not those it was packed with.
    """
    with BundleArchive(path) as archive:
        damaged = _damaged(archive, progress) if checksums else {}
        result = BundleScan(archive.path, checksums=checksums, calls_per_step=calls_per_step,
                            allow_pickle=allow_pickle)
        parts = contents(archive)
        for name in orphans(archive, parts):
            result.ignored.append((where(archive, name), "a payload member no entry of the bundle names"))
        for bp in parts.values():
            result.parts.append(_part(archive, bp, damaged, allow_pickle, archive.mtime_ns / 1e9))
    return result


def _damaged(archive: BundleArchive, progress: Callable[[int], Any] | None) -> dict[str, str]:
    """Every member that fails its size or checksum, with why; the whole checked when none does."""
    bad: dict[str, str] = {}
    whole = new_hasher()

    def feed(chunk: memoryview | bytes) -> None:
        whole.update(chunk)
        if progress is not None:
            progress(len(chunk))

    for name in archive.members:
        try:
            archive.copy_to(name, feed)
        except BundleRefused as exc:
            bad[name] = str(exc)
    if not bad and checksum_digest(whole) != archive.manifest.get("checksum"):
        archive.verify()  # raises, naming the bundle
    return bad


def _part(archive: BundleArchive, bp: BundlePart, damaged: dict[str, str], allow_pickle: bool,
          mtime: float) -> PartScan:
    namespace, role, step, target, shard = bp.part
    entries: list[EntryScan] = []
    for head in bp.heads:
        calls = [c for c in range(head.first, head.last + 1) if bp.head_of(c) == head]
        judged: Judged | None = None
        reason: str | None = None
        foreign: EntryForeign | None = None
        try:
            judged = judge(archive, bp, head, allow_pickle=True)
        except EntryForeign as exc:
            foreign, reason = exc, str(exc)
        except (EntryInvalid, BundleRefused) as exc:
            reason = str(exc)
        files = [head.name, *(judged.payload_names() if judged is not None else ())]
        size = sum(archive.members[n].bytes for n in files if n in archive.members)
        if reason is None and judged is not None:
            reason = _payload_problem(archive, judged, damaged)
        for i, call in enumerate(calls):
            manifest: dict[str, Any] | None = None
            status = Status.FOREIGN if foreign is not None else Status.CORRUPT if reason else Status.COMPLETE
            why = reason
            if judged is not None:
                manifest = judged.manifest.manifest if judged.manifest is not None else \
                    judged.group.entries.get(call) if judged.group is not None else None
                if status is Status.COMPLETE:
                    try:
                        _pickle(judged, bp, call, allow_pickle)
                    except EntryRefused as exc:
                        status, why = Status.REFUSED, str(exc)
            share = size // len(calls) + (size % len(calls) if i == 0 else 0)
            entries.append(EntryScan(key=bp.key(call), path=where(archive, head.name), status=status, reason=why,
                                     files=[n.rsplit("/", 1)[1] for n in files], bytes=share, manifest=manifest,
                                     modified=mtime, foreign=foreign))
    entries.sort(key=lambda e: e.key.call)
    folder = where(archive, f"{namespace}/{role}/{step}/{target}")
    part_file = where(archive, bp.part_file) if bp.part_file is not None else None
    return PartScan(namespace=namespace, role=role, target=target, step=step, shard=shard, folder=folder,
                    entries=entries, closed=bp.part_file is not None, complete=bool(entries),
                    expected_calls=len(bp.calls), part_file=part_file, modified=mtime)


def _pickle(judged: Judged, bp: BundlePart, call: int, allow_pickle: bool) -> None:
    """Raise :class:`EntryRefused` when the entry holds pickled data and ``allow_pickle`` is off."""
    if judged.manifest is not None:
        from skipweave.store.format.manifest import check_pickle

        check_pickle(judged.manifest.manifest, judged.head.name, bp.key(call), allow_pickle=allow_pickle)
    else:
        grouped_manifest(judged, bp.key(call), allow_pickle=allow_pickle)


def _payload_problem(archive: BundleArchive, judged: Judged, damaged: dict[str, str]) -> str | None:
    """Why an entry's payload members are not what its manifest lists (or are damaged), ``None`` when they are."""
    items = ([judged.manifest.tree, judged.manifest.tensors] if judged.manifest is not None
             else [judged.group.data] if judged.group is not None else [])
    for name, item in zip(judged.payload_names(), items, strict=True):
        member = archive.members[name]
        if name in damaged:
            return damaged[name]
        if (member.bytes, member.checksum) != (item.get("bytes"), item.get("checksum")):
            return (f"{where(archive, name)} is not the file its manifest lists ({member.bytes} bytes, "
                    f"{member.checksum}; the manifest says {item.get('bytes')}, {item.get('checksum')})")
    if judged.head.name in damaged:
        return damaged[judged.head.name]
    return None


__all__ = ["BundleScan", "scan_bundle"]
