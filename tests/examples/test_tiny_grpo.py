"""End-to-end tests of the tiny GRPO example through ``examples/tiny_grpo/compare.py``.

Each test runs the reduced configuration as subprocesses (Ray start-up included): record, replay with the
engine, replay-only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPARE = REPO_ROOT / "examples" / "tiny_grpo" / "compare.py"

# Reduced job: 3 training steps, one validation (bypassed by the cache, so it runs live in both runs).
REDUCED_OVERRIDES = [
    "trainer.total_steps=3",
    "trainer.val_every=2",
    "data.batch_size=8",
    "data.val_size=4",
]
REQUIRED_KEYS = {"step", "loss", "reward_mean", "rollout_seconds", "param_checksum", "skip", "rollout_workers"}


def run_compare(tmp_path: Path, *options: str, timeout: float = 420.0) -> tuple[dict[str, Any], str]:
    """Run compare.py on the reduced config; returns (its JSON summary, its combined output)."""
    summary_path = tmp_path / "summary.json"
    cmd = [
        sys.executable,
        str(COMPARE),
        "--out-dir",
        str(tmp_path / "runs"),
        "--summary-json",
        str(summary_path),
        *options,
        *REDUCED_OVERRIDES,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"compare.py exited with {proc.returncode}:\n{output}"
    return json.loads(summary_path.read_text(encoding="utf-8")), output


def train_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The per-step training records of a run's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in records if not r.get("val")]


@pytest.mark.skipweave
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_second_run_replays_every_rollout(tmp_path: Path) -> None:
    """With ``+skip=rollout_cache``: run 1 records, run 2 replays every step, metrics stay identical."""
    summary, output = run_compare(tmp_path)
    assert summary["steps"] == 3, output
    for row in summary["rows"]:
        assert row["identical"], f"step {row['step']} differs in {row['differs']}\n{output}"
    assert summary["identical"] and summary["val_identical"], output
    assert summary["run1_statuses"] == ["miss"] * 3, output
    assert summary["run2_statuses"] == ["hit"] * 3, output
    assert summary["run2_all_hits"], output
    for run in ("run1", "run2", "run3"):
        lines = train_lines(tmp_path / "runs" / run)
        assert [r["step"] for r in lines] == [1, 2, 3]
        for record in lines:
            assert REQUIRED_KEYS <= record.keys()
    # Replaying from the cache must cost a small fraction of generating.
    assert summary["rollout_ratio"] < 0.05, output
    # Run 3, replay-only: every rollout and the validation served, no rollout worker started, same metrics.
    replay_only = summary["replay_only"]
    assert replay_only["identical"] and replay_only["val_identical"], output
    assert replay_only["run2_statuses"] == ["hit"] * 3 and replay_only["run2_val_statuses"] == ["hit"], output
    assert summary["run1_rollout_workers"] == [2] and replay_only["run2_rollout_workers"] == [0], output
    assert summary["ok"], output

    # A step that was never recorded stops a replay-only run with a message naming what is missing.
    dump = tmp_path / "runs" / "dump"
    cmd = [sys.executable, str(REPO_ROOT / "examples" / "tiny_grpo" / "train.py"), "+skip=rollout_replay",
           f"skip.rollout.dump_dir={dump}", f"hydra.run.dir={tmp_path / 'run4'}",
           *[o for o in REDUCED_OVERRIDES if not o.startswith("trainer.total_steps")], "trainer.total_steps=4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO_ROOT, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    for part in ("ReplayMissing", "replay-only role rollout target tiny_grpo", "step 4 call 0", str(dump)):
        assert part in text, (part, text[-3000:])
    rows = train_lines(tmp_path / "run4")
    assert [r["step"] for r in rows] == [1, 2, 3] and {r["rollout_workers"] for r in rows} == {0}
