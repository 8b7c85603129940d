"""Crafting dump dirs the way someone distrusting a folder would: self-consistent entries (checksums match)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skipweave.store.format.manifest import bytes_checksum


def manifests(dump: Path) -> list[Path]:
    """Every committed manifest below ``dump`` (set-aside folders excluded), sorted."""
    return sorted(p for p in dump.rglob("*.manifest.json") if "_set_aside" not in p.parts)


def rewrite(manifest: Path, *, tree: Callable[[dict[str, Any]], None] | None = None,
            fields: dict[str, Any] | None = None) -> None:
    """Change an entry's tree and/or manifest fields, then make its sizes and checksums match again.

    Args:
        manifest: the entry's manifest.
        tree: edits the parsed tree (``{"codec_version", "root"}``) in place.
        fields: manifest fields to overwrite (e.g. ``{"step": 9}``, ``{"pickled": True}``).
    """
    doc = json.loads(manifest.read_text())
    if tree is not None:
        item = next(i for i in doc["payload"] if i["name"].endswith(".tree.json"))
        path = manifest.parent / item["name"]
        parsed = json.loads(path.read_bytes())
        tree(parsed)
        data = json.dumps(parsed).encode()
        path.write_bytes(data)
        item["bytes"], item["checksum"] = len(data), bytes_checksum(data)
    doc.update(fields or {})
    manifest.write_text(json.dumps(doc))


def result_node(tree: dict[str, Any]) -> dict[str, Any]:
    """The node of the recorded result inside an entry's tree (``{"result": ..., "rng": ...}``)."""
    return tree["root"]["v"]["result"]  # type: ignore[no-any-return]


def outside_files(root: Path) -> dict[str, bytes]:
    """Contents of every file below ``root`` (a folder outside the store that must stay untouched)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
