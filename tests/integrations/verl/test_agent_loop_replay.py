"""Record then replay verl's real ``AgentLoopManager.generate_sequences`` in two processes.

Each process runs ``apps/agent_loop_app.py``: verl's ``ppo_trainer`` config with ``+skip=rollout_cache``,
skipweave's Hydra callback, verl's ``SkipManager``, and the real manager with fake Ray workers; steps
called plainly and awaited, validation calls in between. Needs verl (CI installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

APP = Path(__file__).resolve().parent / "apps" / "agent_loop_app.py"
REPO = Path(__file__).resolve().parents[3]


def _run(dump: Path, profile: str = "rollout_cache") -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k not in {"SKIPWEAVE_PLAN", "HYDRA_FULL_ERROR", "PYTHONSTARTUP"}}
    proc = subprocess.run([sys.executable, str(APP), str(dump), profile], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    return json.loads(lines[0][len("REPORT "):]), proc.stderr


def test_record_then_replay_in_two_processes_plain_and_awaited(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    first, log1 = _run(dump)
    # Runs 2 and 3 only read run 1's recordings: they run side by side, run 3 on a copy of the store as run 1
    # left it (run 2 may write validation entries again).
    shutil.copytree(dump, tmp_path / "dump3", symlinks=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        replay_only = pool.submit(_run, tmp_path / "dump3", "rollout_replay")
        second, _ = _run(dump)
        third, _ = replay_only.result()

    assert first["callback"] == "skipweave.integrations.hydra.callback.SkipweaveCallback"
    assert first["plan_namespace"] == "exp_proj.GBS2_N2_in4_out3"
    assert "verl role 'rollout' is recorded and replayed by skipweave (skip.rollout)" in log1
    assert first["verl_skip_enabled"]["rollout"] is False  # exactly one mechanism on the role

    # Run 1 generated every step (two fake workers each) and recorded it; validation ran live, recorded apart.
    assert [s["status"] for s in first["steps"]] == ["miss", "miss", "miss"]
    assert [(c["step"], c["validate"]) for c in first["worker_calls"]] == [
        (0, True), (0, True), (1, False), (1, False), (2, False), (2, False), (2, True), (2, True),
        (3, False), (3, False)]
    role_dir = dump / first["plan_namespace"] / "rollout"
    assert sorted(p.name for p in role_dir.iterdir()) == ["0", "1", "2", "3"]
    assert sorted(p.name for p in role_dir.glob("*/*/*.manifest.json")) == [  # validation (steps 0, 2) kept apart
        "r0-0000.manifest.json"] * 3 + ["val_r0-0000.manifest.json"] * 2

    # Run 2: every step replayed, plain (step 1, 3) and awaited (step 2); only validation reached the workers.
    assert [s["status"] for s in second["steps"]] == ["hit", "hit", "hit"]
    assert [(c["step"], c["validate"]) for c in second["worker_calls"]] == [(0, True), (0, True), (2, True), (2, True)]
    assert second["validation"] == first["validation"] == ["bypass", "bypass"]
    for a, b in zip(first["steps"], second["steps"], strict=True):
        assert a["digest"] == b["digest"]  # tokens, bf16 log-probs and object arrays of dicts, exactly
        assert b["timing_keys"] == a["timing_keys"] > 0  # meta_info["timing"] is there for the trainer to pop
        assert b["uid_is_live"] and b["union_rows"] == 4  # union with the live batch worked: uids echoed
    assert second["rng_after"] == first["rng_after"]  # the RNG state after the real calls was restored
    assert second["counters"]["hits"] == 3 and second["counters"]["misses"] == 0

    # Run 3, +skip=rollout_replay: verl's engine is built from the profile's stubs (servers, agent-loop manager,
    # checkpoint engine: stand-ins, nothing launched); the rollouts and validation batches (steps 0, 2) are served.
    assert third["engine"] == {"servers": "LLMServerManagerStandIn", "manager": "AgentLoopManagerStandIn",
                               "checkpoints": "CheckpointEngineManagerStandIn", "replicas": [], "is_manager": True}
    assert third["worker_calls"] == []
    assert [s["status"] for s in third["steps"]] == ["hit", "hit", "hit"] and third["validation"] == ["hit", "hit"]
    assert [s["digest"] for s in third["steps"]] == [s["digest"] for s in first["steps"]]
    assert third["rng_after"] == first["rng_after"]
