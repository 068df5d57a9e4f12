"""HeapLevel: bounds by count, bytes and both; dirty victims; pinning; policy resolution."""
from __future__ import annotations

import pytest

from mlcache.config import HeapConfig
from mlcache.errors import ConfigError
from mlcache.levels.heap import HeapLevel, estimate_size, resolve_policy
from mlcache.policies import available_policies, get_policy


@pytest.mark.parametrize("policy", ["lru", "clock"])
def test_count_bound_returns_victims_with_dirty_flag(policy):
    heap = HeapLevel(HeapConfig(policy=policy, max_entries=3, max_bytes=None))
    victims = []
    for i in range(10):
        victims += heap.insert(b"k%d" % i, [i], dirty=(i % 2 == 0))
        assert len(heap) <= 3
    assert len(victims) == 7
    for key, value, dirty in victims:
        i = int(key[1:])
        assert value == [i] and dirty == (i % 2 == 0)
    assert set(heap.data) | {k for k, _, _ in victims} == {b"k%d" % i for i in range(10)}
    assert heap.dirty <= set(heap.data)


def test_byte_bound_uses_given_size_and_estimate():
    heap = HeapLevel(HeapConfig(policy="lru", max_entries=None, max_bytes=1000))
    assert heap.insert(b"a", b"x", dirty=False, size=600) == []
    victims = heap.insert(b"b", b"y", dirty=True, size=600)
    assert [(k, d) for k, _, d in victims] == [(b"a", False)]
    # an entry heavier than the whole bound is not admitted: it comes straight back
    victims = heap.insert(b"c", b"z", dirty=True, size=5000)
    assert [(k, d) for k, _, d in victims] == [(b"c", True)]
    assert set(heap.data) == {b"b"}
    big = list(range(1000))
    assert estimate_size(big) > estimate_size(list(range(10)))
    assert heap.weigh(big, None) == estimate_size(big)


def test_both_bounds_enforce_count_and_bytes():
    heap = HeapLevel(HeapConfig(policy="lru", max_entries=2, max_bytes=10_000))
    out = []
    for i in range(5):
        out += heap.insert(b"k%d" % i, i, dirty=False, size=10)
    assert len(heap) == 2 and len(out) == 3
    assert set(heap.data) == {b"k3", b"k4"}          # LRU picked the oldest
    out = heap.insert(b"big", 0, dirty=False, size=9_995)
    assert heap.tracked_weight <= 10_000 and len(heap) <= 2


def test_replace_updates_weight_and_dirty():
    heap = HeapLevel(HeapConfig(policy="lru", max_entries=None, max_bytes=100))
    heap.insert(b"a", 1, dirty=True, size=50)
    heap.insert(b"a", 2, dirty=False, size=30)
    assert heap.tracked_weight == 30 and b"a" not in heap.dirty and heap.data[b"a"] == 2
    assert heap.remove(b"a") == (2, False)
    assert heap.remove(b"a") is None and heap.tracked_weight == 0


def test_pinned_entries_stay_outside_the_policy():
    heap = HeapLevel(HeapConfig(policy="lru", max_entries=1, max_bytes=None))
    heap.insert(b"a", 1, dirty=True)
    (victim,) = heap.insert(b"b", 2, dirty=True)
    heap.pin(*victim)
    assert b"a" in heap and b"a" in heap.pinned and b"a" not in heap.policy
    assert heap.insert(b"c", 3, dirty=False)[0][0] == b"b"   # pinned a is never a victim
    heap.insert(b"a", 4, dirty=True)                          # replacing unpins
    assert b"a" not in heap.pinned and b"a" in heap.policy


def test_policy_resolution():
    assert resolve_policy("lru") == (get_policy("lru"), False)
    if "wtinylfu" not in available_policies():
        cls, fallback = resolve_policy("wtinylfu")
        assert cls is get_policy("lru") and fallback
    HeapLevel(HeapConfig())  # the default config always builds
    with pytest.raises(ConfigError) as info:
        HeapLevel(HeapConfig(policy="nope", max_entries=3))
    assert info.value.field == "heap.policy" and "lru" in str(info.value)
    with pytest.raises(ConfigError) as info:
        HeapLevel(HeapConfig(policy="lru", max_entries=3, policy_options={"bogus": 1}))
    assert "bogus" in str(info.value)
