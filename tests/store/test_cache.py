"""The store's one cache helper (skipweave.store.cache): values served only while their validator holds, bounded."""

from __future__ import annotations

from skipweave.store.cache import ValidatedCache


def test_a_value_is_served_only_for_its_validator_and_within_its_age() -> None:
    cache: ValidatedCache[str, int] = ValidatedCache()
    cache.put("a", (1, 2), 10)
    assert cache.get("a", (1, 2)) == 10 and cache.get("a", (1, 3)) is None and cache.get("a", None) is None
    assert cache.get("a", (1, 2), max_age=0.0) is None
    cache.revalidate((1, 2), (1, 3))
    assert cache.get("a", (1, 3)) == 10 and cache.last("a") == ((1, 3), 10)
    cache.update("a", 11)
    assert cache.get("a", (1, 3)) == 11
    cache.put("a", None, 12)  # a source that is gone: forgotten
    assert cache.last("a") is None


def test_bounded_by_entries_and_by_weight_least_recently_used_first() -> None:
    fifo: ValidatedCache[int, int] = ValidatedCache(max_entries=3)
    for k in range(5):
        fifo.put(k, 0, k)
    assert fifo.keys() == [2, 3, 4]
    lru: ValidatedCache[str, int] = ValidatedCache(max_weight=10, weight=lambda v: v)
    lru.put("a", 0, 4)
    lru.put("b", 0, 4)
    assert lru.get("a", 0) == 4  # now the most recently used
    lru.put("c", 0, 4)
    assert lru.keys() == ["a", "c"]
