"""``mlcache bench levels``: what the manager adds over its levels, measured in one process.

Three experiments, each against a baseline run in the same process on the same data:

1. **Heap hits.** ``manager.get`` on keys that are all in the heap versus
   ``cachetools.LRUCache.get`` on the same Zipf trace. Goal: at least half the throughput.
2. **Batched transfers to Redis.** Per-key cost of ``manager.flush()`` to Redis versus one raw
   pipeline of 100 SETs, and of a batched miss (``get_many`` of 100 keys not in the heap) versus
   one raw ``MGET`` of 100, on the same encoded values. Goal: at most 2x.
3. **DEBS'22 synthetic experiment**, scaled to this machine: 100 objects of 1 MB, Zipf (s=0.99)
   accesses; every access computes a CRC32 of the object's bytes and updates one field in place,
   so write-back is exercised. The heap holds 10/20/30% of the state over Redis; baselines are
   all objects in the heap as plain Python objects and Redis only (GET, decode, work, encode,
   SET). Slowdowns are printed beside the paper's. The slowdown depends on the work per access,
   so the goal is on what the manager adds, as the issue states it: its time must stay within
   1.15x of ``all-in-heap time + misses x (raw GET + decode) + write-backs x raw SET``.
   The bound is measured as one program, right after the run it bounds: the same trace on
   the plain objects with the run's misses and write-backs done as raw redis-py calls spread
   evenly over it (a write-back: SET of the object's bytes, encoded beforehand). Summing
   per-operation costs sampled in short loops before and after a run instead swung the ratio
   by 0.3-0.5 between runs on a shared machine (a 60-call sample against a 3 s run); that
   sum is still printed beside (``vs_summed_bound``), and so is the ratio to a bound that also
   encodes the object before each SET (``vs_bound_with_encode``), which served as the goal
   while a write-back's encoding copied every payload twice: it now sends the object's own
   bytes (:meth:`mlcache.codec.Codec.encode_parts`), so a raw SET is the fair comparison.

Redis is a private server started by the benchmark (``mlcache._redis_server.RedisServer``).
The timing loops take the best of a few repetitions: the machine is shared and the question is
what the code costs, not what the neighbours cost.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
import uuid
import zlib
from typing import Any, Callable

import numpy as np

from ..config import CacheConfig, HeapConfig, RedisConfig
from ._report import BenchReport, redis_url_arg

__all__ = ["add_arguments", "run"]

MB = 1 << 20
PAPER_SLOWDOWN = {0.1: 2.2, 0.3: 1.8}
PAPER_REDIS_ONLY = 12.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=None, type=redis_url_arg,
                        help="use this Redis instead of starting a private server")


def zipf_trace(n_keys: int, length: int, s: float, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_keys + 1) ** s
    ranks = rng.choice(n_keys, size=length, p=weights / weights.sum())
    return rng.permutation(n_keys)[ranks].tolist()


def _drop_prefix(config: Any) -> None:
    """Delete what a run left under its Redis prefix (the server may be the user's)."""
    from ..levels.redis import RedisLevel

    level = RedisLevel(config)
    level.delete_many(list(level.scan(b"")))
    level.close()


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


# -- 1. heap hits -----------------------------------------------------------------------------

def bench_heap_hits(report: BenchReport, quick: bool) -> None:
    import cachetools

    from ..manager import CacheManager

    n_keys = 10_000
    trace = zipf_trace(n_keys, 100_000 if quick else 400_000, 0.99, seed=1)
    value = {"count": 1, "total": 2.5}

    lru: cachetools.LRUCache[int, Any] = cachetools.LRUCache(maxsize=n_keys)
    for k in range(n_keys):
        lru[k] = value

    def time_lru() -> float:
        get = lru.get
        start = time.perf_counter()
        for k in trace:
            get(k)
        return time.perf_counter() - start

    managers = {}
    for policy in ("wtinylfu", "lru"):
        m = CacheManager(CacheConfig(heap=HeapConfig(policy=policy, max_entries=2 * n_keys,
                                                     max_bytes=None), levels=()))
        m.put_many((k, value) for k in range(n_keys))
        managers[policy] = m

    def time_manager(m: Any) -> Callable[[], float]:
        def go() -> float:
            get = m.get
            start = time.perf_counter()
            for k in trace:
                get(k)
            return time.perf_counter() - start
        return go

    # Repetitions interleaved (LRU, then each manager, in turn), the best of each kept: this
    # machine's speed moves by up to 1.8x for seconds at a time, and timing one contender's
    # repetitions after the other's compared the two across such swings (ratios 0.38-0.90
    # between full runs of the same code).
    repeats = 5
    timers = {"cachetools": time_lru,
              **{f"manager {policy}": time_manager(m) for policy, m in managers.items()}}
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, fn in timers.items():
            t = fn()
            best[name] = min(t, best.get(name, t))
    t_lru = best["cachetools"]
    report.result("heap hit: cachetools.LRUCache.get", ops=len(trace),
                  throughput=len(trace) / t_lru)
    ratios = {}
    for policy, m in managers.items():
        t = best[f"manager {policy}"]
        hits = m.stats()["levels"]["heap"]["hits"]
        assert hits >= len(trace), "every lookup must be a heap hit"
        ratios[policy] = t_lru / t
        report.result(f"heap hit: manager.get ({policy} heap)", ops=len(trace),
                      throughput=len(trace) / t, vs_lru=ratios[policy])
        m.close()
    report.goal("heap-hit get throughput: manager (default heap) / cachetools.LRUCache",
                ratios["wtinylfu"], ">=", 0.5)


# -- 2. batched transfers ---------------------------------------------------------------------

def bench_batches(report: BenchReport, url: str, quick: bool) -> None:
    """Flush and batched miss vs raw pipelines/MGETs of 100 on the same keys and values.

    Baseline and manager do the same sweep (every key once, in batches of 100) and are timed
    the same way (the best of five sweeps, taken alternately, so both see the same machine
    load). Timing one raw batch of 100 against a sweep of 10,000 keys, as this did before,
    compared a hot repeat of 100 keys (and its median) with a cold sweep including every
    scheduling delay of a loaded machine, which on a shared two-core box is most of the time.
    The raw side sends the manager's own canonical Redis keys; its values are encoded once
    beforehand (the manager's encode and decode stay on its side of the ratio).
    """
    import redis

    from ..codec import Codec
    from ..manager import CacheManager

    n = 2_000 if quick else 10_000
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    values = {("card", i): {"count": i, "total": i * 1.5, "recent": [1.0, 2.0, 3.5]}
              for i in range(n)}
    config = CacheConfig(heap=HeapConfig(max_entries=4 * n, max_bytes=None),
                         levels=(RedisConfig(url=url, prefix=prefix),), namespace="batches")
    codec = Codec()
    client: Any = redis.Redis.from_url(url)
    with CacheManager(config) as m:
        level_prefix = m._levels[0].prefix
        full_keys = [level_prefix + m._kb(key) for key in values]
    raw_keys = [k + b"-raw" for k in full_keys]
    raw_values = [codec.encode(v) for v in values.values()]
    batches = range(0, n, 100)

    def flush_once(round_: int) -> float:
        with CacheManager(config) as m:
            m.get("warm-up")                   # the connection, not the flush, pays for itself
            for key, v in values.items():
                m.put(key, {**v, "round": round_})
            gc.collect()
            start = time.perf_counter()
            m.flush()
            return (time.perf_counter() - start) / n

    def pipeline_sweep() -> float:
        gc.collect()
        start = time.perf_counter()
        for i in batches:
            pipe = client.pipeline(transaction=False)
            for k, v in zip(raw_keys[i:i + 100], raw_values[i:i + 100]):
                pipe.set(k, v)
            pipe.execute()
        return (time.perf_counter() - start) / n

    def miss_once() -> float:
        with CacheManager(config) as m:
            m.get("warm-up")
            keys = list(values)
            gc.collect()
            start = time.perf_counter()
            for i in batches:
                got = m.get_many(keys[i:i + 100])
                assert len(got) == len(keys[i:i + 100])
            return (time.perf_counter() - start) / n

    def mget_sweep(decode: bool = False) -> float:
        gc.collect()
        start = time.perf_counter()
        for i in batches:
            got = client.mget(full_keys[i:i + 100])
            if decode:
                for raw in got:
                    codec.decode(raw)
        return (time.perf_counter() - start) / n

    def mset_sweep() -> float:
        gc.collect()
        start = time.perf_counter()
        for i in batches:
            client.mset(dict(zip(raw_keys[i:i + 100], raw_values[i:i + 100])))
        return (time.perf_counter() - start) / n

    repeats = 3 if quick else 5
    flushes, pipes, msets = [], [], []
    for r in range(repeats):
        flushes.append(flush_once(r))
        pipes.append(pipeline_sweep())
        msets.append(mset_sweep())
    misses, mgets, mget_decodes = [], [], []
    for _ in range(repeats):
        misses.append(miss_once())
        mgets.append(mget_sweep())
        mget_decodes.append(mget_sweep(decode=True))
    flush_per_key, raw_set, raw_mset = min(flushes), min(pipes), min(msets)
    miss_per_key, raw_mget, raw_mget_decode = min(misses), min(mgets), min(mget_decodes)
    _drop_prefix(config.levels[0])
    for i in batches:
        client.delete(*raw_keys[i:i + 100])
    client.close()

    us = 1e6
    report.result("redis raw: pipeline of 100 SETs", per_key_us=raw_set * us)
    report.result("redis raw: MSET of 100", per_key_us=raw_mset * us)
    report.result("redis raw: MGET of 100", per_key_us=raw_mget * us)
    report.result("redis raw: MGET of 100 + decode (reference)", per_key_us=raw_mget_decode * us)
    report.result("manager.flush() -> redis (encode + write)", keys=n,
                  per_key_us=flush_per_key * us)
    report.result("manager.get_many(100 misses) <- redis (read + decode)", keys=n,
                  per_key_us=miss_per_key * us, vs_mget_decode=miss_per_key / raw_mget_decode)
    report.goal("flush to redis per key / raw pipeline of 100 SETs per key",
                flush_per_key / raw_set, "<=", 2.0)
    report.goal("batched miss per key / raw MGET of 100 per key",
                miss_per_key / raw_mget, "<=", 2.0)


# -- 3. DEBS'22 synthetic experiment ----------------------------------------------------------

def _make_object(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 + i)
    return {"id": i, "updates": 0, "checksum": 0, "payload": rng.bytes(MB)}


def _work(obj: dict[str, Any]) -> None:
    """The fixed work per access: a CRC32 of the bytes and one field updated in place."""
    obj["checksum"] = zlib.crc32(obj["payload"])
    obj["updates"] += 1


def bench_debs(report: BenchReport, url: str, quick: bool) -> None:
    import redis

    from ..codec import Codec
    from ..manager import CacheManager

    n_objects = 100
    accesses = 600 if quick else 3_000
    trace = zipf_trace(n_objects, accesses, 0.99, seed=22)
    codec = Codec()

    # Baseline: every object in the heap as a plain Python object.
    plain = {i: _make_object(i) for i in range(n_objects)}

    def all_in_heap() -> float:
        start = time.perf_counter()
        for i in trace:
            _work(plain[i])
        return time.perf_counter() - start

    t_heap = best_of(3, all_in_heap)
    report.result("debs: all in heap (plain objects)", accesses=accesses, seconds=t_heap,
                  slowdown=1.0)

    # Raw transfer costs, measured on the same objects and the same server.
    client: Any = redis.Redis.from_url(url)
    prefix = f"debs-{uuid.uuid4().hex[:8]}"
    raw_keys = [f"{prefix}-raw:{i}".encode() for i in range(n_objects)]
    encoded = [codec.encode(plain[i]) for i in range(n_objects)]
    for k, v in zip(raw_keys, encoded):
        client.set(k, v)
    sample = range(0, n_objects, 5)

    def raw_get_decode() -> float:
        start = time.perf_counter()
        for i in sample:
            codec.decode(client.get(raw_keys[i]))
        return (time.perf_counter() - start) / len(sample)

    def raw_set() -> float:
        start = time.perf_counter()
        for i in sample:
            client.set(raw_keys[i], encoded[i])
        return (time.perf_counter() - start) / len(sample)

    def raw_encode() -> float:
        start = time.perf_counter()
        for i in sample:
            codec.encode(plain[i])
        return (time.perf_counter() - start) / len(sample)

    def transfer_costs() -> tuple[float, float, float]:
        return (statistics.median(raw_get_decode() for _ in range(3)),
                statistics.median(raw_set() for _ in range(3)),
                statistics.median(raw_encode() for _ in range(3)))

    measured = [transfer_costs()]

    # Redis only: get, work, put back, for every access.
    def redis_only() -> float:
        start = time.perf_counter()
        for i in trace:
            obj = codec.decode(client.get(raw_keys[i]))
            _work(obj)
            client.set(raw_keys[i], codec.encode(obj))
        return time.perf_counter() - start

    t_redis = redis_only()

    def replay(misses: int, writes: int, with_encode: bool) -> float:
        """The bound run as one program: the trace's work on the plain objects, with ``misses``
        raw GET + decode and ``writes`` raw SETs of the object's encoding spread evenly over
        it; ``with_encode``: each SET encodes the object first (the revised bound), else it
        sends bytes encoded beforehand (the issue's bound: a raw SET)."""
        n = len(trace)
        got = put = 0
        get, put_raw, decode, encode = client.get, client.set, codec.decode, codec.encode
        start = time.perf_counter()
        for k, i in enumerate(trace, 1):
            _work(plain[i])
            while got * n < misses * k:
                decode(get(raw_keys[i]))
                got += 1
            while put * n < writes * k:
                put_raw(raw_keys[i], encode(plain[i]) if with_encode else encoded[i])
                put += 1
        return time.perf_counter() - start

    def mlcache_run(fraction: float, run_id: int) -> dict[str, float]:
        config = CacheConfig(
            heap=HeapConfig(max_bytes=int(fraction * n_objects * MB * 1.02)),
            levels=(RedisConfig(url=url, prefix=f"{prefix}-{int(fraction * 100)}-{run_id}"),),
            namespace="debs")
        with CacheManager(config) as m:
            for i in range(n_objects):
                m.put(i, _make_object(i))
            m.flush()
            before = m.stats()["levels"]
            gc.collect()
            start = time.perf_counter()
            for i in trace:
                obj = m.get(i)
                _work(obj)
                m.put(i, obj)
            m.flush()
            elapsed = time.perf_counter() - start
            after = m.stats()["levels"]
        _drop_prefix(config.levels[0])
        misses = after["heap"]["misses"] - before["heap"]["misses"]
        writes = after["redis"]["keys_written"] - before["redis"]["keys_written"]
        # The bound, measured right after the run it bounds, under the same load: the same
        # accesses on plain objects with this run's transfers done raw, in one timed loop.
        gc.collect()
        bound = replay(misses, writes, with_encode=False)
        gc.collect()
        bound_encode = replay(misses, writes, with_encode=True)
        return {"elapsed": elapsed, "misses": misses, "writes": writes, "bound": bound,
                "bound_encode": bound_encode}

    runs = {}
    for fraction in (0.1, 0.2, 0.3):
        # Runs each followed by its bound (three, two with --quick); the best of each side:
        # the machine is shared and the question is what the code costs, as in every loop here.
        pair = [mlcache_run(fraction, r) for r in range(2 if quick else 3)]
        measured.append(transfer_costs())
        best = min(pair, key=lambda run: run["elapsed"])
        runs[fraction] = dict(best, bound=min(run["bound"] for run in pair),
                              bound_encode=min(run["bound_encode"] for run in pair))
    client.delete(*raw_keys)
    client.close()

    get_cost = statistics.median(g for g, _, _ in measured)
    set_cost = statistics.median(s for _, s, _ in measured)
    encode_cost = statistics.median(e for _, _, e in measured)
    report.result("debs: raw GET + decode of 1 MB", per_op_ms=get_cost * 1e3)
    report.result("debs: raw SET of 1 MB", per_op_ms=set_cost * 1e3)
    report.result("debs: encode of 1 MB (bytes; the bound with encode adds one per write-back)",
                  per_op_ms=encode_cost * 1e3)
    report.result("debs: redis only (GET, work, SET)", accesses=accesses, seconds=t_redis,
                  slowdown=t_redis / t_heap, paper=PAPER_REDIS_ONLY)
    for fraction, run in runs.items():
        # The same bound summed from per-operation costs sampled in short loops, for
        # comparison with earlier reports (noisier than the replay).
        summed = t_heap + run["misses"] * get_cost + run["writes"] * set_cost
        report.result(f"debs: mlcache heap {fraction:.0%} -> redis", accesses=accesses,
                      seconds=run["elapsed"], slowdown=run["elapsed"] / t_heap,
                      paper=PAPER_SLOWDOWN.get(fraction, "-"),
                      hit_ratio=1 - run["misses"] / accesses, misses=int(run["misses"]),
                      write_backs=int(run["writes"]), transfer_bound_s=run["bound"],
                      vs_bound_with_encode=run["elapsed"] / run["bound_encode"],
                      vs_summed_bound=run["elapsed"] / summed)
        report.goal(f"debs heap {fraction:.0%}: mlcache time / (all-in-heap + misses x GET+decode"
                    f" + write-backs x SET)", run["elapsed"] / run["bound"], "<=", 1.15)


def run(args: argparse.Namespace) -> BenchReport:
    from .._redis_server import RedisServer

    quick = bool(getattr(args, "quick", False))
    report = BenchReport("levels", quick=quick)
    server = None
    url = getattr(args, "redis_url", None)
    if not url or url == "embedded":
        server = RedisServer().start()
        url = server.url
    try:
        bench_heap_hits(report, quick)
        bench_batches(report, url, quick)
        bench_debs(report, url, quick)
    finally:
        if server is not None:
            server.cleanup()
    report.note("paper: the DEBS 2022 multi-level caching experiment (heap -> Redis, 100 x 1 MB, "
                "Zipf 0.99); "
                "their slowdowns include their own work per access, so only the shape compares")
    return report
