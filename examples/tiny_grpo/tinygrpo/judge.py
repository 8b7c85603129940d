"""A model-based reward standing for an LLM judge: a small scoring network behind a slow endpoint.

The judge is a second tiny language model (its own seed, never trained); it scores a response by how likely it finds
the response's tokens, ``exp(mean log-prob)`` in (0, 1]. A real judge is a remote model whose calls take seconds and
are rate-limited: ``latency`` seconds are spent per call (sleeping, as a client waits for an endpoint) so that the
reward phase costs what it costs in a real job, relative to the rest of this toy.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tinygrpo.data import Batch
from tinygrpo.model import TinyCausalLM, response_log_probs

JUDGES_STARTED = 0
"""Judges this process built (``judges`` of every row of ``metrics.jsonl``): 0 in a run that replays the rewards
replay-only, whose stand-in judge loads no model."""


class Judge:
    """Scores responses with a frozen scoring network; each :meth:`score` call waits ``latency`` seconds."""

    def __init__(self, model_kwargs: dict[str, Any], seed: int, latency: float) -> None:
        """Build the scoring network from ``seed`` (the policy's shape, other weights).

        Args:
            model_kwargs: ``TinyCausalLM`` arguments (``init_seed`` is replaced by ``seed``).
            seed: Weight seed of the judge.
            latency: Seconds one call waits, standing for a judge endpoint's response time (>= 0).

        Raises:
            ValueError: ``latency`` is negative.
        """
        global JUDGES_STARTED
        if latency < 0:
            raise ValueError(f"reward.judge_latency must be >= 0 seconds, got {latency}")
        # A judge is a service of its own: building it leaves the trainer's random stream where it was (torch's
        # layer constructors draw from the global generator before our seeded init overwrites them). Otherwise a
        # run that replays the rewards with a stand-in judge would start its update from another RNG state.
        with torch.random.fork_rng(devices=[]):
            self.model = TinyCausalLM(**{**model_kwargs, "init_seed": seed, "dropout": 0.0}).eval()
        self.latency = latency
        JUDGES_STARTED += 1

    @torch.no_grad()
    def score(self, data: Batch, response_length: int) -> torch.Tensor:
        """Judge scores, shape (len(data),) float32 in (0, 1]: ``exp`` of the mean log-prob of each response's tokens
        (0 for an empty response)."""
        if self.latency:
            time.sleep(self.latency)
        log_probs = response_log_probs(self.model, data.batch["input_ids"], data.batch["attention_mask"],
                                       response_length)
        mask = data.batch["response_mask"].to(log_probs.dtype)
        count = mask.sum(-1)
        mean = (log_probs * mask).sum(-1) / count.clamp(min=1.0)
        return torch.where(count > 0, mean.exp(), torch.zeros_like(mean))
