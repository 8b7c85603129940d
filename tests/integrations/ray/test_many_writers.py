"""Many Ray actors writing one shard, on the second node of a two-node cluster (``apps/many_writers_driver.py``).

Two driver processes run over one dump dir: run 1 records, run 2 replays. Each starts a two-node cluster on
this machine (``ray.cluster_utils.Cluster``) and pins eight actors to the second node: four without
``RANK``, which all write shard ``r0`` of the target ``norank``, and four with ``RANK=i``, each writing shard
``r<i>`` of the target ``rank``. Every actor must get its own result in both runs: in run 1 never another
actor's fresh entry, in run 2 its own recording, whatever order the actors' calls arrive in. A real call
leaves a marker file, so run 2 must leave none.

Each driver gets a Ray temp dir of its own (``RAY_TMPDIR``): ``Cluster`` writes its address to
``<temp dir>/ray/ray_current_cluster``, where any ``ray.init()`` without an address run meanwhile on this
machine (another test's driver) would find it and join this cluster instead of starting its own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APPS = Path(__file__).resolve().parent / "apps"
NORANK = tuple(f"nr{i}" for i in range(4))
RANKED = tuple(f"rk{i}" for i in range(4))
ACTORS = NORANK + RANKED
STEPS = (1, 2)
log = logging.getLogger(__name__)


def _run_driver(phase: str, base: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "RAY_ADDRESS", "SKIPWEAVE_RUN", "SKIPWEAVE_PLAN")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(APPS), env.get("PYTHONPATH", "")) if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    ray_tmp = tempfile.mkdtemp(prefix="swmw", dir="/tmp")  # short: Ray's socket paths live under it
    env["RAY_TMPDIR"] = ray_tmp
    out = base / f"{phase}.json"
    before = set(os.listdir(base / "count"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(APPS / "many_writers_driver.py"), phase, str(base / "dump"), str(base / "count"),
             str(out)],
            cwd=str(base), env=env, capture_output=True, text=True, timeout=280,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    (base / f"{phase}.stdout").write_text(proc.stdout)
    (base / f"{phase}.stderr").write_text(proc.stderr)
    assert proc.returncode == 0, f"{phase} driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    report["live_calls"] = sorted(set(os.listdir(base / "count")) - before)
    report["output"] = proc.stdout + proc.stderr
    report["wall_seconds"] = time.perf_counter() - t0
    log.info("%s run: %s", phase, report["seconds"])
    return report


def record_then_replay(base: Path) -> dict[str, Any]:
    """Record in one driver process, then replay in a second one; return both reports."""
    for sub in ("dump", "count"):
        (base / sub).mkdir()
    record = _run_driver("record", base)
    replay = _run_driver("replay", base)
    return {"record": record, "replay": replay, "dump": base / "dump" / "many" / "rollout"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """This module's :func:`record_then_replay`, once for all its tests (under the README's ``-n 2`` the other Ray
    module's chain runs on the other worker meanwhile)."""
    return record_then_replay(tmp_path_factory.mktemp(__name__.rsplit(".", 1)[1]))


def _live_steps(report: dict[str, Any], name: str) -> list[str]:
    return sorted(m.split("-")[1] for m in report["live_calls"] if m.startswith(name + "-"))


@pytest.mark.parametrize("phase", ["record", "replay"])
def test_every_actor_runs_on_the_second_node_with_the_plan(runs: dict[str, Any], phase: str) -> None:
    report = runs[phase]
    nodes = report["nodes"]
    assert nodes["head"] != nodes["second"]
    assert report["driver"]["node"] == nodes["head"]
    for name in ACTORS:
        where = report["where"][name]
        assert where["node"] == nodes["second"], (phase, name)
        assert where["has_plan"], (phase, name)
        assert where["local_rank"] is None, (phase, name)
    assert [report["where"][n]["rank"] for n in ACTORS] == [None] * 4 + ["0", "1", "2", "3"]
    assert len({report["where"][n]["pid"] for n in ACTORS}) == len(ACTORS)  # one worker process per actor
    assert "could not weave" not in report["output"]


def test_the_actors_join_the_drivers_run_and_each_run_is_its_own(runs: dict[str, Any]) -> None:
    record, replay = runs["record"], runs["replay"]
    assert record["driver"]["run"] and replay["driver"]["run"]
    assert record["driver"]["run"] != replay["driver"]["run"]
    for report in (record, replay):
        # SKIPWEAVE_RUN came with the runtime_env that skipweave's ray.init wrapper merged
        assert {report["where"][n]["run"] for n in ACTORS} == {report["driver"]["run"]}


def test_run_1_calls_every_actor_live_and_gives_each_its_own_result(runs: dict[str, Any]) -> None:
    record = runs["record"]
    assert len(record["live_calls"]) == len(ACTORS) * len(STEPS)
    for name in ACTORS:
        assert _live_steps(record, name) == ["s1", "s2"], name
        results = record["results"][name]
        assert [(r["who"], r["step"]) for r in results] == [(name, 1), (name, 2)], name
        assert {r["pid"] for r in results} == {record["where"][name]["pid"]}, name
        counters = record["stats"][name]["counters"]
        assert (counters["misses"], counters["hits"], counters["record_failures"]) == (2, 0, 0), name
    values = [tuple(r["values"]) for name in ACTORS for r in record["results"][name]]
    assert len(set(values)) == len(values)  # 16 fresh samples


@pytest.mark.parametrize("group", [NORANK, RANKED], ids=["no-rank", "rank"])
def test_run_2_replays_each_actors_own_recording_without_a_live_call(
    runs: dict[str, Any], group: tuple[str, ...],
) -> None:
    record, replay = runs["record"], runs["replay"]
    assert [m for m in replay["live_calls"] if m.split("-")[0] in group] == []
    for name in group:
        got, recorded = replay["results"][name], record["results"][name]
        assert [(r["who"], r["step"]) for r in got] == [(name, 1), (name, 2)], name
        assert [r["values"] for r in got] == [r["values"] for r in recorded], name
        assert got == recorded, name  # the recording worker's pid and rank too
        assert replay["where"][name]["pid"] != record["where"][name]["pid"], name  # a fresh worker process
        counters = replay["stats"][name]["counters"]
        assert (counters["hits"], counters["misses"]) == (2, 0), name


def test_the_store_holds_one_entry_per_actor_and_step_in_each_group(runs: dict[str, Any]) -> None:
    dump: Path = runs["dump"]
    record = runs["record"]
    expected = {"norank": (["r0-0000", "r0-0001", "r0-0002", "r0-0003"], NORANK),
                "rank": (["r0-0000", "r1-0000", "r2-0000", "r3-0000"], RANKED)}
    for step in STEPS:
        for target, (stems, group) in expected.items():
            folder = dump / str(step) / target
            names = os.listdir(folder)
            manifests = sorted(n[: -len(".manifest.json")] for n in names if n.endswith(".manifest.json"))
            assert manifests == stems, (step, target)
            assert not [n for n in names if n.startswith(".tmp-")], (step, target)
            tensors = [n for n in names if n.endswith(".safetensors")]
            assert len(tensors) == len(stems), (step, target, tensors)  # no orphaned payload copies
            writers = []
            for stem in stems:
                manifest = json.loads((folder / f"{stem}.manifest.json").read_text())
                assert manifest["step"] == step and manifest["writer"]["run"] == record["driver"]["run"]
                writers.append(manifest["writer"]["pid"])
            # each entry is a different actor's: every recording worker wrote exactly one per step
            assert sorted(writers) == sorted(record["where"][n]["pid"] for n in group), (step, target)
