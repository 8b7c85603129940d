"""``restore_in_place``: what a replayed declared effect does to the host's own containers (references the host holds
keep seeing the recorded value; their types, ``maxlen`` and factories kept)."""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from skipweave.policy.expressions import restore_in_place


def test_nested_containers_in_mappings_and_sequences_are_restored_in_place() -> None:
    inner, row = deque([0], maxlen=2), {"loss": [0.0]}
    current: dict[str, Any] = {"queue": inner, "rows": [row, {"gone": 1}], "old": 1}
    assert restore_in_place(current, {"queue": [1, 2, 3], "rows": [{"loss": [0.5, 0.25]}], "new": 2})
    assert current == {"queue": deque([2, 3], maxlen=2), "rows": [{"loss": [0.5, 0.25]}], "new": 2}
    assert current["queue"] is inner and inner.maxlen == 2  # the host's deque, bounded as it was
    assert current["rows"][0] is row  # a mapping inside a list: the host's own, refilled
    assert not restore_in_place(current["new"], 3) and not restore_in_place([1], "ab")


def test_a_defaultdict_fills_missing_keys_through_its_factory_and_a_raising_factory_gives_the_value() -> None:
    bounded: defaultdict[str, deque[int]] = defaultdict(lambda: deque(maxlen=2))
    assert restore_in_place(bounded, {"a": [1, 2, 3]})
    assert isinstance(bounded["a"], deque) and list(bounded["a"]) == [2, 3]

    calls = []

    def factory() -> list[int]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the host's factory fails")
        return []

    broken: defaultdict[str, Any] = defaultdict(factory, {"stale": [9]})
    assert restore_in_place(broken, {"a": [1], "b": [2], "c": [3]})
    # every key restored (none left half done), the one whose factory raised as recorded
    assert dict(broken) == {"a": [1], "b": [2], "c": [3]} and len(calls) == 3


def test_a_cycle_on_either_side_is_restored_once() -> None:
    recorded: dict[str, Any] = {"n": 1}
    recorded["self"] = recorded
    current: dict[str, Any] = {"n": 0}
    current["self"] = current
    assert restore_in_place(current, recorded)  # was a RecursionError
    assert current["n"] == 1 and current["self"] is current
    looped: list[Any] = [1]
    looped.append(looped)
    host: list[Any] = [0, [0]]
    assert restore_in_place(host, looped) and host[0] == 1
