"""Session 16 review: faults injected into the Redis level's read paths (split reads, the
pipelined MGET, the fetch threads) against a real redis-server, and what the caller sees.
Regression tests for the defects found."""
from __future__ import annotations

import time
import uuid

import pytest

from mlcache import CacheConfig, CacheManager, HeapConfig, PrefetchConfig, RedisConfig
from mlcache.config import RedisConfig as _RedisConfig
from mlcache.levels.redis import RedisLevel
from mlcache.prefetch import prefetching


def _ns() -> str:
    return "f" + uuid.uuid4().hex[:10]


def test_a_reply_that_came_in_time_is_not_failed_when_taken_in_polls_far_apart(redis_url):
    # Regression: PendingValues timed a split read out at socket_timeout after the request,
    # even while its reply was arriving. A reply of several socket reads (16 values of 20 KB:
    # 64 KiB a poll) is taken a read per poll, and the operator polls every 4th record: with
    # records slower than the timeout allows, every such read failed as "Timeout reading from
    # socket" though the server had answered at once, and its records read their keys again.
    # The timeout now counts the time the server sends nothing, as redis-py's does.
    level = RedisLevel(_RedisConfig(url=redis_url, prefix=_ns(), socket_timeout=0.1, retries=0))
    try:
        keys = [b"k%d" % i for i in range(16)]
        values = [bytes([i]) * 20_000 for i in range(16)]
        level.put_many(list(zip(keys, values)))
        pending = level.start_get_many(keys)
        assert pending is not None
        got = None
        polls = 0
        while got is None:
            time.sleep(0.15)        # longer than the timeout: the records between two polls
            got = pending.poll()    # (raised TimeoutError at the second poll)
            polls += 1
        assert got == values and polls > 2
    finally:
        level.close()


def test_records_slower_than_the_timeout_still_take_their_split_reads(redis_url):
    # the same through the operator: values of 20 KB, records of 30 ms, a timeout of 0.2 s
    ns = _ns()
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=64, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=ns, socket_timeout=0.2),),
                      namespace=ns, prefetch=PrefetchConfig())
    with CacheManager(cfg) as m:
        m.put_many({("k", k): bytes([k]) * 20_000 for k in range(48)})
        m.flush()
        m.put_many({("f", i): i for i in range(64)})      # the heap holds none of them
        m.flush()
        for k in prefetching(list(range(48)), key=lambda k: ("k", k), cache=m, depth=24):
            assert m.get(("k", k)) == bytes([k]) * 20_000
            time.sleep(0.03)
        st = m.stats()["prefetch"]
    assert st["split_reads"] >= 2 and st["failures"] == 0
