"""A verl-sized rollout batch: what ``generate_sequences`` hands back for ``n`` sequences of ``length`` tokens.

The object is shaped like verl's ``DataProto`` (``batch`` a TensorDict, ``non_tensor_batch`` a dict of numpy
object arrays, ``meta_info`` a dict), so skipweave's codec, ``torch.save`` and ``pickle`` all see what they
would see in a verl job. The class lives at module level so every process of the benchmark can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import skipweave

# The store reads this DataProto shape (and the TensorDict in it) through the host types of the verl and tensordict
# integrations; the registries are passive, so a benchmark child that drives StepStore directly loads the
# integrations as every run does (skipweave.weave, the CLI, the Hydra callback).
skipweave.load_integrations()

# bytes per token: input_ids, attention_mask, position_ids (int64) + old_log_probs (float32)
# + ref_log_prob (bfloat16)
BYTES_PER_TOKEN = 3 * 8 + 4 + 2
DEFAULT_LENGTH = 8192


@dataclass
class DataProto:
    """The three attributes skipweave's codec and verl's ``DataProto`` share."""

    batch: Any = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def sequences_for(megabytes: float, length: int = DEFAULT_LENGTH) -> int:
    """Number of sequences whose tensors take about ``megabytes`` MB (10^6 bytes)."""
    return max(1, round(megabytes * 1e6 / (BYTES_PER_TOKEN * length)))


def make_batch(n: int, length: int = DEFAULT_LENGTH, seed: int = 0) -> DataProto:
    """Build the batch: int64 ids/masks/positions, float32 and bfloat16 log-probs, strings and dicts."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 151_000, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.int64)
    mask[:, : length // 8] = 0  # left padding of the prompts
    pos = torch.clamp(torch.cumsum(mask, dim=1) - 1, min=0)
    logp = -torch.rand(n, length, generator=g) * 5
    ref = logp.to(torch.bfloat16)
    batch = TensorDict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "old_log_probs": logp, "ref_log_prob": ref},
        batch_size=[n],
    )
    prompt = "Solve the following problem and put the final answer in a box. " * 12
    non_tensor = {
        "uid": np.array([f"{seed:04d}-{i:08d}" for i in range(n)], dtype=object),
        "data_source": np.array(["openai/gsm8k"] * n, dtype=object),
        "raw_prompt": np.array([f"[{i}] {prompt}" for i in range(n)], dtype=object),
        "reward_model": np.array([{"ground_truth": str(i * 7), "style": "rule"} for i in range(n)], dtype=object),
        "extra_info": np.array([{"index": i, "split": "train", "answer": f"#### {i * 7}"} for i in range(n)],
                               dtype=object),
    }
    return DataProto(batch, non_tensor, {"global_steps": 1, "temperature": 1.0})


def tensor_bytes(obj: DataProto) -> int:
    """Bytes held by the batch's tensors."""
    return sum(int(t.numel() * t.element_size()) for t in obj.batch.values())
