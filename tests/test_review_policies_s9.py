"""Regression tests for session 9's review of the policies' general paths and the sketch's API."""
from __future__ import annotations

import math

import pytest

from mlcache.policies import get_policy

# The policies of this review (TAC and Belady were reviewed in session 8).
GENERAL = ["lru", "clock", "dedup", "slidem", "wtinylfu"]


def _filled(name, capacity=10, n=5):
    policy = get_policy(name)(capacity)
    for k in range(n):
        assert policy.insert(k, 1) == []
    return policy


@pytest.mark.parametrize("name", GENERAL)
@pytest.mark.parametrize("weight, error", [(-1, ValueError), (-0.5, ValueError),
                                           (float("nan"), ValueError), (float("-inf"), ValueError),
                                           ("3", TypeError), (None, TypeError)])
@pytest.mark.parametrize("resident", [False, True])
def test_a_bad_weight_is_refused_and_changes_nothing(name, weight, error, resident):
    # A NaN weight made total_weight NaN, which is never above the capacity: from then on
    # nothing was evicted (31 entries in a policy of capacity 10). A negative one let the
    # policy hold more than its capacity; a str one left SlideM tracking a key whose weight
    # was not counted.
    policy = _filled(name)
    key = 2 if resident else "new"
    before = (len(policy), policy.total_weight, key in policy)
    with pytest.raises(error, match="weight"):
        policy.insert(key, weight)
    assert (len(policy), policy.total_weight, key in policy) == before
    for k in range(100, 130):
        policy.insert(k, 1)
    assert policy.total_weight == len(policy) <= 10


@pytest.mark.parametrize("name", GENERAL)
@pytest.mark.parametrize("weight", [0, 0.5, 2.5, 10])
def test_zero_and_float_weights_still_count(name, weight):
    # sizes from getsizeof may be 0 or floats (the cachetools drop-ins pass them through)
    policy = _filled(name)
    victims = policy.insert("x", weight)
    assert policy.total_weight <= 10
    kept = weight if "x" in policy else 0
    assert math.isclose(policy.total_weight, 5 - len(set(victims) - {"x"}) + kept)
    assert ("x" in policy) != ("x" in victims)


@pytest.mark.parametrize("name", GENERAL)
@pytest.mark.parametrize("resident", [False, True])
def test_an_infinite_weight_is_refused_and_the_total_stays_finite(name, resident):
    # SlideM counted an infinite weight and took it off again (inf - inf: a NaN total), and
    # W-TinyLFU did so for a resident key given an infinite weight: no bound held after it.
    policy = _filled(name)
    key = 2 if resident else "big"
    assert policy.insert(key, float("inf")) == [key]
    assert key not in policy
    assert policy.total_weight == len(policy) == (4 if resident else 5)
    for k in range(100, 130):
        policy.insert(k, 1)
    assert policy.total_weight == len(policy) <= 10
