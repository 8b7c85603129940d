"""``skip.<role>.fingerprint.env``: app config keys read once, when the whole config is read, into the role's plan."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from skipweave.config import load_skip_config
from skipweave.config.adapters import relevant_config
from skipweave.config.env_keys import HASH_PREFIX, MAX_CHARS, MAX_ITEMS, env_value
from skipweave.config.errors import ConfigError
from skipweave.config.parse import parse_skip
from skipweave.store.format.environment import fields_of

ROLLOUT = {"enable": True, "targets": {"gen": "m:C.f"}}


def _config(env: object, **app: object) -> dict[str, object]:
    return {**app, "skip": {"rollout": {**ROLLOUT, "fingerprint": {"env": env}}}}


def test_named_keys_are_resolved_once_and_travel_with_the_plan() -> None:
    plan = load_skip_config(_config(["actor.model.path", "actor.rollout.temperature", "actor.stages.1"],
                                    actor={"model": {"path": "/models/a"}, "rollout": {"temperature": 0.7},
                                           "stages": ["a", "b"]}))
    role = plan.roles["rollout"]
    assert role.fingerprint.env == (("actor.model.path", "/models/a"), ("actor.rollout.temperature", 0.7),
                                    ("actor.stages.1", "b"))
    shipped = plan.to_config()["skip"]["rollout"]["fingerprint"]
    assert shipped["env"] == {"actor.model.path": "/models/a", "actor.rollout.temperature": 0.7, "actor.stages.1": "b"}
    assert parse_skip(plan.to_config()["skip"]) == plan  # what a Ray worker reads back: no app config needed
    assert load_skip_config(plan.to_config()) == plan


def test_long_values_and_containers_are_kept_as_a_short_hash() -> None:
    plan = load_skip_config(_config(["a.long", "a.nested"], a={"long": "x" * 500, "nested": {"k": [1, 2]}}))
    long, nested = (value for _, value in plan.roles["rollout"].fingerprint.env)
    assert long.startswith(HASH_PREFIX) and len(long) == len(HASH_PREFIX) + 16
    assert nested != long and nested == env_value({"k": [1, 2]}) != env_value({"k": [1, 3]})
    assert env_value(long) == long and env_value(None) is None and env_value(True) is True


def test_values_a_replay_would_refuse_are_hashed_so_every_kept_environment_passes_its_judgement() -> None:
    app = {"seed": 2**64, "low": -(2**63), "fits": 2**63 - 1, "huge": 10**5000, "text": "t" * 300, "nan": float("nan")}
    plan = load_skip_config(_config([f"a.{k}" for k in app], a=app))
    env = dict(plan.roles["rollout"].fingerprint.env)
    assert env["a.fits"] == 2**63 - 1
    for name in ("a.seed", "a.low", "a.huge", "a.text", "a.nan"):
        assert env[name].startswith(HASH_PREFIX), name
    assert len({env["a.seed"], env["a.huge"], env_value(2**64 + 1)}) == 3
    assert fields_of({"config": env})["config a.seed"] == env["a.seed"]  # what the store reads back, unrefused


def test_a_path_longer_than_a_recorded_key_may_be_is_an_error_naming_it() -> None:
    fits = "a." + "k" * (MAX_CHARS - 2)
    assert load_skip_config(_config([fits], a={fits[2:]: 5})).roles["rollout"].fingerprint.env == ((fits, 5),)
    long = fits + "k"
    for load in (lambda: load_skip_config(_config([long], a={long[2:]: 5})),
                 lambda: parse_skip({"rollout": {**ROLLOUT, "fingerprint": {"env": {long: 5}}}})):  # a worker's plan
        with pytest.raises(ConfigError, match=f"at most {MAX_CHARS} characters") as info:
            load()
        assert info.value.key == "skip.rollout.fingerprint.env" and long in str(info.value)


def test_more_keys_than_a_recorded_environment_may_list_is_an_error() -> None:
    app = {f"k{i}": i for i in range(MAX_ITEMS + 1)}
    assert len(load_skip_config(_config([f"a.k{i}" for i in range(MAX_ITEMS)], a=app))
               .roles["rollout"].fingerprint.env) == MAX_ITEMS
    resolved = {f"a.k{i}": i for i in range(MAX_ITEMS + 1)}
    for load in (lambda: load_skip_config(_config(list(resolved), a=app)),
                 lambda: parse_skip({"rollout": {**ROLLOUT, "fingerprint": {"env": resolved}}})):
        with pytest.raises(ConfigError, match=f"at most {MAX_ITEMS} keys") as info:
            load()
        assert info.value.key == "skip.rollout.fingerprint.env"


@pytest.mark.parametrize("path", ["a.missing", "a.b.c", "nope", "a.list.5"])
def test_a_named_key_the_config_does_not_have_is_an_error_naming_it(path: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_skip_config(_config(["a.b", path], a={"b": 1, "list": [0]}))
    assert info.value.key == "skip.rollout.fingerprint.env" and path in str(info.value)


def test_a_single_path_is_a_list_of_one() -> None:
    assert load_skip_config(_config("a.b", a={"b": 1})).roles["rollout"].fingerprint.env == (("a.b", 1),)


@pytest.mark.parametrize("env", ["a..b", [""], ["a b"], [3], 5])
def test_an_item_that_is_no_dotted_path_is_an_error(env: object) -> None:
    with pytest.raises(ConfigError, match="skip.rollout.fingerprint.env"):
        load_skip_config(_config(env, a={"b": 1}))


def test_paths_given_without_the_whole_config_are_an_error_not_an_empty_environment() -> None:
    with pytest.raises(ConfigError, match="whole config"):
        parse_skip({"rollout": {**ROLLOUT, "fingerprint": {"env": ["a.b"]}}})


def test_only_the_named_keys_of_an_omegaconf_config_are_resolved() -> None:
    cfg = OmegaConf.create(_config(["actor.temperature"], actor={"temperature": "${base}", "broken": "${nowhere}"},
                                   base=0.9))
    part = relevant_config(cfg)
    assert part["actor"] == {"temperature": 0.9}  # not the key that would not resolve
    assert load_skip_config(part).roles["rollout"].fingerprint.env == (("actor.temperature", 0.9),)
    missing = OmegaConf.create(_config(["actor.unset"], actor={"unset": "???"}))
    with pytest.raises(ConfigError, match="actor.unset"):
        load_skip_config(relevant_config(missing))


def test_on_env_mismatch_takes_the_three_policies_only() -> None:
    for policy in ("warn", "regenerate", "error"):
        role = parse_skip({"r": {"fingerprint": {"on_env_mismatch": policy}}}).roles["r"]
        assert role.fingerprint.on_env_mismatch.value == policy
    with pytest.raises(ConfigError, match="on_env_mismatch"):
        parse_skip({"r": {"fingerprint": {"on_env_mismatch": "ignore"}}})
