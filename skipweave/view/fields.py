"""Which recorded fields hold a sample's reward and its response length: the one place ``skipweave view`` keeps
that knowledge.

- reward: the first per-sample column named (or ending in ``.<name>``) one of :data:`REWARD_FIELDS`: verl's
  ``token_level_scores`` / ``token_level_rewards`` (summed over the response when they are per token), a
  ``rewards`` column (the tiny_grpo example's reward phase, TRL's records), a ``reward`` or a ``score``;
- response length: the number of response ids that are text, by the mask :func:`skipweave.export.text.token_fields`
  picks (the response part of a verl ``attention_mask``, a ``response_mask``/``completion_mask``), else the length of
  each sample's list of ids (TRL's ``completion_ids``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

REWARD_FIELDS = ("token_level_scores", "token_level_rewards", "rewards", "reward", "score")
"""Per-sample reward columns, the first present wins."""


def column(columns: dict[str, Any], name: str) -> str | None:
    """The column of ``columns`` named ``name`` or ending in ``.name`` (a nested field), else None."""
    if name in columns:
        return name
    return next((c for c in columns if c.endswith(f".{name}")), None)


def rewards(columns: dict[str, Any], count: int) -> tuple[str, np.ndarray] | None:
    """``(column, one float per sample)`` of the first reward column of a call's per-sample ``columns`` whose values
    are numbers (a per-token one summed over its last axis); None when there is none."""
    from skipweave.export.values import numeric_array

    for name in REWARD_FIELDS:
        found = column(columns, name)
        if found is None:
            continue
        value = columns[found]
        array = numeric_array(value)
        if array is None:
            try:
                array = np.asarray([float(x) for x in value], dtype=np.float64)
            except (TypeError, ValueError):
                continue  # not numbers (a reward held as text): look further
        if array.ndim == 0 or array.shape[0] != count:
            continue
        array = array.astype(np.float64)
        if array.ndim > 1:
            array = array.reshape(count, -1).sum(axis=1)
        return found, array
    return None


def response_lengths(columns: dict[str, Any], count: int) -> np.ndarray | None:
    """Each sample's response length in tokens (see the module docstring), or None when the call holds no response
    ids under a name :mod:`skipweave.export.text` reads."""
    from skipweave.export.text import token_fields
    from skipweave.export.values import numeric_array

    found = token_fields(columns).get("response")
    if found is None:
        return None
    name, mask = found
    if mask is not None:
        array = numeric_array(mask)
        if array is not None and array.ndim == 2:
            return (array != 0).sum(axis=1).astype(np.int64)
    value = columns[name]
    array = numeric_array(value)
    if array is not None and array.ndim == 2:
        return np.full(count, array.shape[1], dtype=np.int64)  # no mask: every position is a token
    try:
        return np.asarray([len(v) for v in value], dtype=np.int64)
    except TypeError:
        return None


__all__ = ["REWARD_FIELDS", "column", "response_lengths", "rewards"]
