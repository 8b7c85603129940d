"""``skipweave export``'s time and peak memory: a synthetic DataProto-shaped store, and the main job's store.

    python -m bench.export [--steps 200] [--samples 512] [--prompt 64] [--response 128] [--dir DIR]
                           [--main-store DIR] [--formats parquet,jsonl]

The synthetic store is recorded through the store's own writer (``StepStore.record``, one entry per step, as a
rollout role records it): ``--steps`` steps of one verl-shaped rollout batch of ``--samples`` samples (left-padded
``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``response_mask`` as int64, ``old_log_probs`` and
``ref_log_probs`` as float32, per-sample ``token_level_scores``; ``uid`` and two reward-extra columns in
``non_tensor_batch``; ``meta_info``). The main job's store is ``--main-store``, else the newest
``/tmp/tiny_grpo_compare_*/dump`` the README's main job leaves (``examples/tiny_grpo/compare.py``), else one recording
run of ``examples/tiny_grpo/train.py`` with every phase recorded.

Each export runs ``skipweave export`` in a child process of its own; its wall time and its peak resident memory
(``ru_maxrss`` of that child, from ``os.wait4``) are reported beside the store's size and the output's; ``export s`` is
the export's own time as it reports it (``--json``), without the interpreter's start and imports. Prints a table, then
one JSON line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import ROOT, child_env, emit

HOST = '''
import numpy as np
import torch


class Batch:
    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


def rollout(step, n, p, r):
    g = torch.Generator().manual_seed(step)
    prompt_len = torch.randint(1, p + 1, (n,), generator=g)
    response_len = torch.randint(1, r + 1, (n,), generator=g)
    prompt_mask = (torch.arange(p)[None, :] >= (p - prompt_len)[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < response_len[:, None]).long()
    prompts = torch.randint(3, 32000, (n, p), generator=g) * prompt_mask
    responses = torch.randint(3, 32000, (n, r), generator=g) * response_mask
    return Batch(
        batch={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
               "attention_mask": torch.cat([prompt_mask, response_mask], 1), "response_mask": response_mask,
               "old_log_probs": -torch.rand((n, r), generator=g) * response_mask,
               "ref_log_probs": -torch.rand((n, r), generator=g) * response_mask,
               "token_level_scores": torch.rand((n,), generator=g)},
        non_tensor_batch={"uid": np.array([f"{step}-{i // 8}" for i in range(n)], dtype=object),
                          "acc": np.array([float(i % 2) for i in range(n)], dtype=object),
                          "pred": np.array([str(i % 10) for i in range(n)], dtype=object)},
        meta_info={"global_steps": step, "temperature": 1.0, "timing": {"gen": 1.0}},
    )
'''


def make_store(dump: str, steps: int, samples: int, prompt: int, response: int) -> float:
    """Record the synthetic store into ``dump``; returns the seconds it took."""
    sys.path.insert(0, os.path.dirname(dump))
    with open(os.path.join(os.path.dirname(dump), "bench_export_host.py"), "w", encoding="utf-8") as fh:
        fh.write(HOST)
    import bench_export_host as host  # type: ignore[import-not-found]

    from skipweave.integrations.discovery import load_integrations
    from skipweave.store.step_store import StepStore

    load_integrations()  # the DataProto shape: as a run records it
    started = time.perf_counter()
    store = StepStore(dump, "default", "rollout")
    for step in range(1, steps + 1):
        store.record(store.key(step, "gen", "r0", 0), host.rollout(step, samples, prompt, response),
                     target_path="bench_export_host:Rollout.generate_sequences", fingerprint="", rng_state=None,
                     seconds=1.0)
        store.close_part(step, "gen", "r0")
    store.close_all()
    return time.perf_counter() - started


def main_store(given: str | None, work: str) -> str:
    """The main job's dump dir: ``given``, the newest compare.py left in /tmp, or one recording run's."""
    if given:
        return given
    found = sorted(glob.glob(os.path.join(tempfile.gettempdir(), "tiny_grpo_compare_*", "dump")),
                   key=os.path.getmtime)
    if found:
        return found[-1]
    dump = os.path.join(work, "main_dump")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, str(ROOT / "examples" / "tiny_grpo" / "train.py"),
                    "+skip=[rollout_cache,ref_cache,reward_cache]", f"skip.rollout.dump_dir={dump}",
                    f"hydra.run.dir={os.path.join(work, 'main_run')}"], cwd=str(ROOT), env=env, check=True,
                   capture_output=True, timeout=1800)
    return dump


def measure(dump: str, out: str, fmt: str) -> dict[str, Any]:
    """Run ``skipweave export DUMP -o OUT --format FMT`` in a child; its wall seconds and peak RSS."""
    cmd = [sys.executable, "-m", "skipweave.cli", "export", dump, "-o", out, "--format", fmt, "--json"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=str(ROOT))
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}: {stderr[-2000:]}")
    doc = json.loads(stdout)
    return {"format": fmt, "seconds": seconds, "export_s": doc["seconds"], "peak_rss_mb": usage.ru_maxrss / 1024,
            "output_mb": os.path.getsize(out) / 1e6, "rows": doc["rows"], "calls": doc["calls"],
            "columns": len(doc["columns"]), "passes": doc["passes"]}


def store_mb(dump: str) -> float:
    return sum(os.path.getsize(os.path.join(b, n)) for b, _, names in os.walk(dump) for n in names) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--dir", default=None, help="where the synthetic store and outputs go (removed at the end)")
    parser.add_argument("--main-store", default=None)
    parser.add_argument("--formats", default="parquet,jsonl")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="skipweave-bench-export-", dir=args.dir)
    rows: list[dict[str, Any]] = []
    try:
        synthetic = os.path.join(work, "dump")
        record_s = make_store(synthetic, args.steps, args.samples, args.prompt, args.response)
        stores = {f"synthetic {args.steps} steps x {args.samples} samples (prompt {args.prompt}, response "
                  f"{args.response})": synthetic, "main job (tiny_grpo)": main_store(args.main_store, work)}
        for name, dump in stores.items():
            for fmt in args.formats.split(","):
                out = os.path.join(work, f"out.{fmt}")
                row = {"store": name, "dump": dump, "store_mb": store_mb(dump), **measure(dump, out, fmt)}
                os.unlink(out)
                rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"synthetic store recorded in {record_s:.1f} s")
    print(f"{'store':<62}{'format':>8}{'rows':>8}{'store MB':>10}{'out MB':>9}{'export s':>9}{'process s':>10}"
          f"{'peak RSS MB':>13}")
    for r in rows:
        print(f"{r['store']:<62}{r['format']:>8}{r['rows']:>8}{r['store_mb']:>10.1f}{r['output_mb']:>9.1f}"
              f"{r['export_s']:>9.2f}{r['seconds']:>10.2f}{r['peak_rss_mb']:>13.0f}")
    emit({"record_s": record_s, "rows": rows})


if __name__ == "__main__":
    main()
