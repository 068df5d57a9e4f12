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
    assert s.frequency_of_hash(hash("hot")) == 15


def test_counts_with_weights_equal_repeated_increments():
    a, b = FrequencySketch(256, seed=3), FrequencySketch(256, seed=3)
    a.increment_hashes([hash(k) for k in "xyz"], [3, 1, 2])
    b.increment_hashes([hash(k) for k in "xxxyzz"])
    assert a.table == b.table
    assert [a.frequency_of_hash(hash(k)) for k in "xyz"] == [3, 1, 2]


@pytest.mark.parametrize("keys", [["x", "y", "z"], [7, 2**40, -1], [("t", 1), b"b", "s"]])
def test_every_key_api_counts_what_frequency_reads(keys):
    """increment_counts mixed the key itself while frequency mixed the key's hash: for most
    str keys (hash(hash(x)) != hash(x)) a count made by increment_counts read back as 0."""
    by_counts, by_many, one_by_one = (FrequencySketch(256, seed=3) for _ in range(3))
    by_counts.increment_counts(dict(zip(keys, [3, 1, 2])))
    by_many.increment_many([keys[0]] * 3 + [keys[1]] + [keys[2]] * 2)
    for key in [keys[0]] * 3 + [keys[1]] + [keys[2]] * 2:
        one_by_one.increment(key)
    assert by_counts.table == by_many.table == one_by_one.table
    for s in (by_counts, by_many, one_by_one):
        assert [s.frequency(k) for k in keys] == [3, 1, 2]
        assert [s.frequency_of_mixed(s.mix(k)) for k in keys] == [3, 1, 2]


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


@pytest.mark.parametrize("capacity", [64, 1000, 50_000])  # dense (two sizes) and sparse passes
def test_int_keys_drain_like_any_key(capacity, monkeypatch):
    # Drains of plain int keys are read from the dict's marshal bytes: the same counters and
    # additions as hashing key by key, for the ints that hash specially (-1) or sit at the
    # edges of 32 bits, counts past 15 and past uint16, and a halving on the way.
    class Red(int):  # an int whose hash is not its value's: must not count as its value
        def __hash__(self):
            return hash("red")

    import mlcache.sketch as sketch_module
    from mlcache.sketch import _MARSHAL_INTS, _int_items

    rng = random.Random(capacity)
    ints = {k: rng.choice([1, 1, 2, 15, 16, 300, 70_000]) for k in
            [0, 1, -1, -2, 2**31 - 1, -(2**31)] + rng.sample(range(-(2**31), 2**31), 3 * capacity)}
    batches = [
        ints,  # all ints of 32 bits: the marshal read
        {rng.randrange(4 * capacity): 1 for _ in range(capacity)},  # the same
        {-1: 20, 3: 1},  # the same
        {**ints, 2**31: 2, -(2**31) - 1: 3, 2**61 - 1: 4, -(2**63): 5},  # larger ints
        {7: 3, Red(1): 5, True: 2, 2.0: 1, "s": 4, (1, 2): 1},  # int first, then others
    ]
    if _MARSHAL_INTS:
        assert [_int_items(b, len(b)) is not None for b in batches] == [1, 1, 1, 0, 0]
    fast = FrequencySketch(capacity, seed=5, sample_factor=1)
    slow = FrequencySketch(capacity, seed=5, sample_factor=1)
    for batch in batches:
        fast.increment_counts(dict(batch))
        with monkeypatch.context() as patch:  # the hash-per-key path
            patch.setattr(sketch_module, "_MARSHAL_INTS", False)
            slow.increment_counts(dict(batch))
        assert (bytes(fast.table), fast.additions, fast.resets) == (
            bytes(slow.table), slow.additions, slow.resets)
    assert fast.resets > 0
    fresh = FrequencySketch(capacity, seed=5)
    fresh.increment_counts({3: 1, Red(1): 6})
    assert fresh.frequency_of_mixed(fresh.mix(Red(1))) >= 6  # counted under its own hash...
    assert fresh.frequency_of_mixed(fresh.mix(1)) == 0  # ...not its value's


def test_int_items_reads_only_plain_ints_of_32_bits():
    from mlcache.sketch import _MARSHAL_INTS, _int_items

    # On CPython 3.11 (what mlcache runs on) the drain's int path must be on: a format check
    # that silently turned it off would leave every drain on the slow path.
    assert _MARSHAL_INTS, "the drain's marshal path was turned off by its import-time check"
    d = {5: 1, -1: 2, -(2**31): 300, 2**31 - 1: 2**31 - 1}
    hashes, counts = _int_items(d, len(d))
    assert hashes.tolist() == [hash(k) for k in d] == [5, -2, -(2**31), 2**31 - 1]
    assert counts.tolist() == list(d.values())

    class Int(int):
        def __hash__(self):
            return 12345

    for other in ({Int(5): 1}, {5: True}, {5: 1, False: 1}, {2**31: 1}, {5: 2**31}, {5: 1.0},
                  {5: 1, "5": 1}, {5: 1, b"5": 1}, {5: 1, None: 1}, collections.Counter([5])):
        assert _int_items(other, len(other)) is None, other


def test_drain_without_the_vectorised_tuple_hash(monkeypatch):
    # Where numpy cannot reproduce the interpreter's tuple hash, drains build one tuple per key
    # (and read no marshal bytes): the same table.
    import mlcache.sketch as sketch_module

    rng = random.Random(8)
    batch = {rng.randrange(10**6): rng.randrange(1, 40) for _ in range(500)}
    batch.update({"a": 2, ("t", 1): 3, -1: 4})
    want = FrequencySketch(100, seed=2)
    want.increment_counts(dict(batch))
    monkeypatch.setattr(sketch_module, "_NP_TUPLE_HASH", False)
    monkeypatch.setattr(sketch_module, "_MARSHAL_INTS", False)
    got = FrequencySketch(100, seed=2)
    got.increment_counts(dict(batch))
    assert bytes(got.table) == bytes(want.table) and got.additions == want.additions


@pytest.mark.parametrize("filler", [0, 40])  # 2 keys: the sparse pass; 42: the dense one
def test_additions_skip_keys_whose_counters_are_all_saturated(filler):
    # A key adds to the sample only if one of its counters is below 15 before the batch (the
    # dense pass skips that test when no counter at all is saturated).
    s = FrequencySketch(16, seed=4, sample_factor=10**6)
    s.increment_counts({1: 3, 2: 20, **{k: 1 for k in range(10**6, 10**6 + filler)}})
    assert s.additions == 3 + 15 + filler  # nothing was saturated
    assert s.frequency_of_mixed(s.mix(2)) == 15
    cold = [k for k in range(2000, 3000) if s.frequency_of_mixed(s.mix(k)) == 0][:filler + 2]
    s.increment_counts({2: 7, **{k: 1 for k in cold}})  # 2 is saturated: only the cold ones
    assert len(cold) == filler + 2 and s.additions == 3 + 15 + filler + len(cold)


@pytest.mark.parametrize("capacity", [16, 300, 4096])
def test_add_hash_counts_as_the_batched_path_and_returns_the_estimate(capacity):
    """add_hash (one use now, in Python: the hot-key filter's per-hint path) writes the same
    counters as increment_hashes, saturating at 15, and returns the estimate after the use."""
    rng = random.Random(capacity)
    hashes = [hash(("k", rng.randrange(capacity * 3))) for _ in range(capacity * 4)]
    hashes += [hash("hot")] * 40
    one, batch = FrequencySketch(capacity, seed=5), FrequencySketch(capacity, seed=5)
    one.sample_size = batch.sample_size = 10 ** 9     # compare the counters, not the aging
    for h in hashes:
        assert one.add_hash(h) == one.frequency_of_hash(h)
    batch.increment_hashes(hashes)
    assert one.table == batch.table
    assert one.frequency_of_hash(hash("hot")) == 15
    assert 0 < one.additions <= len(hashes)


def test_add_hash_ages_the_sketch_like_the_batched_path():
    s, twin = FrequencySketch(64, seed=1), FrequencySketch(64, seed=1)
    twin.sample_size = 10 ** 9
    hashes = [hash((7, i % 300)) for i in range(s.sample_size)]
    for h in hashes:
        s.add_hash(h)
        twin.add_hash(h)
        if s.resets:
            break
    assert s.resets == 1 and s.additions == s.sample_size // 2
    twin.reset()                          # the same counters, halved once
    assert s.table == twin.table
    saturated = FrequencySketch(64, seed=1)
    for _ in range(30):
        saturated.add_hash(12345)
    assert saturated.additions == 15      # a use whose counters are all at 15 is no addition
    assert saturated.frequency_of_hash(12345) == 15
