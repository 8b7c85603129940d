"""Validation of ``skip.<role>``: every bad value names the key, the value and what is allowed."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from skipweave.config import ConfigError, load_skip_config, parse_skip
from skipweave.config.schema import Action, StepSet


@pytest.mark.parametrize(
    ("role", "key", "fragment"),
    [
        ({"action": "bogus"}, "skip.rollout.action", "'cache', 'repeat'"),
        ({"enable": "yes"}, "skip.rollout.enable", "true or false"),
        ({"steps": "3-1"}, "skip.rollout.steps", "end at or after"),
        ({"steps": []}, "skip.rollout.steps", "no step"),
        ({"steps": "often"}, "skip.rollout.steps", "inclusive range"),
        ({"targets": ["a"]}, "skip.rollout.targets", "mapping name"),
        ({"targets": {"g": "not a path!"}}, "skip.rollout.targets.g", "pkg.mod:Class.method"),
        ({"targets": {"g": "generate"}}, "skip.rollout.targets.g", "a module and a name inside it"),
        ({"targets": {"g": "pkg.mod:Policy."}}, "skip.rollout.targets.g", "without an empty part"),
        ({"targets": {"g": "pkg..mod:gen"}}, "skip.rollout.targets.g", "without an empty part"),
        ({"step": {"source": "regex"}}, "skip.rollout.step.pattern", "one group"),
        ({"step": {"source": "regex", "pattern": "nogroup"}}, "skip.rollout.step.pattern", "capturing group"),
        ({"fingerprint": {"on_mismatch": "shrug"}}, "skip.rollout.fingerprint.on_mismatch", "'warn'"),
        ({"colour": "red"}, "skip.rollout.colour", "no such key"),
        ({"calls_per_step": 0}, "skip.rollout.calls_per_step", ">= 1"),
        ({"namespace": "../x"}, "skip.rollout.namespace", "folder name"),
        ({"keep": {"bytes": "9" * 400}}, "skip.rollout.keep.bytes", "from 0 to 2**63 - 1"),  # float(..) was inf
        ({"keep": {"bytes": "9" * 400 + "TB"}}, "skip.rollout.keep.bytes", "from 0 to 2**63 - 1"),
        ({"keep": {"bytes": 10**5000}}, "skip.rollout.keep.bytes", "<an integer of 16610 bits>"),
        ({"write_buffer": "8388608TiB"}, "skip.rollout.write_buffer", "from 0 to 2**63 - 1"),  # 2**63
        ({"write_buffer": 1 << 63}, "skip.rollout.write_buffer", "from 0 to 2**63 - 1"),
        ({"write_buffer": "0.5B"}, "skip.rollout.write_buffer", "'512MB'"),
    ],
)
def test_bad_values_name_key_value_and_allowed(role: dict[str, object], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_skip({"rollout": role})
    assert info.value.key == key
    assert key in str(info.value) and fragment in str(info.value)


def test_sizes_are_exact_up_to_the_largest_64_bit_count() -> None:
    def size(value: object) -> object:
        return parse_skip({"r": {"write_buffer": value}}).roles["r"].write_buffer

    assert size("1.5GiB") == 3 << 29 and size(" 2 mb ") == 2 * 10**6 and size(0) == 0
    assert size(str(2**53 + 1)) == 2**53 + 1  # a float would have lost the last byte
    assert size(str((1 << 63) - 1)) == size((1 << 63) - 1) == (1 << 63) - 1


def test_steps_forms() -> None:
    assert parse_skip({"r": {"steps": "all"}}).roles["r"].steps == StepSet(None)
    s = parse_skip({"r": {"steps": [1, "3-5", {"start": 9, "end": 10}, "4..6"]}}).roles["r"].steps
    assert s.ranges == ((1, 1), (3, 6), (9, 10))
    assert 4 in s and 7 not in s and 10 in s
    assert parse_skip({"r": {"steps": 2}}).roles["r"].steps.ranges == ((2, 2),)


def test_dump_dir_is_expanded_and_made_absolute_once(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(str(tmp_path))
    role = parse_skip({"r": {"dump_dir": "rel/d"}}).roles["r"]
    assert role.dump_dir == os.path.join(str(tmp_path), "rel", "d")
    assert parse_skip({"r": {"dump_dir": "~/x"}}).roles["r"].dump_dir == os.path.expanduser("~/x")


def test_targets_accept_both_spellings_and_optional_and_null_removes() -> None:
    role = parse_skip({"r": {"targets": {
        "a": "pkg.mod.Class.method", "b": "pkg.mod:Class.method",
        "c": {"path": "x.y:f", "optional": True}, "d": None,
    }}}).roles["r"]
    assert [(t.name, t.path, t.optional) for t in role.targets] == [
        ("a", "pkg.mod.Class.method", False), ("b", "pkg.mod:Class.method", False), ("c", "x.y:f", True)]


def test_whole_app_config_omegaconf_and_no_skip_means_disabled() -> None:
    cfg = OmegaConf.create({"trainer": {"steps": 3}, "d": "/tmp/x",
                            "skip": {"rollout": {"enable": True, "dump_dir": "${d}", "action": "repeat",
                                                 "targets": {"g": "m:f"}}}})
    plan = load_skip_config(cfg)
    assert plan.roles["rollout"].dump_dir == "/tmp/x" and plan.roles["rollout"].action is Action.REPEAT
    assert load_skip_config({"trainer": {}}).roles == {}
    assert load_skip_config(None).roles == {}


def test_to_config_round_trips() -> None:
    plan = parse_skip({"r": {"enable": True, "steps": [1, "4-6"], "targets": {"g": "m:f"},
                             "record_steps": "1-2", "action": "repeat_cycle"}})
    again = parse_skip(plan.to_config()["skip"])
    assert again == plan


def test_null_dump_dir_and_namespace_mean_defaults_and_nested_omegaconf_lists() -> None:
    role = parse_skip({"r": {"dump_dir": None, "namespace": None}}).roles["r"]
    assert role.namespace == "default" and role.dump_dir == os.path.expanduser("~/.cache/skipweave")
    plan = load_skip_config({"skip": OmegaConf.create({"rollout": {"steps": [1, 2]}})})
    assert plan.roles["rollout"].steps.ranges == ((1, 2),)


@pytest.mark.parametrize("role,key", [
    ({"steps": -5}, "skip.rollout.steps"),
    ({"steps": [1, "-3--1"]}, "skip.rollout.steps"),
    ({"action": "repeat", "record_steps": -1}, "skip.rollout.record_steps"),
    ({"action": "cache", "record_steps": [1, 2]}, "skip.rollout.record_steps"),
    ({"targets": {}}, "skip.rollout.targets"),
    ({"step": {"source": "counter", "pattern": "s_(\\d+)"}}, "skip.rollout.step.pattern"),
    ({"bypass": {"when": "never", "callable": "pkg.mod:fn"}}, "skip.rollout.bypass.callable"),
])
def test_settings_that_would_silently_do_nothing_are_errors(role: dict, key: str) -> None:
    raw = {"enable": True, "targets": {"gen": "pkg.mod:Gen.generate"}, **role}
    with pytest.raises(ConfigError) as err:
        parse_skip({"rollout": raw})
    assert err.value.key == key


def test_steps_from_zero_are_allowed_for_zero_based_trainers() -> None:
    cfg = parse_skip({"rollout": {"enable": True, "steps": [0, "1-3"], "targets": {"gen": "pkg.mod:f"}}})
    assert 0 in cfg.roles["rollout"].steps and 3 in cfg.roles["rollout"].steps


def test_strict_is_a_setting_of_the_run_not_a_role() -> None:
    role = {"enable": True, "targets": {"g": "m.C.f"}}
    plan = load_skip_config(OmegaConf.create({"skip": {"strict": True, "rollout": role}}))
    assert plan.strict and list(plan.roles) == ["rollout"]
    assert parse_skip(plan.to_config()["skip"]) == plan  # `skipweave run` hands the plan to its program as JSON
    plain = parse_skip({"rollout": role})
    assert not plain.strict and "strict" not in plain.to_config()["skip"]
    assert not parse_skip({"strict": "???", "rollout": role}).strict  # a profile's unset key
    with pytest.raises(ConfigError) as err:
        parse_skip({"strict": "yes", "rollout": role})
    assert err.value.key == "skip.strict" and "true or false" in str(err.value)
    with pytest.raises(ConfigError, match="no role can be named 'strict'") as err:  # a role of that name
        parse_skip({"strict": role, "rollout": role})
    assert err.value.key == "skip.strict"
