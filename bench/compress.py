"""Compression of recorded entries (``skip.<role>.compress``): bytes on disk, record and replay seconds per setting.

    python -m bench.compress --mb 64 --rounds 3 --dir /tmp/x

Prints one JSON line. A verl-sized batch (``bench.payload``: int64 token ids, masks and positions, float32 and
bfloat16 log-probs, strings) and a token-ids-only batch (``input_ids`` and ``responses``, what a rollout is mostly
made of) are recorded with each setting through ``StepStore.record`` (encode, compress, write, fsync) and loaded
back with ``StepStore.load`` from a warm page cache (decompress, verify, decode), cases taking turns per round.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from typing import Any

from bench.common import sized_main
from bench.payload import make_batch, sequences_for

SETTINGS = ("none", "zstd:1", "zstd:3")


def _tokens_only(n: int, length: int = 8192) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, 151_000, (n, length), generator=g),
            "responses": torch.randint(0, 151_000, (n, length // 2), generator=g)}


def measure(mb: float, rounds: int, folder: str) -> dict[str, Any]:
    """``{payload: {setting: {"disk_bytes": int, "record_s": [...], "load_s": [...]}}}``."""
    from skipweave.config.values import parse_compress
    from skipweave.store.step_store import StepStore

    n = sequences_for(mb)
    payloads = {"verl batch": make_batch(n), "token ids": _tokens_only(max(1, n))}
    out: dict[str, dict[str, dict[str, Any]]] = {p: {s: {"record_s": [], "load_s": []} for s in SETTINGS}
                                                 for p in payloads}
    for r in range(rounds):
        for pname, obj in payloads.items():
            order = SETTINGS[r % len(SETTINGS):] + SETTINGS[:r % len(SETTINGS)]
            for setting in order:
                canon = parse_compress("compress", setting)
                level = None if canon == "none" else int(canon.split(":")[1])
                root = os.path.join(folder, f"{pname.replace(' ', '_')}-{setting.replace(':', '')}-{r}")
                store = StepStore(root, "default", "rollout", compress=level)
                key = store.key(1, "g", "r0", 0)
                gc.collect()
                t0 = time.perf_counter()
                nbytes = store.record(key, obj, target_path="bench:f", fingerprint="", rng_state=None, seconds=0.0)
                out[pname][setting]["record_s"].append(time.perf_counter() - t0)
                out[pname][setting]["disk_bytes"] = nbytes
                store.load(key)  # warm the page cache
                gc.collect()
                t0 = time.perf_counter()
                store.load(key)
                out[pname][setting]["load_s"].append(time.perf_counter() - t0)
                shutil.rmtree(root, ignore_errors=True)
    return {"cases": out, "mb": mb, "rounds": rounds, "settings": list(SETTINGS)}


if __name__ == "__main__":
    sized_main(__doc__, measure, mb=64.0)
