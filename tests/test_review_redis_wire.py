"""Review (F5): the hand-written MGET reader against a real redis-server -- values that look
like protocol, empty values, nulls, sizes around the read size, many threads on one pool --
and the pooled connection stays in step for the next command."""
from __future__ import annotations

import threading

import redis

from mlcache.levels._resp import _RECV, request_values


def _mget(keys):
    parts = [b"MGET", *keys]
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


TRICKY = [b"", b"\r\n", b"$-1\r\n", b"*2\r\n$1\r\na\r\n", b"-ERR x\r\n", b"_\r\n", b"\r", b"\n",
          b"$3\r\nabc", b"\x00" * 7, b"x" * (_RECV - 20), b"y" * (_RECV - 1), b"z" * _RECV,
          b"w" * (_RECV + 1), b"\r\n" * (_RECV // 2 + 3), b"v" * (3 * _RECV + 5)]


def test_values_that_look_like_protocol_and_sizes_round_trip(redis_url):
    client = redis.Redis.from_url(redis_url, max_connections=1)
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    keys = [b"k%d" % i for i in range(len(TRICKY))]
    client.mset(dict(zip(keys, TRICKY)))
    # every mix: with nulls between, single values, reversed
    asks = [keys, keys[::-1], [b"missing", *keys, b"missing2"], *([k] for k in keys),
            [b"m1", b"m2"], [keys[1], b"m", keys[2]]]
    want = dict(zip(keys, TRICKY))
    for ask in asks:
        assert request_values(client, _mget(ask)) == [want.get(k) for k in ask]
        # the one pooled connection is in step: the next command reads its own reply
        assert client.echo(b"in step") == b"in step"


def test_error_reply_keeps_connection_in_step(redis_url):
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    client.set(b"a", b"1")
    try:
        request_values(client, b"*1\r\n$4\r\nMGET\r\n")   # wrong number of arguments
    except redis.ResponseError:
        pass
    else:
        raise AssertionError("no error")
    assert client.get(b"a") == b"1"
    assert request_values(client, _mget([b"a"])) == [b"1"]


def test_threads_share_a_pool(redis_url):
    pool = redis.ConnectionPool.from_url(redis_url, max_connections=4)
    client = redis.Redis(connection_pool=pool)
    for t in range(4):
        client.mset({b"t%d-%d" % (t, i): b"%d:%d" % (t, i) * (i % 50) for i in range(200)})
    errors = []

    def work(t):
        try:
            keys = [b"t%d-%d" % (t, i) for i in range(200)]
            for _ in range(50):
                got = request_values(client, _mget(keys))
                assert got == [b"%d:%d" % (t, i) * (i % 50) for i in range(200)]
        except BaseException as exc:   # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_server_side_kill_raises_and_next_call_reconnects(redis_url):
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    client.set(b"a", b"1")
    assert request_values(client, _mget([b"a"])) == [b"1"]
    other = redis.Redis.from_url(redis_url)
    other.client_kill_filter(_type="normal", skipme=True)
    other.close()
    try:
        got = request_values(client, _mget([b"a"]))
    except redis.ConnectionError:
        got = request_values(client, _mget([b"a"]))
    assert got == [b"1"]
    assert client.get(b"a") == b"1"


def test_put_many_any_bytes_past_the_iovec_limit_then_get_many(redis_url):
    from mlcache.codec import Encoded
    from mlcache.config import RedisConfig
    from mlcache.levels.redis import RedisLevel

    level = RedisLevel(RedisConfig(url=redis_url, prefix="review"))
    n = 1500   # > 512 buffers per sendmsg and > IOV_MAX (1024)
    items = []
    for i in range(n):
        key = b"\r\n$%d\x00*" % i
        value = TRICKY[i % len(TRICKY)] if i % 3 else b""
        if i % 7 == 0:
            value = Encoded([b"\x01", b"", value, b"\r\n"])
        items.append((key, value))
    level.put_many(items)
    want = [bytes(v) if isinstance(v, Encoded) else v for _, v in items]
    assert level.get_many([k for k, _ in items]) == want
    assert level.get_many([b"nope", items[5][0]]) == [None, want[5]]
