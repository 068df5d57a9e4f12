"""SparkCache: the driver-side handle of a stateful PySpark job.

It fixes the config the executors will use (explicit ``CacheConfig`` > ``spark.mlcache.*`` conf
> ``MLCACHE_*`` environment), resolves an embedded Redis to one server for all workers, checks
that the config pickles, and makes the partition helpers and the ``foreachBatch`` wrapper. It
also reads the job's state and counters back on the driver.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping

from mlcache.config import CacheConfig
from mlcache.errors import ConfigError

from ._conf import config_from_spark_conf, prepare_for_executors
from ._epochs import check_shared_bounds, open_epoch_store, shared_level
from ._partition import (BATCH_PROPERTY, PandasFunction, PartitionFunction, PartitionSpec,
                         _listener_calls, as_pandas_udf, batch_context)
from ._scope import partition_prefix
from ._versioned import unwrap

__all__ = ["SparkCache", "foreach_batch"]


def _check_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in "/\x1f"):
        raise ConfigError(what, f"must be a non-empty string without '/', got {name!r}")
    return name


class SparkCache:
    """The state of one Spark job: ``SparkCache(config, name="fraud")``.

    ``config``: a :class:`~mlcache.CacheConfig` (or its ``from_dict`` mapping); ``None`` reads
    ``spark.mlcache.*`` from ``spark``'s conf when given, else ``MLCACHE_*`` variables.
    ``name`` separates the state of different jobs sharing the same levels.
    ``collect_stats`` makes every partition publish its worker's manager stats
    (see :meth:`worker_stats`).
    """

    def __init__(self, config: CacheConfig | Mapping[str, Any] | None = None, *,
                 name: str = "state", spark: Any = None, collect_stats: bool = False) -> None:
        if config is None and spark is not None:
            config = config_from_spark_conf(spark)
        if config is None:
            config = CacheConfig.from_env()
        elif isinstance(config, Mapping):
            config = CacheConfig.from_dict(config)
        elif not isinstance(config, CacheConfig):
            raise ConfigError("config", f"must be a CacheConfig, a mapping or None, "
                              f"got {type(config).__name__}")
        self.name = _check_name("name", name)
        # here, not in the first task: every task failed on the executors with this error
        shared_level(config)
        check_shared_bounds(config)
        self.config = prepare_for_executors(config)
        self.collect_stats = collect_stats

    # -- helpers for the executors -----------------------------------------------------------

    def _spec(self, state: str, key: Any, ts: Any, depth: Any, prefetch: bool,
              listeners: Iterable[Any]) -> PartitionSpec:
        if key is not None and not callable(key) and not isinstance(key, (str, int)):
            raise TypeError(f"key= must be a function, a field/column name or None, got {key!r}")
        # Checked here, on the driver: the executors found these only when a task ran (a bad
        # listener after the partition's work was done and flushed), inside a Spark error.
        if ts is not None and not callable(ts) and not isinstance(ts, (str, int)):
            raise TypeError(f"ts= must be a function, a field/column name or None, got {ts!r}")
        if depth != "auto" and (isinstance(depth, bool) or not isinstance(depth, int)
                                or depth < 0):
            raise ValueError(f"depth= must be 'auto' or an int >= 0, got {depth!r}")
        listeners = tuple(listeners)
        _listener_calls(listeners)
        return PartitionSpec(config=self.config, scope=self.name, state=_check_name("state", state),
                             key=key, ts=ts, depth=depth, prefetch=prefetch,
                             listeners=listeners, collect_stats=self.collect_stats)

    def partitions(self, fn: Callable[..., Any] | None = None, *, key: Any = None,
                   ts: Callable[[Any], float] | None = None, state: str = "state",
                   depth: int | str = "auto", prefetch: bool = True,
                   listeners: Iterable[Any] = ()) -> Any:
        """Decorate ``fn(records, state)`` for ``rdd.mapPartitions``.

        ``state`` is this partition's ``CacheableDict`` named ``state``; ``key(record)`` (or a
        field name) is the state key of a record, hinted ahead of use; ``listeners`` get every
        (key, new, old) change when the partition commits.
        """
        spec = self._spec(state, key, ts, depth, prefetch, listeners)
        if fn is None:
            return lambda f: PartitionFunction(f, spec)
        return PartitionFunction(fn, spec)

    def pandas(self, fn: Callable[..., Any] | None = None, *, key: Any = None, ts: Any = None,
               state: str = "state", depth: int | str = "auto", prefetch: bool = True,
               listeners: Iterable[Any] = ()) -> Any:
        """Decorate ``fn(batches, state)`` for ``df.mapInPandas``; ``key`` (and ``ts``, the
        event time the hints carry) is a column name or ``frame -> sequence``. Each batch's
        keys are hinted when it is read, one batch ahead of the function."""
        spec = self._spec(state, key, ts, depth, prefetch, listeners)
        if fn is None:
            return lambda f: PandasFunction(f, spec)
        return PandasFunction(fn, spec)

    def pandas_udf(self, return_type: Any, *, key: Any = None, state: str = "state",
                   prefetch: bool = True, listeners: Iterable[Any] = ()) -> Callable[[Any], Any]:
        """Decorate ``fn(batches: Iterator[pd.Series], state) -> Iterator[pd.Series]`` into an
        iterator pandas UDF; by default each input value is its own state key."""
        spec = self._spec(state, key, None, "auto", prefetch, listeners)

        def wrap(fn: Callable[..., Any]) -> Any:
            return as_pandas_udf(PandasFunction(fn, spec), fn, return_type)
        return wrap

    def foreach_batch(self, fn: Callable[[Any, int], Any], *,
                      sink: Any = None) -> Callable[[Any, int], None]:
        """Wrap ``fn(batch_df, batch_id)`` for ``writeStream.foreachBatch``.

        Partition functions of this cache run inside ``fn`` are bound to the batch: its id is
        the checkpoint id, their state effects are exactly-once under replay, and ``sink``
        (callable(key, new, old) or an object with ``on_flush``, run on the executors) gets
        each partition's deduplicated changes when it commits, of this cache's state only
        (a function of another cache run inside ``fn`` is bound to the batch, not the sink).
        """
        sinks = () if sink is None else (sink,)
        _listener_calls(sinks)     # on the driver, not in every task's commit
        name = self.name
        store_config = self.config

        def run(batch_df: Any, batch_id: int) -> None:
            sc = batch_df.sparkSession.sparkContext
            sc.setLocalProperty(BATCH_PROPERTY, str(int(batch_id)))
            try:
                with batch_context(batch_id, sinks, (name, store_config)):
                    fn(batch_df, batch_id)
            finally:
                sc.setLocalProperty(BATCH_PROPERTY, None)
            store = open_epoch_store(store_config)
            try:
                store.mark_committed(name, int(batch_id))
            finally:
                store.close()

        run.__name__ = getattr(fn, "__name__", "foreach_batch")
        return run

    # -- reading back on the driver ------------------------------------------------------------

    def _store(self) -> Any:
        return open_epoch_store(self.config)

    def partitions_seen(self) -> list[int]:
        store = self._store()
        try:
            return store.partitions(self.name)
        finally:
            store.close()

    def snapshot(self, state: str = "state") -> dict[Any, Any]:
        """The contents of the dict ``state`` across all partitions (driver-side).

        Reads the shared levels with a fresh manager, so it sees what the executors flushed:
        the committed state, plus what a failed run wrote before it failed, until the batch's
        replay (which starts from the committed state) replaces it.
        """
        from mlcache import CacheManager

        out: dict[Any, Any] = {}
        manager = CacheManager(self.config)
        try:
            for p in self.partitions_seen():
                ns = manager.namespace(partition_prefix(self.name, p) + f"dict:{state}")
                keys = list(ns.keys())
                found = ns.get_many(keys)
                for k in keys:
                    present, value = unwrap(found.get(k))
                    if present:
                        out[k] = value
        finally:
            manager.close()
        return out

    def creations(self) -> dict[str, int]:
        """Manager creations per worker process (``host:pid:fingerprint`` -> count)."""
        store = self._store()
        try:
            return store.creations()
        finally:
            store.close()

    def worker_stats(self) -> dict[str, dict[str, Any]]:
        """The last manager stats each worker published (``collect_stats=True``)."""
        store = self._store()
        try:
            return {w: json.loads(s) for w, s in store.worker_stats().items()}
        finally:
            store.close()

    def last_committed_batch(self) -> int | None:
        store = self._store()
        try:
            return store.last_committed(self.name)
        finally:
            store.close()

    def __repr__(self) -> str:
        return f"<SparkCache {self.name!r} levels={[lv.kind for lv in self.config.levels]}>"


def foreach_batch(cache: SparkCache, fn: Callable[[Any, int], Any], *,
                  sink: Any = None) -> Callable[[Any, int], None]:
    """Function form of :meth:`SparkCache.foreach_batch`."""
    return cache.foreach_batch(fn, sink=sink)
