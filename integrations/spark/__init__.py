"""mlcache for PySpark: stateful partition functions with state larger than a worker's memory.

On the driver::

    from mlcache.integrations.spark import SparkCache
    cache = SparkCache(CacheConfig(...), name="fraud")

    @cache.partitions(key=lambda row: row.card)
    def score(rows, risk):                 # risk: this partition's CacheableDict
        ...

    df.repartition(8, "card").rdd.mapPartitions(score)
    stream.writeStream.foreachBatch(cache.foreach_batch(process)).start()

On the executors each Python worker process keeps one manager (:func:`executor_manager`) for
as long as Spark reuses the worker; partitions take ownership epochs so a partition moving
between processes never reads stale state, and inside ``foreach_batch`` state effects are
exactly-once under replay. See docs/tutorials/stateful-pyspark.md.

PySpark is imported lazily (only inside tasks and the pandas helpers), so this package imports
without Spark installed; ``mlcache`` itself never imports it.
"""
from __future__ import annotations

from ._cache import SparkCache, foreach_batch
from ._conf import check_picklable, config_from_spark_conf, prepare_for_executors
from ._epochs import open_epoch_store
from ._executor import config_fingerprint, executor_manager, worker_context
from ._partition import BATCH_PROPERTY, KeyFunctionError, PandasFunction, PartitionFunction
from ._scope import PartitionScope
from ._versioned import ReplayError

__all__ = [
    "SparkCache",
    "foreach_batch",
    "executor_manager",
    "worker_context",
    "config_fingerprint",
    "config_from_spark_conf",
    "prepare_for_executors",
    "check_picklable",
    "open_epoch_store",
    "PartitionFunction",
    "PandasFunction",
    "PartitionScope",
    "KeyFunctionError",
    "ReplayError",
    "BATCH_PROPERTY",
]
