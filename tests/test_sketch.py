"""FrequencySketch: count-min with 4-bit saturating counters, batched numpy increments."""
from __future__ import annotations

import collections
import random

import pytest

from mlcache.errors import ConfigError
from mlcache.sketch import FrequencySketch


def test_never_underestimates_and_saturates_at_15():
    s = FrequencySketch(512, seed=7)
    rng = random.Random(1)
    keys = [rng.randrange(5000) for _ in range(3000)] + ["a", "b", ("t", 1), b"bytes"]
    counts = collections.Counter(keys)
    for i in range(0, len(keys), 100):  # batches, with repeated keys inside a batch
        s.increment_many(keys[i:i + 100])
    assert s.resets == 0
    for key, n in counts.items():
        assert s.frequency(key) >= min(15, n)
    s.increment_hashes([hash("hot")], [40])
    assert s.frequency("hot") == 15


def test_counts_with_weights_equal_repeated_increments():
    a, b = FrequencySketch(256, seed=3), FrequencySketch(256, seed=3)
    a.increment_hashes([hash(k) for k in "xyz"], [3, 1, 2])
    b.increment_many(list("xxxyzz"))
    assert a.table == b.table
    assert [a.frequency(k) for k in "xyz"] == [3, 1, 2]


def test_estimates_are_accurate_for_a_skewed_stream():
    s = FrequencySketch(1000, seed=11)
    rng = random.Random(5)
    stream = [int(rng.paretovariate(1.1)) for _ in range(5000)]
    s.increment_many(stream)
    truth = collections.Counter(stream)
    errors = [s.frequency(k) - min(15, n) for k, n in truth.items()]
    assert min(errors) >= 0
    assert sum(e == 0 for e in errors) / len(errors) > 0.9  # count-min rarely collides here


def test_halving_after_ten_times_capacity_increments():
    s = FrequencySketch(64, seed=1)
    assert s.sample_size == 640
    key = 10**9 + 7  # an int: its hash, and so any collision below, is the same every run
    s.increment_hashes([key], [12])
    assert s.frequency(key) == 12
    rng = random.Random(2)
    s.increment_many([rng.random() for _ in range(700)])  # distinct keys: 700 additions
    assert s.resets == 1
    assert s.frequency(key) == 6
    assert s.additions < s.sample_size


def test_saturated_increments_do_not_hasten_aging():
    s = FrequencySketch(64, seed=1)
    s.increment_hashes([hash("hot")], [15])
    additions = s.additions
    s.increment_hashes([hash("hot")], [5])  # all of hot's counters are already at 15
    assert s.additions == additions


def test_about_one_word_per_entry_and_four_rows():
    s = FrequencySketch(1000)
    assert s.depth == 4
    assert len(s.table) * 8 / 64 == pytest.approx(1024 * 1, rel=0.01)  # 1024 words for 1000
    assert s.width == 4 * 1024


def test_process_local_seed_differs_between_sketches():
    a, b = FrequencySketch(128), FrequencySketch(128)
    assert a._seed != b._seed


def test_grow_and_clear():
    s = FrequencySketch(16, seed=1)
    s.increment_many(["a"] * 3)
    s.ensure_capacity(8)
    assert s.frequency("a") == 3  # no shrink
    s.ensure_capacity(100)
    assert s.capacity >= 100 and s.frequency("a") == 0
    s.increment_many(["a"])
    s.clear()
    assert s.frequency("a") == 0


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_bad_capacity(capacity):
    with pytest.raises(ConfigError):
        FrequencySketch(capacity)
