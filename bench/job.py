"""The main job: ``examples/tiny_grpo/compare.py`` runs the tiny GRPO job six times (record every phase, replay,
replay-only, update_only, a new reward on recorded rollouts, verify).

    python -m bench.job [--timeout 900] [overrides...]

Prints one JSON line with the comparison summary compare.py writes (per-step rollout seconds of runs 1 and 2,
whole-run wall seconds of every run, the phases each ran live and the workers it started, whether the replaying runs
were all hits and bit-identical), or ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench.common import ROOT, emit

COMPARE = ROOT / "examples" / "tiny_grpo" / "compare.py"


def run(timeout: float, overrides: list[str]) -> dict[str, Any]:
    """Run compare.py once; returns its summary, or ``{"error": ...}`` when it is missing or fails."""
    if not COMPARE.exists():
        return {"error": f"{COMPARE.relative_to(ROOT)} does not exist yet"}
    with tempfile.TemporaryDirectory(prefix="skipweave-bench-job-") as work:
        summary_path = os.path.join(work, "summary.json")
        cmd = [sys.executable, str(COMPARE), "--out-dir", work, "--summary-json", summary_path,
               "--timeout", str(timeout), *overrides]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True,
                                  timeout=7 * timeout + 60)
        except subprocess.TimeoutExpired:
            return {"error": f"compare.py did not finish within {7 * timeout + 60:.0f}s"}
        if not os.path.exists(summary_path):
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
            return {"error": f"compare.py exited {proc.returncode} without a summary:\n{tail}"}
        with open(summary_path, encoding="utf-8") as fh:
            summary: dict[str, Any] = json.load(fh)
        summary["exit_code"] = proc.returncode
        return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=900.0, help="per-run timeout passed to compare.py")
    args, overrides = parser.parse_known_args()
    emit(run(args.timeout, overrides))


if __name__ == "__main__":
    main()
