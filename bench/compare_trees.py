#!/usr/bin/env python
"""Per-call costs of two source trees side by side, measured in turns in one session.

    python bench/compare_trees.py OLD_TREE NEW_TREE [--rounds 3] [--quick] [--all] [--json out.json]

Each round runs ``bench/run.py --only calls --json`` of the old tree, then of the new one (the order alternating
from round to round, so a neighbour's load hits both alike), each with ``PYTHONPATH`` set to its own tree: each
tree is measured with its own benchmark code and its own skipweave. Every tree must hold ``bench/run.py``. The
table gives per row the median over rounds of the row's median (ns per call) for each tree, and new/old twice: the
median of the rounds' ratios (a round's two runs ran back to back) and the ratio of each tree's fastest run (load
only ever adds time). By default only the per-call bypass rows (the ones issue 29 holds within 10 % of the old
tree), ``--all`` for every row of the section; a row is flagged when both ratios exceed 1.10. ``--quick`` passes
``--quick`` on (fewer loops, a smoke run). On a loaded machine a round's two runs can differ 2x: use more rounds.

Exit status: 0, or 2 when a run failed or a tree imported another tree's skipweave.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BYPASS_KEYS = (
    "calls.role_disabled",
    "calls.bypass_step_not_eligible",
    "calls.bypass_validation",
    "calls.method_bypass_step_not_eligible",
    "calls.method_bypass_validation",
    "calls.method_shape_attr_step",
    "calls.method_shape_expr_step",
    "calls.method_shape_expr_bypass",
    "calls.method_shape_counter_step",
    "calls.method_shape_callable_bypass",
    "calls.method_shape_named_arg_step",
)
"""The rows of the ``calls`` section whose call runs live through skipweave's bypass (or is not patched)."""

LIMIT = 1.10
"""new/old above this is flagged (issue 29: per-call bypass rows within 10 % of the old tree)."""


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a run of ``tree``: its root first on ``PYTHONPATH``, progress bars off."""
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *rest])
    env["SKIPWEAVE_PROGRESS"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # measuring a tree leaves it as it was
    return env


def check_tree(python: str, tree: Path) -> str | None:
    """Why ``tree`` cannot be measured (no bench/run.py, or its skipweave is not the one imported), or ``None``."""
    if not (tree / "bench" / "run.py").is_file():
        return f"{tree} holds no bench/run.py"
    proc = subprocess.run([python, "-c", "import skipweave, os; print(os.path.realpath(skipweave.__file__))"],
                          capture_output=True, text=True, env=tree_env(tree), cwd=str(tree), timeout=300)
    where = Path(proc.stdout.strip() or "?")
    if proc.returncode != 0 or not where.is_relative_to(tree.resolve()):
        return f"{tree}: python imports skipweave from {where} {proc.stderr.strip()[-500:]}"
    return None


def measure(python: str, tree: Path, extra: list[str]) -> dict[str, float]:
    """One ``bench/run.py --only calls`` of ``tree``: row key -> median ns per call.

    Raises:
        RuntimeError: the run failed (its stderr tail in the message).
    """
    with tempfile.TemporaryDirectory(prefix="skipweave-compare-") as work:
        out = Path(work) / "calls.json"
        cmd = [python, str(tree / "bench" / "run.py"), "--only", "calls", "--json", str(out), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=tree_env(tree), cwd=str(tree), timeout=7200)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        doc = json.loads(out.read_text(encoding="utf-8"))
    return {r["key"]: float(r["median"]) for r in doc["rows"] if r.get("median") is not None}


def compare(old: list[dict[str, float]], new: list[dict[str, float]], keys: list[str]) -> list[dict[str, Any]]:
    """Per row: the median over rounds of each tree's value; new/old as the median of the rounds' ratios (each
    round's two runs ran back to back, under the same load) and as the ratio of each tree's fastest run (load only
    ever adds time); and each round's ratio."""
    rows = []
    for key in keys:
        a = [r[key] for r in old if key in r]
        b = [r[key] for r in new if key in r]
        if not a or not b:
            rows.append({"key": key, "old": None, "new": None, "ratio": None, "rounds": []})
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        per_round = [y / x for x, y in zip(a, b, strict=False) if x > 0]
        rows.append({"key": key, "old": ma, "new": mb, "ratio": statistics.median(per_round) if per_round else None,
                     "ratio_of_minimums": min(b) / min(a) if min(a) else None, "rounds": per_round})
    return rows


def render(rows: list[dict[str, Any]], old: Path, new: Path, rounds: int) -> str:
    lines = [f"old: {old}", f"new: {new}",
             f"{rounds} rounds; ns per call: median over rounds of each run's median; new/old: median of the rounds' "
             f"ratios, and ratio of the fastest runs", "",
             f"{'row':<42} {'old ns':>9} {'new ns':>9} {'new/old':>8} {'fastest':>8}  per round"]
    for r in rows:
        if r["ratio"] is None:
            lines.append(f"{r['key']:<42} {'-':>9} {'-':>9} {'-':>8} {'-':>8}  (missing in a tree)")
            continue
        flag = "  OVER 10%" if min(r["ratio"], r["ratio_of_minimums"] or r["ratio"]) > LIMIT else ""
        per = " ".join(f"{x:.2f}" for x in r["rounds"])
        lines.append(f"{r['key']:<42} {r['old']:>9.0f} {r['new']:>9.0f} {r['ratio']:>8.3f} "
                     f"{r['ratio_of_minimums'] or 0:>8.3f}  {per}{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="the tree before the change (holds skipweave/ and bench/)")
    parser.add_argument("new", type=Path, help="the tree after the change")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree, taking turns (default 3)")
    parser.add_argument("--quick", action="store_true", help="pass --quick to bench/run.py (a smoke run)")
    parser.add_argument("--all", action="store_true", help="every row of the calls section, not only the bypass rows")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run both trees with")
    parser.add_argument("--json", type=Path, default=None, help="also write the comparison as JSON")
    opts = parser.parse_args(argv)
    old, new = opts.old.resolve(), opts.new.resolve()
    for tree in (old, new):
        problem = check_tree(opts.python, tree)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    extra = ["--quick"] if opts.quick else []
    trees = (old, new)
    runs: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])  # by position: old and new may be equal
    try:
        for i in range(opts.rounds):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                print(f"[compare] round {i + 1}/{opts.rounds}: {trees[side]}", file=sys.stderr, flush=True)
                runs[side].append(measure(opts.python, trees[side], extra))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    keys = sorted(set().union(*runs[0], *runs[1])) if opts.all else list(BYPASS_KEYS)
    rows = compare(runs[0], runs[1], keys)
    print(render(rows, old, new, opts.rounds))
    if opts.json is not None:
        opts.json.write_text(json.dumps({"old": str(old), "new": str(new), "rounds": opts.rounds, "rows": rows,
                                         "runs": {"old": runs[0], "new": runs[1]}}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
