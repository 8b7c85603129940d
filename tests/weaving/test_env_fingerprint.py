"""Environment fingerprints: an entry recorded with other engine or host versions, another source of the target or
other values of named config keys is told apart on replay (skipweave.weaving.environment, Replayer.mismatch).

Each process is real: one records three steps of a host package installed in a temporary folder (with its own
``.dist-info``), each scenario then replays a copy of that store in a fresh process after changing, for real, what it
is about: stand-in ``vllm`` and ``transformers`` modules of another version on ``sys.path``, ``torch.__version__``, the
host's distribution version, the target's source file, the value of the config key the role names.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("env_driver.py")
ENGINES = "vllm,transformers"

HOST = '''
REAL = []


class Batch:
    def __init__(self, step):
        self.meta_info = {"global_steps": step}


class Rollout:
    def generate(self, batch):
        REAL.append(batch.meta_info["global_steps"])
        return {"tokens": [batch.meta_info["global_steps"] * 10 + i for i in range(3)], "version": 1}
'''


def _install(root: Path, *, host_version: str = "1.0", vllm: str = "0.8.4", transformers: str = "4.50.0") -> Path:
    """A host package ``envhost`` (distribution ``envhost`` ``host_version``) and stand-in engines under ``root``."""
    (root / "envhost").mkdir(parents=True)
    (root / "envhost" / "__init__.py").write_text("")
    (root / "envhost" / "rollout.py").write_text(HOST)
    for dist in root.glob("envhost-*.dist-info"):
        shutil.rmtree(dist)
    info = root / f"envhost-{host_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: envhost\nVersion: {host_version}\n")
    (info / "top_level.txt").write_text("envhost\n")
    for name, version in (("vllm", vllm), ("transformers", transformers)):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return root


def _run(root: Path, dump: Path, policy: str = "warn", temperature: float = 1.0, *extra: str,
         imports: str = ENGINES, keys: str = "{}") -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "IMPORT": imports, "EXTRA": keys}
    proc = subprocess.run([sys.executable, str(DRIVER), str(dump), policy, str(temperature), *extra],
                          capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    return {"real": json.loads(lines["REAL"]), "out": json.loads(lines["OUT"]), "mismatch": lines.get("MISMATCH"),
            "warnings": [line for line in proc.stderr.splitlines() if "another environment" in line
                         or "cannot be compared" in line],
            "stderr": proc.stderr}


def _manifests(dump: Path, step: int) -> list[Path]:
    return sorted((dump / "default" / "rollout" / str(step) / "gen").glob("*.manifest.json"))


def _edit_environments(dump: Path, step: int, change: Any) -> None:
    for path in _manifests(dump, step):
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = _install(tmp_path_factory.mktemp("record"))
    first = _run(root, root / "dump")
    assert first["real"] == [1, 2, 3] and not first["warnings"], first["stderr"]
    return root, first


def _scenarios(recorded: tuple[Path, dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """Every replay, two at a time (each starts a Python that imports torch)."""
    root, _ = recorded

    def copy(name: str, **versions: str) -> tuple[Path, Path]:
        where = _install(tmp / name, **versions)
        shutil.copytree(root / "dump", where / "dump")
        return where, where / "dump"

    def everything_changed() -> Any:
        where, dump = copy("all", host_version="1.1", vllm="0.8.5", transformers="4.51.0")
        rollout = where / "envhost" / "rollout.py"
        rollout.write_text(rollout.read_text().replace('"version": 1', '"version": 2'))
        return _run(where, dump, "warn", 0.7, "9.9.9")

    def regenerate() -> Any:
        where, dump = copy("regenerate")
        again = _run(where, dump, "regenerate", 0.7)
        return again, _run(where, dump, "warn", 0.7), json.loads(_manifests(dump, 1)[0].read_text())

    def error() -> Any:
        where, dump = copy("error", vllm="0.8.5")
        return _run(where, dump, "error")

    def engines_not_imported() -> Any:
        where, dump = copy("unimported")
        return _run(where, dump, "error", imports="")

    def old_and_crafted() -> Any:
        where, dump = copy("crafted")
        _edit_environments(dump, 1, lambda m: m.pop("environment"))
        _edit_environments(dump, 2, lambda m: m.__setitem__("environment", {"packages": {"vllm": ["x" * 100_000]},
                                                                             "config": 7}))
        return _run(where, dump, "warn", 0.7)

    jobs = {"all": everything_changed, "regenerate": regenerate, "error": error,
            "unimported": engines_not_imported, "crafted": old_and_crafted}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def replays(recorded: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _scenarios(recorded, tmp_path_factory.mktemp("replays"))


def test_each_new_entry_records_its_environment(recorded: tuple[Path, dict[str, Any]]) -> None:
    root, _ = recorded
    import torch

    (path,) = _manifests(root / "dump", 2)
    env = json.loads(path.read_text())["environment"]
    assert env["packages"] == {"torch": torch.__version__, "vllm": "0.8.4", "transformers": "4.50.0"}
    assert env["host"] == {"name": "envhost", "version": "1.0"}
    assert re.fullmatch(r"xxh3_128:[0-9a-f]{32}", env["source"])
    assert env["config"] == {"model.temperature": 1.0, "model.path": "/models/a"}


def test_every_changed_field_is_named_old_to_new_once_and_warn_serves_the_recording(
        recorded: tuple[Path, dict[str, Any]], replays: dict[str, Any]) -> None:
    import torch

    got = replays["all"]
    assert got["real"] == [] and got["out"] == recorded[1]["out"], got["stderr"]  # served: version 1, not 2
    (warning,) = got["warnings"]  # three calls, one change: one WARNING
    assert "role rollout target gen step 1 call 0" in warning and "fingerprint.on_env_mismatch=warn" in warning
    for change in (f"package torch {torch.__version__} -> 9.9.9", "package vllm 0.8.4 -> 0.8.5",
                   "package transformers 4.50.0 -> 4.51.0", "host package envhost 1.0 -> envhost 1.1",
                   "config model.temperature 1.0 -> 0.7"):
        assert change in warning
    old, new = re.search(r"target source ([0-9a-f]{12}) -> ([0-9a-f]{12})", warning).groups()  # type: ignore[union-attr]
    assert old != new
    assert "model.path" not in warning  # unchanged fields are not named


def test_regenerate_records_again_in_the_new_environment_which_then_replays_silently(
        replays: dict[str, Any]) -> None:
    again, later, manifest = replays["regenerate"]
    assert again["real"] == [1, 2, 3]
    (warning,) = again["warnings"]
    assert "config model.temperature 1.0 -> 0.7" in warning and warning.endswith("regenerating")
    assert later["real"] == [] and later["out"] == again["out"] and not later["warnings"], later["stderr"]
    assert manifest["environment"]["config"]["model.temperature"] == 0.7


def test_error_stops_at_the_first_call_naming_role_target_step_call_and_the_change(replays: dict[str, Any]) -> None:
    got = replays["error"]
    assert got["real"] == [] and got["out"] == []
    assert got["mismatch"].startswith("role rollout target gen step 1 call 0: the recording was made in another "
                                      "environment: package vllm 0.8.4 -> 0.8.5;")
    assert "skip.rollout.fingerprint.on_env_mismatch=warn or regenerate" in got["mismatch"]


def test_a_package_imported_on_one_side_only_is_no_change(replays: dict[str, Any]) -> None:
    got = replays["unimported"]  # on_env_mismatch=error: any difference would stop it
    assert got["real"] == [] and got["mismatch"] is None and not got["warnings"], got["stderr"]


def test_entries_without_an_environment_replay_silently_and_a_crafted_one_is_a_change(
        recorded: tuple[Path, dict[str, Any]], replays: dict[str, Any]) -> None:
    got = replays["crafted"]
    assert got["real"] == [] and got["out"] == recorded[1]["out"], got["stderr"]
    assert not [w for w in got["warnings"] if "step 1 " in w]  # recorded before environments: never compared
    crafted, changed = got["warnings"]
    assert "step 2 call 0" in crafted and "environment invalid (environment.packages['vllm'] is not a string" in crafted
    assert "step 3 call 0" in changed and "config model.temperature 1.0 -> 0.7" in changed


def test_a_named_integer_beyond_64_bits_is_recorded_hashed_and_a_replay_compares_the_rest(tmp_path: Path) -> None:
    root = _install(tmp_path)  # a seed of 2**64 once made every replay with another temperature raise in the host
    keys = json.dumps({"seed": 2**64})
    first = _run(root, root / "dump", "warn", 0.7, keys=keys)
    assert first["real"] == [1, 2, 3], first["stderr"]
    seed = json.loads(_manifests(root / "dump", 1)[0].read_text())["environment"]["config"]["model.seed"]
    assert re.fullmatch(r"xxh3_64:[0-9a-f]{16}", seed)
    got = _run(root, root / "dump", "warn", 0.9, keys=keys)
    assert got["real"] == [] and got["out"] == first["out"] and "Traceback" not in got["stderr"], got["stderr"]
    (warning,) = got["warnings"]
    assert "config model.temperature 0.7 -> 0.9" in warning and "model.seed" not in warning


def test_a_live_environment_that_cannot_be_flattened_is_one_warning_never_the_hosts_error(tmp_path: Path) -> None:
    root = _install(tmp_path)
    metadata = root / "envhost-1.0.dist-info" / "METADATA"  # a version longer than a recorded one may be
    metadata.write_text(metadata.read_text().replace("Version: 1.0", "Version: 1." + "9" * 300))
    first = _run(root, root / "dump", "error")
    assert first["real"] == [1, 2, 3], first["stderr"]
    got = _run(root, root / "dump", "error", 0.7)  # a changed temperature is not noticed: nothing is compared
    assert got["real"] == [] and got["out"] == first["out"] and got["mismatch"] is None, got["stderr"]
    (warning,) = got["warnings"]
    assert "role rollout target gen: this process's environment cannot be compared" in warning
    assert "environment.host.version" in warning and "Traceback" not in got["stderr"]


@pytest.mark.parametrize(("old", "new"), [(0, False), (1, True), (1, 1.0), (True, 1.0), ("1", 1),
                                          ({"a": [0, 1]}, {"a": [False, 1]}), ([{"b": 1}], [{"b": 1.0}])],
                         ids=["0-false", "1-true", "1-1.0", "true-1.0", "str-int", "nested-0-false", "nested-1-1.0"])
def test_a_named_value_of_another_type_is_a_change_and_the_same_one_is_silent(
        host_module: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, old: Any, new: Any) -> None:
    """In this process (real patches, a real store): Python's == finds each pair equal (but str-int), JSON does not;
    with on_env_mismatch: error the replay must stop, naming the key, and replay the same value silently."""
    import skipweave

    name, _ = host_module(HOST)
    mod = sys.modules[name]

    def run(value: Any) -> Any:
        skipweave.unweave()
        skipweave.weave({"model": {"flag": value}, "skip": {"rollout": {
            "enable": True, "dump_dir": str(tmp_path), "targets": {"gen": f"{name}:Rollout.generate"},
            "fingerprint": {"env": ["model.flag"], "on_env_mismatch": "error"}}}})
        out = mod.Rollout().generate(mod.Batch(1))
        skipweave.flush()
        return out

    first = run(old)
    assert mod.REAL == [1]
    shown = "'xxh3_64:" if isinstance(old, (dict, list)) else repr(old)  # lists and mappings are recorded hashed
    with pytest.raises(skipweave.EnvironmentMismatch, match=re.escape(f"config model.flag {shown}")):
        run(new)
    assert mod.REAL == [1]
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        assert run(old) == first and mod.REAL == [1]  # the same value and type: served, nothing said
    assert not [r for r in caplog.records if "another environment" in r.getMessage()]
