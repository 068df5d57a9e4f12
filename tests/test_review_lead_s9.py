"""Regression tests for defects found in session 9's policy review (fixed by the lead)."""
from __future__ import annotations

import copy
import math

import pytest

from mlcache.policies import get_policy
from mlcache.policies.cachetools_compat import TinyLFUCache
from mlcache.sim import zipf
from mlcache.sketch import FrequencySketch


def _memoize(cache, keys) -> int:
    hits = 0
    for k in keys:
        try:
            cache[k]
            hits += 1
        except KeyError:
            cache[k] = k
    return hits


def test_deep_copied_tinylfu_cache_is_independent_of_the_original():
    # The copy's hit path (the protected segment's move_to_end and the hit log, kept bound on
    # the cache) stayed bound to the original's structures: the copy's hits reordered the
    # original, and the two then decided differently on the same requests.
    keys = list(zipf(30_000, n_keys=5_000, alpha=0.9, seed=3).keys)
    original = TinyLFUCache(200)
    _memoize(original, keys[:10_000])
    twin = copy.deepcopy(original)
    assert twin._move.__self__ is twin._policy._protected
    assert twin._logged.__self__ is twin._policy._cold.log
    assert _memoize(original, keys[10_000:]) == _memoize(twin, keys[10_000:])
    assert dict(original.items()) == dict(twin.items())


@pytest.mark.parametrize("counts", [{7: -2}, {"a": -1}, {7: 1, 8: -3}])
def test_sketch_increment_counts_refuses_negative_counts(counts):
    # {7: -2} wrapped round to a saturated counter: the estimate read back was 14
    sketch = FrequencySketch(100)
    before = bytes(sketch.table)
    with pytest.raises(ValueError, match="must not be negative"):
        sketch.increment_counts(counts)
    assert bytes(sketch.table) == before
    assert sketch.frequency(7) == 0


@pytest.mark.parametrize("name", ["tac", "belady"])
@pytest.mark.parametrize("weight", [math.nan, -1, -0.5])
def test_tac_and_belady_refuse_nan_and_negative_weights(name, weight):
    # A NaN weight made total_weight NaN, which never exceeds the capacity: the policy then
    # held any number of entries; a negative one made room that was never there.
    options = {"trace": [1, 2, 3, 1, 2, 3]} if name == "belady" else {}
    policy = get_policy(name)(2, **options)
    policy.insert(1)
    with pytest.raises(ValueError, match="non-negative number"):
        policy.insert(2, weight)
    assert list(policy.keys()) == [1] and policy.total_weight == 1
    policy.insert(2)
    assert policy.insert(3) != [] and len(policy) <= 2


@pytest.mark.parametrize("name", ["tac", "belady"])
def test_tac_and_belady_name_a_weight_that_is_not_a_number(name):
    options = {"trace": [1, 2]} if name == "belady" else {}
    policy = get_policy(name)(2, **options)
    with pytest.raises(TypeError, match="weight must be a number, got str"):
        policy.insert(1, "3")
    assert len(policy) == 0 and policy.total_weight == 0


@pytest.mark.parametrize("timed", [False, True])
def test_a_hit_appended_after_the_read_buffer_was_replayed_is_not_lost(tmp_path, timed):
    # The hit path takes no lock: it reads the buffer list, then appends to it. The replay
    # swapped in new lists, so an append that came after the swap went to a list nobody read
    # again: the key was never marked as handed out, and a flush() missed a change made in
    # place to its value. The buffer is now emptied in place.
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

    config = CacheConfig(heap=HeapConfig(max_entries=100), levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(config) as m:
        m.put("a", [1])
        m.put("b", [0])
        m.flush()                                   # nothing is marked as handed out now
        kb = m._kb("a")
        m.get("b", ts=1.0 if timed else None)       # a hit buffered: the replay has work
        held = m._reads_ts if timed else m._reads   # what a hit thread read before the replay
        with m._lock:
            m._apply_reads()
        held.append((kb, 5.0) if timed else kb)    # its append, after the replay
        with m._lock:
            m._apply_reads()
        assert kb in m._handed
        m._data[kb].append(2)                       # the caller changes the value in place
        m.flush()                                   # written down with the change
        assert m._codec.decode(m._levels[-1].get_many([kb])[0]) == [1, 2]


@pytest.mark.parametrize("kind", ["dict", "list", "set"])
def test_invalidate_local_of_a_structure_reads_another_process_changes(tmp_path, kind):
    # A live structure kept its own copy of its metadata (length, order, chunks): after
    # invalidate_local it still showed its old length, and its next write saved that copy
    # over the other process's changes, hiding them for good. Two managers on one store
    # stand for two processes.
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

    config = CacheConfig(heap=HeapConfig(max_entries=100), levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(config) as a, CacheManager(config) as b:
        sa = getattr(a, kind)("s")
        a.flush()                                   # made by one process, then opened by both
        sb = getattr(b, kind)("s")
        assert len(sb) == 0
        for i in range(10):
            sa.append(i) if kind == "list" else sa.add(i) if kind == "set" else sa.__setitem__(i, i)
        a.flush()
        b.invalidate_local(sb.uid)
        assert len(sb) == 10
        sb.append(10) if kind == "list" else sb.add(10) if kind == "set" else sb.__setitem__(10, 10)
        b.flush()
        a.invalidate_local(sa.uid)
        expected = {i: i for i in range(11)} if kind == "dict" else list(range(11))
        for s in (sa, sb):
            got = dict(s) if kind == "dict" else sorted(s) if kind == "set" else list(s)
            assert got == expected


def test_nested_structures_are_not_kept_for_the_managers_life(tmp_path):
    # Every structure resolved from a stored reference stayed in the manager's tables (and
    # its namespace with it) until close: ~4 MB per 5,000 nested sets outside the heap's
    # budget, growing with every key of a job that keeps a set per key. They are held weakly
    # now: alive while used, opened again (same contents) when read again.
    import gc

    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    from mlcache.structures import CacheableSet

    config = CacheConfig(heap=HeapConfig(max_entries=300), levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(config) as m:
        cards = m.dict("cards")
        for i in range(500):
            s = CacheableSet.open(m)
            s.add(i)
            cards[i] = s
        del s
        for i in range(500):
            cards[i].add(-i)
        gc.collect()
        assert len(m._cold.structures) < 10 and len(m._cold.namespaces) < 10
        assert all(set(cards[i]) == {i, -i} for i in range(0, 500, 7))
        held = cards[3]
        assert cards[3] is held and m.dict("cards") is cards   # one object while it is used
        held.add(99)
        del held
        gc.collect()
        assert set(cards[3]) == {3, -3, 99}
