"""A trainer nobody here wrote: a ``transformers.Trainer`` subclass driven by a profile file through ``skipweave run``.

The user's side is their training script and a YAML profile, nothing else (``apps/``: ``train.py`` and
``hftrainer.py`` import nothing from skipweave; ``hf_profile.yaml`` is the profile). Run 1 records the trainer's
generation method at every training step; run 2 replays them all, runs evaluation live, and ends with the very same
logs, token counter and parameters. A run without skipweave gives run 1's numbers, and a replay without the
profile's ``effects`` shows what they are for.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.hydra.runner import Run, clean_env, recorded_steps, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APPS = Path(__file__).resolve().parent / "apps"
REPO = Path(__file__).resolve().parents[3]
PROFILE = APPS / "hf_profile.yaml"
TRAIN = [sys.executable, str(APPS / "train.py"), "report.json"]
TIMEOUT = 300  # one run: seconds of imports (torch, transformers), then about one second of training

TRAIN_STEPS = [[step, True] for step in range(6)]
"""Real training calls of ``generate_completions``: (global_step, model.training), one per step, from 0."""
EVAL_CALLS = [[3, False]] * 2 + [[6, False]] * 4
"""Evaluation calls: 2 batches at steps 3 and 6 (``eval_steps=3``), 2 more in the final ``trainer.evaluate()``."""
ALL_CALLS = TRAIN_STEPS[:3] + EVAL_CALLS[:2] + TRAIN_STEPS[3:] + EVAL_CALLS[2:]
TIMING = ("_runtime", "_per_second")
"""Suffixes of the Trainer's wall-clock metrics, the only logged values allowed to differ between runs."""


def woven(dump: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "skipweave.cli", "run", "--skip", str(PROFILE), f"skip.rollout.dump_dir={dump}",
            *overrides, "--", *TRAIN]


def launch(args: list[str], cwd: Path) -> tuple[Run, dict[str, Any]]:
    cwd.mkdir()
    # the apps, then this checkout's skipweave (not whichever one the environment installed)
    done = run(args, cwd=cwd, env=clean_env(PYTHONPATH=os.pathsep.join([str(APPS), str(REPO)])), timeout=TIMEOUT)
    assert done.returncode == 0, done
    return done, json.loads((cwd / "report.json").read_text())


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the wall-clock metrics and the real-call list (bit-identical across equal runs)."""
    def untimed(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in entry.items() if not k.endswith(TIMING)}

    out = {k: v for k, v in report.items() if k != "real_generations"}
    out["log_history"] = [untimed(e) for e in report["log_history"]]
    out["final_eval"] = untimed(report["final_eval"])
    return out


def train_logs(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in report["log_history"] if "loss" in e]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Four runs, as concurrent as their order allows: [record, then (replay | replay without effects)] | plain."""
    tmp = tmp_path_factory.mktemp("hf_trainer")
    dump = tmp / "rollouts"
    with ThreadPoolExecutor(max_workers=3) as pool:
        plain = pool.submit(launch, TRAIN, tmp / "plain")
        record = launch(woven(dump), tmp / "record")
        replay = pool.submit(launch, woven(dump), tmp / "replay")
        no_effects = pool.submit(launch, woven(dump, "skip.rollout.effects=[]"), tmp / "no_effects")
        yield {"dump": dump, "record": record, "replay": replay.result(), "plain": plain.result(),
               "no_effects": no_effects.result()}


def test_recording_run_generates_at_every_training_step_and_evaluation(runs: dict[str, Any]) -> None:
    done, report = runs["record"]
    assert report["real_generations"] == ALL_CALLS
    assert recorded_steps(runs["dump"]) == list(range(6)), "evaluation must never be recorded"
    assert "skipweave summary: hits=0 misses=6 bypasses=6 " in done.stderr, done
    logs = train_logs(report)
    assert [e["step"] for e in logs] == [2, 4, 6]
    for entry in logs:  # what the generation method appended to self._metrics["train"] reached the logs
        assert {"completion_length", "completion_max_length", "terminated_ratio", "reward"} <= set(entry), entry
    evals = [e for e in report["log_history"] if "eval_loss" in e]
    assert [e["step"] for e in evals] == [3, 6, 6]
    assert all("eval_completion_length" in e for e in evals), evals
    assert report["num_input_tokens_seen"] > 0


def test_replay_is_bit_identical_with_no_training_generation_and_evaluation_live(runs: dict[str, Any]) -> None:
    _, recorded = runs["record"]
    done, replayed = runs["replay"]
    assert replayed["real_generations"] == EVAL_CALLS, "a training generation ran, or an evaluation was replayed"
    assert "skipweave summary: hits=6 misses=0 bypasses=6 " in done.stderr, done
    assert "skipweave: " not in done.stderr, done  # no warning of skipweave's (its summary lines aside)
    # Metrics (the method's own included), losses, grad norms, eval metrics, token counter, parameters: all equal.
    assert comparable(replayed) == comparable(recorded)
    assert replayed["parameters_sha256"] == recorded["parameters_sha256"]


def test_weaving_changes_nothing_when_recording(runs: dict[str, Any]) -> None:
    _, recorded = runs["record"]
    _, plain = runs["plain"]
    assert plain["real_generations"] == ALL_CALLS
    assert comparable(plain) == comparable(recorded)


def test_a_replay_without_the_declared_effects_loses_what_the_method_changed(runs: dict[str, Any]) -> None:
    """Why the profile lists ``effects``: a replay never runs the method's body, so without them the metrics it
    appends and the tokens it counts are missing, although every loss and parameter is still the same."""
    _, recorded = runs["record"]
    _, bare = runs["no_effects"]
    assert bare["real_generations"] == EVAL_CALLS
    assert bare["parameters_sha256"] == recorded["parameters_sha256"]
    assert [e["loss"] for e in train_logs(bare)] == [e["loss"] for e in train_logs(recorded)]
    assert not any("completion_length" in e for e in train_logs(bare)), train_logs(bare)
    assert bare["num_input_tokens_seen"] < recorded["num_input_tokens_seen"]
