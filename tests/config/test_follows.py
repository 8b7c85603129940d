"""``skip.<role>.follows``: a role it names must exist, and a follower takes the followed role's store, steps and
``fingerprint.env`` where it leaves them unset.

The phase profiles set ``follows: rollout`` and declare the rollout's store keys, so that each of them alone (and every
combination the docs show) has the role it follows; a typo in a profile of one's own is an error naming the roles the
config has, before anything is patched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from skipweave.config import ConfigError, load_skip_config
from skipweave.config.profiles import compose_profile, shipped_profiles
from skipweave.config.schema import SkipConfig

ROOT = Path(__file__).resolve().parents[2]

COMBINATIONS = [["rollout_cache", "ref_cache", "reward_cache"], ["rollout_cache", "ref_cache"],
                ["rollout_cache", "reward_cache"], ["rollout_cache", "values_cache"],
                ["rollout_cache", "old_log_prob_cache"], ["rollout_repeat", "reward_cache"],
                ["rollout_replay", "ref_cache"], ["rollout_verify", "reward_cache"], ["update_only"],
                ["off", "reward_cache"], ["reward_cache", "ref_cache", "values_cache", "old_log_prob_cache"]]
"""Profile combinations of the docs (docs/phases.md, README's main job) and a few more."""


def _check_follows(plan: SkipConfig) -> None:
    for role in plan.roles.values():
        if role.follows is not None:
            assert role.follows in plan.roles and role.follows != role.role, (role.role, role.follows)


@pytest.mark.parametrize("profiles", [[name] for name in shipped_profiles()] + COMBINATIONS,
                         ids=lambda p: "+".join(p))
def test_every_shipped_profile_and_documented_combination_has_the_roles_it_follows(profiles: list[str]) -> None:
    _check_follows(load_skip_config(compose_profile(profiles)))


@pytest.mark.parametrize("profile", ["reward_cache", "ref_cache", "values_cache", "old_log_prob_cache", "update_only"])
def test_the_callback_node_twins_have_the_roles_they_follow(profile: str, tmp_path: Path) -> None:
    """``+skipweave=<phase>`` (an app whose primary config is a dataclass): the twin brings the rollout role too."""
    from skipweave.integrations.hydra.callback import job_skip_config

    (tmp_path / "config.yaml").write_text("{}\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", return_hydra_config=True, overrides=[f"+skipweave={profile}"])
    finally:
        GlobalHydra.instance().clear()
    _check_follows(load_skip_config(job_skip_config(cfg)))


def test_follows_naming_a_role_the_config_lacks_is_an_error_naming_it(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("skip:\n  reward:\n    enable: true\n    follows: rollouts\n"
                    "    targets: {score: my_pkg.trainer:Trainer.compute_reward}\n")
    with pytest.raises(ConfigError) as caught:
        load_skip_config(compose_profile(["rollout_cache", str(mine)]))
    assert caught.value.key == "skip.reward.follows" and caught.value.value == "rollouts"
    assert "the config's other roles: 'rollout'" in str(caught.value)
    assert "did you mean 'rollout'?" in str(caught.value)
    # alone: no other role at all
    with pytest.raises(ConfigError, match=r"skip.reward.follows='rollouts' is not allowed: .*other roles: none"):
        load_skip_config(compose_profile(str(mine)))


@pytest.mark.parametrize("follows", ["reward", 3])
def test_follows_naming_itself_or_no_name_is_an_error(follows: Any) -> None:
    cfg = {"skip": {"rollout": {}, "reward": {"enable": True, "follows": follows}}}
    with pytest.raises(ConfigError) as caught:
        load_skip_config(cfg)
    assert caught.value.key == "skip.reward.follows" and "other roles: 'rollout'" in str(caught.value)


def test_skipweave_run_stops_before_the_program_naming_the_key(tmp_path: Path) -> None:
    """From the command line: exit 2, the key and the roles the config has, and the program never started."""
    (tmp_path / "mine.yaml").write_text("skip:\n  ref:\n    enable: true\n    follows: rolout\n"
                                        "    targets: {ref: my_pkg.trainer:Trainer.compute_ref}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPWEAVE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "skipweave.cli", "run", "--skip", "rollout_cache", "--skip",
                           "mine.yaml", "--", sys.executable, "-c", "open('started', 'w')"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "skip.ref.follows='rolout' is not allowed" in proc.stderr and "did you mean 'rollout'?" in proc.stderr
    assert not (tmp_path / "started").exists()


APP = {"model": {"path": "/models/a", "temperature": 0.7}}


def _plan(*overrides: str) -> SkipConfig:
    from omegaconf import OmegaConf

    composed = compose_profile(["rollout_cache", "reward_cache", "ref_cache"], base=APP, overrides=[
        "skip.rollout.dump_dir=/data/run1", "+skip.rollout.fingerprint.env=[model.path,model.temperature]",
        *overrides])
    return load_skip_config(OmegaConf.merge(OmegaConf.create(APP), composed))


def test_phase_roles_take_the_rollouts_fingerprint_env_where_they_leave_it_unset() -> None:
    roles = _plan().roles
    expected = (("model.path", "/models/a"), ("model.temperature", 0.7))
    assert roles["rollout"].fingerprint.env == expected
    assert roles["reward"].fingerprint.env == expected and roles["ref"].fingerprint.env == expected
    assert roles["ref"].fingerprint.include  # the rest of the phase's fingerprint stays its own
    own = _plan("+skip.reward.fingerprint.env=[model.path]", "+skip.ref.fingerprint.env=[]").roles
    assert own["reward"].fingerprint.env == (("model.path", "/models/a"),)  # its own list wins
    assert own["ref"].fingerprint.env == ()  # [] : none, not the rollout's


def test_a_chain_of_follows_settles_and_the_plan_a_worker_gets_keeps_it() -> None:
    cfg = {"model": {"seed": 7}, "skip": {
        "rollout": {"dump_dir": "/data/a", "fingerprint": {"env": ["model.seed"]}},
        "ref": {"follows": "rollout"}, "values": {"follows": "ref", "fingerprint": {"on_mismatch": "error"}}}}
    roles = load_skip_config(cfg).roles
    assert roles["values"].dump_dir == "/data/a" and roles["values"].fingerprint.env == (("model.seed", 7),)
    assert roles["values"].fingerprint.on_mismatch.value == "error"
    again = load_skip_config(load_skip_config(cfg).to_config())  # what a Ray worker parses
    assert again.roles["values"].fingerprint.env == (("model.seed", 7),)


REWARD_HOST = '''
REAL = []


class Trainer:
    def __init__(self):
        self.global_steps = 1

    def generate(self, prompts):
        return [p * 3 for p in prompts]

    def compute_reward(self, responses):
        REAL.append(self.global_steps)
        return [r * 0.5 for r in responses]
'''


def test_a_replayed_phase_names_the_change_of_a_key_only_the_rollout_lists(host_module: Any, tmp_path: Path) -> None:
    """The reward role lists no key itself: a change of the model the rollout lists stops its replay too."""
    import skipweave

    name, _ = host_module(REWARD_HOST)
    mod = sys.modules[name]

    def run(model_path: str) -> list[float]:
        skipweave.weave({"model": {"path": model_path}, "skip": {
            "rollout": {"dump_dir": str(tmp_path), "fingerprint": {"env": ["model.path"]}},
            "reward": {"enable": True, "follows": "rollout", "step": {"source": "attr", "path": "global_steps"},
                       "bypass": None, "fingerprint": {"on_env_mismatch": "error"},
                       "targets": {"score": f"{name}:Trainer.compute_reward"}}}})
        try:
            out: list[float] = mod.Trainer().compute_reward([1, 2])
            skipweave.flush()
            return out
        finally:
            skipweave.unweave()

    assert run("/models/a") == [0.5, 1.0] and mod.REAL == [1]
    assert run("/models/a") == [0.5, 1.0] and mod.REAL == [1]  # replayed
    with pytest.raises(skipweave.EnvironmentMismatch, match=r"role reward .*config model.path '/models/a'"):
        run("/models/b")
