"""A PPO-trainer-shaped driver of verl's real ``AgentLoopManager.generate_sequences``, run in a subprocess.

It composes verl's own ``ppo_trainer`` config with ``+skip=rollout_cache`` through Hydra, starts the
job the way Hydra does (skipweave's callback's ``on_job_start``), initialises verl's ``SkipManager``
as ``RayPPOTrainer.fit`` does, then drives three training steps and two validation calls through the
real manager, whose Ray workers are replaced by small deterministic fakes. Step 2 and one validation
are awaited inside a running event loop, the rest are called plainly (verl's ``auto_await``).

Like the trainer, every step gets fresh random ``uid``s, ``union``-s its batch with the rollout
output and pops ``meta_info["timing"]``. Prints one ``REPORT {json}`` line.

    python agent_loop_app.py DUMP_DIR
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import types
import uuid
import warnings

import numpy as np
import torch

WORKER_CALLS: list[dict[str, object]] = []
N = 2  # actor_rollout_ref.rollout.n
PROMPTS = 2  # data.train_batch_size
PROMPT_LEN, RESPONSE_LEN = 4, 3


class FakeWorker:
    """Stands in for a Ray ``AgentLoopWorker`` actor: ``generate_sequences.remote(chunk)`` is awaitable.

    Its output has the shape of ``AgentLoopWorker._postprocess``'s (bf16 log-probs, the input's
    non-tensor entries copied through, object arrays of dicts, per-sample metrics) and random tokens
    drawn from torch's global generator, as sampling would.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.generate_sequences = types.SimpleNamespace(remote=self._remote)

    def _remote(self, chunk):  # type: ignore[no-untyped-def]
        return self._generate(chunk)

    async def _generate(self, chunk):  # type: ignore[no-untyped-def]
        from tensordict import TensorDict
        from verl.protocol import DataProto

        bsz = len(chunk)
        WORKER_CALLS.append({"worker": self.index, "rows": bsz, "validate": bool(chunk.meta_info.get("validate")),
                             "step": chunk.meta_info.get("global_steps")})
        prompts = torch.randint(3, 100, (bsz, PROMPT_LEN))
        responses = torch.randint(3, 100, (bsz, RESPONSE_LEN))
        batch = TensorDict(
            {
                "prompts": prompts,
                "responses": responses,
                "response_mask": torch.ones(bsz, RESPONSE_LEN, dtype=torch.int64),
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": torch.ones(bsz, PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64),
                "position_ids": torch.arange(PROMPT_LEN + RESPONSE_LEN).repeat(bsz, 1),
                "rollout_log_probs": torch.randn(bsz, RESPONSE_LEN).to(torch.bfloat16),
            },
            batch_size=bsz,
        )
        extras = np.empty(bsz, dtype=object)
        extras[:] = [{"turns": [int(t) for t in r[:2]], "note": f"w{self.index}"} for r in responses]
        non_tensor = {"__num_turns__": np.full(bsz, 2, dtype=np.int32), **chunk.non_tensor_batch, "extras": extras}
        metrics = [{"generate_sequences": 0.01 * (i + 1), "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": 0}
                   for i in range(bsz)]
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"metrics": metrics})


def compose(dump_dir: str, profile: str = "rollout_cache"):  # type: ignore[no-untyped-def]
    """verl's ``ppo_trainer`` config with ``+skip=<profile>``, composed as ``verl.trainer.main_ppo`` does."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = [
        f"+skip={profile}", f"skip.rollout.dump_dir={dump_dir}",
        "trainer.experiment_name=exp", "trainer.project_name=proj", f"data.train_batch_size={PROMPTS}",
        f"actor_rollout_ref.rollout.n={N}", f"data.max_prompt_length={PROMPT_LEN}",
        f"data.max_response_length={RESPONSE_LEN}",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides, return_hydra_config=True)


def train_batch(step: int, *, validate: bool = False):  # type: ignore[no-untyped-def]
    """A dataloader batch as the trainer holds it, with this run's random uids; and its gen batch."""
    from verl.protocol import DataProto

    raw = np.empty(PROMPTS, dtype=object)
    raw[:] = [[{"role": "user", "content": f"question {step}.{i}"}] for i in range(PROMPTS)]
    batch = DataProto.from_single_dict({
        "dummy_tensor": torch.zeros(PROMPTS, 1, dtype=torch.uint8),
        "raw_prompt": raw,
        "data_source": np.array(["toy"] * PROMPTS, dtype=object),
        "index": np.arange(PROMPTS) + 10 * step,
    })
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(PROMPTS)], dtype=object)
    # RayPPOTrainer._get_gen_batch
    keep = {"data_source", "reward_model", "extra_info", "uid"} & batch.non_tensor_batch.keys()
    gen = batch.pop(batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - keep))
    gen.non_tensor_batch.update(batch.non_tensor_batch)
    gen.meta_info["global_steps"] = step
    if validate:
        gen.meta_info["validate"] = True
    return batch, gen.repeat(repeat_times=N, interleave=True)


def digest(out) -> str:  # type: ignore[no-untyped-def]
    """A hash of what generation produced (tokens, bf16 log-probs, extras), not of the per-run uids."""
    h = hashlib.sha256()
    for key in ("responses", "prompts", "rollout_log_probs"):
        h.update(out.batch[key].view(torch.uint8 if key == "rollout_log_probs" else out.batch[key].dtype)
                 .contiguous().numpy().tobytes())
    h.update(repr(list(out.non_tensor_batch["extras"])).encode())
    return h.hexdigest()[:16]


def one_step(mgr, step: int, out_steps: list[dict[str, object]], *, awaited: bool) -> None:  # type: ignore[no-untyped-def]
    batch, gen = train_batch(step)
    if awaited:
        async def run():  # type: ignore[no-untyped-def]
            return await mgr.generate_sequences(gen)

        out = asyncio.run(run())
    else:
        out = mgr.generate_sequences(gen)
    status = out.meta_info.get("skipweave", {}).get("status")
    timing = out.meta_info.pop("timing")  # RayPPOTrainer: timing_raw.update(...); pop
    full = batch.repeat(repeat_times=N, interleave=True).union(out)  # fails if the uids differ
    out_steps.append({"step": step, "status": status, "digest": digest(out), "timing_keys": len(timing),
                      "union_rows": len(full), "uid_is_live": list(full.non_tensor_batch["uid"]) ==
                      list(np.repeat(batch.non_tensor_batch["uid"], N))})


def validate(mgr, step: int, *, awaited: bool) -> str | None:  # type: ignore[no-untyped-def]
    _, gen = train_batch(step, validate=True)
    if awaited:
        async def run():  # type: ignore[no-untyped-def]
            return await mgr.generate_sequences(gen)

        out = asyncio.run(run())
    else:
        out = mgr.generate_sequences(gen)
    return out.meta_info.get("skipweave", {}).get("status")


def main() -> None:
    dump_dir = sys.argv[1]
    cfg = compose(dump_dir, sys.argv[2] if len(sys.argv) > 2 else "rollout_cache")
    from skipweave.integrations.hydra.callback import SkipweaveCallback

    callback_target = cfg.hydra.callbacks.skipweave._target_
    SkipweaveCallback().on_job_start(config=cfg)  # what Hydra runs before the task

    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.utils.skip import SkipManager

    SkipManager.init(cfg)  # RayPPOTrainer.fit
    engine: dict[str, object] = {}
    if len(sys.argv) > 2 and sys.argv[2] == "rollout_replay":
        # RayPPOTrainer.init_workers, as verl 0.9.1 builds its engine: every piece is a stub of the profile,
        # so nothing is launched (for real these calls start vLLM/SGLang servers and Ray actors).
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.workers.rollout.llm_server import LLMServerManager

        servers = LLMServerManager.create(config=cfg, worker_group=None, rollout_resource_pool=None)
        mgr = AgentLoopManager.create(config=cfg, llm_client=servers.get_client(), teacher_client=None,
                                      reward_loop_worker_handles=None)
        checkpoints = CheckpointEngineManager(config=None, actor_wg=None, replicas=servers.get_replicas())
        checkpoints.sleep_replicas()
        checkpoints.update_weights(1)

        async def awaited_sync() -> None:
            await checkpoints.update_weights(2)  # auto_await's other case: awaited from a coroutine

        asyncio.run(awaited_sync())
        engine = {"servers": type(servers).__name__, "manager": type(mgr).__name__,
                  "checkpoints": type(checkpoints).__name__, "replicas": servers.get_replicas(),
                  "is_manager": isinstance(mgr, AgentLoopManager)}
    else:
        mgr = AgentLoopManager(cfg, llm_client=None)  # type: ignore[arg-type]
        mgr.agent_loop_workers = [FakeWorker(0), FakeWorker(1)]  # type: ignore[list-item]

    torch.manual_seed(0)
    steps: list[dict[str, object]] = []
    val = [validate(mgr, 0, awaited=False)]  # val_before_train
    one_step(mgr, 1, steps, awaited=False)
    SkipManager.set_step(2)
    one_step(mgr, 2, steps, awaited=True)
    val.append(validate(mgr, 2, awaited=True))
    one_step(mgr, 3, steps, awaited=False)
    import skipweave

    report = {
        "callback": callback_target,
        "steps": steps,
        "validation": val,
        "worker_calls": WORKER_CALLS,
        "engine": engine,
        "verl_skip_enabled": {k: v.enable for k, v in SkipManager.skip_instances.items()},
        "rng_after": float(torch.rand(1)),
        "counters": skipweave.counters(),
        "plan_namespace": skipweave.woven_plan().roles["rollout"].namespace,  # type: ignore[union-attr]
    }
    skipweave.unweave()
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # verl warns about every engine it cannot load on CPU
    main()
