"""``bench/view.py`` runs end to end on small sizes and reports what it is for (build time, page size, memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.export.recording import forget, host_module, record, rollouts

pytestmark = pytest.mark.slow  # starts a view process per store and setting

ROOT = Path(__file__).resolve().parents[2]


def test_the_view_bench_reports_build_time_page_size_and_memory_of_both_stores(tmp_path: Path) -> None:
    host = host_module(tmp_path)
    try:
        record(tmp_path / "main", host, {"gen": "Rollout.generate_sequences"}, rollouts((1, 2), 4))
    finally:
        forget(host)
    proc = subprocess.run([sys.executable, "-m", "bench.view", "--steps", "3", "--samples", "8", "--dir",
                           str(tmp_path), "--main-store", str(tmp_path / "main"), "--shown", "2"],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "page MB" in proc.stdout and "peak RSS MB" in proc.stdout
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    got = {(r["store"].split()[0], r["diff"]): r for r in doc["rows"]}
    assert set(got) == {("synthetic", False), ("synthetic", True), ("main", False), ("main", True)}
    assert got["synthetic", False]["entries"] == 3 and got["main", False]["entries"] == 2
    for r in doc["rows"]:
        assert r["peak_rss_mb"] > 0 and r["build_s"] > 0 and r["page_mb"] > 0 and r["shown"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("skipweave-bench-view-")) == []
