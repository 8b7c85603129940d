"""The manifest's ``environment`` (skipweave.store.format.environment): written into every entry, grouped ones
included, and
checked before a replay compares it, however it was crafted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.store.format.environment import EnvironmentInvalid, changes, describe, fields_of, identical
from skipweave.store.format.layout import parse_group_name
from skipweave.store.step_store import EntryMeta, StepStore

ENV = {"packages": {"torch": "2.13.0"}, "host": {"name": "verl", "version": "0.9.1"}, "source": "xxh3_128:" + "0" * 32,
       "config": {"model.path": "/m", "rollout.n": 8}}


def test_every_entry_of_a_group_carries_the_environment_and_reads_it_back(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=6)
    items = [(store.key(1, "gen", "r0", c), store.stage({"ids": torch.arange(4) + c}, rng_state=None).copied(),
              EntryMeta("m:f", f"fp{c}", 0.1, background=True, environment=ENV)) for c in range(6)]
    assert all(isinstance(r, tuple) for r in store.commit_many(items))
    store.close_all()
    folder = tmp_path / "ns" / "rollout" / "1" / "gen"
    assert [p.name for p in folder.iterdir() if parse_group_name(p.name)] == ["r0-0000-0005.pack.json"]
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=6)
    for c in range(6):
        loaded = reader.load(reader.key(1, "gen", "r0", c))
        assert loaded.manifest["environment"] == ENV and fields_of(loaded.manifest["environment"])["host package"] \
            == "verl 0.9.1"


def test_an_entry_recorded_without_an_environment_has_no_field(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout")
    store.commit(store.key(1, "gen", "r0", 0), store.stage([1], rng_state=None), EntryMeta("m:f", "fp", 0.1))
    assert "environment" not in store.load(store.key(1, "gen", "r0", 0)).manifest


@pytest.mark.parametrize("crafted", [
    7, [], "torch 2", {"packages": []}, {"packages": {"vllm": 1}}, {"packages": {"": "1"}},
    {"packages": {"vllm": "x" * 10_000}}, {"packages": {f"p{i}": "1" for i in range(300)}},
    {"host": "verl"}, {"host": {"name": "verl"}}, {"source": 5}, {"config": {"k": [1, 2]}}, {"config": {"k": {}}},
    {"config": {"k": float("nan")}}, {"config": {"k": 1 << 80}}, {"config": {"k": "v" * 1000}},
])
def test_a_crafted_environment_is_refused_with_where_it_is_wrong(crafted: Any) -> None:
    with pytest.raises(EnvironmentInvalid, match="environment|package|config"):
        fields_of(crafted)


def test_fields_only_one_side_has_are_no_change_and_types_count() -> None:
    recorded = fields_of(ENV)
    live = fields_of({"packages": {"vllm": "0.8.5"}, "config": {"model.path": "/m", "rollout.n": 8, "extra": 1},
                      "future_part": {"anything": ["goes"]}})  # parts a later skipweave adds are ignored
    assert changes(recorded, live) == ()
    flipped = fields_of({**ENV, "config": {"model.path": "/m", "rollout.n": True}})
    assert changes(recorded, flipped) == (("config rollout.n", 8, True),)
    assert describe(changes(recorded, flipped)) == "config rollout.n 8 -> True"


# Pairs Python's == finds equal, though JSON (and docs/format.md) tells them apart.
ACROSS_TYPES = [(0, False), (1, True), (1, 1.0), (0, 0.0), (True, 1.0)]


@pytest.mark.parametrize(("old", "new"), ACROSS_TYPES + [("1", 1), (None, False)])
def test_a_config_value_of_another_type_is_a_change_both_ways(old: Any, new: Any) -> None:
    for a, b in ((old, new), (new, old)):
        recorded, live = {**ENV, "config": {"k": a, "rollout.n": 8}}, {**ENV, "config": {"k": b, "rollout.n": 8}}
        assert not identical(json.loads(json.dumps(recorded)), live)  # as a replay reads it from the manifest
        assert changes(fields_of(recorded), fields_of(live)) == (("config k", a, b),)


@pytest.mark.parametrize(("old", "new"), ACROSS_TYPES)
def test_nested_values_of_another_type_are_not_identical(old: Any, new: Any) -> None:
    # fields_of keeps config values scalar (lists and mappings are recorded hashed), but the first look walks the
    # whole manifest value: a number anywhere in it is compared with its type
    for recorded, live in (({"config": {"k": [old, 1]}}, {"config": {"k": [new, 1]}}),
                           ({"x": {"y": [{"z": old}]}}, {"x": {"y": [{"z": new}]}}),
                           ({"x": old}, {"x": new})):
        assert recorded == live and not identical(recorded, live) and not identical(live, recorded)


def test_equal_values_of_the_same_type_are_identical() -> None:
    env = {**ENV, "config": {"a": 0, "b": True, "c": 1.5, "d": None, "e": "1", "f": "xxh3_64:" + "0" * 16}}
    assert identical(json.loads(json.dumps(env)), env)
    assert identical({"x": [1, {"y": [False, None, 0.0]}]}, {"x": [1, {"y": [False, None, 0.0]}]})
    assert changes(fields_of(env), fields_of(json.loads(json.dumps(env)))) == ()


def test_the_first_look_is_no_judgement_of_shape() -> None:
    # anything unequal, or shaped otherwise, is left to fields_of and changes (a crafted value never raises here)
    assert not identical({"packages": {"torch": "2.13.0"}}, {"packages": {"torch": "2.13.0", "vllm": "0.8.5"}})
    assert not identical([ENV], ENV) and not identical(7, ENV) and not identical({"a": (1,)}, {"a": [1]})
    deep: Any = 0
    for _ in range(100_000):
        deep = {"config": deep}
    assert not identical(deep, ENV)
