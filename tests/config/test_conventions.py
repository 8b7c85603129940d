"""Conventions: the schema's defaults name no host; a role naming a host's convention takes its values for the keys it
leaves unset (skipweave/config/conventions.py, skipweave/integrations/verl/convention.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skipweave.config import load_skip_config
from skipweave.config.conventions import CONVENTIONS, Convention
from skipweave.config.errors import ConfigError
from skipweave.config.parse import parse_skip
from skipweave.integrations.verl.convention import VERL

HOST_WORDS = ("verl", "meta_info", "non_tensor_batch", "global_steps", "DataProto")


def role(**keys: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "targets": {"gen": "my_pkg.engine:Engine.generate"}, **keys}}}


def resolved(**keys: Any) -> dict[str, Any]:
    out: dict[str, Any] = load_skip_config(role(**keys)).to_config()["skip"]["rollout"]
    return out


def test_a_trainer_of_ones_own_sees_no_host_in_its_resolved_config() -> None:
    text = json.dumps(load_skip_config(role()).to_config())
    assert not [w for w in HOST_WORDS if w in text], text
    got = resolved()
    assert got["convention"] is None and got["step"]["path"] is None and got["bypass"]["paths"] == []
    assert got["fingerprint"]["ignore"] == []


@pytest.mark.parametrize(("keys", "key"), [
    ({"step": {"path": 3}}, "skip.rollout.step.path"),
    ({"fingerprint": {"ignore": ["a..b"]}}, "skip.rollout.fingerprint.ignore"),
    ({"echo": "x"}, "skip.rollout.echo"),
    ({"effects": ["1 +"]}, "skip.rollout.effects"),
    ({"step": {"source": "attr"}}, "skip.rollout.step.path"),
])
def test_its_errors_name_no_host_either(keys: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_skip_config(role(**keys))
    message = str(caught.value)
    assert message.startswith(key) and not [w for w in HOST_WORDS if w in message], message


def test_verls_convention_gives_what_the_defaults_were() -> None:
    got = resolved(convention="verl")
    assert got["convention"] == "verl"
    assert got["step"] == {"source": "auto", "arg": 0, "path": "meta_info.global_steps", "pattern": None, "expr": None}
    assert got["bypass"]["when"] == "arg" and got["bypass"]["paths"] == ["meta_info.validate"]
    assert got["fingerprint"]["ignore"] == ["*.non_tensor_batch.uid", "*.meta_info.timing"]


def test_a_roles_own_values_win_and_short_forms_are_expanded_first() -> None:
    got = resolved(convention="verl", step="counter", bypass=None,
                   fingerprint={"ignore": ["*.ids"], "on_mismatch": "???"})
    assert got["step"]["source"] == "counter" and got["step"]["path"] == "meta_info.global_steps"
    assert got["bypass"]["when"] == "never" and got["bypass"]["paths"] == ["meta_info.validate"]
    assert got["fingerprint"]["ignore"] == ["*.ids"] and got["fingerprint"]["on_mismatch"] == "warn"
    own = resolved(convention="verl", step={"source": "arg", "arg": 1, "path": "info.step", "pattern": "???"})
    assert (own["step"]["arg"], own["step"]["path"]) == (1, "info.step")


def test_the_resolved_config_parses_back_to_itself() -> None:
    plan = load_skip_config(role(convention="verl", step="counter"))
    assert parse_skip(plan.to_config()["skip"]) == plan


def test_a_name_no_loaded_integration_declares_is_refused_naming_those_that_do() -> None:
    with pytest.raises(ConfigError, match=r"skip\.rollout\.convention='verll' is not allowed: the name of a convention "
                                          r"of a loaded integration; one of \['verl'\]"):
        load_skip_config(role(convention="verll"))
    with pytest.raises(ConfigError, match=r"skip\.rollout\.convention='Verl' is not allowed"):
        load_skip_config(role(convention="Verl"))
    CONVENTIONS.remove(VERL)  # as in a process that did not load the verl integration
    try:
        with pytest.raises(ConfigError, match="none is declared in this process: call skipweave.load_integrations()"):
            load_skip_config(role(convention="verl"))
    finally:
        CONVENTIONS.add(VERL)


def test_a_convention_of_ones_own() -> None:
    mine = Convention("mine", {"step": {"source": "arg", "path": "meta.step"}, "bypass": {"paths": ["meta.eval"]},
                               "calls_per_step": 2})
    CONVENTIONS.add(mine)
    try:
        got = resolved(convention="mine", calls_per_step=3)
        assert got["step"]["source"] == "arg" and got["step"]["path"] == "meta.step"
        assert got["bypass"]["paths"] == ["meta.eval"] and got["calls_per_step"] == 3
        with pytest.raises(ConfigError, match=r"skip\.rollout\.step\.sorce"):
            CONVENTIONS.remove(mine)
            CONVENTIONS.add(Convention("mine", {"step": {"sorce": "arg"}}))
            resolved(convention="mine")
    finally:
        for c in [c for c in CONVENTIONS if c.name == "mine"]:
            CONVENTIONS.remove(c)
    with pytest.raises(ValueError, match="Convention name='My' is not allowed"):
        Convention("My", {})


def test_a_verl_app_and_verls_legacy_keys_follow_verls_convention() -> None:
    shape = {"trainer": {"experiment_name": "e"}, "data": {"train_batch_size": 2}, "actor_rollout_ref": {"rollout": {}}}
    app = load_skip_config({**shape, **role()})
    assert app.roles["rollout"].convention == "verl" and app.roles["rollout"].step.path == "meta_info.global_steps"
    mine = Convention("mine_too", {})
    CONVENTIONS.add(mine)
    try:
        # a role of a verl app naming a convention of its own keeps it
        assert load_skip_config({**shape, **role(convention="mine_too")}).roles["rollout"].convention == "mine_too"
    finally:
        CONVENTIONS.remove(mine)
    with pytest.warns(Warning):
        legacy = load_skip_config({"actor_rollout_ref": {"rollout": {"skip_rollout": True}}})
    rollout = legacy.roles["rollout"]
    assert rollout.convention == "verl" and rollout.bypass.paths == ("meta_info.validate",)
