"""A value the caller holds is still the key's value after the heap evicted it
(mlcache._loans): a change made to it in place is written, and a read returns the same object,
as a Python dict would. Regression for CI's failure of test_eight_threads_against_a_model
(2026-11-27): another thread's put evicted an entry between a get and the append to it, and the
append was lost."""
from __future__ import annotations

import gc
import threading
import uuid

import pytest

from mlcache import ArenaConfig, CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig

POLICIES = ["lru", "clock", "wtinylfu", "tac"]   # (belady needs the whole trace in advance)


def _layouts(tmp_path, redis_url, policy):
    ns = "held" + uuid.uuid4().hex[:8]
    heap = HeapConfig(policy=policy, max_entries=3, max_bytes=None)
    yield "disk", CacheConfig(heap=heap, levels=(DiskConfig(path=str(tmp_path / "d")),),
                              namespace=ns)
    yield "redis-disk", CacheConfig(
        heap=heap, levels=(RedisConfig(url=redis_url, prefix=ns, max_bytes=2000),
                           DiskConfig(path=str(tmp_path / "rd"))), namespace=ns)
    yield "arena-disk", CacheConfig(
        heap=heap, levels=(ArenaConfig(max_bytes=24000, block_size=64, buffer_size=512),
                           DiskConfig(path=str(tmp_path / "ad"))), namespace=ns)


LAYOUTS = ["disk", "redis-disk", "arena-disk"]


def _config(tmp_path, redis_url, policy, layout):
    return dict(_layouts(tmp_path, redis_url, policy))[layout]


def _evict(m, key):
    """Read and write other keys until ``key`` has left the heap."""
    for i in range(200):
        if m._kb(key) not in m._data:
            return
        m.put(("other", i % 8), [i])
        for _ in range(4):   # frequent enough for W-TinyLFU's admission to prefer them
            m.get(("other", i % 8))
    raise AssertionError(f"{key!r} never left the heap")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("flushed", [True, False], ids=["clean", "dirty"])
def test_a_change_to_a_held_value_after_its_eviction_is_kept(tmp_path, redis_url, policy,
                                                             layout, flushed):
    config = _config(tmp_path, redis_url, policy, layout)
    with CacheManager(config) as m:
        m.put("card", [1])
        if flushed:
            m.flush()
        held = m.get("card")
        _evict(m, "card")
        held.append(2)                       # in place, never put back
        assert m.get("card") == [1, 2]
        assert m.get("card") is held         # the same object, as a dict gives
        _evict(m, "card")
        held.append(3)
        m.flush()
        assert m.get_many(["card"]) == {"card": [1, 2, 3]}
    with CacheManager(config) as again:
        assert again.get("card") == [1, 2, 3]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_change_made_while_held_is_written_by_the_flush_after_the_caller_let_go(
        tmp_path, redis_url, layout):
    config = _config(tmp_path, redis_url, "lru", layout)
    with CacheManager(config) as m:
        m.put("a", {"n": 1})
        m.flush()
        value = m.get("a")
        _evict(m, "a")
        value["n"] = 2
        del value                            # dropped before anything compared it
        m.flush()
    with CacheManager(config) as again:
        assert again.get("a") == {"n": 2}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_victims_nobody_holds_are_not_kept(tmp_path, redis_url, layout):
    """The loans are bounded by what the caller holds: evicting thousands of entries nobody
    references keeps none of them, and a held one is forgotten once dropped and flushed."""
    config = _config(tmp_path, redis_url, "lru", layout)
    with CacheManager(config) as m:
        for i in range(2000):
            m.put(i, [i])
        m.flush()
        for i in range(2000):
            m.get(i)
        assert len(m._cold.loans) == 0
        held = [m.get(i) for i in range(50)]   # the last three are resident
        assert len(m._cold.loans) == 47
        del held
        gc.collect()
        m.flush()
        assert len(m._cold.loans) == 0


def test_a_held_value_replaced_by_a_put_is_no_longer_the_keys_value(tmp_path, redis_url):
    config = _config(tmp_path, redis_url, "lru", "disk")
    with CacheManager(config) as m:
        m.put("k", [1])
        old = m.get("k")
        _evict(m, "k")
        m.put("k", [9])
        old.append(2)                        # as with a dict: the old object is not d[k]
        _evict(m, "k")
        m.flush()
        assert m.get("k") == [9]
        m.delete("k")
        old.append(3)
        m.flush()
        assert m.get("k") is None


def test_a_value_heavier_than_the_heap_is_lent_and_its_change_written(tmp_path):
    """Never admitted (heavier than the whole heap), so the heap never held it: the change
    made to the returned object was lost before."""
    config = CacheConfig(heap=HeapConfig(policy="lru", max_bytes=64 << 10),
                         levels=(DiskConfig(path=str(tmp_path / "d")),), namespace="big")
    with CacheManager(config) as m:
        m.put("big", list(range(100_000)))
        m.flush()
        value = m.get("big")
        assert m._kb("big") not in m._data
        value.append(-1)
        assert m.get("big") is value
        m.flush()
    with CacheManager(config) as again:
        assert again.get("big")[-1] == -1


def test_a_held_value_changed_into_something_unencodable_is_reported(tmp_path, redis_url):
    from mlcache.errors import SerializationError

    config = _config(tmp_path, redis_url, "lru", "disk")
    m = CacheManager(config)
    m.put("k", [1])
    m.flush()
    held = m.get("k")
    _evict(m, "k")
    held.append(threading.Lock())        # pickle refuses a lock
    with pytest.raises(SerializationError, match="'k'"):
        m.flush()
    held.pop()
    m.flush()
    m.close()
    with CacheManager(config) as again:
        assert again.get("k") == [1]


def test_invalidate_local_writes_a_held_change_then_reads_below(tmp_path, redis_url):
    config = _config(tmp_path, redis_url, "lru", "redis-disk")
    with CacheManager(config) as m:
        m.put("k", [1])
        m.flush()
        held = m.get("k")
        _evict(m, "k")
        held.append(2)
        m.invalidate_local()
        assert m.get("k") == [1, 2]
        assert m.get("k") is not held        # forgotten: read again below
        assert len(m._cold.loans) == 0


def test_threads_evicting_each_others_values_lose_no_in_place_change(tmp_path, redis_url):
    """Each thread appends to values it holds while the others' puts evict them."""
    config = CacheConfig(heap=HeapConfig(policy="wtinylfu", max_entries=4, max_bytes=None),
                         levels=(RedisConfig(url=redis_url, prefix="th" + uuid.uuid4().hex[:6]),
                                 DiskConfig(path=str(tmp_path / "d"))),
                         namespace="threads", write_batch_size=4)
    m = CacheManager(config)
    barrier = threading.Barrier(4)
    errors: list = []

    def run(tid):
        try:
            barrier.wait()
            for step in range(200):
                key = (tid, step % 5)
                value = m.get(key)
                if value is None:
                    m.put(key, [step])
                    continue
                m.put((tid, "noise", step), step)   # may evict ``value``
                value.append(step)
                if step % 17 == 0:
                    m.flush()
        except BaseException as exc:   # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    m.close()
    with CacheManager(config) as again:
        for tid in range(4):
            for j in range(5):
                expected = [s for s in range(200) if s % 5 == j]
                assert again.get((tid, j)) == expected


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_change_to_a_value_put_many_evicted_in_the_same_call_is_kept(tmp_path, redis_url,
                                                                        policy, layout):
    """Regression (session 16): a value that ``put_many`` evicted within its own call was not
    lent, so a change the caller made to it afterwards through the mapping it still held was
    lost. Not only for a batch larger than the heap: W-TinyLFU (the default) refuses most of a
    fresh batch into a full heap at once, and a 1,000-entry heap lost 23 of 32 appends."""
    config = _config(tmp_path, redis_url, policy, layout)
    with CacheManager(config) as m:
        batch = {("b", i): [i] for i in range(12)}   # four times the heap
        m.put_many(batch)
        for v in batch.values():
            v.append("x")
        assert m.get_many(list(batch)) == {k: [k[1], "x"] for k in batch}
        for v in batch.values():
            v.append("y")
        m.flush()
    with CacheManager(config) as again:
        assert again.get_many(list(batch)) == {k: [k[1], "x", "y"] for k in batch}


def test_a_put_many_batch_nobody_holds_is_forgotten_at_the_next_look(tmp_path, redis_url):
    """The batch's own victims are lent while the call (and the caller's mapping) reference
    them; once the mapping is dropped the next look writes what changed and forgets them."""
    config = _config(tmp_path, redis_url, "lru", "disk")
    with CacheManager(config) as m:
        batch = {i: [i] for i in range(200)}
        m.put_many(batch)
        assert len(m._cold.loans) > 0
        batch[0].append("changed")   # evicted within the call, changed, then dropped
        del batch
        m.flush()
        assert len(m._cold.loans) == 0
        m.put_many({i: [i, "temporary"] for i in range(200, 400)})   # a temporary mapping
        m.flush()
        assert len(m._cold.loans) == 0
        got = m.get_many(range(400))
    assert got == {i: [i] + (["changed"] if i == 0 else []) + (["temporary"] if i >= 200
                                                                else []) for i in range(400)}


def test_a_lent_large_value_is_compared_without_a_pass_over_its_bytes(tmp_path, redis_url):
    """An unchanged lent value with a 1 MB payload is not written again at the flush (its
    encoding's pieces are the value's own bytes, compared by identity); a changed one is."""
    config = CacheConfig(heap=HeapConfig(policy="lru", max_bytes=3 << 20),
                         levels=(RedisConfig(url=redis_url, prefix="big" + uuid.uuid4().hex[:6]),
                                 DiskConfig(path=str(tmp_path / "d"))), namespace="big")
    payload = bytes(range(256)) * 4096          # 1 MiB
    with CacheManager(config) as m:
        for i in range(3):
            m.put(i, {"n": 0, "payload": payload})
        held = m.get(0)
        for i in range(3, 8):                    # dirty evictions, 0 among them, still held
            m.put(i, {"n": i, "payload": payload})
        assert m._kb(0) in m._cold.loans
        m.flush()
        written = m.stats()["levels"]["redis"]["keys_written"]
        detected = m.stats()["writeback"].get("mutations_detected", 0)
        m.flush()
        assert m.stats()["levels"]["redis"]["keys_written"] == written
        held["n"] = 1
        m.flush()
        assert m.stats()["writeback"]["mutations_detected"] == detected + 1
        assert m.stats()["levels"]["redis"]["keys_written"] == written + 1
    with CacheManager(config) as again:
        assert again.get(0)["n"] == 1


def test_stats_count_the_values_lent(tmp_path, redis_url):
    config = _config(tmp_path, redis_url, "lru", "disk")
    with CacheManager(config) as m:
        m.put("k", [1])
        held = m.get("k")
        _evict(m, "k")
        assert m.stats()["levels"]["heap"]["lent"] == 1
        del held
        m.flush()
        assert m.stats()["levels"]["heap"]["lent"] == 0
