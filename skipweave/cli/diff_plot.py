"""``skipweave diff --plot``: the token match ratio and the max |Δ| of float fields per step, drawn from diff's rows.

One line per role and target (validation calls apart), over every step either store holds. A step where a series
has no value (no entry of it, or an entry without a token field / float field) is a gap (NaN), never a made-up 1.0
or 0.0: a validation series that exists every third step is drawn as separate points, and a float-only result has
no token line at all. Steps that only one store holds, or whose entries could not be read, are marked with vertical
lines on both panels, as the table lists them. :func:`series` computes what is drawn (tested without matplotlib's
pixels); :func:`figure` draws it; :func:`plot` saves it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PAIRED = ("identical", "close", "diverged")
"""The statuses of diff's rows whose two entries were compared (:mod:`skipweave.cli.diff` imports it from here: the
plot, imported lazily by diff, then needs nothing of diff's, and the two modules make no import circle)."""

MARKS = {"only_in_a": ("only in A", "tab:red", "--"), "only_in_b": ("only in B", "tab:purple", "--"),
         "unreadable": ("unreadable", "tab:gray", ":")}
"""Row status -> (legend label, colour, line style) of the steps marked with vertical lines."""


@dataclass
class PlotData:
    """What the plot draws.

    Attributes:
        steps: every step of any row, sorted (the x values of every series).
        token_match: label -> the lowest token match ratio per step (NaN: no value at that step); only series with
            at least one value.
        max_abs_diff: label -> the largest max |Δ| of float fields per step (NaN: no value; an inf or NaN mismatch
            is drawn at the top of the axis, see :attr:`infinite`); only series with at least one value.
        infinite: label -> steps whose max |Δ| is infinite.
        marks: row status (``only_in_a``, ``only_in_b``, ``unreadable``) -> the steps that have such a row.
    """

    steps: list[int]
    token_match: dict[str, list[float]] = field(default_factory=dict)
    max_abs_diff: dict[str, list[float]] = field(default_factory=dict)
    infinite: dict[str, list[int]] = field(default_factory=dict)
    marks: dict[str, list[int]] = field(default_factory=dict)


def _label(row: Mapping[str, Any]) -> str:
    return f"{row['role']}/{row['target']}" + (" (validation)" if str(row["shard"]).startswith("val_") else "")


def _delta(value: Any) -> float | None:
    """A row's max |Δ| as a float (``"inf"``/``"nan"``, strict JSON's forms, as inf), ``None`` for none."""
    if value is None:
        return None
    if isinstance(value, str):
        return math.inf
    return float(value)


def series(rows: Iterable[Mapping[str, Any]]) -> PlotData:
    """The plot's data from diff's rows (:func:`skipweave.cli.diff.diff_rows`): per label and step, the lowest token
    match and the largest max |Δ| of the step's compared entries, NaN where none has one."""
    rows = list(rows)
    steps = sorted({int(r["step"]) for r in rows})
    tokens: dict[str, dict[int, float]] = {}
    deltas: dict[str, dict[int, float]] = {}
    labels: list[str] = []
    marks: dict[str, set[int]] = {}
    for r in rows:
        status = r["status"]
        if status in MARKS:
            marks.setdefault(status, set()).add(int(r["step"]))
        if status not in PAIRED:
            continue
        label, step = _label(r), int(r["step"])
        if label not in labels:
            labels.append(label)
        if r.get("token_match") is not None:
            old = tokens.setdefault(label, {}).get(step, math.inf)
            tokens[label][step] = min(old, float(r["token_match"]))
        delta = _delta(r.get("max_abs_diff"))
        if delta is not None:
            old = deltas.setdefault(label, {}).get(step, -math.inf)
            deltas[label][step] = max(old, delta)
    out = PlotData(steps, marks={k: sorted(v) for k, v in sorted(marks.items())})
    for label in sorted(labels):
        if label in tokens:
            out.token_match[label] = [tokens[label].get(s, math.nan) for s in steps]
        if label in deltas:
            values = [deltas[label].get(s, math.nan) for s in steps]
            out.infinite[label] = [s for s, v in zip(steps, values, strict=True) if v == math.inf]
            out.max_abs_diff[label] = [math.nan if v == math.inf else v for v in values]
    return out


def figure(rows: Iterable[Mapping[str, Any]]) -> Any:
    """The matplotlib figure of :func:`series` (not saved; the caller closes it).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(rows)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    # one colour per series on both panels (each axes would start its own colour cycle)
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
    labels = sorted(set(data.token_match) | set(data.max_abs_diff))
    colours = {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}
    for label, values in data.token_match.items():
        top.plot(data.steps, values, marker="o", label=label, color=colours[label])  # NaN: a gap, never a point
    if not data.token_match:
        top.text(0.5, 0.5, "no token field in these results", transform=top.transAxes, ha="center", va="center",
                 color="gray")
    for label, values in data.max_abs_diff.items():
        bottom.plot(data.steps, values, marker="o", label=label, color=colours[label])
        if data.infinite.get(label):
            bottom.plot(data.infinite[label], [1.0] * len(data.infinite[label]), marker="^", linestyle="none",
                        color=colours[label], transform=bottom.get_xaxis_transform(), clip_on=False,
                        label=f"{label}: inf/NaN mismatch")
    for status, steps in data.marks.items():
        name, colour, style = MARKS[status]
        for i, step in enumerate(steps):
            for ax in (top, bottom):
                ax.axvline(step, color=colour, linestyle=style, alpha=0.7, label=name if i == 0 and ax is top
                           else None)
    top.set_ylabel("token match ratio")
    top.set_ylim(-0.02, 1.02)
    top.grid(True, alpha=0.3)
    if top.get_legend_handles_labels()[0]:
        top.legend(loc="lower left", fontsize="small")
    # symlog: an identical step (0) sits on the axis, and deltas from 1e-9 to 1e3 stay readable on one plot
    bottom.set_yscale("symlog", linthresh=1e-9)
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("max |Δ| of float fields")
    if not data.max_abs_diff:
        bottom.text(0.5, 0.5, "no float field in these results", transform=bottom.transAxes, ha="center",
                    va="center", color="gray")
    elif set(data.max_abs_diff) - set(data.token_match):  # a series the top legend does not name
        bottom.legend(loc="lower right", fontsize="small")
    bottom.xaxis.get_major_locator().set_params(integer=True)
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    if data.steps:
        bottom.set_xlim(data.steps[0] - 0.5, data.steps[-1] + 0.5)
    top.set_title("skipweave diff: B against A, per step")
    fig.tight_layout()
    return fig


def plot(rows: Iterable[Mapping[str, Any]], path: str) -> None:
    """Draw :func:`figure` into ``path`` (its format from the extension).

    Raises:
        ImportError: matplotlib is not installed.
        OSError: the file cannot be written.
    """
    fig = figure(rows)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


__all__ = ["MARKS", "PlotData", "figure", "plot", "series"]
