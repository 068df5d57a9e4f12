"""The Redis level's batched read (``get_many``): its MGET is packed by the level, sent and
read on a pooled connection; the replies, errors and retries are redis-py's."""
from __future__ import annotations

import socket
import time

import pytest
import redis
from hypothesis import given, strategies as st

from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
from mlcache.errors import LevelUnavailableError
from mlcache.levels._resp import read_values, request_values
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
        assert st[m._cold.level_names[0]]["keys_loaded"] == len(values)
        assert m.get_many(keys) == values            # now heap hits
        assert m.stats()["levels"]["heap"]["hits"] == len(values)


# -- the reply reader (mlcache.levels._resp) ---------------------------------------------------

class _Sock:
    """A socket stand-in that hands out ``data`` in pieces of ``step`` bytes (the reader's
    parsing across partial reads, without a server)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step = data, step

    def recv(self, n: int, flags: int = 0) -> bytes:
        chunk, self.data = self.data[:min(n, self.step)], self.data[min(n, self.step):]
        return chunk

    def recv_into(self, view) -> int:
        chunk = self.recv(len(view))
        view[:len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1 << 20])
def test_reader_parses_across_partial_reads(step):
    values = [b"", b"a\r\n$3\r\nxyz", None, b"\x00" * 100_000, b"tail"]
    for null in (b"$-1\r\n", b"_\r\n"):   # RESP2 and RESP3 nulls
        wire = b"*%d\r\n" % len(values) + b"".join(
            null if v is None else b"$%d\r\n%b\r\n" % (len(v), v) for v in values)
        assert read_values(_Sock(wire, step)) == values


@pytest.mark.parametrize("wire, error", [
    (b"-NOPERM no mget for you\r\n", redis.ResponseError),
    (b"*2\r\n$1\r\na\r\n", redis.ConnectionError),            # closed mid-reply
    (b"*1\r\n$1\r\nab\r\n", redis.InvalidResponse),           # a value longer than said
    (b"*1\r\n:5\r\n", redis.InvalidResponse),                 # not a bulk string
    (b"*1\r\n$1\r\na\r\n>2\r\n", redis.InvalidResponse),      # bytes after the reply
    (b"$1\r\na\r\n", redis.InvalidResponse),                  # not an array
    (b"*1\r\n$x\r\n", ValueError),
])
def test_reader_refuses_what_is_not_an_mget_reply(wire, error):
    with pytest.raises(error):
        read_values(_Sock(wire, 5))


def test_level_reads_large_values_and_both_protocols(redis_url):
    for protocol in (2, 3):
        url = redis_url + ("&" if "?" in redis_url else "?") + f"protocol={protocol}"
        level = RedisLevel(RedisConfig(url=url, prefix="mget"))
        try:
            items = [(b"big", b"\r\n" * (3 << 19)), (b"small", b"s"), (b"e", b"")]
            level.put_many(items)
            keys = [b"big", b"none", b"small", b"e", b"big"]
            want = [b"\r\n" * (3 << 19), None, b"s", b"", b"\r\n" * (3 << 19)]
            for _ in range(3):   # the connection stays usable, in step
                assert level.get_many(keys) == want
        finally:
            level.close()


def test_request_values_leaves_a_push_first_to_redis_py(redis_url):
    """A RESP3 push waiting before the reply (here a client-side-caching invalidation) is
    redis-py's to read: the reader peeks, sees it is not the reply, and hands over."""
    client = redis.Redis.from_url(redis_url, protocol=3)
    other = redis.Redis.from_url(redis_url)
    try:
        client.set(b"mget:a", b"1")
        conn = client.connection_pool.get_connection()
        conn.send_command("CLIENT", "TRACKING", "ON")
        assert conn.read_response() in (b"OK", "OK")
        conn.send_command("GET", b"mget:a")
        assert conn.read_response() == b"1"
        client.connection_pool.release(conn)
        other.set(b"mget:a", b"2")          # the server pushes an invalidation to conn
        sock = conn._sock
        timeout = sock.gettimeout()
        for _ in range(100):                 # until it is on the socket (not read by redis-py)
            try:
                sock.setblocking(False)
                if sock.recv(1, socket.MSG_PEEK) == b">":
                    break
            except BlockingIOError:
                time.sleep(0.01)
            finally:
                sock.settimeout(timeout)
        else:
            raise AssertionError("no push arrived")
        got = request_values(client, _mget_packed([b"mget:a", b"mget:zz"]))
        assert got == [b"2", None]
        assert request_values(client, _mget_packed([b"mget:a"])) == [b"2"]
    finally:
        client.close()
        other.close()


@given(st.lists(st.one_of(st.none(), st.binary(max_size=12),
                          st.sampled_from([b"\r\n", b"$1\r\nz", b"a\r\n$0", b"\r\n\r\n", b"$-1"]),
                          st.lists(st.sampled_from([b"$", b"\r\n", b"-1", b"2", b"x"]),
                                   max_size=6).map(b"".join)),
                max_size=12),
       st.sampled_from([b"$-1\r\n", b"_\r\n"]), st.sampled_from([1, 5, 1 << 16]))
def test_reader_returns_exactly_the_values_sent(values, null, step):
    """Whatever the values (CRLFs and protocol-looking bytes inside, nulls anywhere), the
    reader -- its one-split fast path or its loop -- returns exactly what was sent."""
    wire = b"*%d\r\n" % len(values) + b"".join(
        null if v is None else b"$%d\r\n%b\r\n" % (len(v), v) for v in values)
    assert read_values(_Sock(wire, step)) == values
