"""``mlcache bench spark``: the Spark demo pipeline, mlcache vs Redis-only vs all-in-heap.

One SparkSession (``local[2]``), one run of each variant over the same synthetic stream (the
streaming fraud-detection job of :mod:`mlcache.demo_spark`: file source, attribute extraction,
per-card risk state in a CacheableDict behind ``mapInPandas``, exactly-once ``foreachBatch``):

- ``mlcache``: heap (TAC, keyed prefetching) holding a twentieth of the cards per worker, so the
  two workers' heaps together hold a tenth of the state; the rest on local disk;
- ``redis-only``: no heap; every state access is a Redis round trip (``--redis URL``, else an
  embedded server);
- ``all-in-heap``: the heap holds every card (the state fits in memory), local disk below.

Every variant commits its state at the end of each partition (the same durability), and each
run's state is checked against an independent tally. A short warm-up job starts the Python
workers first so that no variant pays for it. Goals (issue 9): mlcache throughput at least 3x
Redis-only's, and mlcache's time at most 1.5x all-in-heap's.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from typing import Any

from ._report import BenchReport

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL", default=None,
                        help="Redis for the redis-only variant (default: an embedded server)")


def _row(report: BenchReport, r: Any) -> dict[str, Any]:
    heap = (r.stats.get("levels") or {}).get("heap") or {}
    pf = r.stats.get("prefetch") or {}
    return report.result(
        r.variant, events=r.events, cards=r.cards, batches=r.batches,
        seconds=round(r.seconds, 2), throughput=round(r.throughput, 1),
        p50_batch_ms=round(r.batch_ms(0.5), 1), p99_batch_ms=round(r.batch_ms(0.99), 1),
        heap_hit_ratio=heap.get("hit_ratio"),
        prefetch_usefulness=pf.get("usefulness"),
        heap_entries_per_worker=r.heap_entries_per_worker,
        mismatches=r.mismatches)


def run(args: argparse.Namespace) -> BenchReport:
    from ..demo_spark import run_pipeline, spark_session

    quick = bool(getattr(args, "quick", False))
    size = (dict(events=48_000, cards=16_000, batches=3) if quick
            else dict(events=240_000, cards=60_000, batches=6))
    report = BenchReport("spark", quick=quick)
    workdir = tempfile.mkdtemp(prefix="mlcache-bench-spark-")
    spark = spark_session()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
    try:
        run_pipeline(spark, variant="mlcache", events=4_000, cards=1_000, batches=2,
                     workdir=workdir, progress=False, check=False)     # warm-up: start workers
        results = {}
        for variant in ("all-in-heap", "mlcache", "redis-only"):
            print(f"-- {variant}", flush=True)
            redis = getattr(args, "redis", None) if variant == "redis-only" else None
            results[variant] = run_pipeline(spark, variant=variant, redis=redis,
                                            workdir=workdir, events=size["events"],
                                            cards=size["cards"], batches=size["batches"])
            _row(report, results[variant])
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ml, heap, rds = results["mlcache"], results["all-in-heap"], results["redis-only"]
    report.goal("throughput mlcache / redis-only", ml.throughput / rds.throughput, ">=", 3.0)
    report.goal("time mlcache / all-in-heap", ml.seconds / heap.seconds, "<=", 1.5)
    report.goal("state ratio (cards / heap entries of both workers)",
                ml.cards / (2 * (ml.heap_entries_per_worker or 1)), ">=", 10.0)
    report.goal("state mismatches (all variants)",
                sum(r.mismatches for r in results.values()), "==", 0)
    report.note("each variant: one run, same stream, same SparkSession (local[2]); throughput "
                "is records per second of wall time over all micro-batches")
    return report
