"""A dump dir that is another folder on another Ray node: warned about, refused with ``require_shared``, and quiet when
it is one folder (``apps/shared_path_driver.py``).

One driver process starts a two-node cluster on this machine whose second node sees another folder at the dump dir
paths under ``/proc/self/cwd/`` (each process resolves them against its working folder, which Ray workers take from
their node's raylet: ``BASE/head`` for the head and the driver, ``BASE/node2`` for the second node) -- what
verl's ``~/.verl/rollout_dump`` is on a real cluster, where that one path is a local disk on every node. One job
pins an actor to each node; each calls the woven target of three roles at steps 1 and 2: ``local``
(``/proc/self/cwd/dump``, defaults), ``required`` (``/proc/self/cwd/dump_strict``, ``require_shared: true``) and
``shared`` (``BASE/shared``, one folder for all). A real call leaves a marker file in a folder both nodes share.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from skipweave.config.errors import ConfigError
from skipweave.env import SHARED_MARKS_ENV
from skipweave.integrations.ray.driver import leave_shared_marks, merge_runtime_env
from skipweave.store.identity import run_id

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APPS = Path(__file__).resolve().parent / "apps"
NOT_SHARED = "is not the folder the driver uses"
LOCAL, STRICT = "/proc/self/cwd/dump", "/proc/self/cwd/dump_strict"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the driver once; its report, with the base folder and the driver's output."""
    base = tmp_path_factory.mktemp("shared_path")
    for sub in ("head", "node2", "shared", "markers"):
        (base / sub).mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "RAY_ADDRESS", "SKIPWEAVE_RUN", "SKIPWEAVE_PLAN")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(APPS), env.get("PYTHONPATH", "")) if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    ray_tmp = tempfile.mkdtemp(prefix="swsp", dir="/tmp")  # short (Ray's socket paths), and no other test's cluster
    env["RAY_TMPDIR"] = ray_tmp
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(APPS / "shared_path_driver.py"), str(base), str(base / "out.json")],
                              cwd=str(base / "head"), env=env, capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, f"driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out: dict[str, Any] = json.loads((base / "out.json").read_text())
    out["base"], out["output"], out["wall_seconds"] = base, proc.stdout + proc.stderr, time.perf_counter() - t0
    return out


def _ours(lines: list[str], dump_dir: str) -> list[str]:
    return [line for line in lines if NOT_SHARED in line and f"dump_dir {dump_dir} " in line]


def _steps(calls: list[dict[str, Any]]) -> list[int]:
    return [c["result"]["step"] for c in calls if "result" in c]


def test_the_two_nodes_see_two_folders_at_one_path(report: dict[str, Any]) -> None:
    base: Path = report["base"]
    assert report["head"]["node"] == report["driver"]["node"] == report["nodes"]["head"]
    assert report["node2"]["node"] == report["nodes"]["node2"] != report["nodes"]["head"]
    assert (report["head"]["cwd"], report["node2"]["cwd"]) == (str(base / "head"), str(base / "node2"))


def test_a_worker_on_the_other_node_warns_once_naming_the_path_the_node_and_what_to_set(
        report: dict[str, Any]) -> None:
    assert _ours(report["head"]["warnings"], LOCAL) == []  # the driver's node: its folder
    [line] = _ours(report["node2"]["warnings"], LOCAL)  # one line for both calls: once per process and dump dir
    node = report["nodes"]["node2"]
    for part in (f"({node[:12]})", f"pid={report['node2']['pid']}", "skip.local.dump_dir",
                 "skip.local.require_shared: true", "the folder does not exist here"):
        assert part in line, (part, line)
    # the calls still ran and recorded -- where the driver never looks, which is what the warning is about
    assert _steps(report["node2"]["calls"]["local"]) == [1, 2]
    base: Path = report["base"]
    entry = Path("default", "local", "1", "gen", "r1-0000.manifest.json")  # node2's actor has RANK 1
    assert (base / "node2" / "dump" / entry).is_file()
    assert not (base / "head" / "dump" / entry).exists()
    assert (base / "head" / "dump" / entry.with_name("r0-0000.manifest.json")).is_file()  # the head actor's
    mark = Path(".runs") / report["driver"]["run"] / ".shared.json"
    assert (base / "head" / "dump" / mark).is_file()  # the driver's mark: on its side only
    assert not (base / "node2" / "dump" / mark).exists()


def test_require_shared_fails_the_call_on_the_other_node_in_the_driver_before_the_target_runs(
        report: dict[str, Any]) -> None:
    calls = report["node2"]["calls"]["required"]
    assert [c.get("error") for c in calls] == ["RayTaskError(DumpDirNotShared)"] * 2  # every call, not the first
    assert all(c["not_shared"] for c in calls)  # the driver's ray.get raises a skipweave.DumpDirNotShared
    for part in (f"dump_dir {STRICT} ", f"({report['nodes']['node2'][:12]})", "skip.required.dump_dir",
                 "skip.required.require_shared is true, so the call did not run"):
        assert part in calls[0]["message"], (part, calls[0]["message"])
    assert [m for m in report["markers"] if m.startswith("required-node2-")] == []  # its body never ran there
    assert _steps(report["head"]["calls"]["required"]) == [1, 2]  # on the driver's node it works as ever
    assert _ours(report["head"]["warnings"] + report["node2"]["warnings"], STRICT) == []  # an error, not a warning
    assert _steps(report["node2"]["calls"]["local"]) == [1, 2]  # the same worker's other roles are unaffected


def test_a_dump_dir_shared_by_both_nodes_gives_no_warning(report: dict[str, Any]) -> None:
    shared = str(report["base"] / "shared")
    for name in ("head", "node2"):
        assert _steps(report[name]["calls"]["shared"]) == [1, 2], name
        assert [line for line in report[name]["warnings"] if shared in line] == [], name
    assert len([m for m in report["markers"] if m.startswith("shared-")]) == 4


def test_ls_and_verify_ignore_the_mark_and_gc_removes_it_with_the_ended_run(report: dict[str, Any]) -> None:
    dump = report["base"] / "head" / "dump"
    mark = dump / ".runs" / report["driver"]["run"] / ".shared.json"
    assert mark.is_file()
    cli = [sys.executable, "-m", "skipweave.cli"]
    for command in (["ls", str(dump), "--json"], ["verify", str(dump)]):
        proc = subprocess.run(cli + command, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        assert ".shared.json" not in proc.stdout + proc.stderr, command
    proc = subprocess.run(cli + ["gc", str(dump), "--yes", "--min-age", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert not mark.exists()  # the driver wrote at its exit that the run ended


def _plan(dump: Path, **role: Any) -> str:
    return json.dumps({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "targets": {"g": "os:getcwd"},
                                            **role}}})


def test_the_driver_hands_its_run_and_tokens_to_the_workers_with_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "dump")
    marks = leave_shared_marks(plan)
    env = merge_runtime_env({"env_vars": {"A": "1"}}, plan, shared_marks=marks)["env_vars"]
    assert json.loads(env[SHARED_MARKS_ENV]) == {"run": run_id(), "tokens": marks}
    [(dump_dir, token)] = marks.items()
    mark = json.loads((Path(dump_dir) / ".runs" / run_id() / ".shared.json").read_text())
    assert dump_dir == str(tmp_path / "dump") and mark["token"] == token


def test_require_shared_with_a_dump_dir_the_driver_cannot_mark_fails_before_ray_init(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (dump / ".runs").symlink_to(tmp_path / "elsewhere")  # a crafted dump dir: never written through
    with pytest.raises(ConfigError, match="skip.rollout.require_shared=True .*can leave its mark in"):
        leave_shared_marks(_plan(dump, require_shared=True))
    assert leave_shared_marks(_plan(dump)) == {}  # without it: not checked, and said so
    assert "cannot check that it is the folder they use" in caplog.text
    assert os.listdir(tmp_path / "elsewhere") == []
