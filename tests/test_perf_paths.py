"""The cheap paths of the miss and write-back paths keep their guarantees.

* a large clean value is remembered as its encoding (not hashed): an in-place change is still
  written back on eviction and on checkpoint, and a put or delete forgets it;
* a read that overlaps a write re-reads only the keys that write moved (``moved_since``);
* ``stats()`` does not count an unbounded Redis level's bytes on every call.
"""
from __future__ import annotations

import uuid

from mlcache import CacheConfig, CacheManager
from mlcache._readpath import Digests, digest, same_bytes
from mlcache.config import HeapConfig, RedisConfig
from mlcache.levels.redis import RedisLevel

BIG = 64 * 1024


def _cfg(redis_url: str, **heap) -> CacheConfig:
    ns = "p" + uuid.uuid4().hex[:8]
    return CacheConfig(heap=HeapConfig(**heap), namespace=ns,
                       levels=(RedisConfig(url=redis_url, prefix=ns),))


def test_digests_keep_large_encodings_within_budget_and_hash_the_rest():
    d = Digests(budget=3 * BIG)
    raws = {b"k%d" % i: bytes([i]) * BIG for i in range(5)}
    for kb, raw in raws.items():
        d.remember(kb, raw)
    kept = [kb for kb in raws if type(d.get(kb)) is bytes]
    assert kept == [b"k2", b"k3", b"k4"]              # the oldest were hashed
    assert d.get(b"k0") == digest(raws[b"k0"])
    for kb, raw in raws.items():
        assert same_bytes(d.get(kb), raw)
        assert not same_bytes(d.get(kb), raw[:-1] + b"\xff")
    d.pop(b"k3")
    d[b"k4"] = digest(raws[b"k4"])
    d.remember(b"small", b"x")
    assert d.get(b"small") == digest(b"x")
    assert d._raw_bytes == BIG and list(d._raw) == [b"k2"]
    d.clear()
    assert len(d) == 0 and d._raw_bytes == 0


def test_in_place_change_of_a_large_loaded_value_is_written_back(redis_url):
    cfg = _cfg(redis_url, max_entries=1, max_bytes=None)
    with CacheManager(cfg) as m:
        m.put("a", {"payload": b"x" * BIG, "n": 0})
        m.put("b", {"payload": b"y" * BIG, "n": 0})       # evicts a (dirty) to Redis
        m.flush()
        a = m.get("a")                                      # loaded clean, b evicted
        assert type(m._digests.get(m._kb("a"))) is bytes    # kept, not hashed
        a["n"] = 1                                          # changed in place, no put
        m.get("b")                                          # a evicted: written back
        m.flush()
        m.invalidate_local()
        assert m.get("a")["n"] == 1
        b = m.get("b")
        b["n"] = 2                                          # changed in place, stays resident
        m.checkpoint()
    with CacheManager(cfg) as m:
        assert m.get("a")["n"] == 1 and m.get("b")["n"] == 2


def test_put_after_get_forgets_the_kept_encoding(redis_url):
    cfg = _cfg(redis_url, max_entries=10, max_bytes=None)
    with CacheManager(cfg) as m:
        m.put("a", {"payload": b"x" * BIG})
        m.checkpoint()
        m.invalidate_local()
        value = m.get("a")
        kb = m._kb("a")
        assert kb in m._digests and m._digests._raw_bytes > 0
        value["more"] = 1
        m.put("a", value)
        assert kb not in m._digests and m._digests._raw_bytes == 0
        m.delete("a")
        assert m.get("a") is None


def test_moved_since_names_the_keys_of_overlapping_writes(redis_url):
    with CacheManager(_cfg(redis_url, max_entries=100, max_bytes=None)) as m:
        wb = m._wb
        seq = wb.wseq
        assert wb.moved_since(seq) == set()
        for i in range(3):
            m.put(i, i)
        m.flush()
        assert wb.moved_since(seq) >= {m._kb(i) for i in range(3)}
        later = wb.wseq
        m.delete(7)
        m.flush()
        assert wb.moved_since(later) == {m._kb(7)}
        wb._wlog_floor = wb.wseq + 1                    # history forgotten: unknown
        assert wb.moved_since(later) is None


def test_stats_reuse_an_unbounded_redis_levels_byte_count(redis_url):
    with CacheManager(_cfg(redis_url, max_entries=100, max_bytes=None)) as m:
        m.put("a", "x" * 100)
        m.flush()
        first = m.stats()["levels"]["redis"]["used_bytes"]
        assert first > 100
        calls = []
        level = m._levels[0]
        exact = level.used_bytes
        level.used_bytes = lambda: calls.append(1) or exact()   # type: ignore[method-assign]
        for _ in range(5):
            assert m.stats()["levels"]["redis"]["used_bytes"] == first
        assert not calls
        level._used_cache = None
        m.stats()
        assert calls == [1]
    bounded = RedisLevel(RedisConfig(url=redis_url, prefix="b" + uuid.uuid4().hex[:6],
                                     max_bytes=10_000))
    bounded.put_many([(b"k", b"v" * 10)])
    assert bounded.used_bytes_estimate() == 10
    bounded.put_many([(b"k2", b"v" * 5)])
    assert bounded.used_bytes_estimate() == 15
    bounded.close()
