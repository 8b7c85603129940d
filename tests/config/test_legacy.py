"""Legacy verl skip keys remapped onto ``skip.rollout`` (see the table in skipweave/integrations/verl/legacy.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest
from omegaconf import OmegaConf

from skipweave.config import ConfigError, load_skip_config
from skipweave.config.adapters import relevant_config
from skipweave.config.schema import Action, RoleConfig, StepSet
from skipweave.integrations.verl.legacy import SkipweaveDeprecationWarning, remap_legacy

D = "/tmp/legacy-dump"


def legacy(**rollout: Any) -> dict[str, Any]:
    return {"actor_rollout_ref": {"rollout": rollout}}


def rollout_of(cfg: dict[str, Any]) -> tuple[RoleConfig, list[str]]:
    """The validated ``skip.rollout`` of ``cfg`` and the deprecation messages loading it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        role = load_skip_config(cfg).roles["rollout"]
    return role, [str(w.message) for w in caught if issubclass(w.category, SkipweaveDeprecationWarning)]


def test_no_skip_anywhere_means_disabled_never_an_error() -> None:
    assert load_skip_config({}).roles == {}
    assert load_skip_config({"skip": None, "trainer": {"x": 1}}).roles == {}
    assert load_skip_config(legacy(n=8)).roles == {}


def test_verl_2025_one_dump_serves_every_step() -> None:
    role, messages = rollout_of(legacy(skip_rollout=True, skip_dump_dir=D))
    assert (role.enable, role.action, role.dump_dir) == (True, Action.REPEAT_LAST, D)
    assert role.record_steps == StepSet(((1, 1),)) and role.steps == StepSet(None)
    assert any(
        "actor_rollout_ref.rollout.skip_rollout is deprecated" in m
        and "skip.rollout.enable=true" in m
        and "skip.rollout.action=repeat_last" in m
        for m in messages
    ), messages
    assert any(
        f"actor_rollout_ref.rollout.skip_dump_dir is deprecated; skipweave reads it as "
        f"skip.rollout.dump_dir={D}" in m
        for m in messages
    ), messages


def test_disabled_legacy_blocks_as_verl_ships_them_contribute_and_warn_nothing() -> None:
    cfg = legacy(
        skip_rollout=False,
        skip_dump_dir="/tmp/rollout_dump",
        skip={"enable": False, "dump_dir": "/x", "max_dump_step": 3, "action": "cache"},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert remap_legacy(cfg) == cfg
        assert load_skip_config(cfg).roles == {}


@pytest.mark.parametrize(
    ("action", "expected_action", "steps", "record_steps"),
    [
        ("cache", Action.CACHE, StepSet(((1, 3),)), None),
        ("repeat", Action.REPEAT_CYCLE, StepSet(None), StepSet(((1, 3),))),
        ("repeat_last", Action.REPEAT_LAST, StepSet(None), StepSet(((1, 3),))),
    ],
)
def test_verl_2026_actions(
    action: str, expected_action: Action, steps: StepSet, record_steps: StepSet | None
) -> None:
    role, messages = rollout_of(
        legacy(skip={"enable": True, "dump_dir": D, "max_dump_step": 3, "action": action})
    )
    assert (role.enable, role.action, role.dump_dir) == (True, expected_action, D)
    assert (role.steps, role.record_steps) == (steps, record_steps)
    key = "steps" if action == "cache" else "record_steps"
    assert any(
        "actor_rollout_ref.rollout.skip.max_dump_step is deprecated" in m and f"skip.rollout.{key}=1-3" in m
        for m in messages
    ), messages


def test_verl_2026_defaults_repeat_and_one_dumped_step_reported_against_the_switch() -> None:
    role, messages = rollout_of(legacy(skip={"enable": True}))
    assert (role.action, role.record_steps) == (Action.REPEAT_CYCLE, StepSet(((1, 1),)))
    assert len(messages) == 1 and messages[0].startswith(
        "actor_rollout_ref.rollout.skip.enable is deprecated"
    )
    assert (
        "skip.rollout.action=repeat_cycle" in messages[0] and "skip.rollout.record_steps=[1]" in messages[0]
    )


def test_new_style_settings_win_and_legacy_fills_only_what_they_leave_unset() -> None:
    cfg = {
        "skip": {"rollout": {"enable": True, "action": "cache", "steps": [5], "dump_dir": "/new"}},
        **legacy(skip={"enable": True, "dump_dir": D, "max_dump_step": 2, "action": "repeat"}),
    }
    role, messages = rollout_of(cfg)
    assert (role.action, role.steps, role.dump_dir) == (Action.CACHE, StepSet(((5, 5),)), "/new")
    assert any(
        "skip.dump_dir is deprecated and ignored here: skip.rollout.dump_dir=/new" in m for m in messages
    )
    assert any("skip.action is deprecated and ignored here: skip.rollout.action=cache" in m for m in messages)


def test_the_issues_example_profile_defaults_are_filled_by_legacy_values() -> None:
    # What +skip=rollout_cache composes (??? = unset) + verl 2026 keys: steps 1-2 under D, step 3 live.
    profile = {
        "enable": True,
        "action": "cache",
        "steps": "???",
        "record_steps": "???",
        "dump_dir": "???",
        "namespace": "???",
        "targets": {"gen": "pkg.mod.Gen.run"},
    }
    cfg = {
        "skip": {"rollout": profile},
        **legacy(skip={"enable": True, "dump_dir": D, "max_dump_step": 2, "action": "cache"}),
    }
    role, _ = rollout_of(cfg)
    assert (role.enable, role.action, role.dump_dir, role.namespace) == (True, Action.CACHE, D, "default")
    assert role.steps == StepSet(((1, 2),)) and 3 not in role.steps


def test_max_dump_step_follows_the_action_in_force() -> None:
    cfg = {"skip": {"rollout": {"action": "repeat"}}, **legacy(skip={"enable": True, "max_dump_step": 3})}
    role, _ = rollout_of(cfg)
    assert (role.action, role.steps, role.record_steps) == (Action.REPEAT, StepSet(None), StepSet(((1, 3),)))


def test_max_dump_step_zero_with_cache_selects_no_step() -> None:
    role, _ = rollout_of(legacy(skip={"enable": True, "max_dump_step": 0, "action": "cache"}))
    assert 1 not in role.steps and 0 in role.steps


def test_the_2026_block_wins_over_the_2025_one() -> None:
    role, messages = rollout_of(
        legacy(
            skip_rollout=True,
            skip_dump_dir="/old",
            skip={"enable": True, "dump_dir": D, "action": "cache", "max_dump_step": 1},
        )
    )
    assert (role.action, role.dump_dir) == (Action.CACHE, D)
    assert any("skip_rollout is deprecated and ignored here" in m for m in messages)


@pytest.mark.parametrize(
    ("rollout", "key", "value"),
    [
        ({"skip": {"enable": True, "action": "bogus"}}, "actor_rollout_ref.rollout.skip.action", "bogus"),
        ({"skip": {"enable": True, "max_dump_step": -1}}, "actor_rollout_ref.rollout.skip.max_dump_step", -1),
        ({"skip": {"enable": True, "max_dump_step": 0}}, "actor_rollout_ref.rollout.skip.max_dump_step", 0),
        ({"skip": {"enable": "yes"}}, "actor_rollout_ref.rollout.skip.enable", "yes"),
        ({"skip_rollout": "yes"}, "actor_rollout_ref.rollout.skip_rollout", "yes"),
    ],
)
def test_bad_legacy_values_name_the_legacy_key(rollout: dict[str, Any], key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_skip_config(legacy(**rollout))
    assert (info.value.key, info.value.value) == (key, value)
    assert key in str(info.value)


def test_nulls_mean_unset_and_the_input_is_not_modified() -> None:
    cfg = {"skip": {"rollout": {"enable": True, "dump_dir": None, "namespace": None, "steps": None}}}
    snapshot = repr(cfg)
    role = load_skip_config(cfg).roles["rollout"]
    assert role.namespace == "default" and role.steps == StepSet(None)
    assert repr(cfg) == snapshot


def test_relevant_config_reads_only_skip_and_the_legacy_keys_of_an_omegaconf_config() -> None:
    cfg = OmegaConf.create(
        {
            "root": "/data",
            "broken": "${does.not.exist}",  # unrelated keys are never resolved
            "skip": {"rollout": {"enable": True, "steps": [1, 2], "dump_dir": "${root}/dump"}},
            "actor_rollout_ref": {"rollout": {"n": 8, "skip_rollout": False, "skip": {"enable": False}}},
        }
    )
    assert relevant_config(cfg) == {
        "skip": {"rollout": {"enable": True, "steps": [1, 2], "dump_dir": "/data/dump"}},
        "actor_rollout_ref": {"rollout": {"skip_rollout": False, "skip": {"enable": False}}},
    }
    role = load_skip_config(relevant_config(cfg)).roles["rollout"]
    assert role.steps == StepSet(((1, 2),)) and role.dump_dir == "/data/dump"


def test_the_warning_shows_with_pythons_default_filters() -> None:
    # DeprecationWarning raised from library code is hidden by default; ours must not be. (The legacy keys are the verl
    # integration's config adapter: a program that reads a config without weaving loads the integrations first.)
    code = (
        "import skipweave; skipweave.load_integrations(); from skipweave.config import load_skip_config; "
        "load_skip_config({'actor_rollout_ref': {'rollout': {'skip_rollout': True, 'skip_dump_dir': '/d'}}})"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        "SkipweaveDeprecationWarning: actor_rollout_ref.rollout.skip_dump_dir is deprecated" in result.stderr
    )
    assert "skip.rollout.dump_dir=/d" in result.stderr


def test_legacy_enable_null_means_off() -> None:
    """An unset OmegaConf value (`enable: null`, what `???` resolves to in some setups) is off, not an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_skip_config(legacy(skip={"enable": None, "dump_dir": D}))
    assert cfg.enabled_roles == [] and not [w for w in caught if issubclass(w.category, SkipweaveDeprecationWarning)]
