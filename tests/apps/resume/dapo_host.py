"""A DAPO-shaped trainer for the exit-status tests: imports nothing from skipweave.

Steps ``first..last``; step ``s`` makes ``1 + s % 3`` rollout calls (DAPO's dynamic sampling draws again until the
batch is full), each returning a DataProto-like batch: tensors, a numpy object array of uids and a meta dict.
``REAL`` counts the generations that really ran; :func:`result` prints them with a digest of every result.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import torch

REAL: list[int] = []
PREFETCHED: list[Proto] = []  # what the prefetching threads hand back (see keep_generating)
DIGESTS: dict[str, str] = {}
_lock = threading.Lock()


class Proto:
    def __init__(self, batch: dict, non_tensor_batch: dict, meta_info: dict) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info


class Rollout:
    def generate_sequences(self, prompts: Proto) -> Proto:
        step = prompts.meta_info["global_steps"]
        if prompts.meta_info.get("prefetch"):
            ready = PREFETCHED[0]
            return Proto(dict(ready.batch), dict(ready.non_tensor_batch), {"global_steps": step})
        with _lock:
            REAL.append(step)
        n = 64
        g = torch.Generator().manual_seed(step * 7 + len(prompts.non_tensor_batch["uid"]))
        return Proto(
            {"responses": torch.randint(0, 1000, (n, 256), generator=g), "attention_mask": torch.ones(n, 512),
             "old_log_probs": torch.randn(n, 256, generator=g)},
            {"uid": np.array([f"u{step}-{i}" for i in range(n)], dtype=object)},
            {"global_steps": step, "timing": {"gen": 0.5}},
        )


def digest(out: Proto) -> str:
    h = hashlib.sha256()
    for name in sorted(out.batch):
        h.update(name.encode())
        h.update(out.batch[name].numpy().tobytes())
    h.update(json.dumps(out.non_tensor_batch["uid"].tolist()).encode())
    # (skipweave's own note of hit or miss, meta_info["skipweave"], is no part of the result)
    h.update(json.dumps({k: v for k, v in out.meta_info.items() if k != "skipweave"}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def step(rollout: Rollout, s: int) -> None:
    """One training step: its rollout calls, then a little work on each result (as reward and update would)."""
    for k in range(1 + s % 3):
        prompts = Proto({}, {"uid": np.array(["p"] * (k + 1), dtype=object)}, {"global_steps": s})
        out = rollout.generate_sequences(prompts)
        out.batch["responses"].float().mean()
        with _lock:
            DIGESTS[f"{s}.{k}"] = digest(out)


def train(first: int, last: int) -> None:
    rollout = Rollout()
    for s in range(first, last + 1):
        step(rollout, s)


def train_in_threads(first: int, last: int, threads: int) -> None:
    """Steps spread over ``threads`` non-daemon threads, which the caller does not join: they still record while
    the main thread returns and the interpreter shuts down."""
    rollout = Rollout()
    for t in range(threads):
        mine = [s for s in range(first, last + 1) if s % threads == t]
        threading.Thread(target=lambda mine=mine: [step(rollout, s) for s in mine], name=f"host-{t}").start()


def keep_generating(first: int) -> None:
    """Daemon threads the caller never stops: each calls the rollout without pause (steps ``first``, ``first``
    + 1, ..., none of the main thread's) until the interpreter ends it, as a host's background prefetcher would.
    Their calls do no torch work of their own (they hand back a batch made once, here): an unwoven process then
    always exits 0, so any abort is skipweave's (recording their results). What they generate is theirs: no digest,
    no count."""
    rollout = Rollout()
    n = 64
    PREFETCHED.append(Proto({"responses": torch.zeros(n, 256, dtype=torch.long), "attention_mask": torch.ones(n, 512)},
                            {"uid": np.array([f"d{i}" for i in range(n)], dtype=object)}, {}))

    def loop(t: int) -> None:
        for i in range(1_000_000):
            s = first + 2 * i + t
            rollout.generate_sequences(Proto({}, {"uid": np.array(["d"], dtype=object)},
                                             {"global_steps": s, "prefetch": True}))

    for t in range(2):
        threading.Thread(target=loop, args=(t,), name=f"prefetch-{t}", daemon=True).start()


def result() -> None:
    """Print what this process generated for real and the digest of every result it got."""
    with _lock:
        print("RESULT " + json.dumps({"real": len(REAL), "digests": DIGESTS}), flush=True)
