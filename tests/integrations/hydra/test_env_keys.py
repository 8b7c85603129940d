"""``skip.<role>.fingerprint.env`` from a Hydra app's command line: the callback reads the named keys of the job's
whole config, a replay under another value names the change, and a key the config lacks stops the run first."""

from __future__ import annotations

from pathlib import Path

from tests.integrations.hydra.runner import hydra_app, run, run_all

GEN = "+skip.rollout.targets.gen=worker.Generator.generate"


def test_a_named_config_key_changed_on_the_command_line_is_named_on_replay(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    common = ("+skip=rollout_cache", GEN, f"skip.rollout.dump_dir={dump}")
    record, missing = run_all(
        (hydra_app("app.py", *common, "+model.temperature=1.0", "+skip.rollout.fingerprint.env=[model.temperature]",
                   out=tmp_path / "a"), tmp_path),
        (hydra_app("app.py", *common, "+model.temperature=1.0", "+skip.rollout.fingerprint.env=[model.nope]",
                   out=tmp_path / "b"), tmp_path),
    )
    assert record.returncode == 0 and record.report["real_calls"] == [1, 2, 3], record
    assert missing.returncode != 0 and not missing.task_started, missing
    assert "skip.rollout.fingerprint.env='model.nope'" in missing.stderr, missing
    replay = run(hydra_app("app.py", *common, "+model.temperature=0.7",
                           "+skip.rollout.fingerprint.env=[model.temperature]",
                           "+skip.rollout.fingerprint.on_env_mismatch=error", out=tmp_path / "c"), cwd=tmp_path)
    assert replay.returncode != 0 and replay.task_started, replay
    assert "EnvironmentMismatch" in replay.stderr and "role rollout target gen step 1 call 0" in replay.stderr, replay
    assert "config model.temperature 1.0 -> 0.7" in replay.stderr, replay
