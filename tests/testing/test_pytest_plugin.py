"""The pytest plugin (skipweave.testing.pytest_plugin) driven as a user drives it: pytest sessions in subprocesses
(``pytester.runpytest_subprocess``) on a tiny host, in each mode — record then replay, a call with no recording, a
diverging verify role, blessing a change, running unwoven, unweaving after a failing test — and the plugin found
through its ``pytest11`` entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "skipweave.testing.pytest_plugin"

HOST = '''
import os

import torch

CALLS = []


class Gen:
    def generate(self, batch):
        step = batch["meta_info"]["global_steps"]
        CALLS.append(step)
        g = torch.Generator().manual_seed(step)
        out = torch.randint(0, 100, (2, 4), generator=g)
        if os.environ.get("HOST_CHANGE") and step >= 2:
            out[1, 3] += 1  # the change under test: sample 1, position 3, from step 2 on
        return {"tokens": out, "meta_info": {"global_steps": step}}


def train(steps=2):
    gen = Gen()
    return [gen.generate({"meta_info": {"global_steps": s}}) for s in range(1, steps + 1)]
'''

ROLE = 'ROLE = {"skip": {"rollout": {"targets": {"gen": "tinyhost:Gen.generate"}}}}\n'


@pytest.fixture
def host(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester folder holding the tiny host (``tinyhost``), importable by the sessions run there; their temp
    folders (the replayed copies a failing test keeps) inside it."""
    pytester.makepyfile(tinyhost=HOST)
    pytester.syspathinsert()
    (pytester.path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(pytester.path / "tmp"))
    return pytester


def run(pytester: pytest.Pytester, *args: str, plugin: bool = True) -> pytest.RunResult:
    """One pytest session in a subprocess, with the plugin (``-p``, as an environment whose metadata predates the
    entry point loads it) and ``-rA`` (every test's report sections)."""
    options = ["-p", PLUGIN] if plugin else []
    return pytester.runpytest_subprocess(*options, "-p", "no:cacheprovider", "-rA", *args, timeout=240)


def listing(folder: Path) -> dict[str, int]:
    """Every file below ``folder`` (relative path -> modification time in ns)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def test_record_then_replay(host: pytest.Pytester) -> None:
    """Record writes the recording (its entries only: no run marks, no staging folder left); replay serves every call
    from it without touching it, and the summary (fixture and report section) says so."""
    host.makepyfile(test_golden=ROLE + textwrap.dedent('''
        import pytest
        import tinyhost


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="golden/rec")
        def test_two_steps(skipweave_summary):
            tinyhost.train(2)
            counts = skipweave_summary["rollout"]
            if skipweave_summary.mode == "record":
                assert (counts.hits, counts.misses, counts.live) == (0, 2, 2) and tinyhost.CALLS == [1, 2]
            else:
                assert (counts.hits, counts.misses, counts.live) == (2, 0, 0) and tinyhost.CALLS == []
                assert skipweave_summary.dump_dir != skipweave_summary.recording  # a copy is replayed
    '''))
    recorded = run(host, "--skipweave-mode=record")
    recorded.assert_outcomes(passed=1)
    rec = host.path / "golden" / "rec"
    assert "skipweave: --skipweave-mode=record" in recorded.stdout.str()  # the header says the session re-records
    assert f"skipweave mode record: blessed {rec}" in recorded.stdout.str()
    assert (rec / "default" / "rollout" / "2").is_dir() and not (rec / ".runs").exists()
    assert sorted(p.name for p in rec.parent.iterdir()) == ["rec"]  # no staging folder left beside it
    before = listing(rec)

    replayed = run(host)
    replayed.assert_outcomes(passed=1)
    replayed.stdout.fnmatch_lines(["*Captured skipweave call*", f"skipweave mode replay, recording {rec} (dump dir *)",
                                   "  role rollout (cache, replay-only): hits 2, misses 0, live calls 0"])
    assert listing(rec) == before  # the committed recording is read, never written


def test_a_call_with_no_recording_fails_naming_role_target_and_step(host: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay is replay-only: a step the recording lacks fails the test naming role, target and step, also when the
    code under test catches the ReplayMissing and goes on; a test whose recording is absent says how to make it."""
    host.makepyfile(test_golden=ROLE + textwrap.dedent('''
        import os

        import pytest
        import skipweave
        import tinyhost

        STEPS = int(os.environ.get("STEPS", "2"))


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec")
        def test_raises():
            tinyhost.train(STEPS)


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec")
        def test_swallows():
            try:
                tinyhost.train(STEPS)
            except skipweave.ReplayMissing:
                pass  # a host that retries, logs and goes on


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="never_recorded")
        def test_no_recording():
            tinyhost.train(1)
    '''))
    run(host, "--skipweave-mode=record", "-k", "not no_recording").assert_outcomes(passed=2)
    monkeypatch.setenv("STEPS", "3")
    result = run(host)
    result.assert_outcomes(failed=2, errors=1)
    out = result.stdout.str()
    assert ("ReplayMissing: skipweave: replay-only role rollout target gen (tinyhost:Gen.generate): no recording "
            "serves step 3 call 0") in out, out  # test_raises
    result.stdout.fnmatch_lines(["skipweave: a replay-only call found no recording: role rollout target gen step 3 "
                                 "call 0 *; record it: pytest --skipweave-mode=record 'test_golden.py::test_raises'"])
    result.stdout.fnmatch_lines([
        "*skipweave: a replay-only call found no recording (ReplayMissing, which the code under test caught): "
        "role rollout target gen* step 3 *; record it: pytest --skipweave-mode=record "
        "'test_golden.py::test_swallows'"])
    never = host.path / "never_recorded"
    assert f"GoldenError: skipweave: no recording at {never} (dump_dir= of the test's skipweave marker) to replay; " \
           "record it: pytest --skipweave-mode=record 'test_golden.py::test_no_recording'" in out, out
    assert "pytest_runtest_setup" not in out  # said for people, without a traceback through the plugin


VERIFY_TESTS = ROLE + textwrap.dedent('''
    import pytest
    import tinyhost


    @pytest.mark.skipweave("rollout_verify", cfg=ROLE, dump_dir="rec")
    def test_verified(skipweave_summary):
        tinyhost.train(2)
        assert skipweave_summary["rollout"].live == 2


    @pytest.mark.skipweave("rollout_verify", cfg=ROLE, dump_dir="rec", rollout__on_diverge="warn")
    def test_verified_warn_only():
        tinyhost.train(2)  # the divergence only warns in the host: the plugin still fails the test
''')


def test_divergence_fails_at_the_first_position_and_record_blesses_it(host: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify role that diverges fails the test with the first diverging step, field and position (raised in the
    host, or, when the marker lets the host go on, after the test body); record blesses the change; then it passes."""
    host.makepyfile(test_golden=VERIFY_TESTS)
    run(host, "--skipweave-mode=record").assert_outcomes(passed=2)
    run(host).assert_outcomes(passed=2)  # unchanged: identical

    monkeypatch.setenv("HOST_CHANGE", "1")
    diverged = run(host)
    diverged.assert_outcomes(failed=2)
    out = diverged.stdout.str()
    first = "role rollout target gen step 2 call 0: diverged at tokens [1, 3]: recorded "
    assert "Diverged: skipweave verify: " + first in out, out  # test_verified: raised in the host's call
    assert "role rollout (verify): hits 0, misses 0, live calls 2; verified 2: identical 1, close 0, diverged 1" in out
    lines = [x for x in diverged.stdout.lines if x.startswith(f"skipweave verify: {first}")]
    # each test's report section (and test_verified_warn_only's failure itself) names it, with what to do
    assert {x.split("; recording ", 1)[1] for x in lines} == {
        f"{host.path / 'rec'}. If the change is intended, bless it: pytest --skipweave-mode=record "
        f"'test_golden.py::{name}'" for name in ("test_verified", "test_verified_warn_only")}, out
    assert len(lines) == 3, out

    run(host, "--skipweave-mode=record").assert_outcomes(passed=2)  # bless the change
    run(host).assert_outcomes(passed=2)


def test_a_bundle_is_recorded_replayed_in_place_and_blessed_anew(host: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``bundle=``: record packs the recording into one file (no folder left beside it); replay, verify included,
    reads it in place (nothing written in or beside it); record packs a changed host's recording anew."""
    host.makepyfile(test_golden=ROLE + textwrap.dedent('''
        import pytest
        import tinyhost


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, bundle="golden/rollouts.zip")
        def test_cached(skipweave_summary):
            tinyhost.train(2)
            counts = skipweave_summary["rollout"]
            live = 2 if skipweave_summary.mode == "record" else 0
            assert (counts.live, tinyhost.CALLS) == (live, [1, 2][:live])


        @pytest.mark.skipweave("rollout_verify", cfg=ROLE, bundle="golden/rollouts.zip")
        def test_verified(skipweave_summary):
            tinyhost.train(2)
            assert skipweave_summary["rollout"].identical == 2
    '''))
    recorded = run(host, "--skipweave-mode=record", "-k", "cached")
    recorded.assert_outcomes(passed=1, deselected=1)
    bundle = host.path / "golden" / "rollouts.zip"
    assert f"skipweave mode record: blessed {bundle}" in recorded.stdout.str()
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["rollouts.zip"]  # packed; the fresh folder removed
    before = (bundle.stat().st_mtime_ns, bundle.read_bytes())

    replayed = run(host)
    replayed.assert_outcomes(passed=2)
    replayed.stdout.fnmatch_lines([f"skipweave mode replay, recording {bundle}",
                                   "  role rollout (cache, replay-only): hits 2, misses 0, live calls 0"])
    assert (bundle.stat().st_mtime_ns, bundle.read_bytes()) == before
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["rollouts.zip"]  # nothing written beside it

    monkeypatch.setenv("HOST_CHANGE", "1")
    run(host, "--skipweave-mode=record", "-k", "cached").assert_outcomes(passed=1, deselected=1)  # bless
    assert bundle.read_bytes() != before[1] and sorted(p.name for p in bundle.parent.iterdir()) == ["rollouts.zip"]


def test_off_runs_unwoven(host: pytest.Pytester) -> None:
    """Mode off weaves nothing, needs no recording, and the summary says so."""
    host.makepyfile(test_golden=ROLE + textwrap.dedent('''
        import pytest
        import skipweave
        import tinyhost


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="missing")
        def test_live(skipweave_summary):
            tinyhost.train(2)
            assert tinyhost.CALLS == [1, 2] and skipweave.woven_plan() is None
            assert skipweave_summary.mode == "off" and skipweave_summary.roles() == {}
    '''))
    result = run(host, "--skipweave-mode=off")
    result.assert_outcomes(passed=1)
    assert "skipweave mode off: nothing woven" in result.stdout.str()
    assert not (host.path / "missing").exists()


def test_a_failing_test_is_unwoven_and_blesses_nothing(host: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A marked test that fails is unwoven before the next test runs; in mode record its recording stays as it was,
    with no staging folder left; in mode replay its copy is kept and named. Failing counts a fixture's teardown
    error, a role that recorded (or replayed) nothing, a plan the test wove itself; a recording that cannot be blessed
    fails the test without a traceback through the plugin; an interrupted recording session leaves no staging
    folder."""
    host.makepyfile(test_golden=ROLE + textwrap.dedent('''
        import os

        import pytest
        import skipweave
        import tinyhost

        FAIL = os.environ.get("FAIL")


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec")
        def test_a_fails():
            tinyhost.train(2)
            assert not FAIL, "the test body fails"


        def test_b_after_it():
            assert skipweave.woven_plan() is None
            tinyhost.train(1)
            assert tinyhost.CALLS[-1:] == [1]  # live


        @pytest.fixture
        def checked():
            yield
            assert not FAIL, "a fixture's teardown fails"


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec_td")
        def test_c_teardown_fails(checked):
            tinyhost.train(2)


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, bundle="rec.zip")
        def test_d_reaches_nothing():
            if not FAIL:
                tinyhost.train(2)


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec_own")
        def test_e_weaves_its_own(tmp_path):
            if FAIL:
                skipweave.weave(ROLE, profile="rollout_cache", overrides=[f"skip.rollout.dump_dir={tmp_path}"])
            tinyhost.train(2)


        @pytest.mark.skipweave("rollout_cache", cfg=ROLE, dump_dir="rec_f")
        def test_f_interrupted():
            tinyhost.train(1)
            if os.environ.get("INTERRUPT"):
                raise KeyboardInterrupt
    '''))
    run(host, "--skipweave-mode=record").assert_outcomes(passed=6)
    recordings = ["rec", "rec.zip", "rec_f", "rec_own", "rec_td"]
    rec = host.path / "rec"

    def unchanged() -> None:
        assert listing(host.path / "rec") == before and (host.path / "rec.zip").read_bytes() == bundle
        for name in ("rec_f", "rec_own", "rec_td"):
            assert listing(host.path / name) == others[name], name
        assert sorted(p.name for p in host.path.iterdir() if "rec" in p.name) == recordings  # no staging left

    before, bundle = listing(rec), (host.path / "rec.zip").read_bytes()
    others = {name: listing(host.path / name) for name in ("rec_f", "rec_own", "rec_td")}
    assert all(others.values())
    monkeypatch.setenv("FAIL", "1")
    results = {}
    for mode, outcomes in (("record", {"failed": 2, "passed": 4, "errors": 2}),
                           ("replay", {"failed": 3, "passed": 3, "errors": 1})):
        results[mode] = run(host, f"--skipweave-mode={mode}")
        results[mode].assert_outcomes(**outcomes)
        others["rec_f"] = listing(host.path / "rec_f")  # test_f passes, so blesses: the interrupt's check below
        unchanged()
        out = results[mode].stdout.str()
        assert "pytest_runtest_teardown" not in out and "pytest_plugin.py" not in out, out  # no plugin traceback
        assert "the marker's plan is no longer the one woven: the test or a fixture wove a plan of its own" in out
    out = results["record"].stdout.str()
    assert f"skipweave mode record: the test did not pass; {rec} left as it was" in out
    assert f"skipweave mode record: a fixture's teardown failed; {host.path / 'rec_td'} left as it was" in out, out
    assert (f"skipweave mode record: {host.path / 'rec.zip'} left as it was: enabled role(s) rollout of the marker "
            "recorded nothing (role rollout: gen") in out, out
    results["replay"].stdout.fnmatch_lines(["*skipweave: no role of the marker saw a call (every role at hits 0, "
                                            "live calls 0): the test passed having replayed nothing; check that the "
                                            "test reaches the role's targets (rollout: gen*"])
    kept = [line for line in results["replay"].stdout.lines if "the verify report kept in" in line]
    assert kept and Path(kept[0].rsplit(" ", 1)[1]).parent == host.path / "tmp", results["replay"].stdout.str()
    assert (Path(kept[0].rsplit(" ", 1)[1]) / "recording" / "default").is_dir()

    monkeypatch.delenv("FAIL")
    monkeypatch.setenv("INTERRUPT", "1")
    interrupted = run(host, "--skipweave-mode=record", "-k", "interrupted")
    assert interrupted.ret == pytest.ExitCode.INTERRUPTED, interrupted.stdout.str()
    unchanged()


def declared_entry_points() -> dict[str, str]:
    """The ``[project.entry-points.pytest11]`` table of pyproject.toml (read by hand: tomllib is Python 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    header = "[project.entry-points.pytest11]"
    assert header in text, "pyproject.toml declares no pytest11 entry point"
    section = text.split(header, 1)[1].split("\n[", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in section.splitlines()]
    return {k.strip().strip('"'): v.strip().strip('"') for k, _, v in (line.partition("=") for line in lines if line)}


def test_the_entry_point_loads_the_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``pytest11`` entry point pyproject.toml declares loads the plugin in a session that names nothing (a
    distribution declaring it, put on the path, as an install would), and ``-p`` beside it is the same plugin."""
    declared = declared_entry_points()
    assert declared == {PLUGIN: PLUGIN}, declared  # the name is the module's: `-p` and the entry point are one plugin
    dist = pytester.path / "site" / "skipweave_entry_point_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: skipweave-entry-point-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(dist.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    pytester.makepyfile(test_marked='''
        def test_fixture(skipweave_summary, pytestconfig):
            assert skipweave_summary.mode == pytestconfig.getoption("skipweave_mode") == "off"
    ''')
    run(pytester, "--skipweave-mode=off", plugin=False).assert_outcomes(passed=1)
    run(pytester, "--skipweave-mode=off").assert_outcomes(passed=1)  # -p and the entry point: one plugin
    assert run(pytester, "--skipweave-mode=off", "-p", f"no:{PLUGIN}", plugin=False).ret != 0  # off: no option


def test_the_plugin_imports_nothing_heavy() -> None:
    """Every pytest session of the environment imports the plugin: it brings in no torch, Hydra, Ray and nothing of
    skipweave's engine or integrations."""
    code = (f"import sys, {PLUGIN}\n"
            "heavy = ('torch', 'hydra', 'omegaconf', 'ray', 'skipweave.api', 'skipweave.integrations', "
            "'skipweave.weaving', 'skipweave.testing.golden')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
