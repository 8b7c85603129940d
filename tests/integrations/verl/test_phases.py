"""The phase profiles (``reward_cache``, ``ref_cache``, ``values_cache``, ``old_log_prob_cache``, ``update_only``)
over verl 0.9.1's own driver-side methods of ``RayPPOTrainer``, on CPU.

Real: verl's ``RayPPOTrainer._compute_reward_colocate``, ``_compute_old_log_prob``, ``_compute_ref_log_prob`` and
``_compute_values`` (their padding to no-padding conversions, ``tensordict_utils``, ``DataProto`` in and out), verl's
``DataProto`` batches built as ``fit()`` holds them at each phase (left-padded prompts, right-padded responses,
fresh ``uuid4`` uids per run, ``union``-ed with each phase's result in ``fit()``'s order), verl's own
``RewardLoopManager`` class for the replay-only stand-in, and the shipped profiles composed with Hydra and woven
with real wrapt patches over a real store in ``tmp_path``.

Faked, because they are GPU worker groups and Ray actors: the trainer is made with ``object.__new__`` (its
``__init__`` wants Ray resource pools) and given only the attributes these methods read; the actor, reference and
critic worker groups and the reward loop manager are small classes below that count their calls and return what
the real ones return (TensorDicts in verl's no-padding layout with ``metrics``; a ``DataProto`` of ``rm_scores``
and reward extra columns), computed deterministically from the input tokens.

Runs are weaves over one dump dir, as processes are.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.experimental.reward_loop import reward_loop as reward_loop_module
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
from verl.utils import tensordict_utils as tu

import skipweave
from skipweave import report
from skipweave.config.profiles import compose_profile

PROFILES = {"reward_cache": "reward", "old_log_prob_cache": "old_log_prob", "ref_cache": "ref",
            "values_cache": "values"}
"""Each phase profile and its role (fit()'s order)."""
ALL = list(PROFILES)
TARGETS = {"reward": "verl_reward", "old_log_prob": "verl_old_log_prob", "ref": "verl_ref_log_prob",
           "values": "verl_values"}
"""Each role's verl target, as conf/skip/base/<role>.yaml names it."""
BSZ, N, PROMPT_LEN, RESPONSE_LEN = 4, 2, 5, 4  # rows (prompts x rollout.n), rollout.n, padded lengths


# ---------------------------------------------------------------- fakes of the GPU worker groups
@dataclass
class Ledger:
    """Every call that reached a fake worker group: (phase, step)."""

    calls: list[tuple[str, int | None]] = field(default_factory=list)

    def phases(self) -> set[str]:
        return {phase for phase, _ in self.calls}


def per_token(td: TensorDict, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A model output over every unpadded token of ``td`` (verl's no-padding layout: jagged like its input_ids)."""
    ids = td["input_ids"]
    assert ids.is_nested, "the trainer hands the workers no-padding batches"
    return torch.nested.nested_tensor_from_jagged(fn(ids.values()), offsets=ids.offsets())


def policy_log_probs(v: torch.Tensor) -> torch.Tensor:
    return -((v * 7 + 3) % 11 + 1).float() / 10


def reference_log_probs(v: torch.Tensor) -> torch.Tensor:
    return -((v * 5 + 1) % 13 + 1).float() / 10


def worker_output(td: TensorDict, **outputs: torch.Tensor) -> TensorDict:
    """What ``TrainingWorker.infer_batch`` hands back: the model outputs and its metrics (mfu among them)."""
    mfu = sum(tu.get(td, "global_token_num")) / 1000
    return tu.get_tensordict(dict(outputs), non_tensor_dict={"metrics": {"mfu": mfu, "loss": 0.0}})


class FakeActorWorkerGroup:
    """Stands in for the actor-rollout worker group: ``compute_log_prob`` (old log-probs, and the reference's
    when the reference lives in the actor: LoRA, ``no_lora_adapter``)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def compute_log_prob(self, td: TensorDict) -> TensorDict:
        step = tu.get(td, "global_steps")
        if tu.get(td, "no_lora_adapter", False):
            self.ledger.calls.append(("ref", step))
            return worker_output(td, log_probs=per_token(td, reference_log_probs))
        self.ledger.calls.append(("old_log_prob", step))
        assert tu.get(td, "calculate_entropy") is True
        return worker_output(td, log_probs=per_token(td, policy_log_probs),
                             entropy=per_token(td, lambda v: (v % 5).float() / 4))


class FakeRefWorkerGroup:
    """Stands in for the reference policy's worker group."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def compute_ref_log_prob(self, td: TensorDict) -> TensorDict:
        self.ledger.calls.append(("ref", tu.get(td, "global_steps")))
        return worker_output(td, log_probs=per_token(td, reference_log_probs))


class FakeFuture:
    """What a non-blocking worker-group call hands back: ``.get()`` waits for the result."""

    def __init__(self, value: TensorDict) -> None:
        self.value = value

    def get(self) -> TensorDict:
        return self.value


class FakeCriticWorkerGroup:
    """Stands in for the critic's worker group (``infer_batch`` is registered non-blocking in verl)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def infer_batch(self, td: TensorDict) -> FakeFuture:
        self.ledger.calls.append(("values", tu.get(td, "global_steps")))
        return FakeFuture(worker_output(td, values=per_token(td, lambda v: (v % 17).float() / 17)))


class FakeRewardLoop:
    """Stands in for ``RewardLoopManager`` (its Ray reward-loop workers): ``compute_rm_score`` gives what the real
    one gives, ``rm_scores`` at each response's last token (verl's own ``assemble_rm_scores``) and a reward extra
    column. ``scale``: another reward function."""

    def __init__(self, ledger: Ledger, scale: float = 1.0) -> None:
        self.ledger, self.scale = ledger, scale

    def compute_rm_score(self, data: DataProto) -> DataProto:
        self.ledger.calls.append(("reward", data.meta_info.get("global_steps")))
        mask = data.batch["response_mask"].bool()
        even = ((data.batch["responses"] % 2 == 0) & mask).sum(-1) / mask.sum(-1)
        scores = [float(s) * self.scale for s in even]
        rm_scores = RewardManagerBase.assemble_rm_scores(data, scores)
        return DataProto(batch=TensorDict({"rm_scores": rm_scores}, batch_size=len(data)),
                         non_tensor_batch={"score": np.array(scores)}, meta_info={"reward_extra_keys": ["score"]})


def make_trainer(ledger: Ledger, *, ref_in_actor: bool = False, reward_loop_manager: Any = None) -> Any:
    """A ``RayPPOTrainer`` with only what the four phase methods read (``init_workers`` would start Ray). Typed
    ``Any``: its attributes hold fakes, and verl annotates ``_compute_reward_colocate`` as returning tensors."""
    trainer: Any = object.__new__(RayPPOTrainer)
    trainer.global_steps = 0
    trainer.reward_loop_manager = reward_loop_manager if reward_loop_manager is not None else FakeRewardLoop(ledger)
    trainer.actor_rollout_wg = FakeActorWorkerGroup(ledger)
    trainer.ref_in_actor = ref_in_actor
    # init_workers: with the reference in the actor, its worker group is the actor's
    trainer.ref_policy_wg = trainer.actor_rollout_wg if ref_in_actor else FakeRefWorkerGroup(ledger)
    trainer.critic_wg = FakeCriticWorkerGroup(ledger)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"calculate_sum_pi_squared": False}}})
    return trainer


# ---------------------------------------------------------------- verl batches
def rollout_batch(step: int, *, validation: bool = False, change: str | None = None) -> DataProto:
    """The batch of ``step`` as ``fit()`` holds it before the reward: the dataloader batch repeated ``rollout.n``
    times and unioned with the rollout (left-padded prompts, right-padded responses; deterministic tokens per step,
    fresh uids per run as ``fit()`` draws them), ``response_mask`` and ``global_token_num`` added.

    ``validation``: the batch ``_validate`` hands the reward, the rollout's output, which has no
    ``global_token_num``. ``change``: ``responses`` or ``input_ids``, one token of the first row changed there only.
    """
    g = torch.Generator().manual_seed(1000 + step)
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (BSZ,), generator=g)
    response_lens = torch.randint(1, RESPONSE_LEN + 1, (BSZ,), generator=g)
    prompts = torch.zeros(BSZ, PROMPT_LEN, dtype=torch.long)  # pad id 0
    responses = torch.zeros(BSZ, RESPONSE_LEN, dtype=torch.long)
    attention_mask = torch.zeros(BSZ, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens.tolist(), response_lens.tolist(), strict=True)):
        prompts[i, PROMPT_LEN - p:] = torch.randint(3, 100, (p,), generator=g)
        responses[i, :r] = torch.randint(3, 100, (r,), generator=g)
        attention_mask[i, PROMPT_LEN - p:PROMPT_LEN + r] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    if change == "responses":
        responses[0, 0] += 1
    elif change == "input_ids":
        input_ids[0, PROMPT_LEN] += 1
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    uids = [str(uuid.uuid4()) for _ in range(BSZ // N)]
    extras = np.empty(BSZ, dtype=object)
    extras[:] = [{"ground_truth": str(i % 3), "style": "rule"} for i in range(BSZ)]
    multi_modal = np.empty(BSZ, dtype=object)
    multi_modal[:] = [{} for _ in range(BSZ)]
    batch = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "input_ids": input_ids,
                 "attention_mask": attention_mask, "position_ids": position_ids,
                 "rollout_log_probs": -torch.rand(BSZ, RESPONSE_LEN, generator=g).to(torch.bfloat16)},
        non_tensors={"uid": np.array(np.repeat(uids, N), dtype=object),
                     "data_source": np.array(["toy"] * BSZ, dtype=object), "reward_model": extras,
                     "multi_modal_inputs": multi_modal, "__num_turns__": np.full(BSZ, 2, dtype=np.int32)},
        meta_info={"global_steps": step, "metrics": [{"generate_sequences": 0.1 * i} for i in range(BSZ)]},
    )
    batch.batch["response_mask"] = compute_response_mask(batch)
    if not validation:
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []
    return batch


Outputs = dict[str, Any]
"""One step's phase results: role -> DataProto (old_log_prob: the (DataProto, mfu) tuple)."""


def fit_step(trainer: Any, step: int) -> Outputs:
    """The phases of one step of ``RayPPOTrainer.fit`` (decoupled mode, reference and critic on), in its order."""
    trainer.global_steps = step
    batch = rollout_batch(step)
    reward = trainer._compute_reward_colocate(batch)
    batch = batch.union(reward)
    old_log_prob, mfu = trainer._compute_old_log_prob(batch)
    batch = batch.union(old_log_prob)  # (fit() pops "entropys" first; kept here, it is compared below)
    ref = trainer._compute_ref_log_prob(batch)
    batch = batch.union(ref)
    values = trainer._compute_values(batch)
    batch = batch.union(values)
    assert {"rm_scores", "old_log_probs", "ref_log_prob", "values"} <= set(batch.batch.keys())
    return {"reward": reward, "old_log_prob": (old_log_prob, mfu), "ref": ref, "values": values}


# ---------------------------------------------------------------- runs
@dataclass
class Run:
    outputs: list[Outputs]
    ledger: Ledger
    counts: dict[str, tuple[int, int, int]]  # role -> (hits, misses, bypasses) of its verl target


def weave(dump: Path, profiles: Sequence[str], *overrides: str) -> None:
    """Weave shipped profiles over ``dump``: every phase role's dump dir set, or, with a rollout profile (or
    update_only) composed, the rollout's, which the phase roles follow."""
    if any(p.startswith("rollout_") or p == "update_only" for p in profiles):
        dirs = [f"skip.rollout.dump_dir={dump}"]
    else:
        dirs = [f"skip.{PROFILES[p]}.dump_dir={dump}" for p in profiles]
    skipweave.weave(compose_profile(list(profiles), overrides=[*dirs, *overrides]))


def target_counts() -> dict[str, tuple[int, int, int]]:
    """This plan's counters of each role's verl target (read before unweave: they start afresh after it)."""
    counts = {role: report.for_target(role, target) for role, target in TARGETS.items()}
    return {role: (c.hits, c.misses, c.bypasses) for role, c in counts.items()}


def run(dump: Path, profiles: Sequence[str], *overrides: str, steps: Sequence[int] = (1, 2),
        ref_in_actor: bool = False) -> Run:
    """One run: weave, drive the phases of ``steps``, unweave."""
    ledger = Ledger()
    weave(dump, profiles, *overrides)
    try:
        trainer = make_trainer(ledger, ref_in_actor=ref_in_actor)
        outputs = [fit_step(trainer, step) for step in steps]
        return Run(outputs, ledger, target_counts())
    finally:
        skipweave.unweave()


def status(result: DataProto, role: str) -> str:
    """How the call of ``role`` that returned ``result`` was settled: its note, under the phase's own key."""
    return str(result.meta_info[f"skipweave_{role}"]["status"])


def statuses(outputs: Outputs) -> dict[str, str]:
    """The note of each DataProto result (the old log-probs are a tuple: no note; see the counters)."""
    return {role: status(out, role) for role, out in outputs.items() if role != "old_log_prob"}


def assert_same_dataproto(a: DataProto, b: DataProto, what: str) -> None:
    assert type(a) is DataProto and type(b) is DataProto, what
    a.check_consistency()
    assert a.batch.batch_size == b.batch.batch_size, what
    assert sorted(a.batch.keys()) == sorted(b.batch.keys()), what
    for key in a.batch.keys():
        assert a.batch[key].dtype == b.batch[key].dtype and torch.equal(a.batch[key], b.batch[key]), (what, key)
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch), what
    for key, values in a.non_tensor_batch.items():
        assert values.dtype == b.non_tensor_batch[key].dtype, (what, key)
        assert list(values) == list(b.non_tensor_batch[key]), (what, key)
    strip = {k: v for k, v in a.meta_info.items() if not k.startswith("skipweave")}  # each call's own fate
    assert strip == {k: v for k, v in b.meta_info.items() if not k.startswith("skipweave")}, what


def assert_same_outputs(got: Sequence[Outputs], want: Sequence[Outputs]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert sorted(g) == sorted(w)
        for role in g:
            what = f"step {step} {role}"
            if role == "old_log_prob":
                (g_dp, g_mfu), (w_dp, w_mfu) = g[role], w[role]
                assert_same_dataproto(g_dp, w_dp, what)
                assert type(g_mfu) is type(w_mfu) and g_mfu == w_mfu, what
            else:
                assert_same_dataproto(g[role], w[role], what)


EVERY_CALL = sorted((phase, step) for phase in PROFILES.values() for step in (1, 2))


# ---------------------------------------------------------------- tests
def test_each_phase_records_then_replays_alone_and_composed(tmp_path: Path) -> None:
    first = run(tmp_path, ALL)
    assert sorted(first.ledger.calls) == EVERY_CALL
    assert all(set(statuses(out).values()) == {"miss"} for out in first.outputs)
    assert first.counts == {role: (0, 2, 0) for role in TARGETS}
    mfus = [out["old_log_prob"][1] for out in first.outputs]
    assert mfus[0] != mfus[1] and all(isinstance(m, float) for m in mfus)

    for profile, role in PROFILES.items():
        alone = run(tmp_path, [profile])
        assert alone.ledger.phases() == set(PROFILES.values()) - {role}, profile
        assert alone.counts[role] == (2, 0, 0), profile
        assert_same_outputs(alone.outputs, first.outputs)
        if role != "old_log_prob":
            assert [status(out[role], role) for out in alone.outputs] == ["hit", "hit"], profile

    again = run(tmp_path, ALL)
    assert again.ledger.calls == []
    assert again.counts == {role: (2, 0, 0) for role in TARGETS}
    assert all(set(statuses(out).values()) == {"hit"} for out in again.outputs)
    assert_same_outputs(again.outputs, first.outputs)


def test_reference_in_the_actor_is_recorded_and_replayed_without_the_actor(tmp_path: Path) -> None:
    """LoRA (``ref_in_actor``): the reference is the actor's worker group without its adapter."""
    first = run(tmp_path, ALL, ref_in_actor=True)
    assert sorted(first.ledger.calls) == EVERY_CALL  # ref calls reached the actor's group with no_lora_adapter
    again = run(tmp_path, ALL, ref_in_actor=True)
    assert again.ledger.calls == []
    assert_same_outputs(again.outputs, first.outputs)


@pytest.mark.parametrize("recorded_with", ["rollout_dump_dir", "role_dump_dirs"])
def test_update_only_replays_every_phase_with_a_stand_in_reward_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded_with: str) -> None:
    record = ["rollout_cache", *ALL] if recorded_with == "rollout_dump_dir" else ALL
    first = run(tmp_path, record)
    assert sorted(first.ledger.calls) == EVERY_CALL

    inits: list[str] = []
    real_init = reward_loop_module.RewardLoopManager.__init__

    def flagged_init(self: Any, *args: Any, **kwargs: Any) -> None:
        inits.append("RewardLoopManager.__init__")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(reward_loop_module.RewardLoopManager, "__init__", flagged_init)
    ledger = Ledger()
    weave(tmp_path, ["update_only"])
    try:
        from verl.experimental.reward_loop import RewardLoopManager  # as init_workers imports it, after the weave

        # arguments the real constructor rejects (it reads config.reward): only a stand-in is made of them
        manager = RewardLoopManager(config=None, rm_resource_pool=None)  # type: ignore[arg-type]
        assert inits == [] and isinstance(manager, reward_loop_module.RewardLoopManager)
        assert type(manager) is not reward_loop_module.RewardLoopManager
        trainer = make_trainer(ledger, reward_loop_manager=manager)  # as init_workers sets it
        outputs = [fit_step(trainer, step) for step in (1, 2)]
        assert target_counts() == {role: (2, 0, 0) for role in TARGETS}
        with pytest.raises(skipweave.StubUnforeseen, match="compute_rm_score"):  # never reached by the replay
            manager.compute_rm_score(rollout_batch(1))
        with pytest.raises(skipweave.ReplayMissing, match=r"replay-only role reward target verl_reward .*step 3 "):
            fit_step(trainer, 3)
    finally:
        skipweave.unweave()
    assert ledger.calls == []
    assert all(set(statuses(out).values()) == {"hit"} for out in outputs)
    assert_same_outputs(outputs, first.outputs)
    with pytest.raises(AttributeError):  # unwoven, the real constructor runs (and rejects these arguments)
        reward_loop_module.RewardLoopManager(config=None, rm_resource_pool=None)  # type: ignore[arg-type]
    assert inits == ["RewardLoopManager.__init__"]


def ref_after_new_reward(trainer: Any, step: int, *, scale: float,
                         change: str | None = None) -> tuple[DataProto, DataProto]:
    """``fit()`` up to the reference with another reward function: its scores unioned into the batch first."""
    trainer.global_steps = step
    batch = rollout_batch(step, change=change)
    batch = batch.union(FakeRewardLoop(Ledger(), scale=scale).compute_rm_score(batch))
    return batch, trainer._compute_ref_log_prob(batch)


def test_a_new_reward_on_recorded_rollouts_replays_the_reference_without_a_mismatch(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = run(tmp_path, ["reward_cache", "ref_cache"])
    ledger = Ledger()
    weave(tmp_path, ["ref_cache"])
    try:
        trainer = make_trainer(ledger)
        with caplog.at_level(logging.WARNING, logger="skipweave"):
            for step, recorded in zip((1, 2), first.outputs, strict=True):
                batch, ref = ref_after_new_reward(trainer, step, scale=-3.0)
                assert not torch.equal(batch.batch["rm_scores"], recorded["reward"].batch["rm_scores"])
                assert list(batch.non_tensor_batch["score"]) != list(recorded["reward"].non_tensor_batch["score"])
                assert status(ref, "ref") == "hit"
                assert_same_dataproto(ref, recorded["ref"], f"step {step} ref")
    finally:
        skipweave.unweave()
    assert ledger.calls == []
    assert not [r.getMessage() for r in caplog.records if "inputs differ" in r.getMessage()]


@pytest.mark.parametrize("change", ["responses", "input_ids"])
def test_the_reference_replayed_on_changed_tokens_is_caught_naming_its_role(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str) -> None:
    first = run(tmp_path, ["ref_cache"], steps=[1])
    ledger = Ledger()
    weave(tmp_path, ["ref_cache"])
    try:
        with caplog.at_level(logging.WARNING, logger="skipweave"):
            _, ref = ref_after_new_reward(make_trainer(ledger), 1, scale=1.0, change=change)
    finally:
        skipweave.unweave()
    said = [r.getMessage() for r in caplog.records if "inputs differ" in r.getMessage()]
    assert len(said) == 1 and "role ref target verl_ref_log_prob step 1 call 0" in said[0], said
    assert status(ref, "ref") == "hit" and ledger.calls == []  # on_mismatch=warn: served anyway
    assert_same_dataproto(ref, first.outputs[0]["ref"], "ref")

    weave(tmp_path, ["ref_cache"], "skip.ref.fingerprint.on_mismatch=error")
    try:
        with pytest.raises(skipweave.FingerprintMismatch) as caught:
            ref_after_new_reward(make_trainer(ledger), 1, scale=1.0, change=change)
    finally:
        skipweave.unweave()
    assert "role ref target verl_ref_log_prob step 1 call 0" in str(caught.value)
    assert "skip.ref.fingerprint" in str(caught.value)
    assert ledger.calls == []


def test_validation_rewards_run_live_and_are_served_only_replay_only(tmp_path: Path) -> None:
    """verl's validation batches carry no ``global_token_num``: the reward's bypass lets them run live (recorded
    apart, for replay-only runs) while the training batch of the same step is recorded and replayed."""
    runs = [  # profiles; calls reaching the reward loop; (validation, training) status; reward (hits, misses, bypasses)
        (["reward_cache"], [("reward", 1), ("reward", 1)], ("bypass", "miss"), (0, 1, 1)),
        (["reward_cache"], [("reward", 1)], ("bypass", "hit"), (1, 0, 1)),
        (["update_only"], [], ("hit", "hit"), (2, 0, 0)),
    ]
    live: DataProto | None = None
    for profiles, calls, want, counts in runs:
        ledger = Ledger()
        weave(tmp_path, profiles)
        try:
            trainer = make_trainer(ledger)
            trainer.global_steps = 1
            validation = trainer._compute_reward_colocate(rollout_batch(1, validation=True))
            training = trainer._compute_reward_colocate(rollout_batch(1))
            assert target_counts()["reward"] == counts, profiles
        finally:
            skipweave.unweave()
        assert ledger.calls == calls, profiles
        assert (status(validation, "reward"), status(training, "reward")) == want, profiles
        live = validation if live is None else live
        assert_same_dataproto(validation, live, f"validation reward, {profiles}")


# ---------------------------------------------------------------- what a whole fit() needs of the results and stubs
def test_a_phase_added_to_a_recorded_run_unions_into_fits_batch(tmp_path: Path) -> None:
    """Each phase notes its results under a key of its own: verl's union of a hit beside a miss meets no conflict."""
    first = run(tmp_path, ["reward_cache"], steps=[1])
    # The next run caches the reference too: the reward is a hit, the reference a miss (recorded now), and
    # fit()'s batch.union(ref_log_prob) meets the reward's note in the batch.
    again = run(tmp_path, ["reward_cache", "ref_cache"], steps=[1])
    assert again.counts["reward"] == (1, 0, 0) and again.counts["ref"] == (0, 1, 0)
    assert_same_outputs(again.outputs, first.outputs)


def test_update_only_stand_in_reward_loop_answers_what_init_workers_reads(tmp_path: Path) -> None:
    """``init_workers`` reads ``reward_loop_workers`` of the manager (the V1 trainer ``reward_loop_worker_handles``)."""
    from verl.experimental.reward_loop import RewardLoopManager as Real  # noqa: F401  (imported before the weave)

    weave(tmp_path, ["update_only"])
    try:
        from verl.experimental.reward_loop import RewardLoopManager

        manager = RewardLoopManager(config=None, rm_resource_pool=None)  # type: ignore[arg-type]
        # ray_trainer.py init_workers: enable_agent_reward_loop = not self.use_rm or reward_model.enable_resource_pool
        handles = manager.reward_loop_workers
    finally:
        skipweave.unweave()
    assert not handles and manager.reward_loop_worker_handles is None  # no reward-loop worker was started
