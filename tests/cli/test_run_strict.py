"""A strict run, and failures said once and rightly, from the user's side.

``skipweave run --strict`` (and ``+skip.strict=true`` in a Hydra app) on the one-file trainer
``tests/apps/strict/train.py``: a run in which skipweave failed at what it was asked (records that could not be
written, a step expression that raises, a target never woven) ends with exit status 4 when the program itself ended
with 0, naming each failure and its key; the program's own non-zero status is kept; a clean run ends with 0. Without
``--strict`` the same runs end with 0, a dump dir that cannot be written is one WARNING and a count, and a failing
expression is named as the cause in the closing line.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import Run, Scenarios, clean_env, run, selected_tests

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

TRAIN = Path(__file__).resolve().parents[1] / "apps" / "strict" / "train.py"
SKIPWEAVE = [sys.executable, "-m", "skipweave.cli"]
GEN = "+skip.rollout.targets.gen=train.Trainer.generate"
STEP = "+skip.rollout.step.expr=self.step"
STRICT_EXIT = 4

DROP_DAC_OVERRIDE = """\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
    sys.exit("cannot drop CAP_DAC_OVERRIDE: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[1], sys.argv[1:])
"""


def read_only_dir(path: Path) -> list[str]:
    """Make ``path`` a folder its owner may not write (mode 0555), and return the prefix of a command line that
    runs as a process held to that.

    Root writes through permission bits (``CAP_DAC_OVERRIDE``): as root, the command runs with that capability dropped
    from its bounding set, which every process it execs then lacks (root's permitted capabilities after ``exec`` are
    its bounding set, plus an inheritable set that is empty). The tests assert that nothing was written.
    """
    path.mkdir()
    path.chmod(0o555)
    return [sys.executable, "-c", DROP_DAC_OVERRIDE] if os.geteuid() == 0 else []


def launch(*args: str, cwd: Path, prefix: list[str] | None = None, pythonpath: str = "") -> Run:
    """``skipweave run ARGS`` with this tree's skipweave (the test's own ``PYTHONPATH``), ``pythonpath`` first."""
    path = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    return run([*(prefix or []), *SKIPWEAVE, *args], cwd=cwd, env=clean_env(PYTHONPATH=path))


def trainer(end: str = "none") -> list[str]:
    return [sys.executable, str(TRAIN), "plain", end]


def hydra(tmp: Path, end: str, *overrides: str) -> Run:
    flags = [o for o in overrides if o.startswith("-")]  # (Hydra's flags before its overrides)
    return run([sys.executable, str(TRAIN), "hydra", end, *flags, f"hydra.run.dir={tmp}/hydra",
                f"hydra.sweep.dir={tmp}/sweep", "+skip=rollout_cache", f"skip.rollout.dump_dir={tmp}/dump", GEN,
                *(o for o in overrides if not o.startswith("-"))], cwd=tmp)


def _read_only(strict: bool) -> Callable[[Path], tuple[Path, Run]]:
    """A run on a dump dir that cannot be written; the strict one's program is a shell running the trainer twice (two
    woven processes, whose failures the launcher adds up)."""
    def scenario(tmp: Path) -> tuple[Path, Run]:
        dump = tmp / "dump"
        prefix = read_only_dir(dump)
        flags = ["--strict"] if strict else ["-v"]  # -v: every WARNING line shows its level
        once = shlex.join(trainer())
        program = ["sh", "-c", f"{once} && exec {once}"] if strict else trainer()
        return dump, launch("run", *flags, "--skip", "rollout_cache", f"skip.rollout.dump_dir={dump}", GEN, STEP,
                            "--", *program, cwd=tmp, prefix=prefix)

    return scenario


def _failing_expressions(tmp: Path) -> dict[str, Run]:
    common = ["run", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp}/dump", GEN]
    return {
        "step": launch(*common, "+skip.rollout.step.expr=self.stepp", "--", *trainer(), cwd=tmp),
        # (record_validation off: with it, a call the bypass takes is recorded as a validation call instead)
        "bypass": launch(*common, STEP, "+skip.rollout.bypass.expr=self.nope", "skip.rollout.record_validation=false",
                         "--", *trainer(), cwd=tmp),
    }


LAZY = "+skip.rollout.targets.lazy=lazy_mod.Gen.generate"


def _never_woven(tmp: Path) -> dict[str, Run]:
    """The plan's one target is in a module the program never imports (the trainer does not import ``lazy_mod``)."""
    (tmp / "lazy_mod.py").write_text("class Gen:\n    def generate(self, prompts):\n        return prompts\n")
    common = ["run", "--strict", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp}/dump", LAZY, "--"]
    return {end: launch(*common, *trainer(end), cwd=tmp, pythonpath=str(tmp)) for end in ("none", "3")}


def _clean(tmp: Path) -> tuple[Path, Run, Run]:
    common = ["run", "--strict", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp}/dump", GEN, STEP, "--",
              *trainer()]
    return tmp / "dump", launch(*common, cwd=tmp), launch(*common, cwd=tmp)  # records, then replays


def _hydra(tmp: Path) -> dict[str, Run]:
    runs = {}
    failing = "+skip.rollout.step.expr=self.stepp"
    # (a task that calls sys.exit(3) never reaches the callback's job end: the launcher's case shows a status kept)
    for name, end, *overrides in (("failing", "none", failing), ("clean", "none", STEP), ("raise", "raise", failing),
                                  ("sweep", "none", failing, "--multirun", "+n=1,2")):
        folder = tmp / name.replace(" ", "_")
        folder.mkdir()
        runs[name] = hydra(folder, end, *overrides, "+skip.strict=true")
    return runs


SCENARIOS: dict[str, Callable[[Path], object]] = {
    "test_strict_run_on_a_read_only_dump_dir_fails_naming_the_records": _read_only(strict=True),
    "test_a_dump_dir_that_cannot_be_written_is_one_warning_and_a_count": _read_only(strict=False),
    "test_a_failing_step_or_bypass_expression_is_named_in_the_closing_line": _failing_expressions,
    "test_strict_fails_a_run_whose_target_was_never_woven_but_keeps_the_programs_own_status": _never_woven,
    "test_a_clean_strict_run_that_records_then_replays_exits_0": _clean,
    "test_the_hydra_route_fails_a_completed_job_and_keeps_a_failed_ones_status": _hydra,
}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenarios]:
    started = Scenarios(workers=3)
    for name in selected_tests(request):
        if name in SCENARIOS:
            started.start(name, SCENARIOS[name], tmp_path_factory.mktemp(name[5:30]))
    yield started
    started.close()


def _strict_line(r: Run) -> str:
    lines = [x for x in r.stderr.splitlines() if x.startswith("skipweave run --strict:")]
    assert len(lines) == 1, r
    return lines[0]


def test_strict_run_on_a_read_only_dump_dir_fails_naming_the_records(runs: Scenarios) -> None:
    dump, r = runs.result("test_strict_run_on_a_read_only_dump_dir_fails_naming_the_records")
    assert r.returncode == STRICT_EXIT, r
    assert r.stdout.count("DONE") == 2, r  # the program ran to its end: only the status says the run failed
    line = _strict_line(r)
    assert "the program ended with exit status 0" in line and line.endswith("Exit status 4."), line
    assert f"6 record(s) of role rollout failed (skip.rollout.dump_dir={dump}; first: PermissionError EACCES" in line
    assert "role rollout recorded and replayed nothing (skip.rollout)" in line
    assert list(dump.iterdir()) == [], "the dump dir was written: the test's read-only folder is not read-only here"


def test_a_dump_dir_that_cannot_be_written_is_one_warning_and_a_count(runs: Scenarios) -> None:
    dump, r = runs.result("test_a_dump_dir_that_cannot_be_written_is_one_warning_and_a_count")
    assert r.returncode == 0 and "DONE" in r.stdout, r
    warnings = [x for x in r.stderr.splitlines() if re.match(r"\[\d+\] WARNING ", x)]
    assert len(warnings) == 1, r
    assert f"under {dump} failed (PermissionError EACCES: [Errno 13] Permission denied" in warnings[0]
    assert f"make {dump} writable by this process or set skip.rollout.dump_dir" in warnings[0]
    assert "later failures like it are logged at DEBUG" in warnings[0]
    assert "skipweave summary role=rollout: calls=3 hits=0 misses=3 bypasses=0 record_failures=3" in r.stderr, r
    assert re.search(r"skipweave summary: .* record_failures=3", r.stderr), r
    assert list(dump.iterdir()) == []


def test_a_failing_step_or_bypass_expression_is_named_in_the_closing_line(runs: Scenarios) -> None:
    results = runs.result("test_a_failing_step_or_bypass_expression_is_named_in_the_closing_line")
    for name, expected in (
        ("step", "skip.rollout.step.expr 'self.stepp' failed on an instance of Trainer: AttributeError: 'Trainer' "
                 "object has no attribute 'stepp' (on 3 of its 3 calls); fix skip.rollout.step.expr"),
        ("bypass", "skip.rollout.bypass.expr 'self.nope' failed on an instance of Trainer: AttributeError: 'Trainer' "
                   "object has no attribute 'nope' (on 3 of its 3 calls); fix skip.rollout.bypass.expr"),
    ):
        r = results[name]
        assert r.returncode == 0 and "DONE" in r.stdout, r
        closing = [x for x in r.stderr.splitlines() if "none of its calls was eligible" in x]
        assert closing == [f"skipweave: role rollout: none of its calls was eligible, so nothing was recorded or "
                           f"replayed: {expected}"], r
        assert "validation call" not in r.stderr and "outside skip.rollout.steps" not in r.stderr, r


def test_strict_fails_a_run_whose_target_was_never_woven_but_keeps_the_programs_own_status(runs: Scenarios) -> None:
    results = runs.result("test_strict_fails_a_run_whose_target_was_never_woven_but_keeps_the_programs_own_status")
    r = results["none"]
    assert r.returncode == STRICT_EXIT and "DONE" in r.stdout, r
    assert "target lazy (lazy_mod.Gen.generate) was never woven (skip.rollout.targets.lazy)" in _strict_line(r)
    own = results["3"]  # the same failure, in a program that ends with sys.exit(3): its status is its own
    assert own.returncode == 3 and "DONE" in own.stdout, own
    assert "skipweave run --strict" not in own.stderr, own
    assert "was never woven" in own.stderr  # still said, by the exit summary


def test_a_clean_strict_run_that_records_then_replays_exits_0(runs: Scenarios) -> None:
    dump, first, second = runs.result("test_a_clean_strict_run_that_records_then_replays_exits_0")
    for r in (first, second):
        assert r.returncode == 0 and "DONE" in r.stdout, r
        assert "strict" not in r.stderr and "WARNING" not in r.stderr, r
    assert sorted(p.name for p in (dump / "default" / "rollout").iterdir() if p.name.isdigit()) == ["1", "2", "3"]
    assert "skipweave summary role=rollout: calls=3 hits=3 misses=0" in second.stderr, second


def test_the_hydra_route_fails_a_completed_job_and_keeps_a_failed_ones_status(runs: Scenarios) -> None:
    results = runs.result("test_the_hydra_route_fails_a_completed_job_and_keeps_a_failed_ones_status")
    failing = results["failing"]
    assert failing.returncode == STRICT_EXIT and "DONE" in failing.stdout, failing
    errors = [x for x in (failing.stdout + failing.stderr).splitlines() if "[ERROR]" in x]  # Hydra logs to stdout
    assert len(errors) == 1, failing
    assert ("skipweave (+skip=rollout_cache): strict run failed: the step or bypass of 3 call(s) of role rollout could "
            "not be read: skip.rollout.step.expr 'self.stepp' failed") in errors[0], failing
    assert "(skip.rollout.step.expr)" in errors[0] and "exit status 4" in errors[0]
    assert results["clean"].returncode == 0 and "strict" not in results["clean"].stderr, results["clean"]
    raised = results["raise"]
    assert raised.returncode == 1 and "the trainer failed" in raised.stderr, raised
    assert "strict run failed" not in raised.stderr + raised.stdout, raised
    sweep = results["sweep"]  # every job runs; the sweep ends with 4 once all completed
    assert sweep.returncode == STRICT_EXIT and sweep.stdout.count("DONE") == 2, sweep
    assert (sweep.stdout + sweep.stderr).count("strict run failed") == 2, sweep


def test_a_strict_launcher_passes_sigterm_on_and_ends_by_it(tmp_path: Path) -> None:
    """Under --strict the launcher waits as the program's parent: a scheduler's SIGTERM to it reaches the program,
    and the launcher ends as the program did."""
    program = [sys.executable, "-c", "import time; print('READY', flush=True); time.sleep(60)"]
    proc = subprocess.Popen(
        [*SKIPWEAVE, "run", "--strict", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp_path}/dump", GEN, "--",
         *program], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGTERM, proc.returncode
