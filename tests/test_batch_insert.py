"""Batched inserts of a batched miss: ``WTinyLFUPolicy.insert_many`` and
``HeapLevel.insert_many`` make the same decisions as inserting key by key."""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from mlcache.config import HeapConfig
from mlcache.levels.heap import HeapLevel
from mlcache.policies.wtinylfu import WTinyLFUPolicy


def _state(p: WTinyLFUPolicy) -> tuple:
    return (list(p._window.items()), list(p._probation.items()), list(p._protected.items()),
            p._cold.wsize, p._cold.psize, p._cold.qsize, p.total_weight, dict(p._pending),
            list(p._cold.log), bytes(p.sketch.table), p._countdown, p._cold.drain_left,
            p._cold.tick_len, list(p._wghost.items()), list(p._mghost.items()), p._ghost_limit,
            p._window_max, p._steady, p._cold.unit, p._ticks)


def _replay(ops: list, capacity: int, batched: bool) -> tuple[WTinyLFUPolicy, list]:
    p = WTinyLFUPolicy(capacity)
    lost_all = []
    for op, arg in ops:
        if op == "batch":
            if batched:
                lost_all.append(sorted(p.insert_many(arg), key=repr))
            else:
                lost = []
                for key in arg:
                    lost.extend(p.insert(key, 1))
                # insert_many names each key that left once, and none that is back (7fc8dea):
                # key by key, a key resident before the batch may leave, return and leave again
                lost = [k for k in dict.fromkeys(lost) if k not in p]
                lost_all.append(sorted(lost, key=repr))
        elif op == "access":
            p.access(arg)
        elif op == "remove":
            p.remove(arg)
        else:
            p.insert(arg, 1)
    return p, lost_all


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=400), st.integers(min_value=0, max_value=2**32),
       st.integers(min_value=1, max_value=60))
def test_wtinylfu_insert_many_is_insert_key_by_key(capacity, seed, steps):
    rng = random.Random(seed)
    universe = max(4, capacity * 2)
    ops: list = []
    for _ in range(steps):
        r = rng.random()
        if r < 0.5:
            n = rng.randint(1, 150)
            ops.append(("batch", list(dict.fromkeys(rng.randrange(universe) for _ in range(n)))))
        elif r < 0.75:
            ops.append(("access", rng.randrange(universe)))
        elif r < 0.85:
            ops.append(("remove", rng.randrange(universe)))
        else:
            ops.append(("insert", rng.randrange(universe)))
    one, lost_one = _replay(ops, capacity, batched=False)
    many, lost_many = _replay(ops, capacity, batched=True)
    assert lost_one == lost_many
    assert _state(one) == _state(many)


def test_wtinylfu_insert_many_crosses_drains_exactly():
    # thousands of misses into a large, empty cache: several ticks and drains inside batches
    keys = [("k", i) for i in range(20_000)]
    one, many = WTinyLFUPolicy(100_000), WTinyLFUPolicy(100_000)
    for i in range(0, len(keys), 100):
        for key in keys[i:i + 100]:
            assert one.insert(key, 1) == []
        assert many.insert_many(keys[i:i + 100], fresh=i % 200 == 0) == []
    assert _state(one) == _state(many)


def _heap(policy: str, **kw) -> HeapLevel:
    return HeapLevel(HeapConfig(policy=policy, **kw))


def test_heap_insert_many_matches_insert():
    for policy in ("wtinylfu", "lru", "clock", "tac"):   # (wtinylfu and tac: their own batch)
        for kw in ({"max_entries": 50, "max_bytes": None}, {"max_entries": None,
                                                          "max_bytes": 20_000}):
            one, many = _heap(policy, **kw), _heap(policy, **kw)
            rng = random.Random(7)
            for step in range(30):
                keys = list(dict.fromkeys(f"k{rng.randrange(200)}".encode() for _ in range(20)))
                keys = [k for k in keys if k not in one.data]
                values = [{"v": step, "k": k} for k in keys]
                sizes = [40] * len(keys)
                lost_one: list = []
                for k, v, n in zip(keys, values, sizes):
                    lost_one.extend(one.insert(k, v, dirty=False, size=n))
                victims, refused = many.insert_many(keys, values, iter(sizes),
                                                    absent=step % 2 == 0)
                batch = set(keys)
                assert sorted(refused) == sorted(k for k, _, _ in lost_one if k in batch)
                assert sorted(v[0] for v in victims) == sorted(
                    k for k, _, _ in lost_one if k not in batch)
                assert one.data == many.data
                assert one.weights == many.weights
                assert one.tracked_weight == many.tracked_weight
                assert one.dirty == many.dirty


def test_heap_insert_many_keeps_dirty_victims_dirty():
    heap = _heap("lru", max_entries=4, max_bytes=None)
    for i in range(4):
        heap.insert(b"d%d" % i, i, dirty=True)
    victims, refused = heap.insert_many([b"a", b"b"], [1, 2], [2, 2])
    assert refused == []
    assert sorted(victims) == [(b"d0", 0, True), (b"d1", 1, True)]
    assert set(heap.data) == {b"d2", b"d3", b"a", b"b"}
    assert heap.dirty == {b"d2", b"d3"}
