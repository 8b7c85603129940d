"""The GRPO training loop (driver side), shaped like verl's ``RayPPOTrainer.fit``.

A step: rollout (Ray workers) -> reward (rule + a judge model) -> reference log-probs (Ray workers) -> critic values
(optional) -> advantages -> clipped policy gradient with a KL term to the reference -> critic update. Each expensive
phase is a driver-side method taking and returning a ``Batch`` (``_compute_reward``, ``_compute_ref_log_prob``,
``_compute_values``, the step in ``self.global_steps``), as verl's are, so that skipweave can replay any of them.
"""

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

from tinygrpo import judge as judge_module
from tinygrpo import ref as ref_module
from tinygrpo import rollout as rollout_module
from tinygrpo.critic import ValueModel
from tinygrpo.data import VOCAB_SIZE, Batch, PromptDataset
from tinygrpo.judge import Judge
from tinygrpo.model import TinyCausalLM, param_checksum, response_log_probs
from tinygrpo.ref import RefWorkerGroup
from tinygrpo.reward import grpo_advantages, rule_reward
from tinygrpo.rollout import RolloutConfig, RolloutManager

PHASES = ("rollout", "reward", "ref", "values")
"""The phases of a step that ``metrics.jsonl`` reports as live or replayed, in the order a step runs them."""

log = logging.getLogger(__name__)
T = TypeVar("T")


def seed_everything(seed: int, torch_threads: int) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` and make torch deterministic on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(torch_threads)
    torch.use_deterministic_algorithms(True)


def phase_status(result: Batch, phase: str = "rollout") -> str:
    """How skipweave settled the call of ``phase`` that returned ``result`` (its note in ``meta_info``: the rollout's
    under ``skipweave``, another phase's under ``skipweave_<phase>``, as the phase profiles declare): ``hit``
    (replayed), ``miss`` (ran live and recorded), ``bypass`` (ran live), ...; ``off`` when no role wove it."""
    key = "skipweave" if phase == "rollout" else f"skipweave_{phase}"
    return str(result.meta_info.get(key, {}).get("status", "off"))


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
        # The reference policy is the initial policy, frozen (same weights seed), in its own Ray workers.
        self.ref = RefWorkerGroup(self.model_kwargs, int(cfg.ref.num_workers), int(cfg.rollout.worker_threads))
        self.judge = Judge(self.model_kwargs, int(cfg.reward.judge_seed), float(cfg.reward.judge_latency))
        self.critic: ValueModel | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if bool(cfg.critic.enable):
            self.critic = ValueModel(self.model_kwargs, int(cfg.critic.seed)).eval()
            self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=float(cfg.critic.lr))
        self.global_steps = 0
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion on the trainer's private event loop."""
        return self._loop.run_until_complete(coro)

    def _write(self, record: dict[str, Any]) -> None:
        """Append one JSON line to ``metrics.jsonl`` (with the rollout and reference actors and judges this run
        started)."""
        record = {**record, "rollout_workers": rollout_module.WORKERS_STARTED,
                  "ref_workers": ref_module.WORKERS_STARTED, "judges": judge_module.JUDGES_STARTED}
        with self.metrics_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ the phases (verl's driver-side methods)
    def _compute_reward(self, batch: Batch) -> Batch:
        """Rewards of a rollout batch: ``rewards`` = rule score + ``reward.judge_weight`` x judge score, all (N,)
        float32 (``rule_scores``, ``judge_scores`` beside them). Validation batches (``meta_info["validate"]``)
        are scored the same way."""
        rule = rule_reward(batch)
        judged = self.judge.score(batch, self.response_length)
        rewards = rule + float(self.cfg.reward.judge_weight) * judged
        return Batch(batch={"rewards": rewards, "rule_scores": rule, "judge_scores": judged},
                     meta_info={"global_steps": self.global_steps})

    def _compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Reference log-probs ``ref_log_probs`` (N, response_length) of a rollout batch, from the ref workers."""
        log_probs = self.ref.compute_ref_log_prob(batch, self.response_length)
        return Batch(batch={"ref_log_probs": log_probs}, meta_info={"global_steps": self.global_steps})

    @torch.no_grad()
    def _compute_values(self, batch: Batch) -> Batch:
        """Critic values ``values`` (N, response_length) of a rollout batch (``critic.enable`` only).

        Raises:
            RuntimeError: the job has no critic.
        """
        if self.critic is None:
            raise RuntimeError("_compute_values needs critic.enable=true")
        values = self.critic(batch.batch["input_ids"], batch.batch["attention_mask"], self.response_length)
        return Batch(batch={"values": values}, meta_info={"global_steps": self.global_steps})

    # ------------------------------------------------------------------ the update
    def update_critic(self, data: Batch, rewards: torch.Tensor) -> float:
        """Regress the critic's values at every response position on the sequence reward (shuffled mini-batches,
        consumes the global RNG); returns the mean value loss."""
        assert self.critic is not None and self.critic_optimizer is not None
        self.critic.train()
        losses: list[float] = []
        for idx in torch.randperm(len(data)).chunk(int(self.cfg.actor.ppo_mini_batches)):
            values = self.critic(data.batch["input_ids"][idx], data.batch["attention_mask"][idx],
                                 self.response_length)
            loss = masked_mean((values - rewards[idx].unsqueeze(-1)) ** 2, data.batch["response_mask"][idx])
            self.critic_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.critic_optimizer.step()
            losses.append(float(loss.detach()))
        self.critic.eval()
        return float(np.mean(losses))

    def update_policy(self, data: Batch, advantages: torch.Tensor) -> dict[str, float]:
        """PPO-clipped policy-gradient update over shuffled mini-batches, plus ``actor.kl_coef`` x the low-variance
        KL estimate to the reference policy (verl's ``low_var_kl``); consumes the global RNG."""
        actor = self.cfg.actor
        kl_coef = float(actor.kl_coef)
        clip = float(actor.clip_ratio)
        num_mini = int(actor.ppo_mini_batches)
        self.policy.train()
        input_ids = data.batch["input_ids"]
        attention_mask = data.batch["attention_mask"]
        response_mask = data.batch["response_mask"]
        old_log_probs = data.batch["old_log_probs"]
        ref_log_probs = data.batch["ref_log_probs"]
        losses: list[float] = []
        kls: list[float] = []
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
                log_ratio_ref = (ref_log_probs[idx] - log_probs).clamp(-20.0, 20.0)
                kl = masked_mean((log_ratio_ref.exp() - log_ratio_ref - 1.0).clamp(-10.0, 10.0), mask)
                loss = masked_mean(pg_losses, mask) + kl_coef * kl
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), float(actor.grad_clip))
                self.optimizer.step()
                losses.append(float(loss.detach()))
                kls.append(float(kl.detach()))
                clipfracs.append(float(masked_mean(((ratio - 1.0).abs() > clip).float(), mask)))
                grad_norms.append(float(grad_norm))
        self.policy.eval()
        return {
            "loss": float(np.mean(losses)),
            "kl": float(np.mean(kls)),
            "pg_clipfrac": float(np.mean(clipfracs)),
            "grad_norm": float(np.mean(grad_norms)),
        }

    def validate(self, step: int) -> dict[str, Any]:
        """Run the validation prompts through the same ``generate_sequences`` and ``_compute_reward`` with
        ``meta_info["validate"]`` set (skipweave's roles let such calls run live, or serve them in replay-only
        runs from what a recording run kept apart)."""
        prompts = self.dataset.val_batch(int(self.cfg.data.val_size))
        prompts.meta_info = {
            "global_steps": step,
            "validate": True,
            "do_sample": bool(self.cfg.rollout.val_do_sample),
        }
        start = time.perf_counter()
        out = self._run(self.rollout.generate_sequences(prompts))
        scored = self._compute_reward(out)
        seconds = time.perf_counter() - start
        record = {
            "step": step,
            "val": True,
            "val_reward_mean": float(scored.batch["rewards"].mean()),
            "val_rule_mean": float(scored.batch["rule_scores"].mean()),
            "val_seconds": seconds,
            "skip": phase_status(out),
            "phases": {"rollout": phase_status(out), "reward": phase_status(scored, "reward")},
        }
        self._write(record)
        log.info("step %d validation: reward_mean=%.4f (%.2fs)", step, record["val_reward_mean"], seconds)
        return record

    def train_step(self, step: int) -> dict[str, Any]:
        """One training step; returns its ``metrics.jsonl`` record (per-phase seconds and skipweave statuses)."""
        self.global_steps = step
        step_start = time.perf_counter()
        prompts = self.dataset.train_batch(step)
        prompts.meta_info = {"global_steps": step, "validate": False, "do_sample": True}
        seconds: dict[str, float] = {}
        status: dict[str, str] = {}

        start = time.perf_counter()
        batch = self._run(self.rollout.generate_sequences(prompts))
        seconds["rollout"], status["rollout"] = time.perf_counter() - start, phase_status(batch)

        start = time.perf_counter()
        scored = self._compute_reward(batch)
        batch.union(scored)
        seconds["reward"], status["reward"] = time.perf_counter() - start, phase_status(scored, "reward")

        start = time.perf_counter()
        ref = self._compute_ref_log_prob(batch)
        batch.union(ref)
        seconds["ref"], status["ref"] = time.perf_counter() - start, phase_status(ref, "ref")

        rewards = batch.batch["rewards"]
        if self.critic is not None:
            start = time.perf_counter()
            values = self._compute_values(batch)
            batch.union(values)
            seconds["values"], status["values"] = time.perf_counter() - start, phase_status(values, "values")
            advantages = rewards - batch.batch["values"][:, 0]  # a learned baseline instead of the group's
        else:
            advantages = grpo_advantages(rewards, batch.non_tensor_batch["uid"], float(self.cfg.actor.adv_eps))

        start = time.perf_counter()
        stats = self.update_policy(batch, advantages)
        critic_loss = self.update_critic(batch, rewards) if self.critic is not None else None
        seconds["update"] = time.perf_counter() - start
        step_seconds = time.perf_counter() - step_start

        record: dict[str, Any] = {
            "step": step,
            "val": False,
            "loss": stats["loss"],
            "kl": stats["kl"],
            "reward_mean": float(rewards.mean()),
            "reward_max": float(rewards.max()),
            "rule_mean": float(batch.batch["rule_scores"].mean()),
            "judge_mean": float(batch.batch["judge_scores"].mean()),
            "response_length_mean": float(batch.batch["response_mask"].sum(-1).float().mean()),
            "pg_clipfrac": stats["pg_clipfrac"],
            "grad_norm": stats["grad_norm"],
            "param_checksum": param_checksum(self.policy),
            "rollout_seconds": seconds["rollout"],
            "update_seconds": seconds["update"],
            "step_seconds": step_seconds,
            "phase_seconds": seconds,
            "phases": status,
            # A phase ran live unless skipweave replayed it (status hit).
            "live_phases": [p for p in PHASES if p in status and status[p] != "hit"],
            "skip": status["rollout"],
        }
        if self.critic is not None:
            record["critic_loss"] = critic_loss
            record["value_mean"] = float(batch.batch["values"].mean())
            record["critic_checksum"] = param_checksum(self.critic)
        return record

    def fit(self) -> dict[str, Any]:
        """Train for ``trainer.total_steps`` steps; returns a summary."""
        total_steps = int(self.cfg.trainer.total_steps)
        val_every = int(self.cfg.trainer.val_every)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path.write_text("", encoding="utf-8")
        log.info("training for %d steps, metrics -> %s", total_steps, self.metrics_path)
        totals: dict[str, float] = {}
        skips: list[str] = []
        records: list[dict[str, Any]] = []
        fit_start = time.perf_counter()
        bar = tqdm(
            range(1, total_steps + 1), desc="tiny-grpo", unit="step", file=sys.stderr, dynamic_ncols=True
        )
        for step in bar:
            record = self.train_step(step)
            self._write(record)
            records.append(record)
            skips.append(record["skip"])
            for phase, spent in record["phase_seconds"].items():
                totals[phase] = totals.get(phase, 0.0) + spent
            totals["step"] = totals.get("step", 0.0) + record["step_seconds"]
            bar.set_postfix(reward=f"{record['reward_mean']:.3f}", live=",".join(record["live_phases"]) or "-")
            log.info(
                "step %d: loss=%.5f reward_mean=%.4f kl=%.5f %s live=%s",
                step, record["loss"], record["reward_mean"], record["kl"],
                " ".join(f"{p}={t:.2f}s" for p, t in record["phase_seconds"].items()),
                ",".join(record["live_phases"]) or "-",
            )
            if val_every > 0 and step % val_every == 0:
                self.validate(step)
        bar.close()
        summary = {
            "steps": total_steps,
            "first_reward_mean": records[0]["reward_mean"] if records else None,
            "last_reward_mean": records[-1]["reward_mean"] if records else None,
            "phase_seconds": {p: t for p, t in totals.items() if p != "step"},
            "train_seconds": time.perf_counter() - fit_start,
            "rollout_fraction_of_step": totals.get("rollout", 0.0) / totals["step"] if totals.get("step") else 0.0,
            "skip_statuses": skips,
        }
        log.info("summary: %s", json.dumps(summary))
        return summary

    def close(self) -> None:
        """Stop the rollout and reference workers and close the event loop."""
        self.rollout.shutdown()
        self.ref.shutdown()
        self._loop.close()
