"""``skipweave run --skip PROFILE [overrides] -- COMMAND``: a program without Hydra, woven with no change.

The program (``tests/integrations/hydra/apps/plain_script.py``) imports nothing from skipweave.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import (
    APPS,
    Run,
    Scenarios,
    clean_env,
    recorded_steps,
    run,
    selected_tests,
)

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

GEN = "+skip.rollout.targets.gen=worker.Generator.generate"
SKIPWEAVE = [sys.executable, "-m", "skipweave.cli"]


def this_tree(pythonpath: str = "") -> str:
    """``PYTHONPATH`` of a launch: ``pythonpath`` first, then the test's own (this tree's skipweave, not another
    checkout's editable install)."""
    return os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)


def launch(*args: str, cwd: Path, pythonpath: str = "") -> Run:
    return run([*SKIPWEAVE, *args], cwd=cwd, env=clean_env(PYTHONPATH=this_tree(pythonpath)))


def _record_replay(tmp: Path) -> tuple[Path, Run, Run]:
    user_site = str(APPS / "user_site")  # the user's own sitecustomize, which the bootstrap must not hide
    common = ["run", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp}/dump", GEN, "--"]
    first = launch(*common, sys.executable, str(APPS / "plain_script.py"), "3", cwd=tmp, pythonpath=user_site)
    # The replay runs in a grandchild: the plan reaches the program's own subprocesses too.
    child = (
        f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, {str(APPS / 'plain_script.py')!r},"
        " '3']).returncode)"
    )
    second = launch(*common, sys.executable, "-c", child, cwd=tmp, pythonpath=user_site)
    return tmp, first, second


PROFILE = """\
skip:
  rollout:
    enable: true
    action: cache
    targets:
      gen: worker.Generator.generate
"""


def _profile_files(tmp: Path) -> tuple[Path, Run, Run]:
    """Record with ``--skip ./mine.yaml``; replay with ``--skip rollout_repeat --skip mine`` from the search path.

    ``mine.yaml`` sets no ``dump_dir``: a plain override sets it all the same (a key of the role schema).
    """
    (tmp / "mine.yaml").write_text(PROFILE)
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "mine.yaml").write_text(PROFILE + "    steps: [2, 3]\n")
    dump = f"skip.rollout.dump_dir={tmp}/dump"
    script = f"{sys.executable} {APPS / 'plain_script.py'} 3"
    # The program removes the file before it starts: the plan reaches it in SKIPWEAVE_PLAN, not as a file.
    first = launch("run", "--skip", "./mine.yaml", dump, "--", "sh", "-c", f"rm mine.yaml && exec {script}", cwd=tmp)
    second = run(
        [*SKIPWEAVE, "run", "--skip", "rollout_repeat", "--skip", "mine", f"skip.rollout.dump_dir={tmp}/dump",
         "--", *script.split()],
        cwd=tmp,
        env=clean_env(PYTHONPATH=this_tree(), SKIPWEAVE_PROFILE_PATH=str(tmp / "profiles")),
    )
    return tmp, first, second


def _failures(tmp: Path) -> tuple[Path, dict[str, Run]]:
    script = [sys.executable, str(APPS / "plain_script.py"), "3"]
    marker = [sys.executable, "-c", "open('child-ran', 'w')"]
    (tmp / "a.yaml").write_text("skip:\n  rollout:\n    action: repeat_cycle\n    namespace: a\n")
    (tmp / "b.yaml").write_text("# @package _global_\nskip:\n  rollout:\n    action: repeat_last\n")
    cases: dict[str, list[str]] = {
        "missing profile file": ["run", "--skip", "rollout_cache", "--skip", "./nope.yaml", "--", *marker],
        "print composed plan": [
            "run", "--skip", "rollout_repeat", "--skip", "a.yaml,b.yaml", "skip.rollout.namespace=cli", GEN,
            "--print-plan",
        ],
        "bad value": ["run", "--skip", "rollout_cache", "skip.rollout.action=bogus", GEN, "--", *marker],
        "bad override": ["run", "--skip", "rollout_cache", "skip.rollout.nope=1", "--", *marker],
        "unknown profile": ["run", "--skip", "rollout_cash", "--", *marker],
        "no command": ["run", "--skip", "rollout_cache", GEN],
        "missing module": [
            "run", "--skip", "rollout_cache", "+skip.rollout.targets.gen=wrker.Generator.generate", "--", *script,
        ],
        "missing method": [
            "run", "--skip", "rollout_cache", "+skip.rollout.targets.gen=worker.Generator.genrate", "--", *script,
        ],
        "missing at start-up": [  # `os` is imported before the program runs: the weave happens at start-up
            "run", "--skip", "rollout_cache", "+skip.rollout.targets.gen=os.no_such_function", "--", *script,
        ],
        "print plan": ["run", "--skip", "rollout_repeat", "skip.rollout.steps=[1,2]", GEN, "--print-plan"],
        "verbose": [  # the program configures no logging: -v still shows skipweave's lines
            "run", "--skip", "rollout_cache", "-v", f"skip.rollout.dump_dir={tmp}/verbose", GEN, "--", *script,
        ],
        "never called": [  # the program never imports lazy_worker: its target is never called
            "run", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp}/never", GEN,
            "+skip.rollout.targets.lazy=lazy_worker.LazyGenerator.generate", "--", *script,
        ],
    }
    # Independent launches (most stop before any program starts): a few at a time.
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(launch, *args, cwd=tmp) for name, args in cases.items()}
        return tmp, {name: f.result() for name, f in futures.items()}


SCENARIOS = {
    "test_launcher_records_then_replays_with_no_change_to_the_program": _record_replay,
    "test_launcher_takes_profile_files_and_several_profiles": _profile_files,
    "test_launcher_refuses_bad_plans_before_or_as_the_program_starts": _failures,
}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenarios]:
    started = Scenarios()
    for name in selected_tests(request):
        if name in SCENARIOS:
            started.start(name, SCENARIOS[name], tmp_path_factory.mktemp(name[5:30]))
    yield started
    started.close()


def test_launcher_records_then_replays_with_no_change_to_the_program(runs: Scenarios) -> None:
    tmp, first, second = runs.result("test_launcher_records_then_replays_with_no_change_to_the_program")
    assert first.returncode == 0, first
    assert second.returncode == 0, second
    assert first.report["patched"] and first.report["real_calls"] == [1, 2, 3]
    assert first.report["argv"] == ["3"]
    assert first.report["user_sitecustomize"] == "1", "the user's own sitecustomize was hidden"
    assert recorded_steps(tmp / "dump") == [1, 2, 3]
    assert second.report["real_calls"] == []
    assert second.report["results"] == first.report["results"]
    assert second.report["user_sitecustomize"] == "1"


def test_launcher_takes_profile_files_and_several_profiles(runs: Scenarios) -> None:
    tmp, first, second = runs.result("test_launcher_takes_profile_files_and_several_profiles")
    assert first.returncode == 0, first
    assert second.returncode == 0, second
    assert first.report["patched"] and first.report["real_calls"] == [1, 2, 3]
    assert not (tmp / "mine.yaml").exists()
    assert recorded_steps(tmp / "dump") == [1, 2, 3]
    # `mine` from the search path (steps 2-3) composed over `rollout_repeat`: step 1 ran live, 2-3 replayed.
    assert second.report["real_calls"] == [1], second
    assert second.report["results"][1:] == first.report["results"][1:]


def test_launcher_refuses_bad_plans_before_or_as_the_program_starts(runs: Scenarios) -> None:
    tmp, results = runs.result("test_launcher_refuses_bad_plans_before_or_as_the_program_starts")
    expected = {
        "bad value": ["skip.rollout.action='bogus'", "one of 'cache'"],
        "bad override": ["skip.rollout.nope"],
        "unknown profile": ["'rollout_cash'", "rollout_cache"],
        "missing profile file": ["profile='./nope.yaml'", f"there is no file {tmp / 'nope.yaml'}", "'rollout_cache'"],
        "no command": ["nothing to run"],
        "missing module": ["stopped before the program started", "skip.rollout.targets.gen", "failed at 'wrker'"],
        "missing method": [
            "stopped when the program first imported worker (its code up to that import had run)",
            "skip.rollout.targets.gen", "failed at 'worker.Generator.genrate'",
        ],
        "missing at start-up": ["stopped before the program's own code ran", "failed at 'os.no_such_function'"],
    }
    for name, needles in expected.items():
        result = results[name]
        assert result.returncode == 2, (name, result)
        assert not result.task_started, (name, result)
        for needle in needles:
            assert needle in result.stderr, (name, result)
    assert not (tmp / "child-ran").exists(), "a command ran although its plan was refused"
    verbose = results["verbose"]
    assert verbose.returncode == 0, verbose
    assert verbose.stderr.count("INFO skipweave miss role=rollout target=gen step=") == 3, verbose
    assert "skipweave summary role=rollout: calls=3" in verbose.stderr
    never = results["never called"]
    assert never.returncode == 0, never
    assert "role rollout target lazy (lazy_worker.LazyGenerator.generate) was woven but never called" in never.stderr
    assert "target gen (" not in never.stderr
    plan = json.loads(results["print plan"].stdout)
    role = plan["skip"]["rollout"]
    assert (role["enable"], role["action"], role["steps"]) == (True, "repeat", ["1-2"])
    assert role["targets"]["gen"]["path"] == "worker.Generator.generate"
    # --skip rollout_repeat --skip a.yaml,b.yaml: later profiles win, the overrides win over all.
    composed = json.loads(results["print composed plan"].stdout)["skip"]["rollout"]
    assert (composed["enable"], composed["action"], composed["namespace"]) == (True, "repeat_last", "cli")


def test_console_script_is_installed() -> None:
    script = shutil.which("skipweave", path=os.path.dirname(sys.executable))
    assert script is not None, "the `skipweave` entry point is not installed next to this python"
    result = run([script, "run", "--help"], cwd=Path.cwd())
    assert result.returncode == 0 and "--skip PROFILE" in result.stdout, result
