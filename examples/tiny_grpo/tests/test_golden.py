"""The golden test of the main job: its first two steps against a committed recording (the bundle ``golden.zip``).

Rollouts, reference log-probs and rewards are replayed from the recording (replay-only: no Ray worker, no judge), the
update runs live and is verified: its per-step metrics must match the recorded ones (``golden_update.yaml``). A change
to anything the update sees (the advantages, the loss, the optimizer) fails the test, naming the step and the metric.

    pytest examples/tiny_grpo/tests                                # replay and verify (about 10 s)
    pytest examples/tiny_grpo/tests --skipweave-mode=record        # re-record: bless an intended change (Ray runs)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from omegaconf import OmegaConf
from tinygrpo import cluster, judge, ref, rollout
from tinygrpo.trainer import GRPOTrainer, seed_everything

JOB = Path(__file__).resolve().parents[1]
STEPS = 2


@pytest.fixture
def torch_state() -> Iterator[None]:
    """The trainer makes torch deterministic and single-threaded for the process: put it back afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.mark.timeout(600)  # --skipweave-mode=record starts Ray and generates; a replay takes about 10 s
@pytest.mark.skipweave("rollout_cache", "ref_cache", "reward_cache", "golden_update.yaml",
                       cfg="../config.yaml", bundle="golden.zip")
def test_first_two_steps_match_the_recording(tmp_path: Path, torch_state: None, skipweave_summary) -> None:
    cfg = OmegaConf.load(JOB / "config.yaml")
    cfg.trainer.total_steps = STEPS
    seed_everything(int(cfg.seed), int(cfg.trainer.torch_threads))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    pythonpath = os.pathsep.join(p for p in (str(JOB), os.environ.get("PYTHONPATH", "")) if p)
    cluster.configure(num_cpus=int(cfg.ray.num_cpus), include_dashboard=False, logging_level=logging.WARNING,
                      runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})  # started only by a live worker group
    started = (rollout.WORKERS_STARTED, ref.WORKERS_STARTED, judge.JUDGES_STARTED)
    trainer = GRPOTrainer(cfg, tmp_path)
    try:
        summary = trainer.fit()
        ray_started = ray.is_initialized()
    finally:
        trainer.close()
        cluster.shutdown()
    assert summary["steps"] == STEPS
    roles = skipweave_summary.roles()
    if skipweave_summary.mode == "replay":
        for phase in ("rollout", "ref", "reward"):
            assert (roles[phase].hits, roles[phase].live) == (STEPS, 0), roles[phase]
        assert roles["update"].identical + roles["update"].close == STEPS, roles["update"]
        # nothing but the update ran: no Ray, no rollout or reference worker, no judge
        assert (rollout.WORKERS_STARTED, ref.WORKERS_STARTED, judge.JUDGES_STARTED) == started and not ray_started
    elif skipweave_summary.mode == "record":
        assert {name: counts.misses for name, counts in roles.items()} == dict.fromkeys(roles, STEPS), roles
