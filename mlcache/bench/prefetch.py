"""``mlcache bench prefetch``: keyed prefetching + TAC against caching alone and async I/O.

Two enrichment workloads, as in the Keyed Prefetching paper, each with state at least 10x the
heap, every variant at the same heap budget (entries), one process. The variants run in
interleaved rounds (``--rounds``, default 3, 2 with ``--quick``), the order rotated every round,
each run on a fresh manager over the same events: on a shared machine the load moves by more
than the differences measured, and running each variant in its own minutes compared the minutes,
not the code. A variant's throughput is its best round (median shown beside it), its latency
percentiles and hit ratio pool the measured records of all its rounds; ``cpu_us`` is the least
process CPU time per record over its rounds (fetch threads included).

* **ysb** (Yahoo Streaming Benchmark-like): ad events with Zipf(1.0) ad ids; each event is
  enriched with its ad's campaign metadata from a real Redis level (an embedded redis-server)
  and views are counted per campaign; optional ``--redis-delay-ms`` puts a TCP proxy between
  the job and the server that holds every transfer back by that long each way (a remote
  server; :mod:`mlcache.bench._proxy`).
* **nexmark** (NEXMark Q13-like): bids enriched by auction id from a large side table in the
  disk level; optional ``--backend-delay-ms`` sleeps before every batched read of that level to
  emulate remote storage. Revenue is summed per category.

Variants: ``cache-lru`` and ``cache-clock`` (a blocking get per record); ``async-io`` (a hit is
processed at once, a miss is handed to a pool of ``fetch_threads`` and processed when its fetch
completes, out of order, at most 64 outstanding — Flink's unordered async I/O; no hints);
``keyed+tac`` (the :func:`~mlcache.prefetching` operator with ``depth="auto"`` over a TAC heap);
on ysb also ``keyed+tac/no-filter`` (hot-key filter off), the reference for the filter's goals.

Per-record latency is the time the processing thread spends on a record: from asking the input
for it (``next``) until its state was read and applied; for async-io from asking for the record
until its deferred processing ends. It includes what the keyed operator does inside ``next`` --
reading and hinting a later record, reading a batch of later records' keys (``fetch_mode``
inline: the backend reads themselves), installing reads the fetch threads staged: that work
runs on the same thread, between the previous record's result and this one's, so this record
waits for it exactly as a cache-lru record waits for its own blocking miss. (Until session 9
the clock started when ``next`` returned, which left the keyed variant's inline state reads
out of its latency while every baseline's reads were in: ysb --quick p999 0.018 ms in the step
against 4.1 ms in ``next``.) The two shares are also reported apart: ``step_p999_ms`` (the
step alone) and ``next_us`` (mean), ``next_p999_us``. The input is a batch known in full (a
micro-batch). The first 10% of records warm the heap and are not measured.
Every variant must produce exactly the same aggregates (checked, column ``same``).
"""
from __future__ import annotations

import abc
from array import array
import argparse
import gc
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from ..config import CacheConfig, DiskConfig, HeapConfig, PrefetchConfig, RedisConfig
from ._delayed import Delay, DelayedLevelConfig
from ._proxy import DelayProxy
from ._report import BenchReport, int_arg, nonnegative_float_arg

__all__ = ["add_arguments", "run"]

VARIANTS = ("cache-lru", "cache-clock", "async-io", "keyed+tac")
ASYNC_CAPACITY = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=("ysb", "nexmark", "both"), default="both")
    parser.add_argument("--backend-delay-ms", type=nonnegative_float_arg, default=0.0,
                        help="sleep before every batched read of the nexmark disk level")
    parser.add_argument("--redis-delay-ms", type=nonnegative_float_arg, default=0.0,
                        help="ysb: a TCP proxy holding every transfer between the job and "
                             "Redis back by this many ms each way (a remote server; slow: "
                             "the blocking variants wait for it on every miss)")
    parser.add_argument("--hot-threshold", type=_hot_threshold, default=None,
                        help="hot-key filter threshold for keyed+tac, 0..16 (default: the "
                             "config's)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int_arg(1), default=None,
                        help="interleaved rounds per variant (default 3, 2 with --quick)")


def _hot_threshold(text: str) -> int:
    """0..16, what PrefetchConfig accepts (checked here, before any workload is built)."""
    n = int_arg(0)(text)
    if n > 16:
        raise argparse.ArgumentTypeError(f"must be at most 16, got {n}")
    return n


# -- workloads ----------------------------------------------------------------------------------

def _zipf_ranks(n: int, s: float, count: int, rng: random.Random) -> list[int]:
    weights = [1.0 / (r ** s) for r in range(1, n + 1)]
    perm = list(range(n))
    rng.shuffle(perm)          # popularity is not correlated with key order
    ranks = rng.choices(range(n), weights=weights, k=count)
    return [perm[r] for r in ranks]


class Workload(abc.ABC):
    name = ""
    keys: int
    events: list[tuple]

    @abc.abstractmethod
    def table(self) -> Iterator[tuple[Any, Any]]:
        """The side table: (key, value) pairs stored in the lower level before the run."""

    @abc.abstractmethod
    def levels(self) -> tuple:
        """The level configs below the heap."""

    @abc.abstractmethod
    def process(self, agg: Counter, event: tuple, value: Any) -> None:
        """Apply one enriched event to the aggregate."""

    def close(self) -> None:
        return None


class YSB(Workload):
    name = "ysb"

    def __init__(self, quick: bool, rng: random.Random, redis_url: str) -> None:
        self.keys = 20_000 if quick else 100_000
        n_events = 40_000 if quick else 200_000
        self.redis_url = redis_url
        ads = _zipf_ranks(self.keys, 1.0, n_events, rng)
        kinds = ("view", "click", "purchase")
        self.events = [(f"ad{a}", kinds[rng.randrange(3)], i) for i, a in enumerate(ads)]
        self.campaigns = 1000

    def table(self) -> Iterator[tuple[Any, Any]]:
        for a in range(self.keys):
            yield f"ad{a}", {"campaign": a % self.campaigns, "advertiser": f"adv{a % 97}",
                             "budget": float(a % 1000), "tags": ["sport", "news", str(a % 13)]}

    def levels(self) -> tuple:
        return (RedisConfig(url=self.redis_url, prefix="bench-prefetch"),)

    def process(self, agg: Counter, event: tuple, value: Any) -> None:
        if event[1] == "view":
            agg[value["campaign"]] += 1


class NexmarkQ13(Workload):
    name = "nexmark"

    def __init__(self, quick: bool, rng: random.Random, delay_ms: float) -> None:
        self.keys = 40_000 if quick else 200_000
        n_events = 40_000 if quick else 200_000
        self.dir = tempfile.mkdtemp(prefix="mlcache-bench-q13-")
        self.delay = Delay(delay_ms / 1000.0)
        auctions = _zipf_ranks(self.keys, 0.6, n_events, rng)
        self.events = [(a, rng.randrange(1, 1000), i) for i, a in enumerate(auctions)]

    def table(self) -> Iterator[tuple[Any, Any]]:
        for a in range(self.keys):
            yield a, {"seller": a % 5000, "category": a % 20, "reserve": a % 777,
                      "item": f"item-{a}", "expires": 1_700_000_000 + a}

    def levels(self) -> tuple:
        return (DelayedLevelConfig(inner=DiskConfig(path=self.dir), delay=self.delay),)

    def process(self, agg: Counter, event: tuple, value: Any) -> None:
        agg[value["category"]] += event[1]

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# -- variants -----------------------------------------------------------------------------------

def _config(wl: Workload, policy: str, hot_threshold: int | None, prefetch: bool) -> CacheConfig:
    pf = PrefetchConfig(enabled=prefetch) if hot_threshold is None else \
        PrefetchConfig(enabled=prefetch, hot_threshold=hot_threshold)
    return CacheConfig(heap=HeapConfig(policy=policy, max_entries=wl.keys // 10, max_bytes=None),
                       levels=wl.levels(), namespace=f"bench-{wl.name}", prefetch=pf)


def _populate(wl: Workload) -> None:
    from ..manager import CacheManager

    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=10_000, max_bytes=None),
                      levels=wl.levels(), namespace=f"bench-{wl.name}",
                      prefetch=PrefetchConfig(enabled=False))
    with CacheManager(cfg) as m:
        batch: list = []
        for item in wl.table():
            batch.append(item)
            if len(batch) == 5000:
                m.put_many(batch)
                batch = []
        m.put_many(batch)
        m.checkpoint()


def _drive(m: Any, wl: Workload, events: Any, agg: Counter, lat: list, hits: list,
           nxt_t: list, step: list) -> None:
    """Feed ``events`` to the stateful step one record at a time, timing both shares: getting
    the next record (``nxt_t``: for the keyed variant, read-ahead, hinting and inline reads)
    and the step (``step``); a record's latency (``lat``) is the two together.

    The residency probe (instrumentation for the hit ratio) runs between the two clock pairs
    and the bookkeeping appends after them, so neither is in the latency. (They used to be inside:
    a list append that grows the list copies it, tens of microseconds for lists this long,
    about once per thousand records -- right at the p999 of a step that is a heap hit.)"""
    get, resident, enc, process = m.get, m._resident, m._encode_key, wl.process
    clock = time.perf_counter
    nxt = iter(events).__next__
    while True:
        t = clock()
        try:
            ev = nxt()
        except StopIteration:
            break
        t_next = clock()
        hit = resident(enc(ev[0]))
        t0 = clock()
        process(agg, ev, get(ev[0], ts=ev[2]))
        t1 = clock()
        lat.append((t_next - t) + (t1 - t0))
        step.append(t1 - t0)
        nxt_t.append(t_next - t)
        hits.append(hit)


def _blocking(m: Any, wl: Workload, agg: Counter, lat: list, hits: list, nxt_t: list,
              step: list) -> None:
    _drive(m, wl, wl.events, agg, lat, hits, nxt_t, step)


def _keyed(m: Any, wl: Workload, agg: Counter, lat: list, hits: list, nxt_t: list,
           step: list) -> None:
    from ..prefetch import prefetching

    it = prefetching(wl.events, key=lambda ev: ev[0], ts=lambda ev: ev[2], cache=m)
    _drive(m, wl, it, agg, lat, hits, nxt_t, step)


def _async_io(m: Any, wl: Workload, agg: Counter, lat: list, hits: list, nxt_t: list,
              step: list) -> None:
    get, resident, enc, process = m.get, m._resident, m._encode_key, wl.process
    clock = time.perf_counter
    outstanding: deque = deque()
    n = m.config.prefetch.fetch_threads
    with ThreadPoolExecutor(n, thread_name_prefix="bench-async-io") as pool:
        def finish(block: bool) -> None:
            while outstanding and (block or outstanding[0][3].done()):
                ev, t, t0, fut = outstanding.popleft()
                process(agg, ev, fut.result())
                t1 = clock()
                lat.append(t1 - t)
                step.append(t1 - t0)
                block = False

        nxt = iter(wl.events).__next__
        while True:
            t = clock()
            try:
                ev = nxt()
            except StopIteration:
                break
            t0 = clock()
            # (deciding by residency is this variant's own logic, so it is timed)
            hit = resident(enc(ev[0]))
            if hit:
                process(agg, ev, get(ev[0], ts=ev[2]))
                t1 = clock()
                lat.append(t1 - t)
                step.append(t1 - t0)
            else:
                outstanding.append((ev, t, t0, pool.submit(get, ev[0], None, ts=ev[2])))
            nxt_t.append(t0 - t)
            hits.append(hit)
            if outstanding and outstanding[0][3].done():
                finish(False)
            if len(outstanding) >= ASYNC_CAPACITY:
                finish(True)
        while outstanding:
            finish(True)
    # unordered completion: the warm-up cut below is by completion order, like the others


RUNNERS: dict[str, tuple[str, Callable, bool]] = {
    "cache-lru": ("lru", _blocking, False),
    "cache-clock": ("clock", _blocking, False),
    "async-io": ("lru", _async_io, False),
    "keyed+tac": ("tac", _keyed, True),
    "keyed+tac/no-filter": ("tac", _keyed, True),
}


def _pct(sorted_lat: list[float], q: float) -> float:
    return sorted_lat[min(len(sorted_lat) - 1, int(q * len(sorted_lat)))] * 1000.0


def _run_variant(wl: Workload, variant: str, hot_threshold: int | None) -> dict[str, Any]:
    """One run of one variant on a fresh manager: its measured records and totals."""
    from ..manager import CacheManager

    policy, runner, prefetch = RUNNERS[variant]
    if variant.endswith("no-filter"):
        hot_threshold = 16
    m = CacheManager(_config(wl, policy, hot_threshold, prefetch))
    agg: Counter = Counter()
    lat: list[float] = []
    step: list[float] = []
    hits: list[bool] = []
    nxt_t: list[float] = []
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        runner(m, wl, agg, lat, hits, nxt_t, step)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        pstats = m.stats().get("prefetch", {}) if prefetch else {}
    finally:
        m.close()
    warm = len(lat) // 10
    # (arrays, not lists of floats: every round of every variant is kept until the summary)
    return {"lat": array("d", lat[warm:]), "step": array("d", step[warm:]),
            "hits": (sum(hits[warm:]), len(hits) - warm),
            "next": array("d", nxt_t), "next_measured": array("d", nxt_t[warm:]),
            "throughput": len(lat) / elapsed, "cpu_us": cpu / max(1, len(lat)) * 1e6,
            "agg": agg, "pstats": pstats}


def _summary(variant: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for a variant from its rounds.

    Throughput is the best round's (and the median is shown): another job's load only ever
    takes throughput away, so the best of rounds run interleaved with the other variants is the
    estimate of what the code itself costs, and each variant had the same chances at the quiet
    minutes. Latency percentiles and hit ratio pool every measured record of every round (more
    samples for the p999; a slow round counts, it is not averaged away)."""
    lat = sorted(x for r in runs for x in r["lat"])
    step = sorted(x for r in runs for x in r["step"])
    hit_n = sum(r["hits"][1] for r in runs)
    nxt = [x for r in runs for x in r["next"]]
    nxt_m = sorted(x for r in runs for x in r["next_measured"])
    thr = sorted(r["throughput"] for r in runs)
    row = {
        "p50_ms": _pct(lat, 0.50), "p99_ms": _pct(lat, 0.99), "p999_ms": _pct(lat, 0.999),
        "step_p999_ms": _pct(step, 0.999),
        "throughput": thr[-1], "thr_median": statistics.median(thr),
        "cpu_us": min(r["cpu_us"] for r in runs),
        "hit_ratio": sum(r["hits"][0] for r in runs) / max(1, hit_n),
        "next_us": sum(nxt) / max(1, len(nxt)) * 1e6,
        "next_p999_us": _pct(nxt_m, 0.999) * 1000.0 if nxt_m else 0.0,
    }
    if RUNNERS[variant][2]:
        hints = sum(r["pstats"].get("hints", 0) for r in runs)
        row["hot_dropped"] = sum(r["pstats"].get("dropped_hot", 0) for r in runs) / max(1, hints)
        row["late"] = max(r["pstats"].get("late", 0) for r in runs)
        row["depth"] = runs[-1]["pstats"].get("depth")
    return row


def _one_workload(report: BenchReport, wl: Workload, args: argparse.Namespace,
                  rounds: int) -> None:
    _populate(wl)
    variants = list(VARIANTS) + (["keyed+tac/no-filter"] if wl.name == "ysb" else [])
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    # Interleaved rounds, the order rotated every round: the variants share the machine's
    # load changes instead of each getting its own minutes of it.
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            runs[v].append(_run_variant(wl, v, args.hot_threshold))
    ref = runs["cache-lru"][0]["agg"]
    rows: dict[str, dict[str, Any]] = {}
    equal = 0
    for v in variants:
        same = all(r["agg"] == ref for r in runs[v])
        equal += same
        rows[v] = _summary(v, runs[v])
        report.result(f"{wl.name}:{v}", **rows[v], same=same)
    lru, keyed = rows["cache-lru"], rows["keyed+tac"]
    paired = [k["throughput"] / c["throughput"] for k, c in zip(runs["keyed+tac"], runs["cache-lru"])]
    report.note(f"{wl.name}: {rounds} interleaved rounds; throughput keyed / cache-lru per round: "
                + ", ".join(f"{x:.2f}" for x in paired))
    values = [keyed["p999_ms"] / lru["p999_ms"], keyed["p50_ms"] / lru["p50_ms"],
              keyed["throughput"] / lru["throughput"], equal]
    if wl.name == "ysb":
        nf = rows["keyed+tac/no-filter"]
        values += [keyed["hot_dropped"], keyed["hit_ratio"] - nf["hit_ratio"]]
    for (name, op, target), value in zip(_goal_specs(wl.name), values, strict=True):
        report.goal(name, value, op, target)


def _goal_specs(workload: str) -> list[tuple[str, str, float]]:
    """Issue 5's goals for one workload: (name, comparison, target)."""
    variants = len(VARIANTS) + (1 if workload == "ysb" else 0)
    specs: list[tuple[str, str, float]] = [
        (f"{workload}: p999 keyed / p999 cache-lru", "<=", 0.2),
        (f"{workload}: p50 keyed / p50 cache-lru", "<=", 1.0),
        (f"{workload}: throughput keyed / cache-lru", ">=", 1.0),
        (f"{workload}: variants with results equal to cache-lru", "==", variants)]
    if workload == "ysb":
        specs += [("ysb (Zipf 1.0): share of hints dropped as hot", ">=", 0.5),
                  ("ysb (Zipf 1.0): hit ratio with filter - without filter", ">=", -0.001)]
    return specs


def run(args: argparse.Namespace) -> BenchReport:
    from .._redis_server import RedisServer

    quick = bool(getattr(args, "quick", False))
    report = BenchReport("prefetch", quick=quick)
    which = getattr(args, "workload", "both")
    rng = random.Random(getattr(args, "seed", 7))
    delay_ms = float(getattr(args, "backend_delay_ms", 0.0) or 0.0)
    rounds = getattr(args, "rounds", None) or (2 if quick else 3)
    redis_delay_ms = float(getattr(args, "redis_delay_ms", 0.0) or 0.0)
    if which in ("ysb", "both"):
        server = RedisServer().start()
        proxy = None
        try:
            url = server.url
            where = "embedded redis-server"
            if redis_delay_ms > 0:
                proxy = DelayProxy(server.port, redis_delay_ms).start()
                url = proxy.url
                where += (f" behind a proxy delaying every transfer {redis_delay_ms} ms each "
                          "way (its CPU, in its own process, is not in cpu_us)")
            wl = YSB(quick, rng, url)
            report.note(f"ysb: {wl.keys} ads (Zipf 1.0), {len(wl.events)} events, heap "
                        f"{wl.keys // 10} entries, Redis level ({where})")
            _one_workload(report, wl, args, rounds)
        finally:
            if proxy is not None:
                proxy.stop()
            server.cleanup()
    if which in ("nexmark", "both"):
        wl2 = NexmarkQ13(quick, rng, delay_ms)
        try:
            report.note(f"nexmark: {wl2.keys} auctions (Zipf 0.6), {len(wl2.events)} bids, heap "
                        f"{wl2.keys // 10} entries, disk level, backend delay {delay_ms} ms/batch")
            _one_workload(report, wl2, args, rounds)
        finally:
            wl2.close()
    for name in ("ysb", "nexmark"):
        if which not in (name, "both"):
            # a run of one workload still lists the other's goals, as not run
            for goal, op, target in _goal_specs(name):
                report.unmeasured(goal, op, target, f"not run (--workload {which})")
    report.note("latency = the processing thread's time per record: getting it from the input "
                "(for keyed+tac its read-ahead and inline reads) plus the stateful step; "
                "step_p999_ms is the step alone, next_us/next_p999_us the input's share (see "
                "the module docstring); the first 10% of records warm the heap and are not "
                "measured")
    return report
