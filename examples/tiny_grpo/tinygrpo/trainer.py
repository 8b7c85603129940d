"""The GRPO training loop (driver side): rollout -> rule reward -> group advantages -> clipped PG."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from tinygrpo import rollout as rollout_module
from tinygrpo.data import VOCAB_SIZE, Batch, PromptDataset
from tinygrpo.model import TinyCausalLM, param_checksum, response_log_probs
from tinygrpo.reward import grpo_advantages, rule_reward
from tinygrpo.rollout import RolloutConfig, RolloutManager

log = logging.getLogger(__name__)
T = TypeVar("T")


def seed_everything(seed: int, torch_threads: int) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` and make torch deterministic on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(torch_threads)
    torch.use_deterministic_algorithms(True)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (verl's token-mean aggregation)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


class GRPOTrainer:
    """A tiny verl-like GRPO trainer.

    Args:
        cfg: The Hydra config (see ``config.yaml``).
        output_dir: Where ``metrics.jsonl`` is written (the Hydra run dir).
    """

    def __init__(self, cfg: DictConfig, output_dir: Path) -> None:
        """Build the policy, optimiser, dataset and rollout manager (Ray must be initialised)."""
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.metrics_path = self.output_dir / "metrics.jsonl"
        prompt_width = int(cfg.data.max_prompt_length) + 1
        self.response_length = int(cfg.data.response_length)
        self.model_kwargs: dict[str, Any] = {
            "vocab_size": VOCAB_SIZE,
            "max_seq_len": prompt_width + self.response_length,
            "init_seed": int(cfg.seed),
            **OmegaConf.to_container(cfg.model, resolve=True),  # type: ignore[dict-item]
        }
        self.policy = TinyCausalLM(**self.model_kwargs)
        self.optimizer = torch.optim.Adam(
            self.policy.parameters(), lr=float(cfg.actor.lr), betas=(0.9, 0.99), eps=1e-8
        )
        self.dataset = PromptDataset(
            seed=int(cfg.seed),
            batch_size=int(cfg.data.batch_size),
            min_prompt_length=int(cfg.data.min_prompt_length),
            max_prompt_length=int(cfg.data.max_prompt_length),
        )
        self.rollout_config = RolloutConfig(
            n=int(cfg.rollout.n),
            response_length=self.response_length,
            temperature=float(cfg.rollout.temperature),
            num_workers=int(cfg.rollout.num_workers),
            worker_threads=int(cfg.rollout.worker_threads),
            val_n=int(cfg.rollout.val_n),
            val_do_sample=bool(cfg.rollout.val_do_sample),
            seed=int(cfg.seed),
        )
        self.rollout = RolloutManager(self.policy, self.model_kwargs, self.rollout_config)
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion on the trainer's private event loop."""
        return self._loop.run_until_complete(coro)

    def _write(self, record: dict[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl`` (with ``rollout_workers``: the actors this run started)."""
        record = {**record, "rollout_workers": rollout_module.WORKERS_STARTED}
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def update_policy(self, data: Batch, advantages: torch.Tensor) -> dict[str, float]:
        """PPO-clipped policy-gradient update over shuffled mini-batches (consumes the global RNG)."""
        actor = self.cfg.actor
        clip = float(actor.clip_ratio)
        num_mini = int(actor.ppo_mini_batches)
        self.policy.train()
        input_ids = data.batch["input_ids"]
        attention_mask = data.batch["attention_mask"]
        response_mask = data.batch["response_mask"]
        old_log_probs = data.batch["old_log_probs"]
        losses: list[float] = []
        clipfracs: list[float] = []
        grad_norms: list[float] = []
        for _ in range(int(actor.ppo_epochs)):
            for idx in torch.randperm(len(data)).chunk(num_mini):
                mask = response_mask[idx]
                log_probs = response_log_probs(
                    self.policy, input_ids[idx], attention_mask[idx], self.response_length
                )
                ratio = torch.exp(log_probs - old_log_probs[idx])
                adv = advantages[idx].unsqueeze(-1)
                pg_losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip))
                loss = masked_mean(pg_losses, mask)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), float(actor.grad_clip))
                self.optimizer.step()
                losses.append(float(loss.detach()))
                clipfracs.append(float(masked_mean(((ratio - 1.0).abs() > clip).float(), mask)))
                grad_norms.append(float(grad_norm))
        self.policy.eval()
        return {
            "loss": float(np.mean(losses)),
            "pg_clipfrac": float(np.mean(clipfracs)),
            "grad_norm": float(np.mean(grad_norms)),
        }

    def validate(self, step: int) -> dict[str, Any]:
        """Run the validation prompts through the same ``generate_sequences`` with ``validate=True``."""
        prompts = self.dataset.val_batch(int(self.cfg.data.val_size))
        prompts.meta_info = {
            "global_steps": step,
            "validate": True,
            "do_sample": bool(self.cfg.rollout.val_do_sample),
        }
        start = time.perf_counter()
        out = self._run(self.rollout.generate_sequences(prompts))
        seconds = time.perf_counter() - start
        rewards = rule_reward(out)
        record = {
            "step": step,
            "val": True,
            "val_reward_mean": float(rewards.mean()),
            "val_seconds": seconds,
            "skip": out.meta_info.get("skipweave", {}).get("status", "off"),
        }
        self._write(record)
        log.info("step %d validation: reward_mean=%.4f (%.2fs)", step, record["val_reward_mean"], seconds)
        return record

    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.total_steps`` steps; returns a summary."""
        total_steps = int(self.cfg.trainer.total_steps)
        val_every = int(self.cfg.trainer.val_every)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path.write_text("", encoding="utf-8")
        log.info("training for %d steps, metrics -> %s", total_steps, self.metrics_path)
        totals = {"rollout": 0.0, "update": 0.0, "step": 0.0}
        skips: list[str] = []
        records: list[dict[str, Any]] = []
        fit_start = time.perf_counter()
        bar = tqdm(
            range(1, total_steps + 1), desc="tiny-grpo", unit="step", file=sys.stderr, dynamic_ncols=True
        )
        for step in bar:
            step_start = time.perf_counter()
            prompts = self.dataset.train_batch(step)
            prompts.meta_info = {"global_steps": step, "validate": False, "do_sample": True}

            rollout_start = time.perf_counter()
            out = self._run(self.rollout.generate_sequences(prompts))
            rollout_seconds = time.perf_counter() - rollout_start
            skip = out.meta_info.get("skipweave", {}).get("status", "off")

            update_start = time.perf_counter()
            rewards = rule_reward(out)
            advantages = grpo_advantages(rewards, out.non_tensor_batch["uid"], float(self.cfg.actor.adv_eps))
            stats = self.update_policy(out, advantages)
            update_seconds = time.perf_counter() - update_start
            step_seconds = time.perf_counter() - step_start

            record = {
                "step": step,
                "val": False,
                "loss": stats["loss"],
                "reward_mean": float(rewards.mean()),
                "reward_max": float(rewards.max()),
                "response_length_mean": float(out.batch["response_mask"].sum(-1).float().mean()),
                "pg_clipfrac": stats["pg_clipfrac"],
                "grad_norm": stats["grad_norm"],
                "param_checksum": param_checksum(self.policy),
                "rollout_seconds": rollout_seconds,
                "update_seconds": update_seconds,
                "step_seconds": step_seconds,
                "skip": skip,
            }
            self._write(record)
            records.append(record)
            skips.append(skip)
            totals["rollout"] += rollout_seconds
            totals["update"] += update_seconds
            totals["step"] += step_seconds
            bar.set_postfix(
                reward=f"{record['reward_mean']:.3f}", rollout=f"{rollout_seconds:.2f}s", skip=skip
            )
            log.info(
                "step %d: loss=%.5f reward_mean=%.4f rollout=%.2fs update=%.2fs skip=%s",
                step,
                record["loss"],
                record["reward_mean"],
                rollout_seconds,
                update_seconds,
                skip,
            )
            if val_every > 0 and step % val_every == 0:
                self.validate(step)
        bar.close()
        summary = {
            "steps": total_steps,
            "first_reward_mean": records[0]["reward_mean"] if records else None,
            "last_reward_mean": records[-1]["reward_mean"] if records else None,
            "rollout_seconds": totals["rollout"],
            "update_seconds": totals["update"],
            "train_seconds": time.perf_counter() - fit_start,
            "rollout_fraction_of_step": totals["rollout"] / totals["step"] if totals["step"] else 0.0,
            "skip_statuses": skips,
        }
        log.info("summary: %s", json.dumps(summary))
        return summary

    def close(self) -> None:
        """Stop the rollout workers and close the event loop."""
        self.rollout.shutdown()
        self._loop.close()
