"""Session 9 review of the cacheable dict, list and set against the builtins.

Each test is the regression test of one defect found by a differential probe (a structure over
a 4-entry heap on disk or on Redis -> disk, next to the builtin doing the same thing).
"""
from __future__ import annotations

import sys
import threading

import pytest

from _structures_support import manager  # noqa: F401  (the fixture)


@pytest.fixture()
def fast_switching():
    """Threads switch every microsecond, so two threads' steps interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _run(threads: int, work) -> None:
    errors: list[BaseException] = []

    def body(t: int) -> None:
        try:
            work(t)
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    ts = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def test_two_threads_appending_and_popping_lose_nothing(manager, fast_switching):
    # Regression: append read the metadata (head, len), read and wrote the tail chunk, then
    # wrote the metadata; two threads interleaving those steps overwrote each other's chunk:
    # 6,000 appends left len 6,000 with 20 elements lost (None in their place). popleft in two
    # threads popped the same element twice or crashed ('NoneType' is not subscriptable).
    lst = manager.list("shared", chunk_size=4)
    n = 1500
    _run(2, lambda t: [lst.append((t, i)) for i in range(n)])
    assert len(lst) == 2 * n
    assert sorted(lst.copy()) == sorted((t, i) for t in range(2) for i in range(n))
    popped: list[list] = [[], []]
    _run(2, lambda t: [popped[t].append(lst.popleft()) for _ in range(n)])
    assert len(lst) == 0 and lst.copy() == []
    assert sorted(popped[0] + popped[1]) == sorted((t, i) for t in range(2) for i in range(n))


def test_two_threads_on_the_same_keys_keep_the_count(manager, fast_switching):
    # Regression: __setitem__/add looked the key up, wrote it, then counted it if it was new;
    # del/discard looked it up, deleted it, then uncounted it. Two threads doing that to one key
    # both saw it new (or both saw it present), so len drifted from the real contents.
    d = manager.dict("shared-d")
    s = manager.set("shared-s")

    def work(t: int) -> None:
        for i in range(1500):
            k = i % 20
            d[k] = t
            s.add(k)
            if i % 3 == 0:
                d.pop(k, None)
                s.discard(k)

    _run(2, work)
    assert len(d) == len(d.copy()) == len(list(d))
    assert len(s) == len(s.copy())


def test_update_keeps_the_items_before_an_unsupported_key(manager):
    # Regression: update collected the items and stored them in one batch; a key the levels
    # cannot store (None, 1.5) failed the batch's lookup, so none of the items before it was
    # stored, while a dict keeps them (and the docstrings said so).
    d = manager.dict("d-upd")
    with pytest.raises(TypeError, match="NoneType"):
        d.update([("a", 1), (None, 2), ("b", 3)])
    assert d == {"a": 1} and len(d) == 1
    with pytest.raises(TypeError, match="float"):
        d.update({"c": 3, 1.5: 0})
    assert d == {"a": 1, "c": 3} and list(d) == ["a", "c"]
    s = manager.set("s-upd")
    with pytest.raises(TypeError, match="NoneType"):
        s.update([300, None, 301])
    assert s == {300} and len(s) == 1
    with pytest.raises(TypeError, match="NoneType"):
        s |= {None}
    assert s == {300}


def test_numbers_equal_to_an_int_are_that_key(manager):
    # Regression: only floats and types with __index__ were folded into the int they equal;
    # Fraction(4, 2), Decimal(3), numpy.float32(2.0), 3+0j and numpy.True_ hash and compare
    # equal to an int, so a dict finds them under it, but here they were absent on read
    # (d.get(Fraction(2)) gave None, Fraction(2) in s was False) and refused on write.
    from decimal import Decimal
    from fractions import Fraction

    import numpy as np

    d, plain = manager.dict("d-num"), {}
    s, plain_s = manager.set("s-num"), set()
    for k in range(5):
        d[k] = plain[k] = f"v{k}"
        s.add(k)
        plain_s.add(k)
    keys = [Fraction(4, 2), Decimal(3), np.float32(2.0), np.float16(1.0), complex(3, 0),
            np.complex64(4), np.True_, np.False_, Fraction(1, 2), Decimal("2.5"), complex(1, 1),
            Decimal("NaN"), np.float32("nan"), np.float64("inf")]
    for k in keys:
        assert (k in d) == (k in plain), k
        assert d.get(k, "-") == plain.get(k, "-"), k
        assert (k in s) == (k in plain_s), k
    d[Fraction(6, 3)] = plain[Fraction(6, 3)] = "two"
    d[Decimal(7)] = plain[Decimal(7)] = "seven"
    s.add(np.float32(7.0))
    plain_s.add(np.float32(7.0))
    assert d == plain and len(d) == len(plain) == 6
    assert s == plain_s and len(s) == 6
    with pytest.raises(TypeError, match="Fraction"):
        d[Fraction(1, 2)] = 0


def test_update_takes_any_keyword_as_a_key(manager):
    # Regression: update(self, *args, **kwargs) took update(self=1) for its own parameter
    # (TypeError 'got multiple values for argument self'); dict.update(self=1) adds the key.
    d, plain = manager.dict("d-kw"), {}
    for m in (d, plain):
        m.update(self=1, args=2)
        m.update({"x": 0}, self=3)
        m |= {"kwargs": 4}
    assert d == plain == {"self": 3, "args": 2, "x": 0, "kwargs": 4}
    assert list(d) == list(plain)


def test_a_list_chunk_dropped_by_a_lossy_level_is_named(tmp_path):
    # Regression: a level configured lossy=True may drop entries (docs/guarantees.md); a list
    # whose chunk it dropped failed with bare errors naming nothing: l[0] TypeError
    # "'NoneType' object is not subscriptable", l[5:9] and iteration KeyError 0, pop(0)/insert
    # the same TypeError. Each is now an IntegrityError naming the list and the lost elements.
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    from mlcache.errors import IntegrityError

    config = CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="lru"),
                         levels=(DiskConfig(path=str(tmp_path), max_bytes=64 << 10, lossy=True),),
                         namespace="lossy")
    with CacheManager(config) as m:
        lst = m.list("l", chunk_size=16)
        for i in range(3000):
            lst.append(f"{i:050d}")
        m.flush()
        lost = []
        for i in range(0, 3000, 16):
            try:
                assert lst[i] == f"{i:050d}"
            except IntegrityError as exc:
                assert "list 'l'" in str(exc) and f"elements {i}..{i + 15}" in str(exc)
                lost.append(i)
        assert lost, "the lossy level dropped nothing: the test needs a smaller level"
        i = lost[0]
        for op in (lambda: lst[i:i + 3], lambda: list(lst), lambda: lst.pop(i),
                   lambda: lst.__setitem__(i, "x"), lambda: lst.insert(i + 1, "x")):
            with pytest.raises(IntegrityError, match=f"elements {i}\\.\\.{i + 15}"):
                op()
        assert len(lst) == 3000
        lst.clear()
        lst.extend(range(40))
        assert lst.copy() == list(range(40))


def test_options_given_again_must_match(manager):
    # Regression: a list's chunk_size given again on a reopen (open, or after close()) was
    # silently ignored, even a different or an invalid one, and a dict or set took unknown
    # options on a reopen that it refuses on creation (TypeError 'takes no options').
    lst = manager.list("opts", chunk_size=8)
    lst.extend(range(20))
    assert manager.list("opts", chunk_size=8) is lst and manager.list("opts") is lst
    with pytest.raises(ValueError, match="exists with chunk_size 8, not 64"):
        manager.list("opts", chunk_size=64)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        manager.list("opts", chunk_size=0)
    for make in (manager.dict, manager.set):
        make("opts")
        with pytest.raises(TypeError, match="takes no options"):
            make("opts", chunk_size=8)
    config = manager.test_config
    manager.close()
    from mlcache import CacheManager

    with CacheManager(config) as again:
        with pytest.raises(ValueError, match="exists with chunk_size 8, not 64"):
            again.list("opts", chunk_size=64)
        with pytest.raises(TypeError, match="takes no options"):
            again.dict("opts", foo=1)
        assert again.list("opts", chunk_size=8).copy() == list(range(20))


def test_deepcopy_of_a_structure_that_holds_itself(manager):
    # Regression: __deepcopy__ deep-copied the plain copy, which holds the live structure again,
    # so d["me"] = d (or a list holding itself) recursed until RecursionError; a dict's deep copy
    # keeps the cycle.
    import copy

    d, lst = manager.dict("d-cyc"), manager.list("l-cyc")
    d["me"] = d
    d["l"] = lst
    d["v"] = [1, 2]
    lst.append(lst)
    lst.append(d)
    out = copy.deepcopy(d)
    assert type(out) is dict and out["me"] is out and out["v"] == [1, 2]
    assert type(out["l"]) is list and out["l"][0] is out["l"] and out["l"][1] is out
    plain = copy.deepcopy(lst)
    assert type(plain) is list and plain[0] is plain and plain[1]["l"] is plain
    s = manager.set("s-cyc")
    s.update([1, ("a", 2)])
    d["s"] = s
    assert copy.deepcopy(d)["s"] == {1, ("a", 2)} and type(copy.deepcopy(s)) is set


def test_a_forked_child_can_use_a_structure_locked_at_the_fork(tmp_path):
    # Regression (of the per-structure lock, fbac26e): a child forked while a thread of the
    # parent was inside a structure's call (here a sort whose key function waits) inherited the
    # lock held by a thread it does not have, and its first call on that structure hung. The
    # locks are renewed in the child, as the manager renews its own.
    import os
    import time

    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

    config = CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None),
                         levels=(DiskConfig(path=str(tmp_path)),), namespace="fork")
    m = CacheManager(config)
    lst = m.list("l", chunk_size=2)
    lst.extend([3, 1, 2])
    inside, release = threading.Event(), threading.Event()

    def key(v):
        inside.set()
        release.wait(30)
        return v

    sorter = threading.Thread(target=lambda: lst.sort(key=key))
    sorter.start()
    try:
        assert inside.wait(30)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                lst.append(4)
                code = 0 if lst.copy() == [3, 1, 2, 4] else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 15
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert done and os.WEXITSTATUS(status) == 0, "the child hung on the structure's lock"
    finally:
        release.set()
        sorter.join()
        m.close()


def test_a_redis_level_down_leaves_each_structure_as_it_was():
    # Regression: with the heap over Redis and Redis down, a write succeeds (it goes to the
    # heap) and a read of an evicted entry raises LevelUnavailableError. Changes that read after
    # their first write were left half done: insert(0, x) moved the head and counted the element
    # before writing it (then every read of element 0 failed: its chunk was in no level), a
    # shortening slice assignment or delete wrote and deleted chunks before reading the last one
    # (elements lost, or the length not cut). Every operation now either raises with the
    # structure unchanged or completes (dict and set: see the next test).
    import random

    from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
    from mlcache._redis_server import RedisServer
    from mlcache.errors import LevelUnavailableError

    server = RedisServer(appendonly=True).start()
    try:
        config = CacheConfig(
            heap=HeapConfig(max_entries=3, max_bytes=None, policy="lru"),
            levels=(RedisConfig(url=server.url, retries=0, socket_timeout=0.5),),
            namespace="down")
        m = CacheManager(config)
        lst, d, s = m.list("l", chunk_size=2), m.dict("d"), m.set("s")
        plain_l, plain_d, plain_s = list(range(30)), {i: i for i in range(30)}, set(range(30))
        lst.extend(plain_l)
        d.update(plain_d)
        s.update(plain_s)
        m.checkpoint()
        server.stop()
        rng = random.Random(5)
        done = failed = 0
        for _ in range(300):
            n, j, k, r = len(plain_l), rng.randrange(-33, 33), rng.randrange(100), rng.randrange(4)
            ops = [
                lambda x: x.insert(j, k), lambda x: x.insert(0, k), lambda x: x.append(k),
                lambda x: x.pop(j % n) if n else None, lambda x: x.pop(0) if n else None,
                lambda x: x.__delitem__(slice(j, j + 3)),
                lambda x: x.__setitem__(slice(j, j + 2), [k] * r),
                lambda x: x.__delitem__(slice(None, None, 3)), lambda x: x.reverse(),
                lambda x: x.__setitem__(j % n, k) if n else None, lambda x: x.sort(),
            ]
            dops = [
                lambda x: x.__setitem__(k % 45, k), lambda x: x.pop(k % 45, None),
                lambda x: x.popitem() if x else None, lambda x: x.setdefault(k % 45, -k),
                lambda x: x.update({k % 45: 1, (k + 1) % 45: 2}),
            ]
            sops = [
                lambda x: x.add(k % 45), lambda x: x.discard(k % 45),
                lambda x: x.symmetric_difference_update([k % 45, (k + 7) % 45]),
                lambda x: x.update([k % 45, 50]), lambda x: x.difference_update([k % 45]),
            ]
            for ours, model, op in ((lst, plain_l, rng.choice(ops)),
                                    (d, plain_d, rng.choice(dops)),
                                    (s, plain_s, rng.choice(sops))):
                try:
                    op(ours)
                except LevelUnavailableError:
                    failed += 1
                else:
                    done += 1
                    op(model)
                assert len(ours) == len(model)
        assert done and failed
        server.start()
        assert lst.copy() == plain_l
        assert list(d.items()) == list(plain_d.items())
        assert s.copy() == plain_s
        m.close()
        with CacheManager(config) as again:
            assert again.list("l").copy() == plain_l
            assert list(again.dict("d").items()) == list(plain_d.items())
            assert again.set("s").copy() == plain_s
    finally:
        server.cleanup()


def test_popitem_with_a_redis_level_down_keeps_the_order_and_the_count():
    # Regression: popitem cut the order log's last slot, then read that key's item; with Redis
    # down the read failed after the cut, so each failed popitem lost the slot of a live key:
    # with Redis back, popitem returned (19, 'v19') where a dict gives (24, 'v24'), and the
    # keys out of the log were listed in whatever order the levels gave. (Had the whole log
    # been cut so, the next popitem took the dict for empty and zeroed its count.) Now it
    # reads, then cuts.
    from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
    from mlcache._redis_server import RedisServer
    from mlcache.errors import LevelUnavailableError

    server = RedisServer(appendonly=True).start()
    try:
        config = CacheConfig(
            heap=HeapConfig(max_entries=3, max_bytes=None, policy="lru"),
            levels=(RedisConfig(url=server.url, retries=0, socket_timeout=0.5),),
            namespace="down-pop")
        with CacheManager(config) as m:
            d = m.dict("d")
            d.update({i: f"v{i}" for i in range(20)})   # a log chunk
            for i in range(20, 25):
                d[i] = f"v{i}"                          # the log's tail, in the metadata
            m.namespace("other").put_many([(i, i) for i in range(6)])   # evicts d's items
            m.checkpoint()
            server.stop()
            for _ in range(8):
                with pytest.raises(LevelUnavailableError):
                    d.popitem()
            assert len(d) == 25
            server.start()
            assert len(d) == 25
            assert d.popitem() == (24, "v24") and d.popitem() == (23, "v23")
            assert list(d.items()) == [(i, f"v{i}") for i in range(23)]
    finally:
        server.cleanup()


def test_lists_hold_no_chunk_outside_the_heap_budget(tmp_path):
    # Regression: each list kept the last chunk it wrote (to know it again on the next append),
    # alive after the heap evicted it: 60 lists of 255 elements of 1 kB held about 16 MB
    # (tracemalloc) with a 2 MB heap, outside its count. The chunk's id() is kept instead.
    import gc
    import tracemalloc

    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

    budget = 2 << 20
    config = CacheConfig(heap=HeapConfig(max_bytes=budget),
                         levels=(DiskConfig(path=str(tmp_path)),), namespace="budget")
    with CacheManager(config) as m:
        lists = [m.list(f"l{i}") for i in range(60)]
        tracemalloc.start()
        try:
            for lst in lists:
                lst.extend(bytes(1000) + bytes([j]) for j in range(255))
            m.flush()
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert m.stats()["levels"]["heap"]["bytes"] <= budget
        assert held < 2 * budget, f"{held / 2**20:.1f} MB held with a {budget >> 20} MB heap"
        assert all(lst[254] == bytes(1000) + bytes([254]) for lst in lists)


def test_a_structure_nested_in_a_partition_scope_opens_again(tmp_path):
    # Regression: reading a reference to a structure nested in a Spark partition scope's state
    # went open_structure -> scope.structure -> open_structure ... until RecursionError whenever
    # the nested structure's object was not alive, which is every time in the next task (each
    # task makes a new scope).
    import gc

    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    from mlcache.integrations.spark._scope import PartitionScope
    from mlcache.structures import CacheableList, CacheableSet

    config = CacheConfig(heap=HeapConfig(max_entries=8, max_bytes=None),
                         levels=(DiskConfig(path=str(tmp_path)),), namespace="scope")
    with CacheManager(config) as m:
        scope = PartitionScope(m, "st", 0, None, "task-1")
        state = scope.dict("risk")
        history = CacheableList.open(scope, "history")
        history.extend([1, 2])
        seen = CacheableSet.open(scope)
        seen.add("a")
        state["card"] = history
        state["seen"] = seen
        del history, seen
        gc.collect()
        assert state["card"].copy() == [1, 2] and state["seen"] == {"a"}
        m.flush()
        later = PartitionScope(m, "st", 0, None, "task-2").dict("risk")
        later["card"].append(3)
        assert later["card"].copy() == [1, 2, 3] and "a" in later["seen"]
