"""Data side of the toy task: the vocabulary, a verl-DataProto-shaped ``Batch`` and prompt sampling.

Task: a prompt is ``BOS d1 d2 ... dk`` (digits ``0-9``, ``k`` random), the policy answers with up to
``response_length`` tokens; the rule reward (see :mod:`tinygrpo.reward`) pays for every response
token that is one of the prompt's digits (so the policy must learn to avoid EOS, special/unused
tokens and digits absent from the prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

NUM_DIGITS = 10
BOS_ID = 10
EOS_ID = 11
PAD_ID = 12
VOCAB_SIZE = 16  # ids 13-15 are unused filler tokens the policy has to learn to avoid

_SPECIAL = {BOS_ID: "<s>", EOS_ID: "</s>", PAD_ID: "<pad>"}


def decode(token_ids: Sequence[int]) -> str:
    """Render token ids as a space-separated string (digits as themselves, others as ``<...>``)."""
    return " ".join(str(t) if t < NUM_DIGITS else _SPECIAL.get(int(t), f"<u{int(t)}>") for t in token_ids)


@dataclass
class Batch:
    """A minimal stand-in for verl's ``DataProto``.

    Attributes:
        batch: Tensors sharing the leading (row) dimension.
        non_tensor_batch: Object/numeric numpy arrays sharing the leading dimension (e.g. ``uid``).
        meta_info: Free-form metadata for the whole batch (``global_steps``, ``validate``, ``timing``...).
    """

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        """Number of rows."""
        for value in self.batch.values():
            return int(value.shape[0])
        for array in self.non_tensor_batch.values():
            return int(array.shape[0])
        return 0

    def select(self, index: torch.Tensor | Sequence[int]) -> Batch:
        """Return the rows ``index`` (a new batch; ``meta_info`` is shallow-copied)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        np_idx = idx.numpy()
        return Batch(
            batch={k: v[idx] for k, v in self.batch.items()},
            non_tensor_batch={k: v[np_idx] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def chunk(self, chunks: int) -> list[Batch]:
        """Split into ``chunks`` contiguous, near-equal parts (like ``DataProto.chunk``)."""
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        bounds = np.linspace(0, len(self), chunks + 1).round().astype(int)
        return [self.select(list(range(lo, hi))) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def union(self, other: Batch) -> Batch:
        """Add ``other``'s fields (same rows) to this batch, in place, and return it (like ``DataProto.union``).

        Raises:
            ValueError: ``other`` has another number of rows.
        """
        if len(other) != len(self):
            raise ValueError(f"cannot union a batch of {len(other)} rows into one of {len(self)}")
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        return self

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Concatenate row-wise; ``meta_info`` is taken from the first part."""
        if not parts:
            raise ValueError("cannot concatenate an empty list of batches")
        first = parts[0]
        return Batch(
            batch={k: torch.cat([p.batch[k] for p in parts], dim=0) for k in first.batch},
            non_tensor_batch={
                k: np.concatenate([p.non_tensor_batch[k] for p in parts], axis=0)
                for k in first.non_tensor_batch
            },
            meta_info=dict(first.meta_info),
        )


def _step_generator(seed: int, step: int, stream: int) -> torch.Generator:
    """A private generator derived from (seed, step, stream); never touches the global RNG."""
    state = np.random.SeedSequence([seed, step, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)


def make_prompts(
    num_prompts: int,
    min_len: int,
    max_len: int,
    generator: torch.Generator,
    uid_prefix: str,
) -> Batch:
    """Build ``num_prompts`` left-padded prompts ``BOS d1..dk`` with ``k`` in ``[min_len, max_len]``.

    Returns a batch with ``input_ids``/``attention_mask`` of width ``max_len + 1`` and the non-tensor
    fields ``uid`` (one string id per prompt) and ``raw_prompt`` (the digits as text).
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    width = max_len + 1
    lengths = torch.randint(min_len, max_len + 1, (num_prompts,), generator=generator)
    digits = torch.randint(0, NUM_DIGITS, (num_prompts, max_len), generator=generator)
    input_ids = torch.full((num_prompts, width), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((num_prompts, width), dtype=torch.long)
    raw: list[str] = []
    for i in range(num_prompts):
        k = int(lengths[i])
        row = [BOS_ID, *digits[i, :k].tolist()]
        input_ids[i, width - len(row) :] = torch.tensor(row)
        attention_mask[i, width - len(row) :] = 1
        raw.append("".join(str(d) for d in row[1:]))
    return Batch(
        batch={"input_ids": input_ids, "attention_mask": attention_mask},
        non_tensor_batch={
            "uid": np.array([f"{uid_prefix}-{i}" for i in range(num_prompts)], dtype=object),
            "raw_prompt": np.array(raw, dtype=object),
        },
    )


class PromptDataset:
    """An endless, deterministic prompt source: batch ``step`` depends only on (seed, step)."""

    def __init__(self, seed: int, batch_size: int, min_prompt_length: int, max_prompt_length: int) -> None:
        """Store the sampling parameters."""
        self.seed = seed
        self.batch_size = batch_size
        self.min_len = min_prompt_length
        self.max_len = max_prompt_length

    def train_batch(self, step: int) -> Batch:
        """The training prompts of (1-based) ``step``."""
        gen = _step_generator(self.seed, step, stream=0)
        return make_prompts(self.batch_size, self.min_len, self.max_len, gen, uid_prefix=f"train-s{step}")

    def val_batch(self, size: int) -> Batch:
        """The fixed validation prompts (identical at every validation)."""
        gen = _step_generator(self.seed, 0, stream=1)
        return make_prompts(size, self.min_len, self.max_len, gen, uid_prefix="val")
