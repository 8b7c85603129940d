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

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)


def _cfg(dump: Path, name: str, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(dump), "targets": {"g": f"{name}.Gen.generate"},
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
        ("INFO", f"skipweave miss role=rollout target=g step=1 call=0 recorded_bytes={b1}"),
        ("DEBUG", "skipweave bypass role=rollout target=g step=None"),
        ("INFO", f"skipweave miss role=rollout target=g step=2 call=0 recorded_bytes={b2}"),
        ("INFO", "skipweave summary role=rollout: calls=3 hits=0 misses=2 bypasses=1 record_failures=0 "
                 "seconds_saved=0.0"),  # the first plan ends at unweave
        ("INFO", f"skipweave hit role=rollout target=g step=1 call=0 served_by=1 bytes={b1}"),
        ("INFO", f"skipweave hit role=rollout target=g step=5 call=0 served_by=2 bytes={b2}"),
    ]
    assert re.search(r"call_s=\d+\.\d{3}$", lines[0][1])
    assert lines[5][1].endswith(f"saved_s={s2:.3f}") and re.search(r"read_s=\d+\.\d{3} ", lines[5][1])

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
        f"generation_seconds_saved={s1 + s2:.1f} record_failures=0")), ("INFO", (
        f"skipweave summary role=rollout: calls=2 hits=2 misses=0 bypasses=0 record_failures=0 "
        f"seconds_saved={s1 + s2:.1f}"))]
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


SILENT_HOST = '''
class Batch:
    def __init__(self, step):
        self.meta_info = {"global_steps": step}


class Gen:
    def generate(self, batch):
        return {"step": batch.meta_info["global_steps"]}

    def score(self, batch):
        return {"score": 1.0}
'''

SILENT_SCRIPT = '''
import logging, os, subprocess, sys
sys.path.insert(0, {folder!r})
if os.environ.get("CONFIGURE_LOGGING", "1") == "1":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
import skipweave, {name} as m
skipweave.weave({cfg!r})
calls = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []
for what in calls:
    if what == "child":  # another process of this run makes the calls (a Ray worker, a torchrun rank ...)
        subprocess.run([sys.executable, __file__, "gen,score"], check=True)
    elif what == "child-gen":
        subprocess.run([sys.executable, __file__, "gen"], check=True)
    else:
        for step in (1, 2):
            getattr(m.Gen(), "generate" if what == "gen" else "score")(m.Batch(step))
'''


def _silent_run(tmp_path: Path, folder: Path, name: str, calls: str, env_extra: dict[str, str], **role: Any) -> str:
    run_keys = {"strict": role.pop("strict")} if "strict" in role else {}  # skip.strict: the run's, not the role's
    cfg = {"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path / "dump"),
                                "targets": {"gen": f"{name}:Gen.generate", "score": f"{name}:Gen.score"}, **role},
                    **run_keys}}
    script = tmp_path / "silent.py"
    script.write_text(SILENT_SCRIPT.format(folder=str(folder), name=name, cfg=cfg))
    env = {k: v for k, v in os.environ.items() if k != "SKIPWEAVE_RUN"} | env_extra
    proc = subprocess.run([sys.executable, str(script), calls], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


SILENT_RUNS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {  # name -> (calls, environment, role)
    "one target called": ("gen", {}, {}),
    "nothing eligible": ("gen,score", {}, {"steps": [100]}),
    "a child calls both": ("child", {}, {}),
    "a child calls one": ("child-gen", {}, {}),
    "no logging configured": ("gen,score", {"CONFIGURE_LOGGING": "0"}, {}),
    "no logging, silenced": ("gen,score", {"CONFIGURE_LOGGING": "0", "SKIPWEAVE_SUMMARY": "0"}, {}),
    "strict, weaving itself": ("gen", {}, {"strict": True, "step": {"expr": "batch.stepp"}}),
}


@pytest.fixture(scope="module")
def silent_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The stderr of each of :data:`SILENT_RUNS` (a process start imports torch: started together)."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp_path_factory.mktemp("silent_host")
    name = f"silent_host_{os.getpid()}"
    (folder / f"{name}.py").write_text(SILENT_HOST)
    with ThreadPoolExecutor(max_workers=len(SILENT_RUNS)) as pool:
        futures = {k: pool.submit(_silent_run, tmp_path_factory.mktemp("silent"), folder, name, calls, env, **role)
                   for k, (calls, env, role) in SILENT_RUNS.items()}
        return {k: f.result() for k, f in futures.items()}


def _never_called(stderr: str) -> list[str]:
    return re.findall(r"WARNING skipweave: role rollout target (\w+) \([^)]*\) was woven but never called", stderr)


def test_a_target_never_called_is_named_at_exit_and_one_called_is_not(silent_runs: dict[str, str]) -> None:
    err = silent_runs["one target called"]
    assert _never_called(err) == ["score"], err
    assert "skipweave summary role=rollout: calls=2 hits=0 misses=2 bypasses=0 record_failures=0" in err
    assert "none of its calls was eligible" not in err


def test_a_role_with_no_eligible_call_says_so_at_exit(silent_runs: dict[str, str]) -> None:
    err = silent_runs["nothing eligible"]
    assert _never_called(err) == []
    assert err.count("none of its calls was eligible") == 1, err
    assert "skip.rollout.steps=" in err and "100" in err
    assert "calls=4 hits=0 misses=0 bypasses=4" in err


def test_calls_made_by_another_process_of_the_run_count(silent_runs: dict[str, str]) -> None:
    err = silent_runs["a child calls both"]  # the driver calls nothing itself
    assert _never_called(err) == [], err
    err = silent_runs["a child calls one"]
    assert _never_called(err) == ["score", "score"], err  # said by the child at its exit, and by the driver


def test_a_program_without_logging_still_shows_the_summary_unless_silenced(silent_runs: dict[str, str]) -> None:
    err = silent_runs["no logging configured"]
    assert "skipweave summary: hits=0 misses=4" in err, err
    assert "skipweave summary role=rollout: calls=4 hits=0 misses=4" in err
    assert "skipweave miss" not in err  # the per-call lines stay off: only the summary is shown
    assert "skipweave summary" not in silent_runs["no logging, silenced"]


def test_a_strict_program_that_weaves_itself_keeps_its_status_and_logs_the_verdict(silent_runs: dict[str, str]) -> None:
    """``skip.strict`` in ``skipweave.weave()``: the exit status stays the program's own (``_silent_run`` asserts 0),
    and one ERROR line at exit names what failed and its key."""
    err = silent_runs["strict, weaving itself"]
    errors = [line for line in err.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1, err
    assert errors[0].startswith(
        "ERROR skipweave strict run failed: the step or bypass of 2 call(s) of role rollout could not be read: "
        "skip.rollout.step.expr 'batch.stepp' failed on an instance of Gen: AttributeError"), err
    assert "(skip.rollout.step.expr); role rollout recorded and replayed nothing (skip.rollout)" in errors[0]
    assert "run it with `skipweave run --strict` to end with 4" in errors[0]
