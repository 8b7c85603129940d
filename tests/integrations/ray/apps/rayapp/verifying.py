"""An actor whose rollout departs from a recording from a given step on (the verify run's Ray worker)."""

from __future__ import annotations

import os
from typing import Any

import torch


class Sampler:
    """Generates a step's tokens and log-probs; from step ``change`` on (0: never) sample 1 departs at position 2."""

    def __init__(self, change: int = 0) -> None:
        self.change = change

    def generate(self, step: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, 100, (4, 8), generator=g)
        if self.change and step >= self.change:
            tokens[1, 2:] = (tokens[1, 2:] + 1) % 100
        return {"tokens": tokens, "log_probs": torch.randn(4, 8, generator=g)}

    def pid(self) -> int:
        return os.getpid()
