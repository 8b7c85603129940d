"""``skipweave view DUMP_DIR [DUMP_B] -o report.html [--tokenizer DIR] [--steps ...] [--role ...] [--namespace ...]
[--target ...] [--samples N]``: one self-contained HTML page of a store.

The page holds a steps table (per role, target and step: calls, bytes, samples, response length mean/min/max,
reward mean; validation calls apart), charts of response length and reward per step (inline SVG drawn by
matplotlib: ``pip install 'skipweave[view]'``), and a sample browser (the first ``--samples`` samples of each step:
prompt and response as ids, or as text with ``--tokenizer``, a local Hugging Face tokenizer folder; reward and the
sample's other fields beside them). With ``DUMP_B``, a second store, the page adds ``skipweave diff``'s comparison per
step and the first diverging sample side by side, its first differing token marked; ``DUMP_B`` may be a dump dir or
a bundle (``.zip``), or a verify run's report (any other file, ``skipweave-verify.jsonl``: its lines are the diff, B's
side of the sample the live token it names; a line that is no well-formed record is skipped and named, a WARNING).

Everything is inline (no script, no request: the page opens offline and as an attachment); every string read from
the store is escaped. The file is written under a temporary name and renamed into place.

Exit status: 0 the page is written; 1 it is written but some entry was skipped (damaged, foreign, or of a shape the
page cannot summarize: named on the page and here); 2 nothing written: a dump dir or report that cannot be read, bad
options, a tokenizer that cannot be loaded, an output that cannot be written. See docs/view.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Any

from skipweave.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    add_dump_dir_arguments,
    emit,
    misplaced,
    output_refusal,
    scan_or_explain,
)
from skipweave.cli.format import human_bytes, plural

EXIT_SKIPPED = 1
_LISTED = 20
DEFAULT_SAMPLES = 8


def register(subparsers: Any) -> None:
    """Add the ``view`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "view", help="write one self-contained HTML page of a store (steps, charts, samples; a diff with DUMP_B)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dump_dir_arguments(parser)
    parser.add_argument("dump_b", metavar="DUMP_B", nargs="?", default=None,
                        help="a second store (a dump dir or a .zip bundle) to diff against DUMP_DIR, or a verify "
                             "run's report (any other file, e.g. skipweave-verify.jsonl)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH", help="the HTML file to write (replaced whole)")
    parser.add_argument("--namespace", default=None, help="only this namespace")
    parser.add_argument("--role", default=None, help="only this role")
    parser.add_argument("--target", action="append", default=None, metavar="NAME", help="only this target (repeatable)")
    parser.add_argument("--steps", default=None, metavar="STEPS",
                        help="only these steps, as skip.<role>.steps writes them (e.g. 1-5, '[1,3,8]')")
    parser.add_argument("--samples", type=_samples, default=DEFAULT_SAMPLES, metavar="N",
                        help=f"samples per step in the sample browser (default {DEFAULT_SAMPLES}; 0: none)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a local Hugging Face tokenizer folder: show prompts and responses as text")
    parser.set_defaults(func=run)


def _samples(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Build the page; return 0, 1 (entries skipped) or 2 (nothing written)."""
    from skipweave.config.errors import ConfigError
    from skipweave.export.exporter import Selection
    from skipweave.export.text import TokenizerUnavailable, load_tokenizer
    from skipweave.view import charts
    from skipweave.view.page import Page, write
    from skipweave.view.summary import summarize

    started = time.perf_counter()
    try:
        from skipweave.cli.common import steps_option

        steps = steps_option(args.steps)
    except ConfigError as exc:
        print(f"skipweave view: {exc}", file=sys.stderr)
        return EXIT_USAGE
    refusal = output_refusal(args.output, [p for p in (args.dump_dir, args.dump_b) if p is not None])
    if refusal is not None:
        print(f"skipweave view: nothing written: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    if args.dump_b is not None and not os.path.exists(args.dump_b):
        print(f"skipweave view: DUMP_B {args.dump_b!r} does not exist (a second dump dir, or a verify run's "
              "report such as skipweave-verify.jsonl)", file=sys.stderr)
        return EXIT_USAGE
    try:
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    except TokenizerUnavailable as exc:
        print(f"skipweave view: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = scan_or_explain("view", args, checksums=False)  # load() checks every checksum it reads
    if result is None or misplaced("view", result):
        return EXIT_USAGE
    selection = Selection(args.namespace, args.role, tuple(args.target) if args.target else None, steps)
    summary = summarize(result, selection=selection, limit=args.samples, tokenizer=tokenizer,
                        progress=_bar("reading"))
    notes = []
    if charts.available():
        drawn = charts.charts(sorted(summary.rows.values(), key=lambda r: (r.role, r.target, r.step)))
    else:
        drawn = []
        notes.append("No charts: matplotlib is not installed (pip install 'skipweave[view]').")
        print("skipweave view: no charts: matplotlib is not installed (pip install 'skipweave[view]')",
              file=sys.stderr)
    diff = None
    if args.dump_b is not None:
        diff = _diff(args, result, steps, tokenizer)
        if diff is None:
            return EXIT_USAGE
    filters = "".join(f", {name} {value}" for name, value in (
        ("namespace", args.namespace), ("role", args.role), ("targets", ",".join(args.target or []) or None),
        ("steps", args.steps)) if value)
    page = Page(summary, drawn, diff, title=f"skipweave view: {os.path.basename(result.dump_dir.rstrip('/'))}",
                filters=filters, notes=notes)
    try:
        size = write(page, args.output)
    except OSError as exc:
        print(f"skipweave view: nothing written to {args.output}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    output = os.path.abspath(args.output)
    lines = [f"wrote {output} ({human_bytes(size)}): {plural(len(summary.rows), 'step row')} of "
             f"{plural(summary.entries, 'entry', 'entries')}, up to {args.samples} samples per step, in "
             f"{time.perf_counter() - started:.2f} s"]
    for s in summary.skipped[:20]:
        lines.append(f"SKIPPED  {s.where} call {s.call} ({s.status}): {s.reason}")
    if summary.skipped:
        lines.append(f"{plural(len(summary.skipped), 'entry', 'entries')} skipped; `skipweave verify "
                     f"{shlex.quote(result.dump_dir)}` names every problem")
    if diff is not None and diff.first:
        lines.append(f"first divergence: {diff.first}")
    emit("\n".join(lines))
    return EXIT_SKIPPED if summary.skipped else EXIT_OK


def _diff(args: argparse.Namespace, a: Any, steps: Any, tokenizer: Any) -> Any:
    """The page's diff section against ``args.dump_b`` (a store or a verify report), or None (said on stderr)."""
    from skipweave.store.bundle.layout import is_bundle_path
    from skipweave.view.diffs import diff_steps, first_divergence, side_by_side
    from skipweave.view.page import DiffSection, first_line

    if os.path.isfile(args.dump_b) and not is_bundle_path(args.dump_b):  # a .zip is a store, as diff reads it
        return _report_diff(args, a, steps, tokenizer)
    from skipweave.cli.diff import default_spec, diff_rows, document

    b = scan_or_explain("view", argparse.Namespace(dump_dir=args.dump_b, calls_per_step=args.calls_per_step,
                                                   allow_pickle=args.allow_pickle), checksums=False)
    if b is None or misplaced("view", b):
        return None
    rows = []
    bar = _bar("diffing")
    progress = bar(sum(len(p.entries) for p in a.parts)) if bar is not None else None
    try:
        for row in diff_rows(a, b, {None: default_spec()}, namespace=args.namespace, role=args.role,
                             targets=args.target, steps=steps):
            rows.append(row)
            if progress is not None:
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
    doc = document(a.dump_dir, b.dump_dir, rows)
    first = first_divergence(rows)
    section = DiffSection(a.dump_dir, b.dump_dir, "stores", diff_steps(rows), doc["totals"],
                          first_line(first) if first is not None else None)
    if first is not None:
        section.side_by_side = side_by_side(first, _loader(a, first, first["call"]),
                                            _loader(b, first, first.get("call_b", first["call"])), tokenizer)
    return section


def _report_diff(args: argparse.Namespace, a: Any, steps: Any, tokenizer: Any) -> Any:
    """The diff section of a verify run's report (its lines as the diff's rows, A the store it verified against)."""
    from skipweave.view.diffs import diff_steps, first_divergence, read_report, side_by_side
    from skipweave.view.page import DiffSection, first_line

    try:
        usable, malformed = read_report(args.dump_b)
    except OSError as exc:
        print(f"skipweave view: cannot read the verify report {args.dump_b}: {exc}", file=sys.stderr)
        return None
    notes = []
    for number, why in malformed[:_LISTED]:  # a cut or hand-edited line must not hide the rest of the report
        note = f"line {number} of {args.dump_b} skipped: not a well-formed verify record: {why}"
        notes.append(note)
        print(f"skipweave view: WARNING: {note}", file=sys.stderr)
    if len(malformed) > _LISTED:
        notes.append(f"... and {len(malformed) - _LISTED} more malformed lines skipped")
        print(f"skipweave view: WARNING: ... and {len(malformed) - _LISTED} more malformed lines of "
              f"{args.dump_b} skipped", file=sys.stderr)
    lines = [line for line in usable
             if (args.role is None or line["role"] == args.role)
             and (not args.target or line["target"] in args.target)
             and (steps is None or line["step"] in steps)]
    if not lines:
        what = "under the filters given" if usable else f"({plural(len(malformed), 'line')} skipped as malformed)"
        print(f"skipweave view: {args.dump_b} holds no well-formed line of a verify run's report (schema "
              f"skipweave.verify.call/1) {what}", file=sys.stderr)
        return None
    totals: dict[str, int] = {}
    for line in lines:
        totals[line["status"]] = totals.get(line["status"], 0) + 1
    failing = sum(n for s, n in totals.items() if s not in ("identical", "close"))
    first = first_divergence(lines)
    section = DiffSection(a.dump_dir, os.path.abspath(args.dump_b), "report", diff_steps(lines),
                          {"entries": len(lines), "failing": failing, **totals},
                          first_line(first) if first is not None else None, notes=notes)
    if first is not None:
        section.side_by_side = side_by_side(first, _loader(a, first, first["call"], args.namespace), None, tokenizer)
    return section


def _loader(scan: Any, row: Any, call: int, namespace: str | None = None) -> Any:
    """``() -> result`` (a view) of the entry of ``scan`` a row names, or None when the scan has no such entry."""
    for part in scan.parts:
        if ((part.namespace == row.get("namespace", namespace or part.namespace)) and part.role == row["role"]
                and part.target == row["target"] and part.step == row["step"] and part.shard == row["shard"]):
            for entry in part.entries:
                if entry.key.call == call:
                    return lambda: scan.store(part.namespace, part.role, views=True).load(entry.key).result
    return None


def _bar(what: str) -> Any:
    """``total -> tqdm bar`` counting entries on stderr when bars show (:func:`skipweave.progress.bars_enabled`),
    else None."""
    from skipweave.progress import bars_enabled

    if not bars_enabled():
        return None

    def make(total: int) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc=f"skipweave view: {what}", unit="entry", file=sys.stderr, leave=False,
                    mininterval=0.5)

    return make
