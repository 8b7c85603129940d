"""What the exit summary says of runs that did nothing useful and said little: a run stopped by ReplayMissing at its
first call, and a phase role whose every call its bypass rule took for a validation call.

From the user's side: ``skipweave run --skip <shipped profile> ... -- python train.py`` in a subprocess, a one-file
trainer that imports nothing of skipweave, its stderr read as a person reads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAINER = '''
import os

MODE = os.environ.get("MODE", "plain")


class Batch:
    def __init__(self, step, values, validate=False):
        self.values = values
        self.meta_info = {"global_steps": step}
        if MODE == "verl" and not validate:
            self.meta_info["global_token_num"] = [len(values)]  # verl's fit() sets it on training batches only


class Trainer:
    def __init__(self):
        self.global_steps = 0

    def generate(self, prompts):
        return [p * 3 for p in prompts]

    def compute_reward(self, batch):
        values = batch["values"] if isinstance(batch, dict) else batch.values
        return [v * 0.5 for v in values]

    def fit(self, steps=3):
        for step in range(1, steps + 1):
            self.global_steps = step
            responses = self.generate([step, step + 1])
            self.compute_reward({"values": responses} if MODE == "nometa" else Batch(step, responses))
        if MODE == "verl":
            self.compute_reward(Batch(steps, [0, 1], validate=True))  # a validation pass


Trainer().fit()
'''

SKIPWEAVE = [sys.executable, "-m", "skipweave.cli", "run"]
REWARD = ["+skip.reward.targets.score=trainer:Trainer.compute_reward"]


def _run(folder: Path, *args: str, mode: str = "plain") -> subprocess.CompletedProcess[str]:
    """``skipweave run <args> -- python trainer.py`` in ``folder``, with this checkout's skipweave."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKIPWEAVE_", "HYDRA_"))}
    env.update(MODE=mode, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p))
    return subprocess.run([*SKIPWEAVE, *args, "--", sys.executable, "trainer.py"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=180)


def _folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "trainer.py").write_text(TRAINER)
    return folder


def _twice(folder: Path, *args: str, mode: str) -> list[subprocess.CompletedProcess[str]]:
    return [_run(folder, *args, mode=mode) for _ in range(2)]  # (in turn: the second replays what the first left)


Runs = dict[str, tuple[Path, list[subprocess.CompletedProcess[str]]]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Each scenario's folder and runs (the two runs of one scenario in turn; the scenarios side by side)."""
    root = tmp_path_factory.mktemp("silences")
    store = "skip.rollout.dump_dir=store"
    scenarios = {
        # the main job's run 4 on an empty store: the rollout's first call stops the run
        "replay_missing": lambda f: [_run(f, "--skip", "update_only", store,
                                          "+skip.rollout.targets.gen=trainer:Trainer.generate",
                                          "+skip.rollout.step.expr=self.global_steps", *REWARD,
                                          "skip.reward.bypass=null")],
        # the shipped reward profile on a trainer that is not verl, run twice: batches with meta_info but no
        # global_token_num, then batches without meta_info at all (the rule's expression fails on each)
        "plain": lambda f: [_run(f, "--skip", "reward_cache", store, *REWARD, mode=mode)
                            for mode in ("plain", "nometa")],
        # what docs/phases.md says such a trainer sets
        "bypass_null": lambda f: _twice(f, "--skip", "reward_cache", store, *REWARD, "skip.reward.bypass=null",
                                        mode="plain"),
        # verl-shaped batches: training calls recorded, the validation pass recorded apart, no warning
        "verl": lambda f: [_run(f, "--skip", "reward_cache", store, *REWARD, mode="verl")],
    }
    with ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        folders = {name: _folder(root, name) for name in scenarios}
        futures = {name: pool.submit(make, folders[name]) for name, make in scenarios.items()}
        return {name: (folders[name], future.result()) for name, future in futures.items()}


def _shards(folder: Path) -> set[str]:
    """The shards the reward role's entries were recorded under (``r0``, ``val_r0``)."""
    return {p.name.rsplit("-", 1)[0] for p in folder.glob("store/default/reward/*/score/*.manifest.json")}


def test_a_run_stopped_by_replay_missing_at_its_first_call_says_so_not_never_called(runs: Runs) -> None:
    _, (proc,) = runs["replay_missing"]
    assert proc.returncode != 0 and "ReplayMissing: skipweave: replay-only role rollout target gen" in proc.stderr
    line = next((x for x in proc.stderr.splitlines() if x.startswith("skipweave: the run met a replay-only call")), "")
    assert "(ReplayMissing): role rollout target gen step 1 call 0 (shard r0) in dump dir " in line, proc.stderr
    assert line.endswith("not reached before it: role reward target score (trainer:Trainer.compute_reward)"), line
    assert "never called" not in proc.stderr.replace(line, ""), proc.stderr


def test_a_role_whose_every_call_the_bypass_rule_took_says_so_at_exit_run_after_run(runs: Runs) -> None:
    folder, procs = runs["plain"]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        assert "skipweave summary role=reward: calls=3 hits=0 misses=0 bypasses=3" in proc.stderr, proc.stderr
        assert proc.stderr.count("skipweave: role reward: none of its calls was a training call") == 1, proc.stderr
        assert ("the bypass rule skip.reward.bypass.expr=\"args[0].meta_info.get('validate', 'global_token_num' "
                "not in args[0].meta_info)\" took every one for a validation call") in proc.stderr
        assert "skip.reward.bypass=null" in proc.stderr and "docs/phases.md#a-trainer-that-is-not-verl" in proc.stderr
    assert _shards(folder) == {"val_r0"}  # what the warning says: every reward recorded apart, none for training


def test_the_failing_rule_says_its_calls_are_recorded_apart_not_unrecorded(runs: Runs) -> None:
    folder, (_, proc) = runs["plain"]
    assert proc.returncode == 0, proc.stderr
    warning = next(x for x in proc.stderr.splitlines() if "skip.reward.bypass.expr" in x and "failed on" in x)
    assert "are not recorded" not in warning
    assert warning.endswith("such calls are taken for validation calls: they run live and are recorded apart from "
                            "training calls (shard val_<shard>, served only in replay-only runs)"), warning
    assert "none of its calls was a training call" in proc.stderr


def test_what_the_docs_say_a_trainer_that_is_not_verl_sets_replays_its_rewards(runs: Runs) -> None:
    folder, (first, second) = runs["bypass_null"]
    assert "calls=3 hits=0 misses=3 bypasses=0" in first.stderr, first.stderr
    assert "calls=3 hits=3 misses=0 bypasses=0" in second.stderr, second.stderr
    assert "training call" not in first.stderr + second.stderr
    assert _shards(folder) == {"r0"}


def test_a_verl_shaped_run_with_a_validation_pass_is_not_warned_about(runs: Runs) -> None:
    folder, (proc,) = runs["verl"]
    assert "calls=4 hits=0 misses=3 bypasses=1" in proc.stderr, proc.stderr
    assert "training call" not in proc.stderr and "WARNING" not in proc.stderr
    assert _shards(folder) == {"r0", "val_r0"}
