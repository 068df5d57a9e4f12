"""The Redis level's batched read (``get_many``): its MGET is packed by the level, sent and
read on a pooled connection; the replies, errors and retries are redis-py's."""
from __future__ import annotations

import pytest
import redis

from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
from mlcache.errors import LevelUnavailableError
from mlcache.levels.redis import RedisLevel, _mget_packed


def test_mget_packed_is_the_redis_protocol():
    assert _mget_packed([b"a", b"bc", b""]) == (
        b"*4\r\n$4\r\nMGET\r\n$1\r\na\r\n$2\r\nbc\r\n$0\r\n\r\n")


def test_get_many_equals_redis_py_mget(redis_url):
    level = RedisLevel(RedisConfig(url=redis_url, prefix="mget"))
    try:
        items = [(b"k%d" % i, bytes([i % 256]) * (i % 7)) for i in range(2500)]
        level.put_many(items)
        keys = [k for k, _ in items] + [b"missing", b"k\r\n$3\r\n", b"\x00\xff"]
        client = redis.Redis.from_url(redis_url)
        want = client.mget([level.prefix + k for k in keys])
        client.close()
        for n in (1, 100, 1000, len(keys)):   # one MGET, and the chunked pipeline beyond
            assert level.get_many(keys[-n:]) == want[-n:]
        assert level.get_many([]) == []
    finally:
        level.close()


def test_get_many_after_the_server_dropped_the_connection(redis_url):
    level = RedisLevel(RedisConfig(url=redis_url, prefix="mget", retries=2))
    try:
        level.put_many([(b"a", b"1"), (b"b", b"2")])
        assert level.get_many([b"a", b"b", b"c"]) == [b"1", b"2", None]
        admin = redis.Redis.from_url(redis_url)
        admin.client_kill_filter(_type="normal", skipme=True)   # the level's pooled socket
        admin.close()
        assert level.get_many([b"a", b"b", b"c"]) == [b"1", b"2", None]
    finally:
        level.close()


def test_error_reply_is_raised_and_the_connection_stays_usable(redis_url):
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser("nomget", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-mget"])
    try:
        url = redis_url.replace("redis://", "redis://nomget:pw@", 1)
        level = RedisLevel(RedisConfig(url=url, prefix="mget"))
        try:
            with pytest.raises(LevelUnavailableError, match="(?i)mget|perm"):
                level.get_many([b"a", b"b"])
            level.put_many([(b"a", b"1")])   # the connection read the whole error reply
            admin.acl_setuser("nomget", enabled=True, passwords=["+pw"], keys=["*"],
                              commands=["+@all"])
            assert level.get_many([b"a", b"b"]) == [b"1", None]
        finally:
            level.close()
    finally:
        admin.acl_deluser("nomget")
        admin.close()


def test_manager_batched_miss_through_redis(redis_url, unique_ns):
    cfg = CacheConfig(heap=HeapConfig(max_entries=1000, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns),), namespace=unique_ns)
    values = {("card", i): {"n": i, "xs": [i, i + 0.5]} for i in range(300)}
    with CacheManager(cfg) as m:
        m.put_many(values)
    with CacheManager(cfg) as m:
        keys = list(values) + [("card", -1)]
        assert m.get_many(keys) == values
        st = m.stats()["levels"]
        assert st["heap"]["misses"] == len(keys)
        assert st[m._level_names[0]]["keys_loaded"] == len(values)
        assert m.get_many(keys) == values            # now heap hits
        assert m.stats()["levels"]["heap"]["hits"] == len(values)
