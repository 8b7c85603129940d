"""The shipped TRL profiles and the TRL integration, checked where it is cheap (no TRL process is started here;
tests/integrations/trl/test_trl_trainers.py runs them on real trainers).

- each ``trl_*`` profile composes, through skipweave's composition and through Hydra's ``+skip=`` and ``+skipweave=``
  routes, to the plan docs/trl.md describes: the trainer's own method, its step, evaluation bypassed and recorded
  apart, the trainer attributes it changes declared as effects;
- the integration declares what the profiles weave (:data:`skipweave.integrations.trl.TARGETS`, ``PROFILES``);
- the integration declares the TRL versions the profiles fit, and the installed TRL turns it on;
- importing the integration imports no TRL.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from skipweave.config import load_skip_config
from skipweave.config.profiles import compose_profile, shipped_profiles
from skipweave.config.schema import Action, RoleConfig, Serve, SkipConfig, StepSet
from skipweave.integrations import discovery
from skipweave.integrations import trl as trl_integration

TRAINER_OF = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
PROFILES = {f"trl_{short}_{kind}": (TRAINER_OF[short], kind)
            for short in TRAINER_OF for kind in ("cache", "replay", "verify")}
EFFECTS = ("self._metrics", "self.state.num_input_tokens_seen", "self._logs")


def rollout(plan: SkipConfig) -> RoleConfig:
    (role,) = plan.enabled_roles
    assert role.role == "rollout"
    return role


def test_the_integration_declares_the_shipped_trl_profiles() -> None:
    declared = {name for names in trl_integration.PROFILES.values() for name in names}
    assert declared == set(PROFILES)
    assert {name for name in shipped_profiles() if name.startswith("trl_")} == declared
    assert set(trl_integration.TARGETS) == set(trl_integration.PROFILES) == set(TRAINER_OF.values())


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_trl_profile_composes_to_the_plan_docs_trl_describes(profile: str) -> None:
    trainer, kind = PROFILES[profile]
    role = rollout(load_skip_config(compose_profile(profile)))
    assert role.action is {"verify": Action.VERIFY}.get(kind, Action.CACHE)
    assert role.replay_only is (kind == "replay")
    (target,) = role.targets
    assert target.path == trl_integration.TARGETS[trainer] and not target.optional  # no TRL: the run says so
    assert role.step.expr == "self.state.global_step"
    assert role.bypass.expr == "not self.model.training"
    assert role.record_validation  # evaluation recorded apart, for the replay-only profile
    assert role.effects == EFFECTS
    assert role.steps == StepSet(None)  # every step, unless steps says otherwise
    if kind == "verify":
        assert role.serve is Serve.LIVE and role.report is not None


@pytest.mark.parametrize("profile", ["trl_grpo_cache", "trl_rloo_verify"])
def test_overrides_set_the_per_run_keys_without_plus(profile: str, tmp_path: Path) -> None:
    role = rollout(load_skip_config(compose_profile(profile, overrides=[
        f"skip.rollout.dump_dir={tmp_path}", "skip.rollout.steps=[0-9]", "skip.rollout.namespace=exp1"])))
    assert (role.dump_dir, role.namespace, role.steps.to_config()) == (str(tmp_path), "exp1", ["0-9"])


@pytest.mark.parametrize("route", ["+skip", "+skipweave"])
def test_hydra_apps_get_the_same_plan_through_either_route(route: str, tmp_path: Path) -> None:
    """``+skip=trl_grpo_cache`` in a Hydra app, and its ``+skipweave=`` twin for an app with a dataclass schema."""
    from hydra.utils import instantiate

    (tmp_path / "config.yaml").write_text("{}\n")
    prefix = "skip" if route == "+skip" else "hydra.callbacks.skipweave.skip"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", return_hydra_config=True, overrides=[
                f"{route}=trl_grpo_cache", f"{prefix}.rollout.dump_dir={tmp_path}"])
    finally:
        GlobalHydra.instance().clear()
    assert type(instantiate(cfg.hydra.callbacks.skipweave)).__name__ == "SkipweaveCallback"
    node = cfg if route == "+skip" else cfg.hydra.callbacks.skipweave
    role = rollout(load_skip_config({"skip": node.skip}))
    assert role.targets[0].path == trl_integration.TARGETS["GRPOTrainer"] and role.effects == EFFECTS
    assert role.dump_dir == str(tmp_path)


def test_the_tested_trl_is_inside_the_supported_range() -> None:
    integration = trl_integration.INTEGRATION
    assert (integration.name, integration.host) == ("trl", "trl")
    assert integration.supports(trl_integration.TESTED_VERSION)
    assert not integration.supports("0.19.1") and not integration.supports("2.0.0")


def test_the_installed_trl_turns_the_integration_on() -> None:
    """The environment the slow tests run in: a TRL outside the range would be warned about in every run there
    (discovery's WARNING naming both versions, tests/integrations/test_third_party.py)."""
    (decision,) = [d for d in discovery.decide({}) if d.name == "trl"]
    found = decision.host_version
    assert decision.status == (discovery.NO_HOST if found is None else discovery.ON), decision


def test_the_integration_imports_no_trl() -> None:
    code = ("import sys; from skipweave.integrations.discovery import load_integrations; load_integrations(); "
            "print(sorted(m for m in sys.modules if m == 'trl' or m.startswith('trl.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
