"""Regression tests for session 9's review of the policies' general paths and the sketch's API."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_clock_never_makes_a_none_newcomer_its_victim():
    # None stood for "no newcomer to protect", so a newcomer whose key is None was not
    # protected: with every resident entry referenced, inserting None evicted None itself.
    policy = get_policy("clock")(3)
    for k in "abc":
        policy.insert(k)
        policy.access(k)
    victims = policy.insert(None)
    assert victims and None not in victims and None in policy and len(policy) == 3


@pytest.mark.parametrize("others", [[], [(b"ns\x1fa", 1)]])
def test_dedup_resize_evicts_a_none_key_too(others):
    # resize passed None as "no newcomer to protect": a None key alone in its namespace was
    # skipped, and resize(5) returned no victim with 8 of weight held (capacity exceeded).
    policy = get_policy("dedup")(10)
    for key, weight in others:
        policy.insert(key, weight)
    policy.insert(None, 8)
    victims = policy.resize(5)
    assert None in victims and None not in policy
    assert policy.total_weight <= 5


def test_dedup_resize_evicts_in_lru_order_with_a_none_key():
    # the None key was also moved to the MRU end at a resize, as if it were a newcomer
    policy = get_policy("dedup")(10)
    for key in (None, "a", "b", "c"):
        policy.insert(key, 2)
    assert policy.resize(6) == [None]


def test_slidem_takes_any_int_key():
    # Integer keys are block positions: float(key) raised OverflowError for an int past
    # ~1e308, and above 2**53 neighbouring blocks shared one position (the newest-written rule
    # then followed insertion order instead of the block order).
    policy = get_policy("slidem")(2)
    assert policy.insert(10**400) == [] and 10**400 in policy
    base = 2**53
    policy = get_policy("slidem")(2)
    for key in (base + 2, base + 1):
        policy.insert(key)
    assert policy.insert(base) == [base + 2]          # the farthest position leaves


@pytest.mark.parametrize("batch, resident", [([0, 1, 2], [2]), ([0, 1], [1])])
def test_wtinylfu_insert_many_names_each_key_that_left_once(batch, resident):
    # A key resident before the batch was pushed out by a batch key, came back as a key of the
    # batch, and left again (listed twice: [1, 0, 1]) or stayed (listed although resident),
    # so a caller deleting what the batch returned failed, or dropped a resident value.
    policy = get_policy("wtinylfu")(1)
    policy.insert(1)
    victims = policy.insert_many(batch)
    assert sorted(victims) == sorted(set(victims))
    assert not any(v in policy for v in victims)
    assert sorted(policy.keys()) == resident
    assert sorted(victims + resident) == sorted(set(batch) | {1})


@pytest.mark.parametrize("capacity", [64, 1 << 16])  # the dense and the sparse update
def test_sketch_counts_must_match_the_keys_and_not_be_negative(capacity):
    # One count for three hashes was broadcast over all three and written to the table
    # before an IndexError; a negative count made the key's counters saturate (15), and over
    # a large table also set the other counter sharing each byte to 15.
    from mlcache.sketch import FrequencySketch

    sketch = FrequencySketch(capacity, seed=1)
    sketch.increment_hashes([7], [3])
    table = bytes(sketch.table)
    for hashes, counts in (([1, 2, 3], [2]), ([1, 2], [2, 3, 4]), ([12345], [-1]),
                           ([5, 6], [1, -2])):
        with pytest.raises(ValueError, match="count"):
            sketch.increment_hashes(hashes, counts)
        with pytest.raises(ValueError, match="count"):
            sketch.increment_mixed([sketch.mix(h) for h in hashes], counts)
    assert bytes(sketch.table) == table and sketch.additions == 3
    assert sketch.frequency_of_hash(12345) == 0 and sketch.frequency_of_hash(7) == 3
    sketch.increment_hashes([1, 2], [0, 2])          # zero counts are fine
    assert sketch.frequency_of_hash(2) == 2


@pytest.mark.parametrize("factor", [0, -1, 1.5, True, "10"])
def test_sketch_sample_factor_must_be_a_positive_integer(factor):
    # 0 or less halved every counter at every increment (a sketch that never counts); 1.5 gave
    # a float sample size. Named like the capacity.
    from mlcache.errors import ConfigError
    from mlcache.sketch import FrequencySketch

    with pytest.raises(ConfigError, match="sample_factor"):
        FrequencySketch(16, sample_factor=factor)


@pytest.mark.parametrize("option, value", [("expected_entries", 100.5), ("expected_entries", "100"),
                                           ("expected_entries", -5), ("seed", "abc"),
                                           ("seed", 1.5)])
def test_wtinylfu_names_a_bad_expected_entries_or_seed(option, value):
    # expected_entries=100.5 was "sketch.capacity: must be a positive integer", a field the
    # caller never set; "100" a bare TypeError from a multiplication; -5 was taken as 16;
    # seed="abc" int()'s ValueError from inside the sketch.
    from mlcache.errors import ConfigError

    with pytest.raises(ConfigError, match=option):
        get_policy("wtinylfu")(1000, **{option: value})


def test_wtinylfu_still_takes_its_default_and_integer_options():
    for options in ({}, {"expected_entries": 0}, {"expected_entries": 64}, {"seed": 7},
                    {"seed": -3}):
        policy = get_policy("wtinylfu")(100, **options)
        assert policy.insert(1) == [] and 1 in policy


@pytest.mark.parametrize("name", GENERAL + ["tac"])
def test_a_policy_is_deep_copied_or_refused_never_shallow(name):
    # copy.copy shared the policy's dicts but not its total: an insert into the copy left the
    # original with 4 keys and a total_weight of 5.
    import copy
    import pickle

    policy = _filled(name, capacity=5, n=5)
    with pytest.raises(TypeError, match="copy"):
        copy.copy(policy)
    for twin in (copy.deepcopy(policy), pickle.loads(pickle.dumps(policy))):
        twin.insert("new", 2)
        assert policy.total_weight == len(policy) == 5 and "new" not in policy
        assert twin.total_weight <= 5
        assert "new" in twin or name == "slidem"     # (SlideM evicts the newest position)


def test_register_policy_requires_the_protocols_name(tmp_path):
    # A class with every method register_policy asked for but no `name` was registered, and
    # the manager then failed to build (AttributeError: no attribute 'name').
    from collections import OrderedDict

    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    from mlcache.errors import ConfigError
    from mlcache.policies import register_policy

    class Fifo:
        def __init__(self, capacity, **options):
            self.capacity, self.total_weight, self._order = capacity, 0, OrderedDict()

        def __len__(self):
            return len(self._order)

        def __contains__(self, key):
            return key in self._order

        def insert(self, key, weight=1, ts=None):
            self.total_weight += weight - self._order.pop(key, 0)
            self._order[key] = weight
            return self.resize(self.capacity)

        def access(self, key, ts=None):
            pass

        def remove(self, key):
            self.total_weight -= self._order.pop(key, 0)

        def resize(self, capacity):
            self.capacity, victims = capacity, []
            while self.total_weight > capacity:
                key, weight = self._order.popitem(last=False)
                self.total_weight -= weight
                victims.append(key)
            return victims

    with pytest.raises(ConfigError, match="name"):
        register_policy("fifo-s9-nameless", Fifo)
    Fifo.name = "fifo-s9"
    register_policy("fifo-s9", Fifo)
    config = CacheConfig(heap=HeapConfig(policy="fifo-s9", max_entries=10, max_bytes=None),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as cache:
        for i in range(50):
            cache.put(i, i * i)
        assert cache.get(3) == 9
        assert cache.stats()["levels"]["heap"]["policy"] == "fifo-s9"


_KEY = st.one_of(st.integers(0, 25), st.sampled_from([None, "a", b"ns\x1fk", (1, 2)]))
_OP = st.one_of(
    st.tuples(st.just("insert"), _KEY, st.sampled_from([1, 1, 1, 0, 2, 3, 0.5, "cap", "over"])),
    st.tuples(st.just("access"), _KEY, st.just(0)),
    st.tuples(st.just("remove"), _KEY, st.just(0)),
    st.tuples(st.just("resize"), st.just(0), st.integers(1, 30)),
    st.tuples(st.just("many"), st.lists(_KEY, max_size=6), st.just(0)))


@pytest.mark.parametrize("name", GENERAL)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OP, max_size=150), capacity=st.integers(1, 20))
def test_random_operations_against_a_model(name, ops, capacity):
    """Unit and heavy weights mixed, re-inserts with other weights, None and odd keys, resizes,
    batches: after every step the policy holds exactly the model's keys and weights, within
    its capacity; every victim was resident and is gone; LRU evicts in the reference order."""
    from collections import OrderedDict

    policy = get_policy(name)(capacity)
    model: dict = {}
    lru: OrderedDict = OrderedDict()   # the reference LRU order (checked for "lru")

    def take(victims, before, allowed=()):
        assert len(victims) == len(set(victims)), victims
        for v in victims:
            assert v in before or v in allowed, f"victim {v!r} was not resident"
            assert v not in policy
            model.pop(v, None)
            lru.pop(v, None)

    for op, key, arg in ops:
        before = dict(model)
        if op == "insert":
            weight = {"cap": policy.capacity, "over": policy.capacity + 1}.get(arg, arg)
            victims = policy.insert(key, weight)
            if weight <= policy.capacity:
                model[key] = weight
                lru[key] = weight
                lru.move_to_end(key)
            if name == "lru":
                expected, total = [], sum(lru.values())
                while total > policy.capacity:
                    k, w = lru.popitem(last=False)
                    total -= w
                    expected.append(k)
                if weight > policy.capacity:
                    expected = [key]
                assert victims == expected
            take(victims, before, allowed=(key,))
        elif op == "access":
            policy.access(key)
            if key in lru:
                lru.move_to_end(key)
        elif op == "remove":
            policy.remove(key)
            model.pop(key, None)
            lru.pop(key, None)
        elif op == "resize":
            victims = policy.resize(arg)
            if name == "lru":
                expected, total = [], sum(lru.values())
                while total > arg:
                    k, w = next(iter(lru.items()))
                    total -= w
                    expected.append(k)
                    del lru[k]
                assert victims == expected
            take(victims, before)
        elif name == "wtinylfu":   # a batch: insert(k, 1) each, the keys that left once
            keys = list(dict.fromkeys(key))
            victims = policy.insert_many(keys)
            for k in keys:
                model[k] = 1
            take(victims, before, allowed=keys)
        assert len(policy) == len(model)
        assert all(k in policy for k in model)
        assert math.isclose(policy.total_weight, sum(model.values()))
        assert policy.total_weight <= policy.capacity
        if name == "wtinylfu" and model:
            assert policy.next_victim() in model
            assert all(policy.weight(k) == w for k, w in model.items())


def test_dedup_forgets_a_namespace_with_nothing_left():
    # Every namespace ever written kept its (empty) record in the policy: memory grew with
    # the namespaces seen, and an insert that evicts from the other namespaces scanned them
    # all (50,000 one-key namespaces, half removed: 13 s of inserts).
    policy = get_policy("dedup")(10)
    for i in range(2000):
        key = b"ns%d\x1fk" % i
        policy.insert(key, 1)
        if i % 2:
            policy.remove(key)
    assert len(policy) == len(policy._spaces) == 9     # one key per namespace, the last removed
    policy.mark_dirty(b"t\x1fgone")              # a tombstone keeps its namespace ...
    assert policy.dirty_namespaces() == [b"t\x1f"] and policy.is_dirty(b"t\x1fgone")
    assert policy.take_dirty(b"t\x1f") == [b"t\x1fgone"]
    assert b"t\x1f" not in policy._spaces        # ... until it is taken
    policy.restore_dirty(b"t\x1f", [b"t\x1fgone"])   # a failed flush puts it back
    assert policy.take_dirty(b"t\x1f") == [b"t\x1fgone"]
    policy.restore_dirty(b"u\x1f", [])
    assert len(policy._spaces) == 9
    policy.resize(4)
    assert len(policy) == len(policy._spaces) == 4


@pytest.mark.parametrize("capacity", [64, 1 << 16])  # the dense and the sparse update
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copied_sketch_keeps_counting(capacity, how):
    # The sketch's numpy view of its table became an array of its own in a copy: increments
    # and halvings went there while estimates read the table, so the copy never counted.
    import copy
    import pickle

    from mlcache.sketch import FrequencySketch

    def dup(x):
        return pickle.loads(pickle.dumps(x)) if how == "pickle" else copy.deepcopy(x)

    sketch = FrequencySketch(capacity, seed=1)
    sketch.increment_counts({"a": 2})
    twin = dup(sketch)
    twin.increment_counts({"a": 3, "b": 1})
    twin.increment_hashes([7], [4])
    assert (twin.frequency("a"), twin.frequency("b"), twin.frequency_of_hash(7)) == (5, 1, 4)
    assert sketch.frequency("a") == 2 and sketch.frequency("b") == 0   # the original apart
    twin.reset()
    assert twin.frequency("a") == 2


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copied_wtinylfu_policy_decides_as_the_original(how):
    # With its sketch dead, a copied W-TinyLFU admitted on buffered counts only, and a deep
    # copy logged its protected hits into the original's hit log (a builtin bound method is
    # not copied): the copy and the original, fed the same requests, evicted different keys.
    import copy
    import pickle
    import random

    rng = random.Random(5)
    keys = [min(rng.randrange(3000), rng.randrange(3000)) for _ in range(30_000)]
    original = get_policy("wtinylfu")(200)

    def play(policy, part):
        out = []
        for key in part:
            if key in policy:
                policy.access(key)
            else:
                out.extend(policy.insert(key))
        return out

    play(original, keys[:10_000])
    twin = pickle.loads(pickle.dumps(original)) if how == "pickle" else copy.deepcopy(original)
    assert play(twin, keys[10_000:]) == play(original, keys[10_000:])
    assert twin.frequency(keys[-1]) == original.frequency(keys[-1])


@pytest.mark.parametrize("seq", [None, "5", float("nan"), 2.5, True])
def test_slidem_refuses_a_cursor_that_is_not_a_block_number(seq):
    # None or "5" was kept among the cursors before sorting them failed, so every later
    # set_cursor of any window raised too; NaN was accepted and made the distances garbage.
    policy = get_policy("slidem")(3)
    for key in range(3):
        policy.insert(key)
    policy.set_cursor("w1", 1)
    with pytest.raises(TypeError, match="seq"):
        policy.set_cursor("w2", seq)
    policy.set_cursor("w1", 2)                      # the other windows still work
    assert policy.distance(2) == 0 and policy.distance(0) == math.inf
    assert policy.insert(5) == [1]        # 0 and 1: no window reads them again; the newer goes
