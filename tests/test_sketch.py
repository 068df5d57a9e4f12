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


@pytest.mark.parametrize("capacity,batch", [(64, 300), (1000, 2000), (50_000, 200)])
def test_matches_a_plain_count_min_of_saturating_counters(capacity, batch):
    # The reference: row r of key x counts at (m + r * b) mod width, m = hash((x, seed)),
    # b = (m >> 32) | 1, each counter saturating at 15; the estimate is the minimum of the 4.
    # The table's physical layout (two rows per byte, see _allocate) must not show; the small
    # table takes the dense numpy pass, the large one (50,000) the sparse one.
    s = FrequencySketch(capacity, seed=9, sample_factor=10**6)  # no halving in this test
    ref = [[0] * s.width for _ in range(4)]
    rng = random.Random(capacity)
    keys = [rng.randrange(4 * capacity) for _ in range(3 * batch)] + ["k", ("t", 2)] * 20
    for start in range(0, len(keys), batch):
        chunk = keys[start:start + batch]
        counts = collections.Counter(chunk)
        s.increment_counts(dict(counts))
        for x, n in counts.items():
            m = hash((x, s._seed))
            b = (m >> 32) | 1
            for r in range(4):
                i = (m + r * b) & s.mask
                ref[r][i] = min(15, ref[r][i] + n)
    for x in set(keys) | {-1, "absent"}:
        m = hash((x, s._seed))
        b = (m >> 32) | 1
        want = min(ref[r][(m + r * b) & s.mask] for r in range(4))
        assert s.frequency_of_mixed(m) == want


def test_vectorised_mixing_is_the_tuple_hash():
    # The drain mixes keys' own hashes with the seed in numpy; it must give hash((x, seed)),
    # the value estimates use, or counts would land on other counters.
    import numpy as np

    from mlcache.sketch import _NP_TUPLE_HASH, _tuple_hash2

    rng = random.Random(4)
    xs = [rng.getrandbits(64) - 2**63 for _ in range(2000)] + ["a", b"b", ("c", 1), 2.5, -1]
    for seed in (0, 7, 0x2545F4914F6CDD1D, FrequencySketch(8)._seed):
        if _NP_TUPLE_HASH:
            h = np.array([hash(x) for x in xs], dtype=np.int64)
            assert _tuple_hash2(h, seed).tolist() == [hash((x, seed)) for x in xs]
        s = FrequencySketch(64, seed=seed)
        s.increment_counts({x: 2 for x in xs[-5:]})
        assert all(s.frequency_of_mixed(hash((x, seed))) >= 2 for x in xs[-5:])


def test_batched_drain_counts_as_key_by_key():
    # A batch gives the same counters as counting key by key, also for a batch past the uint16
    # scratch (6,000 keys of count 15 on a small table: the dense pass then adds in int32).
    rng = random.Random(6)
    for n, count in ((300, 3), (6000, 15)):
        keys = [rng.getrandbits(40) for _ in range(n)] + ["k", ("t", 1)]
        s = FrequencySketch(64, seed=3, sample_factor=10**6)
        s.increment_counts({k: count for k in keys})
        runs = [(bytes(s.table), s.additions)]
        one = FrequencySketch(64, seed=3, sample_factor=10**6)
        for k in keys:
            one.increment_counts({k: count})
        assert bytes(one.table) == runs[0][0]
