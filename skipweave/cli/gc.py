"""``skipweave gc DUMP_DIR [--yes] [--min-age SECONDS] [--json]``: remove what no run will ever serve.

Removes corrupt entries, incomplete parts, leftover temporary files, orphan payload files, set-aside
folders and the marks of runs that ended (``.runs/{run}``). A dry run unless ``--yes``. Never touches a
complete, valid entry: each entry is checked again under its writer's lock right before it is removed.

Anything a running writer may still own (temporary files, orphan payload files, incomplete parts,
set-aside folders, run marks) is kept while it was modified less than ``--min-age`` seconds ago (default 3600).
Pass ``--min-age 0`` when no run is writing to the dump dir. A run's marks go once its first process is known
to have ended, or, when that cannot be checked (it ran on another host), once nothing in them changed for 7
days. Exits 0, 1 when some removal failed, 2 when the dump dir cannot be read. See docs/cli.md for the
``--json`` schema.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from skipweave.cli.common import (
    EXIT_USAGE,
    add_dump_dir_arguments,
    add_json_argument,
    emit,
    emit_json,
    misplaced,
    scan_or_explain,
)
from skipweave.cli.format import action_doc, human_bytes, ignored_lines, ignored_list, plural

logger = logging.getLogger(__name__)

SCHEMA = "skipweave.gc/1"
DEFAULT_MIN_AGE_S = 3600.0
"""Default ``--min-age``: a step's calls can be an hour apart, and a writer touches its part at each one."""
EXIT_OK, EXIT_FAILED = 0, 1

_LABELS = {
    "corrupt_entry": "corrupt entry",
    "incomplete_part": "incomplete part",
    "temporary": "temporary file",
    "orphan": "orphan payload file",
    "set_aside": "set-aside folder",
    "run_marks": "run marks",
}
_OUTCOMES = {"would_remove": "would remove", "removed": "removed", "skipped": "kept", "failed": "FAILED"}


def register(subparsers: Any) -> None:
    """Add the ``gc`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "gc", help="remove corrupt or incomplete entries, leftovers and ended runs' marks (dry run unless --yes)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    parser.add_argument("--yes", action="store_true", help="really remove (default: only list what would go)")
    parser.add_argument(
        "--min-age", type=_seconds, default=DEFAULT_MIN_AGE_S, metavar="SECONDS",
        help="keep items a writer may own that changed less than this ago (default %(default).0f)",
    )
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {value:g}")
    return value


def run(args: argparse.Namespace) -> int:
    """Plan and (with ``--yes``) carry out the removals; return 0, 1 (a removal failed) or 2."""
    from skipweave.store.gc import apply_gc, plan_gc
    from skipweave.store.scan import Status

    result = scan_or_explain("gc", args, checksums=True)
    if result is None or misplaced("gc", result):
        return EXIT_USAGE
    dry_run = not args.yes
    now = time.time()
    actions = plan_gc(result)
    for action in actions:
        apply_gc(result, action, min_age=args.min_age, dry_run=dry_run, now=now)
        if action.outcome in ("removed", "failed"):
            logger.info("skipweave gc: %s %s (%s)", action.outcome, action.path, action.detail or action.reason)
    kept = sum(1 for e in result.entries() if e.status is Status.COMPLETE)
    done = [a for a in actions if a.outcome in ("removed", "would_remove")]
    freed = sum(a.bytes for a in done)
    failed = any(a.outcome == "failed" for a in actions)
    if args.json:
        emit_json({
            "schema": SCHEMA,
            "dump_dir": result.dump_dir,
            "dry_run": dry_run,
            "min_age_seconds": args.min_age,
            "actions": [action_doc(a) for a in actions],
            "freed_bytes": freed,
            "complete_entries_kept": kept,
            "ignored": ignored_list(result),
        })
        return EXIT_FAILED if failed else EXIT_OK
    emit("\n".join([render(result.dump_dir, actions, dry_run=dry_run, freed=freed, kept=kept),
                    *ignored_lines(result)]))
    return EXIT_FAILED if failed else EXIT_OK


def render(dump_dir: str, actions: list[Any], *, dry_run: bool, freed: int, kept: int) -> str:
    """Return the human report of a gc run."""
    head = f"gc {dump_dir}"
    lines = [head + (" (dry run: nothing is removed; pass --yes to remove)" if dry_run else "")]
    if not actions:
        lines.append(f"nothing to remove; {plural(kept, 'complete entry', 'complete entries')} kept")
        return "\n".join(lines)
    for a in actions:
        if a.kind.value == "run_marks":
            continue  # one line per outcome below
        label = _LABELS.get(a.kind.value, a.kind.value)
        what = a.where or a.path
        count = "folder" if a.kind.value == "set_aside" else plural(len(a.files), "file")
        lines.append(f"{_OUTCOMES[a.outcome]:<12} {label:<19} {what}  ({count}, {human_bytes(a.bytes)})")
        if a.where:
            lines.append(f"{'':<13}at {a.path}")
        lines.append(f"{'':<13}why: {a.reason}")
        if a.detail:
            lines.append(f"{'':<13}{'kept' if a.outcome == 'skipped' else 'error'}: {a.detail}")
    lines += _run_mark_lines(dump_dir, [a for a in actions if a.kind.value == "run_marks"])
    verb = "would free" if dry_run else "freed"
    n_done = sum(1 for a in actions if a.outcome in ("removed", "would_remove"))
    n_kept = sum(1 for a in actions if a.outcome == "skipped")
    summary = (f"{plural(n_done, 'item')}, {verb} {human_bytes(freed)}; "
               f"{plural(kept, 'complete entry', 'complete entries')} kept")
    if n_kept:
        summary += f"; {n_kept} kept for safety"
        if any("min-age" in (a.detail or "") for a in actions):
            summary += " (pass --min-age 0 if no run is writing to this dump dir)"
    n_failed = sum(1 for a in actions if a.outcome == "failed")
    if n_failed:
        summary += f"; {n_failed} FAILED"
    lines.append(summary)
    return "\n".join(lines)


def _run_mark_lines(dump_dir: str, actions: list[Any]) -> list[str]:
    """The run-mark actions, one line per outcome: a shared store holds a folder per run, too many to list
    one by one (``--json`` has each, with why its run counts as ended)."""
    from skipweave.store.fs import RUNS

    lines = []
    for outcome, word in _OUTCOMES.items():
        group = [a for a in actions if a.outcome == outcome]
        if not group:
            continue
        size = human_bytes(sum(a.bytes for a in group))
        lines.append(f"{word:<12} {_LABELS['run_marks']:<19} {os.path.join(dump_dir, RUNS)}  "
                     f"({plural(len(group), 'run folder')}, {size})")
        lines.append(f"{'':<13}why: the runs ended; their processes left these marks for each other's exit summary")
        details = list(dict.fromkeys(a.detail for a in group if a.detail))
        if details:
            more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
            lines.append(f"{'':<13}{'kept' if outcome == 'skipped' else 'error'}: {details[0]}{more}")
    return lines
