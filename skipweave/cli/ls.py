"""``skipweave ls DUMP_DIR [--json]``: what is recorded, per namespace, role, target and step.

One row per part (a step of a target, for one shard) with its status, entry count, size and creation
time. Sizes are checked, checksums are not (``skipweave verify`` reads every byte). See docs/cli.md for
the ``--json`` schema.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from skipweave.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_dump_dir_arguments,
    add_json_argument,
    emit,
    emit_json,
    misplaced,
    scan_or_explain,
)
from skipweave.cli.format import (
    foreign_text,
    human_bytes,
    human_time,
    ignored_lines,
    ignored_list,
    leftover_doc,
    leftover_summary,
    namespaces_doc,
    plural,
    table,
    totals_doc,
)

SCHEMA = "skipweave.ls/1"


def register(subparsers: Any) -> None:
    """Add the ``ls`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "ls", help="list recorded namespaces, roles, targets and steps", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List the dump dir; return 0, or 2 when it cannot be read."""
    result = scan_or_explain("ls", args, checksums=False)
    if result is None or misplaced("ls", result):
        return EXIT_USAGE
    if args.json:
        emit_json({
            "schema": SCHEMA,
            "dump_dir": result.dump_dir,
            "checksums_checked": False,
            "totals": totals_doc(result),
            "namespaces": namespaces_doc(result),
            "leftovers": [leftover_doc(x) for x in result.leftovers],
            "ignored": ignored_list(result),
        })
        return EXIT_OK
    emit(render(result))
    return EXIT_OK


def render(result: Any) -> str:
    """Return the human listing of a :class:`~skipweave.store.scan.DumpScan`."""
    from skipweave.store.bundle.layout import is_bundle_path
    from skipweave.store.scan import Status

    lines = [f"{'bundle' if is_bundle_path(result.dump_dir) else 'dump dir'} {result.dump_dir}"]
    if not result.parts and not result.leftovers:
        lines.append("nothing recorded yet")
        return "\n".join(lines)
    example: str | None = None  # one entry's manifest, for the closing `skipweave show` hint
    for ns in namespaces_doc(result):
        for role in ns["roles"]:
            lines.append(f"{ns['name']}/{role['name']}")
            for target in role["targets"]:
                folder = os.path.join(ns["name"], role["name"], "STEP", target["name"])
                lines.append(f"  target {target['name']}  ({folder}{os.sep})")
                if example is None:
                    example = _first_manifest(target["parts"])
                rows = [["STEP", "SHARD", "STATUS", "ENTRIES", "SIZE", "CREATED"]]
                for p in target["parts"]:
                    status = p["status"]
                    if p["foreign"]:  # which version, and which skipweave to upgrade to
                        status = (status if status == "foreign" else f"{status}, foreign") + \
                            f" ({foreign_text(p['foreign'])})"
                    rows.append([
                        str(p["step"]), p["shard"], status, str(p["entries"]), human_bytes(p["bytes"]),
                        human_time(p["created_unix"]),
                    ])
                lines += ["    " + r for r in table(rows)]
    totals = totals_doc(result)
    parts = totals["parts_by_status"]
    summary = (
        f"{plural(totals['parts'], 'part')}, {plural(totals['entries'], 'entry', 'entries')}, "
        f"{human_bytes(totals['bytes'])}: "
        f"{parts[Status.COMPLETE.value]} complete, {parts[Status.INCOMPLETE.value]} incomplete, "
        + (f"{parts[Status.REFUSED.value]} refused (pickled), " if parts[Status.REFUSED.value] else "")
        + (f"{parts[Status.FOREIGN.value]} foreign (a newer format: kept, never served; upgrade skipweave to read "
           "them), " if parts[Status.FOREIGN.value] else "")
        + f"{parts[Status.CORRUPT.value]} corrupt (sizes checked; `skipweave verify` checks checksums)"
    )
    lines.append(summary)
    if example is not None:
        lines.append(f"one entry: skipweave show {shlex.quote(example)}")
    if result.leftovers:
        lines.append(f"leftovers: {leftover_summary(result.leftovers)}; `skipweave gc` removes them")
    lines += ignored_lines(result)
    return "\n".join(lines)


def _first_manifest(parts: list[dict[str, Any]]) -> str | None:
    """The manifest path of call 0 of the first complete part (``show`` accepts it for a grouped entry too)."""
    from skipweave.store.format.layout import MANIFEST_SUFFIX

    for p in parts:
        if p["status"] == "complete" and p["path"]:
            return os.path.join(p["path"], f"{p['shard']}-0000{MANIFEST_SUFFIX}")
    return None
