"""What a bundle's members are called, and what its manifest holds.

A bundle is a zip archive (members stored, not compressed) whose members keep the dump dir's own layout, so
``unzip BUNDLE -d DIR`` gives a dump dir::

    {namespace}/{role}/{step}/{target}/{shard}-{call}.manifest.json       (and the entry's two payload files)
    {namespace}/{role}/{step}/{target}/{shard}-{first}-{last}.pack.json   (and the group's data file)
    {namespace}/{role}/{step}/{target}/{shard}.part.json                  (the part, closed)
    skipweave-bundle.json                                                 (the bundle manifest, last)

The archive comment is ``skipweave-bundle/1 xxh3_128:<hex>``: the checksum of the bundle manifest's bytes, which list
every other member with its size and checksum, and a checksum of them all.
"""

from __future__ import annotations

import os
import re

from skipweave.store.format.layout import (
    PART_SUFFIX,
    parse_group_data_name,
    parse_group_name,
    parse_manifest_name,
    parse_payload_name,
)
from skipweave.store.fs import is_step_name, name_problem

BUNDLE_SUFFIX = ".zip"
"""What a bundle's file name ends with: ``skip.<role>.dump_dir`` names a bundle when it ends so."""

MANIFEST_NAME = "skipweave-bundle.json"
"""The bundle manifest's member name."""

BUNDLE_KIND = "skipweave-bundle"
BUNDLE_VERSION = 1
"""The bundle layout's version (apart from the entries' ``format_version``): this code writes and reads 1."""

COMMENT_PREFIX = f"{BUNDLE_KIND}/{BUNDLE_VERSION} "
"""The archive comment's start; the checksum of the bundle manifest's bytes follows."""

MAX_RATIO = 1000
"""Most a member, or the whole archive, may grow when read (uncompressed size over size on disk). skipweave stores
members uncompressed (ratio 1); a deflated member of a bundle re-zipped by hand is accepted up to this ratio."""

MANIFEST_MAX_BYTES = 64 << 20
"""Most bytes the bundle manifest may take (about 200,000 members)."""

_SHARD_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*\Z", re.ASCII)


def is_bundle_path(path: str) -> bool:
    """Whether ``path`` names a bundle (it ends with :data:`BUNDLE_SUFFIX`), whatever is there now: a dump dir is a
    folder, so a name ending in ``.zip`` is always taken for a bundle (a missing one is an error, no folder made)."""
    return path.rstrip(os.sep).lower().endswith(BUNDLE_SUFFIX)


def member_problem(name: str) -> str | None:
    """Why ``name`` cannot be a member of a bundle, ``None`` when it can: the bundle manifest, or a file skipweave
    writes in a target folder (a manifest, payload, group, group data or part file), four valid folder names deep.

    A path that leaves the bundle's folder (``..``, absolute, a drive or backslash) gets its own reason.
    """
    if name == MANIFEST_NAME:
        return None
    if not name or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    if "\\" in name:
        return "holds a backslash (a path skipweave never writes)"
    parts = name.split("/")
    if any(p in ("..", ".") for p in parts):
        return "names a path outside the bundle's folder ('..' or '.')"
    if len(parts) != 5:
        return "is not {namespace}/{role}/{step}/{target}/{file}"
    namespace, role, step, target, file = parts
    for kind, value in (("namespace", namespace), ("role", role), ("target", target)):
        problem = name_problem(value)
        if problem is not None:
            return f"has a {kind} folder {value!r} that {problem}"
    if not is_step_name(step):
        return f"has a step folder {step!r} that is not a step number"
    if file_kind(file) is None:
        return f"holds a file {file!r} that skipweave never writes"
    return None


def file_kind(file: str) -> str | None:
    """What a member's file name is: ``manifest``, ``payload``, ``group``, ``group_data`` or ``part``; ``None`` when it
    is none of the names skipweave writes in a target folder."""
    if parse_manifest_name(file) is not None:
        return "manifest"
    if parse_payload_name(file) is not None:
        return "payload"
    if parse_group_name(file) is not None:
        return "group"
    if parse_group_data_name(file) is not None:
        return "group_data"
    if file.endswith(PART_SUFFIX) and _SHARD_RE.match(file[: -len(PART_SUFFIX)]):
        return "part"
    return None


def member_name(namespace: str, role: str, step: int, target: str, file: str) -> str:
    """The member name of a file of a target folder."""
    return f"{namespace}/{role}/{step}/{target}/{file}"


def split_member(name: str) -> tuple[str, str, int, str, str]:
    """``(namespace, role, step, target, file)`` of a member name :func:`member_problem` accepted."""
    namespace, role, step, target, file = name.split("/")
    return namespace, role, int(step), target, file


__all__ = ["BUNDLE_KIND", "BUNDLE_SUFFIX", "BUNDLE_VERSION", "COMMENT_PREFIX", "MANIFEST_MAX_BYTES", "MANIFEST_NAME",
           "MAX_RATIO", "file_kind", "is_bundle_path", "member_name", "member_problem", "split_member"]
