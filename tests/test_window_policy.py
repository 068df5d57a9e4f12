"""The SlideM policy on its own: the generic Policy contract and the window rules."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlcache.errors import ConfigError
from mlcache.policies import get_policy
from mlcache.policies.base import Policy
from mlcache.policies.slidem import SlideMPolicy


def test_registered_and_a_policy():
    assert get_policy("slidem") is SlideMPolicy
    assert isinstance(SlideMPolicy(4), Policy)
    with pytest.raises(ConfigError):
        SlideMPolicy(0)
    with pytest.raises(ConfigError):
        SlideMPolicy(4, lookahead=3)


def test_plain_sequence_numbers_evict_the_most_recently_written():
    p = SlideMPolicy(3)
    assert [p.insert(k) for k in (0, 1, 2)] == [[], [], []]
    assert p.insert(3) == [3]  # the newest block is the one needed farthest away
    p.remove(0)
    assert p.insert(5) == []
    assert p.insert(4) == [5]
    assert sorted(p.keys()) == [1, 2, 4]


def test_other_keys_use_their_insertion_order():
    p = SlideMPolicy(2)
    p.insert("a")
    p.insert(("b", 1))
    assert p.insert(b"c") == [b"c"]
    assert "a" in p and ("b", 1) in p


def test_unknown_keys_weights_and_resize():
    p = SlideMPolicy(5)
    p.access("nope")
    p.remove("nope")
    assert p.insert("big", weight=6) == ["big"]
    assert len(p) == 0 and p.total_weight == 0
    p.insert(1, weight=2)
    p.insert(2, weight=2)
    assert p.insert(1, weight=4) == [2]  # re-insert updates the weight
    assert p.total_weight == 4
    assert p.insert(0, weight=1) == []
    assert p.resize(3) == [1]
    assert p.total_weight == 1 and list(p.keys()) == [0]


def test_shared_victim_maximises_the_distance_to_the_nearest_ancient_block():
    p = SlideMPolicy(4)
    p.set_cursor("w1", 10)
    p.set_cursor("w2", 20)
    for k in (10, 12, 21, 29):
        p.insert(k)
    assert p.distance(12) == 2 and p.distance(21) == 1 and p.distance(29) == 9
    assert p.insert(15) == [29]
    p.set_cursor("w2", 22)  # w2 moved on: 21 is now behind every window... but w1 still needs it
    assert p.distance(21) == 11
    p.set_cursor("w1", 12)
    p.set_cursor("w2", 30)
    assert p.distance(10) == math.inf  # no window will read it again: first to go
    assert p.insert(31) == [10]
    assert sorted(p.keys()) == [12, 15, 21, 31]
    p.drop_cursor("w1")
    assert p.prefetch_candidates(newest=40) == [30]
    p.insert(30)
    assert p.prefetch_candidates(newest=40) == []
    p.set_cursor("w3", 35)
    assert p.prefetch_candidates(newest=40) == []  # several windows: no prefetch


@given(st.lists(st.tuples(st.sampled_from(["insert", "access", "remove"]), st.integers(0, 30),
                          st.integers(1, 3)), max_size=200),
       st.integers(1, 10), st.booleans())
def test_capacity_respected_and_victims_were_resident(ops, capacity, cursors):
    p = SlideMPolicy(capacity)
    model: dict[int, int] = {}
    if cursors:
        p.set_cursor(0, 5)
        p.set_cursor(1, 15)
    for op, key, weight in ops:
        if op == "insert":
            victims = p.insert(key, weight)
            model[key] = weight
            for v in victims:
                assert v in model
                del model[v]
        elif op == "access":
            p.access(key)
        else:
            p.remove(key)
            model.pop(key, None)
        assert p.total_weight == sum(model.values()) <= capacity
        assert set(p.keys()) == set(model) and len(p) == len(model)
