"""A third party's integration, installed as a real package: found by its entry point, its host type and its profile
used by ``skipweave run --skip <its profile>`` and by a Hydra app's ``+skip=<its profile>``.

``tests/fixtures/thirdparty_pkg`` is a distribution (``skipweave-thirdparty-fixture`` 1.0.0) holding a host library
(``thirdparty_host``: ``Scorer.score`` returns a ``Scored``, a class of its own that the codec stores only through a
host type) and its skipweave integration (``thirdparty_skip``: the declaration, the host type, the profile
``thirdparty_cache``), declared in the entry-point group ``skipweave.integrations``. It is installed with ``pip install
--no-deps --no-build-isolation --target DIR`` (a real ``dist-info`` with real entry points; ~2 s), once as 1.0.0 and
once as 2.0.0 (outside the range ``>=1,<2`` the integration declares), and ``DIR`` is put on the programs'
``PYTHONPATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integrations.hydra.runner import REPO, Run, clean_env, run

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "thirdparty_pkg"
SKIPWEAVE = [sys.executable, "-m", "skipweave.cli"]

APP = """\
import json
from thirdparty_host import LIVE, Scorer

scorer = Scorer()
results = [scorer.score(f"text {i}").as_json() for i in range(3)]
print("TASK STARTED")
print("REPORT " + json.dumps({"live": len(LIVE), "results": results}))
"""

HYDRA_APP = """\
import json
import hydra

@hydra.main(version_base=None, config_path=None)
def main(cfg):
    from thirdparty_host import LIVE, Scorer

    scorer = Scorer()
    results = [scorer.score(f"text {i}").as_json() for i in range(3)]
    print("TASK STARTED")
    print("REPORT " + json.dumps({"live": len(LIVE), "results": results}))

main()
"""

OFF_BY_SWITCH = ("'thirdparty_cache' is a profile of integration 'thirdparty', which is off in this process: "
                 "SKIPWEAVE_DISABLED_INTEGRATIONS names it")
OUT_OF_RANGE = ("skipweave: integration 'thirdparty': skipweave-thirdparty-fixture 2.0.0 is installed and the "
                "integration supports skipweave-thirdparty-fixture >=1,<2")


def install(work: Path, version: str) -> Path:
    """Install a copy of the fixture package as ``version`` into a folder of its own; returns the folder."""
    src = work / f"src-{version}"
    shutil.copytree(FIXTURE, src)  # built from a copy: a build leaves build/ and *.egg-info beside the sources
    project = src / "pyproject.toml"
    text, count = re.subn(r'(?m)^version = "1\.0\.0"$', f'version = "{version}"', project.read_text())
    assert count == 1, "the fixture's pyproject.toml names no version 1.0.0"
    project.write_text(text)
    target = work / f"site-{version}"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    points = next(target.glob("skipweave_thirdparty_fixture-*.dist-info")) / "entry_points.txt"
    assert "thirdparty = thirdparty_skip:INTEGRATION" in points.read_text()
    return target


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("thirdparty")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {v: pool.submit(install, work, v) for v in ("1.0.0", "2.0.0")}
        return {v: f.result() for v, f in futures.items()}


def env_with(site: Path, **extra: str) -> dict[str, str]:
    """The test's environment with ``site`` first on ``PYTHONPATH`` (then this tree's skipweave)."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return clean_env(PYTHONPATH=path, **extra)


def skipweave_run(tmp: Path, site: Path, dump: Path, **extra: str) -> Run:
    (tmp / "app.py").write_text(APP)
    return run([*SKIPWEAVE, "run", "--skip", "thirdparty_cache", f"skip.thirdparty.dump_dir={dump}", "--",
                sys.executable, "app.py"], cwd=tmp, env=env_with(site, **extra))


def test_its_profile_records_then_replays_under_skipweave_run(sites: dict[str, Path], tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    first = skipweave_run(tmp_path, sites["1.0.0"], dump)
    assert first.returncode == 0, first
    assert first.report["live"] == 3
    second = skipweave_run(tmp_path, sites["1.0.0"], dump)
    assert second.returncode == 0, second
    assert second.report["live"] == 0, second  # every call served by the recording
    assert second.report["results"] == first.report["results"]
    assert {r["type"] for r in second.report["results"]} == {"Scored"}  # rebuilt through the host type
    assert "WARNING" not in first.stderr + second.stderr and "integration" not in first.stderr + second.stderr
    # the store holds the integration's node kind; `skipweave ls` (which loads the integrations) judges it valid
    trees = "".join(p.read_text(errors="replace") for p in dump.rglob("*.json"))
    assert '"t": "thirdparty_scored"' in trees or '"t":"thirdparty_scored"' in trees
    listing = run([*SKIPWEAVE, "ls", str(dump)], cwd=tmp_path, env=env_with(sites["1.0.0"]))
    assert listing.returncode == 0 and "thirdparty" in listing.stdout, listing


def test_its_profile_composes_into_a_hydra_app(sites: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "hydra_app.py").write_text(HYDRA_APP)
    args = [sys.executable, "hydra_app.py", "+skip=thirdparty_cache", f"skip.thirdparty.dump_dir={tmp_path / 'dump'}",
            f"hydra.run.dir={tmp_path / 'out'}"]
    first = run(args, cwd=tmp_path, env=env_with(sites["1.0.0"]))
    assert first.returncode == 0 and first.report["live"] == 3, first
    second = run(args, cwd=tmp_path, env=env_with(sites["1.0.0"]))
    assert second.returncode == 0 and second.report["live"] == 0, second
    assert second.report["results"] == first.report["results"]


def test_switched_off_its_profile_is_unknown_and_says_why(sites: dict[str, Path], tmp_path: Path) -> None:
    off = skipweave_run(tmp_path, sites["1.0.0"], tmp_path / "dump", SKIPWEAVE_DISABLED_INTEGRATIONS="thirdparty")
    assert off.returncode == 2 and not off.task_started, off
    assert "profile='thirdparty_cache' is not allowed" in off.stderr and OFF_BY_SWITCH in off.stderr, off
    assert not (tmp_path / "dump").exists()
    # a Hydra app does not find it either (skipweave's search-path plugin leaves its folder out)
    (tmp_path / "hydra_app.py").write_text(HYDRA_APP)
    hydra = run([sys.executable, "hydra_app.py", "+skip=thirdparty_cache", f"hydra.run.dir={tmp_path / 'out'}"],
                cwd=tmp_path, env=env_with(sites["1.0.0"], SKIPWEAVE_DISABLED_INTEGRATIONS="thirdparty"))
    assert hydra.returncode != 0 and not hydra.task_started and OFF_BY_SWITCH in hydra.stderr, hydra


def test_in_a_hydra_app_its_profiles_are_judged_as_ones_own_and_a_broken_part_stops_the_run(
    sites: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "hydra_app.py").write_text(HYDRA_APP)

    def hydra(profile: str, **extra: str) -> Run:
        return run([sys.executable, "hydra_app.py", f"+skip={profile}", f"skip.thirdparty.dump_dir={tmp_path / 'd'}",
                    f"hydra.run.dir={tmp_path / 'out'}"], cwd=tmp_path, env=env_with(sites["1.0.0"], **extra))

    extra = hydra("thirdparty_extra")
    assert extra.returncode != 0 and not extra.task_started, extra
    assert "+skip='thirdparty_extra' is not allowed" in extra.stderr and "top-level key 'thirdparty'" in extra.stderr
    assert "(a role goes under skip:, as skip.thirdparty)" in extra.stderr and "Traceback" not in extra.stderr, extra
    bad = hydra("thirdparty_badyaml")
    assert bad.returncode != 0 and not bad.task_started and "Traceback" not in bad.stderr, bad
    assert "+skip='thirdparty_badyaml' is not allowed: a valid YAML file" in bad.stderr, bad
    assert "thirdparty_badyaml.yaml, line " in bad.stderr, bad
    # skipweave run's --skip judges them the same, naming its own key
    (tmp_path / "app.py").write_text(APP)
    for profile, said in (("thirdparty_extra", "has top-level key 'thirdparty'"),
                          ("thirdparty_badyaml", "a valid YAML file; ")):
        refused = run([*SKIPWEAVE, "run", "--skip", profile, "--", sys.executable, "app.py"], cwd=tmp_path,
                      env=env_with(sites["1.0.0"]))
        assert refused.returncode == 2 and not refused.task_started, refused
        assert f"skipweave run: profile='{profile}' is not allowed: " in refused.stderr and said in refused.stderr
    # Hydra's search path reads the declaration only; the part that fails to load is found by the callback, which
    # stops the run before the task: its targets would else be woven without the host type they were written for.
    broken = hydra("thirdparty_cache", THIRDPARTY_BREAK_HOSTS="1")
    assert broken.returncode != 0 and not broken.task_started, broken
    assert "+skip='thirdparty_cache' is not allowed" in broken.stderr, broken
    assert "integration 'thirdparty', which is off in this process: a part failed to load" in broken.stderr, broken
    assert "THIRDPARTY_BREAK_HOSTS is set" in broken.stderr and "Traceback" not in broken.stderr, broken
    said = broken.stdout + broken.stderr  # Hydra's log (the WARNING) goes to stdout
    assert said.count("thirdparty_skip.hosts is broken on purpose") == 2, broken  # the WARNING, the error


def test_a_host_outside_its_range_warns_once_and_stays_off_unless_forced(
    sites: dict[str, Path], tmp_path: Path
) -> None:
    off = skipweave_run(tmp_path, sites["2.0.0"], tmp_path / "dump")
    assert off.returncode == 2 and not off.task_started, off
    assert off.stderr.count(OUT_OF_RANGE) == 1, off
    assert "it stays off (set SKIPWEAVE_FORCE_INTEGRATIONS=thirdparty to load it all the same)" in off.stderr
    assert "'thirdparty_cache' is a profile of integration 'thirdparty', which is off in this process" in off.stderr
    forced = skipweave_run(tmp_path, sites["2.0.0"], tmp_path / "dump", SKIPWEAVE_FORCE_INTEGRATIONS="thirdparty")
    assert forced.returncode == 0 and forced.report["live"] == 3, forced
    # one WARNING for the run: the program inherits that its launcher said it (SKIPWEAVE_WARNED_INTEGRATIONS)
    assert forced.stderr.count(OUT_OF_RANGE) == 1, forced
    assert "loaded all the same, as SKIPWEAVE_FORCE_INTEGRATIONS names it" in forced.stderr


def test_the_fixture_package_is_left_as_it_is_in_the_repository() -> None:
    """The builds ran on copies: no build/ or *.egg-info beside the fixture's sources."""
    left = sorted(p.name for p in FIXTURE.iterdir() if p.name == "build" or p.name.endswith(".egg-info"))
    assert not left, left

