"""An optional critic (``critic.enable=true``): a value network trained beside the policy, a learned baseline.

The critic has the policy's shape with a scalar head; its value at each response position estimates the sequence's
reward. With a critic the advantage is ``reward - V(first response position)`` (REINFORCE with a learned baseline)
instead of GRPO's group normalisation. GRPO jobs have no critic; this one exists so that the ``values`` phase of a
PPO-style job has a driver-side method to replay (``GRPOTrainer._compute_values``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tinygrpo.model import TinyCausalLM


class ValueModel(nn.Module):
    """A ``TinyCausalLM`` trunk whose head gives one value per position."""

    def __init__(self, model_kwargs: dict[str, Any], seed: int) -> None:
        """Build the trunk from ``seed`` and a zero-initialised value head."""
        super().__init__()
        self.trunk = TinyCausalLM(**{**model_kwargs, "init_seed": seed})
        d_model = self.trunk.head.in_features
        self.trunk.head = nn.Identity()  # type: ignore[assignment]
        self.value_head = nn.Linear(d_model, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
        """Values at the response positions, shape (B, response_length): position ``t``'s value is read at the
        token before response token ``t`` (the state it was chosen in)."""
        hidden = self.trunk(input_ids, attention_mask)[:, -response_length - 1 : -1, :]
        return self.value_head(hidden).squeeze(-1).float()
