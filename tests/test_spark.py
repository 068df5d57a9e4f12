"""The Spark integration on real PySpark ``local[2]`` (one session for the run, see conftest).

With ``local[2]`` Spark serves a partition from either of two Python worker processes, so the
same keys hop between processes across jobs: the simplest setup where coherence matters. Every
check compares the job's output with a model computed in the test (a Counter per key).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import zlib
from collections import Counter
from typing import Iterator

import pandas as pd
import pytest
from pyspark import cloudpickle

from mlcache import CacheConfig, DiskConfig, RedisConfig
from mlcache.integrations.spark import SparkCache

pytestmark = pytest.mark.spark

# Functions defined in this module travel to the workers by value (tests/ is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cache(tmp_path, ns, name="s", **kw):
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=ns)
    return SparkCache(cfg, name=name, **kw)


def _counting(cache):
    @cache.partitions(key=lambda kv: kv[0])
    def count(pairs, state):
        from pyspark import TaskContext

        p = TaskContext.get().partitionId()
        for k, v in pairs:
            state[k] = state.get(k, 0) + v
            yield k, state[k], os.getpid(), p
    return count


def _partitioner(key):
    return zlib.crc32(key.encode())


def _batch(b, n=60, keys=23):
    return [(f"k{(b * 7 + i * 3) % keys}", 1) for i in range(n)]


def _check_against_model(out, model):
    """Each output is the key's count right after that record: with one record per key in a
    partition at a time, the last output per key must equal the model."""
    seen = {}
    for k, n, _pid, _p in out:
        seen[k] = max(seen.get(k, 0), n)
    for k, n in seen.items():
        assert n == model[k], f"stale state for {k}: read {n}, model says {model[k]}"


def test_no_stale_read_when_partitions_hop_between_workers(spark, tmp_path, unique_ns):
    cache = _cache(tmp_path, unique_ns)
    count = _counting(cache)
    sc = spark.sparkContext
    model: Counter = Counter()
    owners: dict[int, set[int]] = {}
    for b in range(10):
        data = _batch(b)
        model.update(k for k, _ in data)
        out = sc.parallelize(data, 4).partitionBy(4, _partitioner).mapPartitions(count).collect()
        _check_against_model(out, model)
        for _k, _n, pid, p in out:
            owners.setdefault(p, set()).add(pid)
    assert any(len(pids) > 1 for pids in owners.values()), owners  # partitions did hop
    assert cache.snapshot() == dict(model)
    assert all(n == 1 for n in cache.creations().values())


def test_one_manager_per_worker_across_micro_batches(spark, tmp_path, unique_ns):
    src = tmp_path / "in"
    src.mkdir()
    batches = 10  # the issue asks for >= 10 micro-batches: keep it
    for b in range(batches):
        rows = [{"k": k, "v": v} for k, v in _batch(b, n=40)]
        (src / f"part-{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
    cache = _cache(tmp_path, unique_ns)

    @cache.partitions(key="k")
    def count(rows, state):
        for r in rows:
            state[r.k] = state.get(r.k, 0) + r.v
            yield r.k, state[r.k], os.getpid(), 0

    outputs: dict[int, list] = {}

    def process(df, batch_id):
        outputs[batch_id] = df.repartition(4, "k").rdd.mapPartitions(count).collect()

    query = (spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1)
             .json(str(src)).writeStream.foreachBatch(cache.foreach_batch(process))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(outputs) == list(range(batches))
    model: Counter = Counter()
    for b in range(batches):  # one output per input record, so the outputs name the inputs
        model.update(k for k, *_ in outputs[b])
        _check_against_model(outputs[b], model)
    creations = cache.creations()
    # One manager per worker process, kept across the 10 micro-batches (40 tasks): every worker
    # created it once. How many workers ran the tasks is Spark's: local[2] runs two tasks at
    # a time, but the daemon keeps every idle worker it started, so a session whose earlier
    # tests ran jobs from a thread pool and pandas UDFs (tests/test_review_spark_s10.py)
    # hands these tasks to more than two (seen: four pids, each with one creation).
    assert 1 <= len(creations) <= 4 and all(n == 1 for n in creations.values()), creations
    assert cache.last_committed_batch() == batches - 1
    assert cache.snapshot() == dict(model)


def _replayable(cache, flag):
    @cache.partitions(key=lambda kv: kv[0])
    def count(pairs, state):
        scope = state.manager
        out = []
        for k, v in pairs:
            state[k] = state.get(k, 0) + v
            out.append((k, state[k]))
        if scope.batch_id == 2 and scope.partition == 3 and os.path.exists(flag):
            raise RuntimeError("injected failure after the partition wrote its state")
        yield from out
    return count


def test_failed_and_replayed_batch_leaves_the_state_of_one_run(spark, tmp_path, unique_ns):
    sc = spark.sparkContext
    flag = str(tmp_path / "fail-once")
    results = {}
    for variant in ("clean", "replayed"):
        cache = _cache(tmp_path, unique_ns, name=variant)
        count = _replayable(cache, flag)
        outputs: dict[int, list] = {}

        def process(df, batch_id):
            rdd = df.rdd.map(lambda r: (r.k, r.v)).partitionBy(4, _partitioner)
            outputs[batch_id] = sorted(rdd.mapPartitions(count).collect())

        run = cache.foreach_batch(process)
        for b in range(4):
            df = spark.createDataFrame(_batch(b, n=50), "k string, v long")
            if variant == "replayed" and b == 2:
                open(flag, "w").close()
                with pytest.raises(Exception, match="injected failure"):
                    run(df, b)
                os.remove(flag)
            run(df, b)  # the replay: same batch id, same input
        results[variant] = (cache.snapshot(), outputs)
    assert results["replayed"] == results["clean"]
    model: Counter = Counter(k for b in range(4) for k, _ in _batch(b, n=50))
    assert results["clean"][0] == dict(model)
    assert sc is spark.sparkContext


def test_killed_workers_lose_no_committed_state(spark, tmp_path, unique_ns):
    cache = _cache(tmp_path, unique_ns)
    count = _counting(cache)
    sc = spark.sparkContext
    model: Counter = Counter()

    def job(b):
        data = _batch(b)
        model.update(k for k, _ in data)
        out = sc.parallelize(data, 4).partitionBy(4, _partitioner).mapPartitions(count).collect()
        _check_against_model(out, model)

    for b in range(2):
        job(b)
    before = cache.creations()
    pids = [int(worker.split(":")[1]) for worker in before]
    for pid in pids:  # what Spark's idle timeout does: the process dies, no exit hooks
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:  # until the daemon has reaped them, so
        try:                                      # Spark sees them dead and does not reuse them
            os.kill(pids[0], 0)
            time.sleep(0.05)
        except ProcessLookupError:
            pids.pop(0)
    assert not pids, f"workers {pids} were not reaped"
    for b in range(2, 4):
        job(b)
    after = cache.creations()
    assert set(after) - set(before), "new workers should have replaced the killed ones"
    assert all(n == 1 for n in after.values())
    assert cache.snapshot() == dict(model)


def test_map_in_pandas_and_iterator_pandas_udf(spark, tmp_path, unique_ns):
    cache = _cache(tmp_path, unique_ns)

    @cache.pandas(key="k")
    def totals(frames, state):
        for frame in frames:
            out = []
            for k, v in zip(frame["k"], frame["v"]):
                state[k] = state.get(k, 0) + int(v)
                out.append(state[k])
            yield pd.DataFrame({"k": frame["k"], "total": out})

    data = _batch(0, n=80) + _batch(1, n=80)
    df = spark.createDataFrame(data, "k string, v long").repartition(3, "k")
    rows = df.mapInPandas(totals, "k string, total long").collect()
    model = Counter(k for k, _ in data)
    assert {r.k: max(x.total for x in rows if x.k == r.k) for r in rows} == dict(model)

    seen = _cache(tmp_path, unique_ns, name="udf")

    @seen.pandas_udf("long")
    def occurrences(batches: Iterator[pd.Series], state) -> Iterator[pd.Series]:
        for keys in batches:
            out = []
            for k in keys:
                state[k] = state.get(k, 0) + 1
                out.append(state[k])
            yield pd.Series(out)

    got = df.repartition(2, "k").select("k", occurrences("k").alias("n")).collect()
    assert max(r.n for r in got) == max(model.values())
    assert seen.snapshot() == dict(model)


def test_key_function_failure_names_the_row(spark, tmp_path, unique_ns):
    cache = _cache(tmp_path, unique_ns)

    @cache.partitions(key=lambda kv: kv[0].upper())
    def count(pairs, state):
        for k, v in pairs:
            state[k] = v
            yield k

    data = [("a", 1), (None, 2), ("b", 3)]
    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize(data, 1).mapPartitions(count).collect()
    text = str(info.value)
    assert "KeyFunctionError" in text and "(None, 2)" in text, text[-2000:]


def test_unreachable_redis_fails_the_first_task_naming_the_setting(spark, unique_ns):
    cfg = CacheConfig(levels=(RedisConfig(url="redis://127.0.0.1:1/0", socket_timeout=0.5),),
                      namespace=unique_ns)
    cache = SparkCache(cfg)

    @cache.partitions()
    def touch(items, state):
        for x in items:
            state[x] = 1
            yield x

    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize([1, 2], 1).mapPartitions(touch).collect()
    assert "redis.url: cannot reach redis://127.0.0.1:1/0" in str(info.value)


class _FileSink:
    """A flush listener that runs on the executors and appends each change to a file."""

    def __init__(self, path):
        self.path = path

    def on_flush(self, key, new, old):
        with open(self.path, "a") as fh:
            fh.write(json.dumps([key, new, old]) + "\n")


def test_foreach_batch_forwards_deduplicated_changes_to_a_sink(spark, tmp_path, unique_ns):
    cache = _cache(tmp_path, unique_ns)
    count = _counting(cache)
    path = str(tmp_path / "changes.jsonl")
    run = cache.foreach_batch(
        lambda df, b: df.rdd.map(lambda r: (r.k, r.v)).partitionBy(2, _partitioner)
        .mapPartitions(count).collect(), sink=_FileSink(path))
    for b, data in enumerate([[("a", 1), ("b", 1), ("a", 1)], [("a", 1), ("c", 1)]]):
        run(spark.createDataFrame(data, "k string, v long"), b)
    with open(path) as fh:
        changes = sorted(tuple(json.loads(line)) for line in fh)
    # one change per key and batch, whatever the number of updates: (key, new, old)
    assert changes == [("a", 2, None), ("a", 3, 2), ("b", 1, None), ("c", 1, None)]


def test_spark_conf_settings_reach_the_executors(spark, tmp_path, unique_ns):
    spark.conf.set("spark.mlcache.disk.path", str(tmp_path / "conf-disk"))
    spark.conf.set("spark.mlcache.namespace", unique_ns)
    spark.conf.set("spark.mlcache.heap.max_entries", "64")
    try:
        cache = SparkCache(spark=spark, name="conf")
    finally:
        for k in ("disk.path", "namespace", "heap.max_entries"):
            spark.conf.unset(f"spark.mlcache.{k}")
    assert cache.config.namespace == unique_ns and cache.config.heap.max_entries == 64
    count = _counting(cache)
    data = _batch(0, n=40)
    spark.sparkContext.parallelize(data, 2).partitionBy(2, _partitioner).mapPartitions(count).collect()
    assert cache.snapshot() == dict(Counter(k for k, _ in data))
    assert os.path.isdir(str(tmp_path / "conf-disk"))


def test_demo_pipeline_keeps_exact_per_card_state(spark, tmp_path):
    from mlcache.demo_spark import run_pipeline

    r = run_pipeline(spark, variant="mlcache", events=3_000, cards=600, batches=2,
                     workdir=str(tmp_path), progress=False)
    assert r.batches == 2 and r.mismatches == 0
    assert 2 * r.heap_entries_per_worker < r.cards   # the state does not fit in the heaps
    assert r.creations and all(n == 1 for n in r.creations.values())
