"""Serving one entry: read its manifest (or its group's), check it, read and verify its payload, decode it.

Part of :class:`~skipweave.store.step_store.StepStore`. Each file is read once and verified before anything is
served: the manifest and tree into memory; a large plain tensor file hashed, then mapped privately with its tensors
built on the mapping (no copy, :mod:`~skipweave.store.format.mapped`); other tensor files read straight into their
tensors. A group's data file is read whole into memory and kept while it is unchanged; each hit copies out its own
tensors (a few KB), so the host never writes into what later hits are served from. An entry is judged by
:func:`~skipweave.store.format.manifest.check_manifest` (or, grouped,
:func:`~skipweave.store.format.group.check_group`), the same functions ``skipweave verify``, ``gc`` and ``ls`` use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from skipweave.store.errors import EntryInvalid
from skipweave.store.folders import Mtime, RoleFolders
from skipweave.store.format import jsonio
from skipweave.store.format.group import entry_of
from skipweave.store.format.layout import EntryKey, manifest_path
from skipweave.store.format.manifest import bytes_checksum, check_manifest, read_manifest
from skipweave.store.fs import open_payload
from skipweave.store.index import GroupFile, PartIndex


@dataclass(frozen=True)
class Loaded:
    """A served entry: its manifest, the recorded result and the RNG state the real call left."""

    manifest: dict[str, Any]
    result: Any
    rng_state: dict[str, Any] | None
    bytes: int
    effects: dict[str, Any] | None = None
    """The values the target's declared side effects had after the real call (``skip.<role>.effects``)."""
    appended: dict[str, Any] | None = None
    """The declared effects that were lists the real call only appended to, by expression: ``{"n_before": items
    before the call, "tail": the items it appended}`` (such an effect is not in ``effects``); ``None`` when none."""


class EntryReader:
    """Reads, checks and decodes the entries of one role.

    Args:
        folders: the role's folders.
        parts: the role's part index (listings and group files).
        allow_pickle: load entries holding pickled data.
        trusted_classes: ``module:qualname`` classes decoding may construct (see :mod:`skipweave.store.format.codec`).
        views: decode results as read-only views that keep their classes' names instead of rebuilding them
            (:func:`~skipweave.store.format.codec.decode_view`; ``skipweave diff``).
    """

    def __init__(self, folders: RoleFolders, parts: PartIndex, *, allow_pickle: bool,
                 trusted_classes: tuple[str, ...], views: bool = False) -> None:
        self._folders = folders
        self._parts = parts
        self.allow_pickle = allow_pickle
        self.trusted_classes = trusted_classes
        self.views = views

    def load(self, key: EntryKey, *, mtime: Mtime | None = None) -> Loaded:
        """Read, check, verify and decode one entry (see :meth:`~skipweave.store.step_store.StepStore.load`)."""
        from skipweave.store.format import tensorfile  # torch: imported on first use, not by the CLI

        folder, mtime = self._folders.checked(key.step, key.target, mtime)
        listing = self._parts.listing((key.step, key.target, key.shard), mtime)
        if listing is not None and key.call not in listing.own:
            # the folder is as it was listed, and held no manifest of the call's own: served from its group
            return self._load_grouped(key, folder, listing.groups)
        where = manifest_path(self._folders.dump_dir, key)
        try:
            manifest = read_manifest(where)
        except FileNotFoundError:
            return self._load_grouped(key, folder)
        checked = check_manifest(manifest, where, key, allow_pickle=self.allow_pickle)
        tree_bytes = read_verified(os.path.join(folder, checked.tree["name"]), checked.tree)
        label = f"skipweave: replaying {self._folders.role} step {key.step}"
        tensors = tensorfile.read(os.path.join(folder, checked.tensors["name"]), size=int(checked.tensors["bytes"]),
                                  checksum=str(checked.tensors["checksum"]), desc=label)
        return self._decode(where, checked.manifest, tree_bytes, tensors,
                            checked.tree["bytes"] + checked.tensors["bytes"])

    def _decode(self, where: str, manifest: dict[str, Any], tree_bytes: bytes, tensors: dict[str, Any],
                size: int) -> Loaded:
        """Decode a verified entry's tree and tensors into what :meth:`load` returns."""
        return decode_entry(where, manifest, tree_bytes, tensors, size, allow_pickle=self.allow_pickle,
                            trusted_classes=self.trusted_classes, views=self.views)

    def _load_grouped(self, key: EntryKey, folder: str, groups: tuple[GroupFile, ...] | None = None) -> Loaded:
        """:meth:`load` of an entry that has no manifest of its own: from the group file holding its call (among
        ``groups`` when given, see :meth:`~skipweave.store.index.PartIndex.covering`)."""
        group = self._parts.covering(key, groups)
        if group is None:
            raise FileNotFoundError(manifest_path(self._folders.dump_dir, key))
        first, last, name = group
        from skipweave.store.format.tensorfile import tensor_at

        checked, split = self._parts.open_group(key, first, last, name, folder=folder, data=True)
        manifest = entry_of(checked, key, allow_pickle=self.allow_pickle)
        assert split is not None
        section, by_call = split
        if key.call not in by_call:
            raise EntryInvalid(f"group {checked.path} holds no tree for call {key.call}")
        tree_span, spans = by_call[key.call]
        tree_bytes = bytes(section[tree_span[0]:tree_span[1]])
        own = {n: tensor_at(section, span) for n, span in spans.items()}  # owned copies: the group stays as read
        size = len(tree_bytes) + sum(t.numel() * t.element_size() for t in own.values())
        return self._decode(f"{checked.path} (call {key.call})", manifest, tree_bytes, own, size)


def decode_entry(where: str, manifest: dict[str, Any], tree_bytes: bytes, tensors: dict[str, Any], size: int, *,
                 allow_pickle: bool, trusted_classes: tuple[str, ...], views: bool = False) -> Loaded:
    """Decode an entry's verified tree and tensors into a :class:`Loaded` (every reader's last step: a dump dir's
    :class:`EntryReader` and a bundle's store alike).

    Args:
        where: the entry, for messages.
        manifest: its judged manifest.
        tree_bytes: its tree file's bytes.
        tensors: its tensors by name.
        size: its payload bytes (reported).
        allow_pickle, trusted_classes, views: as :class:`EntryReader` takes them.

    Raises:
        EntryInvalid: the tree is unreadable or holds no recorded result.
        codec.CodecError: the payload cannot be decoded here.
    """
    from skipweave.store.format import codec

    try:
        tree = jsonio.loads(tree_bytes)
    except (ValueError, RecursionError) as exc:
        raise EntryInvalid(f"payload of {where} is unreadable: {exc}") from exc
    if views:
        payload = codec.decode_view(tree, tensors, allow_pickle=allow_pickle)
    else:
        payload = codec.decode(tree, tensors, allow_pickle=allow_pickle, trusted=trusted_classes)
    if not isinstance(payload, dict) or "result" not in payload:
        raise EntryInvalid(f"payload of {where} holds no recorded result")
    rng = payload.get("rng")
    effects = payload.get("effects")
    appended = payload.get("appended")
    return Loaded(manifest, payload["result"], rng if isinstance(rng, dict) else None, size,
                  effects if isinstance(effects, dict) else None,
                  appended if isinstance(appended, dict) else None)


def read_verified(path: str, item: dict[str, Any]) -> bytes:
    """Read a small payload file whole and check it against its manifest item (size, checksum).

    Raises:
        EntryInvalid: the file is missing, not a file skipweave wrote, of another size or checksum.
    """
    with open_payload(path, item.get("bytes")) as fh:
        try:
            data = fh.read()
        except OSError as exc:
            raise EntryInvalid(f"payload {path} is unreadable: {exc}") from exc
    if len(data) != item.get("bytes"):
        raise EntryInvalid(f"payload {path} changed size while being read")
    if bytes_checksum(data) != item.get("checksum"):
        raise EntryInvalid(f"payload {path} does not match its checksum {item.get('checksum')}")
    return data


__all__ = ["EntryReader", "Loaded", "decode_entry", "read_verified"]
