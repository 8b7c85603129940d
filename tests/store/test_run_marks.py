"""A run's marks (``.runs/{run}``) outlive it only when it recorded: each scenario is a real process that weaves,
calls, maybe starts or forks another process of its run, and exits (the cleanup runs at its exit, after its summary).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

HOST = '''
def gen(step):
    return {"step": step, "ids": list(range(step, step + 4))}
'''

SCRIPT = '''
import logging, os, subprocess, sys
sys.path.insert(0, {folder!r})
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
import skipweave, {name} as host
dump, what = sys.argv[1], sys.argv[2]
role = {{"enable": True, "dump_dir": dump, "targets": {{"gen": "{name}:gen"}}}}
if what.endswith("bypassed"):
    role["steps"] = [100]  # every call of step 1 runs live, unrecorded
skipweave.weave({{"skip": {{"rollout": role}}}})
skipweave.set_step(1)
run = os.environ["SKIPWEAVE_RUN"]
if what.startswith("child-"):  # another process of this run makes the call (a Ray worker, a subprocess)
    subprocess.run([sys.executable, __file__, dump, what[len("child-"):]], check=True)
elif what == "fork-bypassed":  # a forked child that ends with sys.exit: its exit steps run, and must not clean up
    pid = os.fork()
    if pid == 0:
        host.gen(1)
        sys.exit(0)
    os.waitpid(pid, 0)
    print("AFTER-FORK", os.path.isdir(os.path.join(dump, ".runs", run)))
else:
    host.gen(1)
print("RUN", run)
'''


def _run(tmp_path: Path, folder: Path, name: str, dump: Path, what: str) -> tuple[str, str, str]:
    """Run one scenario in a fresh process; return (its run id, stdout, stderr)."""
    script = tmp_path / "drive.py"
    script.write_text(SCRIPT.format(folder=str(folder), name=name))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPWEAVE_")}
    proc = subprocess.run([sys.executable, str(script), str(dump), what], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    runs = re.findall(r"^RUN (\w+)$", proc.stdout, re.M)
    return runs[-1], proc.stdout, proc.stderr  # the last line is the driver's (a child prints first)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, str, str]]:
    """scenario -> (dump dir, run id, stdout, stderr); a replay needs its recording, so that one runs first."""
    folder = tmp_path_factory.mktemp("marks_host")
    name = f"marks_host_{os.getpid()}"
    (folder / f"{name}.py").write_text(HOST)
    shared = tmp_path_factory.mktemp("shared") / "dump"
    recorded = _run(tmp_path_factory.mktemp("record"), folder, name, shared, "record")
    plan = {"replay": (shared, "replay"), "bypassed": (None, "bypassed"), "child-bypassed": (None, "child-bypassed"),
            "child-record": (None, "child-record"), "fork-bypassed": (None, "fork-bypassed")}
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        futures = {}
        for key, (dump, what) in plan.items():
            tmp = tmp_path_factory.mktemp(key)
            dump = dump or tmp / "dump"
            futures[key] = (dump, pool.submit(_run, tmp, folder, name, dump, what))
        out = {key: (dump, *f.result()) for key, (dump, f) in futures.items()}
    return {"record": (shared, *recorded), **out}


def _left(dump: Path, run: str) -> Path:
    return dump / ".runs" / run


def test_a_run_that_recorded_nothing_leaves_no_marks(scenarios: dict[str, Any]) -> None:
    for key in ("bypassed", "replay", "child-bypassed", "fork-bypassed"):
        dump, run, out, err = scenarios[key]
        assert not _left(dump, run).exists(), (key, err)
    assert "skipweave hit" in scenarios["replay"][3]  # it replayed the recording run's entry
    assert "AFTER-FORK True" in scenarios["fork-bypassed"][2]  # the forked child's exit did not clean up


def test_the_cleanup_runs_after_the_summary_that_reads_the_marks(scenarios: dict[str, Any]) -> None:
    _, _, _, err = scenarios["child-bypassed"]  # the driver called nothing: only its child's marks say it was called
    assert "never called" not in err and err.count("none of its calls was eligible") == 2, err


def test_a_run_that_recorded_keeps_its_marks_until_gc_which_knows_it_ended(scenarios: dict[str, Any]) -> None:
    for key in ("record", "child-record"):  # recorded by the first process, or only by another process of the run
        dump, run, out, err = scenarios[key]
        folder = _left(dump, run)
        assert (folder / "default" / "rollout" / "gen.recorded").exists(), (key, err)
        owner = json.loads((folder / ".owner.json").read_text())
        assert owner["ended_unix"] is not None and owner["pid"] != os.getpid()
        proc = subprocess.run([str(Path(sys.executable).parent / "skipweave"), "gc", str(dump), "--yes", "--min-age",
                               "0", "--json"], capture_output=True, text=True, timeout=120)
        doc = json.loads(proc.stdout)
        removed = [a for a in doc["actions"] if a["kind"] == "run_marks"]
        assert [(a["where"], a["outcome"]) for a in removed] == [(f"run {run}", "removed")], doc
        assert "wrote at its exit" in removed[0]["reason"] and not folder.exists()
