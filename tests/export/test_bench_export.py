"""``bench/export.py`` runs end to end on small sizes and reports the numbers it is for (time, peak memory, rows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.export.recording import forget, host_module, record, rollouts

pytestmark = pytest.mark.slow  # starts an export process per store and format

ROOT = Path(__file__).resolve().parents[2]


def test_the_export_bench_reports_time_and_peak_memory_of_both_stores(tmp_path: Path) -> None:
    host = host_module(tmp_path)
    try:
        record(tmp_path / "main", host, {"gen": "Rollout.generate_sequences"}, rollouts((1, 2), 4))
    finally:
        forget(host)
    proc = subprocess.run([sys.executable, "-m", "bench.export", "--steps", "3", "--samples", "8", "--dir",
                           str(tmp_path), "--main-store", str(tmp_path / "main")],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "peak RSS MB" in proc.stdout
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    got = {(r["store"].split()[0], r["format"]): r for r in doc["rows"]}
    assert set(got) == {("synthetic", "parquet"), ("synthetic", "jsonl"), ("main", "parquet"), ("main", "jsonl")}
    assert got["synthetic", "parquet"]["rows"] == 3 * 8 and got["main", "jsonl"]["rows"] == 2 * 4
    for r in doc["rows"]:
        assert r["peak_rss_mb"] > 0 and r["export_s"] > 0 and r["output_mb"] > 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("skipweave-bench-export-")) == []
