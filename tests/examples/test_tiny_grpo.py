"""End-to-end tests of the tiny GRPO example through ``examples/tiny_grpo/compare.py``.

Each test runs the reduced configuration as subprocesses (Ray start-up included): record every phase, replay with the
engine, replay-only, only the update, a new reward on recorded rollouts, verify with a changed update (and, beside
them, a replay-only run past the recorded steps and a verify run with nothing changed).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPARE = REPO_ROOT / "examples" / "tiny_grpo" / "compare.py"

# Reduced job: 3 training steps, one validation (bypassed by the cache, so it runs live in both runs).
REDUCED_OVERRIDES = [
    "trainer.total_steps=3",
    "trainer.val_every=2",
    "data.batch_size=8",
    "data.val_size=4",
    "reward.judge_latency=0.1",
]
COMPARED = ("loss", "reward_mean", "param_checksum")
REQUIRED_KEYS = {"step", "loss", "reward_mean", "rollout_seconds", "param_checksum", "skip", "rollout_workers",
                 "phases", "live_phases", "ref_workers", "judges"}


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


@pytest.mark.hydra_plugin
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
        # (each phase profile alone, its phase replayed and the others live and unwoven, is tests/weaving/test_phases.py
        # and tests/integrations/verl/test_phases.py: in-process, the same profiles and proxies, without Ray's start-up)

    try:
        summary, output = run_compare(tmp_path, after_run_2=start_run_4)
        proc, same = (run.result() for run in run4)
    finally:
        pool.shutdown(wait=True)
    assert summary["steps"] == 3, output
    for row in summary["rows"]:
        assert row["identical"], f"step {row['step']} differs in {row['differs']}\n{output}"
    assert summary["identical"] and summary["val_identical"], output
    assert summary["run1_statuses"] == ["miss"] * 3, output
    assert summary["run2_statuses"] == ["hit"] * 3, output
    assert summary["run2_all_hits"], output
    for run in ("run1", "run2", "run3", "run4", "run5"):
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
    # Run 4, update_only: every phase but the update replayed (validation too), no worker, no judge, same metrics.
    update_only = summary["update_only"]
    assert update_only["identical"] and update_only["val_identical"], output
    assert update_only["run2_statuses"] == ["hit"] * 3 and update_only["run2_val_statuses"] == ["hit"], output
    phases = summary["phases"]
    assert phases[0]["live_calls"] == {"rollout": 4, "reward": 4, "ref": 3}, output  # 3 steps + 1 validation
    assert phases[3] == {"live_calls": {"rollout": 0, "reward": 0, "ref": 0}, "live_phases": [],
                         "rollout_workers": 0, "ref_workers": 0, "judges": 0}, output
    assert phases[2]["live_calls"]["rollout"] == 0 and phases[2]["rollout_workers"] == 0, output
    for record in train_lines(tmp_path / "runs" / "run4"):
        assert record["phases"] == {"rollout": "hit", "reward": "hit", "ref": "hit"}, record
    # Run 5, a new reward on the recorded rollouts: only the reward (and validation's rollout) ran live.
    new_reward = summary["new_reward"]
    assert new_reward["replayed"] and new_reward["rollout_scores_identical"], output
    assert new_reward["reward_changed_steps"] == [1, 2, 3], output
    assert phases[4]["live_calls"] == {"rollout": 1, "reward": 4, "ref": 0}, output
    assert "inputs differ" not in (tmp_path / "runs" / "run5.log").read_text(), output
    # Run 6 of compare.py, a verify run whose update differs (actor.lr): step 1 identical, step 2 first diverges.
    verify = summary["verify"]
    assert verify["statuses"] == {"1": "identical", "2": "diverged", "3": "diverged"}, output
    assert verify["first_step"] == 2 and verify["first_line"]["first"]["path"] == "batch.responses", output
    assert "first divergence: role rollout target tiny_grpo step 2 call 0: diverged at batch.responses [" in output
    assert "run-4 update_only:" in output and "| live: none | 0, 0, 0" in output, output
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

    # The main job's store diffs with no flag (issue 42): its Batch class is compared by its recorded fields, though
    # tinygrpo is not importable by the diff process, and the copy made after run 2 holds the same entries.
    plot = tmp_path / "p.png"
    proc = subprocess.run([sys.executable, "-m", "skipweave.cli.main", "diff", str(dump), str(dump4), "--plot",
                           str(plot)], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "unreadable" not in proc.stdout, proc.stdout + proc.stderr
    assert "every aligned entry is identical" in proc.stdout and plot.stat().st_size > 10_000, proc.stdout

    # compare.py ends with the `skipweave view` command of its store and run 6's report: it writes the page, whose
    # diff marks run 6's first diverging token (the browser's view of such a page: tests/view/test_browser.py)
    line = next(x for x in output.splitlines() if x.startswith("see the store in a browser: "))
    cmd = shlex.split(line.split(": ", 1)[1])
    assert cmd[1:3] == ["view", str(dump)] and cmd[3].endswith("run6/skipweave-verify.jsonl"), line
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "runs" / "view.html").read_text(encoding="utf-8")
    assert "First divergence:</b> role rollout target tiny_grpo step 2" in page, page[:3000]
    assert page.count('<mark class="first-diff"') >= 2 and page.count("<svg") == 2
    check_in_browser(tmp_path / "runs" / "view.html", tmp_path, verify["first_line"])


def check_in_browser(path: Path, tmp_path: Path, first: dict[str, Any]) -> None:
    """The main job's page in headless Chromium (tests/view/browser.py): no console error, no request but the file,
    the steps table and both charts drawn, the verify run's first diverging token marked on A's side (its recorded
    id) and B's (the live id); a screenshot kept (``tmp_path/artifacts/view-main-job.png`` and
    ``tests/artifacts/view-main-job.png``)."""
    from tests.view.browser import chromium, keep, open_page

    detail = first["first_token"]["detail"]
    position = detail["first_index"][-1]
    with chromium() as browser:
        page, errors, requests = open_page(browser, path)
        assert page.locator("table.steps tr.train").count() >= 3 and page.locator("table.steps").first.is_visible()
        charts = page.locator("figure.chart svg")
        assert charts.count() == 2 and all(charts.nth(i).locator("path").count() > 10 for i in range(2))
        marks = page.locator(".side-by-side mark.first-diff")
        assert [marks.nth(i).inner_text() for i in range(marks.count())] == [str(detail["recorded"]),
                                                                             str(detail["live"])]
        assert marks.first.is_visible() and marks.first.get_attribute("title") == f"position {position}"
        keep(page, "view-main-job.png", tmp_path)
        assert errors == [] and requests == []


CRITIC_RUN = ["trainer.total_steps=2", "trainer.val_every=0", "data.batch_size=4", "reward.judge_latency=0",
              "critic.enable=true", "+skip.values.targets.tiny_grpo=tinygrpo.trainer.GRPOTrainer._compute_values"]


def train(tmp_path: Path, name: str, profile: str, dump: Path) -> subprocess.CompletedProcess[str]:
    """One run of train.py on a small config with the critic on, ``+skip=<profile>`` over ``dump``."""
    cmd = [sys.executable, str(REPO_ROOT / "examples" / "tiny_grpo" / "train.py"), f"+skip={profile}",
           f"skip.rollout.dump_dir={dump}", f"hydra.run.dir={tmp_path / name}", *CRITIC_RUN]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT, check=False)


@pytest.mark.hydra_plugin
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_values_cache_records_the_critics_values_and_update_only_replays_them(tmp_path: Path) -> None:
    """With the critic on, ``values_cache`` composed with the others records its values; ``update_only`` then replays
    them with every other phase (no Ray, no worker): bit-identical policy and critic, and the role's WARNING says that
    values come from the weights the run trains."""
    dump = tmp_path / "dump"
    runs = [train(tmp_path, "record", "[rollout_cache,ref_cache,reward_cache,values_cache]", dump),
            train(tmp_path, "replay", "update_only", dump)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = train_lines(tmp_path / "record"), train_lines(tmp_path / "replay")
    assert [r["phases"]["values"] for r in first] == ["miss", "miss"]
    assert [r["phases"] for r in second] == [{"rollout": "hit", "reward": "hit", "ref": "hit", "values": "hit"}] * 2
    for a, b in zip(first, second, strict=True):
        for key in (*COMPARED, "critic_checksum", "value_mean", "critic_loss"):
            assert a[key] == b[key], (key, a[key], b[key])
        assert b["live_phases"] == [] and (b["rollout_workers"], b["ref_workers"], b["judges"]) == (0, 0, 0)
    text = runs[1].stdout + runs[1].stderr
    assert "role values records or replays results computed from weights the run trains" in text, text[-2000:]
    assert "skipweave summary role=values: calls=2 hits=2" in text, text[-2000:]
