"""``skipweave pack``: the complete parts of a dump dir into one bundle file.

A part goes into a bundle whole, and only when a run would serve it (complete, every entry valid; pickled entries
included: the role that replays them decides, as it does for a dump dir). Every payload file is hashed while it is
copied and compared with its manifest, so a bundle never carries bytes its entries do not vouch for. What is left
out is listed in the bundle manifest's ``left_out`` with the reason:

- parts that are incomplete, corrupt, or hold an entry of another format version (*foreign*: written by a skipweave
  that this one cannot judge; a bundle promises that the skipweave that packed it judged every entry complete and
  verified it, so a foreign part is left out with a note, and a newer skipweave packs it);
- everything that is no entry: set-aside parts, temporary files, the ``.runs`` marks.

The bundle is written under a temporary name beside its final one, synced, and renamed into place: a bundle at the
final name is always whole.
"""

from __future__ import annotations

import logging
import os
import platform
import struct
import time
import zipfile
from collections.abc import Callable, Collection, Container
from dataclasses import dataclass, field
from typing import Any

from skipweave.store.atomic import fsync_dir, tmp_name
from skipweave.store.bundle.layout import (
    BUNDLE_KIND,
    BUNDLE_VERSION,
    COMMENT_PREFIX,
    MANIFEST_NAME,
    member_name,
)
from skipweave.store.format import jsonio, versions
from skipweave.store.format.layout import PART_SUFFIX
from skipweave.store.format.manifest import bytes_checksum, checksum_digest, new_hasher
from skipweave.store.fs import open_regular
from skipweave.store.scan import PartScan, Status, scan
from skipweave.version import __version__

logger = logging.getLogger(__name__)

CHUNK = 8 << 20

CONFIG_NOTE = ("the dump dir keeps no resolved config of the role (step source, compare rules): only what each entry's "
               "manifest says (its target's path, environment, fingerprint rule)")
"""Why a bundle's roles carry ``config: null``: a dump dir keeps nothing of the config but what entries record."""


class PackError(Exception):
    """Nothing could be packed, or a file changed or failed its checksum while it was copied (no bundle is left)."""


@dataclass
class PackResult:
    """What :func:`pack` wrote.

    Attributes:
        path: the bundle file.
        bytes: its size.
        parts: the parts packed, as ``namespace/role target step shard`` labels.
        entries: the entries packed.
        members: the members written (the bundle manifest included).
        left_out: ``{where, reason}`` of each part left out.
        seconds: wall time of the pack.
    """

    path: str
    bytes: int
    parts: list[str] = field(default_factory=list)
    entries: int = 0
    members: int = 0
    left_out: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _steps_doc(steps: Container[int] | None) -> Any:
    """The steps selected, as the bundle manifest records them (a step set as ``skip.<role>.steps`` writes it)."""
    if steps is None:
        return None
    to_config = getattr(steps, "to_config", None)
    return to_config() if callable(to_config) else sorted(steps)  # type: ignore[call-overload]


def _selected(part: PartScan, namespaces: Collection[str] | None, roles: Collection[str] | None,
              steps: Container[int] | None) -> bool:
    return not ((namespaces and part.namespace not in namespaces) or (roles and part.role not in roles)
                or (steps is not None and part.step not in steps))


def _why_left_out(part: PartScan) -> str | None:
    """Why a part cannot go into a bundle, ``None`` when it can."""
    if part.holds_foreign:
        entry = next(e for e in part.entries if e.status is Status.FOREIGN)
        return (f"foreign: {entry.reason} (a bundle carries only entries the skipweave packing it can judge; pack it "
                "with that newer skipweave)")
    status = part.status
    if status in (Status.COMPLETE, Status.REFUSED):  # refused: pickled, valid; the replaying role decides
        return None
    if status is Status.CORRUPT:
        bad = next(e for e in part.entries if e.status is Status.CORRUPT)
        return f"corrupt: {bad.reason}"
    return f"incomplete: {part.incomplete_reason}"


def pack(dump_dir: str, out: str, *, namespaces: Collection[str] | None = None, roles: Collection[str] | None = None,
         steps: Container[int] | None = None, progress: Callable[[int, int], Callable[[int], Any]] | None = None
         ) -> PackResult:
    """Write the complete parts of ``dump_dir`` (those selected) into the bundle ``out``.

    Args:
        dump_dir: the dump dir.
        out: the bundle file to write (ends with ``.zip``); an existing file there is replaced only once the new bundle
            is whole.
        namespaces, roles, steps: only these (``None``: all).
        progress: ``progress(total_bytes, members)`` returns a function called with each chunk's size (a bar's
            ``update``), or ``None``.

    Returns:
        The :class:`PackResult`.

    Raises:
        FileNotFoundError, NotADirectoryError: ``dump_dir`` is not a folder.
        PackError: no part selected could be packed, or a payload file changed or failed its checksum while copied.
        OSError: the bundle could not be written (nothing is left at ``out``'s temporary name).
    """
    started = time.monotonic()
    result = scan(dump_dir, checksums=False, allow_pickle=True)
    chosen: list[PartScan] = []
    left: list[dict[str, Any]] = []
    for part in result.parts:
        if not _selected(part, namespaces, roles, steps):
            continue
        why = _why_left_out(part)
        if why is None:
            chosen.append(part)
        else:
            left.append({"namespace": part.namespace, "role": part.role, "target": part.target, "step": part.step,
                         "shard": part.shard, "reason": why})
            logger.info("skipweave pack: %s left out: %s", part.where, why)
    if not chosen:
        raise PackError(f"no complete part of {result.dump_dir} is selected"
                        + (f" ({len(left)} left out: {left[0]['reason']})" if left else ""))
    files = _files_of(chosen)
    total = sum(os.lstat(path).st_size for _name, path, _item in files if path is not None)
    update = progress(total, len(files)) if progress is not None else None
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tmp_name(os.path.dirname(out) or ".", os.path.basename(out))
    try:
        members, whole = _write(tmp, files, chosen, update)
        doc = _bundle_manifest(result.dump_dir, chosen, members, whole, left,
                               {"namespaces": sorted(namespaces) if namespaces else None,
                                "roles": sorted(roles) if roles else None,
                                "steps": _steps_doc(steps)})
        data = jsonio.dumps_spaced(doc, indent=1)
        with zipfile.ZipFile(tmp, "a", allowZip64=True) as zf:
            zf.writestr(_info(MANIFEST_NAME, time.time()), data)
            zf.comment = (COMMENT_PREFIX + bytes_checksum(data)).encode("ascii")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(os.path.dirname(out))
    return PackResult(out, os.path.getsize(out), [p.where for p in chosen],
                      sum(len(p.entries) for p in chosen), len(members) + 1, left, time.monotonic() - started)


_File = tuple[str, str | None, dict[str, Any] | None]
"""A file to pack: ``(member name, its path in the dump dir or None for a part file made here, the manifest item it
must match or None)``."""


def _files_of(parts: list[PartScan]) -> list[_File]:
    """Every member of the chosen parts, in order: per part, each entry's manifest (or group file) and payload files,
    then its part file."""
    out: list[_File] = []
    for part in parts:
        seen: set[str] = set()
        for entry in part.entries:
            manifest = entry.manifest or {}
            items = {i["name"]: i for i in manifest.get("payload", []) if isinstance(i, dict)
                     and isinstance(i.get("name"), str)}
            for name in entry.files:
                if name in seen:
                    continue  # a group's files, shared by its entries
                seen.add(name)
                out.append((member_name(part.namespace, part.role, part.step, part.target, name),
                            os.path.join(part.folder, name), items.get(name)))
        # its own part file when its writer closed it (carried byte for byte), else one made here saying closed: the
        # packer judged the part complete (by its calls), and an unpacked part must not read as an interrupted one
        out.append((member_name(part.namespace, part.role, part.step, part.target, part.shard + PART_SUFFIX),
                    part.part_file if part.closed else None, None))
    return out


def _info(name: str, mtime: float) -> zipfile.ZipInfo:
    """A stored, regular-file (0644) member."""
    info = zipfile.ZipInfo(name, time.localtime(max(mtime, 315532800.0))[:6])  # (zip dates start in 1980)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # unix: the mode below is read
    info.external_attr = (0o100644 & 0xFFFF) << 16
    return info


ALIGN = 64
"""Every copied member's data starts at a multiple of this many bytes in the bundle, so a plain tensor file's tensors
(aligned within it) are aligned in the bundle too, and a replay can build them on a mapping of it (Android's
``zipalign`` does the same, with the same padding field)."""

_PADDING_ID = 0xD935  # the extra field zipalign pads with; readers skip extra fields they do not know


def _align(info: zipfile.ZipInfo, zf: zipfile.ZipFile, force_zip64: bool) -> None:
    """Give ``info`` an extra field that pads its local header so the member's data starts at a multiple of
    :data:`ALIGN` (the header is written at the archive's current end: zipfile writes members one after another)."""
    assert zf.fp is not None
    zip64 = force_zip64 or info.file_size * 1.05 > zipfile.ZIP64_LIMIT  # zipfile's own rule: a 20-byte zip64 field
    start = zf.fp.tell() + 30 + len(info.filename.encode("ascii")) + (20 if zip64 else 0) + 4
    pad = -start % ALIGN
    info.extra = struct.pack("<HH", _PADDING_ID, pad) + bytes(pad)


def _part_file(part: PartScan) -> bytes:
    """The part file a bundle carries: closed (the packer judged it complete), with its calls."""
    return jsonio.dumps_spaced({"state": "closed", "calls": len(part.entries),
                                "updated_unix": part.modified, "pid": 0})


def _write(tmp: str, files: list[_File], parts: list[PartScan],
           update: Callable[[int], Any] | None) -> tuple[list[dict[str, Any]], str]:
    """Write every member to ``tmp``; return the members' ``{name, bytes, checksum}`` and the checksum of them all."""
    by_part = {member_name(p.namespace, p.role, p.step, p.target, p.shard + PART_SUFFIX): p for p in parts}
    whole = new_hasher()
    members: list[dict[str, Any]] = []
    with zipfile.ZipFile(tmp, "x", allowZip64=True) as zf:
        for name, path, item in files:
            if path is None:
                data = _part_file(by_part[name])
                zf.writestr(_info(name, time.time()), data)
                whole.update(data)
                members.append({"name": name, "bytes": len(data), "checksum": bytes_checksum(data)})
                continue
            fd = open_regular(path)
            with open(fd, "rb", buffering=0) as src:
                st = os.fstat(src.fileno())
                info = _info(name, st.st_mtime)
                info.file_size = st.st_size
                force = st.st_size > (1 << 31)
                _align(info, zf, force)
                hasher = new_hasher()
                got = 0
                with zf.open(info, "w", force_zip64=force) as dst:
                    while chunk := src.read(CHUNK):
                        hasher.update(chunk)
                        whole.update(chunk)
                        dst.write(chunk)
                        got += len(chunk)
                        if update is not None:
                            update(len(chunk))
            checksum = checksum_digest(hasher)
            if got != st.st_size or (item is not None and (got != item.get("bytes")
                                                           or checksum != item.get("checksum"))):
                raise PackError(f"{path} changed or does not match its manifest ({got} bytes, {checksum}) while it "
                                "was packed; `skipweave verify` the dump dir, then pack again")
            members.append({"name": name, "bytes": got, "checksum": checksum})
    return members, checksum_digest(whole)


def _bundle_manifest(dump_dir: str, parts: list[PartScan], members: list[dict[str, Any]], whole: str,
                     left: list[dict[str, Any]], selection: dict[str, Any]) -> dict[str, Any]:
    roles: dict[tuple[str, str], dict[str, Any]] = {}
    seen_versions: set[int] = set()
    for part in parts:
        role = roles.setdefault((part.namespace, part.role), {
            "namespace": part.namespace, "role": part.role, "targets": {}, "config": None, "config_note": CONFIG_NOTE})
        target = role["targets"].setdefault(part.target, {"target_paths": [], "steps": [], "entries": 0})
        for entry in part.entries:
            manifest = entry.manifest or {}
            path = manifest.get("target_path")
            if isinstance(path, str) and path not in target["target_paths"]:
                target["target_paths"].append(path)
            if type(manifest.get("format_version")) is int:
                seen_versions.add(manifest["format_version"])
        if part.step not in target["steps"]:
            target["steps"].append(part.step)
        target["entries"] += len(part.entries)
    now = time.time()
    return {
        "kind": BUNDLE_KIND, "bundle_version": BUNDLE_VERSION, "skipweave_version": __version__,
        "format_versions": {"entries": sorted(seen_versions), "packer_reads": sorted(versions.READABLE)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)), "created_unix": now,
        "source": {"dump_dir": dump_dir, "host": platform.node()},
        "selection": selection,
        "roles": list(roles.values()),
        "parts": [{"namespace": p.namespace, "role": p.role, "target": p.target, "step": p.step, "shard": p.shard,
                   "calls": [e.key.call for e in p.entries], "bytes": p.bytes} for p in parts],
        "left_out": left,
        "totals": {"parts": len(parts), "entries": sum(len(p.entries) for p in parts), "members": len(members),
                   "bytes": sum(m["bytes"] for m in members)},
        "members": members,
        "checksum": whole,
    }


__all__ = ["CONFIG_NOTE", "PackError", "PackResult", "pack"]
