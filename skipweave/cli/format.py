"""How the store commands show a scan: text for people (sizes, times, tables) and the JSON objects docs/cli.md
documents (``part``, ``leftover``, ``totals``, ``namespaces``, ``action``, ``ignored``).

The scan model (:mod:`skipweave.store.scan`, :mod:`skipweave.store.gc`) holds plain data; its presentation lives
here, beside the commands that print it. The store is imported when a function runs, not at import time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

__all__ = ["action_doc", "human_bytes", "human_time", "ignored_lines", "ignored_list", "leftover_doc",
           "leftover_summary", "namespaces_doc", "part_doc", "plural", "status_counts", "table", "totals_doc"]


# ---------------------------------------------------------------------------------------------- text for people
def human_bytes(n: int) -> str:
    """Return ``n`` bytes as ``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def plural(n: int, one: str, many: str | None = None) -> str:
    """Return ``"1 entry"`` / ``"3 entries"``: ``n`` and the word in the right number."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def human_time(unix: float | None) -> str:
    """Return a unix time (seconds) as local ``YYYY-MM-DD HH:MM:SS``, or ``-`` when unknown."""
    try:
        return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))
    except (OverflowError, ValueError, OSError):  # a crafted time: not one a clock gives
        return "-"


def table(rows: list[list[str]]) -> list[str]:
    """Return rows of cells as left-aligned text columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def ignored_lines(result: Any, limit: int = 10) -> list[str]:
    """Human lines for the names a scan ignored (symlinks, stray files and folders); none when there are none.

    Args:
        result: the :class:`~skipweave.store.scan.DumpScan`.
        limit: names listed at most; the rest are counted.
    """
    if not result.ignored:
        return []
    lines = [f"ignored (never followed, read or removed): {len(result.ignored)} name(s) skipweave does not write"]
    lines += [f"  {path}: {why}" for path, why in result.ignored[:limit]]
    if len(result.ignored) > limit:
        lines.append(f"  ... and {len(result.ignored) - limit} more")
    return lines


def leftover_summary(leftovers: list[Any]) -> str:
    """Return e.g. ``2 temporary files, 1 set-aside folder (3.1 KiB)`` for :class:`~skipweave.store.leftovers.Leftover`
    items."""
    from skipweave.store.leftovers import LeftoverKind

    names = {
        LeftoverKind.TEMPORARY: "temporary file",
        LeftoverKind.ORPHAN: "orphan payload file",
        LeftoverKind.SET_ASIDE: "set-aside folder",
        LeftoverKind.TRASH: "trash folder",
    }
    parts = []
    for kind, one in names.items():
        n = sum(1 for x in leftovers if x.kind is kind)
        if n:
            parts.append(plural(n, one))
    return ", ".join(parts) + f" ({human_bytes(sum(x.bytes for x in leftovers))})"


# ---------------------------------------------------------------------------------------------- JSON objects
def ignored_list(result: Any) -> list[dict[str, str]]:
    """The ``ignored`` list of the JSON documents: names skipweave never writes, each ``{path, why}``."""
    return [{"path": path, "why": why} for path, why in result.ignored]


def status_counts(statuses: Iterable[Any]) -> dict[str, int]:
    """Count :class:`~skipweave.store.scan.Status` values by name; every status is a key, also at 0."""
    from skipweave.store.scan import Status

    counts = {s.value: 0 for s in Status}
    for s in statuses:
        counts[s.value] += 1
    return counts


def part_doc(part: Any) -> dict[str, Any]:
    """The ``part`` object documented in docs/cli.md, of a :class:`~skipweave.store.scan.PartScan`."""
    from skipweave.store.scan import Status

    first = min(part.entries, key=lambda e: e.created_unix or float("inf")) if part.entries else None
    return {
        "step": part.step,
        "shard": part.shard,
        "status": part.status.value,
        "closed": part.closed,
        "expected_calls": part.expected_calls,
        "entries": len(part.entries),
        "entries_by_status": status_counts(e.status for e in part.entries),
        "bytes": part.bytes,
        "created": (first.manifest or {}).get("created") if first else None,
        "created_unix": part.created_unix,
        "modified_unix": part.modified,
        "generation_seconds": sum(e.generation_seconds for e in part.entries),
        "path": part.folder,
        "reason": part.incomplete_reason if part.status is Status.INCOMPLETE else None,
        "foreign": foreign_docs(part),
    }


def foreign_docs(part: Any) -> list[dict[str, Any]]:
    """The part's foreign entries (of a format version this skipweave does not read): one object per version and
    writer, ``{"format_version", "written_by", "calls"}``; empty when it holds none."""
    found: dict[tuple[int, str | None], list[int]] = {}
    for e in part.entries:
        if e.foreign is not None:
            found.setdefault((e.foreign.version, e.foreign.writer), []).append(e.key.call)
    return [{"format_version": v, "written_by": w, "calls": calls} for (v, w), calls in found.items()]


def foreign_text(docs: list[dict[str, Any]]) -> str:
    """``format 3, skipweave 0.3.0`` for :func:`foreign_docs` (several versions joined by ``; ``)."""
    return "; ".join(f"format {d['format_version']}" + (f", skipweave {d['written_by']}" if d["written_by"] else "")
                     for d in docs)


def leftover_doc(leftover: Any) -> dict[str, Any]:
    """The ``leftover`` object documented in docs/cli.md, of a :class:`~skipweave.store.leftovers.Leftover`."""
    return {"kind": leftover.kind.value, "path": leftover.path, "bytes": leftover.bytes,
            "modified_unix": leftover.modified}


def totals_doc(result: Any) -> dict[str, Any]:
    """The ``totals`` object documented in docs/cli.md, of a :class:`~skipweave.store.scan.DumpScan`."""
    return {
        "parts": len(result.parts),
        "parts_by_status": status_counts(p.status for p in result.parts),
        "entries": sum(len(p.entries) for p in result.parts),
        "entries_by_status": status_counts(e.status for e in result.entries()),
        "bytes": sum(p.bytes for p in result.parts),
        "leftovers": len(result.leftovers),
        "leftover_bytes": sum(x.bytes for x in result.leftovers),
    }


def namespaces_doc(result: Any) -> list[dict[str, Any]]:
    """The nested ``namespaces`` list documented in docs/cli.md (namespaces > roles > targets > parts), of a
    :class:`~skipweave.store.scan.DumpScan`."""
    out: list[dict[str, Any]] = []
    index: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for p in result.parts:
        ns_key, role_key, target_key = (p.namespace,), (p.namespace, p.role), (p.namespace, p.role, p.target)
        if ns_key not in index:
            roles: list[dict[str, Any]] = []
            out.append({"name": p.namespace, "roles": roles})
            index[ns_key] = roles
        if role_key not in index:
            targets: list[dict[str, Any]] = []
            index[ns_key].append({"name": p.role, "targets": targets})
            index[role_key] = targets
        if target_key not in index:
            parts: list[dict[str, Any]] = []
            index[role_key].append({"name": p.target, "parts": parts})
            index[target_key] = parts
        index[target_key].append(part_doc(p))
    return out


def action_doc(action: Any) -> dict[str, Any]:
    """The ``action`` object documented in docs/cli.md, of a :class:`~skipweave.store.gc.GcAction`."""
    return {
        "kind": action.kind.value, "path": action.path, "where": action.where, "files": action.files,
        "bytes": action.bytes, "reason": action.reason, "outcome": action.outcome, "detail": action.detail,
    }
