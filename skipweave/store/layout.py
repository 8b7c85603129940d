"""On-disk layout of a dump dir, readable by a person::

    {dump_dir}/{namespace}/{role}/{step}/{target}/{shard}-{call:04d}.manifest.json
                                                  {shard}-{call:04d}.{token}.tensors.safetensors
                                                  {shard}-{call:04d}.{token}.tree.json
                                                  {shard}.part.json
    {dump_dir}/{namespace}/{role}/_set_aside/{step}-{target}-{shard}-{stamp}/   (interrupted steps)

``step`` is a plain decimal integer, ``call`` the index of the call within the step (verl's
``parameter_sync_step > 1`` makes several), ``shard`` the writer's label (``r0``, ``r1``… from ``RANK``).
Files whose name starts with ``.tmp-`` are being written and are never read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

TMP_PREFIX = ".tmp-"
SET_ASIDE_DIR = "_set_aside"
MANIFEST_SUFFIX = ".manifest.json"
PART_SUFFIX = ".part.json"
_ENTRY_RE = re.compile(r"^(?P<shard>[A-Za-z0-9_\-]+)-(?P<call>\d{4,})\.manifest\.json$")


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


def list_steps(dump_dir: str, namespace: str, role: str) -> list[int]:
    """Return the sorted steps that have a folder under a role (complete or not)."""
    try:
        names = os.listdir(role_dir(dump_dir, namespace, role))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit() or (n.startswith("-") and n[1:].isdigit()))
