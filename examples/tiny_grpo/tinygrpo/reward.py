"""Rule reward of the toy task and GRPO's group-relative advantages."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from tinygrpo.data import Batch


def compute_score(raw_prompt: str, response_ids: Sequence[int], response_length: int) -> float:
    """Fraction of the ``response_length`` response slots holding a digit that occurs in the prompt.

    Tokens after the first EOS are not part of the response, so stopping early scores less.
    """
    allowed = {int(c) for c in raw_prompt}
    return sum(1 for t in response_ids if int(t) in allowed) / float(response_length)


def rule_reward(data: Batch) -> torch.Tensor:
    """Sequence-level rewards, shape (N,), for a rollout batch (masks applied)."""
    responses = data.batch["responses"]
    mask = data.batch["response_mask"].bool()
    length = responses.shape[1]
    scores = [
        compute_score(prompt, responses[i][mask[i]].tolist(), length)
        for i, prompt in enumerate(data.non_tensor_batch["raw_prompt"])
    ]
    return torch.tensor(scores, dtype=torch.float32)


def grpo_advantages(rewards: torch.Tensor, uids: np.ndarray, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage ``(r - mean_group) / (std_group + eps)``; groups share a ``uid``."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, uid in enumerate(uids.tolist()):
        groups[str(uid)].append(i)
    adv = torch.zeros_like(rewards)
    for rows in groups.values():
        r = rewards[rows]
        std = r.std(unbiased=True) if len(rows) > 1 else torch.zeros(())
        adv[rows] = (r - r.mean()) / (std + eps)
    return adv
