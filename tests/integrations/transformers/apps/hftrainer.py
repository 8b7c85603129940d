"""A ``transformers.Trainer`` subclass shaped like TRL's online trainers (GRPO, RLOO, online DPO).

Nothing here knows skipweave. As in TRL:

- ``compute_loss`` calls the trainer's own generation method, ``generate_completions(inputs)``, which samples
  completions with ``self.model.generate(do_sample=True)``, appends per-batch statistics to
  ``self._metrics[mode]`` and adds the tokens it saw to ``self.state.num_input_tokens_seen``;
- the loss is a REINFORCE-style objective over the sampled completions (their log-likelihood under the
  model, weighted by a reward computed from the completions);
- evaluation (``prediction_step``) calls the same method while ``self.model.training`` is False;
- ``log()`` averages ``self._metrics[mode]`` into the logs and clears it at every logging step.

The method counts its real calls in ``self.real_generations`` (a replay never runs its body).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from transformers import Trainer

BOS, EOS, PAD = 0, 1, 2
"""Special token ids of the tiny vocabulary (the script's model config uses them)."""


class OnlineTrainer(Trainer):
    """Generates completions for each batch of prompts and trains on them."""

    def __init__(self, *args: Any, max_new_tokens: int = 6, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_new_tokens = max_new_tokens
        self.model_accepts_loss_kwargs = False  # the loss below does not take num_items_in_batch
        self._metrics: dict[str, defaultdict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        self.real_generations: list[list[Any]] = []  # (global_step, model.training) of every real call

    # ------------------------------------------------------------------ the slow call
    def generate_completions(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sample one completion per prompt; return its ids and the mask of the tokens up to its first EOS."""
        policy: Any = self.model
        self.real_generations.append([self.state.global_step, policy.training])
        mode = "train" if policy.training else "eval"
        prompt_ids = inputs["input_ids"]
        with torch.no_grad():
            out = policy.generate(
                input_ids=prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=1,
                eos_token_id=EOS,
                pad_token_id=PAD,
            )
        completion_ids = out[:, prompt_ids.size(1):]
        is_eos = completion_ids == EOS
        # Tokens up to and including the first EOS count; what generate padded after it does not.
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
        completion_mask = (~after_eos).long()
        lengths = completion_mask.sum(dim=1).float()
        metrics = self._metrics[mode]
        metrics["completion_length"].append(lengths.mean().item())
        metrics["completion_max_length"].append(lengths.max().item())
        metrics["terminated_ratio"].append(is_eos.any(dim=1).float().mean().item())
        self.state.num_input_tokens_seen += int(prompt_ids.numel() + completion_mask.sum().item())
        return {"completion_ids": completion_ids, "completion_mask": completion_mask}

    # ------------------------------------------------------------------ loss, evaluation, logging
    def _mode(self) -> str:
        return "train" if getattr(self.model, "training", False) else "eval"

    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        mode = self._mode()
        gen = self.generate_completions(inputs)
        prompt_ids, completion_ids, mask = inputs["input_ids"], gen["completion_ids"], gen["completion_mask"]
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([torch.ones_like(prompt_ids), mask], dim=1)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, prompt_ids.size(1) - 1 : -1]
        logps = logits.log_softmax(dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        seq_logp = (logps * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        # Reward: the share of "low" tokens (id < 32) in the completion; advantage against the batch mean.
        reward = (((completion_ids < 32) & mask.bool()).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).float()
        advantage = reward - reward.mean()
        loss = -((advantage + 0.1) * seq_logp).mean()
        self._metrics[mode]["reward"].append(reward.mean().item())
        return (loss, None) if return_outputs else loss

    def prediction_step(self, model: Any, inputs: dict[str, torch.Tensor], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = self._mode()
        metrics = {key: sum(values) / len(values) for key, values in self._metrics[mode].items() if values}
        if mode == "eval":
            metrics = {f"eval_{key}": value for key, value in metrics.items()}
        if start_time is None:  # transformers < 4.46 has no start_time
            super().log({**logs, **metrics})
        else:
            super().log({**logs, **metrics}, start_time)
        self._metrics[mode].clear()
