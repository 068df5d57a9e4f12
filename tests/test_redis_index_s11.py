"""The Redis level lists a prefix from its listing index, not by a SCAN of the whole database.

The index is one sorted set beside the data (``prefix + "\\x00keys"``), every stored key a
member (``b"k" + key``), kept in the same transaction as the writes, deletes, evictions and
releases that change the keys; a listing reads a lexicographic range of it and skips (and
removes) a member whose key is gone. Data written before the index existed is added by one
``SCAN`` of the level the first time it is listed; the empty member (the sentinel) then says
the index is complete.

Each test compares a listing with the keys actually stored (a raw ``SCAN``) and the index
with the listing (no member left for a key that is gone).
"""
from __future__ import annotations

import pytest
import redis

from mlcache import CacheConfig, CacheManager, RedisConfig
from mlcache.errors import LevelUnavailableError
from mlcache.levels.redis import RedisLevel


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def _stored(url: str, prefix: str) -> set[bytes]:
    """The keys stored under the level's prefix, by a raw SCAN (what a listing must give)."""
    client = _client(url)
    try:
        head = prefix.encode() + b":"
        return {k[len(head):] for k in client.scan_iter(match=head + b"*", count=1000)}
    finally:
        client.close()


def _index(url: str, prefix: str) -> set[bytes]:
    client = _client(url)
    try:
        return set(client.zrange(prefix.encode() + b"\x00keys", 0, -1))
    finally:
        client.close()


def _scans(url: str) -> int:
    client = _client(url)
    try:
        return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))
    finally:
        client.close()


def _exact(level: RedisLevel, url: str, prefix: str, ns: bytes = b"n\x1f") -> set[bytes]:
    """The level's listing of ``ns`` and of everything, checked against what is stored, and
    the index holding exactly the stored keys (and the sentinel, once built)."""
    stored = _stored(url, prefix)
    assert set(level.scan(b"")) == stored
    listed = set(level.scan(ns))
    assert listed == {k for k in stored if k.startswith(ns)}
    assert _index(url, prefix) == {b""} | {b"k" + k for k in stored}
    return listed


@pytest.fixture(params=[None, 4_000], ids=["unbounded", "bounded"])
def level(request, redis_url, unique_ns):
    lv = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=request.param))
    yield lv
    lv.close()


def test_listing_is_exact_after_puts_and_deletes(level, redis_url, unique_ns):
    assert set(level.scan(b"n\x1f")) == set()
    level.put_many([(b"n\x1f%d" % i, b"v") for i in range(20)] +
                   [(b"m\x1f%d" % i, b"v") for i in range(5)] + [(b"n", b"no separator")])
    assert _exact(level, redis_url, unique_ns) == {b"n\x1f%d" % i for i in range(20)}
    level.delete_many([b"n\x1f%d" % i for i in range(0, 20, 2)] + [b"m\x1f0", b"absent\x1f"])
    level.put(b"n\x1f3", b"rewritten")
    assert _exact(level, redis_url, unique_ns) == {b"n\x1f%d" % i for i in range(1, 20, 2)}
    assert set(level.scan(b"n\x1f1")) == {b"n\x1f1", *(b"n\x1f1%d" % i for i in range(1, 10, 2))}
    assert set(level.scan(b"n")) == {b"n", *(b"n\x1f%d" % i for i in range(1, 20, 2))}
    assert set(level.scan(b"m\x1f")) == {b"m\x1f%d" % i for i in range(1, 5)}


def test_listing_pages_through_a_large_prefix_between_others(redis_url, unique_ns):
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns))
    try:
        level.put_many([(b"b\x1f%05d" % i, b"v") for i in range(2_500)])
        level.put_many([(b"a\x1f%d" % i, b"v") for i in range(1_200)] +
                       [(b"c\x1f%d" % i, b"v") for i in range(1_200)] + [(b"b\xff", b"v")])
        listed = list(level.scan(b"b\x1f"))
        assert sorted(listed) == [b"b\x1f%05d" % i for i in range(2_500)]   # each once
        assert len(list(level.scan(b""))) == 4_901
    finally:
        level.close()


def test_a_listing_does_not_scan_the_database_once_the_index_is_built(redis_url, unique_ns):
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns))
    try:
        level.put_many([(b"s\x1f%d" % i, b"v") for i in range(10)])
        assert len(list(level.scan(b"s\x1f"))) == 10         # builds the index: one SCAN
        level.put_many([(b"o%d\x1f1" % i, b"v") for i in range(5_000)])
        before = _scans(redis_url)
        for name in (b"s\x1f", b"o7\x1f", b"new\x1f", b""):
            list(level.scan(name))
        assert _scans(redis_url) == before
    finally:
        level.close()


def test_bounded_evictions_leave_the_index(redis_url, unique_ns):
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
    try:
        level.put_many([(b"n\x1fa%d" % i, b"x" * 100) for i in range(10)])
        victims = level.put_many([(b"n\x1fb", b"y" * 300)])
        assert [k for k, _ in victims] == [b"n\x1fa0", b"n\x1fa1", b"n\x1fa2"]
        assert _exact(level, redis_url, unique_ns) == {b"n\x1fb",
                                                       *(b"n\x1fa%d" % i for i in range(3, 10))}
        victims = level.put_many([(b"n\x1fhuge", b"z" * 2_000)])     # passed through
        assert b"n\x1fhuge" in dict(victims)
        assert b"n\x1fhuge" not in _exact(level, redis_url, unique_ns)
    finally:
        level.close()


def test_held_victims_are_listed_until_released(redis_url, unique_ns):
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
    level.hold_victims()
    try:
        level.put_many([(b"n\x1fa%d" % i, b"x" * 100) for i in range(10)])
        victims = level.put_many([(b"n\x1fb", b"y" * 300)])
        held = {k for k, _ in victims}
        assert held == {b"n\x1fa0", b"n\x1fa1", b"n\x1fa2"}
        assert held <= _exact(level, redis_url, unique_ns)          # still stored: listed
        _client(redis_url).script_flush()      # both scripts loaded again on demand
        level.release(victims)
        assert not held & _exact(level, redis_url, unique_ns)
        victims = level.put_many([(b"n\x1fc", b"w" * 300)])
        level.release(victims, remove=False)   # the level below failed: they stay, listed
        assert {k for k, _ in victims} <= _exact(level, redis_url, unique_ns)
    finally:
        level.close()


def test_a_write_cut_short_leaves_nothing_the_index_misses(redis_url, unique_ns):
    # Redis closes the connection on a value over its proto-max-bulk-len, here in the middle
    # of the write's transaction (the index's ZADD and part of the MSET sent): nothing of it
    # is applied, neither the keys nor their members
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, retries=0))
    client = _client(redis_url)
    limit = client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    try:
        level.put_many([(b"n\x1fkept", b"v")])
        client.config_set("proto-max-bulk-len", 1 << 20)
        with pytest.raises(LevelUnavailableError):
            level.put_many([(b"n\x1fsmall", b"v"), (b"n\x1fbig", b"x" * (2 << 20))])
        client.config_set("proto-max-bulk-len", limit)
        assert _exact(level, redis_url, unique_ns) == {b"n\x1fkept"}
        # a member whose key is not stored (a writer cut short between the two, were they
        # not one transaction) is skipped by listings, and removed by them
        client.zadd(unique_ns.encode() + b"\x00keys", {b"kn\x1fghost": 0})
        assert set(level.scan(b"n\x1f")) == {b"n\x1fkept"}
        assert b"kn\x1fghost" not in _index(redis_url, unique_ns)
    finally:
        client.config_set("proto-max-bulk-len", limit)
        client.close()
        level.close()


def test_data_stored_before_the_index_is_listed(redis_url, unique_ns):
    # written by an older version (no index), or the index lost: one SCAN builds it
    client = _client(redis_url)
    try:
        head = unique_ns.encode() + b":"
        client.mset({head + b"n\x1f%d" % i: b"v" for i in range(30)})
        level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns))
        try:
            level.put_many([(b"n\x1fnew", b"v")])               # the index exists, unbuilt
            assert _exact(level, redis_url, unique_ns) == \
                {b"n\x1fnew", *(b"n\x1f%d" % i for i in range(30))}
            client.delete(unique_ns.encode() + b"\x00keys")     # lost: built again
            assert len(set(level.scan(b"n\x1f"))) == 31
            assert _index(redis_url, unique_ns) == \
                {b"", *(b"k" + k for k in _stored(redis_url, unique_ns))}
        finally:
            level.close()
    finally:
        client.close()


def test_two_managers_on_one_prefix_list_each_others_keys(redis_url, unique_ns):
    def manager() -> CacheManager:
        return CacheManager(CacheConfig(levels=(RedisConfig(url=redis_url, prefix=unique_ns),),
                                        namespace="shared"))

    with manager() as a, manager() as b:
        sa, sb = a.namespace("s"), b.namespace("s")
        assert sorted(sb.keys()) == []                           # b builds the index first
        sa.put_many((i, i) for i in range(50))
        a.flush()
        assert sorted(sb.keys()) == list(range(50))
        sb.delete_many(range(0, 50, 2))
        b.flush()
        sb.put("new", 1)
        b.flush()
        expect = sorted([*range(1, 50, 2), "new"], key=str)
        with manager() as c:     # (a still holds the deleted keys in its heap)
            assert sorted(c.namespace("s").keys(), key=str) == expect
        level = a._levels[0]
        assert sorted(level.scan(sa._prefix)) == sorted(sa._kb(k) for k in expect)
        assert sorted(a.keys()) == sorted(b.keys()) == []


def test_an_error_inside_the_write_transaction_is_raised(redis_url, unique_ns):
    # the replies of a write are read by _resp.read_replies: an error in the EXEC's array
    # (here the index's ZADD on a key that is no sorted set) is raised, not dropped
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, retries=0))
    client = _client(redis_url)
    try:
        client.set(unique_ns.encode() + b"\x00keys", b"not a sorted set")
        with pytest.raises(LevelUnavailableError, match="WRONGTYPE"):
            level.put_many([(b"n\x1fa", b"v")])
        with pytest.raises(LevelUnavailableError, match="WRONGTYPE"):
            level.delete_many([b"n\x1fa"])
        client.delete(unique_ns.encode() + b"\x00keys")
        level.put_many([(b"n\x1fa", b"v")])
        assert _exact(level, redis_url, unique_ns) == {b"n\x1fa"}
    finally:
        client.close()
        level.close()
