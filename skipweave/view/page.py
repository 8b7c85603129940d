"""The HTML of ``skipweave view``: one self-contained file, every asset inline, nothing fetched, no script.

A store is untrusted input: every string that comes from it (names, uids, decoded text, field values, reasons) is
escaped with :func:`html.escape` where it is written, and the page declares a Content-Security-Policy that allows no
script and no request at all (``default-src 'none'``; inline styles and the inline SVG only), so even a string that
escaped escaping could neither run nor call home. The parts open and close with ``<details>`` elements.

The file is written under a temporary name beside ``output`` and renamed into place
(:class:`skipweave.export.sinks.AtomicFile`): a failed build leaves ``output`` as it was.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skipweave.export.sinks import AtomicFile
from skipweave.export.values import text as escape_surrogates
from skipweave.view.diffs import DiffStep, Side, SideBySide
from skipweave.view.summary import MAX_CHARS, MAX_TOKENS, SampleView, StepRow, Summary

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.val td{background:#f7f7ff}
.bad{color:#b00;font-weight:bold}.ok{color:#070}.muted{color:#777}
details{margin:.2em 0}summary{cursor:pointer}
.ids,.text{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;background:#fafafa;
border:1px solid #eee;padding:4px;margin:2px 0}
mark.first-diff{background:#fd4;outline:2px solid #b00}
.pair{display:flex;gap:1em}.pair>div{flex:1;min-width:0}
.chart svg{max-width:100%;height:auto}
.sample{border-left:3px solid #ddd;padding-left:.6em;margin:.4em 0}
"""


def e(value: Any) -> str:
    """``value`` as text, HTML-escaped (quotes too: safe in an attribute as in an element), surrogates escaped
    (:func:`skipweave.export.values.text`)."""
    return html.escape(escape_surrogates(str(value)), quote=True)


@dataclass
class DiffSection:
    """What the page shows of a diff (two stores, or a store and a verify report)."""

    label_a: str
    label_b: str
    kind: str
    """``stores`` or ``report``."""
    steps: list[DiffStep]
    totals: dict[str, int]
    first: str | None
    """The first divergence in one line (``skipweave diff``'s words), or None."""
    side_by_side: SideBySide | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Page:
    """Everything the page shows."""

    summary: Summary
    charts: list[tuple[str, str | None]]
    diff: DiffSection | None = None
    title: str = "skipweave view"
    filters: str = ""
    notes: list[str] = field(default_factory=list)


def _number(x: float | None, fmt: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "" if x is None else e(x)
    return format(x, fmt)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def steps_table(rows: Iterable[StepRow], caption: str) -> str:
    """A table of per-step figures."""
    rows = list(rows)
    if not rows:
        return ""
    out = [f'<table class="steps"><caption class="l">{e(caption)}</caption><tr><th class="l">role/target</th>'
           "<th>step</th><th>calls</th><th>bytes</th><th>samples</th><th>resp. len mean</th><th>min</th><th>max</th>"
           '<th>reward mean</th><th class="l">reward field</th><th>skipped</th></tr>']
    for r in rows:
        lengths = r.lengths
        out.append(
            f'<tr class="{"val" if r.validation else "train"}"><td class="l">{e(r.namespace)}/{e(r.role)}/'
            f'{e(r.target)}</td><td>{r.step}</td><td>{r.calls}</td><td>{e(_bytes(r.bytes))}</td><td>{r.samples}</td>'
            f"<td>{_number(lengths.mean, '.1f')}</td><td>{_number(lengths.low if lengths.count else None, '.0f')}"
            f"</td><td>{_number(lengths.high if lengths.count else None, '.0f')}</td>"
            f"<td>{_number(r.rewards.mean)}</td><td class=\"l\">{e(r.reward_field or '')}</td>"
            f'<td class="{"bad" if r.skipped else ""}">{r.skipped or ""}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _ids(ids: list[int] | None, total: int) -> str:
    if ids is None:
        return ""
    more = f" … ({total} ids, first {len(ids)} shown)" if total > len(ids) else ""
    return f'<div class="ids">{e(" ".join(map(str, ids)))}{e(more)}</div>'


def sample_html(s: SampleView) -> str:
    """One sample: a ``<details>`` whose summary names it, opening to its prompt, response and fields."""
    reward = f" · reward {_number(s.reward)}" if s.reward is not None else ""
    length = f" · response {s.response_len} tokens" if s.response is not None else ""
    head = f"sample {s.index} (shard {e(s.shard)}, call {s.call}){e(reward)}{e(length)}"
    body = []
    for name, text, ids, total in (("prompt", s.prompt_text, s.prompt, s.prompt_len),
                                   ("response", s.response_text, s.response, s.response_len)):
        if text is not None:
            body.append(f'<div><b>{name}</b> (text)<div class="text {name}-text">{e(text)}</div></div>')
        if ids is not None:
            label = "ids" if text is None else "ids (padding left out)"
            body.append(f"<details{' open' if text is None else ''}><summary>{name} {label}</summary>"
                        f"{_ids(ids, total)}</details>")
    if s.fields:
        body.append('<table class="fields">' + "".join(
            f'<tr><th class="l">{e(n)}</th><td class="l">{e(v)}</td></tr>' for n, v in s.fields) + "</table>")
    return f'<details class="sample"><summary>{head}</summary>{"".join(body)}</details>'


def browser(summary: Summary) -> str:
    """The sample browser: per step, a ``<details>`` holding its first samples."""
    out = []
    for key, row in sorted(summary.rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][4], kv[0][3])):
        kept = summary.samples.get(key, [])
        if not kept:
            continue
        kind = " (validation)" if row.validation else ""
        out.append(f'<details class="step"><summary>{e(row.role)}/{e(row.target)} step {row.step}{e(kind)}: '
                   f"{len(kept)} of {row.samples} samples</summary>{''.join(sample_html(s) for s in kept)}</details>")
    return "".join(out) or '<p class="muted">No call with a sample axis.</p>'


def _side_html(side: Side, position: int | None) -> str:
    if side.ids is None:
        return f"<div><b>{e(side.label)}</b><p class=\"muted\">{e(side.note)}</p></div>"
    cells = []
    for i, token in enumerate(side.ids, start=side.start):
        if i == position:
            cells.append(f'<mark class="first-diff" title="position {i}">{token}</mark>')
        else:
            cells.append(str(token))
    more = " …" if side.start + len(side.ids) < side.length else ""
    lead = "… " if side.start else ""
    text = ""
    if side.text is not None:
        before, at, after = side.text
        text = (f'<div class="text">{e(before)}<mark class="first-diff">{e(at) or "(end)"}</mark>{e(after)}</div>')
    note = f'<p class="muted">{e(side.note)}</p>' if side.note else ""
    return (f"<div><b>{e(side.label)}</b> <span class=\"muted\">(positions {side.start}–"
            f"{side.start + len(side.ids) - 1} of {side.length})</span>{text}"
            f'<div class="ids">{lead}{" ".join(cells)}{more}</div>{note}</div>')


def diff_html(d: DiffSection) -> str:
    """The diff: totals, the first divergence, its sample side by side, and a table per step."""
    failing = d.totals.get("failing", 0)
    counts = ", ".join(f"{e(k)} {v}" for k, v in d.totals.items() if k not in ("entries", "failing"))
    out = [f"<p>A: <code>{e(d.label_a)}</code><br>B: <code>{e(d.label_b)}</code>"
           f"{' (a verify run&#x27;s report: B is the live side)' if d.kind == 'report' else ''}</p>",
           f'<p class="{"bad" if failing else "ok"}">{d.totals.get("entries", 0)} entries compared: {counts}</p>']
    if d.first:
        out.append(f'<p id="first-divergence"><b>First divergence:</b> {e(d.first)}</p>')
    sbs = d.side_by_side
    if sbs is not None:
        where = (f"sample {sbs.sample}, " if sbs.sample is not None else "") + f"position {sbs.position}"
        out.append(f'<div class="side-by-side"><p>{e(sbs.path)}, {e(where)}: recorded {e(sbs.recorded)}, '
                   f"live {e(sbs.live)}</p><div class=\"pair\">"
                   + "".join(_side_html(s, sbs.position) for s in sbs.sides) + "</div></div>")
    for note in d.notes:
        out.append(f'<p class="muted">{e(note)}</p>')
    out.append('<table class="diff"><tr><th class="l">role/target</th><th>step</th><th class="l">statuses</th>'
               '<th>token match (min)</th><th>max |Δ|</th><th class="l">first diverging field</th></tr>')
    for s in d.steps:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
        kind = " (validation)" if s.validation else ""
        delta = s.max_abs_diff if isinstance(s.max_abs_diff, str) else _number(s.max_abs_diff, ".3g")
        out.append(f'<tr class="{"val" if s.validation else "train"}"><td class="l">{e(s.role)}/{e(s.target)}'
                   f'{e(kind)}</td><td>{s.step}</td><td class="l {"bad" if s.failing else "ok"}">{e(statuses)}</td>'
                   f"<td>{_number(s.token_match, '.3f')}</td><td>{e(delta)}</td><td class=\"l\">"
                   f"{e(s.first_field)}</td></tr>")
    out.append("</table>")
    return "".join(out)


def render(page: Page) -> str:
    """The page's HTML."""
    s = page.summary
    rows = sorted(s.rows.values(), key=lambda r: (r.namespace, r.role, r.target, r.step))
    training = [r for r in rows if not r.validation]
    validation = [r for r in rows if r.validation]
    steps = sorted({r.step for r in rows})
    limits = (f"The sample browser holds the first {s.limit} samples of each step (--samples), each prompt and "
              f"response cut to {MAX_TOKENS} ids and {MAX_CHARS} characters; the table and charts count every sample.")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(page.title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(page.title)}</h1>",
        f"<p>Store <code>{e(s.dump_dir)}</code>{e(page.filters)}: {s.entries} entries read in "
        f"{len(steps)} steps{f' (steps {steps[0]}–{steps[-1]})' if steps else ''}.</p>",
        f'<p class="muted" id="limits">{e(limits)}</p>',
    ]
    for note in page.notes:
        parts.append(f'<p class="muted">{e(note)}</p>')
    if s.skipped:
        items = "".join(f"<li>{e(k.where)} call {k.call}: {e(k.status)}: {e(k.reason)}</li>" for k in s.skipped[:200])
        parts.append(f'<details><summary class="bad">{len(s.skipped)} entries skipped (foreign, damaged or not '
                     f"summarized)</summary><ul>{items}</ul></details>")
    if page.diff is not None:
        parts += ['<h2 id="diff">Diff</h2>', diff_html(page.diff)]
    parts += ['<h2 id="steps">Steps</h2>', steps_table(training, "training calls") or
              '<p class="muted">No entry selected.</p>', steps_table(validation, "validation calls (apart)")]
    parts.append('<h2 id="charts">Charts</h2>')
    for title, chart in page.charts:
        if chart is None:
            parts.append(f'<p class="muted">{e(title)}: no value recorded.</p>')
        else:
            parts.append(f'<figure class="chart">{chart}</figure>')
    parts += ['<h2 id="samples">Samples</h2>', browser(s), "</body></html>"]
    return "\n".join(parts)


def write(page: Page, output: str) -> int:
    """Write the page to ``output`` atomically; returns its size in bytes.

    Raises:
        OSError: the file cannot be written (``output`` is left as it was).
    """
    text = render(page)
    target = AtomicFile(output)
    try:
        # backslashreplace: e() escapes surrogates in store strings; one that slipped by must not fail the page
        with open(target.temporary, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
        target.commit()
    except BaseException:
        target.discard()
        raise
    return os.path.getsize(target.path)


def first_line(row: Mapping[str, Any]) -> str:
    """The first divergence in one line, as ``skipweave diff`` says it."""
    from skipweave.verify.report import describe

    return describe({**row, "inputs": row.get("inputs")})


__all__ = ["CSP", "DiffSection", "Page", "browser", "diff_html", "e", "first_line", "render", "sample_html",
           "steps_table", "write"]
