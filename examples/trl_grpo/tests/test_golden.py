"""The golden test of the TRL example: its first two steps against a committed recording (the bundle ``golden.zip``).

Each step's generation (completions, rewards, reference log-probs, advantages: TRL's
``GRPOTrainer._generate_and_score_completions``) is replayed from the recording by the shipped profile
``trl_grpo_replay`` (replay-only: no completion sampled, no reward function called); the update runs live and is
verified: the loss of each micro-batch (``GRPOTrainer.compute_loss``) must match the recorded one
(``golden_update.yaml``). A change to what the loss is computed with after generation (``loss_type``, ``beta``, the
learning rate, the optimizer, TRL's loss code) fails the test, naming the step, the call and the value.

    pytest examples/trl_grpo/tests                                # replay and verify
    pytest examples/trl_grpo/tests --skipweave-mode=record        # re-record: bless an intended change (TRL generates)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import train
from transformers import GenerationMixin

STEPS = 2
CALLS_PER_STEP = 2
"""Micro-batches per step (``gradient_accumulation_steps``): each one computes its loss."""


@pytest.fixture
def torch_state() -> Iterator[None]:
    """The run makes torch single-threaded (and the test deterministic): put it back afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


@pytest.fixture
def generations(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every real call of ``model.generate`` (TRL samples through it when vLLM is off), as ``model.training``."""
    calls: list[bool] = []
    real = GenerationMixin.generate

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.training)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", counted)
    return calls


@pytest.mark.timeout(600)
@pytest.mark.skipweave("trl_grpo_replay", "golden_update.yaml", bundle="golden.zip")
def test_first_two_steps_match_the_recording(tmp_path: Path, torch_state: None, generations: list[bool],
                                             skipweave_summary: Any) -> None:
    train.REWARD_CALLS.clear()
    trainer = train.make_trainer(tmp_path, max_steps=STEPS)
    trainer.train()
    assert trainer.state.global_step == STEPS
    losses = [line["loss"] for line in trainer.state.log_history if "loss" in line]
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses))), trainer.state.log_history
    roles = skipweave_summary.roles()
    if skipweave_summary.mode == "replay":
        assert (roles["rollout"].hits, roles["rollout"].live) == (STEPS, 0), roles["rollout"]
        assert roles["update"].identical + roles["update"].close == STEPS * CALLS_PER_STEP, roles["update"]
        # nothing but the update ran: no completion sampled, no reward scored
        assert generations == [] and train.REWARD_CALLS == [], (generations, train.REWARD_CALLS)
    elif skipweave_summary.mode == "record":
        assert roles["rollout"].misses == STEPS and roles["update"].misses == STEPS * CALLS_PER_STEP, roles
        assert generations == [True] * STEPS and len(train.REWARD_CALLS) == STEPS
