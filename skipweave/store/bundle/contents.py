"""What a judged bundle holds: its parts and their entries, each entry judged as a run judges one in a dump dir.

:func:`contents` groups an archive's members by part (namespace, role, step, target, shard) and entry: a *head*
(a manifest, or a group file of small entries) with the payload members it names. A member no head names is refused
(a bundle holds whole entries only). :func:`judge` reads one head and judges it with the dump dir's own functions
(:func:`~skipweave.store.format.manifest.check_manifest`, :func:`~skipweave.store.format.group.check_group`), so a
bundle and a dump dir are never judged apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skipweave.store.bundle.archive import BundleArchive, BundleRefused
from skipweave.store.bundle.layout import file_kind, split_member
from skipweave.store.errors import EntryForeign, EntryInvalid
from skipweave.store.format import jsonio
from skipweave.store.format.group import GROUP_KIND, GROUP_MAX_BYTES, CheckedGroup, check_group, entry_of
from skipweave.store.format.layout import (
    PART_SUFFIX,
    EntryKey,
    parse_group_data_name,
    parse_group_name,
    parse_manifest_name,
    parse_payload_name,
)
from skipweave.store.format.manifest import MANIFEST_MAX_BYTES, CheckedManifest, check_manifest, check_structure
from skipweave.store.format.versions import version_of

Part = tuple[str, str, int, str, str]
"""A part of a bundle: ``(namespace, role, step, target, shard)``."""


@dataclass(frozen=True)
class Head:
    """An entry (a manifest) or a group of small entries (a group file) of a bundle, with its payload members.

    Attributes:
        name: the manifest's or group file's member name.
        kind: ``manifest`` or ``group``.
        first, last: the calls it holds (one call for a manifest).
    """

    name: str
    kind: str
    first: int
    last: int

    @property
    def file(self) -> str:
        """The file name (no folders)."""
        return self.name.rsplit("/", 1)[1]


@dataclass
class BundlePart:
    """One part of a bundle: its heads (by first call), payload members and part file."""

    part: Part
    heads: list[Head] = field(default_factory=list)
    payloads: list[str] = field(default_factory=list)
    part_file: str | None = None

    @property
    def calls(self) -> tuple[int, ...]:
        """Every call a head of the part holds, sorted."""
        return tuple(sorted({c for h in self.heads for c in range(h.first, h.last + 1)}))

    def head_of(self, call: int) -> Head | None:
        """The head holding ``call``: its own manifest first (as in a dump dir), else the one group claiming it."""
        own = [h for h in self.heads if h.kind == "manifest" and h.first == call]
        if own:
            return own[0]
        grouped = [h for h in self.heads if h.kind == "group" and h.first <= call <= h.last]
        return grouped[0] if len(grouped) == 1 else None

    def key(self, call: int) -> EntryKey:
        namespace, role, step, target, shard = self.part
        return EntryKey(namespace, role, step, target, shard, call)


def _shard_of(file: str, kind: str) -> str:
    if kind == "manifest":
        parsed = parse_manifest_name(file)
        assert parsed is not None
        return parsed[0]
    if kind == "payload":
        payload = parse_payload_name(file)
        assert payload is not None
        return payload[0].rsplit("-", 1)[0]
    if kind == "group":
        grouped = parse_group_name(file)
        assert grouped is not None
        return grouped[0]
    if kind == "group_data":
        stem = parse_group_data_name(file)
        assert stem is not None
        return stem.rsplit("-", 2)[0]
    return file[: -len(PART_SUFFIX)]


def contents(archive: BundleArchive) -> dict[Part, BundlePart]:
    """The parts of a judged archive, in the order the bundle manifest lists their members.

    Raises:
        BundleRefused: two part files for one part (cannot happen: names are unique), or a head claims calls another
            head of its part claims too.
    """
    parts: dict[Part, BundlePart] = {}
    for name in archive.members:
        namespace, role, step, target, file = split_member(name)
        kind = file_kind(file)
        assert kind is not None  # the archive judged every name
        part = (namespace, role, step, target, _shard_of(file, kind))
        bp = parts.setdefault(part, BundlePart(part))
        if kind == "manifest":
            call = parse_manifest_name(file)[1]  # type: ignore[index]
            bp.heads.append(Head(name, "manifest", call, call))
        elif kind == "group":
            _, first, last = parse_group_name(file)  # type: ignore[misc]
            bp.heads.append(Head(name, "group", first, last))
        elif kind == "part":
            bp.part_file = name
        else:
            bp.payloads.append(name)
    for bp in parts.values():
        bp.heads.sort(key=lambda h: (h.first, h.kind != "manifest"))
    return parts


def read_json(archive: BundleArchive, name: str, limit: int) -> Any:
    """A JSON member of at most ``limit`` bytes, verified.

    Raises:
        EntryInvalid: too large or not JSON.
        BundleRefused: the member fails its checksum.
    """
    member = archive.members[name]
    if member.bytes > limit:
        raise EntryInvalid(f"{where(archive, name)} has {member.bytes} bytes, more than {limit}")
    try:
        return jsonio.loads(archive.read(name))
    except (ValueError, RecursionError) as exc:
        raise EntryInvalid(f"{where(archive, name)} is unreadable: {exc}") from exc


def where(archive: BundleArchive, name: str) -> str:
    """How messages name a member: ``BUNDLE/MEMBER``."""
    return f"{archive.path}/{name}"


@dataclass(frozen=True)
class Judged:
    """A head judged: a manifest's :class:`CheckedManifest`, or a group's :class:`CheckedGroup`."""

    head: Head
    manifest: CheckedManifest | None = None
    group: CheckedGroup | None = None

    def payload_names(self) -> list[str]:
        """The member names of its payload files (in its folder)."""
        folder = self.head.name.rsplit("/", 1)[0]
        if self.manifest is not None:
            return [f"{folder}/{self.manifest.tree['name']}", f"{folder}/{self.manifest.tensors['name']}"]
        assert self.group is not None
        return [f"{folder}/{self.group.data['name']}"]


def judge(archive: BundleArchive, bp: BundlePart, head: Head, *, allow_pickle: bool) -> Judged:
    """Read and judge one head as a run judges it in a dump dir (its payload members must be in the bundle; their
    bytes are checked when read).

    Raises:
        EntryForeign: the head is of a format version this skipweave does not read.
        EntryRefused: a manifest holding pickled data, and ``allow_pickle`` is off (a group's entries are judged per
            call, by :func:`~skipweave.store.format.group.entry_of`).
        EntryInvalid: anything else, named.
        BundleRefused: a member fails its checksum.
    """
    path = where(archive, head.name)
    key = bp.key(head.first)
    if head.kind == "manifest":
        data = read_json(archive, head.name, MANIFEST_MAX_BYTES)
        judged = Judged(head, manifest=check_manifest(check_structure(data, path), path, key,
                                                      allow_pickle=allow_pickle))
    else:
        data = read_json(archive, head.name, GROUP_MAX_BYTES)
        version_of(data, path, "group")
        if not isinstance(data, dict) or data.get("kind") != GROUP_KIND:
            raise EntryInvalid(f"group {path} is not a group file")
        judged = Judged(head, group=check_group(data, path, key, head.first, head.last))
    for name in judged.payload_names():
        if name not in archive.members:
            raise EntryInvalid(f"{path} names a payload file {name.rsplit('/', 1)[1]!r} the bundle does not hold")
    return judged


def grouped_manifest(judged: Judged, key: EntryKey, *, allow_pickle: bool) -> dict[str, Any]:
    """The manifest of ``key``'s call in a judged group (pickle judged against ``allow_pickle``)."""
    assert judged.group is not None
    return entry_of(judged.group, key, allow_pickle=allow_pickle)


def orphans(archive: BundleArchive, parts: dict[Part, BundlePart]) -> list[str]:
    """Payload members no head of their part names (judged heads only; a head that cannot be read names none)."""
    named: set[str] = set()
    for bp in parts.values():
        for head in bp.heads:
            try:
                named.update(judge(archive, bp, head, allow_pickle=True).payload_names())
            except (EntryInvalid, EntryForeign):
                folder = head.name.rsplit("/", 1)[0]
                stem = head.file.split(".", 1)[0]
                named.update(p for p in bp.payloads if p.startswith(f"{folder}/{stem}."))
    return [p for bp in parts.values() for p in bp.payloads if p not in named]


def check_whole_entries(archive: BundleArchive, parts: dict[Part, BundlePart]) -> None:
    """Refuse a bundle holding a payload member that belongs to no entry (pack never writes one).

    Raises:
        BundleRefused: naming the member.
    """
    stray = orphans(archive, parts)
    if stray:
        raise BundleRefused(f"member {stray[0]!r} of bundle {archive.path} belongs to no entry of the bundle; nothing "
                            "of it is served or written")


__all__ = ["BundlePart", "Head", "Judged", "Part", "check_whole_entries", "contents", "grouped_manifest", "judge",
           "orphans", "read_json", "where"]
