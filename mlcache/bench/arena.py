"""``mlcache bench arena``: Pravega's raw cache benchmark, scaled to this machine, in one run.

Experiments (each against its baselines, same data, same run):

1. **Sequential**: insert, get, delete N entries of 10 KiB (N = 100K; quick 10K), then the
   same again on the now warm structure. Baseline: a dict of ``bytes`` copies (Pravega's
   HashMap-with-copy: the value is copied in on insert and out on get, so the caller owns it).
2. **Random**: N ops, 60% insert / 40% delete over a key space, 10 KiB or 100 KiB values, each
   op followed by a read of a random key.
3. **Levels**: per-op ``put_many``/``get_many``/``delete_many`` of one 10 KiB entry on the arena,
   the disk level and the Redis level (a private server) — fewer entries, same per-op cost.
4. **Append**: 100-byte events appended to one growing entry versus read-modify-write of a
   ``bytes`` value in a dict.
5. **Bound and fragmentation**: a long churn of mixed sizes (100 B - 200 KiB, log-uniform;
   inserts and deletes, live data held at the bound) with RSS sampled throughout. The arena is
   a lossy cache (victims dropped, so no caller copies are alive); the baseline is a dict of
   ``bytes`` copies evicting oldest-first at the same byte budget, whose RSS growth is compared
   with the live bytes it holds (malloc overhead and fragmentation, measured).

Sequential, random and churn runs each take a fresh interpreter (``python -m
mlcache.bench.arena PHASE VARIANT ...``) so neither side inherits the other's heap or page
faults. The throughput phases (sequential, random, append) run baseline and arena interleaved,
alternating which goes first, N times each (full 5, quick 3), and keep each side's best figure:
the machine is shared, and a neighbour's burst then hits both sides alike instead of whichever
happened to run during it. They count the CPU time of the measuring thread
(``time.thread_time``: user + system, so its page faults are in, time spent preempted is not).
Not the whole process's: importing the arena imports numpy (the policies' sketch), whose
OpenBLAS helper thread spins for a while after start-up, and ``process_time`` charged that to
the arena's first timed loop (the dict's worker never imports it) -- about 2% of a first-fill
profile. Workers also import the arena modules before any setup whichever side they measure,
and run with ``OPENBLAS_NUM_THREADS=1`` unless it is set, so no helper thread competes for the
two cores. The level comparison counts wall time (``perf_counter``), since a Redis round trip
is mostly waiting.

The garbage collector is in the same state on both sides: enabled (as in a user's process),
after a ``gc.collect()`` and a ``gc.freeze()`` of the setup (the workload plan and the value
pool), so a collection during a timed loop would not walk the setup objects. Each worker also
reports how many collections ran inside its timed loops (``gc_runs``), so the report shows
whether the collector touched either side at all.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable

from ._report import BenchReport, int_arg

__all__ = ["add_arguments", "run"]

KiB = 1 << 10
MiB = 1 << 20
POOL = 8 * MiB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--churn-mib", type=int_arg(1), default=None,
                        help="arena bound for the churn experiment (default 256, quick 64)")


# -- helpers shared by the worker processes ------------------------------------------------------

# Throughput phases count the measuring thread's CPU time (user + system, so page faults
# included): the machine is shared, and wall time would measure the neighbours; a helper
# thread of an imported library is not the operation either (module doc). The level
# comparison uses wall time, since a Redis round trip is mostly waiting.
_cpu = time.thread_time

_gc_runs = [0]


def _count_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_runs[0] += 1


def _settle() -> None:
    """Right before a timed loop: collect, freeze what exists (the setup), keep the collector
    on, and count the collections from here (read ``_gc_runs[0]`` right after the loop)."""
    gc.enable()
    gc.collect()
    gc.freeze()
    if _count_gc not in gc.callbacks:
        gc.callbacks.append(_count_gc)
    _gc_runs[0] = 0


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _pool(seed: int = 7) -> memoryview:
    return memoryview(random.Random(seed).randbytes(POOL))


def _sources(pool: memoryview, size: int, count: int, seed: int) -> list[memoryview]:
    """``count`` read-only windows of ``size`` bytes into the pool: buffers neither side owns."""
    rng = random.Random(seed)
    return [pool[o:o + size] for o in (rng.randrange(POOL - size) for _ in range(count))]


def _arena(max_bytes: int, **kw: Any) -> Any:
    from ..config import ArenaConfig
    from ..levels.arena import ArenaLevel

    return ArenaLevel(ArenaConfig(max_bytes=max_bytes, **kw))


class _DictWithCopy:
    """The HashMap-with-copy baseline: copy in on insert, copy out on get."""

    def __init__(self) -> None:
        self.d: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: Any) -> None:
        self.d[key] = bytes(value)

    def get(self, key: bytes) -> bytes | None:
        v = self.d.get(key)
        return None if v is None else bytes(memoryview(v))

    def delete(self, key: bytes) -> None:
        self.d.pop(key, None)


def _store(variant: str) -> Any:
    return _DictWithCopy() if variant == "dict" else _arena(8 << 30)


def _seq(variant: str, n: int) -> dict[str, float]:
    pool = _pool()
    values = _sources(pool, 10 * KiB, 1024, 1)
    keys = [b"seq-%09d" % i for i in range(n)]
    s = _store(variant)
    put, get, delete = s.put, s.get, s.delete
    out: dict[str, float] = {}
    gc_runs = 0
    for round_ in ("", "_warm"):
        _settle()
        t0 = _cpu()
        for i, k in enumerate(keys):
            put(k, values[i & 1023])
        t1 = _cpu()
        for k in keys:
            get(k)
        t2 = _cpu()
        for k in keys:
            delete(k)
        t3 = _cpu()
        gc_runs += _gc_runs[0]
        out[f"insert{round_}"] = (t1 - t0) / n * 1e9
        out[f"get{round_}"] = (t2 - t1) / n * 1e9
        out[f"delete{round_}"] = (t3 - t2) / n * 1e9
    out["gc_runs"] = gc_runs
    return out


def _random(variant: str, n: int) -> dict[str, float]:
    pool = _pool()
    rng = random.Random(3)
    small = _sources(pool, 10 * KiB, 512, 2)
    large = _sources(pool, 100 * KiB, 512, 3)
    space = max(1000, n // 10)
    keys = [b"rnd-%08d" % i for i in range(space)]
    plan = [(rng.random() < 0.6, keys[rng.randrange(space)],
             (small if rng.random() < 0.5 else large)[rng.randrange(512)],
             keys[rng.randrange(space)]) for _ in range(n)]
    s = _store(variant)
    put, get, delete = s.put, s.get, s.delete
    _settle()
    t0 = _cpu()
    for insert, key, value, probe in plan:
        if insert:
            put(key, value)
        else:
            delete(key)
        get(probe)
    return {"op_read": (_cpu() - t0) / n * 1e9, "gc_runs": _gc_runs[0]}


def _append(variant: str, events: int) -> dict[str, float]:
    evs = [bytes([i]) * 100 for i in range(64)]
    if variant == "dict":
        d = {b"log": b""}
        _settle()
        t0 = _cpu()
        for i in range(events):
            d[b"log"] = d[b"log"] + evs[i & 63]
        dt = _cpu() - t0
        assert len(d[b"log"]) == 100 * events
    else:
        a = _arena(1 << 30)
        a.put(b"log", b"")
        append = a.append
        _settle()
        t0 = _cpu()
        for i in range(events):
            append(b"log", evs[i & 63])
        dt = _cpu() - t0
    runs = _gc_runs[0]
    if variant != "dict":
        assert len(a.get(b"log")) == 100 * events
    return {"append": dt / events * 1e9, "gc_runs": runs}


def _churn(variant: str, max_bytes: int, ops: int) -> dict[str, float]:
    pool = _pool()
    rng = random.Random(11)
    lo, hi = math.log(100), math.log(200 * KiB)
    plan = []
    for i in range(ops):
        size = int(math.exp(rng.uniform(lo, hi)))
        plan.append((rng.random() < 0.7, b"churn-%09d" % i, rng.randrange(POOL - size), size,
                     rng.random()))
    live: list[bytes] = []
    from ..levels import arena as _imported  # noqa: F401  (imports are not the arena's memory)
    gc.collect()
    base = _rss()
    peak = 0
    if variant == "arena":
        a = _arena(max_bytes, lossy=True)
        a.may_evict = False          # a pure cache: victims are dropped, not copied out
        put, delete, index = a.put, a.delete, a._index
    else:
        od: OrderedDict[bytes, Any] = OrderedDict()
        held = 0
    for n, (insert, key, off, size, pick) in enumerate(plan):
        if variant == "arena":
            if insert or not live:
                put(key, pool[off:off + size])
                live.append(key)
            else:
                j = int(pick * len(live))
                live[j], live[-1] = live[-1], live[j]
                delete(live.pop())
            if n & 4095 == 0:
                live = [k for k in live if k in index]
        else:
            if insert or not live:
                od[key] = bytes(pool[off:off + size])
                held += size
                live.append(key)
                while held > max_bytes:
                    _, v = od.popitem(last=False)
                    held -= len(v)
            else:
                j = int(pick * len(live))
                live[j], live[-1] = live[-1], live[j]
                v = od.pop(live.pop(), None)
                if v is not None:
                    held -= len(v)
            if n & 4095 == 0:
                live = [k for k in live if k in od]
        if n & 255 == 0:
            peak = max(peak, _rss() - base)
    final = _rss() - base
    peak = max(peak, final)
    if variant == "arena":
        stats = a.stats()
        return {"peak_rss": peak, "final_rss": final, "live": stats["data_bytes"],
                "accounted": stats["memory_bytes"], "evictions": stats["evictions"]}
    return {"peak_rss": peak, "final_rss": final, "live": held, "accounted": held,
            "evictions": 0}


PHASES: dict[str, Callable[..., dict[str, float]]] = {
    "seq": _seq, "random": _random, "append": _append, "churn": _churn,
}


def _spawn(phase: str, variant: str, *params: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "mlcache.bench.arena", phase, variant, *map(str, params)]
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _interleaved(phase: str, *params: int, reps: int) -> dict[str, dict[str, float]]:
    """Baseline and arena runs alternating (dict, arena, arena, dict, ...), ``reps`` each;
    per side the best of each figure, ``gc_runs`` summed."""
    runs: dict[str, list[dict[str, float]]] = {"dict": [], "arena": []}
    for r in range(reps):
        for variant in (("dict", "arena") if r % 2 == 0 else ("arena", "dict")):
            runs[variant].append(_spawn(phase, variant, *params))
    return {v: {k: (sum if k == "gc_runs" else min)(x[k] for x in rs) for k in rs[0]}
            for v, rs in runs.items()}


# -- levels: the Level API, one entry per call ---------------------------------------------------

def _level_ops(level: Any, n: int, values: list[memoryview]) -> dict[str, list[float]]:
    """Per-op wall time of put/get/delete, one key per call, per batch of 50 ops.

    Every level gets the same keys and the same ``bytes`` values through the same calls
    (``put_many([item])``, ``get_many([key])``, ``delete_many([key])``: the Level protocol,
    as the manager calls it). The fastest batch is the cost of the operation itself; slower
    ones were preempted (the machine is shared), and that hits a 1 us arena op harder than a
    50 us Redis round trip. The batch times are kept too, for the medians in the report.
    """
    keys = [b"lvl-%07d" % i for i in range(n)]
    items = [(k, bytes(values[i % len(values)])) for i, k in enumerate(keys)]
    batches: dict[str, list[float]] = {"insert": [], "get": [], "delete": []}
    clock = time.perf_counter
    for lo in range(0, n, 50):
        batch_items, batch_keys = items[lo:lo + 50], keys[lo:lo + 50]
        t0 = clock()
        for item in batch_items:
            level.put_many([item])
        t1 = clock()
        for k in batch_keys:
            level.get_many([k])
        t2 = clock()
        for k in batch_keys:
            level.delete_many([k])
        t3 = clock()
        m = len(batch_keys)
        batches["insert"].append((t1 - t0) / m * 1e9)
        batches["get"].append((t2 - t1) / m * 1e9)
        batches["delete"].append((t3 - t2) / m * 1e9)
    return batches


def _levels(n: int, reps: int = 3) -> dict[str, dict[str, float]]:
    """Per level and op: the best batch (``insert``, ``get``, ``delete``) and the median
    batch (``*_median``) over ``reps`` interleaved repetitions."""
    from .._redis_server import RedisServer
    from ..config import DiskConfig, RedisConfig
    from ..levels.disk import DiskLevel
    from ..levels.redis import RedisLevel

    values = _sources(_pool(), 10 * KiB, 64, 5)
    tmp = tempfile.mkdtemp(prefix="mlcache-bench-arena-")
    server = RedisServer().start()
    levels = {
        "arena": _arena(1 << 30),
        "disk": DiskLevel(DiskConfig(path=os.path.join(tmp, "disk"))),
        "redis": RedisLevel(RedisConfig(url=server.url, prefix="bench-" + uuid.uuid4().hex[:8])),
    }
    times: dict[str, dict[str, list[float]]] = {name: {} for name in levels}
    try:
        # interleaved repetitions (the machine is shared), the same GC state for every level
        _settle()
        for _ in range(reps):
            for name, level in levels.items():
                for op, batch in _level_ops(level, n, values).items():
                    times[name].setdefault(op, []).extend(batch)
    finally:
        for level in levels.values():
            level.close()
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, dict[str, float]] = {}
    for name, ops in times.items():
        out[name] = {op: min(ts) for op, ts in ops.items()}
        out[name].update({f"{op}_median": statistics.median(ts) for op, ts in ops.items()})
    return out


# -- the report ----------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> BenchReport:
    quick = bool(getattr(args, "quick", False))
    report = BenchReport("arena", quick=quick)
    n_seq = 10_000 if quick else 100_000
    n_rand = 10_000 if quick else 100_000
    n_level = 500 if quick else 2_000
    reps = 3 if quick else 5
    events = 5_000 if quick else 10_000
    churn_mib = getattr(args, "churn_mib", None) or (64 if quick else 256)
    churn_ops = 20_000 if quick else 100_000

    seq = _interleaved("seq", n_seq, reps=reps)
    for v in ("dict", "arena"):
        r = seq[v]
        report.result(f"sequential {n_seq:,} x 10 KiB: {v}", insert_ns=r["insert"],
                      get_ns=r["get"], delete_ns=r["delete"], warm_insert_ns=r["insert_warm"],
                      warm_get_ns=r["get_warm"])
    rnd = _interleaved("random", n_rand, reps=reps)
    for v in ("dict", "arena"):
        report.result(f"random {n_rand:,} ops 60/40, 10|100 KiB + read: {v}",
                      op_plus_read_ns=rnd[v]["op_read"])
    lv = _levels(n_level, reps)
    for name, r in lv.items():
        report.result(f"level API, {n_level:,} x 10 KiB: {name}", insert_ns=r["insert"],
                      get_ns=r["get"], delete_ns=r["delete"],
                      get_median_ns=r["get_median"], insert_median_ns=r["insert_median"])
    app = _interleaved("append", events, reps=reps)
    report.result(f"append {events:,} x 100 B to one entry: dict read-modify-write",
                  append_ns=app["dict"]["append"])
    report.result(f"append {events:,} x 100 B to one entry: arena append",
                  append_ns=app["arena"]["append"])
    max_bytes = churn_mib * MiB
    churn = {v: _spawn("churn", v, max_bytes, churn_ops) for v in ("arena", "dict")}
    for v in ("arena", "dict"):
        c = churn[v]
        report.result(f"churn {churn_ops:,} ops, 100 B-200 KiB, bound {churn_mib} MiB: {v}",
                      peak_rss_mib=c["peak_rss"] / MiB, final_rss_mib=c["final_rss"] / MiB,
                      live_mib=c["live"] / MiB, rss_over_live=c["final_rss"] / max(1, c["live"]))

    report.goal("sequential insert: arena / dict-with-copy", seq["arena"]["insert"]
                / seq["dict"]["insert"], "<=", 2.0)
    report.goal("sequential get: arena / dict-with-copy", seq["arena"]["get"]
                / seq["dict"]["get"], "<=", 2.0)
    report.goal("warm insert: arena / dict-with-copy", seq["arena"]["insert_warm"]
                / seq["dict"]["insert_warm"], "<=", 2.0)
    report.goal("random op+read: arena / dict-with-copy", rnd["arena"]["op_read"]
                / rnd["dict"]["op_read"], "<=", 2.0)
    report.goal("get speedup vs disk level", lv["disk"]["get"] / lv["arena"]["get"], ">=", 10)
    report.goal("get speedup vs Redis level", lv["redis"]["get"] / lv["arena"]["get"], ">=", 10)
    report.goal("append speedup vs read-modify-write", app["dict"]["append"]
                / app["arena"]["append"], ">=", 5)
    report.goal("arena peak RSS growth / max_bytes", churn["arena"]["peak_rss"] / max_bytes,
                "<=", 1.01)
    report.note("dict-with-copy copies in (bytes(view)) and out (bytes(memoryview(v))); a plain "
                f"dict lookup without the copy-out is not a cache read a caller may keep")
    gc_runs = {v: sum(int(ph[v].get("gc_runs", 0)) for ph in (seq, rnd, app))
               for v in ("dict", "arena")}
    report.note(f"method: sequential, random and append run dict and arena interleaved, {reps} "
                f"fresh processes each, best CPU time of the measuring thread (thread_time: user + "
                f"system) per side; "
                f"GC enabled for both after gc.collect() + gc.freeze() of the setup, collections "
                f"inside timed loops: dict {gc_runs['dict']}, arena {gc_runs['arena']}; levels: "
                f"same keys and bytes values through put_many/get_many/delete_many of one key, "
                f"wall time (perf_counter), best batch of 50 over {reps} interleaved passes "
                f"(medians in the table)")
    report.note(f"dict-of-bytes churn: RSS grew to {churn['dict']['peak_rss'] / MiB:.1f} MiB "
                f"peak / {churn['dict']['final_rss'] / MiB:.1f} MiB final for "
                f"{churn['dict']['live'] / MiB:.1f} MiB live (x{churn['dict']['final_rss'] / max(1, churn['dict']['live']):.2f}); "
                f"arena: {churn['arena']['peak_rss'] / MiB:.1f} MiB peak for a {churn_mib} MiB "
                f"bound ({churn['arena']['live'] / MiB:.1f} MiB live, "
                f"{churn['arena']['evictions']:,.0f} evictions)")
    return report


def _worker(argv: list[str]) -> None:
    phase, variant, *params = argv
    # the same modules on both sides, imported before any setup (module doc)
    from ..config import ArenaConfig  # noqa: F401
    from ..levels import arena as _imported  # noqa: F401
    print(json.dumps(PHASES[phase](variant, *map(int, params))))


if __name__ == "__main__":
    _worker(sys.argv[1:])
