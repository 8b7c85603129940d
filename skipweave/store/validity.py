"""Whether one committed entry may be served: the one judgement that a run, ``skipweave ls``/``verify``/``show``
and ``gc`` share (see docs/architecture.md).

An entry is judged without decoding it, by the checks a reader makes before it serves one
(:func:`~skipweave.store.format.manifest.check_manifest` for an entry with a manifest of its own,
:func:`~skipweave.store.format.group.check_group` and :func:`~skipweave.store.format.group.entry_of` for one held in
a group file of
small entries), and its payload files' sizes (with ``checksums``, every byte). A copy of this judgement for
tools only would drift from what a run serves; so the tools call these functions.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from skipweave.store.errors import EntryForeign
from skipweave.store.format.group import check_group as check_group_file
from skipweave.store.format.group import claims, entry_of, read_data, read_group
from skipweave.store.format.layout import (
    EntryKey,
    key_of_manifest,
    parse_group_data_name,
    parse_group_name,
    parse_payload_name,
)
from skipweave.store.format.manifest import EntryInvalid, EntryRefused, check_manifest, read_manifest, verify_payload
from skipweave.store.index import calls_in

__all__ = ["Validity", "check_entry", "check_group", "group_data_names", "payload_names", "payload_stem"]


@dataclass(frozen=True)
class Validity:
    """How :func:`check_entry` (or :func:`check_group`, per call) judged one entry.

    Attributes:
        manifest: the parsed manifest, ``None`` when it is unreadable.
        reason: why the entry would not be served, ``None`` when it would.
        refused: the entry is sound but holds pickled data and pickle is not allowed (``reason`` says so).
        foreign: the entry (or its group file) is of a format version this skipweave does not read (``reason``
            says which and what to upgrade); such an entry is kept as it is, never judged damaged.
    """

    manifest: dict[str, Any] | None
    reason: str | None
    refused: bool = False
    foreign: EntryForeign | None = None


def check_entry(path: str, *, checksums: bool, allow_pickle: bool = False, key: EntryKey | None = None) -> Validity:
    """Judge one committed entry the way :meth:`StepStore.load` would, without decoding it.

    The same judgement (:func:`~skipweave.store.format.manifest.check_manifest`: identity, payload names, pickle)
    and the same payload checks (regular files, sizes, and with ``checksums`` every byte).

    Args:
        path: the manifest, or the group file holding the entry (then ``key`` names its call).
        checksums: also compare each payload file's checksum (reads every byte).
        allow_pickle: judge as a run with ``allow_pickle=true`` (else a pickled entry is refused).
        key: the entry the manifest is read for; default: the one its place implies.

    Returns:
        The entry's :class:`Validity`.

    Raises:
        FileNotFoundError: the manifest (or group file) does not exist.
    """
    grouped = parse_group_name(os.path.basename(path))
    if grouped is not None and key is not None:  # a grouped entry: its group file judged for its call
        checked = check_group(path, key, grouped[1], grouped[2], checksums=checksums, allow_pickle=allow_pickle)
        if checked is None:
            raise FileNotFoundError(path)
        return checked[1].get(key.call, Validity(None, f"group {path} holds no call {key.call}"))
    try:
        manifest = read_manifest(path)
    except EntryForeign as exc:
        return Validity(None, str(exc), foreign=exc)
    except EntryInvalid as exc:
        return Validity(None, str(exc))
    key = key or key_of_manifest(path)
    if key is None:
        return Validity(manifest, f"manifest {path} does not sit at an entry's place in a dump dir "
                                  "({namespace}/{role}/{step}/{target}/{shard}-{call}.manifest.json)")
    try:
        check_manifest(manifest, path, key, allow_pickle=allow_pickle)
    except EntryRefused as exc:
        try:
            verify_payload(os.path.dirname(path), manifest, checksums=checksums)
        except EntryInvalid as bad:
            return Validity(manifest, str(bad))
        return Validity(manifest, str(exc), refused=True)
    except EntryInvalid as exc:
        return Validity(manifest, str(exc))
    try:
        verify_payload(os.path.dirname(path), manifest, checksums=checksums)
    except EntryInvalid as exc:
        return Validity(manifest, str(exc))
    return Validity(manifest, None)


def check_group(path: str, key: EntryKey, first: int, last: int, *, checksums: bool,
                allow_pickle: bool = False) -> tuple[Any, dict[int, Validity]] | None:
    """Judge every entry of a group file the way :meth:`StepStore.load` would, without decoding it: the group
    (:func:`~skipweave.store.format.group.check_group`), its data file (its size; with ``checksums`` every byte and its
    header, each call's tree included, :func:`~skipweave.store.format.group.read_data`), each call against the folder's
    other group files (a call two of them claim, with no manifest of its own, is served by neither), then each
    entry's pickle against ``allow_pickle``.

    Args:
        path: the group file (``{shard}-{first}-{last}.pack.json``).
        key: any key of the group's part (its call is not used).
        first, last: the call range the group file's name gives.
        checksums: also compare the data file's checksum and read its header (reads every byte).
        allow_pickle: judge as a run with ``allow_pickle=true``.

    Returns:
        The parsed group file (``None`` when unreadable) and a :class:`Validity` per call ``first..last``; ``None``
        when the group file does not exist.
    """
    try:
        group = read_group(path)
    except FileNotFoundError:
        return None
    except EntryForeign as exc:
        return None, {c: Validity(None, str(exc), foreign=exc) for c in range(first, last + 1)}
    except EntryInvalid as exc:
        return None, {c: Validity(None, str(exc)) for c in range(first, last + 1)}
    folder = os.path.dirname(path)
    try:
        checked = check_group_file(group, path, key, first, last)
        if checksums:
            read_data(folder, checked, first, last)
        else:
            verify_payload(folder, {"payload": [checked.data]}, checksums=False)
    except EntryForeign as exc:  # a readable group holding an entry of a version this code does not read
        return None, {c: Validity(None, str(exc), foreign=exc) for c in range(first, last + 1)}
    except EntryInvalid as exc:
        entries = group.get("entries")
        return group, {c: Validity(entries[c - first] if isinstance(entries, list) and len(entries) > c - first
                                   and isinstance(entries[c - first], dict) else None, str(exc))
                       for c in range(first, last + 1)}
    try:
        own, groups = calls_in(os.listdir(folder), key.shard)
    except OSError:
        own, groups = set(), ()
    claimed = claims(groups, (first, last))
    out: dict[int, Validity] = {}
    for call, manifest in checked.entries.items():
        if claimed[call] > 1 and call not in own:
            out[call] = Validity(manifest, f"call {call} is claimed by {claimed[call]} group files: none is served")
            continue
        try:
            entry_of(checked, dataclasses.replace(key, call=call), allow_pickle=allow_pickle)
            out[call] = Validity(manifest, None)
        except EntryRefused as exc:
            out[call] = Validity(manifest, str(exc), refused=True)
    return group, out


def payload_stem(name: str) -> str | None:
    """Return the entry stem (``r0-0001``) of a payload file name, or the group stem (``r0-0000-0063``) of a group's
    data file, or ``None`` when it is neither."""
    parsed = parse_payload_name(name)
    return parsed[0] if parsed else parse_group_data_name(name)


def payload_names(manifest: dict[str, Any] | None) -> set[str] | None:
    """Return the payload file names a manifest lists, or ``None`` when it lists none readable."""
    if manifest is None or not isinstance(manifest.get("payload"), list):
        return None
    names = {item.get("name") for item in manifest["payload"] if isinstance(item, dict)}
    return {n for n in names if isinstance(n, str)}


def group_data_names(group: dict[str, Any]) -> set[str] | None:
    """The data file name a parsed group file refers to (a set of one), ``None`` when it names none readable."""
    data = group.get("data")
    name = data.get("name") if isinstance(data, dict) else None
    return {name} if isinstance(name, str) else None
