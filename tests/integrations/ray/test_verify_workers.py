"""``action: verify`` in Ray workers: a changed actor's rollouts are compared in the worker with the recording its
run made, the report lines land in the driver's report file, and ``on_diverge: error`` stops the driver's
``ray.get`` with the worker's :class:`skipweave.Diverged`.

Three driver processes, each with its own local Ray (``apps/verify_driver.py``): record, verify (warn), verify
(error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APPS = Path(__file__).resolve().parent / "apps"


def _driver(phase: str, base: Path) -> dict[str, Any]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(APPS), os.environ.get("PYTHONPATH", "")) if p)}
    out = base / f"{phase}.json"
    proc = subprocess.run([sys.executable, str(APPS / "verify_driver.py"), phase, str(base / "dump"),
                           str(base / "report.jsonl"), str(out)], cwd=str(base), env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, f"{phase} driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    result["stderr"] = proc.stderr
    return result


def test_verify_in_ray_workers_reports_into_the_drivers_file_and_errors_reach_the_driver(tmp_path: Path) -> None:
    record = _driver("record", tmp_path)
    assert record["errors"] == [] and not (tmp_path / "report.jsonl").exists()

    verify = _driver("verify", tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert [(x["step"], x["status"]) for x in lines] == [(1, "identical"), (2, "diverged"), (3, "diverged")]
    assert {x["pid"] for x in lines} == {verify["worker_pid"]}  # compared in the worker, not in the driver
    assert lines[1]["first"]["path"] == "tokens" and lines[1]["first"]["detail"]["first_index"] == [1, 2]
    assert verify["errors"] == []

    failed = _driver("verify_error", tmp_path)
    (error,) = failed["errors"]
    assert error["step"] == 2 and error["cause"] == "Diverged", error
    assert "role rollout target sampler step 2 call 0: diverged at tokens [1, 2]" in error["message"]
