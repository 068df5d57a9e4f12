"""Review s15: held values (mlcache._loans) across the manager's API and the structures,
against a plain dict of expected values, with heaps of 1-8 entries (or a few hundred bytes) so
that every value is evicted and read back: values held across other calls, changed after their
eviction, dropped (gc.collect()), one object under two keys, keys deleted or overwritten while
their old value is held, flush/checkpoint/close and reopen. (Prefetching is
tests/test_review_prefetch_s15.py's.)"""
from __future__ import annotations

import copy
import gc
import random
import uuid

import pytest

from mlcache import ArenaConfig, CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig


def _config(tmp_path, redis_url, layout, policy="lru", entries=4, nbytes=None):
    ns = "rl" + uuid.uuid4().hex[:8]
    heap = HeapConfig(policy=policy, max_entries=None if nbytes else entries, max_bytes=nbytes)
    path = tmp_path / uuid.uuid4().hex[:6]
    if layout == "disk":
        levels = (DiskConfig(path=str(path)),)
    elif layout == "redis":
        levels = (RedisConfig(url=redis_url, prefix=ns),)
    elif layout == "redis-disk":
        levels = (RedisConfig(url=redis_url, prefix=ns, max_bytes=3000),
                  DiskConfig(path=str(path)))
    else:
        levels = (ArenaConfig(max_bytes=24000, block_size=64, buffer_size=512),
                  DiskConfig(path=str(path)))
    return CacheConfig(heap=heap, levels=levels, namespace=ns)


def _lent(m):
    return m.stats()["levels"]["heap"]["lent"]


# -- one object under two keys, dropped --------------------------------------------------------

@pytest.mark.parametrize("layout", ["disk", "redis-disk"])
def test_an_object_lent_under_two_keys_is_let_go_once_the_caller_drops_it(
        tmp_path, redis_url, layout):
    """Copying a value to a second key (v = get(a); put(b, v)) left both keys' loans alive
    for good once the heap evicted them: each loan's reference counted as "the caller holds
    it" in the other's look, so no flush ever forgot them (1,996 lent objects after copying
    1,000 values and dropping every one; 3,996 for 1,000 objects put under two keys each)."""
    config = _config(tmp_path, redis_url, layout)
    with CacheManager(config) as m:
        m.put_many({("src", i): [i] for i in range(200)})
        m.flush()
        for i in range(200):
            v = m.get(("src", i))
            m.put(("dst", i), v)
        for i in range(200):
            w = [i, i]
            m.put(("a", i), w)
            m.put(("b", i), w)
        del v, w
        gc.collect()
        m.flush()
        assert _lent(m) <= 8     # at most what the heap's entries still share
        # still a dict's semantics while held: one object, both keys, a change to it is kept
        shared = m.get(("src", 7))
        m.put(("dst", 7), shared)
        for i in range(20):
            m.put(("other", i), [i])
        shared.append("x")
        gc.collect()
        m.flush()
        assert m.get(("src", 7)) == [7, "x"] and m.get(("dst", 7)) == [7, "x"]
        assert m.get(("src", 7)) is shared
        del shared
    with CacheManager(config) as again:
        assert again.get(("src", 7)) == [7, "x"] == again.get(("dst", 7))
        assert again.get(("a", 3)) == [3, 3] == again.get(("b", 3))
