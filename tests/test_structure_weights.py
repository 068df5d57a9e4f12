"""Weights that CacheableList and CacheableSet hand to a heap bounded in bytes.

Their metadata (and the list's chunk on an append or extend) go to the heap with a weight
worked out from their shape, so that the heap does not walk the value on every write. That
weight must be what the heap's own walk (:func:`estimate_size`) gives for the value it holds;
the tests read the weight the heap charged for each resident entry of the structure and compare.
The operations run against a plain list or set too, over a heap small enough to evict, since the
structure tests elsewhere run on an entry-bounded heap, where no weight is worked out.
"""
from __future__ import annotations

import random
import shutil
import tempfile
import uuid

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.levels.heap import estimate_size
from mlcache.structures.base import META_NAMESPACE, int_weight, list_shell


@pytest.fixture(params=[64 * 1024 * 1024, 300_000], ids=["big-heap", "evicting-heap"])
def manager(request):
    path = tempfile.mkdtemp(prefix="mlcache-weights-")
    m = CacheManager(CacheConfig(heap=HeapConfig(max_bytes=request.param),
                                 levels=(DiskConfig(path=path),),
                                 namespace="w" + uuid.uuid4().hex[:10]))
    yield m
    m.close()
    shutil.rmtree(path, ignore_errors=True)


def charged(m: CacheManager, kb: bytes) -> int:
    """The weight the heap charged for ``kb``, without its per-entry overhead and key."""
    heap = m._heap
    assert heap is not None and heap.by_bytes
    extra = heap.entry_overhead + (len(kb) << 1 if heap.entry_overhead else 0)
    return heap.weights[kb] - extra


def check_weights(m: CacheManager, s) -> int:
    """Every resident entry of ``s`` (its metadata, a list's chunks) weighs what the walk gives;
    returns how many were checked."""
    heap = m._heap
    checked = 0
    metans = m.namespace(META_NAMESPACE)
    kb = metans._kb((s.kind, s.name))
    if kb in heap.data:
        assert charged(m, kb) == estimate_size(heap.data[kb]), s._meta
        checked += 1
    for key in s._ns.keys() if s.kind == "list" else ():   # (a set's entries are flat ints)
        kb = s._ns._kb(key)
        if kb in heap.data:
            value = heap.data[kb]
            assert charged(m, kb) == max(1, estimate_size(value)), (key, value)
            checked += 1
    return checked


def test_int_weight_and_list_shell_are_the_walks():
    for v in [0, 1, -5, -6, 256, 257, 1000, -1000, 2 ** 30 - 1, 2 ** 30, -(2 ** 30) + 1,
              -(2 ** 30), 2 ** 45, 2 ** 62, -(2 ** 62), 2 ** 100, -(2 ** 200)]:
        assert int_weight(v) == estimate_size(v), v
    # a list of Nones weighs its shell only (None is free): lists of every length, grown by
    # appends (over-allocated) or made at their size
    grown: list = []
    for n in range(300):
        for plain in (grown, [None] * n, [None for _ in range(n)], grown[: n // 2]):
            assert list_shell(plain) == estimate_size(plain), n
        grown.append(None)


ELEMENTS = [
    lambda r: r.randint(-10, 300),
    lambda r: r.randint(-(2 ** 40), 2 ** 40),
    lambda r: 2 ** r.randint(60, 90),
    lambda r: "s" * r.randint(0, 40),
    lambda r: "a" * r.randint(1, 5),
    lambda r: r.random(),
    lambda r: None,
    lambda r: b"b" * r.randint(0, 20),
    lambda r: [r.randint(0, 1000) for _ in range(r.randint(0, 5))],
    lambda r: (r.randint(0, 9), "t", [1, [2, [3, [4]]]]),
    lambda r: {"k": r.randint(0, 10 ** 6)},
]


# (Only ASCII strings: a non-ASCII str grows by its UTF-8 form once it is encoded, so the
# walk gives more after a write-back than when the weight was worked out; see the test below.)


def element(r: random.Random):
    return r.choice(ELEMENTS)(r)


@pytest.mark.parametrize("chunk_size", [1, 5, 31, 32, 33, 40, 256])
def test_list_weights_are_the_heaps_estimates(manager, chunk_size):
    r = random.Random(chunk_size)
    s = manager.list(f"l{chunk_size}", chunk_size=chunk_size)
    assert s._put_weighed is not None   # the path under test, not the heap's own walk
    model: list = []
    checked = 0
    for step in range(700):
        op = r.random()
        if op < 0.45:
            v = element(r)
            s.append(v)
            model.append(v)
        elif op < 0.6:
            vs = [element(r) for _ in range(r.randint(0, 2 * chunk_size + 3))]
            s.extend(vs)
            model.extend(vs)
        elif op < 0.68 and model:
            # a change of a slot in the weighed chunk, then appends on top of it
            i = r.randrange(len(model))
            v = element(r)
            s[i] = v
            model[i] = v
        elif op < 0.74 and model:
            assert s.popleft() == model.pop(0)
        elif op < 0.8:
            v = element(r)
            i = r.randint(-len(model) - 1, len(model) + 1)
            s.insert(i, v)
            model.insert(i, v)
        elif op < 0.85 and model:
            i = r.randrange(len(model))
            assert s.pop(i) == model.pop(i)
        elif op < 0.88 and model:
            lo, k = r.randrange(len(model)), r.randint(0, 5)
            del s[lo:lo + k]
            del model[lo:lo + k]
        elif op < 0.9:
            s.reverse()
            model.reverse()
        elif op < 0.91:
            s.clear()
            model.clear()
        elif op < 0.915:
            s.drop()
            model.clear()
        checked += check_weights(manager, s)
        if step % 50 == 0:
            assert s.copy() == model
    assert s.copy() == model and len(s) == len(model)
    assert checked > 700


def test_list_append_onto_a_chunk_changed_elsewhere_reweighs_it(manager):
    """The chunk weighed last is reused only while nothing else changed it: a slot among the
    sampled first ones replaced in place, a pop from the front, or the chunk reloaded."""
    s = manager.list("changed", chunk_size=64)
    for n in range(40):
        s.append(n + 1000)
    s[3] = "x" * 500            # a sampled slot gets much heavier
    s.append(7)
    check_weights(manager, s)
    assert s.popleft() == 1000
    s.append("y" * 100)
    check_weights(manager, s)
    s.extend(["z" * 300] * 10)
    check_weights(manager, s)
    assert s.copy()[-12:] == [7, "y" * 100] + ["z" * 300] * 10


def test_list_weight_with_non_ascii_strings_trails_the_walk_by_their_utf8_forms(manager):
    """A non-ASCII str keeps its UTF-8 form once encoded (a write-back, or the first put of a
    type), and ``sys.getsizeof`` counts it: the heap's walk then gives more than when the
    weight was worked out (the heap's own weights have the same lag). Bounded by that form."""
    s = manager.list("utf8", chunk_size=64)
    for n in range(200):
        s.append("ü" * (n % 7 + 1))
        if n % 50 == 0:
            manager.flush()
    for key in s._ns.keys():
        kb = s._ns._kb(key)
        if kb in manager._heap.data:
            chunk = manager._heap.data[kb]
            walk, given = estimate_size(chunk), charged(manager, kb)
            assert given <= walk <= given + len(chunk) * 32, (walk, given)


def test_set_metadata_weight_is_the_heaps_estimate(manager):
    r = random.Random(5)
    s = manager.set("weighed")
    model: set = set()
    for step in range(1500):
        op = r.random()
        k = r.randint(0, 2000)
        if op < 0.6:
            s.add(k)
            model.add(k)
        elif op < 0.8:
            s.discard(k)
            model.discard(k)
        elif op < 0.9:
            ks = [r.randint(0, 2000) for _ in range(r.randint(0, 30))]
            s.update(ks)
            model.update(ks)
        elif op < 0.97:
            ks = [r.randint(0, 2000) for _ in range(r.randint(0, 30))]
            s.difference_update(ks)
            model.difference_update(ks)
        elif op < 0.99 and len(model) > 300:
            s.clear()
            model.clear()
        kb = manager.namespace(META_NAMESPACE)._kb(("set", "weighed"))
        if kb in manager._heap.data:
            assert charged(manager, kb) == estimate_size(manager._heap.data[kb])
        assert len(s) == len(model)
    assert s.copy() == model


def test_reopened_structures_weigh_their_read_metadata(manager):
    lst = manager.list("again", chunk_size=8)
    lst.extend(range(1000, 1100))
    st = manager.set("again")
    st.update(range(300))
    manager.flush()
    del lst, st
    import gc

    gc.collect()
    lst = manager.list("again")
    st = manager.set("again")
    lst.append("more")
    st.add("more")
    check_weights(manager, lst)
    check_weights(manager, st)
    assert len(lst) == 101 and lst[-1] == "more" and len(st) == 301


def test_entry_bounded_heap_takes_no_weights():
    """A heap bounded by entry count weighs every entry 1 without a walk: the structures then
    write as before, with nothing worked out."""
    path = tempfile.mkdtemp(prefix="mlcache-weights-")
    m = CacheManager(CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                                 levels=(DiskConfig(path=path),)))
    try:
        lst, st = m.list("plain"), m.set("plain")
        assert lst._put_weighed is None and st._put_weighed is None
        lst.extend(range(600))
        lst.append(1)
        st.update(range(600))
        assert lst._chunk_w is None
        assert len(lst) == 601 and lst[600] == 1 and len(st) == 600
    finally:
        m.close()
        shutil.rmtree(path, ignore_errors=True)
