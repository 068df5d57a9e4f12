"""A bounded Redis level above another level keeps its victims until the level below holds them.

Its write (one MULTI/EXEC) stores the batch and removes nothing; the victims it read are handed
to the write-back, written below, and only then released: each removed if Redis still holds the
very bytes written below, with its LRU entry and its bytes on the counter, atomically. Another
process reading a victim meanwhile finds it in Redis, never the older copy below (the lost
updates of a Spark job on local[2], tests/test_review_spark_s10.py). The last level (nothing
below) removes its victims in the EXEC as before.

Every test checks the byte counter against the values stored (the sum of STRLEN).
"""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest
import redis

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import LevelUnavailableError
from mlcache.levels.base import HeldVictims
from mlcache.levels.redis import RedisLevel


def _stored_bytes(url: str, prefix: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + ":*", count=1000))
        return sum(client.strlen(k) for k in keys)
    finally:
        client.close()


def _exact(level_or_manager, url: str, prefix: str) -> int:
    level = level_or_manager
    if isinstance(level, CacheManager):
        level = level._levels[0]
    used = level.used_bytes()
    assert used == _stored_bytes(url, prefix)
    return used


def _level(url: str, prefix: str, max_bytes: int) -> RedisLevel:
    level = RedisLevel(RedisConfig(url=url, prefix=prefix, max_bytes=max_bytes))
    level.hold_victims()
    return level


def _raw(url: str, prefix: str, key: bytes) -> bytes | None:
    client = redis.Redis.from_url(url)
    try:
        return client.get(prefix.encode() + b":" + key)
    finally:
        client.close()


# -- the level ---------------------------------------------------------------------------------

def test_held_victims_stay_stored_until_released(redis_url, unique_ns):
    level = _level(redis_url, unique_ns, 1_000)
    try:
        assert level.put_many([(b"a%d" % i, b"x" * 100) for i in range(10)]) == []
        victims = level.put_many([(b"b", b"y" * 300)])
        assert isinstance(victims, HeldVictims)
        assert [k for k, _ in victims] == [b"a0", b"a1", b"a2"]       # least recently used
        assert victims.held == list(victims) and victims.passed == []
        # still there, and counted: over the bound by the victims' size until released
        assert all(_raw(redis_url, unique_ns, k) == v for k, v in victims)
        assert _exact(level, redis_url, unique_ns) == 1_300
        redis.Redis.from_url(redis_url).script_flush()     # the script loaded again on demand
        level.release(victims)
        assert all(_raw(redis_url, unique_ns, k) is None for k, _ in victims)
        assert _exact(level, redis_url, unique_ns) == 1_000
        level.release(victims)                                         # idempotent
        assert _exact(level, redis_url, unique_ns) == 1_000
        assert set(level.scan(b"")) == {b"b", *(b"a%d" % i for i in range(3, 10))}
    finally:
        level.close()


def test_a_victim_rewritten_before_its_release_keeps_the_newer_value(redis_url, unique_ns):
    level, other = _level(redis_url, unique_ns, 1_000), _level(redis_url, unique_ns, 1_000)
    try:
        level.put_many([(b"a%d" % i, b"x" * 100) for i in range(10)])
        victims = level.put_many([(b"b", b"y" * 100)])
        assert [k for k, _ in victims] == [b"a0"]
        other.put_many([(b"a0", b"newer")])       # another process writes it meanwhile
        level.release(victims)
        assert _raw(redis_url, unique_ns, b"a0") == b"newer"
        assert other.get(b"a0") == b"newer"
        _exact(level, redis_url, unique_ns)
    finally:
        level.close()
        other.close()


def test_a_held_victim_is_handed_down_by_one_process_at_a_time(redis_url, unique_ns):
    # Were another write to evict it too, the two could write it below out of order (one
    # slow with v1, the other quick with a v2 written meanwhile): v1 would land last.
    a, b, c = (_level(redis_url, unique_ns, 1_000) for _ in range(3))
    try:
        a.put_many([(b"a%d" % i, b"x" * 100) for i in range(10)])
        held = a.put_many([(b"b", b"y" * 100)])
        assert [k for k, _ in held] == [b"a0"]
        v2 = b"v" * 100
        rewrote = b.put_many([(b"a0", v2)])              # rewritten while a holds it
        assert [k for k, _ in rewrote] == [b"a1"]
        b.release(rewrote)
        # a0 counts as on its way out (leased): c takes the next victims, never a0
        taken = c.put_many([(b"c", b"z" * 250)])
        assert [k for k, _ in taken] == [b"a2", b"a3"]
        c.release(taken)
        a.release(held)                                  # changed: stays, lease ended
        assert _raw(redis_url, unique_ns, b"a0") == v2
        # over the bound by a0 until the next write, which may evict it now
        assert _exact(a, redis_url, unique_ns) == 1_050
        later = c.put_many([(b"d", b"w" * 900)])
        assert (b"a0", v2) in later
        c.release(later)
        assert _exact(a, redis_url, unique_ns) <= 1_000
    finally:
        for level in (a, b, c):
            level.close()


def test_a_failed_hand_down_ends_the_leases_and_keeps_the_victims(redis_url, unique_ns):
    a, c = _level(redis_url, unique_ns, 1_000), _level(redis_url, unique_ns, 1_000)
    try:
        a.put_many([(b"a%d" % i, b"x" * 100) for i in range(10)])
        held = a.put_many([(b"b", b"y" * 100)])
        a.release(held, remove=False)                    # the level below failed
        assert _raw(redis_url, unique_ns, b"a0") == b"x" * 100
        assert _exact(a, redis_url, unique_ns) == 1_100
        taken = c.put_many([(b"c", b"z" * 100)])         # evicted again, by anyone
        assert [k for k, _ in taken] == [b"a0", b"a1"]
        c.release(taken)
        assert _exact(a, redis_url, unique_ns) == 1_000
    finally:
        a.close()
        c.close()


def test_an_older_copy_of_a_value_passed_through_stays_until_released(redis_url, unique_ns):
    # A value larger than the level is not stored; its older copy here stays (readers find
    # it, not the even older one below) until the level below holds the new value.
    level = _level(redis_url, unique_ns, 1_000)
    try:
        level.put_many([(b"k", b"old"), (b"j", b"j" * 10)])
        victims = level.put_many([(b"k", b"n" * 2_000)])
        assert list(victims) == [(b"k", b"n" * 2_000)]
        assert victims.passed == [(b"k", b"n" * 2_000)] and victims.held == [(b"k", b"old")]
        assert _raw(redis_url, unique_ns, b"k") == b"old"
        assert _exact(level, redis_url, unique_ns) == 13
        level.release(victims)
        assert _raw(redis_url, unique_ns, b"k") is None
        assert _exact(level, redis_url, unique_ns) == 10
    finally:
        level.close()


def test_a_level_on_its_own_or_last_still_removes_its_victims_in_the_write(redis_url,
                                                                           unique_ns):
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
    try:
        level.put_many([(b"a%d" % i, b"x" * 100) for i in range(10)])
        victims = level.put_many([(b"b", b"y" * 100)])
        assert not isinstance(victims, HeldVictims) and victims == [(b"a0", b"x" * 100)]
        assert _raw(redis_url, unique_ns, b"a0") is None
        assert _exact(level, redis_url, unique_ns) == 1_000
    finally:
        level.close()


# -- the write-back ----------------------------------------------------------------------------

def _cfg(url: str, ns: str, disk, **disk_kw) -> CacheConfig:
    return CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None),
                       levels=(RedisConfig(url=url, prefix=ns, max_bytes=2_000),
                               DiskConfig(path=str(disk), **disk_kw)),
                       namespace="n", retry_attempts=2, retry_backoff=0.01)


def _disk_only(disk) -> CacheManager:
    return CacheManager(CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None),
                                    levels=(DiskConfig(path=str(disk)),), namespace="n"))


def _wait_for(what, predicate, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_another_process_reads_the_victim_while_the_disk_is_busy(redis_url, unique_ns,
                                                                 tmp_path):
    # The reviewer's scenario (s10), then: once the disk holds "new", Redis no longer does,
    # and the level is back within its bound with its counter exact.
    disk = tmp_path / "disk"
    cfg = _cfg(redis_url, unique_ns, disk, timeout=30)
    a, b = CacheManager(cfg), CacheManager(cfg)
    try:
        b.put("k", "old")
        b.checkpoint()
        b.put("k", "new")
        b.flush()
        lock = sqlite3.connect(str(disk / "cache.db"), timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        writer = threading.Thread(target=lambda: (
            a.put_many([(f"x{i}", "v" * 100) for i in range(40)]), a.flush()))
        try:
            writer.start()
            _wait_for("the Redis level evicted nothing",
                      lambda: a.stats()["levels"]["redis"]["evictions"].get("overflow"))
            b.invalidate_local()
            assert b.get("k") == "new"
            _exact(b, redis_url, unique_ns)                # the held victims counted
        finally:
            lock.execute("ROLLBACK")
            lock.close()
            writer.join(30)
        assert not writer.is_alive()
        assert _exact(a, redis_url, unique_ns) <= 2_000
        b.invalidate_local()
        assert b.get("k") == "new"
        with _disk_only(disk) as d:
            assert d.get("k") == "new"
    finally:
        a.close()
        b.close()


def test_a_victim_another_manager_rewrites_before_the_release_keeps_its_newer_value(
        redis_url, unique_ns, tmp_path):
    disk = tmp_path / "disk"
    cfg = _cfg(redis_url, unique_ns, disk, timeout=30)
    a, b = CacheManager(cfg), CacheManager(cfg)
    try:
        b.put("k", "old")
        b.checkpoint()
        b.put("k", "new")
        b.flush()
        lock = sqlite3.connect(str(disk / "cache.db"), timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        writer = threading.Thread(target=lambda: (
            a.put_many([(f"x{i}", "v" * 100) for i in range(40)]), a.flush()))
        rewriter = threading.Thread(target=b.flush)
        try:
            writer.start()
            _wait_for("the Redis level evicted nothing",
                      lambda: a.stats()["levels"]["redis"]["evictions"].get("overflow"))
            # a holds "new" on its way to the disk; b writes "newer" to Redis meanwhile
            writes = b.stats()["levels"]["redis"]["writes"]
            b.put("k", "newer")
            rewriter.start()
            _wait_for("b did not write to Redis",
                      lambda: b.stats()["levels"]["redis"]["writes"] > writes)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
            writer.join(30)
            rewriter.join(30)
        assert not writer.is_alive() and not rewriter.is_alive()
        _exact(a, redis_url, unique_ns)
        with CacheManager(cfg) as c:             # a third process reads Redis first
            assert c.get("k") == "newer"
        b.checkpoint()
        with _disk_only(disk) as d:
            assert d.get("k") == "newer"
        _exact(a, redis_url, unique_ns)
    finally:
        a.close()
        b.close()


def test_a_failing_level_below_leaves_the_victims_readable_in_redis(redis_url, unique_ns,
                                                                    tmp_path):
    # The disk's write lock held by another connection past the level's timeout: writing the
    # victims below fails, and they stay in Redis, readable by every process, counted.
    disk = tmp_path / "disk"
    cfg = _cfg(redis_url, unique_ns, disk, timeout=0.2)
    a, b = CacheManager(cfg), CacheManager(cfg)
    try:
        b.put("k", "old")
        b.checkpoint()
        b.put("k", "new")
        b.flush()
        lock = sqlite3.connect(str(disk / "cache.db"), timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            a.put_many([(f"x{i}", "v" * 100) for i in range(40)])
            with pytest.raises(LevelUnavailableError, match="timed out waiting for the lock"):
                a.flush()
            assert a.stats()["levels"]["redis"]["evictions"].get("overflow")
            b.invalidate_local()
            assert b.get("k") == "new"
            assert _exact(a, redis_url, unique_ns) > 2_000         # held, not lost
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # the disk back: a checkpoint copies what the level holds newer than below
        a.checkpoint()
        with _disk_only(disk) as d:
            assert d.get("k") == "new"
        # and the next write evicts the victims again and releases them: back in the bound
        a.put_many([(f"y{i}", "w" * 100) for i in range(4)])
        a.flush()
        assert _exact(a, redis_url, unique_ns) <= 2_000
        b.invalidate_local()
        assert b.get("k") == "new"
        assert [b.get(f"x{i}") for i in range(40)] == ["v" * 100] * 40
    finally:
        a.close()
        b.close()


def test_byte_accounting_stays_exact_through_every_path(redis_url, unique_ns, tmp_path):
    # Overwrites of held keys, values larger than the level, deletes, a checkpoint: the counter
    # is the sum of the values stored after each, and after the last flush within the bound.
    cfg = _cfg(redis_url, unique_ns, tmp_path / "disk")
    with CacheManager(cfg) as m:
        model = {}
        for r in range(6):
            for i in range(30):
                key = f"k{(i * 7 + r) % 45}"
                value = "v" * (20 + (i * 37 + r) % 90)
                if i % 11 == 0:
                    value = "L" * 2_500                    # passed through, to the disk
                m.put(key, value)
                model[key] = value
            for i in range(0, 45, 9 + r):
                m.delete(f"k{i}")
                model.pop(f"k{i}", None)
            m.flush()
            assert _exact(m, redis_url, unique_ns) <= 2_000
            if r % 2:
                m.checkpoint()
                assert _exact(m, redis_url, unique_ns) <= 2_000
        m.invalidate_local()
        assert {k: m.get(k) for k in model} == model
        assert all(m.get(f"k{i}") is None for i in range(45) if f"k{i}" not in model)


def test_a_lossy_bounded_last_level_stays_bounded(redis_url, unique_ns):
    cfg = CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=2_000,
                                          lossy=True),), namespace="n")
    with CacheManager(cfg) as m:
        for i in range(200):
            m.put(f"k{i}", "v" * 100)
        m.flush()
        assert not m._levels[0]._holds          # nothing below: victims leave in the write
        assert _exact(m, redis_url, unique_ns) <= 2_000
        assert m.stats()["levels"]["redis"]["evictions"]["dropped"] > 0


# -- Spark -------------------------------------------------------------------------------------

def _add(pairs, state):
    for k, v in pairs:
        state[k] = state.get(k, 0) + v
        yield k, state[k]


def test_spark_accepts_a_bounded_redis_level_above_shared_levels_only(tmp_path):
    from mlcache.config import ArenaConfig
    from mlcache.errors import ConfigError
    from mlcache.integrations.spark import SparkCache

    redis_level = RedisConfig(url="redis://127.0.0.1:6379/0", max_bytes=1 << 20)
    disk = DiskConfig(path=str(tmp_path / "disk"))
    SparkCache(CacheConfig(levels=(redis_level, disk)), name="s")
    SparkCache(CacheConfig(levels=(redis_level, RedisConfig(url="redis://127.0.0.1:6379/1"),
                                   disk)), name="s")
    # below it, one process's arena: the victims of other workers' keys would go there
    with pytest.raises(ConfigError, match="redis.max_bytes: .*above a arena level"):
        SparkCache(CacheConfig(levels=(redis_level, ArenaConfig(max_bytes=1 << 20), disk)),
                   name="s")


@pytest.mark.spark
def test_a_spark_job_over_a_bounded_redis_above_the_disk_keeps_exact_state(
        spark, redis_url, unique_ns, tmp_path):
    # The configuration the lost updates came from (s10): Redis bounded far below the state,
    # above the disk, two worker processes; every job's result is checked against a model.
    import sys
    from collections import Counter

    from pyspark import cloudpickle

    from mlcache.integrations.spark import SparkCache

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = CacheConfig(heap=HeapConfig(max_entries=20, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=3_000),
                              DiskConfig(path=str(tmp_path / "disk"))),
                      namespace="agg")
    cache = SparkCache(cfg, name="agg")
    add = cache.partitions(_add, key=lambda kv: kv[0])
    sc = spark.sparkContext
    model: Counter = Counter()
    for job, slices in enumerate((3, 2, 4, 3)):   # another upstream split: partitions hop
        data = [(f"k{(job * 31 + i * 7) % 400}", 1 + i % 3) for i in range(1_200)]
        for k, v in data:
            model[k] += v
        sc.parallelize(data, slices).partitionBy(4).mapPartitions(add).count()
        assert cache.snapshot() == dict(model)
    level = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=3_000))
    try:
        assert level.used_bytes() == _stored_bytes(redis_url, unique_ns)
        assert 0 < level.used_bytes() <= 3_000
    finally:
        level.close()


def test_a_failed_release_writes_a_value_passed_through_again(redis_url, unique_ns, tmp_path):
    # The level below holds the new value but Redis could not be told to release the older
    # copy, which would hide the new value: it goes back to the Redis level's queue, whose
    # next write passes it through again and releases the older copy then.
    import threading as th

    from mlcache.levels.disk import DiskLevel
    from mlcache.stats import Stats
    from mlcache.writeback import WriteBack

    top = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
    below = DiskLevel(DiskConfig(path=str(tmp_path / "disk")))
    wb = WriteBack([top, below], ["redis", "disk"], th.RLock(), Stats(["heap", "redis", "disk"]),
                   batch_size=16, buffer_max=100, retry_attempts=1, retry_backoff=0.0,
                   writer_threads=0)
    try:
        assert top._holds and not getattr(below, "_holds", False)
        wb._write(0, [(b"k", b"old")])
        held = top.put_many([(b"k", b"n" * 2_000)])
        assert held.passed and held.held == [(b"k", b"old")]
        below.put_many(list(held))
        broken = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
        broken.close()                                 # every call raises LevelUnavailableError
        wb.levels[0] = broken
        wb._release(0, held)
        assert wb.buffer.pending[0] == {b"k": b"n" * 2_000}
        assert wb.stats.writeback["unreleased"] == 1
        wb.levels[0] = top
        wb.drain_once()                                # passed through again, then released
        assert _raw(redis_url, unique_ns, b"k") is None
        assert below.get_many([b"k"]) == [b"n" * 2_000]
        assert _exact(top, redis_url, unique_ns) == 0
    finally:
        top.close()
        below.close()


def test_a_value_passed_through_when_the_level_below_fails_is_queued_again(redis_url,
                                                                          unique_ns, tmp_path):
    # Its older copy stays in Redis, still leased to this process (no other write evicts it
    # and writes it below meanwhile); the value waits in the Redis level's queue (which this
    # process's reads look at first) and goes through again once the disk is back.
    import threading as th

    from mlcache.levels.disk import DiskLevel
    from mlcache.stats import Stats
    from mlcache.writeback import WriteBack

    top = RedisLevel(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1_000))
    below = DiskLevel(DiskConfig(path=str(tmp_path / "disk"), timeout=0.2))
    wb = WriteBack([top, below], ["redis", "disk"], th.RLock(), Stats(["heap", "redis", "disk"]),
                   batch_size=16, buffer_max=100, retry_attempts=1, retry_backoff=0.0,
                   writer_threads=0)
    big = b"n" * 2_000
    try:
        wb._write(0, [(b"k", b"old")])
        below.put_many([(b"j", b"")])                  # the database file exists
        lock = sqlite3.connect(str(tmp_path / "disk" / "cache.db"), timeout=30,
                               isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(LevelUnavailableError):
                wb._write(0, [(b"k", big)])
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert wb.buffer.pending[0] == {b"k": big}
        assert _raw(redis_url, unique_ns, b"k") == b"old"
        client = redis.Redis.from_url(redis_url)
        assert client.zscore(unique_ns.encode() + b"\x00held", unique_ns.encode() + b":k")
        client.close()
        _exact(top, redis_url, unique_ns)
        wb.drain_once()
        assert _raw(redis_url, unique_ns, b"k") is None
        assert below.get_many([b"k"]) == [big]
        assert _exact(top, redis_url, unique_ns) == 0
    finally:
        top.close()
        below.close()
