"""The on-disk format holds: a store recorded by an earlier skipweave replays bit-identically and verifies.

tests/fixtures/store_v1 was recorded by the code before the redesign of issue 29 (its commit is in
tests/fixtures/store_v1.digests.json) with tests/fixtures/make_store_v1.py: verl ``DataProto`` results with RNG
state, validation shards, groups of small per-sample entries (dataclasses, namedtuples, enums, object arrays) and an
``async`` target. A replay with the current code, in a fresh process, must serve every call from it (no real call,
no input-fingerprint mismatch) and hand back results whose digests equal the recorded ones, RNG draws after each
call included; ``skipweave verify`` must pass on it. Both work on a copy: a run writes its run marks into the store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
STORE = FIXTURES / "store_v1"
DIGESTS = FIXTURES / "store_v1.digests.json"
SCRIPT = FIXTURES / "make_store_v1.py"


def _env() -> dict[str, str]:
    """This checkout's skipweave first on the path, whatever the environment has installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env["SKIPWEAVE_PROGRESS"] = "0"
    return env


@pytest.fixture
def store(tmp_path: Path) -> Path:
    copy = tmp_path / "store_v1"
    shutil.copytree(STORE, copy, symlinks=True)
    return copy


def _recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DIGESTS.read_text(encoding="utf-8"))
    return doc


def test_the_fixture_holds_what_it_claims() -> None:
    names = [p.relative_to(STORE).as_posix() for p in STORE.rglob("*") if p.is_file()]
    assert any(n.endswith(".pack.json") for n in names), "no group of small entries"
    assert any(Path(n).name.startswith("val_") for n in names), "no validation shard"
    assert any(n.startswith("v1/rollout/") and n.endswith(".manifest.json") for n in names)
    assert any(n.startswith("v1/async_rollout/") for n in names)
    results = _recorded()["results"]
    assert len(results) == 39 and "rollout/1/validation" in results
    assert sum(p.stat().st_size for p in STORE.rglob("*") if p.is_file()) < 300_000


def test_a_replay_with_this_code_serves_every_entry_bit_identically(store: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "replay", str(store)], capture_output=True, text=True,
                          env=_env(), cwd=str(ROOT), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    replayed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert replayed["real_calls"] == []
    recorded = _recorded()["results"]
    assert replayed["counters"]["hits"] == len(recorded) and replayed["counters"]["misses"] == 0
    assert sorted(replayed["results"]) == sorted(recorded)
    differing = {label: (recorded[label], got) for label, got in replayed["results"].items() if got != recorded[label]}
    assert not differing, f"{len(differing)} results differ from the recording:\n" + "\n".join(
        f"  {label}: recorded {want}, replayed {got}" for label, (want, got) in sorted(differing.items()))


def test_skipweave_verify_passes_on_it(store: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "skipweave.cli", "verify", str(store), "--json"],
                          capture_output=True, text=True, env=_env(), cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["problems"] == []
    assert doc["totals"]["entries"] == len(_recorded()["results"])
