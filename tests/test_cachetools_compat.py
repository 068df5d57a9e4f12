"""TinyLFUCache and TACache honour the cachetools.Cache contract and work with @cached."""
from __future__ import annotations

import random

import cachetools
import pytest

from mlcache import TACache, TinyLFUCache

CLASSES = [TinyLFUCache, TACache]


@pytest.mark.parametrize("cls", CLASSES)
def test_is_a_cachetools_cache_usable_with_cached(cls):
    cache = cls(maxsize=32)
    assert isinstance(cache, cachetools.Cache)
    calls = []

    @cachetools.cached(cache)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(i % 10) for i in range(50)] == [(i % 10) ** 2 for i in range(50)]
    assert sorted(calls) == list(range(10))  # each computed once: everything fits
    assert len(cache) == 10 and cache.currsize == 10


@pytest.mark.parametrize("cls", CLASSES)
def test_maxsize_currsize_and_eviction(cls):
    cache = cls(maxsize=50)
    rng = random.Random(1)
    for _ in range(3000):
        k = int(rng.paretovariate(1.0))
        if cache.get(k) is None:
            cache[k] = str(k)
        assert len(cache) <= 50 and cache.currsize == len(cache)
    assert cache.maxsize == 50
    for k in list(cache):
        assert cache[k] == str(k)


@pytest.mark.parametrize("cls", CLASSES)
def test_getsizeof_counts_against_maxsize(cls):
    cache = cls(maxsize=100, getsizeof=len)
    for i in range(200):
        cache[i] = "x" * (1 + i % 30)
        assert cache.currsize <= 100
        assert cache.currsize == sum(len(v) for v in cache.values())
    with pytest.raises(ValueError, match="value too large"):
        cache["big"] = "x" * 101
    assert "big" not in cache
    cache["big"] = "x" * 100  # exactly the maxsize fits, alone
    assert cache.currsize <= 100
    cache[5] = "abc"
    cache[5] = "abcdef"  # replacing changes the size
    assert cache.currsize == sum(len(v) for v in cache.values())


@pytest.mark.parametrize("cls", CLASSES)
def test_value_too_large_with_maxsize_zero(cls):
    cache = cls(maxsize=0)
    with pytest.raises(ValueError, match="value too large"):
        cache["a"] = 1
    assert len(cache) == 0


@pytest.mark.parametrize("cls", CLASSES)
def test_popitem_removes_the_next_victim(cls):
    cache = cls(maxsize=10)
    for i in range(10):
        cache[i] = i
    key, value = cache.popitem()
    assert key == value and key not in cache and len(cache) == 9
    while cache:
        cache.popitem()
    with pytest.raises(KeyError):
        cache.popitem()


@pytest.mark.parametrize("cls", CLASSES)
def test_mapping_methods(cls):
    cache = cls(maxsize=10)
    cache["a"] = 1
    assert cache.get("a") == 1 and cache.get("zz", 7) == 7
    assert cache.setdefault("b", 2) == 2 and cache.setdefault("b", 3) == 2
    assert cache.pop("a") == 1 and cache.pop("a", None) is None
    with pytest.raises(KeyError):
        cache.pop("a")
    with pytest.raises(KeyError):
        cache["missing"]
    del cache["b"]
    assert len(cache) == 0 and cache.currsize == 0
    cache["c"] = 3
    cache.clear()
    assert len(cache) == 0 and "c" not in cache
    cache["d"] = 4
    assert dict(cache) == {"d": 4}
    assert "maxsize=10" in repr(cache)


def test_missing_hook_like_cachetools():
    class Loading(TinyLFUCache):
        def __missing__(self, key):
            self[key] = key * 2
            return key * 2

    cache = Loading(maxsize=4)
    assert cache[3] == 6 and 3 in cache


def test_tinylfu_keeps_frequent_keys_under_a_scan():
    cache = TinyLFUCache(maxsize=100)
    hot = list(range(50))
    for _ in range(20):
        for k in hot:
            if cache.get(k) is None:
                cache[k] = k
    for k in range(1000, 6000):  # a one-pass scan, 50x the cache
        if cache.get(k) is None:
            cache[k] = k
    assert sum(k in cache for k in hot) >= 45  # LRU would keep none


def test_tacache_orders_by_event_time():
    cache = TACache(maxsize=3)
    for k, ts in (("a", 10.0), ("b", 20.0), ("c", 30.0)):
        cache[k] = k
        cache.touch(k, ts)
    cache.hint("a", 100.0)  # "a" is expected at t=100: renewed
    cache["d"] = "d"
    assert "b" not in cache and "a" in cache


def test_tinylfu_equal_but_distinct_keys_stay_consistent():
    # Keys that are equal but not the same object (ints > 256 rebuilt, as from a parser): the
    # policy's cached victim must be recognised by equality when it is hit and promoted.
    rng = random.Random(3)
    cache = TinyLFUCache(maxsize=50)
    for _ in range(20_000):
        k = int(str(1000 + int(rng.paretovariate(1.0) * 10) % 400))
        try:
            assert cache[k] == k
        except KeyError:
            cache[k] = k
        assert len(cache) <= 50
    policy = cache._policy
    assert len(policy) == len(cache) and all(k in cache for k in policy.keys())


def test_tinylfu_cache_decides_exactly_like_the_policy_it_wraps():
    # The cache inlines the policy's common hit and raises misses from its dict lookup; the
    # eviction decisions must still be the policy's own: the same trace played through the
    # simulator leaves the same resident keys (hits, drains, adaptation, ties included).
    from mlcache.bench.policies import _memoize_pass
    from mlcache.policies.wtinylfu import WTinyLFUPolicy
    from mlcache.sim import play, zipf

    keys = zipf(30_000, n_keys=3_000, alpha=0.9, seed=5).keys
    keys += list(range(10_000, 10_400)) * 3  # a loop phase: ghosts move the window
    cache = TinyLFUCache(maxsize=200)
    hits, _ = _memoize_pass(cache, keys)   # the @cached access pattern the benchmark times
    policy = WTinyLFUPolicy(200)
    result = play(policy, keys)
    assert hits == result.hits
    assert set(cache) == set(policy.keys())


def test_tinylfu_cache_after_clear_decides_like_a_fresh_policy():
    # The hot paths call bound methods of the policy's dicts kept on the cache (see
    # TinyLFUCache.__getitem__); clear() makes a new policy, so they must follow it: a cleared
    # cache plays a trace exactly as a new policy does, and its old policy is left untouched.
    from mlcache.bench.policies import _memoize_pass
    from mlcache.policies.wtinylfu import WTinyLFUPolicy
    from mlcache.sim import play, zipf

    keys = zipf(20_000, n_keys=2_000, alpha=0.9, seed=7).keys
    cache = TinyLFUCache(maxsize=100)
    _memoize_pass(cache, keys[:5_000])
    old = cache._policy
    old_keys = list(old.keys())
    cache.clear()
    assert len(cache) == 0 and cache._policy is not old
    hits, _ = _memoize_pass(cache, keys)
    result = play(WTinyLFUPolicy(100), keys)
    assert hits == result.hits
    assert set(cache) == set(cache._policy.keys())
    assert list(old.keys()) == old_keys


def test_missing_hook_sees_hits_as_hits():
    class Loading(TinyLFUCache):
        def __missing__(self, key):
            self[key] = key
            return key

    cache = Loading(maxsize=8)
    for k in [1, 2, 1, 1, 3] * 20:
        assert cache[k] == k
    assert set(cache) == {1, 2, 3} and cache._policy.frequency(1) >= cache._policy.frequency(3)


def test_tinylfu_cache_honours_a_policy_subclass_with_its_own_miss_path():
    # TinyLFUCache writes W-TinyLFU's steady miss out in __setitem__; a policy subclass that
    # overrides _miss must still be the one deciding.
    from mlcache.policies.wtinylfu import WTinyLFUPolicy

    calls = []

    class Counting(WTinyLFUPolicy):
        def _miss(self, key):
            calls.append(key)
            return super()._miss(key)

    class CountingCache(TinyLFUCache):
        _policy_class = Counting

    cache = CountingCache(maxsize=50)
    misses = 0
    for k in range(500):
        try:
            cache[k % 120]
        except KeyError:
            misses += 1
            cache[k % 120] = k
    assert len(calls) == misses > 120  # every miss went through the override
    assert len(cache) == 50 and set(cache) == set(cache._policy.keys())
    plain = TinyLFUCache(maxsize=50)
    assert plain._steady is plain._policy and cache._steady is None


def test_steady_miss_shortcuts_decide_like_the_general_steps():
    # The steady miss refuses a candidate that ties with a cold victim itself (ties go to the
    # incumbent, no chance draw) instead of calling _settle, and takes a one-entry window's
    # only key with popitem(). With both shortcuts disabled (_tie_ok and _single never set)
    # every tie goes through _settle/_decide and every window through its LRU end: the cache
    # and the policy must play the trace the same either way, ghosts and tie marks included.
    from mlcache.bench.policies import _memoize_pass
    from mlcache.policies.wtinylfu import WTinyLFUPolicy
    from mlcache.sim import play, zipf

    class NoShortcut(WTinyLFUPolicy):
        def _cache_victim(self):
            victim = super()._cache_victim()
            self._tie_ok = self._single = False
            return victim

    class NoShortcutCache(TinyLFUCache):
        _policy_class = NoShortcut

    keys = zipf(30_000, n_keys=3_000, alpha=0.9, seed=9).keys
    keys += list(range(10_000, 10_300)) * 3
    runs, single = [], 0
    for cache, policy in ((TinyLFUCache(200), WTinyLFUPolicy(200)),
                          (NoShortcutCache(200), NoShortcut(200))):
        assert cache._steady is cache._policy  # the inlined miss path in both
        hits = 0
        for i in range(0, len(keys), 100):
            hits += _memoize_pass(cache, keys[i:i + 100])[0]
            single += cache._policy._single
        result = play(policy, keys)
        p = cache._policy
        runs.append((hits, result.hits, sorted(cache), sorted(policy.keys()),
                     list(p._wghost.items()), list(p._mghost.items()), p._cold.tie_score))
    assert runs[0] == runs[1]
    assert runs[0][0] == runs[0][1]
    assert any(code & 4 for _, code in runs[0][4])  # ties were refused and remembered
    assert single  # the one-entry window was taken


def test_the_policy_keeps_its_attributes_inline():
    # CPython 3.11 reads an object's attributes at a fixed offset only while its class's
    # instances have fewer than about 30 attribute names; past that each read on the hot paths
    # is a dict lookup (~170 instructions a request on the Zipf bench). State the hot paths do
    # not touch lives in WTinyLFUPolicy._cold: keep new attributes there, or this count low.
    cache = TinyLFUCache(100)
    for i in range(1000):
        cache[i % 300] = i
    assert len(vars(cache._policy)) <= 27
    assert len(vars(cache)) <= 27
