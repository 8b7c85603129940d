"""The main job's golden test (examples/tiny_grpo/tests/test_golden.py) as its users run it: pytest in a subprocess,
on a copy of the example. It passes on the committed recording; a one-line change to the advantage computation fails
it, naming the step and the metric; ``--skipweave-mode=record`` blesses the change (Ray and the rollout workers run)
and it passes again. Beside it (no process): the committed recording is small and holds the two steps of every role.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = REPO_ROOT / "examples" / "tiny_grpo"
GOLDEN = JOB / "tests" / "golden.zip"
ROLES = ("rollout", "reward", "ref", "update")
PLUGIN = "skipweave.testing.pytest_plugin"
ADVANTAGE = "adv[rows] = (r - r.mean()) / (std + eps)"
UNNORMALISED = "adv[rows] = r - r.mean()"  # the one-line change: the group's std no longer divides


def golden_test(job: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the job copy's golden test with the plugin; returns the process and its wall seconds."""
    cmd = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", str(job / "tests"),
           *options]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=job.parent, capture_output=True, text=True, timeout=420, check=False)
    return proc, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_golden_test_fails_on_an_advantage_change_until_it_is_blessed(tmp_path: Path) -> None:
    job = tmp_path / "tiny_grpo"
    shutil.copytree(JOB, job, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "outputs"))
    proc, seconds = golden_test(job)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for role in ("rollout", "reward", "ref"):
        assert f"role {role} (cache, replay-only): hits 2, misses 0, live calls 0" in out, out[-4000:]
    assert "role update (verify): hits 0, misses 0, live calls 2; verified 2: identical 2" in out, out[-4000:]
    print(f"golden test, replayed: {seconds:.1f} s")

    reward = job / "tinygrpo" / "reward.py"
    assert reward.read_text().count(ADVANTAGE) == 1
    reward.write_text(reward.read_text().replace(ADVANTAGE, UNNORMALISED))
    proc, _ = golden_test(job)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-6000:]
    # the first step whose update differs, the metric, recorded and live values
    first = "role update target tiny_grpo step 1 call 0: diverged at loss: max |Δ| "
    assert f"Diverged: skipweave verify: {first}" in out, out[-6000:]
    assert "If the change is intended, bless it: pytest --skipweave-mode=record '" in out, out[-6000:]
    kept = [line.rsplit(" ", 1)[1] for line in out.splitlines() if "and the verify report kept in " in line]
    assert len(kept) == 1 and Path(kept[0], "verify.jsonl").is_file(), out[-6000:]
    # a failing test keeps its copy for whoever reads the failure; not here (its TMPDIR is left alone: Ray keeps its
    # sockets there, and a long pytest path would break them)
    shutil.rmtree(kept[0])
    before = (job / "tests" / "golden.zip").read_bytes()

    proc, seconds = golden_test(job, "--skipweave-mode=record")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"skipweave mode record: blessed {job / 'tests' / 'golden.zip'}" in out, out[-4000:]
    assert (job / "tests" / "golden.zip").read_bytes() != before  # packed anew from the new recording
    assert sorted(p.name for p in (job / "tests").iterdir() if p.name.startswith(".golden")) == []  # no staging left
    print(f"golden test, re-recorded: {seconds:.1f} s")

    proc, _ = golden_test(job)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def test_the_committed_recording_is_small_and_complete() -> None:
    """A bundle of at most 2 MB that ``skipweave verify`` finds whole, holding steps 1 and 2 of every role."""
    import zipfile

    assert GOLDEN.stat().st_size <= 2 * 1024 * 1024
    with zipfile.ZipFile(GOLDEN) as bundle:
        names = bundle.namelist()
    manifests = {tuple(n.split("/")[1:3]) for n in names if n.endswith(".manifest.json")}
    assert manifests == {(role, step) for role in ROLES for step in ("1", "2")}, manifests
    assert not [n for n in names if "/.runs/" in n or n.startswith(".runs/")]
    verify = subprocess.run([sys.executable, "-m", "skipweave.cli", "verify", str(GOLDEN)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not [p for p in GOLDEN.parent.iterdir() if p.name.startswith(f".{GOLDEN.name}.")]  # no staging left
    assert os.path.getsize(GOLDEN.parent / "golden_update.yaml") > 0
