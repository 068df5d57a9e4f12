"""``mlcache demo`` on Spark: streaming fraud detection with per-card state 10x the heap.

The job is the single-process demo (:mod:`mlcache.demo`: synthetic card transactions with Zipf
card popularity, Welford mean/variance, velocity and home-country risk) run as a Structured
Streaming query on ``local[2]``:

    text files (one per micro-batch)  ->  attribute extraction (split + cast, Spark SQL)
      ->  repartition by card  ->  mapInPandas: per-card risk state in a CacheableDict,
          keys hinted one Arrow batch ahead (keyed prefetching), TAC in the heap
      ->  alerts (risk > threshold)  ->  JSON-lines sink

``foreachBatch`` goes through :meth:`SparkCache.foreach_batch`, so the state effects are
exactly-once and every partition commits (checkpoints) before its task ends. Each worker's heap
holds at most a twentieth of the cards, so the two workers together hold a tenth of the state;
the rest is on local disk (``--redis URL|embedded`` puts Redis between heap and disk). After the
last batch the state is checked against an independent tally of transactions per card.

:func:`run_pipeline` is shared with ``mlcache bench spark``, which runs it with other level
configurations in the same SparkSession.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .config import CacheConfig, DiskConfig, HeapConfig, LevelConfig, PrefetchConfig, RedisConfig
from .demo import ALERT, HOME_COUNTRIES, new_state, score, transactions

__all__ = ["main", "run_pipeline", "PipelineResult", "spark_session", "score_frames"]


def score_frames(frames: Iterator[Any], risk: Any) -> Iterator[Any]:
    """The stateful step (runs on the executors): score each transaction against its card's
    state, update the state, emit the alerts."""
    import pandas as pd

    get = risk.get
    for frame in frames:
        out_card, out_ts, out_amount, out_risk = [], [], [], []
        cols = (frame["card"].tolist(), frame["ts"].tolist(), frame["amount"].tolist(),
                frame["country"].tolist())
        for card, ts, amount, country in zip(*cols):
            state = get(card)
            if state is None:
                state = new_state(card % HOME_COUNTRIES)
            r = score(state, ts, amount, country)
            risk[card] = state
            if r > ALERT:
                out_card.append(card)
                out_ts.append(ts)
                out_amount.append(amount)
                out_risk.append(r)
        yield pd.DataFrame({"card": out_card, "ts": out_ts, "amount": out_amount,
                            "risk": out_risk})


ALERT_SCHEMA = "card long, ts double, amount double, risk double"


@dataclass
class PipelineResult:
    variant: str
    events: int
    cards: int
    batches: int
    seconds: float
    batch_seconds: list[float]
    alerts: int
    mismatches: int
    heap_entries_per_worker: int | None
    creations: dict[str, int]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def batch_ms(self, q: float) -> float:
        data = sorted(self.batch_seconds)
        if not data:
            return 0.0
        return 1000.0 * data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]


def spark_session(partitions: int = 4) -> Any:
    """A quiet local[2] session whose workers run this interpreter (reuses an active one)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Keep the driver on loopback: local mode needs no other interface.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("mlcache-demo")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(partitions))
             .config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_source(directory: str, events: int, cards: int, batches: int,
                 seed: int = 7) -> tuple[np.ndarray, int]:
    """One text file per micro-batch, ``ts,card,amount,country`` per line; returns the tally
    of transactions per card and the number of distinct cards."""
    os.makedirs(directory, exist_ok=True)
    stream = transactions(events, cards, seed=seed)
    per = math.ceil(events / batches)
    for b in range(batches):
        lo, hi = b * per, min(events, (b + 1) * per)
        lines = [f"{t:.6f},{c},{a:.2f},{k}" for t, c, a, k in zip(
            stream["ts"][lo:hi].tolist(), stream["card"][lo:hi].tolist(),
            stream["amount"][lo:hi].tolist(), stream["country"][lo:hi].tolist())]
        tmp = os.path.join(directory, f".part-{b:05d}.tmp")
        with open(tmp, "w") as fh:
            fh.write("\n".join(lines))
            fh.write("\n")
        os.replace(tmp, os.path.join(directory, f"part-{b:05d}.txt"))
    tally = np.bincount(stream["card"], minlength=cards)
    return tally, int(np.count_nonzero(tally))


def levels_for(variant: str, disk_path: str, redis: str | None, prefix: str) -> tuple[LevelConfig, ...]:
    if variant == "redis-only":
        return (RedisConfig(url=redis or "embedded", prefix=prefix),)
    levels: list[LevelConfig] = []
    if redis:
        levels.append(RedisConfig(url=redis, prefix=prefix))
    levels.append(DiskConfig(path=disk_path))
    return tuple(levels)


def _sum_stats(worker_stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    levels: dict[str, dict[str, Any]] = {}
    prefetch: dict[str, Any] = {}
    spark: dict[str, float] = {}
    for st in worker_stats.values():
        for name, lv in (st.get("levels") or {}).items():
            agg = levels.setdefault(name, {"hits": 0, "misses": 0})
            agg["hits"] += lv.get("hits") or 0
            agg["misses"] += lv.get("misses") or 0
        for k in ("hints", "prefetched", "useful", "wasted", "late", "dropped_hot"):
            prefetch[k] = prefetch.get(k, 0) + ((st.get("prefetch") or {}).get(k) or 0)
        for k, v in (st.get("spark") or {}).items():
            spark[k] = spark.get(k, 0) + v
    for agg in levels.values():
        total = agg["hits"] + agg["misses"]
        agg["hit_ratio"] = agg["hits"] / total if total else None
    done = prefetch.get("useful", 0) + prefetch.get("wasted", 0)
    prefetch["usefulness"] = prefetch["useful"] / done if done else None
    return {"levels": levels, "prefetch": prefetch, "spark": spark}


def run_pipeline(spark: Any, *, variant: str = "mlcache", events: int = 300_000,
                 cards: int = 75_000, batches: int = 15, partitions: int = 2,
                 heap_share: float = 0.05, redis: str | None = None, policy: str = "tac",
                 prefetch: bool = True, workdir: str | None = None,
                 progress: bool = True, check: bool = True,
                 metrics_port: int | None = None) -> PipelineResult:
    """Run the streaming job once. ``variant``: ``mlcache`` (each worker's heap holds
    ``heap_share`` of the cards), ``all-in-heap`` (the heap holds them all) or
    ``redis-only`` (no heap: every state access is a Redis round trip)."""
    from .integrations.spark import SparkCache

    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="mlcache-spark-demo-")
    run_id = f"{variant}-{uuid.uuid4().hex[:8]}"
    metrics = None
    failed = True
    try:
        src = os.path.join(workdir, run_id, "in")
        tally, distinct = write_source(src, events, cards, batches)
        if variant == "redis-only":
            # No heap means nowhere to prefetch into: hints would only add Redis reads.
            heap, per_worker, prefetch = None, None, False
        elif variant == "all-in-heap":
            per_worker = 2 * cards + 1024
            heap = HeapConfig(policy=policy, max_entries=per_worker, max_bytes=None)
        else:
            per_worker = max(64, int(distinct * heap_share))
            heap = HeapConfig(policy=policy, max_entries=per_worker, max_bytes=None)
        config = CacheConfig(heap=heap, namespace=run_id.replace("-", "_"),
                             levels=levels_for(variant, os.path.join(workdir, run_id, "disk"),
                                               redis, f"mlcache-demo-{run_id}"),
                             prefetch=PrefetchConfig(enabled=prefetch))
        cache = SparkCache(config, name="fraud", collect_stats=True)
        if metrics_port is not None:
            # The driver serves what each worker's manager published, labelled by worker.
            from .metrics import serve_stats

            metrics = serve_stats(cache.worker_stats, metrics_port)
            print(f"  metrics: {metrics.url} (mlcache stats --port {metrics.port})", flush=True)
        # Hints carry the worker's own clock (the default), not the transactions' timestamps: a
        # worker runs the partitions of a batch one after another, so event times go backwards
        # at every partition boundary, which a timestamp-ordered policy would misread.
        scorer = cache.pandas(score_frames, key="card", state="risk")
        alerts_path = os.path.join(workdir, run_id, "alerts.jsonl")
        per_batch = math.ceil(events / batches)
        batch_seconds: list[float] = []
        alerts_total = 0
        seen = [0, 0]

        def process(batch_df: Any, batch_id: int) -> None:
            nonlocal alerts_total
            t0 = time.perf_counter()
            alerts = (batch_df.repartition(partitions, "card")
                      .mapInPandas(scorer, ALERT_SCHEMA).collect())
            with open(alerts_path, "a") as sink:
                for a in alerts:
                    sink.write(json.dumps(a.asDict()) + "\n")
            dt = time.perf_counter() - t0
            batch_seconds.append(dt)
            alerts_total += len(alerts)
            if progress:
                agg = _sum_stats(cache.worker_stats())
                heap = agg["levels"].get("heap") or {"hits": 0, "misses": 0}
                hits, misses = heap["hits"] - seen[0], heap["misses"] - seen[1]
                seen[:] = [heap["hits"], heap["misses"]]
                moved = agg["spark"].get("ownership_changes", 0)
                n = min(per_batch, events - batch_id * per_batch)
                hr = f"{hits / (hits + misses):.1%}" if hits + misses else "-"
                print(f"  [{variant}] batch {batch_id:>3}: {n:>7,} tx in {dt:5.2f} s "
                      f"({n / dt:>8,.0f} tx/s), {len(alerts):>4} alerts, heap hit ratio {hr:>6}, "
                      f"partition moves so far {int(moved)}", flush=True)

        extracted = (spark.readStream.option("maxFilesPerTrigger", 1).text(src)
                     .selectExpr("split(value, ',') AS f")
                     .selectExpr("CAST(f[1] AS BIGINT) AS card", "CAST(f[0] AS DOUBLE) AS ts",
                                 "CAST(f[2] AS DOUBLE) AS amount", "CAST(f[3] AS INT) AS country"))
        start = time.perf_counter()
        query = (extracted.writeStream.foreachBatch(cache.foreach_batch(process))
                 .option("checkpointLocation", os.path.join(workdir, run_id, "checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
        finally:
            if query.isActive:
                query.stop()
        seconds = time.perf_counter() - start
        mismatches = 0
        if check:
            state = cache.snapshot("risk")
            seen = np.nonzero(tally)[0].tolist()
            mismatches = sum(1 for c in seen if (state.get(c) or {}).get("n") != int(tally[c]))
            mismatches += sum(1 for c in state if c >= len(tally) or not tally[c])
        result = PipelineResult(variant=variant, events=events, cards=distinct,
                                batches=len(batch_seconds), seconds=seconds,
                                batch_seconds=batch_seconds, alerts=alerts_total,
                                mismatches=mismatches, heap_entries_per_worker=per_worker,
                                creations=cache.creations(), stats=_sum_stats(cache.worker_stats()))
        failed = False
    finally:
        if metrics is not None:
            metrics.close()
        if redis and redis != "embedded":   # leave a shared server as we found it
            try:
                _forget_run(redis, f"mlcache-demo-{run_id}")
            except Exception:
                if not failed:   # (else the run's own failure is the error to see)
                    raise
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _forget_run(url: str, prefix: str) -> None:
    """Delete the keys a run left in a Redis it was given: its state and its epoch store (every
    key under the run's own prefix)."""
    import redis as redis_py

    client = redis_py.Redis.from_url(url)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=prefix.encode() + b"*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


def report(r: PipelineResult) -> str:
    lines = [
        f"{r.variant}: {r.events:,} transactions, {r.cards:,} cards, {r.batches} micro-batches "
        f"in {r.seconds:.1f} s",
        f"  records/s {r.throughput:,.0f}   batch latency p50 {r.batch_ms(0.5):,.0f} ms  "
        f"p99 {r.batch_ms(0.99):,.0f} ms   alerts {r.alerts:,}",
    ]
    if r.heap_entries_per_worker:
        lines.append(f"  state {r.cards:,} entries; heap budget {r.heap_entries_per_worker:,} "
                     f"entries per worker ({r.cards / (2 * r.heap_entries_per_worker):.1f}x "
                     f"smaller than the state, both workers together)")
    lines.append(f"  {'level':<8}{'hits':>12}{'misses':>12}{'hit ratio':>11}")
    for name, lv in r.stats.get("levels", {}).items():
        hr = lv.get("hit_ratio")
        lines.append(f"  {name:<8}{int(lv['hits']):>12,}{int(lv['misses']):>12,}"
                     f"{'-' if hr is None else f'{hr:.1%}':>11}")
    pf = r.stats.get("prefetch", {})
    if pf.get("hints"):
        use = pf.get("usefulness")
        lines.append(f"  prefetch: {int(pf['hints']):,} hints, {int(pf['prefetched']):,} "
                     f"prefetched, {int(pf['useful']):,} useful, {int(pf['wasted']):,} wasted, "
                     f"{int(pf['late']):,} late; usefulness "
                     f"{'-' if use is None else f'{use:.1%}'}")
    per = ", ".join(f"pid {w.split(':')[1]}: {n}" for w, n in sorted(r.creations.items()))
    lines.append(f"  manager creations per worker process: {per}")
    lines.append(f"  state check against an independent tally: {r.mismatches} cards differ")
    return "\n".join(lines)


def main(args: argparse.Namespace | None = None) -> int:
    """``mlcache demo [--quick] [--redis URL|embedded]`` (the Spark job)."""
    quick = bool(getattr(args, "quick", False))
    redis = getattr(args, "redis", None) or os.environ.get("MLCACHE_DEMO_REDIS")
    size = (dict(events=60_000, cards=20_000, batches=10) if quick
            else dict(events=300_000, cards=75_000, batches=15))
    where = "heap -> redis -> disk" if redis else "heap -> disk"
    print(f"mlcache demo (Spark local[2], Structured Streaming): {size['events']:,} card "
          f"transactions in {size['batches']} micro-batches through {where}"
          f"{' (quick)' if quick else ''}", flush=True)
    spark = spark_session()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
    try:
        result = run_pipeline(spark, redis=redis,
                              metrics_port=getattr(args, "metrics_port", None),
                              events=size["events"], cards=size["cards"],
                              batches=size["batches"])
    finally:
        spark.stop()
    print(report(result), flush=True)
    return 0 if result.mismatches == 0 else 1
