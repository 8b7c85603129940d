"""End-to-end tests of the tiny GRPO example through ``examples/tiny_grpo/compare.py``.

Each test runs the reduced configuration as subprocesses (Ray start-up included): record, replay with the
engine, replay-only, verify with a changed update (and, beside them, a replay-only run past the recorded steps and a
verify run with nothing changed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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


def run_compare(tmp_path: Path, *options: str, timeout: float = 420.0,
                after_run_2: Callable[[], Any] | None = None) -> tuple[dict[str, Any], str]:
    """Run compare.py on the reduced config; returns (its JSON summary, its combined output).

    ``after_run_2`` is called (in this thread) as soon as compare.py reports that run 2 is done, while it goes on
    with run 3; if it never reports so, after compare.py ends.
    """
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
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if after_run_2 is not None and line.startswith("[compare] run-2: done"):
                    after_run_2()
                    after_run_2 = None
        finally:
            timer.cancel()
    output = "".join(lines)
    assert proc.returncode == 0, f"compare.py exited with {proc.returncode}:\n{output}"
    if after_run_2 is not None:
        after_run_2()
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
    # Run 4 (a replay-only run past the recorded steps) reads what runs 1 and 2 left: it starts on a copy of the
    # store as soon as run 2 is done, beside compare.py's run 3 (replay-only too, which adds nothing to it).
    dump = tmp_path / "runs" / "dump"
    dump4 = tmp_path / "dump4"
    pool = ThreadPoolExecutor(max_workers=1)
    run4: list[Future[subprocess.CompletedProcess[str]]] = []

    def start_run_4() -> None:
        shutil.copytree(dump, dump4, symlinks=True)
        train = [sys.executable, str(REPO_ROOT / "examples" / "tiny_grpo" / "train.py")]
        cmd = [*train, "+skip=rollout_replay", f"skip.rollout.dump_dir={dump4}", f"hydra.run.dir={tmp_path / 'run4'}",
               *[o for o in REDUCED_OVERRIDES if not o.startswith("trainer.total_steps")], "trainer.total_steps=4"]
        run4.append(pool.submit(subprocess.run, cmd, capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                                check=False))
        # A verify run with nothing changed (compare.py's run 4 changes the update): every step identical.
        cmd = [*train, "+skip=rollout_verify", f"skip.rollout.dump_dir={dump}", f"hydra.run.dir={tmp_path / 'same'}",
               *REDUCED_OVERRIDES]
        run4.append(pool.submit(subprocess.run, cmd, capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                                check=False))

    try:
        summary, output = run_compare(tmp_path, after_run_2=start_run_4)
        proc, same = run4[0].result(), run4[1].result()
    finally:
        pool.shutdown(wait=True)
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
    # Run 4 of compare.py, a verify run whose update differs (actor.lr): step 1 identical, step 2 first diverges.
    verify = summary["verify"]
    assert verify["statuses"] == {"1": "identical", "2": "diverged", "3": "diverged"}, output
    assert verify["first_step"] == 2 and verify["first_line"]["first"]["path"] == "batch.responses", output
    assert "first divergence: role rollout target tiny_grpo step 2 call 0: diverged at batch.responses [" in output
    assert summary["ok"], output
    assert same.returncode == 0, same.stderr[-3000:]
    assert "every verified call is identical to its recording" in same.stdout + same.stderr, same.stdout[-3000:]
    same_lines = [json.loads(x) for x in (tmp_path / "same" / "skipweave-verify.jsonl").read_text().splitlines()]
    assert [(x["step"], x["validation"], x["status"]) for x in same_lines] == [
        (1, False, "identical"), (2, False, "identical"), (2, True, "identical"), (3, False, "identical")]

    # A step that was never recorded stops a replay-only run with a message naming what is missing.
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    for part in ("ReplayMissing", "replay-only role rollout target tiny_grpo", "step 4 call 0", str(dump4)):
        assert part in text, (part, text[-3000:])
    rows = train_lines(tmp_path / "run4")
    assert [r["step"] for r in rows] == [1, 2, 3] and {r["rollout_workers"] for r in rows} == {0}
