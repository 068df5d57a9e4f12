"""Session 8 review of the write path and the Redis level: regression tests for the defects
found, each against a real redis-server (a private one where the test stops it)."""
from __future__ import annotations

import threading

import pytest

from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
from mlcache._redis_server import RedisServer
from mlcache.errors import LevelUnavailableError


@pytest.fixture()
def own_redis():
    """A private server this test may stop and start again."""
    server = RedisServer().start()
    yield server
    server.cleanup()


def _on_writer() -> bool:
    return threading.current_thread().name.startswith("mlcache-writer-")


def test_flush_does_not_return_while_a_writer_batch_it_staged_fails(own_redis):
    # flush() stages a and b; it writes a itself and the writer thread takes b after flush's
    # last look at the buffer. Redis stops while b is in flight: b goes back to the buffer.
    # flush() used to wait for the write to end and return as if b had reached Redis (and
    # clear the writer's error), so the caller's durability point was not one.
    config = CacheConfig(heap=HeapConfig(policy="lru", max_entries=100, max_bytes=None),
                         levels=(RedisConfig(url=own_redis.url, prefix="s8", retries=0,
                                             socket_timeout=2.0),),
                         write_batch_size=1, retry_attempts=1, retry_backoff=0.01)
    m = CacheManager(config)
    wb, level = m._wb, m._levels[0]
    flush_took, writer_in, release = threading.Event(), threading.Event(), threading.Event()
    real_drain, real_put = wb.drain_once, level.put_many
    writer_calls = []

    def drain_once():
        if _on_writer():
            flush_took.wait(10)          # the writer takes its batch after flush took one
            return real_drain()
        n = real_drain()
        flush_took.set()
        writer_in.wait(10)               # ... and before flush looks at the buffer again
        return n

    def put_many(items):
        if _on_writer():
            writer_calls.append(items)
            if len(writer_calls) == 1:
                writer_in.set()
                release.wait(10)
        return real_put(items)

    wb.drain_once, level.put_many = drain_once, put_many
    m.put("a", 1)
    m.put("b", 2)
    outcome = {}

    def flush():
        try:
            m.flush()
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            outcome["error"] = exc

    t = threading.Thread(target=flush)
    t.start()
    assert writer_in.wait(10)
    own_redis.kill()                     # Redis stops while the writer's batch is in flight
    release.set()
    t.join(20)
    assert not t.is_alive()
    assert "ok" not in outcome, "flush() returned though a batch it staged was not written"
    assert isinstance(outcome["error"], LevelUnavailableError)
    # nothing lost: once Redis is back, a flush writes it
    own_redis.start()
    wb.drain_once, level.put_many = real_drain, real_put
    m.flush()
    m.close()
    with CacheManager(config) as again:
        assert again.get("b") == 2
