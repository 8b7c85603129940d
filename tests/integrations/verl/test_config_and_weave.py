"""verl's own ``ppo_trainer`` config with ``+skip=<profile>`` composed through Hydra, and verl's real classes woven.

Needs verl: the test command installs the `verl` extra (see docs/verl.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import skipweave  # noqa: E402
from skipweave.config import load_skip_config  # noqa: E402
from skipweave.integrations.hydra.callback import job_skip_config  # noqa: E402
from skipweave.integrations.verl.coexist import sanitize_skip, taken_roles  # noqa: E402
from skipweave.integrations.verl.namespace import derive_namespace  # noqa: E402
from skipweave.weaving.proxy import proxy_of  # noqa: E402
from tests.integrations.verl.apps.agent_loop_app import compose  # noqa: E402

AGENT_LOOP = "verl.experimental.agent_loop.agent_loop.AgentLoopManager.generate_sequences"


def _compose(dump: Path, *overrides: str, profile: str = "rollout_cache") -> Any:
    import os

    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", return_hydra_config=True,
                             overrides=[f"+skip={profile}", f"skip.{_role(profile)}.dump_dir={dump}", *overrides])


def _role(profile: str) -> str:
    return "async_rollout" if profile.startswith("async") else "rollout"


def test_profile_composed_into_ppo_trainer_gives_the_plan(tmp_path: Path) -> None:
    cfg = compose(str(tmp_path))
    assert cfg.hydra.callbacks.skipweave._target_ == "skipweave.integrations.hydra.callback.SkipweaveCallback"
    plan = load_skip_config(job_skip_config(cfg))
    role = plan.roles["rollout"]
    assert role.enable and role.action.value == "cache" and role.steps.ranges is None  # verl's `steps: []` -> all
    assert role.dump_dir == str(tmp_path)
    # verl's run identity; data.gen_batch_size is null in ppo_trainer, so train_batch_size (2) is used.
    assert role.namespace == "exp_proj.GBS2_N2_in4_out3"
    targets = {t.name: (t.path, t.proxy) for t in role.targets}
    assert targets["verl_agent_loop"] == (AGENT_LOOP, "skipweave.integrations.verl.proxies:AgentLoopProxy")
    assert set(targets) == {"verl_agent_loop", "verl_tq_submit", "verl_tq_sample", "verl_tq_sample_async",
                            "verl_tq_warmup"}
    assert all(t.optional for t in role.targets)
    assert not plan.roles["rollout_tq"].enable and not plan.roles["async_rollout"].enable
    assert "_target_" not in plan.roles  # verl's `skip._target_` is Hydra's, not a role
    assert taken_roles(plan) == {"rollout": "rollout", "rollout_tq": "rollout"}


def test_async_profile_and_namespace_fallbacks(tmp_path: Path) -> None:
    cfg = _compose(tmp_path, "data.gen_batch_size=8", "trainer.experiment_name=e", profile="async_rollout_cache")
    role = load_skip_config(job_skip_config(cfg)).roles["async_rollout"]
    assert role.namespace == "e_verl_examples.GBS8_N1_in512_out512"
    assert [(t.path, t.proxy) for t in role.targets] == [(
        "verl.experimental.fully_async_policy.fully_async_rollouter.FullyAsyncAgentLoopManager."
        "generate_sequences_single", "skipweave.integrations.verl.proxies:AsyncSampleProxy")]
    # verl's fallbacks when names are missing
    assert derive_namespace({"trainer": {}, "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {}}}) \
        == "default_experiment_name_default_project_name.GBS4_N0_in0_out0"
    assert derive_namespace({"skip": {}}) is None
    # an explicit namespace wins
    cfg = _compose(tmp_path, "skip.rollout.namespace=mine")
    assert load_skip_config(job_skip_config(cfg)).roles["rollout"].namespace == "mine"


def test_verl_skip_manager_parses_its_section_and_leaves_the_role_to_skipweave(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from verl.utils.skip import SkipManager

    cfg = compose(str(tmp_path))
    with pytest.raises(Exception, match="not in 'RolloutSkipConfig'"):
        SkipManager.init(cfg)  # what verl alone makes of skipweave's keys: why the coexistence exists
    skipweave.weave(load_skip_config(job_skip_config(cfg)))
    with caplog.at_level(logging.INFO, logger="skipweave"):
        SkipManager.init(cfg)
    assert {k: v.enable for k, v in SkipManager.skip_instances.items()} == {
        "rollout": False, "rollout_tq": False, "async_rollout": False}
    said = [r.getMessage() for r in caplog.records if "SkipManager" in r.getMessage()]
    assert any("verl role 'rollout' is recorded and replayed by skipweave (skip.rollout)" in m for m in said), said
    assert cfg.skip.rollout.enable is True  # the host's own config is untouched
    skipweave.unweave()
    SkipManager.init(_plain_verl(tmp_path))  # unwoven: verl alone, with its own skip switched on
    assert SkipManager.skip_instances["rollout"].enable is True


def _plain_verl(tmp_path: Path) -> Any:
    """verl's config with its own skip switched on for rollout (no skipweave profile)."""
    import os

    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=["skip.rollout.enable=true",
                                                                   f"skip.rollout.dump_dir={tmp_path}/verl"])


def test_verl_keeps_the_roles_skipweave_does_not_take(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from verl.utils.skip import SkipManager

    # skipweave acts on the async rollouter only; verl's own rollout skip (switched on by the user) stays verl's.
    cfg = _compose(tmp_path, "skip.rollout.enable=true", "skip.rollout.steps=[1,2]", profile="async_rollout_cache")
    plan = load_skip_config(job_skip_config(cfg))
    assert [r.role for r in plan.enabled_roles] == ["async_rollout"]  # skip.rollout has no target: not skipweave's
    skipweave.weave(plan)
    with caplog.at_level(logging.INFO, logger="skipweave"):
        SkipManager.init(cfg)
    instances = SkipManager.skip_instances
    assert instances["rollout"].enable is True and instances["rollout"].steps == [1, 2]
    assert instances["async_rollout"].enable is False
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "verl role 'rollout' is served by verl's own SkipManager" in said
    assert "verl role 'async_rollout' is recorded and replayed by skipweave" in said


def test_sanitize_keeps_only_what_verl_knows() -> None:
    raw = {"_target_": "verl.utils.skip.SkipManagerConfig",
           "rollout": {"enable": True, "steps": "all", "action": "repeat_last", "dump_dir": None, "targets": {}},
           "rollout_tq": {"enable": True, "steps": [3], "action": "repeat", "dump_dir": "/d"},
           "custom": {"enable": True}}
    out = sanitize_skip(raw, {"rollout": "rollout"})
    assert out["_target_"] == raw["_target_"] and "custom" not in out
    assert out["rollout"] == {"enable": False, "steps": [], "action": "cache", "dump_dir": "~/.verl/rollout_dump"}
    assert out["rollout_tq"] == {"enable": True, "steps": [3], "action": "repeat", "dump_dir": "/d"}
    assert out["async_rollout"]["enable"] is False


def test_weave_reaches_every_verl_entry_point(tmp_path: Path) -> None:
    import inspect

    import wrapt

    from skipweave.integrations.verl.proxies import AgentLoopProxy, AsyncSampleProxy
    from skipweave.integrations.verl.tq import TqSampleProxy, TqSubmitProxy, TqWarmupProxy

    plan_a = load_skip_config(job_skip_config(compose(str(tmp_path))))
    plan_b = load_skip_config(job_skip_config(_compose(tmp_path, profile="async_rollout_cache")))
    both = type(plan_a)({**plan_a.roles, "async_rollout": plan_b.roles["async_rollout"]})
    patches = skipweave.weave(both)
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    expected = {
        (AgentLoopManager, "generate_sequences"): AgentLoopProxy,
        (FullyAsyncAgentLoopManager, "generate_sequences_single"): AsyncSampleProxy,
        (PPOTrainer, "_add_batch_to_generate"): TqSubmitProxy,
        (ReplayBuffer, "sample"): TqSampleProxy,
        (ReplayBufferAsync, "sample"): TqSampleProxy,
        (PPOTrainer, "_add_async_warmup_batches"): TqWarmupProxy,
    }
    for (owner, attr), cls in expected.items():
        current = inspect.getattr_static(owner, attr)
        assert isinstance(current, wrapt.FunctionWrapper), (owner, attr)
        assert type(proxy_of(current._self_wrapper)) is cls, (owner, attr)
    assert all(not p.pending for p in patches)
    agent = next(p for p in patches if p.target.name == "verl_agent_loop")
    assert agent.proxy is not None and agent.proxy.bridge and not agent.proxy.is_async  # verl's auto_await
    skipweave.unweave()
    assert not isinstance(inspect.getattr_static(AgentLoopManager, "generate_sequences"), wrapt.FunctionWrapper)


def test_a_skip_manager_initialised_before_the_weave_hands_the_role_over(tmp_path: Path) -> None:
    from verl.utils.skip import SkipManager

    SkipManager.init(_plain_verl(tmp_path))  # verl alone, its own rollout skip on
    assert SkipManager.skip_instances["rollout"].enable is True
    skipweave.weave(load_skip_config(job_skip_config(compose(str(tmp_path)))))
    assert SkipManager.skip_instances["rollout"].enable is False
    assert SkipManager.skip_instances["rollout_tq"].enable is False
