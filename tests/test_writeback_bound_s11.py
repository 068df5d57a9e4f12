"""The keys a level above the disk holds newer than the disk stay bounded without checkpoints.

``WriteBack.newer[i]`` remembers every key written to an intermediate level (Redis above the
disk) until it is copied down. Only a checkpoint copied them, so a job that flushes each
micro-batch and checkpoints seldom (close() does) kept ~75 bytes a distinct key outside the
heap budget: 22 MiB after 3 * 10**5 keys under a 1 MiB heap (tests/test_review_scale_s10.py).
Past ``newer_max`` keys (10**4 at least) the writer thread, or the next flush, copies them down
as a checkpoint would. These tests use a real Redis and disk.
"""
from __future__ import annotations

import gc
import sqlite3
import tracemalloc

import pytest
import redis

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import IntegrityError, LevelUnavailableError

_N = 100_000


def _config(url: str, ns: str, disk, redis_max: int | None = None,
            **disk_kw) -> CacheConfig:
    return CacheConfig(heap=HeapConfig(max_bytes=1 << 20),
                       levels=(RedisConfig(url=url, prefix=ns, max_bytes=redis_max),
                               DiskConfig(path=str(disk), **disk_kw)),
                       namespace="n", retry_attempts=2, retry_backoff=0.01)


def _disk_only(disk) -> CacheManager:
    return CacheManager(CacheConfig(heap=HeapConfig(max_bytes=1 << 20),
                                    levels=(DiskConfig(path=str(disk)),), namespace="n"))


def _write(m: CacheManager, keys: range, value=lambda i: i * 3, step: int = 1000) -> int:
    """Put ``keys`` ``step`` at a time, flushing after each; the largest ``newer[0]`` seen
    after a flush."""
    most = 0
    for b in range(0, len(keys), step):
        m.put_many((i, value(i)) for i in keys[b:b + step])
        m.flush()
        most = max(most, len(m._wb.newer[0]))
    return most


def _values(m: CacheManager, keys) -> dict:
    """Every key's value, None for a missing one."""
    keys = list(keys)
    out = {}
    for b in range(0, len(keys), 1000):
        found = m.get_many(keys[b:b + 1000])
        out.update((k, found.get(k)) for k in keys[b:b + 1000])
    return out


def test_memory_stays_bounded_over_many_keys_without_checkpoints(redis_url, unique_ns,
                                                                  tmp_path):
    disk = tmp_path / "disk"
    m = CacheManager(_config(redis_url, unique_ns, disk))
    try:
        cap = m._wb.newer_max
        assert cap == 10_000          # a 1 MiB heap: the floor
        tracemalloc.start()
        try:
            most = _write(m, range(_N))
            gc.collect()
            traced = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        # it held all 10**5 (8.9 MiB traced) until close(); a flush leaves at most the bound
        assert most <= cap, most
        assert traced < 3 << 20, traced
        assert m.stats()["writeback"]["early_copies"] >= _N // cap - 1
        # what was copied early is on the disk, with its value, before any checkpoint
        with _disk_only(disk) as d:
            below = _values(d, range(_N))
        on_disk = {k for k, v in below.items() if v is not None}
        assert len(on_disk) >= _N - cap - 1000, len(on_disk)
        bad = [(k, below[k]) for k in on_disk if below[k] != k * 3]
        assert not bad, (len(bad), bad[:5])
    finally:
        m.close()


def test_values_after_close_and_reopen_are_the_last_written(redis_url, unique_ns, tmp_path):
    # Keys copied down early and written again later: the disk must end with the later value
    # (a copy down never overtakes a newer write), through Redis and from the disk alone.
    disk = tmp_path / "disk"
    n = 30_000
    with CacheManager(_config(redis_url, unique_ns, disk)) as m:
        _write(m, range(n), lambda i: ("a", i))
        assert m.stats()["writeback"]["early_copies"] >= 2
        _write(m, range(0, n, 3), lambda i: ("b", i), step=500)   # rewrites, copied again
        m.delete_many(range(1, n, 7))
        m.flush()
    expect = {i: None if i % 7 == 1 else ("b", i) if i % 3 == 0 else ("a", i)
              for i in range(n)}
    with CacheManager(_config(redis_url, unique_ns, disk)) as m:
        assert _values(m, range(n)) == expect
    with _disk_only(disk) as d:
        assert _values(d, range(n)) == expect


def test_a_redis_that_lost_data_between_flushes_is_still_reported(redis_url, unique_ns,
                                                                   tmp_path):
    disk = tmp_path / "disk"
    m = CacheManager(_config(redis_url, unique_ns, disk))
    try:
        _write(m, range(25_000))
        with m._wb._bound_lock:       # no copy down of the writer's under way
            kept = set(m._wb.newer[0])    # in Redis only: flushed, not yet copied down
            assert 0 < len(kept) <= m._wb.newer_max
            redis.Redis.from_url(redis_url).flushall()      # restarted without its data
        early = m.stats()["writeback"]["early_copies"]
        _write(m, range(100_000, 100_000 + 2 * m._wb.newer_max))
        # copied down early since the loss: the lost keys were found missing, and kept
        assert m.stats()["writeback"]["early_copies"] >= early + 1
        lost = [k for k in range(25_000) if m._kb(k) in kept]
        assert len(lost) == len(kept)
        # a read of one no longer in the heap raises, never the disk's (absent) older copy
        away = [k for k in lost if m._kb(k) not in m._data]
        assert away
        with pytest.raises(IntegrityError, match="not checkpointed below"):
            m.get(away[0])
        # what was copied down before the loss is read from the disk
        assert m.get(0) == 0 and m.get(10) == 30
        with pytest.raises(IntegrityError, match=f"checkpoint: {len(lost)} entries"):
            m.close()
        m.close()          # reported once
    finally:
        m.close()
    with _disk_only(disk) as d:
        got = _values(d, range(25_000))
    assert {k for k, v in got.items() if v is None} == set(lost)
    assert all(v == k * 3 for k, v in got.items() if v is not None)


def test_a_failing_disk_is_reported_by_the_flush_and_nothing_is_lost(redis_url, unique_ns,
                                                                      tmp_path):
    # The disk's write lock held by another connection past the level's timeout: the early
    # copy fails and the flush raises it (then each flush, as for any write queued for the
    # disk: the failed batch waits in the disk's queue); the keys stay newer in Redis, and
    # close() copies them once the disk is free.
    disk = tmp_path / "disk"
    m = CacheManager(_config(redis_url, unique_ns, disk, timeout=0.2))
    try:
        m.put("probe", 1)
        m.checkpoint()                # the database exists
        lock = sqlite3.connect(str(disk / "cache.db"), timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        failed = []
        try:
            for b in range(0, 15_000, 1000):
                m.put_many((i, i * 3) for i in range(b, b + 1000))
                try:
                    m.flush()
                except LevelUnavailableError as exc:
                    failed.append((b, exc))
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # none before newer[0] outgrew its bound (Redis alone was written), then each one
        assert [b for b, _ in failed] == list(range(10_000, 15_000, 1000))
        assert len(m._wb.newer[0]) >= 10_000
        m.flush()
    finally:
        m.close()
    with _disk_only(disk) as d:
        assert _values(d, range(15_000)) == {i: i * 3 for i in range(15_000)}


def _stored_bytes(url: str, prefix: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(client.strlen(k) for k in client.scan_iter(match=prefix + ":*", count=1000))
    finally:
        client.close()


def test_a_bounded_redis_level_holding_its_victims_stays_exact(redis_url, unique_ns, tmp_path):
    # A Redis level bounded by max_bytes above the disk holds its victims until the disk holds
    # them (59648aa); the early copies run beside its evictions. Another manager (another
    # process) reads the last values throughout, the byte counter stays exact.
    disk = tmp_path / "disk"
    cfg = _config(redis_url, unique_ns, disk, redis_max=150_000)
    a, b = CacheManager(cfg), CacheManager(cfg)
    try:
        n = 40_000
        most = _write(a, range(n), lambda i: ("a", i))
        assert most <= a._wb.newer_max
        assert a.stats()["writeback"]["early_copies"] >= 1
        assert a.stats()["levels"]["redis"]["evictions"].get("overflow")
        _write(a, range(0, n, 5), lambda i: ("b", i))
        expect = {i: ("b", i) if i % 5 == 0 else ("a", i) for i in range(n)}
        b.invalidate_local()
        assert _values(b, range(n)) == expect
        level = a._levels[0]
        assert level.used_bytes() == _stored_bytes(redis_url, unique_ns)
        assert level.used_bytes() <= 150_000 + 64_000
    finally:
        a.close()
        b.close()
    with _disk_only(disk) as d:
        assert _values(d, range(n)) == expect
