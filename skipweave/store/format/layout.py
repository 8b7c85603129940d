"""On-disk layout of a dump dir, readable by a person::

    {dump_dir}/{namespace}/{role}/{step}/{target}/{shard}-{call:04d}.manifest.json
                                                  {shard}-{call:04d}.{token}.tensors.safetensors
                                                  {shard}-{call:04d}.{token}.tree.json
                                                  {shard}.part.json
                                                  {shard}-{first:04d}-{last:04d}.pack.json   (a group of small
                                                  {shard}-{first:04d}-{last:04d}.{token}.pack.safetensors  entries)
    {dump_dir}/{namespace}/{role}/_set_aside/{step}-{target}-{shard}-{time}/   (interrupted steps)

``step`` is a plain decimal integer, ``call`` the index of the call within the step (verl's
``parameter_sync_step > 1`` makes several), ``shard`` the writer's label (``r0``, ``r1``… from ``RANK``).
Files whose name starts with ``.tmp-`` are being written and are never read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from skipweave.store.fs import SET_ASIDE, is_step_name

TMP_PREFIX = ".tmp-"
SET_ASIDE_DIR = SET_ASIDE
MANIFEST_SUFFIX = ".manifest.json"
PART_SUFFIX = ".part.json"
GROUP_SUFFIX = ".pack.json"
MAX_GROUP_CALLS = 4096
"""Most calls one group file may hold; a name spanning more is not one skipweave writes (and is ignored)."""
_ENTRY_RE = re.compile(r"^(?P<shard>[A-Za-z0-9_][A-Za-z0-9_\-]*)-(?P<call>[0-9]{4,})\.manifest\.json\Z", re.ASCII)
_PAYLOAD_RE = re.compile(
    r"^(?P<stem>[A-Za-z0-9_\-]+-[0-9]{4,})\.[A-Za-z0-9]+\.(?P<kind>tree\.json|tensors\.safetensors(?:\.zst)?)\Z",
    re.ASCII,
)

_GROUP_RE = re.compile(
    r"^(?P<shard>[A-Za-z0-9_][A-Za-z0-9_\-]*)-(?P<first>[0-9]{4,})-(?P<last>[0-9]{4,})\.pack\.json\Z", re.ASCII)
_GROUP_DATA_RE = re.compile(
    r"^(?P<group>[A-Za-z0-9_][A-Za-z0-9_\-]*-[0-9]{4,}-[0-9]{4,})\.[A-Za-z0-9]+\.pack\.safetensors(?:\.zst)?\Z",
    re.ASCII)


@dataclass(frozen=True)
class EntryKey:
    """Identity of one recorded call.

    Attributes:
        namespace, role, target: names from the config (``target`` is the key under ``targets``).
        step: training step.
        call: index of the call within the step for this shard, from 0.
        shard: writer label, e.g. ``r0``.
    """

    namespace: str
    role: str
    step: int
    target: str
    shard: str
    call: int

    @property
    def stem(self) -> str:
        """File name stem shared by the entry's files, e.g. ``r0-0000``."""
        return f"{self.shard}-{self.call:04d}"


def role_dir(dump_dir: str, namespace: str, role: str) -> str:
    """Return ``{dump_dir}/{namespace}/{role}``."""
    return os.path.join(dump_dir, namespace, role)


def target_dir(dump_dir: str, key: EntryKey) -> str:
    """Return the folder holding every entry of ``key``'s step and target."""
    return os.path.join(role_dir(dump_dir, key.namespace, key.role), str(key.step), key.target)


def manifest_path(dump_dir: str, key: EntryKey) -> str:
    """Return the path of ``key``'s manifest."""
    return os.path.join(target_dir(dump_dir, key), key.stem + MANIFEST_SUFFIX)


def part_path(dump_dir: str, key: EntryKey) -> str:
    """Return the path of the part state file of ``key``'s step, target and shard."""
    return os.path.join(target_dir(dump_dir, key), key.shard + PART_SUFFIX)


def parse_manifest_name(name: str) -> tuple[str, int] | None:
    """Return ``(shard, call)`` for a manifest file name, else ``None``."""
    m = _ENTRY_RE.match(name)
    return (m.group("shard"), int(m.group("call"))) if m else None


def group_stem(shard: str, first: int, last: int) -> str:
    """File name stem of the group of calls ``first..last`` of a shard, e.g. ``r0-0000-0063``."""
    return f"{shard}-{first:04d}-{last:04d}"


def parse_group_name(name: str) -> tuple[str, int, int] | None:
    """Return ``(shard, first, last)`` for a group file name (``r0-0000-0063.pack.json``), else ``None``.

    ``None`` too when ``first > last`` or the range spans more than :data:`MAX_GROUP_CALLS` calls, or when the
    numbers are not written as :func:`group_stem` writes them (a crafted name never claims calls it could not hold).
    """
    m = _GROUP_RE.match(name)
    if m is None:
        return None
    first, last = int(m.group("first")), int(m.group("last"))
    if first > last or last - first >= MAX_GROUP_CALLS \
            or group_stem(m.group("shard"), first, last) + GROUP_SUFFIX != name:
        return None
    return m.group("shard"), first, last


def parse_group_data_name(name: str) -> str | None:
    """Return the group stem (``r0-0000-0063``) of a group's data file name
    (``r0-0000-0063.<token>.pack.safetensors``, compressed ``....zst``), else ``None``."""
    m = _GROUP_DATA_RE.match(name)
    return m.group("group") if m else None


def touch_role(dump_dir: str, namespace: str, role: str) -> None:
    """Bump the role folder's modification time (never through a symlink); errors are ignored.

    Every skipweave writer does this when it commits, closes, sets aside or removes anything of the role,
    so a reader's in-memory index of recorded steps stays valid exactly while the folder's :func:`role_mtime`
    does (adding or removing a step folder moves it too). No file is added for it.
    """
    try:
        os.utime(role_dir(dump_dir, namespace, role), follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


def folder_mtime(folder: str) -> tuple[int, int] | None:
    """(inode, mtime in ns) of a folder, or None when it does not exist; changes whenever an entry in it does.

    ``lstat``: a symlink's own never matches a real folder's (and the store refuses symlinks anyway).
    """
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def role_mtime(dump_dir: str, namespace: str, role: str) -> tuple[int, int] | None:
    """The role folder's :func:`folder_mtime`, which :func:`touch_role` moves (every writer's change of the role)."""
    return folder_mtime(role_dir(dump_dir, namespace, role))


def key_of_manifest(path: str) -> EntryKey | None:
    """The :class:`EntryKey` a manifest's place implies (``.../{namespace}/{role}/{step}/{target}/{stem}``),
    or ``None`` when the path is not shaped like an entry's place in a dump dir."""
    parts = os.path.abspath(path).split(os.sep)
    if len(parts) < 6:
        return None
    namespace, role, step, target, name = parts[-5:]
    parsed = parse_manifest_name(name)
    if parsed is None or not is_step_name(step):
        return None
    return EntryKey(namespace, role, int(step), target, parsed[0], parsed[1])


def parse_payload_name(name: str) -> tuple[str, str] | None:
    """Return ``(stem, kind)`` of a payload file name (kind ``tree.json``, ``tensors.safetensors`` or, compressed,
    ``tensors.safetensors.zst``), else ``None``."""
    m = _PAYLOAD_RE.match(name)
    return (m.group("stem"), m.group("kind")) if m else None


def list_steps(dump_dir: str, namespace: str, role: str) -> list[int]:
    """Return the sorted steps that have a folder under a role (complete or not).

    Only names skipweave writes count: real folders (not symlinks, not files) named by an optional ``-`` and
    ASCII digits, in the form ``str(step)`` gives. Anything else (a file named ``4``, a folder named ``²``,
    a symlink) is ignored.
    """
    try:
        with os.scandir(role_dir(dump_dir, namespace, role)) as it:
            names = [e.name for e in it if is_step_name(e.name) and e.is_dir(follow_symlinks=False)]

    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names)
