"""Profiles composed in-process: ``compose_profile``, ``weave(profile=...)``, the callback, the launcher.

These are the pieces the subprocess tests drive end to end, checked here where it is cheap.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import skipweave
from skipweave.config import ConfigError, load_skip_config
from skipweave.config.profiles import available_profiles, compose_profile, conf_dir
from skipweave.config.schema import Action, StepSet
from skipweave.integrations.hydra.callback import SkipweaveCallback, job_skip_config
from skipweave.integrations.launcher import BOOTSTRAP_DIR, _script_dir, child_env
from skipweave.integrations.launcher.bootstrap import PLAN_ENV, read_plan, top_module

ROLLOUT_PROFILES = {"rollout_cache", "rollout_repeat", "rollout_replay", "rollout_verify", "async_rollout_cache", "off"}
# The phase profiles are checked in tests/config/test_phase_profiles.py.
PHASE_PROFILES = {"ref_cache", "reward_cache", "values_cache", "old_log_prob_cache", "update_only"}
# The TRL profiles (one role, TRL's targets) are checked in tests/integrations/trl/test_trl_profiles.py.
TRL_PROFILES = {f"trl_{trainer}_{kind}" for trainer in ("grpo", "rloo") for kind in ("cache", "replay", "verify")}
PROFILES = ROLLOUT_PROFILES | PHASE_PROFILES | TRL_PROFILES


def test_shipped_profiles_and_their_dataclass_schema_twins() -> None:
    assert set(available_profiles()) == PROFILES
    twins = {p.stem for p in Path(conf_dir(), "skipweave").glob("*.yaml")} - {"callback"}
    assert twins == PROFILES - {"off"}  # `off` registers no callback: nothing to weave


@pytest.mark.parametrize("profile", sorted(ROLLOUT_PROFILES))
def test_every_profile_composes_to_a_valid_plan_with_optional_host_targets(profile: str) -> None:
    plan = load_skip_config(compose_profile(profile))
    if profile == "off":
        assert plan.roles and not any(r.enable for r in plan.roles.values())
        return
    (role,) = plan.enabled_roles
    assert role.role == ("async_rollout" if profile.startswith("async") else "rollout")
    assert role.action is {"rollout_repeat": Action.REPEAT, "rollout_verify": Action.VERIFY}.get(profile, Action.CACHE)
    assert role.steps == StepSet(None)  # every step eligible unless `steps` says otherwise
    assert role.replay_only is (profile == "rollout_replay")
    assert role.record_validation  # the recording profiles keep validation for a replay-only run
    if profile == "rollout_verify":  # the run's own timings and notes are never compared
        assert role.compare.rule_for("meta_info.timing_s") == "ignore" and role.report is not None
    assert role.targets and all(t.optional and t.path.startswith("verl.") for t in role.targets)


def test_precedence_is_hydras_app_config_then_profile_then_overrides() -> None:
    base = {
        "skip": {"rollout": {"action": "repeat", "namespace": "app", "targets": {"app": "app.mod.Gen.run"}}}
    }
    profile = load_skip_config(compose_profile("rollout_cache")).roles["rollout"]
    profile_targets = {t.name for t in profile.targets}
    composed = load_skip_config(compose_profile("rollout_cache", base=base)).roles["rollout"]
    assert (composed.action, composed.namespace) == (Action.CACHE, "app")
    assert {t.name for t in composed.targets} == {"app"} | profile_targets
    overridden = load_skip_config(
        compose_profile(
            "rollout_cache",
            base=base,
            overrides=[
                "skip.rollout.action=repeat_last",
                "skip.rollout.steps=[1,2,3]",
                "skip.rollout.dump_dir=/x",
                "~skip.rollout.targets.verl_agent_loop",
                "+skip.rollout.targets.cli=cli.mod.Gen.run",
            ],
        )
    ).roles["rollout"]
    assert (overridden.action, overridden.steps, overridden.dump_dir) == (
        Action.REPEAT_LAST,
        StepSet(((1, 3),)),
        "/x",
    )
    assert {t.name for t in overridden.targets} == {"app", "cli"} | profile_targets - {"verl_agent_loop"}


@pytest.mark.parametrize(
    ("profile", "overrides", "key"),
    [
        ("rollout_cash", [], "profile"),
        ("rollout_cache", ["skip.rollout.nope=1"], "skip.rollout.nope"),
        ("rollout_cache", ["skip.rollout.steps=[1,2"], "overrides"),
    ],
)
def test_composition_errors_name_the_culprit(profile: str, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_profile(profile, overrides=overrides)
    assert info.value.key == key
    if profile == "rollout_cash":
        assert "'rollout_cache'" in str(info.value)  # lists what exists


def test_weave_with_a_profile_from_python(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    name, _ = host_module(
        "CALLS = []\nclass Gen:\n    def run(self, step):\n        CALLS.append(step)\n"
        "        return {'step': step}\n"
    )
    host = sys.modules[name]
    overrides = [f"skip.rollout.dump_dir={tmp_path}", f"+skip.rollout.targets.gen={name}.Gen.run"]
    patches = skipweave.weave(profile="rollout_cache", overrides=overrides)  # steps: the call counter
    assert [p.target.name for p in patches if not p.target.optional] == ["gen"]
    assert [host.Gen().run(s) for s in (7, 8)] == [{"step": 7}, {"step": 8}]
    assert host.CALLS == [7, 8]
    plan = skipweave.woven_plan()
    assert plan is not None
    skipweave.unweave()
    # The woven plan's JSON form weaves again: the replay makes no real call.
    skipweave.weave(plan.to_config())
    assert [host.Gen().run(s) for s in (7, 8)] == [{"step": 7}, {"step": 8}]
    assert host.CALLS == [7, 8]


def test_callback_stops_the_run_with_one_paragraph_naming_the_key() -> None:
    cfg = OmegaConf.create(
        {
            "skip": {"rollout": {"enable": True, "action": "bogus"}},
            "hydra": {"runtime": {"choices": {"skip": "rollout_cache"}}},
        }
    )
    with pytest.raises(SystemExit) as info:
        SkipweaveCallback().on_job_start(config=cfg)
    message = str(info.value.code)
    assert message.startswith("skipweave (+skip=rollout_cache): the run was stopped before the task started")
    assert "skip.rollout.action='bogus'" in message and "\n" not in message


def test_callback_without_an_enabled_role_imports_no_weaver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "skipweave.api", raising=False)
    SkipweaveCallback().on_job_start(config=OmegaConf.create({"skip": {"rollout": {"enable": False}}}))
    assert "skipweave.api" not in sys.modules


def test_the_callback_nodes_skip_is_merged_over_the_apps() -> None:
    cfg = OmegaConf.create(
        {
            "skip": {"rollout": {"enable": False, "targets": {"app": "a.b.c"}}},
            "hydra": {
                "callbacks": {
                    "skipweave": {"_target_": "x", "skip": {"rollout": {"enable": True, "steps": [2]}}}
                }
            },
        }
    )
    assert job_skip_config(cfg) == {
        "skip": {"rollout": {"enable": True, "targets": {"app": "a.b.c"}, "steps": [2]}}
    }


def test_launcher_environment_and_plan_round_trip(tmp_path: Path) -> None:
    plan = load_skip_config(
        compose_profile("rollout_cache", overrides=["+skip.rollout.targets.gen=pkg.mod:Gen.run"])
    )
    env = child_env(plan, {"PYTHONPATH": f"/mine{os.pathsep}{BOOTSTRAP_DIR}", "OTHER": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [BOOTSTRAP_DIR, "/mine"]
    assert env["OTHER"] == "1"
    assert read_plan(env) == plan
    assert json.loads(env[PLAN_ENV]) == plan.to_config()
    assert read_plan({}) is None
    assert {top_module(t.path) for t in plan.roles["rollout"].targets} == {"verl", "pkg"}


def test_the_deferred_weave_stands_down_for_another_weave() -> None:
    """A Ray worker under ``skipweave run`` weaves its driver's plan: the launcher's deferred weave never runs."""
    from skipweave.integrations.launcher import bootstrap

    root = f"never_imported_{os.getpid()}"
    plan = load_skip_config({"skip": {"rollout": {"enable": True, "targets": {"gen": f"{root}.mod:Gen.run"}}}})
    hook = bootstrap.bootstrap({PLAN_ENV: json.dumps(plan.to_config())})
    assert hook is not None and not hook.done
    bootstrap.stand_down()
    assert hook.done
    hook(None)  # a first import after standing down weaves nothing (nor fails)


def test_launcher_knows_the_import_path_of_python_script_and_python_m(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    assert _script_dir([sys.executable, "-u", str(script), "--lr", "1"]) == str(tmp_path)
    assert _script_dir([sys.executable, "-m", "pkg.train"]) == os.getcwd()
    assert _script_dir([sys.executable, "-c", "print(1)"]) is None
    assert _script_dir(["torchrun", str(script)]) is None
