"""TRL's GRPOTrainer and RLOOTrainer, recorded and replayed by the shipped profiles alone (no profile file of
the user's).

The user's side is one training script (``apps/train.py``: a tiny Qwen2 model and a word-level tokenizer built in code,
a rule reward, 3 steps, evaluation at step 2 and at the end; it imports nothing from skipweave), run exactly as
docs/trl.md says::

    skipweave run --skip trl_grpo_cache -- python train.py grpo report.json     # run 1 records
    skipweave run --skip trl_grpo_cache -- python train.py grpo report.json     # run 2 replays
    skipweave run --skip trl_grpo_replay -- python train.py grpo report.json    # replay-only: nothing generated

with the store in the default dump dir (each trainer's runs get a ``HOME`` of their own). Run 2 and the replay-only
run must end with run 1's per-step logs (losses, rewards, KL, completion lengths, ...), evaluation metrics, token
counter, completions tables and parameters, bit for bit, and so must a run without skipweave; run 2 generates only
for evaluation, the replay-only run not at all (GRPO's goes through ``accelerate launch``). A verify run with another
learning rate names the first step whose generation differs.

All runs start from one module fixture, as concurrently as their order allows (each is ~5 s of imports and under a
second of training).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from skipweave.store.scan import scan
from tests.integrations.hydra.runner import Run, clean_env, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
APP = Path(__file__).resolve().parent / "apps" / "train.py"
TIMEOUT = 300  # one run: ~5 s of imports (torch, transformers, trl), under a second of training
TRAINERS = ("grpo", "rloo")
TIMING = ("_runtime", "_per_second", "step_time")
"""Wall-clock metrics (transformers' runtimes and rates, TRL's ``step_time``): the only logged values allowed to
differ between runs."""

TRAINING_CALLS = {"grpo": [[0, True], [1, True], [2, True]], "rloo": [[0, True], [2, True]]}
"""Real training generations, ``[global_step, model.training]``: GRPO one per step (2 micro-batches share it), RLOO
one every 2 steps (``num_iterations=2``)."""
EVAL_CALLS = [[2, False], [3, False], [3, False]]
"""Real evaluation generations: at step 2 (``eval_steps=2``), at the last step, and the final ``evaluate()``."""
ALL_CALLS = {trainer: [*calls[:-1], EVAL_CALLS[0], calls[-1], *EVAL_CALLS[1:]]
             for trainer, calls in TRAINING_CALLS.items()}
"""Every real generation of a run without replay, in order (step 2's evaluation comes before step 2's training call:
it runs at the end of step 1, when the global step is already 2)."""
EVAL_REWARDS = [4, 4, 4]
"""Completions each evaluation's reward call scores (2 prompts, 2 generations each)."""


# ---------------------------------------------------------------------------------------------------------- runs
def env_for(home: Path) -> dict[str, str]:
    """The runs' environment: this checkout's skipweave first on the path, the store under ``home`` (the default
    dump dir is ``~/.cache/skipweave``), nothing from a hub, no profile folder of the test process's."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = clean_env(PYTHONPATH=path, HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("SKIPWEAVE_PROFILE_PATH", None)
    return env


def train(trainer: str, *options: str) -> list[str]:
    return [sys.executable, str(APP), trainer, "report.json", *options]


def woven(profile: str, command: list[str]) -> list[str]:
    """``skipweave run --skip PROFILE -- COMMAND``, nothing else."""
    return [sys.executable, "-m", "skipweave.cli", "run", "--skip", profile, "--", *command]


def accelerate(trainer: str) -> list[str]:
    """``accelerate launch`` of the script, one CPU process."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--cpu", str(APP), trainer, "report.json"]


def launch(args: list[str], cwd: Path, home: Path) -> tuple[Run, dict[str, Any]]:
    cwd.mkdir()
    done = run(args, cwd=cwd, env=env_for(home), timeout=TIMEOUT)
    assert done.returncode == 0, done
    return done, json.loads((cwd / "report.json").read_text())


def listing(home: Path) -> dict[tuple[int, str], int]:
    """``(step, shard) -> committed entries`` of the default dump dir under ``home``, every checksum checked."""
    parts = scan(str(home / ".cache" / "skipweave"), checksums=True).parts
    assert all(p.complete and p.closed for p in parts), parts
    return {(p.step, p.shard): len(p.entries) for p in parts}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Per trainer: ``plain`` | ``record`` -> (``replay`` | ``replay_only`` [| ``verify``]); GRPO's replay-only run
    through ``accelerate launch``."""
    tmp = tmp_path_factory.mktemp("trl")
    homes = {trainer: tmp / f"home_{trainer}" for trainer in TRAINERS}
    for home in homes.values():
        home.mkdir()
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures: dict[str, dict[str, Future[Any]]] = {trainer: {} for trainer in TRAINERS}

        def start(trainer: str, name: str, args: list[str], after: Future[Any] | None = None) -> None:
            def job() -> Any:
                if after is not None:
                    after.result()  # the recording first (its failure fails this run too)
                return launch(args, tmp / f"{trainer}_{name}", homes[trainer])
            futures[trainer][name] = pool.submit(job)

        for trainer in TRAINERS:
            start(trainer, "record", woven(f"trl_{trainer}_cache", train(trainer)))
            start(trainer, "plain", train(trainer))
        for trainer in TRAINERS:
            recorded = futures[trainer]["record"]
            start(trainer, "replay", woven(f"trl_{trainer}_cache", train(trainer)), after=recorded)
            # GRPO's replay-only run goes through `accelerate launch` (its child process is woven too)
            command = accelerate(trainer) if trainer == "grpo" else train(trainer)
            start(trainer, "replay_only", woven(f"trl_{trainer}_replay", command), after=recorded)
        recorded = futures["grpo"]["record"]
        start("grpo", "verify", woven("trl_grpo_verify", train("grpo", "--learning-rate", "0.02")), after=recorded)
        done = {trainer: {name: f.result() for name, f in named.items()} for trainer, named in futures.items()}
    for trainer in TRAINERS:  # the store as the recording left it (the other runs record nothing)
        done[trainer]["listing"] = listing(homes[trainer])
    done["grpo"]["verify_folder"] = tmp / "grpo_verify"
    yield done


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the wall-clock metrics and the real-call counts (bit-identical across equal runs)."""
    def untimed(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in entry.items() if not k.endswith(TIMING)}

    out = {k: v for k, v in report.items() if k not in ("real_generations", "reward_calls")}
    out["log_history"] = [untimed(e) for e in report["log_history"]]
    out["final_eval"] = untimed(report["final_eval"])
    return out


def generation_logs(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Training log lines that carry the metrics a generation appended (a step that reused a buffered generation
    logs none)."""
    return [e for e in report["log_history"] if "loss" in e and "reward" in e]


def summary(done: Run) -> str:
    lines = [line for line in done.stderr.splitlines() if "skipweave summary: " in line]
    assert len(lines) == 1, done
    return lines[0].split("skipweave summary: ", 1)[1]


each = pytest.mark.parametrize("trainer", TRAINERS)


# ---------------------------------------------------------------------------------------------------------- tests
@each
def test_recording_run_generates_and_scores_every_step_and_records_evaluation_apart(
        runs: dict[str, dict[str, Any]], trainer: str) -> None:
    done, report = runs[trainer]["record"]
    assert report["real_generations"] == ALL_CALLS[trainer]
    n = len(TRAINING_CALLS[trainer])
    assert summary(done).startswith(f"hits=0 misses={n} bypasses=3 "), done
    # Training generations under their steps (shard r0); evaluations apart (val_r0), two of them at step 3.
    assert runs[trainer]["listing"] == {**{(step, "r0"): 1 for step, _ in TRAINING_CALLS[trainer]},
                                        (2, "val_r0"): 1, (3, "val_r0"): 2}
    # What the method appended to the trainer's metrics reached the logs: one line per generation.
    logs = generation_logs(report)
    assert [e["step"] for e in logs] == [step + 1 for step, _ in TRAINING_CALLS[trainer]]
    for entry in logs:
        assert {"num_tokens", "completions/mean_length", "rewards/reward_good_words/mean", "reward_std"} <= set(entry)
    assert report["num_input_tokens_seen"] > 0
    assert len({e["grad_norm"] for e in report["log_history"] if "grad_norm" in e}) == 3  # it trains
    assert any(table["completion"] for table in report["completions"])


@each
def test_replay_is_bit_identical_with_no_training_generation_and_evaluation_live(
        runs: dict[str, dict[str, Any]], trainer: str) -> None:
    _, recorded = runs[trainer]["record"]
    done, replayed = runs[trainer]["replay"]
    assert replayed["real_generations"] == EVAL_CALLS, "a training generation ran, or an evaluation was replayed"
    assert replayed["reward_calls"] == EVAL_REWARDS, "a training generation was scored again"
    n = len(TRAINING_CALLS[trainer])
    assert summary(done).startswith(f"hits={n} misses=0 bypasses=3 "), done
    assert "skipweave: " not in done.stderr, done  # no warning of skipweave's (its summary lines aside)
    # Per-step losses, rewards, KL, completion metrics, evaluation metrics, token counter, completions tables and
    # the final parameters: all equal.
    assert comparable(replayed) == comparable(recorded)


@each
def test_weaving_changes_nothing_when_recording(runs: dict[str, dict[str, Any]], trainer: str) -> None:
    _, recorded = runs[trainer]["record"]
    _, plain = runs[trainer]["plain"]
    assert plain["real_generations"] == recorded["real_generations"]
    assert comparable(plain) == comparable(recorded)


@each
def test_replay_only_run_generates_and_scores_nothing(runs: dict[str, dict[str, Any]], trainer: str) -> None:
    """GRPO's through ``skipweave run ... -- accelerate launch train.py``: the trainer runs in accelerate's child
    process, woven as well; the recording it replays was made by a plain ``python train.py``."""
    _, recorded = runs[trainer]["record"]
    done, replayed = runs[trainer]["replay_only"]
    assert ("accelerate.commands.launch" in done.args) is (trainer == "grpo")
    assert replayed["real_generations"] == [] and replayed["reward_calls"] == []
    n = len(TRAINING_CALLS[trainer]) + len(EVAL_CALLS)
    assert summary(done).startswith(f"hits={n} misses=0 bypasses=0 "), done
    assert comparable(replayed) == comparable(recorded)  # evaluation metrics too: served with their effects


def test_verify_run_names_the_first_step_another_learning_rate_changes(runs: dict[str, dict[str, Any]]) -> None:
    """Step 0's generation comes from the initial weights, so it is identical; step 1's from weights updated with
    another learning rate: the first divergence, named by its token."""
    done, verified = runs["grpo"]["verify"]
    assert verified["real_generations"] == ALL_CALLS["grpo"]  # a verify run runs every call live
    (report,) = runs["grpo"]["verify_folder"].glob("skipweave-verify-*.jsonl")
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    expected = [(step, not training) for step, training in ALL_CALLS["grpo"]]
    assert [(x["step"], x["validation"]) for x in lines] == expected
    first, second = lines[0], lines[1]
    assert first["status"] == "identical" and first["inputs"] == "same", first
    assert second["status"] == "diverged" and second["first_token"]["path"] == "completion_ids", second
    assert 0 < second["token_match"] < 1, second
    _, recorded = runs["grpo"]["record"]
    assert verified["parameters_sha256"] != recorded["parameters_sha256"]
