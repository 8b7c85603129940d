"""Groups of small entries: the payloads of many calls of one part in one data file, committed by one group file.

Per-sample recording (verl's fully-async rollouter) makes thousands of entries of a few KB per step. As three
files each, an entry costs three file creations (600-1200 µs each on a slow disk) however the syncs are
grouped. The background writer therefore commits the small entries of a part that it holds at once, with
contiguous call indices, as one group (:meth:`~skipweave.store.step_store.StepStore.commit_many`)::

    {shard}-{first:04d}-{last:04d}.pack.json                 the group file: the entries' manifests, and the commit
    {shard}-{first:04d}-{last:04d}.{token}.pack.safetensors  every entry's tree (``{call:04d}/tree``, uint8) and
                                                             tensors (``{call:04d}/{name}``): one safetensors file

The data file is written, synced and renamed first; the group file's rename commits every entry in it at once,
so the commit marker rule of single entries holds. A group file holds, per call ``first..last``, the very
manifest a single entry has (:func:`~skipweave.store.format.manifest.build_manifest`) with the data file as its one
payload item, and is checked the same way (:func:`check_group`): a reader serves an entry of a group only when the
whole group file is sound and the data file has its size and checksum.

Which entry a call is: its own manifest when there is one (a later re-record of a grouped call, or an older
skipweave, writes one), else the one group whose range holds it. A call two groups claim (no writer makes that;
a crafted or copied-together folder does) is served by neither.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from skipweave.store.format import safetensors_header
from skipweave.store.format.layout import EntryKey, group_stem, parse_group_data_name
from skipweave.store.format.manifest import (
    FORMAT_VERSION,
    EntryInvalid,
    PayloadFile,
    check_fields,
    check_identity,
    check_pickle,
    check_structure,
    library_versions,
    read_json,
)
from skipweave.store.format.versions import version_of
from skipweave.store.fs import open_regular

GROUP_KIND = "pack"
"""The group file's ``kind``."""

GROUP_MAX_BYTES = 64 << 20
"""A group file holds at most :data:`~skipweave.store.format.layout.MAX_GROUP_CALLS` manifests of about 1 KB: a larger
file is not one skipweave wrote (and is not parsed)."""

ENTRY_MAX_BYTES = 256 << 10
"""Entries whose payload takes more bytes than this are written as single entries (three files cost little
beside their bytes)."""

DATA_MAX_BYTES = 32 << 20
"""Most payload bytes one group holds; a reader reads (and verifies) a group's data file whole."""

DATA_READ_MAX = 2 * DATA_MAX_BYTES
"""Most bytes a reader takes a group's data file (or its decompressed contents) to have: a group file naming a
larger one is not one skipweave wrote, and is refused before any memory is allocated for it."""


def claims(groups: Iterable[tuple[int, int, str]], within: tuple[int, int] | None = None) -> collections.Counter[int]:
    """How many of a part's group files (``(first, last, name)``) claim each call, counted over ``within`` only when
    given: a call two of them claim, with no manifest of its own, is served by neither (runs and the CLI alike)."""
    lo, hi = within if within is not None else (0, 1 << 62)
    return collections.Counter(c for first, last, _ in groups for c in range(max(first, lo), min(last, hi) + 1))


def tensor_name(call: int, name: str) -> str:
    """Name of an entry's tensor (or, for ``name`` ``tree``, of its tree) in a group's data file."""
    return f"{call:04d}/{name}"


def group_tensors(entries: list[tuple[int, bytes, dict[str, Any]]]) -> dict[str, Any]:
    """The tensors of a group's data file from ``(call, tree bytes, tensors)`` per entry (the trees as ``bytes``,
    which :func:`~skipweave.store.format.tensorfile.write` stores as 1-D uint8 tensors)."""
    out: dict[str, Any] = {}
    for call, tree, tensors in entries:
        out[tensor_name(call, "tree")] = tree
        for name, t in tensors.items():
            out[tensor_name(call, name)] = t
    return out


def read_data(folder: str, checked: CheckedGroup, first: int, last: int) -> tuple[memoryview, dict[int, Any]]:
    """Read a checked group's data file whole, verify it (size, checksum, safetensors header) and index it by call
    (:func:`index`): the data section and ``call -> (tree span, tensor spans by name)``. What a run serves from and
    what ``skipweave verify`` checks.

    Raises:
        EntryInvalid: the data file is missing, larger than :data:`DATA_READ_MAX`, corrupt, or holds no 1-D uint8
            tree for one of the calls ``first..last``.
    """
    from skipweave.store.format import tensorfile

    path = os.path.join(folder, checked.data["name"])
    section, spans = tensorfile.read_whole(path, size=int(checked.data["bytes"]),
                                           checksum=str(checked.data["checksum"]), limit=DATA_READ_MAX)
    by_call = index(spans, checked.path)
    missing = [c for c in range(first, last + 1) if c not in by_call]
    if missing:
        raise EntryInvalid(f"group {checked.path}: its data file holds no tree for call {missing[0]}"
                           f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    return section, by_call


def index(spans: dict[str, Any], where: str) -> dict[int, tuple[Any, dict[str, Any]]]:
    """A group's data file by call: ``call -> (its tree's span, its tensors' spans by name)``, from the spans
    :func:`~skipweave.store.format.tensorfile.read_whole` gives. A name not of the form ``{call}/{name}``, and a call
    with
    no tree, are left out (no entry is served from them).

    Raises:
        EntryInvalid: a tree is not a 1-D uint8 tensor.
    """
    import torch

    trees: dict[int, Any] = {}
    parts: dict[int, dict[str, Any]] = {}
    for full, span in spans.items():
        call_text, sep, name = full.partition("/")
        if not sep or not call_text.isdigit() or not call_text.isascii() or not name:
            continue
        call = int(call_text)
        if name == "tree":
            if span[3] != torch.uint8 or len(span[4]) != 1:
                raise EntryInvalid(f"group {where} holds a tree for call {call} that is not 1-D uint8")
            trees[call] = span
        else:
            parts.setdefault(call, {})[name] = span
    return {call: (tree, parts.get(call, {})) for call, tree in trees.items()}


def read_tree(data_path: str, call: int) -> bytes:
    """The tree bytes of one call from a group's data file, without torch and without reading the other entries'
    bytes (a compressed file is decompressed up to them): what ``skipweave show`` summarises. Not verified against
    the checksum (``show --verify`` checks the file whole).

    Raises:
        OSError: the file cannot be read.
        EntryInvalid: its header is malformed (:func:`~skipweave.store.format.safetensors_header.parse`).
        ValueError: the header names no tree for ``call``, or the file ends before it.
    """
    with open(open_regular(data_path), "rb") as fh:
        source: Any = fh
        if data_path.endswith(".zst"):
            import zstandard

            source = zstandard.ZstdDecompressor().stream_reader(fh)
        n = safetensors_header.header_length(source.read(8).ljust(8, b"\0"), data_path, room=None)
        spans = safetensors_header.parse(source.read(n), None, data_path)
        tree = next((sp for sp in spans if sp[2] == tensor_name(call, "tree")), None)
        if tree is None or tree[3] != "U8":
            raise ValueError(f"{data_path} holds no tree for call {call}")
        lo, hi = tree[0], tree[1]
        skip = lo
        while skip:
            got = len(source.read(min(skip, 1 << 20)))
            if not got:
                raise ValueError(f"{data_path} ends before the tree of call {call}")
            skip -= got
        data = bytes(source.read(hi - lo))
        if len(data) != hi - lo:
            raise ValueError(f"{data_path} ends within the tree of call {call}")
        return data


def build_group(*, role: str, target: str, step: int, shard: str, first: int, last: int, data: PayloadFile,
               entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The group file's mapping: its identity, its data file, and one manifest per call ``first..last``."""
    return {
        "format_version": FORMAT_VERSION, "skipweave_version": library_versions().get("skipweave", "unknown"),
        "kind": GROUP_KIND, "role": role, "target": target, "step": step,
        "shard": shard, "first": first, "last": last,
        "data": {"name": data.name, "bytes": data.bytes, "checksum": data.checksum},
        "entries": entries,
    }


def read_group(path: str) -> dict[str, Any]:
    """Read a group file (at most :data:`GROUP_MAX_BYTES`) and check its version and kind.

    Raises:
        FileNotFoundError: no group file.
        EntryForeign: a format version this skipweave does not read (the group is kept as it is).
        EntryInvalid: unreadable JSON, too large, no version number, or another kind.
    """
    data = read_json(path, GROUP_MAX_BYTES, "group")
    version_of(data, path, "group")
    if data.get("kind") != GROUP_KIND:
        raise EntryInvalid(f"group {path} is not a group file (kind {data.get('kind')!r:.40})")
    return data


@dataclass(frozen=True)
class CheckedGroup:
    """A group file that passed :func:`check_group`.

    Attributes:
        path: the group file.
        data: its data file's ``{name, bytes, checksum}``.
        entries: call index -> that call's manifest (each passed
            :func:`~skipweave.store.format.manifest.check_fields` with pickle allowed; :func:`entry_of` judges pickle).
    """

    path: str
    data: dict[str, Any]
    entries: dict[int, dict[str, Any]]


def check_group(group: dict[str, Any], path: str, key: EntryKey, first: int, last: int) -> CheckedGroup:
    """Decide whether a group file may serve entries: the judgement of runs and the CLI alike.

    The group names the part it sits in (role, target, step, shard of ``key``) and the range its name gives; its
    data file is named for the group; it holds exactly one manifest per call ``first..last``, each of which names
    its own call (:func:`~skipweave.store.format.manifest.check_identity`), lists the group's data file as its one
    payload
    item and passes :func:`~skipweave.store.format.manifest.check_fields` (pickle is checked per entry and reader, by
    :func:`entry_of`). The data file's bytes are checked by the reader.

    Args:
        group: what :func:`read_group` returned.
        path: the group file, for messages.
        key: any key of the part (its call is not used).
        first, last: the call range the group file's name gives.

    Raises:
        EntryInvalid: naming the first thing that does not fit.
    """
    want = {"role": key.role, "target": key.target, "step": key.step, "shard": key.shard, "first": first,
            "last": last}
    for field, value in want.items():
        got = group.get(field)
        if got != value or type(got) is not type(value):
            raise EntryInvalid(f"group {path} belongs elsewhere: {field}={got!r:.80}, expected {value!r}")
    data = group.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) \
            or parse_group_data_name(data["name"]) != group_stem(key.shard, first, last) \
            or type(data.get("bytes")) is not int or not 0 <= data["bytes"] <= DATA_READ_MAX \
            or not isinstance(data.get("checksum"), str):
        raise EntryInvalid(f"group {path} names no data file of its own "
                           f"({group_stem(key.shard, first, last)}.<token>.pack.safetensors, with bytes and checksum)")
    entries = group.get("entries")
    if not isinstance(entries, list) or len(entries) != last - first + 1:
        raise EntryInvalid(f"group {path} does not hold one manifest per call {first}..{last}")
    item = {"name": data["name"], "bytes": data["bytes"], "checksum": data["checksum"]}
    checked: dict[int, dict[str, Any]] = {}
    for call, entry in enumerate(entries, start=first):
        where = f"{path} (call {call})"
        manifest = check_structure(entry, where)
        check_identity(manifest, where, role=key.role, target=key.target, step=key.step, call=call, shard=key.shard)
        payload = manifest["payload"]
        if len(payload) != 1 or {k: payload[0].get(k) for k in item} != item:
            raise EntryInvalid(f"manifest {where} does not list its group's data file as its one payload item")
        check_fields(manifest, where, key, allow_pickle=True)
        checked[call] = manifest
    return CheckedGroup(path, item, checked)


def entry_of(checked: CheckedGroup, key: EntryKey, *, allow_pickle: bool) -> dict[str, Any]:
    """The manifest of ``key``'s call in a checked group.

    Raises:
        EntryRefused: the entry holds pickled data and ``allow_pickle`` is off.
        EntryInvalid: the group does not hold the call.
    """
    manifest = checked.entries.get(key.call)
    if manifest is None:
        raise EntryInvalid(f"group {checked.path} holds no call {key.call}")
    # check_group checked its fields (with pickle allowed); a checked group's manifests do not change: only the
    # reader's own policy is left
    check_pickle(manifest, f"{checked.path} (call {key.call})", key, allow_pickle=allow_pickle)
    return manifest


__all__ = ["DATA_MAX_BYTES", "DATA_READ_MAX", "ENTRY_MAX_BYTES", "GROUP_KIND", "GROUP_MAX_BYTES", "CheckedGroup",
           "build_group", "check_group", "claims", "entry_of", "group_tensors", "index", "read_data", "read_group",
           "read_tree", "tensor_name"]
