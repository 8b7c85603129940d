"""What a ``skipweave`` marker asks for, checked before anything is woven, and the plan each mode weaves
(skipweave.testing.golden), in-process: the marker's arguments and their errors, the roles a mode changes, and what
a golden run refuses to bless or to pass (woven in this process on a tiny host module)."""

from __future__ import annotations

import os
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import skipweave
from skipweave.config.errors import ConfigError
from skipweave.config.loader import load_skip_config
from skipweave.testing.golden import (
    GoldenError,
    GoldenRun,
    MarkerError,
    MarkerSpec,
    Mode,
    bless,
    bless_bundle,
    compose,
    for_mode,
)

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


@pytest.mark.parametrize("value", [".", "..", "./", "sub/..", "/repo", "/"])
def test_the_test_folder_or_a_parent_is_no_recording(value: str) -> None:
    """Blessing replaces the recording: never the folder holding the test file, nor one it lies in."""
    for kind in ("dump_dir", "bundle"):
        with pytest.raises(MarkerError, match=f"{kind}={value!r} is not allowed: it names .*the test file's folder"):
            spec("rollout_cache", **{kind: value})


HOST = textwrap.dedent('''
    import torch


    class Gen:
        def generate(self, batch):
            step = batch["meta_info"]["global_steps"]
            g = torch.Generator().manual_seed(step)
            return {"tokens": torch.randint(0, 100, (2, 4), generator=g), "meta_info": {"global_steps": step}}


    def train(steps=2):
        return [Gen().generate({"meta_info": {"global_steps": s}}) for s in range(1, steps + 1)]
''')
HOST_ROLE = {"skip": {"rollout": {"targets": {"gen": "goldenhost:Gen.generate"}}}}


@pytest.fixture
def golden_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tiny host module (``goldenhost``) importable from ``tmp_path/host``; returns the folder of the recordings."""
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "goldenhost.py").write_text(HOST)
    monkeypatch.syspath_prepend(str(tmp_path / "host"))
    (tmp_path / "t").mkdir()
    yield tmp_path / "t"
    sys.modules.pop("goldenhost", None)
    skipweave.unweave()


def golden(folder: Path, mode: Mode, *profiles: str, train: int = 0, passed: bool = True,
           **kwargs: object) -> GoldenRun:
    """One marked test's run, in-process: weave, call the host ``train`` steps, finish (which may raise)."""
    run = GoldenRun(MarkerSpec.from_marker(profiles or ("rollout_cache",), {"cfg": HOST_ROLE, **kwargs}, folder),
                    mode, "t.py::test_x")
    run.start()
    try:
        if train:
            import goldenhost

            goldenhost.train(train)
    except BaseException:
        run.finish(passed=False)
        raise
    return run


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["dump_dir", "bundle"])
def test_record_never_blesses_a_role_that_recorded_nothing(golden_host: Path, kind: str) -> None:
    """A recording run whose role recorded nothing (the test never reached its targets) fails, naming the role; the
    committed recording stays as it was and no staging folder is left (a bundle's pack is not even tried)."""
    where = {kind: "rec" if kind == "dump_dir" else "rec.zip"}
    run = golden(golden_host, Mode.RECORD, train=2, **where)
    assert run.problems() == [] and run.finish(passed=True).startswith("skipweave mode record: blessed")
    before = listing(golden_host)
    assert before, "nothing recorded"
    run = golden(golden_host, Mode.RECORD, train=0, **where)
    assert run.problems() == []
    with pytest.raises(GoldenError, match=r"left as it was: enabled role\(s\) rollout of the marker recorded nothing "
                                          r"\(role rollout: gen, .*\); check that the test reaches"):
        run.finish(passed=True)
    assert listing(golden_host) == before and sorted(os.listdir(golden_host)) == [where[kind]]


def test_a_plan_the_test_weaves_replaces_the_markers_and_blesses_nothing(golden_host: Path, tmp_path: Path) -> None:
    """A test that weaves its own plan (the same role and target, another dump dir) replaced the marker's: its
    counters are not the recording's; the run says so, in both modes, and blesses nothing."""
    golden(golden_host, Mode.RECORD, train=2, dump_dir="rec").finish(passed=True)
    before = listing(golden_host)
    for mode in (Mode.RECORD, Mode.REPLAY):
        run = golden(golden_host, mode, dump_dir="rec")
        skipweave.weave(HOST_ROLE, profile="rollout_cache", overrides=[f"skip.rollout.dump_dir={tmp_path / 'own'}"])
        import goldenhost

        goldenhost.train(2)
        problems = run.problems()
        assert len(problems) == 1 and "the marker's plan is no longer the one woven: the test or a fixture wove a " \
            "plan of its own" in problems[0], problems
        if mode is Mode.RECORD:
            with pytest.raises(GoldenError, match="rollout of the marker recorded nothing .*wove a plan of its own"):
                run.finish(passed=True)
        else:
            run.finish(passed=False)
        assert listing(golden_host) == before and sorted(os.listdir(golden_host)) == ["rec"]


def test_replay_that_checked_nothing_fails(golden_host: Path) -> None:
    """A replay whose verify role compared no call, or whose roles saw no call at all, verified nothing: it fails,
    saying what to check; the same test reaching its targets passes."""
    golden(golden_host, Mode.RECORD, train=2, dump_dir="rec").finish(passed=True)
    run = golden(golden_host, Mode.REPLAY, "rollout_verify", dump_dir="rec")
    problems = run.problems()
    run.finish(passed=False)
    assert len(problems) == 1, problems
    assert problems[0].startswith("skipweave: role rollout (verify) compared no call with its recording: the test "
                                  "passed having verified nothing; check that the test reaches the role's targets "
                                  "(gen"), problems
    assert problems[0].endswith(f") at the steps its recording holds (recording {golden_host / 'rec'})"), problems
    run = golden(golden_host, Mode.REPLAY, dump_dir="rec")
    problems = run.problems()
    run.finish(passed=False)
    assert len(problems) == 1 and problems[0].startswith("skipweave: no role of the marker saw a call (every role "
                                                         "at hits 0, live calls 0)"), problems
    for profile in ("rollout_verify", "rollout_cache"):
        run = golden(golden_host, Mode.REPLAY, profile, train=2, dump_dir="rec")
        assert run.problems() == [], profile
        run.finish(passed=True)


def test_blessing_replaces_only_a_recording(golden_host: Path, tmp_path: Path) -> None:
    """Something at the recording's path that is not a skipweave recording (a folder of other files, a file, a zip
    that is no bundle) is never replaced: record refuses before the test runs, bless and bless_bundle touch
    nothing; an empty folder and an existing recording are replaced."""
    own = golden_host / "mine"
    (own / "sub").mkdir(parents=True)
    (own / "notes.txt").write_text("mine")
    (own / "sub" / "data.txt").write_text("mine too")
    with zipfile.ZipFile(golden_host / "mine.zip", "w") as z:
        z.writestr("a.txt", "not a bundle")
    (golden_host / "afile").write_text("x")
    before = listing(golden_host)
    for kind, name in (("dump_dir", "mine"), ("bundle", "mine.zip"), ("dump_dir", "afile")):
        with pytest.raises(GoldenError, match="skipweave mode record: .* (is not a skipweave|is not a folder)"):
            golden(golden_host, Mode.RECORD, **{kind: name})
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(GoldenError, match="is not a skipweave dump dir .*left as it was"):
        bless(fresh, own)
    with pytest.raises(GoldenError, match="is not a skipweave bundle, which is all blessing replaces"):
        bless_bundle(fresh, golden_host / "mine.zip")
    assert listing(golden_host) == before and fresh.is_dir()
    assert sorted(os.listdir(golden_host)) == ["afile", "mine", "mine.zip"]  # no staging folder left
    (golden_host / "empty").mkdir()
    golden(golden_host, Mode.RECORD, train=2, dump_dir="empty").finish(passed=True)
    golden(golden_host, Mode.RECORD, train=1, dump_dir="empty").finish(passed=True)  # a recording: replaced
    assert sorted(p.name for p in (golden_host / "empty" / "default" / "rollout").iterdir()) == ["1"]
    (golden_host / "empty" / "README").write_text("a file beside the namespaces")
    with pytest.raises(GoldenError, match="holds what skipweave never writes \\(README\\)"):
        golden(golden_host, Mode.RECORD, dump_dir="empty")
