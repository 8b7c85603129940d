"""The frozen reference policy: Ray actor workers that compute reference log-probs (verl's ref worker group).

Each worker holds the initial policy (built from the same seed as the trained one, never updated). The driver-side
``RefWorkerGroup.compute_ref_log_prob`` splits a rollout batch across the workers and gathers their log-probs; the
trainer's KL term compares the policy with it.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from tinygrpo import cluster
from tinygrpo.data import Batch
from tinygrpo.model import TinyCausalLM, response_log_probs

WORKERS_STARTED = 0
"""Reference worker actors this process started (``ref_workers`` of every row of ``metrics.jsonl``): 0 in a run
that replays the reference log-probs replay-only, whose stand-in group starts none."""


class RefWorker:
    """Holds the frozen reference policy and scores responses with it."""

    def __init__(self, rank: int, model_kwargs: dict[str, Any], num_threads: int = 1) -> None:
        """Build the reference policy: the trained policy's initial weights (same ``init_seed``)."""
        torch.set_num_threads(num_threads)
        torch.use_deterministic_algorithms(True)
        self.rank = rank
        self.model = TinyCausalLM(**model_kwargs).eval()

    def ready(self) -> int:
        """Return the worker's rank once its constructor has run (used to wait for start-up)."""
        return self.rank

    @torch.no_grad()
    def compute_ref_log_prob(self, data: Batch, response_length: int) -> torch.Tensor:
        """Log-probs, shape (rows, response_length) float32, of ``data``'s responses under the reference policy."""
        return response_log_probs(self.model, data.batch["input_ids"], data.batch["attention_mask"], response_length)


class RefWorkerGroup:
    """Driver-side front end of the reference workers (verl's ``ref_policy_wg``)."""

    def __init__(self, model_kwargs: dict[str, Any], num_workers: int, worker_threads: int = 1) -> None:
        """Start ``num_workers`` Ray actors holding the reference policy (Ray must be initialised).

        Raises:
            ValueError: ``num_workers`` is below 1.
        """
        global WORKERS_STARTED
        if num_workers < 1:
            raise ValueError("ref.num_workers must be >= 1")
        cluster.ensure_started()
        # No CPU reserved: the reference workers share the rollout workers' CPUs (they run between rollouts), as
        # verl colocates the reference with the actor.
        remote_cls = ray.remote(num_cpus=0)(RefWorker)
        self.workers: list[Any] = [  # Ray actor handles of RefWorker
            remote_cls.remote(rank, dict(model_kwargs), worker_threads) for rank in range(num_workers)
        ]
        WORKERS_STARTED += len(self.workers)
        # Not waited for: they start while the first rollout runs (the first compute_ref_log_prob waits for them).

    def compute_ref_log_prob(self, data: Batch, response_length: int) -> torch.Tensor:
        """Reference log-probs of ``data``'s responses, shape (len(data), response_length), gathered in row order."""
        chunks = data.chunk(min(len(self.workers), len(data)))
        refs = [w.compute_ref_log_prob.remote(c, response_length) for w, c in zip(self.workers, chunks, strict=False)]
        return torch.cat(ray.get(refs), dim=0)

    def shutdown(self) -> None:
        """Kill the worker actors."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
