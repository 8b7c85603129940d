"""What a ``skipweave`` marker asks for, checked before anything is woven, and the plan each mode weaves
(skipweave.testing.golden), in-process: the marker's arguments and their errors, and the roles a mode changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipweave.config.errors import ConfigError
from skipweave.config.loader import load_skip_config
from skipweave.testing.golden import GoldenError, GoldenRun, MarkerError, MarkerSpec, Mode, compose, for_mode

ROLE = {"skip": {"rollout": {"targets": {"gen": "some_host:Gen.generate"}}}}


def spec(*args: object, **kwargs: object) -> MarkerSpec:
    return MarkerSpec.from_marker(args, kwargs, Path("/repo/tests"))


def test_paths_are_relative_to_the_test_file() -> None:
    s = spec("rollout_cache", "profiles/mine.yaml", "/abs/other.yaml", dump_dir="golden", rollout__steps=[1, 2],
             **{"update.compare.default": "exact"})
    assert s.profiles == ("rollout_cache", "/repo/tests/profiles/mine.yaml", "/abs/other.yaml")
    assert (s.recording, s.kind, s.cfg) == (Path("/repo/tests/golden"), "dump_dir", None)
    assert s.overrides == (("rollout.steps", [1, 2]), ("update.compare.default", "exact"))
    assert s.explicit == {"rollout.steps", "update.compare.default"}


def test_bundle_is_the_recording_too() -> None:
    """A bundle (a single-file recording, ``skipweave pack``) is the recording, read in place when replayed."""
    s = spec("rollout_cache", bundle="golden.zip")
    assert (s.recording, s.kind) == (Path("/repo/tests/golden.zip"), "bundle")


@pytest.mark.parametrize(("args", "kwargs", "says"), [
    ((), {}, "got neither of dump_dir= and bundle=; give exactly one"),
    ((), {"dump_dir": "a", "bundle": "b"}, "got ['dump_dir', 'bundle'] of dump_dir= and bundle=; give exactly one"),
    ((), {"dump_dir": 3}, "dump_dir=3 is not allowed: a path (str or os.PathLike)"),
    ((3,), {"dump_dir": "a"}, "profile 3 is not allowed: a profile is a shipped name"),
    ((), {"dump_dir": "a", "cfg": "no_such.yaml"}, "cfg='no_such.yaml': there is no file /repo/tests/no_such.yaml"),
    ((), {"dump_dir": "a", "__": 1}, "override '__' is not allowed: an override names a key under skip"),
    ((), {"bundle": "golden"}, "bundle='golden' is not allowed: bundle= names a bundle (a file ending in .zip"),
    ((), {"dump_dir": "golden.zip"}, "dump_dir='golden.zip' is not allowed: bundle= names a bundle"),
])
def test_wrong_arguments_are_named(args: tuple[object, ...], kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(MarkerError) as exc:
        spec(*args, **kwargs)
    assert says in str(exc.value)


def test_each_mode_changes_the_enabled_roles(tmp_path: Path) -> None:
    cfg = {"skip": {"rollout": {"targets": {"gen": "some_host:Gen.generate"}},
                    "update": {"enable": True, "action": "verify", "targets": {"u": "some_host:Trainer.update"}},
                    "off": {"enable": False, "targets": {"x": "some_host:X.y"}}}}
    plan = compose(spec("rollout_cache", cfg=cfg, dump_dir=str(tmp_path / "rec"), **{"update.compare.default":
                                                                                      {"atol": 1e-6}}))
    replay = load_skip_config(for_mode(plan, Mode.REPLAY, tmp_path / "copy", tmp_path / "v.jsonl")).roles
    assert (replay["rollout"].replay_only, replay["rollout"].dump_dir) == (True, str(tmp_path / "copy"))
    assert (replay["update"].action.value, replay["update"].on_diverge.value, replay["update"].report) == (
        "verify", "error", str(tmp_path / "v.jsonl"))
    assert not replay["off"].enable and not replay["off"].replay_only
    record = load_skip_config(for_mode(plan, Mode.RECORD, tmp_path / "new", None)).roles
    assert (record["rollout"].replay_only, record["rollout"].action.value) == (False, "cache")
    assert (record["update"].action.value, record["update"].dump_dir) == ("cache", str(tmp_path / "new"))
    # a mode leaves what the marker set itself
    plan = compose(spec("rollout_verify", cfg=ROLE, dump_dir="rec", rollout__on_diverge="warn"))
    marked = spec("rollout_verify", cfg=ROLE, dump_dir="rec", rollout__on_diverge="warn")
    replay = load_skip_config(for_mode(plan, Mode.REPLAY, tmp_path, tmp_path / "v", marked.explicit)).roles
    assert replay["rollout"].on_diverge.value == "warn"


def test_a_bad_override_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="skip.rollout.steps"):
        compose(spec("rollout_cache", cfg=ROLE, dump_dir="rec", rollout__steps="every other"))


def test_replay_needs_a_recording(tmp_path: Path) -> None:
    run = GoldenRun(spec("rollout_cache", cfg=ROLE, dump_dir=str(tmp_path / "none")), Mode.REPLAY, "t.py::test_x")
    with pytest.raises(GoldenError, match="no recording at .*none .*record it: pytest --skipweave-mode=record "
                                          "'t.py::test_x'"):
        run.start()
    assert not run.woven and list(tmp_path.iterdir()) == []
