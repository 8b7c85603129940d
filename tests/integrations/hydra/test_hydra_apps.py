"""``+skip=<profile>`` on real Hydra apps, driven from their command line in subprocesses.

The apps (``apps/``) import nothing from skipweave: all they get comes from the search-path plugin,
the profile and the callback it registers. A woven app start imports torch (seconds), so each test's
runs are a *scenario* started in the background when the module starts (see ``Scenarios``); the
test itself only reads the runs and asserts.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integrations.hydra.runner import (
    REPO,
    Run,
    Scenarios,
    clean_env,
    hydra_app,
    recorded_steps,
    run,
    run_all,
    selected_tests,
)

GEN = "+skip.rollout.targets.gen=worker.Generator.generate"
SCENARIOS: dict[str, Callable[[Path], Any]] = {}


def scenario(test_name: str) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register the runs of test ``test_name``."""

    def register(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        SCENARIOS[test_name] = fn
        return fn

    return register


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenarios]:
    started = Scenarios()
    for name in selected_tests(request):  # in the module's order: the first test waits least
        if name not in SCENARIOS:
            continue
        started.start(name, SCENARIOS[name], tmp_path_factory.mktemp(name[5:30]))
    yield started
    started.close()


# --- no profile -------------------------------------------------------------------------------------


@scenario("test_no_profile_patches_nothing_and_the_plugin_imports_nothing_heavy")
def _no_profile(tmp: Path) -> Run:
    return run(hydra_app("app.py", out=tmp), cwd=tmp)


def test_no_profile_patches_nothing_and_the_plugin_imports_nothing_heavy(runs: Scenarios) -> None:
    result = runs.result("test_no_profile_patches_nothing_and_the_plugin_imports_nothing_heavy")
    assert result.returncode == 0, result
    report = result.report
    assert report["plugins"], "Hydra did not import the search-path plugin"
    assert report["patched"] is False
    assert report["loaded"] == [], f"imported without a profile: {report['loaded']}"
    assert report["real_calls"] == [1, 2, 3]


# --- record, replay, targets --------------------------------------------------------------------------


@scenario("test_profile_records_then_replays_keeping_the_apps_and_the_profiles_targets")
def _record_replay(tmp: Path) -> tuple[Path, Run]:
    # One process, two jobs of a sweep (a weave per job): job 1 records every step, job 2 replays.
    return tmp, run(
        hydra_app(
            "app.py",
            "--config-name=with_targets",
            "--multirun",
            "+skip=rollout_cache",
            f"skip.rollout.dump_dir={tmp}/dump",
            "+job=1,2",
            out=tmp,
        ),
        cwd=tmp,
    )


def test_profile_records_then_replays_keeping_the_apps_and_the_profiles_targets(runs: Scenarios) -> None:
    tmp, result = runs.result("test_profile_records_then_replays_keeping_the_apps_and_the_profiles_targets")
    assert result.returncode == 0, result
    first, second = result.reports
    assert (first["job"], second["job"]) == (1, 2)
    assert first["patched"] and first["real_calls"] == [1, 2, 3]
    assert second["real_calls"] == [], "job 2 generated again instead of replaying"
    assert second["results"] == first["results"]
    assert recorded_steps(tmp / "dump") == [1, 2, 3]
    # The app's own target (conf/with_targets.yaml) joined the profile's optional verl target.
    job_cfg = yaml.safe_load((tmp / "multirun" / "0" / ".hydra" / "config.yaml").read_text())
    targets = job_cfg["skip"]["rollout"]["targets"]
    assert targets["gen"] == "worker.Generator.generate"
    assert targets["verl_agent_loop"]["optional"] is True


@scenario("test_usual_overrides")
def _overrides(tmp: Path) -> tuple[Path, Run, Run]:
    dump = tmp / "dump"
    # steps=[1,3] with action cache, then with action repeat (a namespace per action keeps them apart).
    sweep = run(
        hydra_app(
            "app.py",
            "--multirun",
            "+skip=rollout_cache",
            GEN,
            "skip.rollout.steps=[1,3]",
            f"skip.rollout.dump_dir={dump}",
            "skip.rollout.action=cache,repeat",
            "skip.rollout.namespace=${skip.rollout.action}",
            out=tmp / "a",
        ),
        cwd=tmp,
    )
    disabled = run(
        hydra_app(
            "app.py",
            "+skip=rollout_cache",
            GEN,
            "skip.rollout.enable=false",
            f"skip.rollout.dump_dir={dump}/off",
            out=tmp / "b",
        ),
        cwd=tmp,
    )
    return dump, sweep, disabled


def test_usual_overrides(runs: Scenarios) -> None:
    dump, sweep, disabled = runs.result("test_usual_overrides")
    assert sweep.returncode == 0, sweep
    cache, repeat = sweep.reports
    assert cache["real_calls"] == [1, 2, 3] and recorded_steps(dump, "cache") == [1, 3]
    # repeat: step 1 recorded; step 2 not eligible (runs live); step 3 replays step 1.
    assert repeat["real_calls"] == [1, 2] and recorded_steps(dump, "repeat") == [1]
    assert repeat["results"][2] == repeat["results"][0]
    assert disabled.returncode == 0, disabled
    assert disabled.report["patched"] is False and "torch" not in disabled.report["loaded"]
    assert not (dump / "off").exists()


@scenario("test_targets_never_called_and_roles_never_eligible_are_named_at_the_end")
def _silent(tmp: Path) -> tuple[Run, Run]:
    never = run(hydra_app("app.py", "+skip=rollout_cache", GEN, f"skip.rollout.dump_dir={tmp}/a",
                          "+skip.rollout.targets.lazy=lazy_worker.LazyGenerator.generate", out=tmp / "a"), cwd=tmp)
    ineligible = run(hydra_app("app.py", "+skip=rollout_cache", GEN, f"skip.rollout.dump_dir={tmp}/b",
                               "skip.rollout.steps=[50]", out=tmp / "b"), cwd=tmp)
    return never, ineligible


def test_targets_never_called_and_roles_never_eligible_are_named_at_the_end(runs: Scenarios) -> None:
    never, ineligible = runs.result("test_targets_never_called_and_roles_never_eligible_are_named_at_the_end")
    assert never.returncode == 0 and ineligible.returncode == 0, (never, ineligible)
    out = never.stdout + never.stderr
    assert "role rollout target lazy (lazy_worker.LazyGenerator.generate) was woven but never called" in out, never
    assert "target gen (" not in out and "none of its calls was eligible" not in out
    out = ineligible.stdout + ineligible.stderr
    assert "role rollout: none of its calls was eligible" in out and "skip.rollout.steps=" in out, ineligible
    assert "skipweave summary role=rollout: calls=3 hits=0 misses=0 bypasses=3" in out, ineligible


# --- profiles of one's own, several profiles -------------------------------------------------------------

OWN_PROFILE = """\
# No '# @package' header and no defaults line: a profile from SKIPWEAVE_PROFILE_PATH needs neither.
skip:
  rollout:
    enable: true
    action: cache
    dump_dir: ???
    targets:
      gen: worker.Generator.generate
"""


@scenario("test_profiles_on_the_search_path_and_several_profiles_compose_in_hydra_apps")
def _own_profiles(tmp: Path) -> tuple[Path, list[Run]]:
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "mine.yaml").write_text(OWN_PROFILE)
    (tmp / "profiles" / "foreign.yaml").write_text("rollout:\n  enable: true\n")
    env = clean_env(SKIPWEAVE_PROFILE_PATH=str(tmp / "profiles"))
    sweep = hydra_app(
        "app.py", "--multirun", "+skip=mine", f"skip.rollout.dump_dir={tmp}/dump", "+job=1,2", out=tmp / "a"
    )
    # `--cfg job` prints the composed job config and runs no task (no torch): cheap checks of the order.
    shipped = hydra_app("app.py", "--cfg=job", "+skip=[rollout_cache,rollout_repeat]", out=tmp / "b")
    mixed = hydra_app("app.py", "--cfg=job", "+skip=[mine,rollout_repeat]", "skip.rollout.steps=[2]", out=tmp / "c")
    foreign = hydra_app("app.py", "+skip=foreign", out=tmp / "d")
    return tmp, run_all((sweep, tmp, env), (shipped, tmp), (mixed, tmp, env), (foreign, tmp, env))


def test_profiles_on_the_search_path_and_several_profiles_compose_in_hydra_apps(runs: Scenarios) -> None:
    tmp, (sweep, shipped, mixed, foreign) = runs.result(
        "test_profiles_on_the_search_path_and_several_profiles_compose_in_hydra_apps"
    )
    assert sweep.returncode == 0, sweep
    first, second = sweep.reports
    assert first["patched"] and first["real_calls"] == [1, 2, 3]
    assert second["real_calls"] == [] and second["results"] == first["results"]
    assert recorded_steps(tmp / "dump") == [1, 2, 3]
    assert shipped.returncode == 0, shipped
    assert yaml.safe_load(shipped.stdout)["skip"]["rollout"]["action"] == "repeat"  # the later profile won
    assert mixed.returncode == 0, mixed
    role = yaml.safe_load(mixed.stdout)["skip"]["rollout"]
    assert (role["action"], role["steps"], role["targets"]["gen"]) == ("repeat", [2], "worker.Generator.generate")
    assert foreign.returncode != 0 and not foreign.task_started, foreign
    assert f"{tmp / 'profiles' / 'foreign.yaml'} has top-level key 'rollout'" in foreign.stderr, foreign
    assert "Traceback" not in foreign.stderr, foreign


# --- failures -----------------------------------------------------------------------------------------

FAILURES = {
    "bad action": (["skip.rollout.action=bogus", GEN], ["skip.rollout.action", "'bogus'"]),
    "bad steps": (["skip.rollout.steps=[3-1]", GEN], ["skip.rollout.steps", "3-1"]),
    # lazy_worker is imported only inside the task: the callback must still catch the typo first.
    "lazy target": (
        ["+use_lazy=true", "+skip.rollout.targets.lazy=lazy_worker.LazyGenerator.genrate"],
        ["skip.rollout.targets.lazy", "lazy_worker.LazyGenerator.genrate"],
    ),
    "no module": (
        ["+skip.rollout.targets.gen=wrker.Generator.generate"],
        ["skip.rollout.targets.gen", "'wrker'"],
    ),
}


@scenario("test_a_bad_value_or_target_stops_the_run_before_the_task")
def _failures(tmp: Path) -> dict[str, Run]:
    return {
        name: run(hydra_app("app.py", "+skip=rollout_cache", *args, out=tmp / str(i)), cwd=tmp)
        for i, (name, (args, _)) in enumerate(FAILURES.items())
    }


def test_a_bad_value_or_target_stops_the_run_before_the_task(runs: Scenarios) -> None:
    results = runs.result("test_a_bad_value_or_target_stops_the_run_before_the_task")
    for name, (_, needles) in FAILURES.items():
        result = results[name]
        assert result.returncode != 0, result
        assert not result.task_started, result
        assert "stopped before the task started" in result.stderr, result
        for needle in needles:
            assert needle in result.stderr, (name, result)
        assert "UserWarning: Callback" not in result.stderr  # not demoted to one of Hydra's warnings


# --- legacy verl keys ---------------------------------------------------------------------------------


@scenario("test_legacy_verl_keys_are_remapped_with_visible_warnings")
def _legacy(tmp: Path) -> tuple[Path, Run, Run]:
    # The example: verl 2026 keys (max_dump_step 2, action cache) with +skip=rollout_cache.
    # (Every legacy form is covered in-process by tests/config/test_legacy.py.)
    env = clean_env(LEGACY_DUMP_DIR=str(tmp / "dump"))
    args = hydra_app("app.py", "--config-name=legacy2026", "+skip=rollout_cache", GEN, out=tmp)
    return tmp, run(args, cwd=tmp, env=env), run(args, cwd=tmp, env=env)


def test_legacy_verl_keys_are_remapped_with_visible_warnings(runs: Scenarios) -> None:
    tmp, first, second = runs.result("test_legacy_verl_keys_are_remapped_with_visible_warnings")
    assert first.returncode == 0, first
    assert second.returncode == 0, second
    # Steps 1-2 are recorded under the legacy dump dir and replayed by a later run; step 3 runs live.
    assert first.report["real_calls"] == [1, 2, 3]
    assert second.report["real_calls"] == [3]
    assert second.report["results"][:2] == first.report["results"][:2]
    assert recorded_steps(tmp / "dump") == [1, 2]
    for result in (first, second):
        stderr = result.stderr
        assert (
            "SkipweaveDeprecationWarning: actor_rollout_ref.rollout.skip.max_dump_step is deprecated"
            in stderr
        )
        assert "skip.rollout.steps=1-2" in stderr
        assert (
            f"actor_rollout_ref.rollout.skip.dump_dir is deprecated; skipweave reads it as "
            f"skip.rollout.dump_dir={tmp / 'dump'}" in stderr
        )


# --- dataclass-schema apps, experiment YAML -------------------------------------------------------------


@scenario("test_dataclass_schema_app_uses_the_skipweave_group")
def _schema(tmp: Path) -> tuple[Path, Run, Run]:
    refused = run(hydra_app("schema_app.py", "+skip=rollout_cache", out=tmp / "a"), cwd=tmp)
    woven = run(
        hydra_app(
            "schema_app.py",
            "+skipweave=rollout_cache",
            f"hydra.callbacks.skipweave.skip.rollout.dump_dir={tmp}/dump",
            "+hydra.callbacks.skipweave.skip.rollout.targets.gen=worker.Generator.generate",
            out=tmp / "b",
        ),
        cwd=tmp,
    )
    return tmp, refused, woven


def test_dataclass_schema_app_uses_the_skipweave_group(runs: Scenarios) -> None:
    tmp, refused, woven = runs.result("test_dataclass_schema_app_uses_the_skipweave_group")
    assert refused.returncode != 0 and "Key 'skip' not in 'Config'" in refused.stderr, refused
    assert woven.returncode == 0, woven
    assert woven.report["patched"] and woven.report["real_calls"] == [1, 2, 3]
    assert recorded_steps(tmp / "dump") == [1, 2, 3]


@scenario("test_experiment_yaml_example_selects_a_profile_and_overrides_it")
def _experiment(tmp: Path) -> tuple[Path, Run, Run]:
    env = clean_env(ROLLOUT_DUMP_DIR=str(tmp / "dump"))
    args = [
        sys.executable,
        str(REPO / "examples" / "hydra_experiment" / "train.py"),
        "+experiment=cached_rollout",
        f"hydra.run.dir={tmp}/out",
    ]
    return tmp, run(args, cwd=tmp, env=env), run(args, cwd=tmp, env=env)


def test_experiment_yaml_example_selects_a_profile_and_overrides_it(runs: Scenarios) -> None:
    tmp, first, second = runs.result("test_experiment_yaml_example_selects_a_profile_and_overrides_it")
    assert first.returncode == 0, first
    assert second.returncode == 0, second
    assert "generated live at steps: [1, 2, 3, 4]" in first.stdout, first
    assert "generated live at steps: [3, 4]" in second.stdout, second
    assert recorded_steps(tmp / "dump", "cached_rollout") == [1, 2]

    def responses(stdout: str) -> list[str]:
        return [line.split("first response ")[1] for line in stdout.splitlines() if "first response" in line]

    assert responses(second.stdout)[:2] == responses(first.stdout)[:2]


# --- install modes --------------------------------------------------------------------------------------
# CI installs skipweave editable (every test above); a user's `pip install skipweave` gets the wheel.


@scenario("test_wheel_install_ships_the_profiles_and_the_plugin")
def _wheel(tmp: Path) -> tuple[Path, str, Run]:
    python = install_wheel(tmp)
    where = subprocess.run(
        [
            python,
            "-c",
            "import skipweave, hydra_plugins.skipweave_searchpath as p; "
            "print(skipweave.__file__, p.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp,
    ).stdout
    woven = run(
        hydra_app(
            "app.py", "+skip=rollout_cache", GEN, f"skip.rollout.dump_dir={tmp}/dump", out=tmp, python=python
        ),
        cwd=tmp,
    )
    return tmp, where, woven


def test_wheel_install_ships_the_profiles_and_the_plugin(runs: Scenarios) -> None:
    tmp, where, woven = runs.result("test_wheel_install_ships_the_profiles_and_the_plugin")
    assert str(REPO) not in where and where.count(str(tmp / "venv")) == 2, where
    assert woven.returncode == 0, woven
    assert woven.report["patched"] and woven.report["real_calls"] == [1, 2, 3]
    assert recorded_steps(tmp / "dump") == [1, 2, 3]


def install_wheel(tmp: Path) -> str:
    """Build skipweave's wheel from a copy of the checkout and install it into a fresh venv under ``tmp``.

    The venv sees this environment's packages (hydra, torch…) through a ``.pth`` line, which does not
    run that folder's own ``.pth`` files: the editable install's finder stays out, so ``skipweave``
    resolves to the wheel's copy only. Returns the venv's python.
    """
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("skipweave", "hydra_plugins", "conf"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            *isolation,
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp,
    )
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True, cwd=tmp)
    python = str(tmp / "venv" / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "host_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next((tmp / "dist").glob("skipweave-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            site,
            str(wheel),
        ],
        check=True,
        capture_output=True,
        cwd=tmp,
    )
    return python
