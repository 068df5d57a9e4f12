"""Session 9 review of the benchmark harness (mlcache/bench): regression tests.

None of these time anything: they check what is measured and how it is reported.
"""
from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from mlcache.bench import all as bench_all
from mlcache.bench._report import BenchReport, goal_met


# -- a goal that cannot be measured is listed, not met ---------------------------------------

def test_unmeasured_goal_is_listed_and_not_met(tmp_path):
    report = BenchReport("example")
    report.goal("measured", 2.0, ">=", 1.0)
    assert report.unmeasured("needs theine", ">=", 2.5, "theine is not installed") is False
    data = json.loads(json.dumps(report.to_dict()))
    assert [g["name"] for g in data["goals"]] == ["measured", "needs theine"]
    missing = data["goals"][1]
    assert missing["value"] is None and missing["target"] == 2.5
    assert missing["unmeasured"] == "theine is not installed"
    assert [goal_met(g) for g in data["goals"]] == [True, False]
    assert "[NOT MEASURED] needs theine (>= 2.5): theine is not installed" in report.format()
    assert bench_all._margin(missing) == -1.0
    # a NaN value is a miss in the plot too (it was drawn as a full 'met' bar)
    assert bench_all._margin({"value": float("nan"), "op": ">=", "target": 1.0}) == -1.0

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "_run.json").write_text(json.dumps({"date": "d", "machine": "m", "quick": True,
                                               "benchmarks": ["example"], "failures": {}}))
    (raw / "example.json").write_text(json.dumps(data))
    page = bench_all.render_report(tmp_path, tmp_path / "report.md").read_text()
    assert "| 1 / 2 (1 not measured) |" in page
    assert "not measured: theine is not installed" in page


def test_policies_lists_goals_of_missing_traces_and_theine_as_unmeasured():
    """A trace file or theine missing used to drop those goals from the report silently, so a
    run without them could show every listed goal met."""
    from mlcache.bench import policies

    row = {"mlcache.TinyLFUCache": 47.0, "cachetools.LRUCache": 40.0, "theine.Cache": 46.0}
    best = {"mlcache.TinyLFUCache": 3.0, "cachetools.LRUCache": 2.0, "theine.Cache": 1.0}
    full = BenchReport("policies")
    policies._goals(full, {name: row for name, *_ in policies._TRACES} | {"zipf": row},
                    best, "/traces")
    names = [g["name"] for g in full.goals]
    assert all(g["value"] is not None for g in full.goals)

    partial = BenchReport("policies")
    no_theine = {k: v for k, v in best.items() if k != "theine.Cache"}
    policies._goals(partial, {"zipf": row}, no_theine, "/nowhere")
    assert [g["name"] for g in partial.goals] == names       # the same goals, in order
    by_name = {g["name"]: g for g in partial.goals}
    assert by_name["oltp: wtinylfu hit%"]["value"] is None
    assert "oltp not found in /nowhere" in by_name["oltp: wtinylfu hit%"]["unmeasured"]
    assert by_name["zipf: wtinylfu hit% - theine hit%"]["value"] is None
    assert "theine" in by_name["zipf throughput TinyLFUCache / theine"]["unmeasured"]
    assert by_name["zipf: wtinylfu hit%"]["value"] == 47.0
    assert not any(goal_met(g) for g in partial.goals if g["value"] is None)


# -- bad arguments: one error line before anything runs --------------------------------------

@pytest.mark.parametrize("argv, what", [
    (["policies", "--repeat", "-1"], "argument --repeat: must be at least 1, got -1"),
    (["policies", "--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
    (["policies", "--traces", "/no/such/dir"], "argument --traces: no directory /no/such/dir"),
    (["prefetch", "--rounds", "-1"], "argument --rounds: must be at least 1"),
    (["prefetch", "--backend-delay-ms", "-2"], "argument --backend-delay-ms: must be a finite"),
    (["prefetch", "--backend-delay-ms", "inf"], "argument --backend-delay-ms: must be a finite"),
    (["prefetch", "--redis-delay-ms", "-1"], "argument --redis-delay-ms: must be a finite"),
    (["prefetch", "--hot-threshold", "17"], "argument --hot-threshold: must be at most 16"),
    (["events", "--intervals", "5"], "argument --intervals: must be at least 13"),
    (["events", "--posts", "0"], "argument --posts: must be at least 1"),
    (["events", "--repeat", "-1"], "argument --repeat: must be at least 1"),
    (["events", "--policy", "nope"], "argument --policy: unknown policy 'nope'"),
    (["windows", "--block-size", "16"], "argument --block-size: must be at least 64"),
    (["windows", "--window-blocks", "0"], "argument --window-blocks: must be at least 200"),
    (["windows", "--window-blocks", "199"], "argument --window-blocks: must be at least 200"),
    (["dedup", "--intervals", "-1"], "argument --intervals: must be at least 1"),
    (["dedup", "--updates", "0"], "argument --updates: must be at least 1"),
    (["dedup", "--keys", "x"], "argument --keys: not an integer: 'x'"),
    (["arena", "--churn-mib", "-4"], "argument --churn-mib: must be at least 1"),
    (["levels", "--redis-url", "localhost:6379"], "argument --redis-url: not a Redis URL"),
    (["spark", "--redis", "http://x"], "argument --redis: not a Redis URL"),
])
def test_bad_benchmark_arguments_are_refused_before_running(argv, what, capsys):
    from mlcache.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv, "--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"mlcache bench {argv[0]}: error: {what}")
# -- prefetch: a record's latency includes what the input iterator did for it ------------------

class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _SlowInput:
    """An input whose ``next`` spends 5 clock units (a read-ahead doing reads inline)."""

    def __init__(self, events, clock: _FakeClock) -> None:
        self.events, self.clock = iter(events), clock

    def __iter__(self):
        return self

    def __next__(self):
        self.clock.now += 5.0
        return next(self.events)


class _Workload:
    def __init__(self, clock: _FakeClock) -> None:
        self.clock = clock

    def process(self, agg: Counter, event: tuple, value) -> None:
        self.clock.now += 1.0            # the step's own work: 1 unit
        agg[event[0]] += 1


def test_prefetch_latency_counts_the_inputs_share(monkeypatch):
    """The keyed operator reads later records' state inside ``next`` on the processing thread;
    the latency used to start after ``next`` returned, leaving those reads out of the keyed
    variant's p999 while the baselines' blocking reads were in it."""
    from mlcache import CacheConfig, CacheManager, HeapConfig
    from mlcache.bench import prefetch

    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    events = [(f"k{i}", "view", i) for i in range(20)]
    with CacheManager(CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                                  levels=())) as m:
        agg: Counter = Counter()
        lat: list[float] = []
        hits: list[bool] = []
        nxt: list[float] = []
        step: list[float] = []
        prefetch._drive(m, _Workload(clock), _SlowInput(events, clock), agg, lat, hits, nxt,
                        step)
    assert sum(agg.values()) == 20
    assert nxt == [5.0] * 20 and step == [1.0] * 20
    assert lat == [6.0] * 20


# -- dedup: 'state correct' checks every key ---------------------------------------------------

def test_dedup_state_check_covers_every_key(tmp_path):
    """The check read back the first 500 keys of the expected state only, so a variant that
    lost or corrupted a key seen later still reported its state correct."""
    from mlcache.bench import dedup

    variant = dedup._Variant("dedup", str(tmp_path))
    try:
        keys = list(range(600))
        variant.updates_chunk(keys)
        variant.commit(keys)
        expected = {k: 1 for k in keys}
        assert variant.row(expected)["state_correct"] is True
        expected[599] = 2                     # the store holds 1: a wrong value past the 500th
        assert variant.row(expected)["state_correct"] is False
    finally:
        variant.m.close()


# -- spark: no variant runs in a favoured position ---------------------------------------------

def test_spark_runs_every_variant_twice_at_the_same_mean_position():
    """Each variant ran once, all-in-heap first: the session speeds up run after run (JIT,
    worker caches), so the baseline of 'time mlcache / all-in-heap' paid the warming alone."""
    from mlcache.bench import spark

    order = spark._schedule()
    positions = {v: [i for i, name in enumerate(order) if name == v] for v in spark.ORDER}
    assert all(len(p) == 2 for p in positions.values())
    assert len({sum(p) for p in positions.values()}) == 1


def test_spark_row_is_the_mean_of_the_runs():
    from mlcache.bench import spark
    from mlcache.demo_spark import PipelineResult

    def result(seconds: float, batches: list[float], mismatches: int) -> PipelineResult:
        return PipelineResult(variant="mlcache", events=1000, cards=500, batches=2,
                              seconds=seconds, batch_seconds=batches, alerts=0,
                              mismatches=mismatches, heap_entries_per_worker=25, creations={})

    report = BenchReport("spark")
    row = spark._row(report, [result(4.0, [1.0, 3.0], 0), result(2.0, [0.5, 1.5], 1)])
    assert row["seconds"] == 3.0 and row["seconds_per_run"] == "4.00, 2.00"
    assert row["throughput"] == round(1000 / 3.0, 1)
    assert row["mismatches"] == 1


# -- optional extras missing: goals unmeasured, the page still written --------------------------

def test_spark_without_the_spark_extra_lists_its_goals_unmeasured(monkeypatch):
    import argparse
    import sys

    from mlcache.bench import spark

    monkeypatch.setitem(sys.modules, "pyspark", None)       # as if not installed
    report = spark.run(argparse.Namespace(quick=True, redis=None))
    assert [(g["name"], g["op"], g["target"]) for g in report.goals] == list(spark.GOALS)
    assert all(g["value"] is None and "pyspark is not installed" in g["unmeasured"]
               for g in report.goals)


def test_report_page_is_written_without_matplotlib(tmp_path, monkeypatch):
    """The page rendered at the end of `bench all --report` imported matplotlib for the plots
    and failed without it (the bench extra), after every benchmark had run."""
    import sys

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "_run.json").write_text(json.dumps({"date": "d", "machine": "m", "quick": True,
                                               "benchmarks": ["example"], "failures": {}}))
    report = BenchReport("example")
    report.result("a", throughput=1.0)
    report.result("b", throughput=2.0)
    report.goal("b / a", 2.0, ">=", 1.0)
    (raw / "example.json").write_text(json.dumps(report.to_dict()))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    page = bench_all.render_report(tmp_path, tmp_path / "report.md").read_text()
    assert "| b / a | 2.00 | >= 1.00 | met |" in page
    assert "plots/example.png" not in page


def test_nan_and_infinite_figures_are_valid_json_and_a_nan_goal_is_unmeasured():
    """json.dump wrote NaN/Infinity (not JSON: strict readers refuse the whole file) and a NaN
    goal value was stored as a number."""
    report = BenchReport("example")
    report.result("a", p999_ms=float("nan"), ratio=float("inf"), n=3)
    assert report.goal("0/0", float("nan"), "<=", 1.0) is False
    assert report.goal("x/0", float("inf"), ">=", 10.0) is False

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    data = json.loads(json.dumps(report.to_dict()), parse_constant=refuse)
    assert data["results"] == [{"variant": "a", "p999_ms": None, "ratio": None, "n": 3}]
    assert [g["value"] for g in data["goals"]] == [None, None]
    assert data["goals"][0]["unmeasured"] == "the measurement gave nan"


def test_dedup_checks_one_forward_per_dirty_key_per_interval_pair_by_pair(tmp_path):
    """'Exactly one forward per dirty key per interval' was measured as total forwards over
    total dirty keys, which is 1.0 also when a key is forwarded twice and another not at all."""
    from mlcache.bench import dedup

    variant = dedup._Variant("dedup", str(tmp_path))
    try:
        variant.updates_chunk([1, 2, 2, 3])
        variant.commit([1, 2, 2, 3])
        assert variant.wrong_pairs == 0 and variant.downstream == 3
        # interval 2 counted as dirty {4, 5}, only 4 updated, and 4 forwarded twice (once
        # more through the listener): 2 forwards for 2 dirty keys, a mean of exactly 1.0
        variant.updates_chunk([4])
        variant._count([(4, 1, None)])
        before = variant.downstream
        variant.commit([4, 5])
        assert variant.downstream - before == 1 and variant.downstream == 5 == variant.dirty
        assert variant.wrong_pairs == 2                  # 4 forwarded twice, 5 never
        row = variant.row({1: 1, 2: 2, 3: 1, 4: 1})
        assert row["pairs_not_forwarded_once"] == 2
    finally:
        variant.m.close()


def test_prefetch_goal_specs_match_the_issue():
    from mlcache.bench import prefetch

    ysb, nexmark = prefetch._goal_specs("ysb"), prefetch._goal_specs("nexmark")
    assert [(op, t) for _, op, t in ysb] == [("<=", 0.2), ("<=", 1.0), (">=", 1.0), ("==", 5),
                                              (">=", 0.5), (">=", -0.001)]
    assert [(op, t) for _, op, t in nexmark] == [("<=", 0.2), ("<=", 1.0), (">=", 1.0),
                                                  ("==", 4)]


def test_events_memory_pass_counts_the_heaps_own_bookkeeping():
    """The events memory goal ('heap memory within its byte budget') traced only the node
    files, not what the heap itself allocates per entry (its entries, keys, policy records)."""
    import fnmatch

    from mlcache.bench import events

    files = events.NODE_FILES + events.HEAP_FILES
    for path in ("/x/mlcache/levels/heap.py", "/x/mlcache/keys.py", "/x/policies/lru.py",
                 "/x/policies/wtinylfu.py", "/x/mlcache/writeback.py",
                 "/x/structures/quadtree.py", "/x/mlcache/codec.py"):
        assert any(fnmatch.fnmatch(path, f"*{f}") for f in files), path


def test_delay_proxy_forwards_in_order_and_stops(redis_url, redis_server):
    """The bench's delay proxy (``--redis-delay-ms``): a real Redis behind it answers a
    pipeline of many commands in order, and the proxy process ends with stop()."""
    import redis as redis_py

    from mlcache.bench._proxy import DelayProxy

    with DelayProxy(redis_server.port, 1.0) as proxy:
        client = redis_py.Redis.from_url(proxy.url)
        pipe = client.pipeline(transaction=False)
        for i in range(500):
            pipe.set(f"proxy:{i}", i)
        for i in range(500):
            pipe.get(f"proxy:{i}")
        out = pipe.execute()
        client.close()
        proc = proxy._proc
        assert out[500:] == [str(i).encode() for i in range(500)]
    assert proc.poll() is not None
    with pytest.raises(ValueError, match="delay_ms"):
        DelayProxy(redis_server.port, -1.0)

