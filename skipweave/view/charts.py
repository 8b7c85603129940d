"""The page's charts, drawn with matplotlib into inline SVG (no image file, no script, nothing fetched).

Two charts, one series per role and target (validation calls a series of their own, dashed): the mean response
length per step with its min-max band, and the mean reward per step. A step without a value is a gap (NaN), never a
made-up zero. Text stays text (``svg.fonttype: none``) and the SVG's ids are fixed per chart (``svg.hashsalt``), so
two charts on one page never share an id and the same store gives the same page.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable

from skipweave.view.summary import StepRow


def _label(row: StepRow) -> str:
    label = f"{row.role}/{row.target}" + (" (validation)" if row.validation else "")
    return label.replace("$", r"\$")  # no mathtext from a name


def series(rows: Iterable[StepRow], what: str) -> tuple[list[int], dict[str, tuple[list[float], list[float],
                                                                                   list[float]]]]:
    """``(steps, label -> (means, lows, highs))`` of ``what`` (``lengths`` or ``rewards``) per step, NaN where a
    series has no value; only series with at least one value."""
    rows = list(rows)
    steps = sorted({r.step for r in rows})
    found: dict[str, dict[int, tuple[float, float, float]]] = {}
    for r in rows:
        stats = getattr(r, what)
        if stats.mean is None:
            continue
        found.setdefault(_label(r), {})[r.step] = (stats.mean, stats.low, stats.high)
    nan = (math.nan, math.nan, math.nan)
    out = {label: tuple(list(x) for x in zip(*(by.get(s, nan) for s in steps), strict=True))
           for label, by in sorted(found.items())}
    return steps, out  # type: ignore[return-value]


def svg(rows: list[StepRow], what: str, title: str, ylabel: str, salt: str) -> str | None:
    """One chart as an ``<svg>`` element's text (no XML prolog), or None when no series has a value.

    Raises:
        ImportError: matplotlib is not installed.
    """
    steps, data = series(rows, what)
    if not data:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "text.usetex": False,
                                "font.family": "sans-serif"}):
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        try:
            for i, (label, (means, lows, highs)) in enumerate(data.items()):
                colour = f"C{i % 10}"
                style = "--" if label.endswith("(validation)") else "-"
                marker = "o" if len(steps) <= 60 else None
                ax.plot(steps, means, linestyle=style, marker=marker, markersize=3, color=colour, label=label)
                if what == "lengths" or any(lo != hi for lo, hi in zip(lows, highs, strict=True) if lo == lo):
                    ax.fill_between(steps, lows, highs, color=colour, alpha=0.15, linewidth=0)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
            ax.legend(loc="best", fontsize="small")
            fig.tight_layout()
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
        finally:
            plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    # inline SVG in HTML needs no namespace declarations and no RDF metadata: the page then names no URL at all
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    return re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", text, count=2)


def charts(rows: list[StepRow]) -> list[tuple[str, str | None]]:
    """The page's charts: ``(title, svg or None)`` for response length and reward."""
    return [("Response length per step", svg(rows, "lengths", "Response length per step (mean, min-max band)",
                                             "tokens", "skipweave-view-lengths")),
            ("Reward per step", svg(rows, "rewards", "Reward per step (mean, min-max band)", "reward",
                                    "skipweave-view-rewards"))]


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["available", "charts", "series", "svg"]
