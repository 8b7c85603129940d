"""The phase profiles (``ref_cache``, ``reward_cache``, ``values_cache``, ``old_log_prob_cache``, ``update_only``):
one role each, composed with each other and with the rollout profiles, through Hydra's own composition (the
``+skip=[...]`` command line of a real app runs in tests/examples/test_tiny_grpo.py).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from skipweave.config import load_skip_config
from skipweave.config.profiles import compose_profile
from skipweave.config.schema import DEFAULT_DUMP_DIR, Action, SkipConfig
from skipweave.weaving.binding import binding_of
from skipweave.weaving.fingerprint import fingerprint, signature_fingerprint

PHASES = {"ref_cache": "ref", "reward_cache": "reward", "values_cache": "values", "old_log_prob_cache": "old_log_prob"}


def plan(profiles: str | list[str], *overrides: str) -> SkipConfig:
    return load_skip_config(compose_profile(profiles, overrides=overrides))


@pytest.mark.parametrize("profile", sorted(PHASES))
def test_a_phase_profile_alone_enables_its_role_with_rollout_defaults(profile: str) -> None:
    roles = plan(profile).roles
    role = roles[PHASES[profile]]
    assert role.enable and role.action is Action.CACHE and not role.replay_only
    assert {r.role for r in plan(profile).enabled_roles} == {PHASES[profile]}
    assert role.dump_dir == os.path.expanduser(DEFAULT_DUMP_DIR)
    assert role.step.path == "global_steps"  # the trainer's own counter: driver-side methods
    assert [t.optional for t in role.targets] == [True] * len(role.targets)


def test_phase_profiles_follow_the_rollouts_dump_dir_namespace_and_steps(tmp_path: Path) -> None:
    composed = plan(["rollout_cache", "ref_cache", "reward_cache"], f"skip.rollout.dump_dir={tmp_path}",
                    "skip.rollout.namespace=exp1", "skip.rollout.steps=[1,3]")
    roles = {r.role: r for r in composed.enabled_roles}
    assert set(roles) == {"rollout", "ref", "reward"}
    for role in roles.values():
        assert (role.dump_dir, role.namespace, role.steps.to_config()) == (str(tmp_path), "exp1", [1, 3])
        assert role.action is Action.CACHE


def test_a_role_of_its_own_dump_dir_wins_over_the_rollouts(tmp_path: Path) -> None:
    composed = plan(["rollout_cache", "ref_cache"], f"skip.rollout.dump_dir={tmp_path / 'a'}",
                    f"skip.ref.dump_dir={tmp_path / 'b'}")
    assert composed.roles["rollout"].dump_dir == str(tmp_path / "a")
    assert composed.roles["ref"].dump_dir == str(tmp_path / "b")


def test_update_only_replays_every_phase_replay_only(tmp_path: Path) -> None:
    composed = plan("update_only", f"skip.rollout.dump_dir={tmp_path}")
    roles = {r.role: r for r in composed.enabled_roles}
    assert set(roles) == {"rollout", "ref", "reward", "values", "old_log_prob"}
    for role in roles.values():
        assert role.replay_only and role.action is Action.CACHE and role.dump_dir == str(tmp_path), role.role
    assert {r for r, role in roles.items() if role.depends_on_update} == {"values", "old_log_prob"}
    # The engine of the rollout and the reward loop's manager are stand-ins; validation is served as well.
    stubbed = {t.path for role in roles.values() for t in role.targets if t.stub is not None}
    assert "verl.experimental.reward_loop.RewardLoopManager" in stubbed
    assert "verl.workers.rollout.llm_server.LLMServerManager.create" in stubbed
    # A phase left live on top of update_only: the rest stays replayed.
    live_values = plan("update_only", f"skip.rollout.dump_dir={tmp_path}", "skip.values.enable=false")
    assert {r.role for r in live_values.enabled_roles} == {"rollout", "ref", "reward", "old_log_prob"}


def test_the_callback_route_composes_the_phase_profiles_too(tmp_path: Path) -> None:
    """``+skipweave=update_only`` (apps with a dataclass schema): the same roles, read from the callback's node."""
    (tmp_path / "config.yaml").write_text("{}\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", return_hydra_config=True, overrides=[
                "+skipweave=update_only", f"hydra.callbacks.skipweave.skip.rollout.dump_dir={tmp_path}"])
    finally:
        GlobalHydra.instance().clear()
    composed = load_skip_config(cfg.hydra.callbacks.skipweave)
    roles = {r.role: r for r in composed.enabled_roles}
    assert set(roles) == {"rollout", "ref", "reward", "values", "old_log_prob"}
    assert {role.dump_dir for role in roles.values()} == {str(tmp_path)}


@pytest.mark.parametrize("profile", [*sorted(PHASES), "update_only"])
def test_the_callback_of_a_phase_profile_is_instantiated_as_hydra_instantiates_it(profile: str, tmp_path: Path) -> None:
    """Hydra instantiates the callback from its node and refuses an unset (???) value there."""
    from hydra.utils import instantiate

    (tmp_path / "config.yaml").write_text("{}\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", return_hydra_config=True, overrides=[
                f"+skipweave={profile}", f"hydra.callbacks.skipweave.skip.rollout.dump_dir={tmp_path}"])
    finally:
        GlobalHydra.instance().clear()
    callback = instantiate(cfg.hydra.callbacks.skipweave)
    assert type(callback).__name__ == "SkipweaveCallback"
    roles = load_skip_config(cfg.hydra.callbacks.skipweave).enabled_roles
    assert {r.dump_dir for r in roles} == {str(tmp_path)}


def test_phases_follow_a_rollout_store_that_verls_legacy_keys_set(tmp_path: Path) -> None:
    """The legacy adapter fills skip.rollout.dump_dir after Hydra composed: the phases follow what it filled."""
    base = {"actor_rollout_ref": {"rollout": {"skip": {"enable": True, "dump_dir": str(tmp_path / "legacy")}}}}
    for profiles in (["ref_cache"], ["rollout_cache", "ref_cache", "reward_cache"], ["update_only"]):
        with pytest.warns(Warning):  # the legacy keys' deprecation
            composed = load_skip_config(compose_profile(profiles, base=base))
        dump_dirs = {r.role: r.dump_dir for r in composed.roles.values() if r.role in {"rollout", "ref", "reward"}}
        assert set(dump_dirs.values()) == {str(tmp_path / "legacy")}, (profiles, dump_dirs)


@pytest.mark.parametrize("profile", ["ref_cache", "values_cache", "old_log_prob_cache"])
def test_a_phase_reading_the_tokens_is_fingerprinted_by_them_alone(profile: str) -> None:
    """A reference log-prob reads the tokens; rewards unioned into its batch before the call are no input of it,
    and a changed response is."""
    import torch

    role = plan(profile).roles[PHASES[profile]]
    ignore, include = role.fingerprint.ignore, role.fingerprint.include or None

    class Batch:  # DataProto-shaped: batch, non_tensor_batch, meta_info
        def __init__(self, responses: torch.Tensor, rewards: torch.Tensor) -> None:
            self.batch = {"input_ids": torch.arange(8).reshape(2, 4), "responses": responses,
                          "attention_mask": torch.ones(2, 4, dtype=torch.long), "rm_scores": rewards}
            self.non_tensor_batch: dict[str, object] = {"acc": rewards.tolist()}
            self.meta_info = {"reward_extra_keys": ["acc"], "global_token_num": [4, 4]}

    responses = torch.tensor([[2, 3], [6, 7]])
    recorded = fingerprint((Batch(responses, torch.zeros(2)),), {}, ignore=ignore, include=include)
    assert fingerprint((Batch(responses, torch.ones(2)),), {}, ignore=ignore, include=include) == recorded
    assert fingerprint((Batch(responses + 1, torch.zeros(2)),), {}, ignore=ignore, include=include) != recorded

    # the same paths under the signature rule (format 2), the batch passed by position or by keyword
    class Trainer:  # verl's RayPPOTrainer._compute_ref_log_prob(self, batch) and its siblings
        def compute(self, batch: Batch) -> None: ...

    binding = binding_of(inspect.getattr_static(Trainer, "compute"), Trainer)
    assert binding is not None

    def bound(batch: Batch, by_keyword: bool) -> str | None:
        args, kwargs = ((), {"batch": batch}) if by_keyword else ((batch,), {})
        return signature_fingerprint(binding, args, kwargs, ignore=ignore, include=include)

    recorded = bound(Batch(responses, torch.zeros(2)), False)
    assert bound(Batch(responses, torch.ones(2)), True) == bound(Batch(responses, torch.ones(2)), False) == recorded
    assert bound(Batch(responses + 1, torch.zeros(2)), True) != recorded


VERL_APP = {"trainer": {"experiment_name": "e", "project_name": "p"},
            "data": {"train_batch_size": 8, "max_prompt_length": 16, "max_response_length": 32},
            "actor_rollout_ref": {"rollout": {"n": 2}}}


@pytest.mark.parametrize("profiles", [["rollout_cache", "ref_cache"], ["ref_cache"], ["update_only"]])
def test_in_a_verl_app_phases_follow_the_rollouts_own_namespace(profiles: list[str], tmp_path: Path) -> None:
    """verl's run identity is the default namespace of a role that leaves it unset, but not of one that follows
    another: a namespace set for the rollout is the phases' too (one store per step)."""
    from omegaconf import OmegaConf

    import skipweave.integrations.verl.config  # noqa: F401  (registers verl's config adapters)

    composed = compose_profile(profiles, base=VERL_APP,
                               overrides=[f"skip.rollout.dump_dir={tmp_path}", "skip.rollout.namespace=mine"])
    roles = load_skip_config(OmegaConf.merge(OmegaConf.create(VERL_APP), composed)).roles
    assert {r.namespace for r in roles.values()} == {"mine"}
    identity = load_skip_config(OmegaConf.merge(OmegaConf.create(VERL_APP), compose_profile(profiles, base=VERL_APP)))
    assert {r.namespace for r in identity.roles.values()} == {"e_p.GBS8_N2_in16_out32"}  # unset: verl's identity


def test_a_phase_twin_keeps_the_apps_own_store_and_mismatch_policy(tmp_path: Path) -> None:
    """The +skipweave= twins null what Hydra refuses as ??? in the callback node; those nulls leave the app's values."""
    from skipweave.integrations.hydra.callback import job_skip_config

    (tmp_path / "config.yaml").write_text(
        "skip:\n  rollout: {dump_dir: /data/run1, namespace: exp1, steps: [1, 2]}\n"
        "  ref: {fingerprint: {on_mismatch: error}}\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", return_hydra_config=True, overrides=["+skipweave=ref_cache"])
    finally:
        GlobalHydra.instance().clear()
    roles = load_skip_config(job_skip_config(cfg)).roles
    for name in ("rollout", "ref"):
        assert (roles[name].dump_dir, roles[name].namespace, roles[name].steps.to_config()) == (
            "/data/run1", "exp1", ["1-2"]), name
    assert roles["ref"].fingerprint.on_mismatch.value == "error"
