"""Review of the Spark integration (session 8): regression tests for the defects found.

- An arena level (process memory) right below the heap: a partition's commit point flushed
  its state into this process's arena only, so the next process to run the partition read the
  shared level without it; and a process taking a partition back dropped its heap copies but
  read stale ones from its arena.
- ``foreach_batch(fn, sink=...)`` gave its sink to every partition function pickled inside
  ``fn``, also those of another cache: the sink received another state's changes.
"""
from __future__ import annotations

import json
import multiprocessing
import sys
import zlib
from collections import Counter
from typing import Iterator

import pandas as pd
import pytest
from pyspark import cloudpickle

from mlcache import CacheConfig, DiskConfig, HeapConfig, RedisConfig
from mlcache.config import ArenaConfig
from mlcache.integrations.spark import SparkCache

# Functions defined in this module travel to the Spark workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _arena_config(tmp_path, ns):
    return CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None),
                       levels=(ArenaConfig(max_bytes=1 << 20),
                               DiskConfig(path=str(tmp_path / "disk"))),
                       namespace=ns)


def _add(pairs, state):
    for k, v in pairs:
        state[k] = state.get(k, 0) + v
        yield k, state[k]


def _run_partition(pf, records):
    """In a worker process: one run of partition 0 (no TaskContext), as a Spark task does."""
    return list(pf(records))


def test_arena_state_is_coherent_between_processes(tmp_path, unique_ns):
    # Two real processes, each with its own arena, one shared disk level: the partition runs
    # in A, then B, then A again. A's first run must reach the disk before B reads it, and A's
    # second run must not read its own arena's copy from before B's run.
    cache = SparkCache(_arena_config(tmp_path, unique_ns), name="s")
    pf = cache.partitions(_add, key=0)
    records = [(f"k{i}", 1) for i in range(12)]          # 12 keys > 4 heap entries
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as a, ctx.Pool(1) as b:
        first = a.apply(_run_partition, (pf, records))
        second = b.apply(_run_partition, (pf, records))
        third = a.apply(_run_partition, (pf, records))
    assert dict(first) == {k: 1 for k, _ in records}
    assert dict(second) == {k: 2 for k, _ in records}, "B did not see A's committed state"
    assert dict(third) == {k: 3 for k, _ in records}, "A read its stale arena copies"
    assert cache.snapshot() == {k: 3 for k, _ in records}


def _partitioner(key):
    return zlib.crc32(key.encode())


@pytest.mark.spark
def test_arena_level_on_local2_keeps_exact_state(spark, tmp_path, unique_ns):
    cache = SparkCache(_arena_config(tmp_path, unique_ns), name="s")
    count = cache.partitions(_add, key=lambda kv: kv[0])
    sc = spark.sparkContext
    model: Counter = Counter()
    for b in range(4):
        data = [(f"k{(b * 7 + i * 3) % 23}", 1) for i in range(60)]
        model.update(k for k, _ in data)
        out = sc.parallelize(data, 4).partitionBy(4, _partitioner).mapPartitions(count).collect()
        last: dict[str, int] = {}
        for k, n in out:
            last[k] = max(last.get(k, 0), n)
        assert last == {k: model[k] for k in last}, f"stale state in job {b}"
    assert cache.snapshot() == dict(model)


class _FileSink:
    def __init__(self, path):
        self.path = path

    def on_flush(self, key, new, old):
        with open(self.path, "a") as fh:
            fh.write(json.dumps([key, new, old]) + "\n")


@pytest.mark.spark
def test_a_sink_gets_the_changes_of_its_own_cache_only(spark, tmp_path, unique_ns):
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    mine, other = SparkCache(cfg, name="mine"), SparkCache(cfg, name="other")

    def put_name(cache):
        def put(items, state):
            for x in items:
                state[x] = cache
                yield x
        return put

    fa = mine.partitions(put_name("mine"))
    fb = other.partitions(put_name("other"))
    path = str(tmp_path / "changes.jsonl")

    def process(df, batch_id):
        sc = df.sparkSession.sparkContext
        sc.parallelize(["a"], 1).mapPartitions(fa).collect()
        sc.parallelize(["b"], 1).mapPartitions(fb).collect()

    mine.foreach_batch(process, sink=_FileSink(path))(spark.createDataFrame([(1,)], "v long"), 0)
    with open(path) as fh:
        changes = [json.loads(line) for line in fh]
    assert changes == [["a", "mine", None]]
    # the other cache's function still ran bound to the batch (exactly-once state)
    assert other.snapshot() == {"b": "other"}


def _count_rows(frames, state):
    for frame in frames:
        for k in frame["k"]:
            state[k] = state.get(k, 0) + 1
        yield frame


@pytest.mark.parametrize("key, ts, wrong", [
    (lambda f: f["k"].unique(), None, "returned 3 values, not one per row"),
    (lambda f: "a", None, "returned a str, not one value per row"),
    (lambda f: list(f["k"]) + ["z"], None, "returned 6 values, not one per row"),
    ("k", lambda f: f["t"][:2], "returned 2 values, not one per row"),
    ("k", lambda f: 5.0, "returned a float, not one value per row"),
    ("k", "no_such_column", "KeyError"),
])
@pytest.mark.parametrize("prefetch", [True, False])
def test_a_pandas_key_or_ts_not_one_per_row_is_refused(tmp_path, unique_ns, key, ts, wrong,
                                                       prefetch):
    # The rows were handed to the function as far as they had keys: a key function giving
    # fewer keys than rows dropped the others silently; a short or scalar ts= raised a bare
    # IndexError/TypeError from the helper. The partition runs here without a SparkSession
    # (no TaskContext: partition 0), as a worker runs it.
    from mlcache.integrations.spark import KeyFunctionError

    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    cache = SparkCache(cfg, name="pd")
    frame = pd.DataFrame({"k": ["a", "b", "a", "c", "a"], "t": [1.0, 2.0, 3.0, 4.0, 5.0]})
    with pytest.raises(KeyFunctionError, match="batch of 5 rows in partition 0") as info:
        list(cache.pandas(_count_rows, key=key, ts=ts, prefetch=prefetch)(iter([frame])))
    assert wrong in str(info.value)
    assert cache.snapshot() == {}        # refused before any row was handed over
    good = list(cache.pandas(_count_rows, key="k", ts="t", prefetch=prefetch)(iter([frame])))
    assert sum(len(f) for f in good) == 5
    assert cache.snapshot() == {"a": 3, "b": 1, "c": 1}


def test_a_lost_redis_is_a_level_unavailable_error_naming_the_url(unique_ns):
    # The epoch store's calls let redis-py's ConnectionError out (every partition start, the
    # driver's foreach_batch commit mark and reads), where the levels raise the retryable
    # LevelUnavailableError naming redis.
    from mlcache._redis_server import RedisServer
    from mlcache.errors import LevelUnavailableError
    from mlcache.integrations.spark import open_epoch_store

    server = RedisServer().start()
    try:
        cfg = CacheConfig(levels=(RedisConfig(url=server.url, socket_timeout=1.0, retries=1),),
                          namespace=unique_ns)
        cache = SparkCache(cfg, name="lost")
        store = open_epoch_store(cache.config)
        assert store.acquire("lost", 0, "me") == 1
        assert store.acquire("lost", 0, "me") == 1
        server.stop()
        calls = [lambda: store.acquire("lost", 0, "me"), lambda: store.record_creation("w"),
                 lambda: store.mark_committed("lost", 3), cache.last_committed_batch,
                 cache.partitions_seen, cache.creations, cache.worker_stats]
        for call in calls:
            with pytest.raises(LevelUnavailableError, match="redis.url: .*" + server.url) as info:
                call()
            assert info.value.level == "redis" and info.value.retryable
        store.close()
    finally:
        server.cleanup()


@pytest.mark.spark
def test_a_run_stopped_early_forwards_its_changes(spark, tmp_path, unique_ns):
    # take(1) closes the partition's iterator after one row: the run's change is in the state
    # (flushed), so the sink must get it; it was treated as a failed run and never forwarded.
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    cache = SparkCache(cfg, name="early")
    count = cache.partitions(_add, key=lambda kv: kv[0])
    path = str(tmp_path / "changes.jsonl")
    taken = {}

    def process(df, batch_id):
        taken[batch_id] = df.rdd.map(lambda r: (r.k, 1)).mapPartitions(count).take(1)

    run = cache.foreach_batch(process, sink=_FileSink(path))
    for b in range(2):
        run(spark.createDataFrame([("a",), ("b",), ("c",)], "k string").coalesce(1), b)
    assert taken == {0: [("a", 1)], 1: [("a", 2)]}
    assert cache.snapshot() == {"a": 2}
    with open(path) as fh:
        changes = [json.loads(line) for line in fh]
    assert changes == [["a", 1, None], ["a", 2, 1]]


@pytest.mark.parametrize("records, key, ts, says", [
    ([("a", 1), (None, 2)], 0, None, "row (None, 2) in partition 0: record 1: key= returned an "
                                     "unsupported key type NoneType"),
    ([("a", 1), (["x"], 2)], 0, None, "row (['x'], 2) in partition 0: record 1: key= returned "
                                      "an unsupported key type list"),
    ([("a", 1), ("b", None)], 0, 1, "row ('b', None) in partition 0: record 1: key=/ts= raised"),
    ([("a", 1), ("b", float("nan"))], 0, 1, "row ('b', nan) in partition 0: record 1: ts= "
                                            "returned nan"),
    ([("a", 1), ("b", 2)], lambda kv: kv[1] / 0, None, "key function <lambda> failed on row "
                                                       "('a', 1) in partition 0"),
])
def test_a_bad_row_key_or_ts_names_the_row_and_partition(tmp_path, unique_ns, records, key, ts,
                                                         says):
    # The row path raised the lookahead's RecordKeyError, naming the record's index only
    # (the pandas path named the row and the partition); a failing key function's error came
    # wrapped in it.
    from mlcache.integrations.spark import KeyFunctionError

    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    pf = SparkCache(cfg, name="rows").partitions(_add, key=key, ts=ts)
    with pytest.raises(KeyFunctionError) as info:
        list(_run_partition(pf, records))
    assert says in str(info.value)
    assert info.value.partition == 0 and info.value.record in records


def _no_output(pairs, state):
    for k, v in pairs:
        state[k] = v                     # updates the state, forgets to return anything


def test_a_function_returning_none_is_named(tmp_path, unique_ns):
    # 'yield from None' raised "TypeError: 'NoneType' object is not iterable" from the helper,
    # naming neither the partition function nor what it should return.
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    pf = SparkCache(cfg, name="none").partitions(_no_output, key=0)
    with pytest.raises(TypeError, match="partition function _no_output returned NoneType, "
                                        "not an iterable of output rows"):
        _run_partition(pf, [("a", 1)])


def test_a_nan_pandas_ts_names_the_row_and_partition(tmp_path, unique_ns):
    # A null in the ts column (NaN) came out as the operator's RecordKeyError, 'record 7: ts=
    # returned nan', numbering the rows across batches and naming neither row nor partition.
    from mlcache.integrations.spark import KeyFunctionError

    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    pf = SparkCache(cfg, name="nan").pandas(_count_rows, key="k", ts="t")
    frames = [pd.DataFrame({"k": ["a", "b"], "t": [1.0, 2.0]}),
              pd.DataFrame({"k": ["c", "d"], "t": [3.0, float("nan")]})]
    with pytest.raises(KeyFunctionError) as info:
        _run_partition(pf, frames)
    assert ("row {'k': 'd', 't': nan} (row 1 of its batch) in partition 0: ts= returned nan"
            in str(info.value)), str(info.value)


def test_spark_conf_level_settings_outside_the_levels_list_are_refused():
    # spark.mlcache.redis.url beside spark.mlcache.levels=disk was dropped silently: a
    # disk-only config, whose state is shared by the workers of one host only.
    from mlcache.errors import ConfigError
    from mlcache.integrations.spark import config_from_spark_conf

    conf = {"spark.mlcache.levels": "disk", "spark.mlcache.disk.path": "/tmp/mlcache-s8",
            "spark.mlcache.redis.url": "redis://cache:6379/0",
            "spark.mlcache.redis.prefix": "jobs"}
    with pytest.raises(ConfigError, match=r"spark\.mlcache\.redis\.prefix: is set but "
                                          r"spark\.mlcache\.levels \('disk'\) does not list "
                                          r"'redis'"):
        config_from_spark_conf(conf)
    conf["spark.mlcache.levels"] = "redis, disk"
    cfg = config_from_spark_conf(conf)
    assert [lv.kind for lv in cfg.levels] == ["redis", "disk"]
    assert cfg.levels[0].url == "redis://cache:6379/0" and cfg.levels[0].prefix == "jobs"


@pytest.mark.spark
def test_a_pandas_udf_reused_across_micro_batches_runs_each_batch(spark, tmp_path, unique_ns):
    # A pandas UDF pickles its command once, on first use, so one defined outside the
    # foreachBatch function carried batch 0's id into every later batch: each ran as a replay
    # of batch 0 and its effects replaced the previous batch's (a stayed at 2 over 3 batches).
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=unique_ns)
    seen = SparkCache(cfg, name="seen")

    @seen.pandas_udf("long")
    def occurrence(values: Iterator[pd.Series], state) -> Iterator[pd.Series]:
        for batch in values:
            out = []
            for v in batch:
                state[v] = state.get(v, 0) + 1
                out.append(state[v])
            yield pd.Series(out)

    outputs = {}

    def process(df, batch_id):
        rows = df.repartition(2, "k").select("k", occurrence("k").alias("n")).collect()
        outputs[batch_id] = sorted(tuple(r) for r in rows)

    run = seen.foreach_batch(process)
    for b in range(3):
        run(spark.createDataFrame([("a",), ("b",), ("a",)], "k string"), b)
    assert outputs[2] == [("a", 5), ("a", 6), ("b", 3)]
    assert seen.snapshot() == {"a": 6, "b": 3}
