"""``skipweave gc DUMP_DIR [--yes] [--min-age SECONDS] [--json] [--keep-last N] [--max-bytes SIZE] [--pin STEPS ...]
[--namespace NS] [--role ROLE]``: remove broken, leftover and incomplete data, and recorded steps a retention rule
selects.

Removes corrupt entries, incomplete parts (a run whose calls are matched by inputs would resume one, its entries
serving the calls with the same inputs: removing it loses that, and its "why" line says so), leftover temporary
files, orphan payload files, set-aside folders and the marks of runs that ended (``.runs/{run}``). A dry run
unless ``--yes``. Never touches a complete, valid entry: each entry is checked again under its writer's lock right
before it is removed.

Anything a running writer may still own (temporary files, orphan payload files, incomplete parts,
set-aside folders, run marks) is kept while it was modified less than ``--min-age`` seconds ago (default 3600).
Pass ``--min-age 0`` when no run is writing to the dump dir. A run's marks go once its first process is known
to have ended, or, when that cannot be checked (it ran on another host), once nothing in them changed for 7
days -- unless they hold a Ray driver's mark (``.shared.json``), which workers its run starts later check: kept
until the run is known to have ended. Exits 0, 1 when some removal failed, 2 when the dump dir cannot be read
or an argument is bad (a ``--namespace`` or ``--role`` naming no role with recorded steps, too). See docs/cli.md for
the ``--json`` schema.

Retention (``--keep-last N``, ``--max-bytes SIZE``, as ``skip.<role>.keep`` in a run): in each role (of
``--namespace``, ``--role`` when given), whole steps beyond the newest N go, then the oldest until the role's steps
hold at most SIZE (``500GB``, ``2GiB``); never a ``--pin`` step (``--pin all``: none goes), nor one with a part that
is not closed whose writer runs on this host or that changed less than ``--min-age`` ago. Each step is renamed to
``.trash-{step}-{token}`` (never served) before it is deleted, so a kill leaves no partial step; the next gc removes
the trash.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import time
from typing import Any

from skipweave.cli.common import (
    EXIT_USAGE,
    add_dump_dir_arguments,
    add_json_argument,
    emit,
    emit_json,
    misplaced,
    positive_int,
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
    "trash": "trash folder",
    "retention": "recorded step",
    "foreign": "foreign part",
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
    keep = parser.add_argument_group("retention (whole recorded steps; the same rule as skip.<role>.keep)")
    keep.add_argument("--keep-last", type=positive_int, default=None, metavar="N",
                      help="remove every step but the newest N of each role")
    keep.add_argument("--max-bytes", type=_size, default=None, metavar="SIZE",
                      help="then remove each role's oldest steps until its steps hold at most SIZE (e.g. 500GB, 2GiB)")
    keep.add_argument("--pin", nargs="+", action="extend", default=None, metavar="STEPS",
                      help="steps never removed: steps and ranges (3 10-20), or all (retention then removes no step); "
                           "repeatable")
    keep.add_argument("--namespace", default=None, metavar="NS", help="apply retention to this namespace only")
    keep.add_argument("--role", default=None, metavar="ROLE", help="apply retention to this role only")
    parser.set_defaults(func=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more seconds, got {value:g}")
    return value


def _size(text: str) -> int:
    from skipweave.config.errors import ConfigError
    from skipweave.config.values import parse_bytes

    try:
        return parse_bytes("--max-bytes", text)
    except ConfigError as exc:  # (argparse names the flag: "argument --max-bytes: ...", exit status 2)
        raise argparse.ArgumentTypeError(f"expected {exc.allowed}, got {text!r}") from None


def _rule(args: argparse.Namespace) -> Any:
    """The :class:`~skipweave.store.retention.KeepRule` of the retention flags, ``None`` without ``--keep-last`` or
    ``--max-bytes``; a message and ``False`` when the flags cannot be used."""
    from skipweave.config.errors import ConfigError
    from skipweave.store.fs import name_problem
    from skipweave.store.retention import KeepRule

    if args.keep_last is None and args.max_bytes is None:
        extra = [f for f, v in (("--pin", args.pin), ("--namespace", args.namespace), ("--role", args.role)) if v]
        if extra:
            print(f"skipweave gc: {', '.join(extra)} needs --keep-last or --max-bytes (they scope retention)",
                  file=sys.stderr)
            return False
        return None
    for flag, value in (("--namespace", args.namespace), ("--role", args.role)):
        if value is not None and (problem := name_problem(value)) is not None:
            print(f"skipweave gc: {flag} {value!r} {problem}", file=sys.stderr)
            return False
    try:
        pin = _pin(args.pin) if args.pin else ()
    except ConfigError as exc:
        print(f"skipweave gc: {exc}", file=sys.stderr)
        return False
    return KeepRule(args.keep_last, args.max_bytes, pin)


PIN_ALLOWED = "steps (3), inclusive ranges (10-20) or all (every step pinned: retention removes none)"


def _pin(values: list[str]) -> Any:
    """The :class:`~skipweave.config.values.StepSet` of the ``--pin`` values: each a step, a range ``a-b`` or ``all``.

    Raises:
        ConfigError: key ``--pin``, naming the first value that is none of :data:`PIN_ALLOWED` (the config's list of
            forms, ``{start: 3, end: 7}`` among them, has no use on a command line).
    """
    from skipweave.config.errors import ConfigError
    from skipweave.config.values import StepSet, parse_steps

    if any(v.strip().lower() == "all" for v in values):
        return StepSet(None)
    for value in values:
        try:
            parse_steps("--pin", int(value) if value.isdigit() else value)
        except ConfigError:
            reversed_range = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
            raise ConfigError("--pin", value, PIN_ALLOWED + (
                "; a range ends at or after its start" if reversed_range else "")) from None
    return parse_steps("--pin", [int(v) if v.isdigit() else v for v in values])


def _scope_problem(args: argparse.Namespace, result: Any) -> str | None:
    """Why ``--namespace`` / ``--role`` name no role with recorded steps in the scanned dump dir ``result`` (then
    retention would remove nothing, silently), naming what the dump dir has; ``None`` when they name one."""
    roles = list(dict.fromkeys((p.namespace, p.role) for p in result.parts))  # (retention acts on these only)
    namespaces = sorted({ns for ns, _ in roles})
    if args.namespace is not None and args.namespace not in namespaces:
        return (f"--namespace {args.namespace!r} names no namespace with recorded steps in {result.dump_dir}; "
                f"it has: {', '.join(namespaces) or 'none'}")
    if args.role is not None:
        names = sorted({name for ns, name in roles if args.namespace in (None, ns)})
        if args.role not in names:
            where = f"namespace {args.namespace} of " if args.namespace is not None else ""
            return (f"--role {args.role!r} names no role with recorded steps in {where}{result.dump_dir}; "
                    f"it has: {', '.join(names) or 'none'}")
    return None


def run(args: argparse.Namespace) -> int:
    """Plan and (with ``--yes``) carry out the removals; return 0, 1 (a removal failed) or 2."""
    from skipweave.store.bundle.layout import is_bundle_path
    from skipweave.store.gc import apply_gc, hold_role_locks, plan_gc, plan_retention_gc, without_removed_steps
    from skipweave.store.scan import Status

    if is_bundle_path(args.dump_dir):
        print(f"skipweave gc: {args.dump_dir} names a bundle (a .zip file), which gc never changes; `skipweave pack` "
              "writes a new one", file=sys.stderr)
        return EXIT_USAGE
    rule = _rule(args)
    if rule is False:
        return EXIT_USAGE
    result = scan_or_explain("gc", args, checksums=True)
    if result is None or misplaced("gc", result):
        return EXIT_USAGE
    if rule is not None and (problem := _scope_problem(args, result)) is not None:
        print(f"skipweave gc: {problem}", file=sys.stderr)  # a typo would else remove nothing and exit 0
        return EXIT_USAGE
    dry_run = not args.yes
    now = time.time()
    with contextlib.ExitStack() as held:
        retention = [] if rule is None else plan_retention_gc(
            result, rule, namespace=args.namespace, role=args.role, min_age=args.min_age, now=now)
        if retention and not dry_run:
            hold_role_locks(result.dump_dir, retention, held)  # one process cleans a role at a time
        # What lies in a step retention removes goes with it, in the dry run too: both list the same.
        actions = retention + without_removed_steps(plan_gc(result), retention)
        for action in actions:
            apply_gc(result, action, min_age=args.min_age, dry_run=dry_run, now=now)
            if action.outcome in ("removed", "failed"):
                logger.info("skipweave gc: %s %s (%s)", action.outcome, action.path, action.detail or action.reason)
    gone = tuple(a.path + os.sep for a in retention if a.outcome in ("removed", "would_remove"))
    kept = sum(1 for e in result.entries() if e.status is Status.COMPLETE and not (gone and e.path.startswith(gone)))
    done = [a for a in actions if a.outcome in ("removed", "would_remove")]
    freed = sum(a.bytes for a in done)
    failed = any(a.outcome == "failed" for a in actions)
    if args.json:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "dump_dir": result.dump_dir,
            "dry_run": dry_run,
            "min_age_seconds": args.min_age,
            "actions": [action_doc(a) for a in actions],
            "freed_bytes": freed,
            "complete_entries_kept": kept,
            "ignored": ignored_list(result),
        }
        if rule is not None:  # (only with the retention flags: without them the document is as it always was)
            doc["retention"] = {"keep_last": rule.last, "max_bytes": rule.max_bytes,
                                "pin": args.pin or [], "namespace": args.namespace, "role": args.role}
        emit_json(doc)
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
        count = "folder" if a.kind.value in ("set_aside", "trash") else \
            plural(a.removal.files, "file") if a.removal is not None else plural(len(a.files), "file")
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
        if any(a.kind.value == "foreign" for a in actions):
            summary += " (foreign parts: written by a skipweave that reads a newer format)"
        if any("min-age" in (a.detail or "") for a in actions):
            summary += " (pass --min-age 0 if no run is writing to this dump dir)"
    n_failed = sum(1 for a in actions if a.outcome == "failed")
    if n_failed:
        summary += f"; {n_failed} FAILED"
    lines.append(summary)
    return "\n".join(lines)


def _run_mark_lines(dump_dir: str, actions: list[Any]) -> list[str]:
    """The run-mark actions, one line per outcome (and apart, the folders kept for a driver's mark): a shared store
    holds a folder per run, too many to list one by one (``--json`` has each, with why its run counts as ended)."""
    from skipweave.store.fs import RUNS

    lines = []
    groups = [(outcome, word, marked) for outcome, word in _OUTCOMES.items() for marked in (False, True)]
    for outcome, word, marked in groups:
        group = [a for a in actions if a.outcome == outcome and (a.kept is not None) is marked]
        if not group:
            continue
        size = human_bytes(sum(a.bytes for a in group))
        lines.append(f"{word:<12} {_LABELS['run_marks']:<19} {os.path.join(dump_dir, RUNS)}  "
                     f"({plural(len(group), 'run folder')}, {size})")
        details = list(dict.fromkeys(a.detail for a in group if a.detail))
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        if outcome == "skipped":  # one statement per folder: why it stays, not also why it would have gone
            why = "nothing in them changed for days, but their runs are not known to have ended: " if marked else ""
            lines.append(f"{'':<13}kept: {why}{details[0] if details else 'see --json'}{more}")
            continue
        lines.append(f"{'':<13}why: the runs ended; their processes left these marks for each other's exit summary")
        if details:
            lines.append(f"{'':<13}error: {details[0]}{more}")
    return lines
