"""``skipweave view``'s build time, page size and peak memory: the main job's store, and a synthetic 200 x 512 store.

    python -m bench.view [--steps 200] [--samples 512] [--prompt 64] [--response 128] [--dir DIR]
                         [--main-store DIR] [--shown 8,64]

The synthetic store is :mod:`bench.export`'s (a verl-shaped rollout batch of ``--samples`` samples per step, recorded
through ``StepStore.record``); the main job's store is ``--main-store``, else the newest ``/tmp/tiny_grpo_compare_*/
dump`` the README's main job leaves, else one recording run of ``examples/tiny_grpo/train.py``. Each store's page is
built with each ``--shown`` value as ``--samples`` (samples per step in the browser), then once more as a diff of the
store against itself (every entry compared, the diff section added), each in a child process of its own: its wall
time, the build time the command reports (without the interpreter's start and imports), its peak resident memory
(``ru_maxrss``, from ``os.wait4``) and the page's size. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import ROOT, child_env, emit
from bench.export import main_store, make_store, store_mb

_BUILT = re.compile(r"in ([0-9.]+) s$", re.M)


def measure(dump: str, out: str, shown: int, diff: bool) -> dict[str, Any]:
    """Run ``skipweave view DUMP [DUMP] -o OUT --samples SHOWN`` in a child; its times, peak RSS and page size."""
    cmd = [sys.executable, "-m", "skipweave.cli", "view", dump, *([dump] if diff else []), "-o", out,
           "--samples", str(shown)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=str(ROOT))
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}: {stderr[-2000:]}")
    found = _BUILT.search(stdout)
    if found is None:
        raise RuntimeError(f"no build time in the output of {' '.join(cmd)}: {stdout[-500:]}")
    return {"shown": shown, "diff": diff, "seconds": seconds, "build_s": float(found.group(1)),
            "peak_rss_mb": usage.ru_maxrss / 1024, "page_mb": os.path.getsize(out) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--dir", default=None, help="where the synthetic store and pages go (removed at the end)")
    parser.add_argument("--main-store", default=None)
    parser.add_argument("--shown", default="8,64", help="--samples values to build each page with")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="skipweave-bench-view-", dir=args.dir)
    rows: list[dict[str, Any]] = []
    try:
        synthetic = os.path.join(work, "dump")
        record_s = make_store(synthetic, args.steps, args.samples, args.prompt, args.response)
        stores = {f"synthetic {args.steps} steps x {args.samples} samples": synthetic,
                  "main job (tiny_grpo)": main_store(args.main_store, work)}
        shown = [int(x) for x in args.shown.split(",")]
        for name, dump in stores.items():
            for n, diff in [*((n, False) for n in shown), (shown[0], True)]:
                out = os.path.join(work, "page.html")
                rows.append({"store": name, "dump": dump, "store_mb": store_mb(dump),
                             "entries": sum(1 for b, _, names in os.walk(dump) for x in names
                                            if x.endswith(".manifest.json") and ".runs" not in b),
                             **measure(dump, out, n, diff)})
                os.unlink(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"synthetic store recorded in {record_s:.1f} s")
    print(f"{'store':<40}{'store MB':>9}{'samples':>8}{'diff':>6}{'page MB':>9}{'build s':>9}{'process s':>10}"
          f"{'peak RSS MB':>13}")
    for r in rows:
        print(f"{r['store']:<40}{r['store_mb']:>9.1f}{r['shown']:>8}{'yes' if r['diff'] else 'no':>6}"
              f"{r['page_mb']:>9.2f}{r['build_s']:>9.2f}{r['seconds']:>10.2f}{r['peak_rss_mb']:>13.0f}")
    emit({"record_s": record_s, "rows": rows})


if __name__ == "__main__":
    main()
