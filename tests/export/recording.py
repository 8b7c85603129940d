"""Stores for the export tests, made by really recording: a tiny host module woven in this process and called.

``HOST`` holds the result shapes the tests export: verl's ``DataProto`` shape as the tiny_grpo example's rollout
returns it (``Batch.batch`` tensors, ``non_tensor_batch`` uid and reward extras, ``meta_info``), TRL's lists of token
ids, a ``TensorDict``, plain dicts with and without a sample axis, and a scalar.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import skipweave

HOST = '''
import numpy as np
import torch

PAD, BOS, EOS = 0, 1, 2
P, R = 4, 5


class Batch:
    """verl's DataProto shape, as the tiny_grpo example's rollout and reward return it."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}


def prompts_of(step, n, validate=False):
    return Batch(meta_info={"global_steps": step, "validate": validate, "n": n})


def rollout_batch(step, n):
    """n samples: left-padded prompts (P wide), right-padded responses (R wide), tiny_grpo's field names."""
    g = torch.Generator().manual_seed(step)
    prompts = torch.full((n, P), PAD)
    prompt_mask = torch.zeros((n, P), dtype=torch.long)
    responses = torch.full((n, R), PAD)
    response_mask = torch.zeros((n, R), dtype=torch.long)
    for i in range(n):
        k = 1 + (i + step) % (P - 1)            # prompt length 1..P-1 after BOS
        prompts[i, P - k - 1:] = torch.tensor([BOS] + [3 + (i + j) % 5 for j in range(k)])
        prompt_mask[i, P - k - 1:] = 1
        m = 1 + (i * 2 + step) % (R - 1)        # response length 1..R-1, then EOS
        responses[i, :m + 1] = torch.tensor([3 + (i + j + step) % 5 for j in range(m)] + [EOS])
        response_mask[i, :m + 1] = 1
    log_probs = torch.randn((n, R), generator=g) * response_mask
    return Batch(
        batch={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "old_log_probs": log_probs,
            "token_level_scores": torch.arange(n, dtype=torch.float32) / 10 + step,
        },
        non_tensor_batch={
            "uid": np.array([f"s{step}-p{i // 2}" for i in range(n)], dtype=object),
            "acc": np.array([float(i % 2) for i in range(n)], dtype=object),
            "pred": np.array([str(i) for i in range(n)], dtype=object),
        },
        meta_info={"global_steps": step, "temperature": 0.7, "timing": {"gen": 0.25 * step}},
    )


class Rollout:
    def generate_sequences(self, prompts):
        meta = prompts.meta_info
        out = rollout_batch(meta["global_steps"], meta["n"])
        out.meta_info["validate"] = bool(meta.get("validate", False))
        return out


def trl_generate(step, n):
    """TRL's shape: lists of token ids of any length, per-sample rewards, a scalar of the call."""
    return {
        "prompt_ids": [[BOS] + [3 + (i + j) % 5 for j in range(1 + i % 3)] for i in range(n)],
        "completion_ids": [[3 + (i + j + step) % 5 for j in range(1 + (i + step) % 4)] + [EOS] for i in range(n)],
        "rewards": [float(i) / n + step for i in range(n)],
        "num_items_in_batch": n * step,
    }


def tensordict_result(step, n):
    from tensordict import TensorDict

    return TensorDict({
        "tokens": torch.arange(n * 3).reshape(n, 3) + step,
        "reward": torch.full((n,), float(step)),
        "nested": TensorDict({"value": torch.ones(n, 2) * step}, batch_size=[n]),
    }, batch_size=[n])


def plain_no_axis(step):
    return {"loss": 0.5 * step, "ids": torch.arange(3), "names": ["a", "b"], "step_seen": step}


def scalar(step):
    return 1.5 * step


def surrogates(step):
    """Strings holding a lone surrogate (the codec stores them, as surrogatepass): a valid recording, in a value and
    in a key, DataProto-shaped as verl's rollouts are."""
    return Batch(batch={"responses": torch.tensor([[3, 2], [4, 2]]) + step},
                 non_tensor_batch={"uid": np.array(["\\udcff x", "ok"], dtype=object),
                                   "note\\udcfe": np.array(["a", "b"], dtype=object)},
                 meta_info={"global_steps": step, "tag": "\\udcfd"})


def awkward(step):
    """Values JSON holds badly: non-finite floats, ints beyond int64, a column of values of no common type."""
    return {"ids": [[1], [2], [3]], "score": [float("nan"), 1.0, float("inf")], "mixed": [1, "a", [2]],
            "big": [10**30, 1, 2], "nested": [{"a": 1}, {"a": "x"}, None],
            "huge": 10**30 + step, "nan": float("nan")}


def colliding(step):
    """Sample fields named like the call's columns: a non_tensor_batch column "meta_info.k" beside meta_info["k"]."""
    return Batch(batch={"responses": torch.tensor([[3, 2], [4, 2]])},
                 non_tensor_batch={"meta_info.k": np.array(["sample 0", "sample 1"], dtype=object)},
                 meta_info={"global_steps": step, "k": "the call's"})


def colliding_plain(step):
    """A plain mapping's per-sample "a.b" beside its call field a = {"b": ...}."""
    return {"a.b": [10, 11], "a": {"b": step}}


def pickled(step):
    """What the codec stores only pickled (a datetime.date): recorded with allow_pickle."""
    import datetime

    return {"day": datetime.date(2026, 12, step), "ids": [[step], [step + 1]]}
'''


def host_module(tmp_path: Path) -> Any:
    """Write ``HOST`` as a uniquely named module under ``tmp_path``, import it and return it (removed from
    ``sys.modules`` by :func:`forget`)."""
    name = f"exphost_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOST))
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def forget(host: Any) -> None:
    """Drop the host module imported by :func:`host_module`."""
    sys.modules.pop(host.__name__, None)


def record(dump: Path, host: Any, targets: dict[str, str], calls: Callable[[Any], Iterable[Any]], *,
           role: str = "rollout", namespace: str | None = None, **settings: Any) -> None:
    """Weave ``targets`` (name -> attribute path in ``host``) as a recording role and run ``calls(host)`` (a
    generator making the calls), then unweave (which commits every entry)."""
    # verl's convention: the DataProto-shaped calls carry their step and validation flag in meta_info
    spec: dict[str, Any] = {"enable": True, "convention": "verl", "dump_dir": str(dump),
                            "targets": {k: f"{host.__name__}:{v}" for k, v in targets.items()}, **settings}
    if namespace is not None:
        spec["namespace"] = namespace
    skipweave.weave({"skip": {role: spec}})
    try:
        for _ in calls(host):
            pass
    finally:
        skipweave.unweave()
        skipweave.set_step(None)


def rollouts(steps: Iterable[int], n: int, *, validate_at: Iterable[int] = ()) -> Callable[[Any], Iterable[Any]]:
    """Calls of ``Rollout.generate_sequences`` at ``steps`` with ``n`` samples (a validation call after each step of
    ``validate_at``)."""
    validate = set(validate_at)

    def calls(host: Any) -> Iterable[Any]:
        rollout = host.Rollout()
        for step in steps:
            yield rollout.generate_sequences(host.prompts_of(step, n))
            if step in validate:
                yield rollout.generate_sequences(host.prompts_of(step, 2, validate=True))

    return calls


STEP_ARG = {"source": "arg", "arg": "step", "path": ""}
"""The ``step`` setting of a target whose argument ``step`` is the step (the functions of ``HOST`` but the rollout)."""


def stepped(function: str, steps: Iterable[int], *args: Any) -> Callable[[Any], Iterable[Any]]:
    """Calls of ``host.<function>(step, *args)`` at ``steps`` (record them with ``step=STEP_ARG``)."""

    def calls(host: Any) -> Iterable[Any]:
        for step in steps:
            yield getattr(host, function)(step, *args)

    return calls


def manifests(dump: Path) -> list[Path]:
    """Every entry's manifest under ``dump``, sorted."""
    return sorted(p for p in dump.rglob("*.manifest.json") if ".runs" not in p.parts)


def rewrite_manifest(path: Path, **fields: Any) -> None:
    """Set ``fields`` in the manifest at ``path`` (a format version, for a foreign or format-1 entry)."""
    doc = json.loads(path.read_text())
    doc.update(fields)
    for key in [k for k, v in fields.items() if v is None]:
        doc.pop(key)
    path.write_text(json.dumps(doc))
