"""Review of the Spark integration from the outside (session 10): real PySpark jobs written from
the stateful-PySpark tutorial, each compared with the same aggregation in plain Python.

- The epoch store kept its hashes under ``<redis prefix>:spark:...``, inside the Redis level's
  key space: a Redis level with ``max_bytes`` took them for stored values, so the first write of
  every task failed (WRONGTYPE from the level's STRLEN scan), and an unbounded level's
  ``used_bytes`` in ``stats()`` came out None.
- A config without a level shared between worker processes (heap only, arena only) was accepted
  by ``SparkCache`` and failed every task on the executors.
- The embedded Redis a SparkCache starts on the driver was stopped by an atexit hook only: a
  driver ended by SIGTERM (a cluster manager, ``kill``) or SIGKILL left the redis-server
  running, with its directory, for good.
- A foreachBatch function that runs its Spark jobs from a thread pool (parallel sinks): the
  partition functions were bound to the batch through this thread's context and Spark's local
  property, neither of which reaches the pool's threads, so they ran unversioned and a replayed
  batch counted twice. A pandas UDF (pickled once by Spark) used there is refused by name.
- A run without a batch id over a state written inside foreach_batch failed with a ValueError
  from the dict's metadata that named neither the state nor the cause.
- Not fixed here (levels/redis.py, writeback.py; was a strict xfail below): a bounded Redis
  level removed its victims before the level below held them, so another process read an older
  copy meanwhile: lost updates in a Spark job with Redis(max_bytes) + disk on local[2]. Until
  it was, SparkCache refused a bounded shared level above another level. Fixed in session 11
  (the level keeps its victims until released, tests/test_redis_victims_s11.py): a bounded
  Redis level above shared levels is accepted again; a bounded disk level above another is
  still refused.
"""
from __future__ import annotations

import sys
from collections import Counter

import pandas as pd
import pytest
from pyspark import cloudpickle

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.config import ArenaConfig
from mlcache.errors import ConfigError
from mlcache.integrations.spark import SparkCache, open_epoch_store

pytestmark = pytest.mark.spark

# Functions defined in this module travel to the Spark workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _add(pairs, state):
    for k, v in pairs:
        state[k] = state.get(k, 0) + v
        yield k, state[k]


def test_a_bounded_redis_level_keeps_exact_state_on_local2(spark, redis_url, unique_ns):
    # State 10x the heap, in a Redis level with a byte bound (the last level: one above another
    # is refused, see below).
    cfg = CacheConfig(heap=HeapConfig(max_entries=20, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=1 << 20),),
                      namespace="agg")
    cache = SparkCache(cfg, name="agg")
    add = cache.partitions(_add, key=lambda kv: kv[0])
    sc = spark.sparkContext
    model: Counter = Counter()
    for job, slices in enumerate((3, 2)):     # another upstream split: partitions hop workers
        data = [(f"k{(job * 31 + i * 7) % 200}", 1 + i % 3) for i in range(600)]
        for k, v in data:
            model[k] += v
        sc.parallelize(data, slices).partitionBy(4).mapPartitions(add).count()
        assert cache.snapshot() == dict(model)


def test_the_epoch_store_stays_outside_the_redis_levels_key_space(redis_url, unique_ns):
    cfg = CacheConfig(heap=HeapConfig(max_entries=5, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns),), namespace="n")
    store = open_epoch_store(cfg)
    store.acquire("s", 0, "worker-a")
    store.record_creation("worker-a")
    store.mark_committed("s", 3)
    store.close()
    with CacheManager(cfg) as manager:
        manager.put("k", "v")
        manager.flush()
        assert manager.stats()["levels"]["redis"]["used_bytes"] > 0
    bounded = CacheConfig(heap=HeapConfig(max_entries=5, max_bytes=None),
                          levels=(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=10_000),),
                          namespace="n")
    with CacheManager(bounded) as manager:
        manager.put_many([(i, i) for i in range(20)])
        manager.flush()
        assert manager.get(3) == 3
    store = open_epoch_store(cfg)
    try:        # and the level's evictions never touched the store
        assert store.partitions("s") == [0]
        assert store.last_committed("s") == 3
    finally:
        store.close()


@pytest.mark.parametrize("levels", [(), (ArenaConfig(max_bytes=1 << 20),)],
                         ids=["heap-only", "arena-only"])
def test_a_config_no_worker_can_share_is_refused_on_the_driver(levels):
    cfg = CacheConfig(heap=HeapConfig(max_entries=10, max_bytes=None), levels=levels)
    with pytest.raises(ConfigError, match="levels: Spark state needs a level shared"):
        SparkCache(cfg, name="s")


def test_jobs_run_from_a_thread_pool_inside_foreach_batch_are_exactly_once(spark, tmp_path,
                                                                          unique_ns):
    from concurrent.futures import ThreadPoolExecutor

    cfg = CacheConfig(heap=HeapConfig(max_entries=8, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    cache = SparkCache(cfg, name="pool")
    add = cache.partitions(_add, key=lambda kv: kv[0])
    batches = [[(f"k{(b * 5 + i) % 17}", 1) for i in range(60)] for b in range(2)]
    with ThreadPoolExecutor(2) as pool:
        def process(df, batch_id):
            job = pool.submit(lambda: df.rdd.map(tuple).partitionBy(3).mapPartitions(add).count())
            job.result()

        run = cache.foreach_batch(process)
        for b, data in enumerate(batches):
            run(spark.createDataFrame(data, "k string, v long"), b)
        run(spark.createDataFrame(batches[1], "k string, v long"), 1)   # the replay of batch 1
    model = Counter(k for data in batches for k, _ in data)
    assert cache.snapshot() == dict(model)


@pytest.mark.parametrize("kind", ["disk"])   # redis: accepted since s11 (test_redis_victims_s11)
def test_a_bounded_shared_level_above_another_is_refused(tmp_path, kind):
    # Its victims leave it before the level below holds them: the lost updates of the test
    # below (a strict xfail for Redis until s11), which a Spark job on local[2] met (3 of
    # 4,000 keys after 8 jobs).
    redis = RedisConfig(url="redis://127.0.0.1:6379/0", max_bytes=1 << 20 if kind == "redis"
                        else None)
    disk = DiskConfig(path=str(tmp_path / "disk"), max_bytes=1 << 20 if kind == "disk" else None)
    levels = (redis, disk) if kind == "redis" else (disk, redis)
    with pytest.raises(ConfigError, match=f"{kind}.max_bytes: .*above another level"):
        SparkCache(CacheConfig(levels=levels), name="s")
    SparkCache(CacheConfig(levels=levels[::-1]), name="s")     # bounded and last: accepted


_DRIVER = """
import sys, time
from mlcache import CacheConfig, RedisConfig
from mlcache.integrations.spark import _conf, prepare_for_executors
cfg = prepare_for_executors(CacheConfig(levels=(RedisConfig(url="embedded", prefix="d"),)))
print(cfg.levels[0].url.rsplit(":", 1)[1].split("/")[0], _conf._servers["d"].directory, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_the_embedded_redis_does_not_outlive_a_killed_driver(sig):
    import os
    import signal
    import socket
    import subprocess
    import time

    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        port, directory = driver.stdout.readline().split()
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5):
            pass                                        # the server runs
        driver.send_signal(getattr(signal, sig))        # exit hooks never run
        driver.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            except OSError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"redis-server on port {port} outlived its driver ({sig})")
        while os.path.exists(directory) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(directory)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_a_redis_victim_stays_readable_by_other_processes_until_the_disk_holds_it(
        redis_url, unique_ns, tmp_path):
    # Two managers on one Redis and one disk directory: two Spark workers of one host. b owns
    # "k" (its partition); a's writes overflow the bounded Redis level, which evicts "k". Its
    # newest value is then only in a's write-back, on its way to the disk, which is slow for
    # the moment (another connection holds the database's write lock: a busy disk).
    import sqlite3
    import threading
    import time

    disk = tmp_path / "disk"
    cfg = CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=2_000),
                              DiskConfig(path=str(disk), timeout=30)),
                      namespace="n")
    a, b = CacheManager(cfg), CacheManager(cfg)
    try:
        b.put("k", "old")
        b.checkpoint()                    # the disk holds "old"
        b.put("k", "new")
        b.flush()                         # Redis holds "new", the disk still "old"
        lock = sqlite3.connect(str(disk / "cache.db"), timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        writer = threading.Thread(target=lambda: (
            a.put_many([(f"x{i}", "v" * 100) for i in range(40)]), a.flush()))
        try:
            writer.start()
            deadline = time.monotonic() + 20
            while not a.stats()["levels"]["redis"]["evictions"].get("overflow"):
                assert time.monotonic() < deadline, "the Redis level evicted nothing"
                time.sleep(0.01)
            b.invalidate_local()          # b takes its partition again: reads below its heap
            seen = b.get("k")
        finally:
            lock.execute("ROLLBACK")
            lock.close()
            writer.join(30)
        assert seen == "new", f"another process read {seen!r} while 'new' was being evicted"
    finally:
        a.close()
        b.close()


def test_a_run_without_a_batch_over_a_batch_written_state_names_the_cause(tmp_path, unique_ns):
    # A backfill with plain mapPartitions, a call on the driver, a pandas UDF run from a thread
    # pool inside foreachBatch: the dict opened over versioned records failed with "ValueError:
    # dictionary update sequence element #0 has length 11; 2 is required".
    from mlcache.integrations.spark import ReplayError

    cfg = CacheConfig(heap=HeapConfig(max_entries=8, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    cache = SparkCache(cfg, name="mixed")
    add = cache.partitions(_add, key=lambda kv: kv[0])
    assert list(add.for_batch(0)(iter([("a", 1), ("b", 2)]))) == [("a", 1), ("b", 2)]
    with pytest.raises(ReplayError, match=r"written by foreach_batch \(batch 0\).*for_batch"):
        list(add(iter([("a", 1)])))
    assert cache.snapshot() == {"a": 1, "b": 2}
    assert list(add.for_batch(1)(iter([("a", 1)]))) == [("a", 2)]


def _occurrences(values, state):
    for batch in values:
        out = []
        for v in batch:
            state[v] = state.get(v, 0) + 1
            out.append(state[v])
        yield pd.Series(out)


def test_a_pandas_udf_used_from_a_thread_pool_inside_foreach_batch_is_refused(spark, tmp_path,
                                                                            unique_ns):
    # Spark pickles a pandas UDF once; in a thread the batch function started neither the
    # thread's context nor the local property carries the batch, so it ran unversioned.
    from concurrent.futures import ThreadPoolExecutor
    from typing import Iterator

    _occurrences.__annotations__ = {"values": Iterator[pd.Series], "return": Iterator[pd.Series]}
    cfg = CacheConfig(heap=HeapConfig(max_entries=8, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    cache = SparkCache(cfg, name="udf")
    occurrence = cache.pandas_udf("long")(_occurrences)
    df = spark.createDataFrame([("a",), ("b",), ("a",)], "page string")
    with ThreadPoolExecutor(1) as pool:
        def process(batch_df, batch_id):
            pool.submit(lambda: batch_df.repartition(2, "page")
                        .select(occurrence("page")).collect()).result()

        with pytest.raises(Exception, match="pandas UDF _occurrences of SparkCache 'udf' is used "
                                            "in another thread"):
            cache.foreach_batch(process)(df, 0)
    assert cache.snapshot() == {}
