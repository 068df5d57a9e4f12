"""Keyed prefetching against the real manager, real Redis and real disk levels.

Delays and failures are injected with ``DelayedLevelConfig``: a wrapper around a real level that
sleeps (or raises) before reading, never a mock. No test asserts on wall-clock time; waits poll
the prefetcher's state with a generous bound.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig, RedisConfig
from mlcache.bench._delayed import Delay, DelayedLevelConfig
from mlcache.errors import IntegrityError, LevelUnavailableError
from mlcache.prefetch import Prefetcher, RecordKeyError, prefetching


def _disk_config(tmp_path, delay=None, *, entries=1000, policy="lru", ns="t", **pf):
    level = DiskConfig(path=str(tmp_path / "disk"))
    if delay is not None:
        level = DelayedLevelConfig(inner=level, delay=delay)
    return CacheConfig(heap=HeapConfig(policy=policy, max_entries=entries, max_bytes=None),
                       levels=(level,), namespace=ns, prefetch=PrefetchConfig(**pf))


def _fill(config, items):
    with CacheManager(config) as m:
        m.put_many(items)
        m.checkpoint()


def _prefetcher(m) -> Prefetcher:
    p = getattr(m, "_prefetcher", None)
    assert isinstance(p, Prefetcher)
    return p


def _threads_config(redis_url, prefix):
    """Over Redis, fetch threads staging their reads for a lookahead operator to install."""
    return CacheConfig(heap=HeapConfig(policy="lru", max_entries=400, max_bytes=None),
                       levels=(RedisConfig(url=redis_url, prefix=prefix),), namespace="op",
                       prefetch=PrefetchConfig(hot_threshold=16, fetch_mode="threads"))


def _wait_idle(p: Prefetcher, bound: float = 30.0) -> None:
    """Until the fetch threads have nothing left to do. (While an operator reads batches
    inline, queued keys wait for the operator's next record, not for a thread.)"""
    def busy():
        return p._buffer.inflight or (p._buffer.pending and not p._thread_idle())

    end = time.monotonic() + bound
    while busy() and time.monotonic() < end:
        time.sleep(0.005)
    assert not busy()


def test_hinted_keys_are_resident_before_use(tmp_path):
    delay = Delay(0.002)
    cfg = _disk_config(tmp_path, delay, entries=500, hot_threshold=16, batch_size=16)
    _fill(cfg, [(f"k{i}", {"v": i}) for i in range(200)])
    with CacheManager(cfg) as m:
        for i in range(100):
            m.hint(f"k{i}", i)
        p = _prefetcher(m)
        _wait_idle(p)
        assert all(m._resident(m._encode_key(f"k{i}")) for i in range(100))
        # batched: one read per batch of up to 16 keys, never one per key
        assert delay.reads <= 100 // 16 + p.config.fetch_threads * 2 + 1
        reads = delay.reads
        assert [m.get(f"k{i}")["v"] for i in range(100)] == list(range(100))
        assert delay.reads == reads  # every use was a heap hit


def test_operator_prefetches_before_use_when_slack_allows(tmp_path, redis_url):
    # fetch threads read while the records are processed; the operator installs their reads
    cfg = _threads_config(redis_url, "pf1")
    _fill(cfg, [(i, i * 10) for i in range(300)])
    with CacheManager(cfg) as m:
        it = prefetching(range(300), key=lambda r: r, cache=m, depth=16)
        p = _prefetcher(m)
        out = []
        for r in it:
            # record 0 is hinted and used at once (no slack); every later record was hinted
            # 16 records earlier and the step below leaves the fetch time to land
            if r > 0:
                assert m._resident(m._encode_key(r))
            out.append(m.get(r))
            _wait_idle(p)                    # the slack: this record's processing time
        assert out == [i * 10 for i in range(300)]
        st = m.stats()["prefetch"]
        assert st["useful"] == 299 and st["late"] == 1
        assert st["depth"] == 16 and st["sent"] == 300


def test_no_key_is_fetched_twice_concurrently(tmp_path):
    delay = Delay(0.02)
    cfg = _disk_config(tmp_path, delay, entries=2000, hot_threshold=16, batch_size=8)
    keys = [f"k{i}" for i in range(64)]
    _fill(cfg, [(k, k.upper()) for k in keys])
    with CacheManager(cfg) as m:
        for k in keys:
            m.hint(k, 0)
        results: list[list] = [[], [], []]

        def demand(out):
            out.extend(m.get(k) for k in keys)

        threads = [threading.Thread(target=demand, args=(out,)) for out in results]
        for t in threads:
            t.start()
        for k in keys:          # re-hints while fetches are in flight
            m.hint(k, 1)
        for t in threads:
            t.join()
        _wait_idle(_prefetcher(m))
        assert results == [[k.upper() for k in keys]] * 3
        assert delay.concurrent_duplicates == 0
        assert delay.keys_read == len(keys)   # each key read from the level exactly once


def test_hint_never_overwrites_a_newer_dirty_value(tmp_path):
    delay = Delay(0.05)
    cfg = _disk_config(tmp_path, delay, entries=100, hot_threshold=16)
    _fill(cfg, [("a", "old"), ("b", "old")])
    with CacheManager(cfg) as m:
        m.put("a", "new")                 # dirty in the heap: the hint only tells the policy
        m.hint("a", 1)
        m.hint("b", 1)
        p = _prefetcher(m)
        kb = m._encode_key("b")
        end = time.monotonic() + 10
        while p._buffer.state(kb) is None and kb not in p._landed and time.monotonic() < end:
            time.sleep(0.001)
        m.put("b", "new")                 # written while the prefetch of b is (likely) in flight
        _wait_idle(p)
        assert m.get("a") == "new" and m.get("b") == "new"
        m.checkpoint()
    with CacheManager(cfg) as m2:
        assert m2.get("a") == "new" and m2.get("b") == "new"


def test_eviction_buffer_round_trip_without_io(tmp_path):
    delay = Delay(0.0, put_seconds=1.0)   # slow write-back keeps victims in the eviction buffer
    cfg = _disk_config(tmp_path, delay, entries=4, hot_threshold=16)
    with CacheManager(cfg) as m:
        for i in range(8):                # the writer takes these and sits in a slow write
            m.put(f"filler{i}", i)
        time.sleep(0.05)
        m.put("x", {"payload": 1})
        for i in range(4):                # push x out of the heap; dirty, so it is buffered
            m.put(f"more{i}", i)
        assert not m._resident(m._encode_key("x"))
        reads = delay.reads
        m.hint("x", 1)
        p = _prefetcher(m)
        _wait_idle(p)
        assert m._resident(m._encode_key("x"))
        assert m.get("x") == {"payload": 1}
        assert delay.reads == reads       # rescued from the eviction buffer, no level read
        assert m.stats()["writeback"]["buffer_hits"] >= 1


def test_lateness_drops_hints_for_records_already_passed(tmp_path):
    cfg = _disk_config(tmp_path, None, entries=1000, hot_threshold=16, lateness=5.0)
    _fill(cfg, [(i, i) for i in range(120)])
    with CacheManager(cfg) as m:
        events = [(i, float(i)) for i in range(100)] + [(110, 10.0)]   # one straggler
        out = [m.get(k) for k, _ in prefetching(events, key=lambda e: e[0], ts=lambda e: e[1],
                                                cache=m, depth=4)]
        assert out == [k for k, _ in events]
        p = _prefetcher(m)
        assert p.counters["dropped_late"] >= 1
        assert m._prefetcher.hint(m._encode_key(111), 1.0) == "late"
        assert m.stats()["prefetch"]["dropped_late"] >= 2


def _paced(records, delay: Delay, phases):
    """Yield records, switching the backend delay at the given record counts."""
    for i, r in enumerate(records):
        for at, seconds in phases:
            if i == at:
                delay.seconds = seconds
        yield r


def test_adaptive_depth_follows_backend_delay(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=300, hot_threshold=16, batch_size=32)
    n = 4500
    _fill(cfg, [(i, i) for i in range(n)])
    with CacheManager(cfg) as m:
        phases = [(0, 0.0), (1500, 0.03), (3000, 0.0)]
        it = prefetching(_paced(range(n), delay, phases), key=lambda r: r, cache=m)
        depth_at = {}
        for r in it:
            time.sleep(0.0003)            # the stateful step's own work
            assert m.get(r) == r
            if r in (1499, 2999, n - 1):
                depth_at[r] = it.depth
        fast1, slow, fast2 = depth_at[1499], depth_at[2999], depth_at[n - 1]
        assert slow > fast1, it.controller.history
        assert fast2 < slow, it.controller.history


def _ysb_job(m, events, use_prefetch):
    """A stateful job: enrich with campaign metadata, count views per campaign in the cache."""
    src = prefetching(events, key=lambda e: ("ad", e[0]), ts=lambda e: e[2], cache=m) \
        if use_prefetch else iter(events)
    seen = []
    for ad, kind, t in src:
        meta = m.get(("ad", ad), ts=t)
        seen.append((ad, meta["campaign"]))
        if kind == "view":
            ck = ("views", meta["campaign"])
            m.put(ck, m.get(ck, 0) + 1)
    m.flush()
    return seen


def test_results_equal_a_run_without_prefetching(tmp_path, redis_url):
    import random

    rng = random.Random(3)
    ads = 2000
    events = [(int(rng.paretovariate(1.0)) % ads, rng.choice(["view", "click"]), i)
              for i in range(4000)]
    runs = []
    for use in (False, True):
        cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=150, max_bytes=None),
                          levels=(RedisConfig(url=redis_url, prefix=f"eq{use}"),),
                          namespace="eq", prefetch=PrefetchConfig(enabled=use))
        _fill(cfg, [(("ad", a), {"campaign": a % 37}) for a in range(ads)])
        with CacheManager(cfg) as m:
            seen = _ysb_job(m, events, use)
            views = {c: m.get(("views", c)) for c in range(37)}
            runs.append((seen, views))
    assert runs[0] == runs[1]
    expected = Counter(a % 37 for a, kind, _ in events if kind == "view")
    assert {c: v for c, v in runs[1][1].items() if v} == dict(expected)


def test_bad_key_errors_name_the_record_index(tmp_path):
    cfg = _disk_config(tmp_path, None)
    with CacheManager(cfg) as m:
        records = [{"k": 1}, {"k": 2}, {}, {"k": 4}]
        it = prefetching(records, key=lambda r: r["k"], cache=m, depth=8)
        assert next(it) == {"k": 1} and next(it) == {"k": 2}   # earlier records still come out
        with pytest.raises(RecordKeyError, match="record 2") as info:
            next(it)
        assert info.value.index == 2 and isinstance(info.value.__cause__, KeyError)

        it = prefetching([1, [2], 3], key=lambda r: r, cache=m)
        assert next(it) == 1
        with pytest.raises(RecordKeyError, match=r"record 1.*list"):
            next(it)


@pytest.mark.parametrize("mode", ["threads", "inline"])
def test_prefetch_failure_falls_back_to_demand_fetch(tmp_path, mode):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16, fetch_mode=mode)
    _fill(cfg, [(i, -i) for i in range(200)])
    if mode == "threads":
        delay.fail = lambda keys: threading.current_thread().name.startswith("mlcache-prefetch")
    else:
        delay.fail = lambda keys: len(keys) > 1    # the operator's batches; a demand get reads one
    with CacheManager(cfg) as m:
        out = [m.get(r) for r in prefetching(range(200), key=lambda r: r, cache=m, depth=32)]
        assert out == [-i for i in range(200)]
        assert m.stats()["prefetch"]["failures"] >= 1


def test_failure_surfaces_when_demand_fetch_fails_too(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16)
    _fill(cfg, [(i, i) for i in range(50)])
    with CacheManager(cfg) as m:
        delay.fail = lambda keys: True
        it = prefetching(range(50), key=lambda r: r, cache=m, depth=8)
        p = None
        with pytest.raises(LevelUnavailableError, match=r"record \d+") as info:
            for r in it:
                p = p or _prefetcher(m)
                _wait_idle(p)
        assert info.value.prefetch_error is not None
        delay.fail = None


def test_hot_filter_drops_hints_for_frequent_resident_keys(tmp_path):
    cfg = _disk_config(tmp_path, None, entries=1000, hot_threshold=3)
    _fill(cfg, [("hot", 1), ("cold", 2), ("evicted", 3)])
    with CacheManager(cfg) as m:
        p = Prefetcher(m)
        try:
            hot = m._encode_key("hot")
            assert p.hint(hot, 0) == "queued"
            _wait_idle(p)
            outcomes = [p.hint(hot, i) for i in range(1, 10)]
            assert outcomes[:2] == ["resident"] * 2 and outcomes[-1] == "hot"
            assert p.counters["dropped_hot"] >= 6
            assert p.hint(m._encode_key("cold"), 0) == "queued"
            # a frequent key that is not resident is still fetched: the filter costs no hits
            ev = m._encode_key("evicted")
            dropped = p.counters["dropped_hot"]
            for i in range(10):
                assert p.hint(ev, i) == "queued"
                _wait_idle(p)
                m.delete("evicted")   # gone from the heap (and below): next hint queues again
            assert p.counters["dropped_hot"] == dropped
        finally:
            p.close()


def test_hot_filter_switches_itself_off_when_it_drops_little_and_stays_on_when_it_works(tmp_path):
    cfg = _disk_config(tmp_path, None, entries=4000, policy="tac", hot_threshold=3)
    with CacheManager(cfg) as m:
        m.put_many((i, i) for i in range(3000))          # resident: every hint is judged
        kbs = [m._encode_key(i) for i in range(3000)]
        p = Prefetcher(m)
        try:
            p.HOT_WINDOW, p.HOT_WARMUP, p.HOT_OFF_WINDOWS = 64, 2, 10
            p._hot_tick = 64
            # every key hinted once: nothing is hot, the filter pays for nothing
            for i in range(300):
                assert p.hint(kbs[i], i) == "resident"
            assert p.stats()["hot_filter"] == "off" and p.counters["hot_filter_off"] == 1
            sketch_adds = p._filter.sketch.additions
            for i in range(300, 700):                    # off: no sketch work at all
                p.hint(kbs[i], i)
            assert p._filter.sketch.additions == sketch_adds
            for i in range(700, 1100):                   # back on for a window, judged again
                p.hint(kbs[i], i)
            assert p.counters["hot_filter_off"] == 2
        finally:
            p.close()
        q = Prefetcher(m)
        try:
            q.HOT_WINDOW, q.HOT_WARMUP, q.HOT_OFF_WINDOWS = 64, 2, 10
            q._hot_tick = 64
            # a few keys hinted over and over: most hints dropped, the filter stays on (the
            # clock advancing as the operator moves it: a hint is for the record at hand)
            for i in range(2000):
                m._advance_clock(i)
                q.hint(kbs[i % 5], i)
            assert q.stats()["hot_filter"] == "on" and q.counters["hot_filter_off"] == 0
            assert q.counters["dropped_hot"] > 1900
        finally:
            q.close()


def test_demand_fetch_has_priority_over_prefetch_batches(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16)
    _fill(cfg, [(i, i) for i in range(20)])
    with CacheManager(cfg) as m:
        m.hint(0, 0)
        p = _prefetcher(m)
        _wait_idle(p)
        reads = delay.reads
        with p.demand():
            for i in range(1, 20):
                m.hint(i, 0)
            time.sleep(0.1)
            assert delay.reads == reads and len(p._buffer.pending) == 19   # held back
        _wait_idle(p)
        assert all(m._resident(m._encode_key(i)) for i in range(20))


def test_close_stops_fetch_threads_and_stats_are_exposed(tmp_path):
    cfg = _disk_config(tmp_path, None, entries=1000, hot_threshold=16)
    _fill(cfg, [(i, i) for i in range(10)])
    m = CacheManager(cfg)
    for i in range(10):
        m.hint(i, i)
    p = _prefetcher(m)
    _wait_idle(p)
    threads = list(p._cold._threads)
    st = m.stats()["prefetch"]
    for name in ("hints", "sent", "dropped_hot", "dropped_late", "useful", "wasted", "late",
                 "slack_ms", "fetch_latency_ms", "depth", "pending", "inflight"):
        assert name in st
    assert st["sent"] == 10 and st["prefetched"] == 10
    m.close()
    assert threads and not any(t.is_alive() for t in threads)


def _paced_until_landed(m, records):
    """Yield ``records``, each only once every hint given so far has landed: the consumer can
    never overtake the fetch threads (a prefetch overtaken is 'late', not 'useful'), however
    loaded the machine is."""
    for r in records:
        _wait_idle(_prefetcher(m))
        yield r


def test_operator_accepts_namespaces_and_structures(tmp_path):
    cfg = _disk_config(tmp_path, None, entries=50, hot_threshold=16)
    with CacheManager(cfg) as m:
        ns = m.namespace("users")
        ns.put_many((i, -i) for i in range(200))
        d = m.dict("profiles")
        d.update({i: {"n": i} for i in range(200)})
        m.checkpoint()
        records = _paced_until_landed(m, range(200))
        out = [ns.get(r) for r in prefetching(records, key=lambda r: r, cache=ns, depth=8)]
        assert out == [-i for i in range(200)]
        useful = m.stats()["prefetch"]["useful"]
        assert useful > 0          # hints went to the namespace's own keys
        records = _paced_until_landed(m, range(200))
        out = [d[r]["n"] for r in prefetching(records, key=lambda r: r, cache=d, depth=8)]
        assert out == list(range(200))
        assert m.stats()["prefetch"]["useful"] > useful


def test_fetch_threads_are_rebuilt_after_fork(redis_url):
    import os

    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=100, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix="fork"),), namespace="fork",
                      prefetch=PrefetchConfig(hot_threshold=16))
    _fill(cfg, [(i, i) for i in range(10)])
    m = CacheManager(cfg)
    try:
        m.hint(0, 0)
        parent = _prefetcher(m)
        _wait_idle(parent)
        pid = os.fork()
        if pid == 0:                                  # child: fresh threads, same API
            code = 1
            try:
                m.hint(5, 0)
                child = m._prefetcher
                _wait_idle(child)
                alive = [t for t in child._cold._threads if t.is_alive()]
                if child is not parent and alive and m._resident(m._encode_key(5)):
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert all(t.is_alive() for t in parent._cold._threads)   # the parent's are untouched
    finally:
        m.close()


def test_prefetch_config_is_validated_and_can_be_disabled(tmp_path):
    from mlcache.errors import ConfigError

    for bad in ({"lateness": -1.0}, {"hot_threshold": 17}, {"fetch_threads": 0},
                {"batch_size": 0}):
        with pytest.raises(ConfigError, match="prefetch."):
            PrefetchConfig(**bad)
    cfg = _disk_config(tmp_path, None, enabled=False)
    _fill(cfg, [(i, i) for i in range(20)])
    with CacheManager(cfg) as m:
        it = prefetching(range(20), key=lambda r: r, cache=m)
        assert [m.get(r) for r in it] == list(range(20))     # a plain pass-through
        assert m._prefetcher is None and m.stats()["prefetch"].get("hints") is None
        with pytest.raises(RecordKeyError, match="record 0"):
            next(prefetching([1.5], key=lambda r: r, cache=m))


def _zipf_keys(n_keys, n, seed=7):
    import numpy as np

    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_keys + 1)
    p /= p.sum()
    return rng.permutation(n_keys)[rng.choice(n_keys, size=n, p=p)].tolist()


def _operator_hit_ratio(tmp_path, policy, keys, n_keys, entries):
    cfg = _disk_config(tmp_path / policy, entries=entries, policy=policy, ns="zipf")
    _fill(cfg, [(k, k) for k in range(n_keys)])
    with CacheManager(cfg) as m:
        m.invalidate_local()
        for r in prefetching(keys, key=lambda r: r, cache=m):   # no ts= anywhere
            assert m.get(r) == r
        return m.stats()["levels"]["heap"]["hit_ratio"]


def test_tac_with_plain_operator_is_no_worse_than_lru(tmp_path):
    # Regression: with neither the operator nor the gets giving ts=, TAC's "now" never
    # advanced, so entries in use (hot keys, whose hints the filter drops) kept the time of
    # their last hint and were evicted before the prefetches queued behind them (TAC 0.64
    # against LRU 0.93 here). The operator now advances the policy's clock per record.
    n_keys, entries = 5000, 400                      # state 12.5x the heap, on disk
    keys = _zipf_keys(n_keys, 12000)
    lru = _operator_hit_ratio(tmp_path, "lru", keys, n_keys, entries)
    tac = _operator_hit_ratio(tmp_path, "tac", keys, n_keys, entries)
    assert tac >= lru, (tac, lru)


def test_tac_clock_ignores_hints_and_orders_untimed_uses():
    from mlcache.policies.tac import TACPolicy

    p = TACPolicy(3)
    p.insert("a")
    p.insert("b")
    p.hint("b", 100.0)                 # expected use: does not move "now"
    p.advance(5.0)
    p.access("a")                      # untimed access happens "now" (5), not at 100
    assert p.timestamp("a") == 5.0 and p.timestamp("b") == 100.0
    p.access("b")                      # used before its expected time: keeps its key
    assert p.timestamp("b") == 100.0
    p.advance(3.0)                     # the clock never moves back
    p.insert("c")
    assert p.timestamp("c") == 5.0
    assert p.insert("d") == ["a"]      # oldest use goes first; the hinted entry stays


def test_bare_hint_then_get_counts_useful_and_late(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=500, hot_threshold=16, batch_size=8)
    _fill(cfg, [(f"k{i}", i) for i in range(100)])
    with CacheManager(cfg) as m:
        for i in range(40):
            m.hint(f"k{i}", i)
        p = _prefetcher(m)
        _wait_idle(p)
        assert [m.get(f"k{i}", ts=i) for i in range(40)] == list(range(40))
        assert [m.get(f"k{i}") for i in range(40)] == list(range(40))   # second use: no count
        st = m.stats()["prefetch"]
        assert st["useful"] == 40 and st["wasted"] == 0 and st["late"] == 0
        assert len(p.slack) == 40
        # a get while the prefetch is still queued is late (and is not fetched again)
        delay.seconds = 0.2
        m.hint("k50", 50)
        m.hint("k51", 51)
        assert m.get("k51") == 51
        _wait_idle(p)
        assert m.stats()["prefetch"]["late"] >= 1
        # a plain heap hit of a never-hinted key leaves the counters alone
        before = dict(m.stats()["prefetch"])
        m.get("k3")
        after = m.stats()["prefetch"]
        assert {k: after[k] for k in ("useful", "late", "wasted")} == \
               {k: before[k] for k in ("useful", "late", "wasted")}


def test_latency_window_can_be_read_while_fetch_threads_append():
    """Regression: ``recent()`` built an islice over the deque in one bytecode and consumed it in
    the next; an append in between raised "deque mutated during iteration" from the operator
    (seen in a full `mlcache bench prefetch` run)."""
    import sys
    import threading

    from mlcache.prefetch import _Window

    window = _Window(maxlen=512)
    stop = threading.Event()

    def writer():
        x = 0.0
        while not stop.is_set():
            window.add(x)
            x += 1.0

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)      # switch threads as often as possible
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        for _ in range(20_000):
            got = window.recent(256)
            assert len(got) <= 256
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)


class _Operator:
    """Stands for a lookahead operator attached to the prefetcher (it installs staged reads)."""


def test_staged_reads_never_install_over_newer_writes_or_deletes(tmp_path):
    # Fetch threads with an operator attached only read and stage the bytes; the operator's
    # thread installs them later. Anything written or deleted in between must win.
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=4, hot_threshold=16, fetch_mode="threads")
    _fill(cfg, [(f"k{i}", i) for i in range(20)])
    with CacheManager(cfg) as m:
        p = m._get_prefetcher()
        op = _Operator()
        p.attach(op)
        kbs = [m._encode_key(f"k{i}") for i in range(4)]
        for i, kb in enumerate(kbs):
            assert p.hint(kb, i) == "queued"
        _wait_idle(p)
        assert all(kb in p._staged for kb in kbs)
        m.put("k0", "new0")               # resident and dirty
        m.put("k1", "new1")
        for j in range(10, 16):           # k1 (and k0) evicted dirty and written below
            m.get(f"k{j}")
        m.flush()
        assert not m._resident(kbs[1])
        m.delete("k2")                    # a tombstone
        assert p.install(100) == 1        # only k3 is still what the level holds
        assert m.get("k0") == "new0" and m.get("k1") == "new1"
        assert m.get("k2") is None and m.get("k3") == 3
        assert p.counters["staged_dropped"] == 3
        p.detach(op)


def test_invalidate_local_drops_staged_and_in_flight_reads(tmp_path):
    # Regression: invalidate_local (a partition moved here from another process) forgot the
    # heap's clean copies but kept the prefetcher's staged reads, so a get installed the value
    # from before the other process's write.
    cfg = _disk_config(tmp_path, Delay(0.0), entries=100, hot_threshold=16, fetch_mode="threads")
    _fill(cfg, [(f"k{i}", i) for i in range(4)])
    with CacheManager(cfg) as m:
        p = m._get_prefetcher()
        op = _Operator()
        p.attach(op)
        for i in range(4):
            m.hint(f"k{i}", i)
        _wait_idle(p)
        assert len(p._staged) == 4
        with m._lock:
            seq = m._wb.wseq          # as a read starting now would take it
        with CacheManager(cfg) as other:  # the other process changes the shared level
            other.put_many((f"k{i}", f"new{i}") for i in range(4))
            other.checkpoint()
        m.invalidate_local()
        assert not p._staged and p.counters["staged_dropped"] == 4
        with m._lock:
            assert m._wb.moved_since(seq) is None   # a read from before must not be trusted
        assert [m.get(f"k{i}") for i in range(4)] == [f"new{i}" for i in range(4)]
        p.detach(op)


def test_get_of_a_staged_key_installs_it_without_io(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=100, hot_threshold=16, fetch_mode="threads")
    _fill(cfg, [(f"k{i}", {"v": i}) for i in range(10)])
    with CacheManager(cfg) as m:
        p = m._get_prefetcher()
        op = _Operator()
        p.attach(op)
        for i in range(10):
            m.hint(f"k{i}", i)
        _wait_idle(p)
        assert len(p._staged) == 10 and not any(m._resident(kb) for kb in p._staged)
        reads = delay.reads
        assert [m.get(f"k{i}")["v"] for i in range(10)] == list(range(10))
        assert delay.reads == reads and not p._staged
        p.detach(op)


def test_staging_is_bounded_and_threads_resume_when_the_operator_drains(tmp_path):
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16, fetch_mode="threads",
                       batch_size=4)
    _fill(cfg, [(i, i) for i in range(100)])
    with CacheManager(cfg) as m:
        p = m._get_prefetcher()
        p.staged_max_keys = 8
        op = _Operator()
        p.attach(op)
        for i in range(100):
            m.hint(i, i)
        _wait_idle(p)           # threads stop taking batches once the stage is full
        full = len(p._staged)
        assert 8 <= full <= 8 + 4 * p.config.fetch_threads and p._buffer.pending
        installed = 0
        end = time.monotonic() + 30
        while (p._buffer.pending or p._buffer.inflight or p._staged) and time.monotonic() < end:
            installed += p.install(8)
            time.sleep(0.002)
        assert installed == 100 and all(m._resident(m._encode_key(i)) for i in range(100))
        p.detach(op)


def test_inline_mode_reads_batches_on_the_operator_thread(tmp_path):
    delay = Delay(0.0)
    readers: set[str] = set()

    def note(keys):
        readers.add(threading.current_thread().name)
        return False

    delay.fail = note
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16, fetch_mode="inline")
    _fill(cfg, [(i, i * 3) for i in range(400)])
    readers.clear()
    with CacheManager(cfg) as m:
        out = []
        for r in prefetching(range(400), key=lambda r: r, cache=m, depth=32):
            out.append(m.get(r))
        st = m.stats()["prefetch"]
    assert out == [i * 3 for i in range(400)]
    assert readers == {threading.current_thread().name}   # no fetch thread ever read
    assert st["mode"] == "inline" and st["inline_batches"] == st["batches"] > 0
    # a key is read at most a batch's worth of records (16 here) after its hint, 32 before
    # its use; only the first records, read ahead together, find their keys still queued
    assert st["late"] <= 17 and st["useful"] >= 400 - 17


def test_inline_batches_from_a_level_that_cannot_split_are_at_most_32_keys(tmp_path):
    # the record that reads an inline batch decodes, inserts and evicts for every key of it:
    # its latency is the batch, so the operator reads 32 keys at a time even when batch_size
    # allows 64 (the keyed p999 on the disk level halved at the same throughput)
    sizes: list[int] = []

    def note(keys):
        sizes.append(len(keys))
        return False

    delay = Delay(0.0)
    delay.fail = note
    cfg = _disk_config(tmp_path, delay, entries=300, hot_threshold=16, fetch_mode="inline")
    assert cfg.prefetch.batch_size == 64
    _fill(cfg, [(i, i) for i in range(3000)])
    sizes.clear()
    with CacheManager(cfg) as m:
        out = [m.get(r) for r in prefetching(range(3000), key=lambda r: r, cache=m, depth=256)]
        st = m.stats()["prefetch"]
    assert out == list(range(3000))
    assert st["inline_batches"] > 0 and st["useful"] > 2900
    assert max(sizes) == 32          # full batches are 32 keys, none more
    small = _disk_config(tmp_path, delay, entries=300, hot_threshold=16, fetch_mode="inline",
                         batch_size=8, ns="small")
    _fill(small, [(i, i) for i in range(500)])
    sizes.clear()
    with CacheManager(small) as m:
        assert [m.get(r) for r in prefetching(range(500), key=lambda r: r, cache=m,
                                              depth=256)] == list(range(500))
    assert max(sizes) == 8           # a smaller batch_size still bounds them


def test_auto_mode_moves_reads_to_threads_when_they_wait_and_back(tmp_path):
    delay = Delay(0.02)
    cfg = _disk_config(tmp_path, delay, entries=5000, hot_threshold=16, batch_size=8)
    _fill(cfg, [(i, i) for i in range(3000)])
    with CacheManager(cfg) as m:
        it = prefetching(range(3000), key=lambda r: r, cache=m, depth=16)
        p = _prefetcher(m)
        out = []
        for r in it:
            out.append(m.get(r))
            if r == 400:
                # reads that wait 20 ms for ~16 records of work: fetch threads overlap them
                assert p.inline is False and p.counters["staged"] > 0
                delay.seconds = 0.0
        assert out == list(range(3000))
        # probes (one inline batch every 64 thread batches) saw the waits go away
        assert p.inline is True


def test_fetch_mode_is_validated():
    from mlcache.errors import ConfigError

    with pytest.raises(ConfigError, match="fetch_mode"):
        PrefetchConfig(fetch_mode="sometimes")
    assert PrefetchConfig().fetch_mode == "auto"


def test_inline_batches_measure_latency_from_the_read_not_the_hint(tmp_path):
    # Regression: measured from the hint, an inline key's "fetch latency" included the records
    # it waited for its batch, which grows with the depth; the controller then kept doubling
    # the depth (10,000 records on the full nexmark run). From the read's start, it cannot
    # exceed the batch's own duration, and the depth stays far below its memory cap.
    cfg = _disk_config(tmp_path, None, entries=40_000, hot_threshold=16, fetch_mode="inline")
    n = 12_000
    _fill(cfg, [(i, i) for i in range(n)])
    with CacheManager(cfg) as m:
        it = prefetching(range(n), key=lambda r: r, cache=m)
        total = sum(m.get(r) for r in it)
        p = _prefetcher(m)
        assert total == sum(range(n))
        # each key's latency is exactly its batch's duration (same clock readings)
        assert set(p.fetch_latency._d) <= set(p.batch_latency._d)
        assert max(it.controller.history) < 20_000 // 4, it.controller.history


def test_operator_leaves_the_handed_over_record_key_to_its_own_get():
    buf = __import__("mlcache.prefetch", fromlist=["HintBuffer"]).HintBuffer()
    for i, kb in enumerate([b"head", b"a", b"b"]):
        buf.add(kb, float(i), 0.0)
    batch, late = buf.take(10, 0.0, skip=b"head")
    assert [kb for kb, _, _ in batch] == [b"a", b"b"] and late == 0
    assert list(buf.pending) == [b"head"]
    batch, _ = buf.take(10, 0.0, skip=b"head")
    assert batch == [] and list(buf.pending) == [b"head"]


def test_inline_operator_reads_the_last_keys_when_the_input_ends(tmp_path):
    # Regression: the batch trigger counted records read, which stops at the end of the input,
    # so the keys of the last records (fewer than a full batch) were never read ahead and every
    # one of those records arrived "late" and paid a demand read in its step.
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=1000, hot_threshold=16, fetch_mode="inline")
    n = 200
    _fill(cfg, [(i, i) for i in range(n)])
    with CacheManager(cfg) as m:
        out = [m.get(r) for r in prefetching(range(n), key=lambda r: r, cache=m, depth=32)]
        st = m.stats()["prefetch"]
    assert out == list(range(n))
    # only the first two records find their keys queued: record 0 is read and handed over in
    # one call, and record 1's key is left to its own get by the first batch
    assert st["late"] <= 2 and st["useful"] >= n - 2


def test_operator_installs_staged_reads_in_order_of_use(tmp_path, redis_url):
    # Regression: with two fetch threads, the batch of later keys can be staged before the
    # batch of earlier ones; installing in staging order left the next record's key staged
    # (not resident) when its record was handed over.
    cfg = _threads_config(redis_url, "pf-order")
    _fill(cfg, [(i, i * 10) for i in range(40)])
    with CacheManager(cfg) as m:
        m.hint(0, 0)                       # starts the prefetcher
        p = _prefetcher(m)
        _wait_idle(p)
        class Operator:       # what attach() holds: any object standing for the operator
            pass

        operator = Operator()
        p.attach(operator)
        try:
            seq = m._wb.wseq
            encode = m._codec.encode
            # staged as a second thread would leave them: keys 20..29 (used later) first
            for i in [*range(20, 30), *range(10, 20)]:
                raw = encode(i * 10)
                p._staged[m._encode_key(i)] = (raw, float(i), time.perf_counter(), seq)
                p._staged_bytes += len(raw)
            assert p.install(8) == 8
            assert [i for i in range(10, 30) if m._resident(m._encode_key(i))] == \
                list(range(10, 18))
            assert p.install(100) == 12
            assert all(m._resident(m._encode_key(i)) for i in range(10, 30))
            assert [m.get(i) for i in range(10, 30)] == [i * 10 for i in range(10, 30)]
        finally:
            p.detach(operator)


def test_an_error_of_the_input_comes_after_the_records_read_before_it(tmp_path):
    # The operator reads ahead: an exception raised by the input itself reached the caller up
    # to ``depth`` records early, and the records read ahead of it were never handed over.
    cfg = _disk_config(tmp_path, None)
    _fill(cfg, [(i, i) for i in range(100)])

    def records():
        for i in range(100):
            if i == 50:
                raise RuntimeError("input broke at 50")
            yield i

    with CacheManager(cfg) as m:
        seen = []
        with pytest.raises(RuntimeError, match="input broke at 50"):
            for r in prefetching(records(), key=lambda r: r, cache=m, depth=16):
                seen.append(m.get(r))
        assert seen == list(range(50))


@pytest.mark.parametrize("staged", [False, True])
def test_a_hint_while_the_key_is_in_flight_keeps_the_latest_time(tmp_path, staged):
    # The hint buffer keeps one entry per key with its latest ts, in flight too; but the key was
    # installed (and TAC told) with the ts of the batch it was taken in, so a later record's
    # hint that came during the read was lost, and TAC ordered the entry by the earlier use.
    delay = Delay(0.0)
    cfg = _disk_config(tmp_path, delay, entries=100, policy="tac", hot_threshold=16,
                       fetch_mode="threads")
    _fill(cfg, [("k", 1), ("j", 2)])
    reading, release = threading.Event(), threading.Event()

    def hold(keys):
        if threading.current_thread().name.startswith("mlcache-prefetch"):
            reading.set()
            release.wait(30)
        return False

    with CacheManager(cfg) as m:
        p = m._get_prefetcher()
        op = _Operator()
        if staged:
            p.attach(op)
        kb = m._encode_key("k")
        delay.fail = hold
        m.hint("k", 10.0)
        assert reading.wait(30)
        m.hint("k", 1000.0)               # a later record's hint, while the read runs
        assert p._buffer.inflight[kb][0] == 1000.0
        release.set()
        _wait_idle(p)
        if staged:
            assert kb in p._staged
            m.hint("k", 2000.0)           # read already, waiting to be installed
            _wait_idle(p)
            assert p._staged[kb][1] == 10.0   # installs still go by the first expected use
            assert p.install(100) == 1
        assert m._heap.policy.timestamp(kb) == (2000.0 if staged else 1000.0)
        if staged:
            p.detach(op)


@pytest.mark.parametrize("mode", ["threads", "inline"])
def test_corrupt_bytes_read_by_a_prefetch_raise_integrity_error(tmp_path, mode):
    # The inline operator's fallback wrapped every demand failure in a LevelUnavailableError
    # (retryable), so corrupt stored bytes told the caller to retry a read that can only fail
    # again; a get, or the fetch threads, raise IntegrityError for them.
    cfg = _disk_config(tmp_path, None, entries=100, hot_threshold=16, fetch_mode=mode)
    _fill(cfg, [(i, i) for i in range(50)])
    with CacheManager(cfg) as m:
        m._levels[0].put_many([(m._encode_key(20), b"\x01\xc1")])   # 0xc1: never msgpack
    with CacheManager(cfg) as m:
        got = []
        with pytest.raises(IntegrityError, match="key 20") as info:
            for r in prefetching(range(50), key=lambda r: r, cache=m, depth=8):
                got.append(m.get(r))
        assert not info.value.retryable
        assert got == list(range(20))


def test_a_key_that_fails_to_encode_otherwise_still_names_its_record(tmp_path):
    # Only a TypeError from encoding the key became a RecordKeyError; any other error (a tuple
    # nested past the recursion limit: RecursionError) escaped from the read-ahead, before the
    # records ahead of it were handed over. (Since keys refuse tuples nested more than
    # keys.MAX_KEY_DEPTH deep, this key's error is that TypeError, no longer a RecursionError.)
    cfg = _disk_config(tmp_path, None)
    deep: tuple = ()
    for _ in range(5000):
        deep = (deep,)
    with CacheManager(cfg) as m:
        it = prefetching([1, 2, deep, 3], key=lambda r: r, cache=m, depth=8)
        assert next(it) == 1 and next(it) == 2
        with pytest.raises(RecordKeyError, match="record 2") as info:
            next(it)
        assert info.value.index == 2 and isinstance(info.value.__cause__, TypeError)
        assert "nested more than" in str(info.value)


def test_the_prefetcher_keeps_its_attributes_inline(tmp_path):
    # CPython 3.11 reads an object's attributes at a fixed offset only while its class's
    # instances have fewer than 30 attribute names (counted over all of them); past that every
    # ``self._x`` on the hint and use paths (once or twice per record) is a dict lookup
    # (LOAD_ATTR_WITH_HINT). State those paths do not read lives in Prefetcher._cold (it had
    # 42 names): keep new attributes there, or this low.
    names: set[str] = set()
    for mode in ("inline", "threads", "auto"):
        cfg = _disk_config(tmp_path / mode, None, entries=60, policy="tac", hot_threshold=16,
                           fetch_mode=mode)
        _fill(cfg, [(i, i) for i in range(300)])
        with CacheManager(cfg) as m:
            records = [(i * 7) % 300 if i % 3 else i % 10 for i in range(2000)]
            got = [m.get(r) for r in prefetching(records, key=lambda r: r,
                                                  ts=lambda r: float(r), cache=m, depth=16)]
            assert got == records
            p = _prefetcher(m)
            m.hint(5, ts=1e9)
            m.hint(299, ts=1e9)
            assert m.get(299) == 299
            stats = p.stats()
            assert stats["hints"] >= 2000 and stats["mode"] in ("inline", "threads")
            assert p.config is cfg.prefetch and p.staged_max_keys > 0 < p.staged_max_bytes
            assert len(p.slack) <= 2048 and len(p.fetch_latency) <= len(p.batch_latency) + 2048
            names.update(vars(p))   # (vars() makes the dict: only after the work above)
    assert len(names) <= 27, sorted(names)


def test_hot_filter_keeps_the_hint_of_a_hot_key_tac_would_evict_before_its_use(tmp_path):
    """Under TAC an entry whose hint is dropped is not renewed: it leaves once the evictions
    reach its timestamp. With a deep read-ahead (a slow server) a key hot by count but last
    used long ago was dropped and then evicted before its record came, which missed and paid a
    full round trip (ysb through a 0.5 ms proxy: step p999 2.85 ms with the filter, 0.09 without).
    Its hint is now kept; a hot key used recently, or already stamped for a later use, still
    has its hint dropped."""
    cfg = _disk_config(tmp_path, None, entries=1000, policy="tac", hot_threshold=3)
    with CacheManager(cfg) as m:
        p = Prefetcher(m)
        try:
            m.put("old", 0, ts=1.0)              # last used at 1
            m.put("recent", 0, ts=99.0)          # last used at 99
            for i in range(100):
                m.put(("filler", i), i, ts=1.0 + i / 100)   # the front: around 1-2
            m._advance_clock(100.0)
            old, recent = m._encode_key("old"), m._encode_key("recent")
            for kb in (old, recent):
                p._filter.hot(kb)
                p._filter.hot(kb)
                p._filter.hot(kb)             # hot by count from here on
            # needed 500 later: "old" is ~0 ahead of the front, "recent" ~98
            assert p.hint(old, 600.0) == "resident"       # kept: TAC renews it to 600
            assert m._heap.policy.timestamp(old) == 600.0
            assert p.hint(recent, 140.0) == "hot"         # 98 ahead, needed in 40: safe
            assert p.hint(recent, 200.0) == "resident"    # needed in 100: renewed
            assert p.hint(recent, 150.0) == "hot"         # stamped for 200 already
            assert m._heap.policy.timestamp(recent) == 200.0
        finally:
            p.close()
