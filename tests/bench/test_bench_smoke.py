"""Smoke run of the benchmark harness: ``bench/run.py --quick --json out.json`` runs and writes the table.

Only the table's structure is checked here. Speed and memory targets live in the benchmark itself
(``python bench/run.py`` lists them as PASS/MISS), never in unit tests: a shared machine is too noisy.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

ROW_KEYS = {"section", "group", "key", "name", "median", "unit", "values", "ratio", "ratio_to", "added",
            "peak_mb", "payload_mb", "target", "ok", "note"}


@pytest.mark.timeout(300)
def test_quick_run_writes_the_documented_table(quick_run: Any) -> None:
    # The run started when collection ended, and this test runs last (see conftest.py).
    try:
        quick_run.proc.wait(timeout=290)
    except subprocess.TimeoutExpired:
        quick_run.proc.kill()
        raise
    stdout, stderr = quick_run.output()
    assert quick_run.proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    for title in ("1. cost per call", "2. record and replay", "2b. time-to-return", "2c. many small entries",
                  "2d. compression", "2e. event-loop stall", "2f. what verifying a call adds", "2g. verified reads",
                  "3. start-up",
                  "4. the main job", "targets"):
        assert title in stdout
    check_table(json.loads((quick_run.folder / "out.json").read_text(encoding="utf-8")))


def check_table(data: dict[str, Any]) -> None:
    """The structure of the JSON table."""
    assert data["schema"] == 1
    assert data["sections"] == ["calls", "io", "returns", "small", "compress", "stall", "verify", "reads",
                                "startup", "job"]
    assert {"cpus", "python", "torch", "loadavg_start", "loadavg_end"} <= set(data["machine"])
    rows = data["rows"]
    for r in rows:
        assert ROW_KEYS <= set(r), r
    by_key = {r["key"]: r for r in rows}
    assert len(by_key) == len(rows), "row keys are unique"

    # 1. every call path, in ns, with the added cost over a bare call and the bypass target
    for case in ("bare", "functools_wraps", "wrapt_passthrough", "role_disabled", "bypass_step_not_eligible",
                 "bypass_validation", "decision_hit_replay", "decision_miss_record"):
        r = by_key[f"calls.{case}"]
        assert r["unit"] == "ns" and r["median"] > 0 and r["values"] and r["added"] is not None
    for case in ("bypass_step_not_eligible", "bypass_validation"):
        assert by_key[f"calls.{case}"]["target"] and isinstance(by_key[f"calls.{case}"]["ok"], bool)

    # 2. every writer and every reader (cold and warm page cache), with ratios and peak memory
    io = [r for r in rows if r["section"] == "io"]
    assert not [r for r in io if r.get("error")], io
    cases = {r["key"].split(".", 2)[2] for r in io}
    writes = {f"{c}.write" for c in ("raw_write", "skipweave_record", "torch_save", "pickle_dump")}
    reads = {f"{c}.{cache}" for c in ("raw_read", "skipweave_load", "torch_load", "pickle_load")
             for cache in ("cold", "warm")}
    assert cases == writes | reads
    for r in io:
        assert r["unit"] == "s" and r["median"] > 0 and r["ratio"] > 0 and r["vs_pickle"] > 0
        assert r["peak_mb"] is not None and r["payload_mb"] > 0
    assert all(isinstance(r["ok"], bool) for r in io if "skipweave" in r["key"])

    # 2b/2c. time-to-return per size beside raw write+fsync; per-sample record and hit costs, with targets
    for case in ("raw", "behind", "behind_warm", "through"):
        r = by_key[f"returns.16 MB.{case}"]
        assert r["unit"] == "s" and r["median"] > 0, r
    assert by_key["returns.16 MB.behind"]["ratio"] > 0 and isinstance(by_key["returns.16 MB.behind"]["ok"], bool)
    assert by_key["returns.16 MB.behind"]["peak_mb"] is not None
    assert by_key["returns.16 MB.behind_warm"]["ratio"] > 0 and "keeps" in by_key["returns.16 MB.behind_warm"]["note"]
    for key in ("small.record", "small.hit"):
        assert by_key[key]["median"] > 0 and isinstance(by_key[key]["ok"], bool), by_key[key]
    for key in ("small.return", "small.through", "small.record_norng", "small.return_norng", "small.hit_norng",
                "small.record_draws", "small.return_draws", "small.hit_draws"):
        assert by_key[key]["median"] > 0, key
    # 2e. bytes on disk and replay seconds per compress setting
    for payload in ("verl batch", "token ids"):
        for setting in ("none", "zstd:1", "zstd:3"):
            r = by_key[f"compress.{payload}.{setting}.load"]
            assert r["median"] > 0 and r["disk_mb"] > 0 and r["shrink"] >= (1.5 if setting != "none" else 1.0), r

    # 2f. what a verified call adds, beside a raw read of the same bytes
    for key in ("verify.raw_read", "verify.skipweave_load", "verify.compare_identical", "verify.compare_diverged",
                "verify.adds"):
        assert by_key[key]["unit"] == "s" and by_key[key]["median"] > 0, by_key[key]
    assert by_key["verify.adds"]["ratio_to"] == "raw" and by_key["verify.adds"]["ok"] in (True, False)

    # 2g. a verified replay beside mmap + xxh3 (warm) and a raw read (cold), and its peak memory, with targets
    for key in ("reads.mmap_xxh3.warm", "reads.load.warm", "reads.touch.warm", "reads.raw.cold", "reads.load.cold"):
        assert by_key[key]["unit"] == "s" and by_key[key]["median"] > 0, by_key[key]
    for key in ("reads.load.warm", "reads.load.cold", "reads.peak"):
        assert by_key[key]["ratio"] > 0 and isinstance(by_key[key]["ok"], bool), by_key[key]
    assert by_key["reads.peak"]["unit"] == "MB" and by_key["reads.peak"]["median"] > 0

    # 3. start-up: import, weave of 20 targets, and the three Hydra variants
    for key in ("startup.import", "startup.first_weave", "startup.weave20", "startup.unweave20",
                "startup.hydra.without", "startup.hydra.installed", "startup.hydra.profile"):
        assert by_key[key]["unit"] == "ms" and by_key[key]["median"] > 0, by_key[key]
    assert by_key["startup.hydra.installed"]["loaded"]["plugin_loaded"] is True
    assert by_key["startup.hydra.without"]["loaded"]["plugin_loaded"] is False
    assert by_key["startup.hydra.installed"]["loaded"]["torch_loaded"] is False

    # 4. the main job is skipped in --quick, with a row that says so
    job = [r for r in rows if r["section"] == "job"]
    assert len(job) == 1 and "skipped" in job[0]["note"]

    targets = data["targets"]
    assert targets and all(t["ok"] in (True, False) for t in targets)
    assert {t["key"] for t in targets} >= {"calls.bypass_step_not_eligible", "startup.hydra.installed",
                                           "returns.16 MB.behind", "returns.16 MB.behind_warm", "small.record",
                                           "small.hit", "reads.load.warm", "reads.load.cold", "reads.peak"}
