"""Start-up costs: importing skipweave, weaving 20 targets, and a minimal Hydra app with and without skipweave.

    python -m bench.startup [--runs 15] [--procs 5]

Prints one JSON line. The Hydra app is run as a fresh process per measurement, the variants taking turns:

* ``without``: skipweave made invisible to the interpreter (its editable-install finder removed and a
  finder refusing ``skipweave*`` / ``hydra_plugins.skipweave_searchpath`` put first), i.e. not installed;
* ``installed``: skipweave installed, no profile selected (Hydra finds and runs its search-path plugin);
* ``profile``: ``+skip=rollout_cache`` selected (the callback imports skipweave and weaves);
* ``torch_without`` / ``torch_profile`` (``--torch-app``): the same app importing torch first, as every
  trainer does, without skipweave and with the profile: the profile's cost when torch is paid anyway.

Each process reports the seconds from the first line of its launcher to the end of the app (interpreter
start-up, identical in all variants, is left out); the wall time and the CPU time (user + system) of the
whole process are kept too. Variants run back to back in every round, so differences can be paired.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from bench.common import emit

LAUNCHER = r'''
import time
T0 = time.perf_counter()
import importlib.abc, importlib.util, json, os, runpy, sys

MODE, OUT, APP = sys.argv[1], sys.argv[2], sys.argv[3]


class _Hide(importlib.abc.MetaPathFinder):
    """Refuse skipweave's modules, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "skipweave" or name.startswith("skipweave.") or name == "hydra_plugins.skipweave_searchpath":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if MODE == "without":
    sys.meta_path[:] = [f for f in sys.meta_path if "skipweave" not in (getattr(f, "__module__", "") or "")]
    sys.path_hooks[:] = [h for h in sys.path_hooks if "skipweave" not in (getattr(h, "__module__", "") or "")]
    # Only the entries that hold skipweave itself: a checkout in a folder named "skipweave" keeps its .venv
    # (and the site-packages with hydra in it) on the path.
    sys.path[:] = [p for p in sys.path if not os.path.isfile(os.path.join(p or ".", "skipweave", "__init__.py"))
                   and not os.path.isdir(os.path.join(p or ".", "hydra_plugins", "skipweave_searchpath"))]
    sys.path_importer_cache.clear()
    sys.meta_path.insert(0, _Hide())


def _report():
    data = {"seconds": time.perf_counter() - T0, "mode": MODE,
            "plugin_loaded": "hydra_plugins.skipweave_searchpath" in sys.modules,
            "skipweave_loaded": "skipweave" in sys.modules, "torch_loaded": "torch" in sys.modules}
    with open(OUT, "w") as fh:
        json.dump(data, fh)


sys.argv = [APP] + sys.argv[4:]
try:
    runpy.run_path(APP, run_name="__main__")
except SystemExit as exc:
    if exc.code not in (None, 0):
        raise
_report()
'''

APP = '''
import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    assert cfg.lr > 0


if __name__ == "__main__":
    main()
'''

HOST20 = "\n".join(
    [f"def f{i}(batch):\n    return batch\n" for i in range(10)]
    + [f"class C{i}:\n    def run(self, batch):\n        return batch\n" for i in range(10)]
)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["HYDRA_FULL_ERROR"] = "1"
    return env


def hydra_app(runs: int, work: str, torch_app: bool = False) -> dict[str, Any]:
    """Time the minimal Hydra app in its variants, ``runs`` times each, taking turns."""
    app_dir = os.path.join(work, "app")
    os.makedirs(os.path.join(app_dir, "conf"), exist_ok=True)
    with open(os.path.join(app_dir, "app.py"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(APP))
    with open(os.path.join(app_dir, "torch_app.py"), "w", encoding="utf-8") as fh:
        fh.write("import torch  # noqa: F401 - a trainer imports torch before Hydra starts\n" + textwrap.dedent(APP))
    with open(os.path.join(app_dir, "conf", "config.yaml"), "w", encoding="utf-8") as fh:
        fh.write("lr: 0.1\nname: minimal\n")
    launcher = os.path.join(work, "launch.py")
    with open(launcher, "w", encoding="utf-8") as fh:
        fh.write(LAUNCHER)
    dump = os.path.join(work, "dump")
    profile = ["+skip=rollout_cache", f"skip.rollout.dump_dir={dump}"]
    variants: dict[str, list[str]] = {"without": [], "installed": [], "profile": profile}
    if torch_app:
        variants.update({"torch_without": [], "torch_profile": profile})
    out: dict[str, Any] = {k: {"seconds": [], "wall": [], "cpu": []} for k in variants}
    env = _clean_env()
    warmup = 1 if runs > 1 else 0
    for i in range(runs + warmup):  # the first round warms the file cache and is dropped
        for mode, extra in variants.items():
            result = os.path.join(work, f"{mode}.json")
            app = os.path.join(app_dir, "torch_app.py" if mode.startswith("torch") else "app.py")
            cmd = [sys.executable, launcher, "without" if mode.endswith("without") else "with", result, app,
                   f"hydra.run.dir={work}/out/{mode}", "hydra.output_subdir=null", *extra]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if proc.returncode != 0:
                raise RuntimeError(f"hydra app ({mode}) failed:\n{proc.stderr[-2000:]}")
            with open(result, encoding="utf-8") as fh:
                data = json.load(fh)
            out[mode]["loaded"] = {k: data[k] for k in ("plugin_loaded", "skipweave_loaded", "torch_loaded")}
            if i < warmup:
                continue
            out[mode]["seconds"].append(data["seconds"])
            out[mode]["wall"].append(wall)
            out[mode]["cpu"].append(cpu)
    return out


def import_and_weave(procs: int, runs: int, work: str) -> dict[str, Any]:
    """Seconds of ``import skipweave`` (fresh process) and of weaving / unweaving 20 targets."""
    host_dir = os.path.join(work, "host")
    os.makedirs(host_dir, exist_ok=True)
    with open(os.path.join(host_dir, "bench_host20.py"), "w", encoding="utf-8") as fh:
        fh.write(HOST20)
    code = textwrap.dedent(f'''
        import json, sys, time
        sys.path.insert(0, {host_dir!r})
        import bench_host20
        t0 = time.perf_counter()
        import skipweave
        t_import = time.perf_counter() - t0
        torch_after_import = "torch" in sys.modules
        targets = {{f"f{{i}}": f"bench_host20.f{{i}}" for i in range(10)}}
        targets.update({{f"c{{i}}": f"bench_host20.C{{i}}.run" for i in range(10)}})
        plan = {{"skip": {{"rollout": {{"enable": True, "dump_dir": {os.path.join(work, "dump")!r},
                                       "targets": targets}}}}}}
        t0 = time.perf_counter()
        patches = skipweave.weave(plan)
        t_first = time.perf_counter() - t0
        assert sum(not p.pending for p in patches) == 20, patches
        weave, unweave = [], []
        for _ in range({max(3, runs)}):
            t0 = time.perf_counter()
            skipweave.unweave()
            unweave.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            skipweave.weave(plan)
            weave.append(time.perf_counter() - t0)
        skipweave.unweave()
        print(json.dumps({{"import": t_import, "first_weave": t_first, "weave": weave, "unweave": unweave,
                          "torch_after_import": torch_after_import, "torch_after_weave": "torch" in sys.modules}}))
    ''')
    env = _clean_env()
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = []
    for _ in range(procs):
        proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"weave benchmark failed:\n{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "import": [r["import"] for r in results],
        "first_weave": [r["first_weave"] for r in results],
        "weave": [w for r in results for w in r["weave"]],
        "unweave": [w for r in results for w in r["unweave"]],
        "torch_after_import": results[0]["torch_after_import"],
        "torch_after_weave": results[0]["torch_after_weave"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="Hydra app runs per variant")
    parser.add_argument("--procs", type=int, default=5, help="fresh processes importing skipweave and weaving")
    parser.add_argument("--skip-hydra", action="store_true")
    parser.add_argument("--torch-app", action="store_true", help="also time an app that imports torch itself")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="skipweave-bench-startup-") as work:
        out: dict[str, Any] = {"weave": import_and_weave(args.procs, args.runs, work)}
        if not args.skip_hydra:
            try:
                out["hydra"] = hydra_app(args.runs, work, torch_app=args.torch_app)
            except (RuntimeError, ImportError, OSError) as exc:
                out["hydra_error"] = str(exc)
    emit(out)


if __name__ == "__main__":
    main()
