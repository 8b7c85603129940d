"""Phases of a step as roles of their own (docs/phases.md): a verl-shaped trainer's driver-side methods woven by the
shipped phase profiles, composed; a phase replayed on inputs that differ from its recording is caught naming its
role; roles whose results come from the trained weights warn once they are woven.

Real wrapt patches over a real host module and real stores; runs are weaves over one dump dir, as processes are.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.config.profiles import compose_profile

HOST = '''
from dataclasses import dataclass, field

import torch

LIVE = []


@dataclass
class Batch:  # DataProto-shaped
    batch: dict
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def union(self, other):  # as verl's DataProto.union: meta_info keys both hold must agree
        for key, value in other.meta_info.items():
            assert self.meta_info.get(key, value) == value, f"{key} in both meta_info dicts, not the same"
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self


class Trainer:
    def __init__(self, reward_scale=1.0, seed=0):
        self.global_steps, self.reward_scale, self.seed = 0, reward_scale, seed

    def rollout(self, prompts):
        LIVE.append(("rollout", self.global_steps))
        g = torch.Generator().manual_seed(self.seed * 100 + self.global_steps)
        responses = torch.randint(0, 9, (4, 5), generator=g)
        return Batch({"input_ids": responses, "responses": responses,
                      "attention_mask": torch.ones(4, 5, dtype=torch.long)},
                     meta_info={"global_steps": self.global_steps, "global_token_num": [5] * 4})

    def _compute_reward(self, batch):
        LIVE.append(("reward", self.global_steps))
        return Batch({"rm_scores": batch.batch["responses"].float().mean(-1) * self.reward_scale})

    def _compute_ref_log_prob(self, batch):
        LIVE.append(("ref", self.global_steps))
        return Batch({"ref_log_prob": torch.log_softmax(batch.batch["responses"].float(), -1)})

    def _compute_values(self, batch):
        LIVE.append(("values", self.global_steps))
        return Batch({"values": batch.batch["responses"].float().cumsum(-1)})

    def fit(self, steps):
        losses = []
        for step in range(1, steps + 1):
            self.global_steps = step
            batch = self.rollout(Batch({}, meta_info={"global_steps": step}))
            batch.union(self._compute_reward(batch))  # as verl's fit(): the reward first, unioned into the batch
            batch.union(self._compute_ref_log_prob(batch))
            batch.union(self._compute_values(batch))
            losses.append(float((batch.batch["rm_scores"] + batch.batch["ref_log_prob"].mean(-1)
                                 + batch.batch["values"].mean(-1)).sum()))
        return losses
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def weave(mod: Any, dump: Path, profiles: list[str], *overrides: str) -> None:
    """Weave shipped profiles with this host's targets added, as ``+skip=[...]`` and ``+skip.<role>.targets.x=``
    would on a command line."""
    name = mod.__name__
    targets = {"rollout": "rollout", "reward": "_compute_reward", "ref": "_compute_ref_log_prob",
               "values": "_compute_values"}
    roles = [role for role in compose_profile(profiles).skip if role in targets]
    extra = [f"skip.{role}.dump_dir={dump}" for role in roles]
    extra += [f"+skip.{role}.targets.host={name}:Trainer.{targets[role]}" for role in roles]
    skipweave.weave(compose_profile(profiles, overrides=[*extra, *overrides]))


def run(mod: Any, dump: Path, profiles: list[str], *overrides: str, steps: int = 2, **trainer: Any) -> list[float]:
    mod.LIVE.clear()
    weave(mod, dump, profiles, *overrides)
    try:
        return list(mod.Trainer(**trainer).fit(steps))
    finally:
        skipweave.unweave()


RECORD = ["rollout_cache", "reward_cache", "ref_cache", "values_cache"]


def test_each_phase_profile_replays_its_phase_alone_and_composed(mod: Any, tmp_path: Path) -> None:
    first = run(mod, tmp_path, RECORD)
    assert sorted(mod.LIVE) == sorted((p, s) for p in ("rollout", "reward", "ref", "values") for s in (1, 2))
    for profile, phase in (("reward_cache", "reward"), ("ref_cache", "ref"), ("values_cache", "values")):
        assert run(mod, tmp_path, [profile]) == first
        assert {p for p, _ in mod.LIVE} == {"rollout", "reward", "ref", "values"} - {phase}, profile
    assert run(mod, tmp_path, ["rollout_cache", "ref_cache"]) == first
    assert {p for p, _ in mod.LIVE} == {"reward", "values"}
    assert run(mod, tmp_path, RECORD) == first and mod.LIVE == []
    # A phase recorded now beside a replayed one: each notes its results under its own key, so the host's union of
    # the two (verl's DataProto.union refuses two different values under one key) meets no conflict.
    for dump in (tmp_path / "own", tmp_path / "shared"):
        run(mod, dump, ["rollout_cache"])
    assert run(mod, tmp_path / "own", ["rollout_cache", "ref_cache"]) == first  # rollout hit, reference miss
    # The host's own key on the reference beside the rollout (which writes it) would meet the same conflict in the
    # host's union: it is refused before anything is patched.
    with pytest.raises(skipweave.ConfigError, match=r"skip.ref.note='skipweave'"):
        run(mod, tmp_path / "shared", ["rollout_cache", "ref_cache"], "skip.ref.note=skipweave")


def test_a_role_note_key_is_checked_before_anything_is_patched(mod: Any, tmp_path: Path) -> None:
    with pytest.raises(skipweave.ConfigError, match="skip.reward.note"):
        weave(mod, tmp_path, ["reward_cache"], "skip.reward.note=has.dot")
    with pytest.raises(skipweave.ConfigError, match=r"skip.values.note='skipweave_ref'.*skip.ref.note"):
        weave(mod, tmp_path, ["ref_cache", "values_cache"], "skip.values.note=skipweave_ref")
    with pytest.raises(skipweave.ConfigError, match=r"skip.ref.note='skipweave'.*role rollout"):  # the host's key
        weave(mod, tmp_path, ["rollout_cache", "ref_cache"], "skip.ref.note=skipweave")
    assert skipweave.woven_plan() is None  # nothing stays patched


def test_a_note_of_any_key_is_no_input_of_the_next_phase(mod: Any, tmp_path: Path) -> None:
    """The rollout's note under a key of the user's own is in the reward's input batch: a miss in the recording run,
    a hit in the replay; it is left out of the reward's fingerprint, as every woven role's note is."""
    first = run(mod, tmp_path, RECORD, "+skip.rollout.note=my_rollout")
    again = run(mod, tmp_path, RECORD, "+skip.rollout.note=my_rollout", "skip.reward.fingerprint.on_mismatch=error")
    assert again == first and mod.LIVE == []


def test_an_include_naming_nothing_fingerprints_everything_and_says_so(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The reference's include names verl's token fields; a batch without them is fingerprinted whole, so a
    changed rollout is still caught, and a WARNING names the role and its include."""
    bare = ["skip.ref.fingerprint.include=[0.batch.no_such_field]", "skip.ref.fingerprint.on_mismatch=error"]
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        run(mod, tmp_path, RECORD, *bare)
    said = [r.getMessage() for r in caplog.records if "names no part of the call's inputs" in r.getMessage()]
    assert len(said) == 1 and "role ref target host" in said[0], said
    with pytest.raises(skipweave.FingerprintMismatch, match="role ref target host step 1"):
        run(mod, tmp_path, ["ref_cache"], *bare, seed=1)


def test_update_only_replays_every_phase_and_misses_stop_it(mod: Any, tmp_path: Path) -> None:
    first = run(mod, tmp_path, RECORD)
    assert run(mod, tmp_path, ["update_only"]) == first and mod.LIVE == []
    with pytest.raises(skipweave.ReplayMissing, match=r"replay-only role rollout target host .*step 3 call 0"):
        run(mod, tmp_path, ["update_only"], steps=3)


def test_a_new_reward_on_recorded_rollouts_replays_the_reference_without_a_mismatch(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The reference reads the tokens (fingerprint.include): the new rewards unioned into its batch are no input."""
    first = run(mod, tmp_path, RECORD)
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        changed = run(mod, tmp_path, ["rollout_cache", "ref_cache", "values_cache"], reward_scale=2.0)
    assert sorted(mod.LIVE) == [("reward", 1), ("reward", 2)]
    assert changed != first
    assert not [r for r in caplog.records if "inputs differ" in r.getMessage()]


@pytest.mark.parametrize("policy", ["warn", "regenerate", "error"])
def test_a_phase_replayed_on_changed_inputs_is_caught_naming_its_role(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, policy: str) -> None:
    """Rewards replayed after the rollout changed (another seed): the reward's input fingerprint differs."""
    first = run(mod, tmp_path, RECORD)
    overrides = [f"skip.reward.fingerprint.on_mismatch={policy}"]
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        if policy == "error":
            with pytest.raises(skipweave.FingerprintMismatch) as caught:
                run(mod, tmp_path, ["reward_cache"], *overrides, seed=1)
            assert "role reward target host step 1 call 0" in str(caught.value)
            assert "skip.reward.fingerprint" in str(caught.value)
            return
        changed = run(mod, tmp_path, ["reward_cache"], *overrides, seed=1)
    said = [r.getMessage() for r in caplog.records if "inputs differ" in r.getMessage()]
    assert len(said) == 2 and all("role reward target host step" in m for m in said), said
    live_rewards = [s for p, s in mod.LIVE if p == "reward"]
    assert live_rewards == ([1, 2] if policy == "regenerate" else [])
    assert changed != first
    if policy == "regenerate":  # re-recorded for the new rollouts: a run on them replays without a word
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="skipweave"):
            assert run(mod, tmp_path, ["reward_cache"], seed=1) == changed
        assert not [r for r in caplog.records if "inputs differ" in r.getMessage()]
        assert [p for p, _ in mod.LIVE].count("reward") == 0


def test_roles_computed_from_trained_weights_warn_once_woven(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        run(mod, tmp_path, RECORD)
    said = [r.getMessage() for r in caplog.records if "computed from weights the run trains" in r.getMessage()]
    assert len(said) == 1 and "role values" in said[0] and "skip.values.enable=false" in said[0]
    caplog.clear()
    nowhere = "skip.old_log_prob.targets.verl_old_log_prob.path=no_such_trainer.T.m"  # verl may be imported already
    with caplog.at_level(logging.WARNING, logger="skipweave"):  # old_log_prob: no target of this host resolves
        run(mod, tmp_path, ["rollout_cache", "old_log_prob_cache"], nowhere)
    assert not [r for r in caplog.records if "computed from weights" in r.getMessage()]
