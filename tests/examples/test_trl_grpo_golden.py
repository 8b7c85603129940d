"""The TRL example's golden test (examples/trl_grpo/tests/test_golden.py) as its users run it: pytest in a subprocess,
on a copy of the example. It passes on the committed recording (TRL samples nothing, no reward function runs); a
one-line change to the loss (``loss_type="grpo"`` -> ``"bnpo"`` in the copy's ``train.py``) fails it, naming the step,
the call and the loss's recorded and live values; ``--skipweave-mode=record`` blesses the change (TRL generates and
scores again) and it passes again. Beside it (no process): the committed recording is small and holds both steps of
both roles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB = REPO_ROOT / "examples" / "trl_grpo"
GOLDEN = JOB / "tests" / "golden.zip"
PLUGIN = "skipweave.testing.pytest_plugin"
LOSS = 'loss_type="grpo",'
TOKEN_MEAN = 'loss_type="bnpo",'  # the one-line change: the loss averaged over the batch's tokens, not per sequence
STEPS = ("0", "1")
"""transformers' global step before each of the 2 recorded steps."""


def golden_test(job: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the job copy's golden test with the plugin (this checkout's skipweave first on the path, nothing from a
    hub); returns the process and its wall seconds."""
    cmd = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", str(job / "tests"),
           *options]
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=job.parent, env=env, capture_output=True, text=True, timeout=420, check=False)
    return proc, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_trl_golden_test_fails_on_a_loss_change_until_it_is_blessed(tmp_path: Path) -> None:
    job = tmp_path / "trl_grpo"
    shutil.copytree(JOB, job, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    proc, seconds = golden_test(job)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "role rollout (cache, replay-only): hits 2, misses 0, live calls 0" in out, out[-4000:]
    assert "role update (verify): hits 0, misses 0, live calls 4; verified 4: identical 4" in out, out[-4000:]
    print(f"TRL golden test, replayed: {seconds:.1f} s")

    script = job / "train.py"
    assert script.read_text().count(LOSS) == 1
    script.write_text(script.read_text().replace(LOSS, TOKEN_MEAN))
    proc, _ = golden_test(job)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-6000:]
    # the first micro-batch whose loss differs: step, call, by how much, recorded and live values
    first = "role update target trl_grpo_loss step 0 call 0: diverged at (the result): max |Δ| "
    assert f"Diverged: skipweave verify: {first}" in out, out[-6000:]
    line = next(x for x in out.splitlines() if x.startswith(f"skipweave verify: {first}"))
    assert "(recorded " in line and ", live " in line and "inputs differ" not in line, line
    assert "If the change is intended, bless it: pytest --skipweave-mode=record '" in out, out[-6000:]
    kept = [x.rsplit(" ", 1)[1] for x in out.splitlines() if "and the verify report kept in " in x]
    assert len(kept) == 1 and Path(kept[0], "verify.jsonl").is_file(), out[-6000:]
    shutil.rmtree(kept[0])  # a failing test keeps its copy for whoever reads the failure; not here
    print(f"TRL golden test, failed: {line}")
    before = (job / "tests" / "golden.zip").read_bytes()

    proc, seconds = golden_test(job, "--skipweave-mode=record")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"skipweave mode record: blessed {job / 'tests' / 'golden.zip'}" in out, out[-4000:]
    assert "role rollout (cache): hits 0, misses 2, live calls 2" in out, out[-4000:]  # TRL generated again
    assert (job / "tests" / "golden.zip").read_bytes() != before  # packed anew from the new recording
    assert sorted(p.name for p in (job / "tests").iterdir() if p.name.startswith(".golden")) == []  # no staging left
    print(f"TRL golden test, re-recorded: {seconds:.1f} s")

    proc, _ = golden_test(job)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "verified 4: identical 4" in out, out[-4000:]


def test_the_committed_trl_recording_is_small_and_complete() -> None:
    """A bundle of at most 2 MB that ``skipweave verify`` finds whole: the generation of steps 0 and 1 and the loss
    of both micro-batches of each."""
    assert GOLDEN.stat().st_size <= 2 * 1024 * 1024
    with zipfile.ZipFile(GOLDEN) as bundle:
        names = bundle.namelist()
    manifests = sorted(tuple(n.split("/")[1:5]) for n in names if n.endswith(".manifest.json"))
    assert manifests == sorted([("rollout", step, "trl_grpo", "r0-0000.manifest.json") for step in STEPS]
                               + [("update", step, "trl_grpo_loss", f"r0-000{call}.manifest.json")
                                  for step in STEPS for call in (0, 1)]), manifests
    assert not [n for n in names if "/.runs/" in n or n.startswith(".runs/")]
    verify = subprocess.run([sys.executable, "-m", "skipweave.cli", "verify", str(GOLDEN)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not [p for p in GOLDEN.parent.iterdir() if p.name.startswith(f".{GOLDEN.name}.")]  # no staging left
