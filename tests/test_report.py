"""Run-time reporting with a real weave: one log line per hit, miss and bypass, counters, exit summary."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave import report
from tests.conftest import HOST_SOURCE


def _cfg(dump: Path, name: str, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "targets": {"g": f"{name}.Gen.generate"},
                                 **role}}}


def _manifest(dump: Path, step: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((dump / "default" / "rollout" / str(step) / "g" / "r0-0000.manifest.json")
                                      .read_text())
    return data


def _bytes(dump: Path, step: int) -> int:
    return sum(int(p["bytes"]) for p in _manifest(dump, step)["payload"])


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "skipweave" and re.match(r"skipweave (hit|miss|bypass|summary)", r.getMessage())]


def test_one_line_per_hit_miss_and_bypass_and_counters(host_module: Any, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    dump = tmp_path / "dump"
    report.reset()
    with caplog.at_level(logging.DEBUG, logger="skipweave"):
        skipweave.weave(_cfg(dump, name))
        gen = mod.Gen()
        gen.generate(mod.Batch(step=1))
        gen.generate(mod.Batch(step=1, validate=True))
        gen.generate(mod.Batch(step=2))
        skipweave.unweave()
        skipweave.weave(_cfg(dump, name, action="repeat"))
        gen.generate(mod.Batch(step=1))
        gen.generate(mod.Batch(step=5))  # repeat: served by the nearest recorded step, 2
    b1, b2 = _bytes(dump, 1), _bytes(dump, 2)
    s1, s2 = (float(_manifest(dump, s)["generation_seconds"]) for s in (1, 2))
    lines = _lines(caplog)
    assert [(level, msg.split(" read_s=")[0].split(" call_s=")[0]) for level, msg in lines] == [
        ("INFO", f"skipweave miss role=rollout target=g step=1 recorded_bytes={b1}"),
        ("DEBUG", "skipweave bypass role=rollout target=g step=None"),
        ("INFO", f"skipweave miss role=rollout target=g step=2 recorded_bytes={b2}"),
        ("INFO", f"skipweave hit role=rollout target=g step=1 served_by=1 bytes={b1}"),
        ("INFO", f"skipweave hit role=rollout target=g step=5 served_by=2 bytes={b2}"),
    ]
    assert re.search(r"call_s=\d+\.\d{3}$", lines[0][1])
    assert lines[4][1].endswith(f"saved_s={s2:.3f}") and re.search(r"read_s=\d+\.\d{3} ", lines[4][1])

    expected = {"hits": 2, "misses": 2, "bypasses": 1, "bytes_read": b1 + b2, "bytes_written": b1 + b2,
                "record_failures": 0}
    got = skipweave.counters()
    assert {k: got[k] for k in expected} == expected
    assert got["seconds_saved"] == pytest.approx(s1 + s2) and s1 > 0
    got["hits"] = 99  # a snapshot: the host may keep or change it freely
    assert report.counters()["hits"] == 2

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="skipweave"):
        report.log_summary()
    assert _lines(caplog) == [("INFO", (
        f"skipweave summary: hits=2 misses=2 bypasses=1 bytes_read={b1 + b2} bytes_written={b1 + b2} "
        f"generation_seconds_saved={s1 + s2:.1f} record_failures=0"))]
    report.reset()
    assert set(skipweave.counters().values()) == {0}


def test_summary_is_logged_when_the_process_ends(host_module: Any, tmp_path: Path) -> None:
    name, folder = host_module(HOST_SOURCE, import_now=False)
    dump = tmp_path / "dump"
    script = textwrap.dedent(f"""
        import logging, sys
        sys.path.insert(0, {str(folder)!r})
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        import skipweave, {name} as m
        cfg = {_cfg(dump, name)!r}
        skipweave.weave(cfg)
        m.Gen().generate(m.Batch(step=1))
        skipweave.unweave()
        skipweave.weave(cfg)
        m.Gen().generate(m.Batch(step=1))
        print("done")
    """)
    path = [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"  # the summary is a log line, not program output
    summary = [line for line in proc.stderr.splitlines() if "skipweave summary:" in line]
    b = _bytes(dump, 1)
    assert len(summary) == 1, proc.stderr
    assert summary[0].startswith(f"skipweave INFO skipweave summary: hits=1 misses=1 bypasses=0 bytes_read={b} "
                                 f"bytes_written={b} generation_seconds_saved=")
    assert proc.stderr.index("skipweave hit ") < proc.stderr.index("skipweave summary:")
