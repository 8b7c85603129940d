"""Entries of a format version this skipweave does not read, found in a folder of the store.

Such an entry or group file is *foreign* (:class:`~skipweave.store.errors.EntryForeign`): written by a newer
skipweave (a node of the cluster upgraded first, a store shared with a colleague), or of a version nobody known to
this code wrote. It is kept as it is: a run does not set aside the part holding it, retention does not remove its
step, ``gc`` and ``migrate`` leave it, and the CLI lists it. This module finds them for those decisions; reading a
single entry raises the exception directly (:func:`~skipweave.store.format.versions.version_of`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from skipweave.store.errors import EntryForeign, EntryInvalid
from skipweave.store.format.group import read_group
from skipweave.store.format.layout import parse_group_name, parse_manifest_name
from skipweave.store.format.manifest import read_manifest
from skipweave.store.format.versions import version_of
from skipweave.store.fs import is_real_dir

__all__ = ["describe", "foreign_in", "foreign_in_step"]


def foreign_in(folder: str, shard: str | None = None, names: Iterable[str] | None = None) -> list[EntryForeign]:
    """The foreign manifests and group files of a target folder (of one ``shard``, or of every one).

    Args:
        folder: a target folder ``{dump_dir}/{namespace}/{role}/{step}/{target}``.
        shard: only this shard's files; ``None``: every shard's.
        names: the folder's listing when the caller has it (else it is listed).

    Returns:
        One :class:`EntryForeign` per foreign file, in name order; empty when the folder is gone or holds none.
        Unreadable and invalid files are not foreign (they are judged elsewhere) and are left out.
    """
    if names is None:
        try:
            names = os.listdir(folder)
        except OSError:
            return []
    found = []
    for name in sorted(names):
        manifest = parse_manifest_name(name)
        grouped = parse_group_name(name) if manifest is None else None
        owner = manifest[0] if manifest is not None else grouped[0] if grouped is not None else None
        if owner is None or name.startswith(".") or (shard is not None and owner != shard):
            continue
        path = os.path.join(folder, name)
        try:
            if manifest is not None:
                read_manifest(path)
            else:
                _entries_readable(read_group(path), path)
        except EntryForeign as exc:
            found.append(exc)
        except (EntryInvalid, OSError):
            continue
    return found


def _entries_readable(group: dict[str, object], path: str) -> None:
    """Raise :class:`EntryForeign` when a group file of a readable version holds a manifest of a version this code
    does not read: the run's and the CLI's judgement (:func:`skipweave.store.validity.check_group`) takes such a
    group for foreign, so keeping it is decided here alike (retention, set-aside, orphans)."""
    entries = group.get("entries")
    if not isinstance(entries, list):
        return
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            try:
                version_of(entry, f"{path} (entry {i})")
            except EntryInvalid:
                continue


def foreign_in_step(step_dir: str) -> list[EntryForeign]:
    """The foreign files of every target folder of a step folder (no symlink followed); empty when it is gone."""
    try:
        targets = sorted(n for n in os.listdir(step_dir) if not n.startswith("."))
    except OSError:
        return []
    return [f for t in targets if is_real_dir(os.path.join(step_dir, t))
            for f in foreign_in(os.path.join(step_dir, t))]


def describe(found: list[EntryForeign]) -> str:
    """One phrase for people: ``"2 files of format version 3 (written by skipweave 0.3.0)"``, several versions
    joined by "and"."""
    by_version: dict[tuple[int, str | None], int] = {}
    for f in found:
        by_version[(f.version, f.writer)] = by_version.get((f.version, f.writer), 0) + 1
    ordered = sorted(by_version.items(), key=lambda item: (item[0][0], item[0][1] or ""))
    parts = [f"{n} file{'s' if n != 1 else ''} of format version {v}" + (f" (written by skipweave {w})" if w else "")
             for (v, w), n in ordered]
    return " and ".join(parts)
