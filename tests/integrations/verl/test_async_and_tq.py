"""verl's fully-async rollouter and TransferQueue (V1) trainer, record then replay, with verl's real classes.

The async rollouter's Ray worker and the V1 trainer's TransferQueue service are fakes (``helpers.py``);
``FullyAsyncAgentLoopManager.generate_sequences_single``, ``PPOTrainer._add_batch_to_generate``,
``ReplayBuffer.sample`` and verl's TensorDict helpers are verl's own. Needs verl (CI installs it).
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import numpy as np  # noqa: E402
import pytest
import torch  # noqa: E402

import skipweave  # noqa: E402
from skipweave import report  # noqa: E402
from skipweave.config import load_skip_config  # noqa: E402
from skipweave.integrations.hydra.callback import job_skip_config  # noqa: E402
from skipweave.store.scan import scan  # noqa: E402
from tests.integrations.verl.apps.agent_loop_app import compose  # noqa: E402
from tests.integrations.verl.helpers import FakeAsyncWorker, FakeTQ, FakeTQAgentLoop, trajectory_digest  # noqa: E402

ASYNC = ("verl.experimental.fully_async_policy.fully_async_rollouter.FullyAsyncAgentLoopManager."
         "generate_sequences_single")


# ---------------------------------------------------------------------------------------------- fully async


def _async_plan(dump: Path) -> Any:
    return load_skip_config({"skip": {"async_rollout": {
        "enable": True, "dump_dir": str(dump), "targets": {"verl_fully_async": {
            "path": ASYNC, "optional": True, "proxy": "skipweave.integrations.verl.proxies:AsyncSampleProxy"}}}}})


def _samples(order: list[int]) -> list[Any]:
    from verl.protocol import DataProto

    out = []
    for index in order:  # the rollouter's feed index; epoch 0 below 3, epoch 1 from 3 on
        dp = DataProto.from_single_dict({"input_ids": torch.full((2, 3), index)})
        dp.non_tensor_batch["uid"] = np.array([f"uid_sample_{index // 3}_{index}"] * 2, dtype=object)
        out.append(dp)
    return out


def _run_async(dump: Path, order: list[int]) -> tuple[dict[int, torch.Tensor], FakeAsyncWorker, list[str]]:
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager

    skipweave.weave(_async_plan(dump))
    mgr = FullyAsyncAgentLoopManager.__new__(FullyAsyncAgentLoopManager)
    worker = FakeAsyncWorker()
    mgr.agent_loop_workers = [worker]  # type: ignore[list-item]

    async def feed() -> list[Any]:  # samples generated concurrently, completing in any order
        return await asyncio.gather(*[mgr.generate_sequences_single(s) for s in _samples(order)])

    outs = asyncio.run(feed())
    statuses = [o.meta_info["skipweave"]["status"] for o in outs]
    skipweave.unweave()
    return {i: o.batch["responses"] for i, o in zip(order, outs, strict=True)}, worker, statuses


def test_async_rollouter_steps_are_feed_indexes_and_replay(tmp_path: Path) -> None:
    first, w1, s1 = _run_async(tmp_path, [0, 1, 2, 3, 4])
    assert s1 == ["miss"] * 5 and len(w1.calls) == 5
    role_dir = tmp_path / "default" / "async_rollout"
    assert sorted(int(p.name) for p in role_dir.iterdir()) == [0, 1, 2, 3, 4]  # feed index, across epochs
    order = [4, 2, 0, 3, 1]
    random.Random(0).shuffle(order)
    second, w2, s2 = _run_async(tmp_path, order)
    assert s2 == ["hit"] * 5 and w2.calls == []
    for index, responses in first.items():
        assert torch.equal(second[index], responses)


# ---------------------------------------------------------------------------------------------- V1 / TransferQueue

PROMPTS, N = 4, 2


def _trainer(cfg: Any, agent: FakeTQAgentLoop, psync: int, seed: int) -> Any:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    class Trainer(PPOTrainer):  # verl's own step methods; only the abstract hooks are filled in
        def on_step_end(self) -> None: ...

        def on_sample_end(self) -> None: ...

    trainer = Trainer.__new__(Trainer)
    rng = np.random.default_rng(seed)
    trainer.config = cfg
    trainer.trainer_mode = "sync"
    trainer.parameter_sync_step = psync
    trainer.train_dataloader = [{"raw_prompt": np.array([f"q{rng.integers(1000)}" for _ in range(PROMPTS)],
                                                        dtype=object)} for _ in range(8)]
    trainer.train_dataloader_it = None
    trainer.agent_loop_manager = agent  # type: ignore[assignment]
    trainer._restored_tq_prompt_count = 0
    return trainer


def _buffer(psync: int) -> Any:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    return ReplayBuffer(trainer_mode="sync", trainer_config=OmegaConf.create({"parameter_sync_step": psync}),
                        max_off_policy_threshold=None, max_off_policy_strategy="drop",
                        sampler_kwargs=OmegaConf.create({}),
                        poll_interval=0.001, train_batch_size=PROMPTS, gen_batch_size=PROMPTS)


def _run_v1(dump: Path, monkeypatch: pytest.MonkeyPatch, psync: int, steps: int = 2) -> dict[str, Any]:
    cfg = compose(str(dump))
    cfg.data.train_batch_size = PROMPTS
    tq = FakeTQ().install(monkeypatch)
    agent = FakeTQAgentLoop(tq, N)
    skipweave.weave(load_skip_config(job_skip_config(cfg)))
    report.reset()
    trainer, buffer = _trainer(cfg, agent, psync, seed=1), _buffer(psync)
    trainer._add_async_warmup_batches(1)  # the async modes' warm-up: left out, as verl does with its skip
    digests, sampled = {}, {}
    for step in range(1, steps + 1):
        trainer.global_steps = step
        trainer._add_batch_to_generate()  # PPOTrainer.prepare_step
        rows: list[str] = []
        keys: list[str] = []
        for _ in range(psync):  # PPOTrainer.step: parameter_sync_step samples
            meta, _ = buffer.sample(global_steps=step, partition_id="train", batch_size=PROMPTS // psync)
            rows += trajectory_digest(tq.kv_batch_get(keys=meta.keys, partition_id="train"))
            keys += meta.keys
            tq.kv_clear(keys=meta.keys, partition_id="train")
        digests[step] = sorted(rows)
        sampled[step] = keys
        # validation: prompts to the val partition, sampled from it: always live
        vbatch = trainer._next_train_batch()
        from verl.utils import tensordict_utils as tu

        tu.assign_non_tensor_data(vbatch, "validate", True)
        tq.kv_batch_put(keys=list(vbatch["uid"]), partition_id="val",
                        tags=[{"is_prompt": True, "status": "pending", "global_steps": step}] * PROMPTS)
        agent.generate_sequences(vbatch)
        buffer.sample(global_steps=step, partition_id="val", batch_size=PROMPTS)
    counters = skipweave.counters()
    skipweave.unweave()
    left = len(list(trainer.train_dataloader_it))  # prompts drawn: a replayed step draws its own too
    return {"digests": digests, "calls": agent.calls, "sampled": sampled, "counters": counters, "left": left}


@pytest.mark.parametrize("psync", [1, 2])
def test_v1_trainer_records_each_sample_then_injects_on_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, psync: int
) -> None:
    torch.manual_seed(0)
    first = _run_v1(tmp_path, monkeypatch, psync)
    assert [(c["step"], c["validate"]) for c in first["calls"]] == [(1, False), (1, True), (2, False), (2, True)]
    step_dir = tmp_path / "exp_proj.GBS4_N2_in4_out3" / "rollout"
    assert sorted(p.name for p in step_dir.iterdir()) == ["1", "2"]
    # one entry per sample of the step (committed one by one, or as one group when the writer had both queued)
    (part,) = [p for p in scan(str(tmp_path)).parts if (p.step, p.target) == (1, "verl_tq")]
    assert [(e.key.shard, e.key.call) for e in part.entries] == [("r0", i) for i in range(psync)], \
        os.listdir(step_dir / "1" / "verl_tq")

    torch.manual_seed(1)  # a replay generating anything would now differ
    second = _run_v1(tmp_path, monkeypatch, psync)
    assert [(c["step"], c["validate"]) for c in second["calls"]] == [(1, True), (2, True)]  # validation only
    for step in (1, 2):
        assert second["digests"][step] == first["digests"][step]  # every trajectory, bf16 and jagged, exactly
        assert len(second["sampled"][step]) == PROMPTS * N
        assert all(k.endswith("_0") for k in second["sampled"][step])
    assert (first["counters"]["misses"], second["counters"]["hits"]) == (2 * psync, 2)
    assert second["left"] == first["left"]  # the dataloader stays where live steps leave it


def test_v1_sampling_never_waits_for_its_own_step_background_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mini-batch of a step is written behind the host: the next ``sample`` of the same step does not wait for
    it (with the ``cache`` action no other step can serve a step, so no write is waited for at all)."""
    from skipweave.integrations.verl.tq import TQ_TARGET
    from skipweave.store.step_store import StepStore

    waited: list[tuple[int, str]] = []
    real = StepStore.wait_pending

    def wait_pending(self: StepStore, step: int, target: str, shard: str, **kwargs: Any) -> None:
        waited.append((step, target))
        real(self, step, target, shard, **kwargs)

    monkeypatch.setattr(StepStore, "wait_pending", wait_pending)
    torch.manual_seed(0)
    first = _run_v1(tmp_path, monkeypatch, psync=2)
    assert first["counters"]["misses"] == 4
    assert [w for w in waited if w[1] == TQ_TARGET] == []
