"""Rollout: Ray actor workers that sample responses, and the driver-side ``RolloutManager``.

Mirrors verl's agent-loop design: ``RolloutManager.generate_sequences`` is ``async``, first syncs the
current policy weights to every worker (``ray.put`` of the ``state_dict``), then splits the prompt
batch into one chunk per worker, awaits their results and concatenates them into a new ``Batch``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from torch import nn

from tinygrpo import cluster
from tinygrpo.data import EOS_ID, PAD_ID, Batch
from tinygrpo.model import TinyCausalLM

WORKERS_STARTED = 0
"""Rollout worker actors this process started (every row of ``metrics.jsonl`` reports it as ``rollout_workers``):
0 in a replay-only run, whose stand-in manager starts none."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling settings of the rollout.

    Attributes:
        n: Responses per prompt during training.
        response_length: Maximum number of generated tokens.
        temperature: Sampling temperature.
        num_workers: Number of Ray rollout actors.
        worker_threads: ``torch.set_num_threads`` inside each actor.
        val_n: Responses per prompt during validation.
        val_do_sample: Sample during validation (greedy decoding otherwise).
        seed: Base seed of the per-(step, worker) sampling generators.
    """

    n: int = 8
    response_length: int = 32
    temperature: float = 1.0
    num_workers: int = 2
    worker_threads: int = 1
    val_n: int = 1
    val_do_sample: bool = False
    seed: int = 0


def sampling_seed(seed: int, step: int, rank: int, validate: bool) -> int:
    """Seed of worker ``rank``'s generator for ``step`` (distinct streams for training/validation)."""
    state = np.random.SeedSequence([seed, step, rank, int(validate)]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & 0x7FFF_FFFF_FFFF_FFFF


class RolloutWorker:
    """Holds a copy of the policy and generates responses autoregressively (no KV cache)."""

    def __init__(self, rank: int, model_kwargs: dict[str, Any], num_threads: int = 1) -> None:
        """Build the local policy copy; real weights arrive through :meth:`load_weights`."""
        torch.set_num_threads(num_threads)
        torch.use_deterministic_algorithms(True)
        self.rank = rank
        self.model = TinyCausalLM(**model_kwargs).eval()
        self.weights_version = -1

    def ready(self) -> int:
        """Return the worker's rank once its constructor has run (used to wait for start-up)."""
        return self.rank

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        """Load the driver's weights (weight sync); returns the version now held."""
        self.model.load_state_dict(state_dict)
        self.weights_version = version
        return version

    @torch.no_grad()
    def generate(
        self,
        prompts: Batch,
        n: int,
        response_length: int,
        temperature: float,
        do_sample: bool,
        seed: int,
    ) -> Batch:
        """Generate ``n`` responses per prompt.

        Returns a batch with ``prompts``, ``responses``, ``input_ids``, ``attention_mask``,
        ``response_mask`` and ``old_log_probs`` (log-probs of the sampled tokens), plus the repeated
        non-tensor fields.
        """
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        prompt_ids = prompts.batch["input_ids"].repeat_interleave(n, dim=0)
        prompt_mask = prompts.batch["attention_mask"].repeat_interleave(n, dim=0)
        rows = prompt_ids.shape[0]
        responses = torch.full((rows, response_length), PAD_ID, dtype=torch.long)
        response_mask = torch.zeros((rows, response_length), dtype=torch.long)
        log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
        done = torch.zeros(rows, dtype=torch.bool)
        seq, seq_mask = prompt_ids, prompt_mask
        for t in range(response_length):
            logits = self.model(seq, seq_mask)[:, -1, :].float() / temperature
            logp_all = torch.log_softmax(logits, dim=-1)
            if do_sample:
                token = torch.multinomial(logp_all.exp(), 1, generator=gen).squeeze(-1)
            else:
                token = logits.argmax(dim=-1)
            active = ~done
            token = torch.where(active, token, torch.full_like(token, PAD_ID))
            responses[:, t] = token
            response_mask[:, t] = active.long()
            log_probs[:, t] = torch.where(active, logp_all.gather(-1, token[:, None]).squeeze(-1), 0.0)
            done |= token == EOS_ID
            if bool(done.all()):
                break
            seq = torch.cat([seq, token[:, None]], dim=1)
            seq_mask = torch.cat([seq_mask, active.long()[:, None]], dim=1)
        return Batch(
            batch={
                "prompts": prompt_ids,
                "responses": responses,
                "input_ids": torch.cat([prompt_ids, responses], dim=1),
                "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
                "response_mask": response_mask,
                "old_log_probs": log_probs,
            },
            non_tensor_batch={k: np.repeat(v, n, axis=0) for k, v in prompts.non_tensor_batch.items()},
            meta_info={"rank": self.rank, "generate_seconds": time.perf_counter() - start},
        )


class RolloutManager:
    """Driver-side front end of the rollout workers (the analogue of verl's ``AgentLoopManager``)."""

    def __init__(self, policy: nn.Module, model_kwargs: dict[str, Any], config: RolloutConfig) -> None:
        """Start ``config.num_workers`` Ray actors; ``policy`` is the driver's trained module."""
        global WORKERS_STARTED
        if config.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.policy = policy
        self.config = config
        cluster.ensure_started()
        total_cpus = float(ray.cluster_resources().get("CPU", 1.0))
        remote_cls = ray.remote(num_cpus=min(1.0, total_cpus / config.num_workers))(RolloutWorker)
        self.workers: list[Any] = [  # Ray actor handles of RolloutWorker
            remote_cls.remote(rank, dict(model_kwargs), config.worker_threads)
            for rank in range(config.num_workers)
        ]
        WORKERS_STARTED += len(self.workers)
        # Wait for the actors to be up so that start-up is not billed to the first rollout.
        ray.get([w.ready.remote() for w in self.workers])
        self._weights_version = 0

    async def sync_weights(self) -> int:
        """Broadcast the policy's current ``state_dict`` to all workers via the object store."""
        self._weights_version += 1
        state = {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}
        ref = ray.put(state)
        await asyncio.gather(*(w.load_weights.remote(ref, self._weights_version) for w in self.workers))
        return self._weights_version

    async def generate_sequences(self, prompts: Batch) -> Batch:
        """Sync weights, then generate responses for ``prompts`` on the workers.

        ``prompts.meta_info`` must hold ``global_steps`` (1-based int) and may hold ``validate``
        (bool, switches to the validation sampling settings) and ``do_sample`` (bool).
        """
        start = time.perf_counter()
        step = int(prompts.meta_info["global_steps"])
        validate = bool(prompts.meta_info.get("validate", False))
        cfg = self.config
        n = cfg.val_n if validate else cfg.n
        do_sample = bool(prompts.meta_info.get("do_sample", cfg.val_do_sample if validate else True))
        version = await self.sync_weights()
        synced = time.perf_counter()
        chunks = prompts.chunk(min(len(self.workers), len(prompts)))
        refs = [
            worker.generate.remote(
                chunk,
                n,
                cfg.response_length,
                cfg.temperature,
                do_sample,
                sampling_seed(cfg.seed, step, rank, validate),
            )
            for rank, (worker, chunk) in enumerate(zip(self.workers, chunks, strict=False))
        ]
        parts: list[Batch] = list(await asyncio.gather(*refs))
        out = Batch.concat(parts)
        end = time.perf_counter()
        out.meta_info = {
            **prompts.meta_info,
            "weights_version": version,
            "timing": {
                "weight_sync": synced - start,
                "generate": end - synced,
                "total": end - start,
                "per_worker": [p.meta_info["generate_seconds"] for p in parts],
            },
        }
        return out

    def shutdown(self) -> None:
        """Kill the worker actors."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
