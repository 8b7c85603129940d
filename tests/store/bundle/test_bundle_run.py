"""``skipweave run`` replays straight from a bundle: record a program, pack, move the bundle, replay it with no live
call and nothing written beside it; a step the bundle lacks stops the replay naming what it holds."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.cli.test_run import GEN, SKIPWEAVE, launch
from tests.integrations.hydra.runner import APPS, clean_env, run

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)


def test_skipweave_run_replays_from_a_moved_bundle_with_no_live_call(tmp_path: Path) -> None:
    script = [sys.executable, str(APPS / "plain_script.py")]
    first = launch("run", "--skip", "rollout_cache", f"skip.rollout.dump_dir={tmp_path}/dump", GEN, "--", *script,
                   "3", cwd=tmp_path)
    assert first.returncode == 0, first
    assert first.report["real_calls"] == [1, 2, 3]
    packed = run([*SKIPWEAVE, "pack", str(tmp_path / "dump"), "-o", str(tmp_path / "ship" / "rec.zip")],
                 cwd=tmp_path, env=clean_env())
    assert packed.returncode == 0, packed
    other = tmp_path / "other"
    other.mkdir()
    shutil.move(str(tmp_path / "ship" / "rec.zip"), other / "rec.zip")
    shutil.rmtree(tmp_path / "dump")
    bundle = f"skip.rollout.dump_dir={other}/rec.zip"
    second = launch("run", "--skip", "rollout_cache", bundle, GEN, "--", *script, "3", cwd=tmp_path)
    assert second.returncode == 0, second
    assert second.report["real_calls"] == []
    assert second.report["results"] == first.report["results"]
    assert sorted(p.name for p in other.iterdir()) == ["rec.zip"]
    assert not (tmp_path / "dump").exists()
    beyond = launch("run", "--skip", "rollout_cache", bundle, GEN, "--", *script, "4", cwd=tmp_path)
    assert beyond.returncode != 0, beyond
    assert "the bundle holds target gen steps 1-3 (shard r0)" in beyond.stderr, beyond
    asks = launch("run", "--skip", "rollout_cache", bundle, "+skip.rollout.replay_only=false", GEN, "--", *script,
                  "3", cwd=tmp_path)
    assert asks.returncode == 2 and not asks.task_started, asks
    assert "skip.rollout.replay_only" in asks.stderr and "names a bundle" in asks.stderr, asks
    assert sorted(p.name for p in other.iterdir()) == ["rec.zip"]
