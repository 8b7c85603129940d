"""``skipweave show BUNDLE/<member>``: one entry of a bundle, shown as ``skipweave show`` shows one of a dump dir.

The entry's files are copied (each checked against the bundle manifest as it is copied) into a private temporary
folder laid out as a dump dir, judged and summarised there by :func:`skipweave.cli.show.describe`, and the
document's paths are made to name the bundle's members. Nothing is written beside the bundle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class NotInBundle(Exception):
    """The path names no single entry of the bundle, or the bundle is refused (the message says which)."""


def split_bundle_path(path: str) -> tuple[str, str] | None:
    """``(bundle, member path inside it)`` when ``path`` is a bundle file (a ``.zip``) or a path below one
    (``run.zip/default/rollout/3/gen/r0-0000.manifest.json``: as ``skipweave ls BUNDLE`` names entries); else
    ``None``."""
    from skipweave.store.bundle.layout import is_bundle_path

    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for i in range(len(parts), 1, -1):
        head = os.sep.join(parts[:i])
        if is_bundle_path(head) and os.path.isfile(head):
            return head, "/".join(parts[i:])
    return None


def describe_in_bundle(bundle: str, inner: str, *, call: int | None, checksums: bool, allow_pickle: bool,
                       resolve_manifest: Callable[[str, int | None], tuple[str, int | None]],
                       describe: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """:func:`~skipweave.cli.show.describe` of an entry inside a bundle (see the module docstring): its target folder's
    manifests, group and part files are copied, the entry resolved among them as in a dump dir, then its payload
    members copied. ``resolve_manifest`` and ``describe`` are :mod:`skipweave.cli.show`'s (handed in: that module
    imports this one).

    Raises:
        NotInBundle: the bundle is refused, or ``inner`` names no single entry of it.
    """
    import tempfile

    from skipweave.store.bundle.archive import BundleArchive, BundleRefused
    from skipweave.store.bundle.layout import file_kind

    try:
        archive = BundleArchive(bundle)
    except BundleRefused as exc:
        raise NotInBundle(str(exc)) from None
    with archive, tempfile.TemporaryDirectory(prefix="skipweave-show-") as tmp:
        inner = inner.strip("/")
        folders = sorted({n.rsplit("/", 1)[0] for n in archive.members})
        if inner.count("/") < 4:  # the bundle, or a folder of it: one target folder below, or name an entry
            below = [f for f in folders if f == inner or f.startswith(inner + "/") or not inner]
            heads = [n for n in archive.members if n.rsplit("/", 1)[0] in below
                     and file_kind(n.rsplit("/", 1)[1]) in ("manifest", "group")]
            if len(below) != 1 or (len(heads) != 1 and call is None):
                listed = "\n  ".join(f"{bundle}/{n}" for n in heads[:10])
                more = f"\n  ... and {len(heads) - 10} more" if len(heads) > 10 else ""
                raise NotInBundle(f"{bundle}/{inner} holds {len(heads)} entries or groups in {len(below)} target "
                                 f"folders; name one (a group with --call N):\n  {listed}{more}")
            inner = heads[0] if len(heads) == 1 and call is None else below[0]
        folder = inner if inner in folders else inner.rsplit("/", 1)[0]
        if folder not in folders:
            raise NotInBundle(f"{bundle} holds no {inner}; `skipweave ls {bundle}` lists its entries")
        local = os.path.join(tmp, *folder.split("/"))
        os.makedirs(local)

        def copy(name: str) -> None:
            with open(os.path.join(local, name.rsplit("/", 1)[1]), "wb") as fh:
                archive.copy_to(name, fh.write)

        try:
            for name in archive.members:  # the folder's manifests, group and part files: what resolves an entry
                if name.rsplit("/", 1)[0] == folder and file_kind(name.rsplit("/", 1)[1]) in ("manifest", "group",
                                                                                               "part"):
                    copy(name)
            target = local if inner == folder else os.path.join(local, inner.rsplit("/", 1)[1])
            manifest_path, entry_call = resolve_manifest(target, call)
            with open(manifest_path, "rb") as fh:
                from skipweave.store.format import jsonio

                head = jsonio.loads(fh.read())
            items = head.get("payload") if isinstance(head, dict) and "payload" in head else \
                [head.get("data")] if isinstance(head, dict) else []
            for item in items or []:
                member = f"{folder}/{item.get('name')}" if isinstance(item, dict) else ""
                if member in archive.members:
                    copy(member)
        except Exception as exc:  # noqa: BLE001 - named by the bundle's member, not the private copy
            if not isinstance(exc, (BundleRefused, ValueError)) and tmp not in str(exc):
                raise
            raise NotInBundle(_renamed(str(exc), tmp, bundle)) from None
        doc = describe(manifest_path, checksums=checksums, allow_pickle=allow_pickle, call=entry_call)
    return _renamed(doc, tmp, bundle)


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` with every string starting with the folder ``old`` made to start with ``new`` instead."""
    if isinstance(value, str):
        return new + value[len(old):] if value.startswith(old) else value.replace(old + os.sep, new + "/")
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    return value


__all__ = ["NotInBundle", "describe_in_bundle", "split_bundle_path"]
