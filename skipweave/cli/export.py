"""``skipweave export DUMP_DIR -o PATH [--format parquet|jsonl] [--steps ...] [--role ...] [--namespace ...]
[--target ...] [--tokenizer DIR] [--json]``: one row per recorded sample, as a Parquet or JSONL file.

Each row names its call (namespace, role, target, step, call, shard, validation) and its sample index, then holds the
sample's recorded fields (token ids, masks and log-probs as lists, rewards, ``uid`` and every other non-tensor
column) and the call's fields (``meta_info.*``, scalars). With ``--tokenizer`` (a local Hugging Face tokenizer folder)
``prompt_text`` and ``response_text`` are decoded, padding left out. The file is written under a temporary name and
renamed into place at the end: a failed export leaves no file, and an earlier file at PATH as it was.

Exits 0 when every selected entry was exported; 1 when some were damaged (corrupt, refused as pickled, failing their
checksum): the rest are exported and the damaged ones named; 3 when nothing is damaged but some entries are foreign
(a format version this skipweave does not read): skipped and named; 2 when the dump dir, an option or the output
cannot be used (nothing written). See docs/export.md for the columns and docs/cli.md for the ``--json`` schema.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from skipweave.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_dump_dir_arguments,
    add_json_argument,
    emit,
    emit_json,
    misplaced,
    output_refusal,
    scan_or_explain,
    steps_option,
)
from skipweave.cli.format import human_bytes, plural

SCHEMA = "skipweave.export/1"
EXIT_DAMAGED, EXIT_FOREIGN = 1, 3
_LISTED = 20


def register(subparsers: Any) -> None:
    """Add the ``export`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "export", help="write one row per recorded sample to a Parquet or JSONL file", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="PATH", help="the file to write (replaced whole)")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default=None,
                        help="default: from PATH's suffix (.jsonl/.json: jsonl), else parquet")
    parser.add_argument("--namespace", default=None, help="only this namespace")
    parser.add_argument("--role", default=None, help="only this role")
    parser.add_argument("--target", action="append", default=None, metavar="NAME", help="only this target (repeatable)")
    parser.add_argument("--steps", default=None, metavar="STEPS",
                        help="only these steps, as skip.<role>.steps writes them (e.g. 1-5, '[1,3,8]')")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a local Hugging Face tokenizer folder: add prompt_text and response_text")
    add_json_argument(parser, SCHEMA)
    parser.set_defaults(func=run)


def output_format(args: argparse.Namespace) -> str:
    """``--format``, else ``jsonl`` for a ``.jsonl``/``.json`` output, else ``parquet``."""
    if args.format:
        return str(args.format)
    return "jsonl" if args.output.lower().endswith((".jsonl", ".json")) else "parquet"


def run(args: argparse.Namespace) -> int:
    """Export the dump dir; return 0, 1 (damaged entries skipped), 3 (foreign entries skipped) or 2 (nothing
    written)."""
    from skipweave.config.errors import ConfigError
    from skipweave.export.exporter import Selection, export
    from skipweave.export.sinks import PyarrowMissing, SchemaChanged, require_pyarrow
    from skipweave.export.text import TokenizerUnavailable, load_tokenizer

    fmt = output_format(args)
    try:
        steps = steps_option(args.steps)
    except ConfigError as exc:
        print(f"skipweave export: {exc}", file=sys.stderr)
        return EXIT_USAGE
    refusal = output_refusal(args.output, [args.dump_dir])
    if refusal is not None:
        print(f"skipweave export: nothing written: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if fmt == "parquet":
            require_pyarrow()  # before the scan: a missing extra is said at once
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    except (PyarrowMissing, TokenizerUnavailable) as exc:
        print(f"skipweave export: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = scan_or_explain("export", args, checksums=False)  # load() checks every checksum it reads
    if result is None or misplaced("export", result):
        return EXIT_USAGE
    selection = Selection(args.namespace, args.role, tuple(args.target) if args.target else None, steps)
    try:
        report = export(result, args.output, fmt, selection=selection, tokenizer=tokenizer, progress=_bar())
    except (SchemaChanged, OSError) as exc:
        print(f"skipweave export: nothing written to {args.output}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    damaged = [s for s in report.skipped if s.damaged]
    foreign = [s for s in report.skipped if not s.damaged]
    if args.json:
        emit_json({"schema": SCHEMA, "dump_dir": result.dump_dir, **report.to_json(),
                   "output": os.path.abspath(args.output), "ok": not report.skipped})
    else:
        emit(render(report, os.path.abspath(args.output), result.dump_dir))
    if tokenizer is not None and report.calls and not {"prompt_text", "response_text"} & set(report.columns):
        from skipweave.export.text import PROMPT_FIELDS, RESPONSE_FIELDS

        print(f"skipweave export: --tokenizer decoded nothing: no call holds token ids under a name it reads (prompt: "
              f"{', '.join(PROMPT_FIELDS)}; response: {', '.join(RESPONSE_FIELDS)})", file=sys.stderr)
    return EXIT_DAMAGED if damaged else EXIT_FOREIGN if foreign else EXIT_OK


def _bar() -> Any:
    """``total -> tqdm bar`` counting entries on stderr when bars show (:func:`skipweave.progress.bars_enabled`),
    else None."""
    from skipweave.progress import bars_enabled

    if not bars_enabled():
        return None

    def make(total: int) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc="skipweave: exporting", unit="entry", file=sys.stderr, leave=False,
                    mininterval=0.5)

    return make


def render(report: Any, output: str, dump_dir: str) -> str:
    """The human summary of an export (an :class:`~skipweave.export.exporter.ExportReport` of ``dump_dir``)."""
    try:
        size = human_bytes(os.path.getsize(output))
    except OSError:
        size = "?"
    lines = [f"exported {plural(report.rows, 'row')} of {plural(report.calls, 'call')} to {output} "
             f"({report.format}, {size}, {plural(len(report.columns), 'column')}) in {report.seconds:.1f} s"]
    for s in report.skipped[:_LISTED]:
        label = "FOREIGN" if s.status == "foreign" else "SKIPPED"
        lines.append(f"{label:<8} {s.namespace}/{s.role} {s.target} step {s.step} shard {s.shard} call {s.call} "
                     f"({s.status}): {s.reason}  [{s.path}]")
    if len(report.skipped) > _LISTED:
        lines.append(f"... and {len(report.skipped) - _LISTED} more (--json lists every one)")
    damaged = sum(1 for s in report.skipped if s.damaged)
    foreign = len(report.skipped) - damaged
    if damaged:
        lines.append(f"INCOMPLETE: {plural(damaged, 'damaged entry', 'damaged entries')} skipped; "
                     f"`skipweave verify {shlex.quote(dump_dir)}` names every problem; a run records them afresh")
    if foreign:
        lines.append(f"NOT EXPORTED: {plural(foreign, 'foreign entry', 'foreign entries')} of a format this "
                     "skipweave does not read; upgrade skipweave to export them")
    return "\n".join(lines)
