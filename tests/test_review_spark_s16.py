"""Review of the Spark integration's promises under failures and replays (session 16), each
job compared with a plain-Python model of exactly-once state effects.

What held (see the report): a task that raises part-way through its partition, or whose worker
dies (``os._exit``) there, followed by the same batch again; the same batch run again after it
succeeded; partitions served by the other worker between batches; a heap of three entries (the
state spills mid-batch) with disk, an arena above disk, and Redis (bounded or not) above disk;
``foreach_batch`` over a file stream restarted from its checkpoint after a task failure and
after a failure of the batch function past its jobs, through ``partitions``, ``pandas`` and
``pandas_udf``. One manager per worker process in all of them.

Fixed (the last test): a run whose *downstream* stage fails (``.map(f)`` after the partition
function raises) is closed by PySpark with ``GeneratorExit`` after the task failed, which the
helper took for an early stop (``take``) and committed as a completed run: the sink got the
partial change ``(key, value so far, old)``, a value the state never has once the batch
commits. A close with no frame of PySpark's worker on the stack now counts as a failure.
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest
from pyspark import cloudpickle

from mlcache import CacheConfig, DiskConfig, HeapConfig, RedisConfig
from mlcache.integrations.spark import SparkCache

pytestmark = pytest.mark.spark

# Functions defined in this module travel to the workers by value (tests/ is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _partitioner(key):
    return int(key[1:])


class _FileSink:
    def __init__(self, path):
        self.path = path

    def on_flush(self, key, new, old):
        with open(self.path, "a") as fh:
            fh.write(f"{key} {new} {old}\n")


def test_failed_part_way_then_replayed_twice_with_redis_and_a_tiny_heap(spark, tmp_path,
                                                                      redis_url):
    """Lists written back, keys deleted past a threshold, len() in the output: a batch whose
    task raises after 7 records, then runs twice more; the state and the outputs are those of
    one run, with three heap entries per worker (the state spills to Redis mid-batch)."""
    cfg = CacheConfig(heap=HeapConfig(max_entries=3, max_bytes=None),
                      levels=(RedisConfig(url=redis_url), DiskConfig(path=str(tmp_path / "d"))),
                      namespace="s16" + uuid.uuid4().hex[:8])
    cache = SparkCache(cfg, name="lists")
    flag = str(tmp_path / "fail")

    @cache.partitions(key=lambda kv: kv[0])
    def keep(pairs, state):
        for n, (k, v) in enumerate(pairs, 1):
            cur = state.get(k, [])
            cur.append(v)
            if sum(cur) > 12:
                del state[k]
            else:
                state[k] = cur
            if n == 7 and os.path.exists(flag):
                os.remove(flag)
                raise RuntimeError("injected failure")
            yield k, tuple(state.get(k, ())), len(state)

    sc = spark.sparkContext
    model: dict = {}
    batches = [[(f"k{(i * 7 + b) % 9}", (i + b) % 5 + 1) for i in range(40)] for b in range(3)]
    for b, data in enumerate(batches):
        def run():
            rdd = sc.parallelize(data, 2).partitionBy(3, _partitioner)
            return sorted(rdd.mapPartitions(keep.for_batch(b)).collect())
        if b == 1:
            open(flag, "w").close()
            with pytest.raises(Exception, match="injected failure"):
                run()
        first = run()
        assert run() == first            # the same batch again after it succeeded
        for k, v in data:
            cur = model.get(k, []) + [v]
            if sum(cur) > 12:
                model.pop(k, None)
            else:
                model[k] = cur
        assert cache.snapshot() == model, f"after batch {b}"
    assert all(n == 1 for n in cache.creations().values())


def test_a_task_failing_downstream_forwards_nothing_to_the_sink(spark, tmp_path):
    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "d")),),
                      namespace="s16" + uuid.uuid4().hex[:8])
    cache = SparkCache(cfg, name="sink")
    log = str(tmp_path / "sink.log")

    @cache.partitions(key=lambda kv: kv[0])
    def count(pairs, state):
        for k, v in pairs:
            state[k] = state.get(k, 0) + v
            yield k, state[k]

    def downstream(kv):
        if kv[1] == 3:
            raise ValueError("downstream failure")
        return kv

    data = [("a", 1)] * 10
    with pytest.raises(Exception, match="downstream failure"):
        spark.sparkContext.parallelize(data, 1).mapPartitions(
            count.for_batch(0, listeners=[_FileSink(log)])).map(downstream).collect()
    forwarded = open(log).read() if os.path.exists(log) else ""
    assert forwarded == "", f"a failed task forwarded {forwarded!r}"
