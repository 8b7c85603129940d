"""``skipweave ls DUMP_DIR [--json]``: what is recorded, per namespace, role, target and step.

One row per part (a step of a target, for one shard) with its status, entry count, size and creation
time. Sizes are checked, checksums are not (``skipweave verify`` reads every byte). See docs/cli.md for
the ``--json`` schema.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

SCHEMA = "skipweave.ls/1"
EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers: Any) -> None:
    """Add the ``ls`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "ls", help="list recorded namespaces, roles, targets and steps", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema skipweave.ls/1)")
    parser.set_defaults(func=run)


def add_dump_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``DUMP_DIR`` and ``--calls-per-step`` (shared by ls, verify and gc)."""
    parser.add_argument("dump_dir", metavar="DUMP_DIR", help="the store root (skip.<role>.dump_dir)")
    parser.add_argument(
        "--calls-per-step", type=_positive_int, default=None, metavar="N",
        help="calls one shard makes per step (as skip.<role>.calls_per_step); default: learned from closed steps",
    )
    parser.add_argument(
        "--allow-pickle", action="store_true",
        help="judge entries holding pickled data as a run with skip.<role>.allow_pickle=true would "
             "(default: they are 'refused', as a run refuses them)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def scan_or_explain(command: str, args: argparse.Namespace, *, checksums: bool) -> Any:
    """Scan ``args.dump_dir``; on failure print a message for people to stderr and return ``None``."""
    from skipweave.store.inspect import scan

    try:
        return scan(args.dump_dir, checksums=checksums, calls_per_step=args.calls_per_step,
                    allow_pickle=getattr(args, "allow_pickle", False))
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"skipweave {command}: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return None


def misplaced(command: str, result: Any) -> bool:
    """When ``result`` is empty but entries sit below it at another depth, say where to look (stderr).

    Returns:
        True when the message was printed: the caller exits 2, as for any dump dir that cannot be read.
    """
    from skipweave.store.inspect import find_dump_dir_hint

    if result.parts or result.leftovers:
        return False
    hint = find_dump_dir_hint(result.dump_dir)
    if hint is None:
        return False
    print(f"skipweave {command}: {result.dump_dir} is not a dump dir, but entries sit below it: "
          f"try `skipweave {command} {hint}`", file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    """List the dump dir; return 0, or 2 when it cannot be read."""
    result = scan_or_explain("ls", args, checksums=False)
    if result is None or misplaced("ls", result):
        return EXIT_USAGE
    if args.json:
        doc = {
            "schema": SCHEMA,
            "dump_dir": result.dump_dir,
            "checksums_checked": False,
            "totals": result.totals(),
            "namespaces": result.tree(),
            "leftovers": [x.as_dict() for x in result.leftovers],
            "ignored": ignored_list(result),
        }
        emit(json.dumps(doc, indent=2))
        return EXIT_OK
    emit(render(result))
    return EXIT_OK


def render(result: Any) -> str:
    """Return the human listing of a :class:`~skipweave.store.inspect.DumpScan`."""
    from skipweave.store.inspect import Status, human_bytes, human_time, plural

    lines = [f"dump dir {result.dump_dir}"]
    if not result.parts and not result.leftovers:
        lines.append("nothing recorded yet")
        return "\n".join(lines)
    for ns in result.tree():
        for role in ns["roles"]:
            lines.append(f"{ns['name']}/{role['name']}")
            for target in role["targets"]:
                lines.append(f"  target {target['name']}")
                rows = [["STEP", "SHARD", "STATUS", "ENTRIES", "SIZE", "CREATED"]]
                for p in target["parts"]:
                    rows.append([
                        str(p["step"]), p["shard"], p["status"], str(p["entries"]), human_bytes(p["bytes"]),
                        human_time(p["created_unix"]),
                    ])
                lines += ["    " + r for r in table(rows)]
    totals = result.totals()
    parts = totals["parts_by_status"]
    summary = (
        f"{plural(totals['parts'], 'part')}, {plural(totals['entries'], 'entry', 'entries')}, "
        f"{human_bytes(totals['bytes'])}: "
        f"{parts[Status.COMPLETE.value]} complete, {parts[Status.INCOMPLETE.value]} incomplete, "
        + (f"{parts[Status.REFUSED.value]} refused (pickled), " if parts[Status.REFUSED.value] else "")
        + f"{parts[Status.CORRUPT.value]} corrupt (sizes checked; `skipweave verify` checks checksums)"
    )
    lines.append(summary)
    if result.leftovers:
        lines.append(f"leftovers: {leftover_summary(result.leftovers)}; `skipweave gc` removes them")
    lines += ignored_lines(result)
    return "\n".join(lines)


def ignored_list(result: Any) -> list[dict[str, str]]:
    """The ``ignored`` list of the JSON documents: names skipweave never writes, each ``{path, why}``."""
    return [{"path": path, "why": why} for path, why in result.ignored]


def ignored_lines(result: Any, limit: int = 10) -> list[str]:
    """Human lines for the names a scan ignored (symlinks, stray files and folders); none when there are none."""
    if not result.ignored:
        return []
    lines = [f"ignored (never followed, read or removed): {len(result.ignored)} name(s) skipweave does not write"]
    lines += [f"  {path}: {why}" for path, why in result.ignored[:limit]]
    if len(result.ignored) > limit:
        lines.append(f"  ... and {len(result.ignored) - limit} more")
    return lines


def leftover_summary(leftovers: list[Any]) -> str:
    """Return e.g. ``2 temporary files, 1 set-aside folder (3.1 KiB)``."""
    from skipweave.store.inspect import LeftoverKind, human_bytes, plural

    names = {
        LeftoverKind.TEMPORARY: "temporary file",
        LeftoverKind.ORPHAN: "orphan payload file",
        LeftoverKind.SET_ASIDE: "set-aside folder",
    }
    parts = []
    for kind, one in names.items():
        n = sum(1 for x in leftovers if x.kind is kind)
        if n:
            parts.append(plural(n, one))
    return ", ".join(parts) + f" ({human_bytes(sum(x.bytes for x in leftovers))})"


def emit(text: str) -> None:
    """Print ``text`` to stdout; a reader that stops early (``| head``) ends the output quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)


def table(rows: list[list[str]]) -> list[str]:
    """Return rows of cells as left-aligned text columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
