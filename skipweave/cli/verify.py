"""``skipweave verify DUMP_DIR [--json]``: check every manifest and checksum.

Reads every payload byte and judges every entry as a run would (the same function). Exits 0 when
nothing would be served wrongly: every entry is valid, and parts that are only incomplete (an interrupted
run; a run resumes them by inputs, or sets them aside and records them afresh) are listed as a note. Exits 1 when
some entry is corrupt, belongs to another place, or is refused (pickled, without --allow-pickle); 2 when the dump dir
cannot be read; 3 when nothing is wrong but some entries are foreign: of a format version this skipweave does not
read (a newer skipweave wrote them), so it cannot check them; they are kept as they are. Leftovers and ignored names
are listed but are not errors. See docs/cli.md for the ``--json`` schema.
"""

from __future__ import annotations

import argparse
from typing import Any

from skipweave.cli.common import (
    EXIT_USAGE,
    add_dump_dir_arguments,
    add_json_argument,
    emit,
    emit_json,
    misplaced,
    scan_bundle_or_explain,
    scan_or_explain,
)
from skipweave.cli.format import (
    human_bytes,
    ignored_lines,
    ignored_list,
    leftover_doc,
    leftover_summary,
    plural,
    totals_doc,
)

SCHEMA = "skipweave.verify/1"
EXIT_OK, EXIT_PROBLEMS, EXIT_FOREIGN = 0, 1, 3


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "verify", help="check every manifest and checksum; exit 1 if anything is corrupt or refused",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def problems(result: Any) -> list[dict[str, Any]]:
    """Return the ``problems`` list documented in docs/cli.md, in part order (namespace, role, target, step)."""
    from skipweave.cli.format import foreign_docs
    from skipweave.store.scan import Status

    out: list[dict[str, Any]] = []
    for p in result.parts:
        where = {"namespace": p.namespace, "role": p.role, "target": p.target, "step": p.step, "shard": p.shard}
        for e in p.entries:
            if e.status in (Status.CORRUPT, Status.REFUSED):
                out.append({"status": e.status.value, **where, "call": e.key.call, "path": e.path,
                            "reason": e.reason, "entries": [e.path]})
        for doc in foreign_docs(p):  # one per version and writer: a group of thousands of calls is one line
            paths = list(dict.fromkeys(e.path for e in p.entries if e.foreign is not None
                                       and (e.foreign.version, e.foreign.writer) == (doc["format_version"],
                                                                                     doc["written_by"])))
            out.append({"status": "foreign", **where, "call": doc["calls"][0], "path": paths[0],
                        "reason": f"format version {doc['format_version']}, which this skipweave does not read",
                        "entries": paths, **doc})
        if not p.complete:
            out.append({"status": "incomplete", **where, "call": None, "path": p.folder,
                        "reason": p.incomplete_reason, "entries": [e.path for e in p.entries]})
    return out


def run(args: argparse.Namespace) -> int:
    """Verify the dump dir; return 0 (all good), 1 (problems listed) or 2 (unreadable dump dir)."""
    from skipweave.store.bundle.layout import is_bundle_path

    if is_bundle_path(args.dump_dir):  # a bundle refused (damaged, crafted) is a problem found, not a usage error
        result, refused = scan_bundle_or_explain("verify", args, checksums=True)
        if refused:
            return EXIT_PROBLEMS
    else:
        result = scan_or_explain("verify", args, checksums=True)
    if result is None or misplaced("verify", result):
        return EXIT_USAGE
    found = problems(result)
    bad = failing(found)
    foreign = [p for p in found if p["status"] == "foreign"]
    if args.json:
        emit_json({
            "schema": SCHEMA,
            "dump_dir": result.dump_dir,
            "ok": not bad and not foreign,
            "checksums_checked": True,
            "totals": totals_doc(result),
            "problems": found,
            "leftovers": [leftover_doc(x) for x in result.leftovers],
            "ignored": ignored_list(result),
        })
    else:
        emit(render(result, found))
    return EXIT_PROBLEMS if bad else EXIT_FOREIGN if foreign else EXIT_OK


def failing(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The problems that make ``verify`` exit 1: corrupt and refused entries (incomplete parts are a note, foreign
    entries exit 3 when nothing else is wrong)."""
    return [p for p in found if p["status"] not in ("incomplete", "foreign")]


def render(result: Any, found: list[dict[str, Any]]) -> str:
    """Return the human report of a verification."""
    totals = totals_doc(result)
    lines = [f"verified {result.dump_dir}: {plural(totals['entries'], 'entry', 'entries')} in "
             f"{plural(totals['parts'], 'part')}, {human_bytes(totals['bytes'])}, sizes and checksums"]
    for p in found:
        where = f"{p['namespace']}/{p['role']} {p['target']} step {p['step']} shard {p['shard']}"
        if p["status"] == "corrupt":
            lines.append(f"CORRUPT     {where} call {p['call']}: {p['reason']}")
        elif p["status"] == "refused":
            lines.append(f"REFUSED     {where} call {p['call']}: {p['reason']} (or pass --allow-pickle)")
        elif p["status"] == "foreign":
            by = f"written by skipweave {p['written_by']}" if p["written_by"] else "writer unknown"
            lines.append(f"FOREIGN     {where}: {plural(len(p['calls']), 'entry', 'entries')} of format version "
                         f"{p['format_version']} ({by}): not checked, kept as they are; upgrade skipweave to read them")
        else:
            n = plural(len(p["entries"]), "entry", "entries")
            lines.append(f"INCOMPLETE  {where}: {p['reason']} "
                         f"({n}; not served as a whole step: a run resumes it by inputs or records it afresh)")
    if result.leftovers:
        lines.append(f"leftovers (not errors): {leftover_summary(result.leftovers)}")
    lines += ignored_lines(result)
    corrupt = sum(1 for p in found if p["status"] == "corrupt")
    refused = sum(1 for p in found if p["status"] == "refused")
    foreign = sum(len(p["calls"]) for p in found if p["status"] == "foreign")
    incomplete = sum(1 for p in found if p["status"] == "incomplete")
    if corrupt or refused:
        lines.append(f"FAILED: {plural(corrupt, 'corrupt entry', 'corrupt entries')}, "
                     f"{plural(refused, 'refused entry', 'refused entries')}, "
                     f"{plural(incomplete, 'incomplete part')}. A run sets corrupt entries aside and records them "
                     f"afresh, and resumes an incomplete part by inputs (or records it afresh); "
                     f"`skipweave gc {result.dump_dir}` shows what it would remove.")
    elif incomplete:
        lines.append(f"OK: nothing would be served wrongly; {plural(incomplete, 'incomplete part')} (an interrupted "
                     f"run) will be resumed by inputs or recorded afresh; "
                     f"`skipweave gc {result.dump_dir}` shows what it would remove")
    elif not foreign:
        lines.append("OK: every entry is complete and matches its checksums" if result.parts
                     else "OK: nothing recorded yet")
    if foreign:
        lines.append(f"NOT CHECKED: {plural(foreign, 'foreign entry', 'foreign entries')} of a format this skipweave "
                     "does not read (exit 3 when nothing else is wrong); runs leave them as they are and run their "
                     "calls live")
    return "\n".join(lines)
