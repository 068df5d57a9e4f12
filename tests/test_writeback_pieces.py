"""Large write-backs in pieces: ``Codec.encode_parts`` references the value's large bytes
instead of copying them, the Redis level sends the pieces as they are, every other consumer
sees the same bytes ``Codec.encode`` gives (joined), signatures included."""
from __future__ import annotations

import os
import time
import uuid

import pytest
import redis
from hypothesis import given, settings, strategies as st

from mlcache import CacheConfig, CacheManager
from mlcache.codec import Codec, Encoded
from mlcache.config import DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import CapacityError, IntegrityError, LevelUnavailableError
from mlcache.levels import redis as redis_level
from mlcache.levels.redis import RedisLevel

KEY = b"k" * 32
BIG = [os.urandom(300_000), os.urandom(70_000), os.urandom(1 << 20)]
small = st.one_of(st.none(), st.integers(), st.text(max_size=6), st.binary(max_size=6),
                  st.tuples(st.integers(), st.text(max_size=3)),
                  st.frozensets(st.integers(), max_size=3))
blob = st.sampled_from(BIG)
item = st.one_of(small, blob)
values = st.one_of(
    blob,
    st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), st.tuples(st.integers())),
                    item, max_size=6),
    st.lists(item, max_size=6),
)


@settings(max_examples=150, deadline=None)
@given(value=values, signed=st.booleans())
def test_encode_parts_joined_is_exactly_encode(value, signed):
    codec = Codec(KEY if signed else None)
    got = codec.encode_parts(value)
    want = codec.encode(value)
    assert bytes(got) == want and len(got) == len(want)
    assert got == want
    assert codec.decode(got) == codec.decode(want) == value
    if type(got) is Encoded:
        assert hash(got) == hash(want)


def test_large_bytes_are_referenced_not_copied():
    big = BIG[2]
    value = {"id": 1, "payload": big, "n": 2.5}
    enc = Codec().encode_parts(value)
    assert type(enc) is Encoded
    assert any(part is big for part in enc.parts)
    assert any(part is big for part in Codec().encode_parts(big).parts)
    # small values, or values whose large bytes are not at the top, are plain bytes
    assert type(Codec().encode_parts({"payload": b"x" * 100})) is bytes
    assert type(Codec().encode_parts({"inner": {"payload": big}})) is bytes
    # a bytearray is mutable: copied, as encode does
    assert type(Codec().encode_parts({"payload": bytearray(big)})) is bytes


def test_signed_pieces_are_verified_and_tampering_is_caught():
    codec = Codec(KEY)
    enc = codec.encode_parts({"payload": BIG[0], "x": 1})
    assert type(enc) is Encoded
    assert codec.decode(enc) == {"payload": BIG[0], "x": 1}
    tampered = bytearray(bytes(enc))
    tampered[-5] ^= 1
    with pytest.raises(IntegrityError):
        codec.decode(bytes(tampered))
    with pytest.raises(IntegrityError):
        Codec(b"another key" * 3).decode(enc)
    unsigned = Codec().encode_parts({"payload": BIG[0]})
    with pytest.raises(IntegrityError):
        codec.decode(unsigned)


def test_a_codec_subclass_keeps_its_own_encoding():
    class Upper(Codec):
        def dumps(self, value):
            fmt, payload = super().dumps(value)
            return fmt, bytes(payload)

    codec = Upper()
    got = codec.encode_parts({"payload": BIG[0]})
    assert type(got) is bytes and got == codec.encode({"payload": BIG[0]})


def test_unencodable_values_fail_as_encode_does():
    class Thing:
        def __reduce__(self):
            raise TypeError("nope")

    codec = Codec()
    from mlcache.errors import SerializationError

    with pytest.raises(SerializationError):
        codec.encode_parts({"payload": BIG[0], "x": Thing()})
    # pickle fallback (a set of unhashable-in-msgpack keys is fine; a dataclass is not msgpack)
    import dataclasses

    @dataclasses.dataclass
    class P:
        blob: bytes

    value = {"payload": BIG[0], "p": P(b"1")}
    assert bytes(codec.encode_parts(value)) == codec.encode(value)
    assert codec.decode(codec.encode_parts(value)) == value


# -- the Redis level -----------------------------------------------------------------------------

def _level(url: str, **kw) -> RedisLevel:
    return RedisLevel(RedisConfig(url=url, prefix=f"pieces-{uuid.uuid4().hex[:8]}", **kw))


def test_redis_level_packs_batches_of_plain_bytes_itself(redis_url, monkeypatch):
    """An unbounded level packs every MSET itself (values of any size, protocol-looking bytes,
    bytes-like values, an empty value), the last value of a key given twice wins, and a
    batch over the chunk size is several MSETs on one connection, each reply read."""
    level = _level(redis_url)
    awkward = [b"", b"\r\n", b"$5\r\nhello\r\n", b"*1\r\n:1\r\n", bytes(range(256)) * 70]
    items = [(b"k%d" % i, v) for i, v in enumerate(awkward)]
    items += [(b"ba", bytearray(b"from a bytearray")), (b"mv", memoryview(b"from a view")),
              (b"k0", b"second write of k0")]
    assert level.put_many(items) == []
    keys = [b"k%d" % i for i in range(len(awkward))] + [b"ba", b"mv"]
    assert level.get_many(keys) == [b"second write of k0", *awkward[1:], b"from a bytearray",
                                    b"from a view"]
    monkeypatch.setattr(redis_level, "_CHUNK", 2)
    many = [(b"m%d" % i, b"v%d\r\n" % i * (i + 1)) for i in range(7)]
    assert level.put_many(many) == []
    assert level.get_many([k for k, _ in many]) == [v for _, v in many]
    client = level._connect()
    assert client.ping()   # the connection is still in step after the pipelined replies
    level.close()


def test_redis_level_packs_its_deletes_itself(redis_url, monkeypatch):
    """delete_many on an unbounded level: one UNLINK per chunk, pipelined, awkward keys and a
    key given twice included; absent keys are no error; the connection stays in step."""
    level = _level(redis_url)
    keys = [b"d%d" % i for i in range(7)] + [b"\r\n$3\r\nodd", b"", b"*"]
    assert level.put_many([(k, b"v" + k) for k in keys]) == []
    level.delete_many([keys[0], keys[0], b"never-written"])
    assert level.get_many(keys[:2]) == [None, b"vd1"]
    monkeypatch.setattr(redis_level, "_CHUNK", 2)
    level.delete_many(keys[1:])
    assert level.get_many(keys) == [None] * len(keys)
    assert level.put_many([(b"after", b"x")]) == [] and level.get(b"after") == b"x"
    level.close()


def test_redis_level_writes_pieces_and_bytes_in_one_batch(redis_url, monkeypatch):
    codec = Codec()
    level = _level(redis_url)
    items = [(b"a", codec.encode_parts({"payload": BIG[0], "i": 1})), (b"b", b"plain"),
             (b"c", codec.encode_parts(BIG[2])), (b"a", codec.encode_parts([BIG[1], BIG[0]]))]
    assert level.put_many(items) == []
    got = level.get_many([b"a", b"b", b"c"])
    assert got == [bytes(items[3][1]), b"plain", bytes(items[2][1])]
    assert codec.decode(got[0]) == [BIG[1], BIG[0]]
    # several MSET commands pipelined on one connection, every reply read
    monkeypatch.setattr(redis_level, "_CHUNK", 2)
    many = [(b"m%d" % i, codec.encode_parts({"payload": BIG[i % 2], "i": i})) for i in range(5)]
    assert level.put_many(many) == []
    assert level.get_many([k for k, _ in many]) == [bytes(v) for _, v in many]
    assert level.used_bytes() == sum(len(v) for v in level.get_many([b"a", b"b", b"c"])) + \
        sum(len(v) for _, v in many)
    level.close()


def test_gathering_writes_resume_after_partial_sends(monkeypatch):
    """More buffers than one sendmsg takes, into a socket with little room (real sockets, a
    reader on the other end): every byte goes out once, in order."""
    import socket
    import threading

    monkeypatch.setattr(redis_level, "_IOV", 3)
    buffers = [b"head", BIG[2], b"", b"mid", BIG[0], memoryview(BIG[1])[5:], b"tail"]
    want = b"".join(bytes(b) for b in buffers)
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.settimeout(5.0)
    got = bytearray()

    def read():
        while len(got) < len(want):
            chunk = b.recv(1 << 16)
            if not chunk:
                break
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        redis_level._sendmsg_all(a, buffers)
        reader.join(10)
    finally:
        a.close()
        b.close()
    assert bytes(got) == want


def test_bounded_redis_level_takes_pieces_joined(redis_url):
    codec = Codec()
    level = _level(redis_url, max_bytes=500_000)
    enc = codec.encode_parts({"payload": BIG[0]})
    assert level.put_many([(b"x", enc)]) == []
    victims = level.put_many([(b"y", codec.encode_parts({"payload": BIG[0], "y": 1}))])
    assert [k for k, _ in victims] == [b"x"] and victims[0][1] == bytes(enc)
    assert level.used_bytes() <= 500_000
    level.close()


def test_redis_down_with_pieces_is_level_unavailable():
    level = RedisLevel(RedisConfig(url="redis://127.0.0.1:1/0", retries=1))
    with pytest.raises(LevelUnavailableError) as info:
        level.put_many([(b"k", Codec().encode_parts(BIG[0]))])
    assert info.value.retryable
    level.close()


def test_error_replies_leave_the_connection_in_step(monkeypatch):
    from mlcache._redis_server import RedisServer

    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        level = RedisLevel(RedisConfig(url=server.url, prefix="oom", max_connections=1))
        codec = Codec()
        monkeypatch.setattr(redis_level, "_CHUNK", 1)
        items = [(b"a", codec.encode_parts(BIG[0])), (b"b", codec.encode_parts(BIG[1]))]
        client.config_set("maxmemory", 1)     # every write refused: two error replies
        with pytest.raises(CapacityError):
            level.put_many(items)
        client.config_set("maxmemory", 0)
        # the one pooled connection read both replies: the next commands answer in order
        assert level.get_many([b"a", b"b"]) == [None, None]
        assert level.put_many(items) == []
        assert level.get_many([b"a", b"b"]) == [bytes(items[0][1]), bytes(items[1][1])]
        level.close()
        client.close()
    finally:
        server.cleanup()


# -- through the manager -------------------------------------------------------------------------

def _objects(n: int) -> dict[int, dict]:
    return {i: {"id": i, "updates": 0, "payload": os.urandom(300_000)} for i in range(n)}


def _exercise(config: CacheConfig, n: int = 8) -> None:
    objs = _objects(n)
    with CacheManager(config) as m:
        for i, obj in objs.items():
            m.put(i, obj)
        for round_ in range(3):
            for i in range(n):
                obj = m.get(i)
                assert obj["payload"] == objs[i]["payload"]
                obj["updates"] += 1
                m.put(i, obj)
        stats = m.stats()
        assert stats["levels"]["heap"]["evictions"]["dirty"] > 0
    with CacheManager(config) as m:
        for i in range(n):
            got = m.get(i)
            assert got["updates"] == 3 and got["payload"] == objs[i]["payload"]


@pytest.mark.parametrize("signed", [False, True])
def test_manager_heap_to_redis_large_dirty_victims(redis_url, signed):
    config = CacheConfig(heap=HeapConfig(max_bytes=1_500_000),
                         levels=(RedisConfig(url=redis_url, prefix=uuid.uuid4().hex[:8]),),
                         signing_key=KEY if signed else None)
    _exercise(config)


def test_manager_heap_to_disk_gets_joined_bytes(tmp_path):
    config = CacheConfig(heap=HeapConfig(max_bytes=1_500_000),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    _exercise(config)


def test_manager_bounded_redis_cascades_pieces_to_disk(redis_url, tmp_path):
    config = CacheConfig(heap=HeapConfig(max_bytes=1_500_000),
                         levels=(RedisConfig(url=redis_url, prefix=uuid.uuid4().hex[:8],
                                             max_bytes=1_000_000),
                                 DiskConfig(path=str(tmp_path / "d"))))
    _exercise(config)


def test_eviction_buffer_hit_on_a_value_in_pieces(redis_url):
    """A key read back while its write-back (in pieces) is still queued: the right value, and
    mutation tracking compares against the pieces, so an unchanged value evicts clean."""
    config = CacheConfig(heap=HeapConfig(max_bytes=1_000_000, policy="lru"),
                         levels=(RedisConfig(url=redis_url, prefix=uuid.uuid4().hex[:8]),))
    objs = _objects(3)
    with CacheManager(config) as m:
        with m._wb.io_lock:                  # no write can run: evictions stay queued
            for i in range(3):
                m.put(i, dict(objs[i]))      # the third evicts the first (dirty), in pieces
                # (a copy: a value the caller still held would be lent, not read back)
            queued = m._wb.buffer.pending[0]
            assert [type(v) for v in queued.values()] == [Encoded]
            assert list(queued) == [m._kb(0)]
            assert m.get(0) == objs[0]       # from the buffer (evicts 1, queued too)
            assert m.stats()["writeback"]["buffer_hits"] == 1
            assert type(m._digests.get(m._kb(0))) is Encoded   # kept, not hashed
        m.flush()
        clean = m.stats()["levels"]["heap"]["evictions"].get("clean", 0)
        for i in (1, 2, 1, 2):
            m.get(i)                         # 0 leaves again, unchanged: clean
        assert m._kb(0) not in m._data
        assert m.stats()["levels"]["heap"]["evictions"].get("clean", 0) > clean
        assert m.stats()["writeback"].get("mutations_detected", 0) == 0
        assert m.get(0) == objs[0]


def test_out_of_memory_reply_is_a_capacity_error(redis_url):
    """Regression: redis-py raises OutOfMemoryError without the "OOM" code in its message,
    so a full server surfaced as LevelUnavailableError (retryable) instead of CapacityError."""
    from mlcache._redis_server import RedisServer

    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        level = RedisLevel(RedisConfig(url=server.url, prefix="oom-plain"))
        client.config_set("maxmemory", 1)
        with pytest.raises(CapacityError):
            level.put_many([(b"k", b"v")])
        client.config_set("maxmemory", 0)
        assert level.put_many([(b"k", b"v")]) == []
        level.close()
        client.close()
    finally:
        server.cleanup()


# -- batches -------------------------------------------------------------------------------------

def test_a_write_takes_what_is_queued_up_to_its_batch_bound(redis_url):
    """The writer takes what is queued in one write, up to a quarter of the buffer's byte
    bound (one entry over it at most), and the heap budget is charged for a level client's
    copy of such a batch beside the buffer itself."""
    config = CacheConfig(heap=HeapConfig(max_bytes=4 << 20, policy="lru"),
                         levels=(RedisConfig(url=redis_url, prefix=f"b-{uuid.uuid4().hex[:8]}"),))
    with CacheManager(config) as m:
        wb = m._wb
        limit = wb.buffer_bytes_max
        assert limit and wb.batch_bytes_max == limit // 4
        assert m._heap.reserved >= limit + limit // 4
        with m._lock:   # the writer thread cannot take them meanwhile
            for i in range(10):
                wb.enqueue(b"q%d" % i, os.urandom(limit // 50))
            taken = wb.buffer.take(0, wb.batch_size, wb.batch_bytes_max)
            assert len(taken) == 10 and len(wb.buffer) == 0
            for key, data in taken:
                wb.buffer.add(0, key, data)
            # past the bound a batch stops (one entry over it at most)
            for i in range(10, 50):
                wb.enqueue(b"q%d" % i, os.urandom(limit // 50))
            taken = wb.buffer.take(0, wb.batch_size, wb.batch_bytes_max)
            assert 12 <= len(taken) <= 13
            for key, data in taken:
                wb.buffer.add(0, key, data)
        m.flush()
        assert m.stats()["writeback"]["pending"] == 0


# -- the writer thread's own connection ------------------------------------------------------------

def test_a_thread_holding_a_connection_writes_on_it_not_on_the_pool(redis_url):
    """hold_connection gives the calling thread a connection beside the pool for its writes:
    with the pool's only connection checked out elsewhere, the thread still writes and
    deletes; other threads are not affected; release closes it, and the level's close closes
    any still held."""
    level = _level(redis_url, max_connections=1, socket_timeout=2.0)
    pool = level._connect().connection_pool
    taken = pool.get_connection()   # the pool is empty now
    done: list = []

    def writer() -> None:
        level.hold_connection()
        level.put_many([(b"w1", b"one"), (b"w2", b"two")])
        level.delete_many([b"w1"])
        done.append(level._own.conn[1])
        level.release_connection()

    import threading

    t = threading.Thread(target=writer)
    t.start()
    t.join(10)
    assert len(done) == 1 and done[0] not in pool._connections
    assert done[0]._sock is None and not level._owned   # released: closed
    assert level._own_connection(level._client) is None  # this thread holds none
    pool.release(taken)
    assert level.get_many([b"w1", b"w2"]) == [None, b"two"]
    level.hold_connection()
    level.put_many([(b"w3", b"three")])
    held = level._own.conn[1]
    assert held._sock is not None
    level.close()
    assert held._sock is None


def test_a_held_connection_dropped_by_the_server_connects_again(redis_url):
    level = _level(redis_url, retries=2)
    try:
        level.hold_connection()
        level.put_many([(b"a", b"1")])
        admin = redis.Redis.from_url(redis_url)
        admin.client_kill_filter(_type="normal", skipme=True)   # the level's sockets
        admin.close()
        level.put_many([(b"b", b"2")])
        level.delete_many([b"a"])
        assert level.get_many([b"a", b"b"]) == [None, b"2"]
        level.release_connection()
    finally:
        level.close()


def test_the_writer_thread_writes_on_its_own_connection_and_closes_it(redis_url):
    config = CacheConfig(heap=HeapConfig(max_bytes=300_000, policy="lru"),
                         levels=(RedisConfig(url=redis_url, prefix=f"o-{uuid.uuid4().hex[:8]}"),))
    m = CacheManager(config)
    level = m._levels[0]
    for i in range(200):
        m.put(i, os.urandom(5_000))
    m.flush()
    assert all(m.get(i) is not None for i in range(200))
    m.delete_many(range(100))
    m.flush()
    writers = [t for t in m._wb._threads if t.is_alive()]
    assert writers and m.stats()["levels"]["redis"]["writes"] > 0
    deadline = time.monotonic() + 10
    while not level._owned and time.monotonic() < deadline:   # the writer's first write
        m.put("more", os.urandom(100_000))
        time.sleep(0.05)
    assert len(level._owned) == 1   # one writer thread, one connection of its own
    m.close()
    assert not level._owned   # the writer released its connection when it stopped


def test_a_write_to_redis_takes_long_encodings_up_to_half_the_buffer():
    """Encodings the level sends as they are (at least ``sends_as_is`` bytes) do not count
    toward the copy bound (``batch_bytes_max``, what the heap budget reserves for a level
    client's copy); all of them count toward half the buffer. Short ones still stop a batch
    at the copy bound, and a batch always takes at least one entry."""
    from mlcache.writeback import EvictionBuffer

    buf = EvictionBuffer(1)
    for i in range(20):
        buf.add(0, b"long%d" % i, b"x" * 10_000)
    taken = buf.take(0, 256, 18_000, as_is=4096, total_max=37_000)
    assert len(taken) == 4   # 40,000 >= 37,000 after the fourth; none counted as copied
    assert len(buf.take(0, 256, 18_000)) == 2   # without as_is: the copy bound
    buf.pending[0].clear()
    for i in range(20):
        buf.add(0, b"short%d" % i, b"y" * 3_000)
    assert len(buf.take(0, 256, 18_000, as_is=4096, total_max=37_000)) == 6   # copied
    assert len(buf.take(0, 3, 18_000, as_is=4096, total_max=37_000)) == 3     # count bound
    buf.pending[0].clear()
    buf.add(0, b"huge", b"z" * 100_000)
    buf.add(0, b"next", b"z" * 10)
    assert len(buf.take(0, 256, 18_000, as_is=4096, total_max=37_000)) == 1


def test_write_bounds_by_level(redis_url, tmp_path):
    from mlcache.levels.redis import _DIRECT

    unbounded = CacheConfig(heap=HeapConfig(max_bytes=4 << 20, policy="lru"),
                            levels=(RedisConfig(url=redis_url, prefix="wb1"),))
    with CacheManager(unbounded) as m:
        wb = m._wb
        limit = wb.buffer_bytes_max
        assert m._levels[0].sends_as_is == _DIRECT
        assert wb._take_bounds(0) == (limit // 4, _DIRECT, limit // 2)
    bounded = CacheConfig(heap=HeapConfig(max_bytes=4 << 20, policy="lru"),
                          levels=(RedisConfig(url=redis_url, prefix="wb2", max_bytes=1 << 30),
                                  DiskConfig(path=str(tmp_path / "d"))))
    with CacheManager(bounded) as m:
        wb = m._wb
        assert m._levels[0].sends_as_is is None   # its transaction copies every value
        assert wb._take_bounds(0) == (wb.buffer_bytes_max // 4, None, None)
        assert wb._take_bounds(1) == (wb.buffer_bytes_max // 4, None, None)   # disk
    entries = CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                          levels=(RedisConfig(url=redis_url, prefix="wb3"),))
    with CacheManager(entries) as m:
        assert m._wb._take_bounds(0) == (None, None, None)


def test_pages_written_in_larger_writes_read_back_exactly(redis_url):
    """A heap over an unbounded Redis level, values of 10 KB (sent as they are): each write
    carries several, and every value reads back as it was put."""
    config = CacheConfig(heap=HeapConfig(max_bytes=600_000, policy="lru"),
                         levels=(RedisConfig(url=redis_url, prefix=f"l-{uuid.uuid4().hex[:8]}"),))
    values = {i: os.urandom(10_000) for i in range(300)}
    with CacheManager(config) as m:
        with m._lock:   # queued, not written, until flush() drains them in full writes
            for i, v in values.items():
                m.put(i, v)
        m.flush()
        st = m.stats()["levels"]["redis"]
        assert st["keys_written"] > 2 * st["writes"] > 0   # more than two values a write
        assert all(m.get(i) == v for i, v in values.items())
