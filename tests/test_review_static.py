"""Regression tests for defects found by a static-analysis pass (mypy, ruff) and review.

Each test names the defect it guards against; real Redis through the session fixtures.
"""
from __future__ import annotations

import math

import pytest

from mlcache import (CacheConfig, CacheManager, ConfigError, DiskConfig, HeapConfig,
                     PrefetchConfig, RedisConfig)


# -- config: a value of the wrong type is refused at construction, naming the field ----------

@pytest.mark.parametrize("make, field", [
    # "no" is truthy: it used to turn unpickling on / make the store of record lossy
    (lambda p: CacheConfig(allow_pickle="no", levels=(DiskConfig(path=p),)), "allow_pickle"),
    (lambda p: DiskConfig(path=p, lossy="no"), "disk.lossy"),
    (lambda p: RedisConfig(url="embedded", lossy="false"), "redis.lossy"),
    (lambda p: HeapConfig(track_mutations="no"), "heap.track_mutations"),
    # a non-string prefix failed with AttributeError when the manager was built
    (lambda p: RedisConfig(url="embedded", prefix=2024), "redis.prefix"),
    # prefetch=None / a dict failed with AttributeError at the first hint
    (lambda p: CacheConfig(prefetch=None, levels=(DiskConfig(path=p),)), "prefetch"),
    (lambda p: CacheConfig(prefetch={"enabled": False}, levels=(DiskConfig(path=p),)),
     "prefetch"),
    # NaN compares False with everything and slipped through ``value < 0``
    (lambda p: PrefetchConfig(lateness=math.nan), "prefetch.lateness"),
    (lambda p: CacheConfig(retry_backoff=math.nan, levels=(DiskConfig(path=p),)),
     "retry_backoff"),
])
def test_config_refuses_wrong_types_naming_the_field(tmp_path, make, field):
    with pytest.raises(ConfigError) as info:
        make(str(tmp_path))
    assert info.value.field == field


def test_config_from_dict_refuses_a_non_mapping_prefetch(tmp_path):
    with pytest.raises(ConfigError, match="prefetch"):
        CacheConfig.from_dict({"prefetch": None,
                               "levels": [{"type": "disk", "path": str(tmp_path)}]})


def test_redis_prefix_of_digits_from_spark_conf_is_text(redis_url, tmp_path):
    """``spark.mlcache.redis.prefix 2024`` used to become the int 2024, and the manager built
    from that config (on an executor) failed with AttributeError."""
    from mlcache.integrations.spark._conf import config_from_spark_conf

    cfg = config_from_spark_conf({
        "spark.mlcache.levels": "redis",
        "spark.mlcache.redis.url": redis_url,
        "spark.mlcache.redis.prefix": "2024",
        "spark.mlcache.signing_key": "1234567890123456",
    })
    assert cfg.levels[0].prefix == "2024"
    assert cfg.signing_key == b"1234567890123456"
    with CacheManager(cfg) as m:
        ns = m.namespace("n")
        ns.put("k", 1)
        m.flush()
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        assert any(k.startswith(b"2024") for k in client.scan_iter())
    finally:
        client.close()


def test_spark_conf_refuses_a_word_for_a_flag():
    from mlcache.integrations.spark._conf import config_from_spark_conf

    with pytest.raises(ConfigError, match=r"spark\.mlcache\.allow_pickle"):
        config_from_spark_conf({"spark.mlcache.allow_pickle": "no"})


# -- prefetch: an interrupt during a batch read on the caller's thread is not swallowed -------

def test_keyboard_interrupt_in_an_inline_prefetch_batch_reaches_the_caller(tmp_path):
    """Inline batches are read on the operator's (the caller's) thread; ``_fetch`` caught
    BaseException there so that a failure falls back to a demand read, and a Ctrl-C arriving
    during the read was kept as a "prefetch failure" and lost: the loop went on."""
    from mlcache.bench._delayed import Delay, DelayedLevelConfig
    from mlcache.prefetch import prefetching

    delay = Delay(0.0)
    level = DelayedLevelConfig(inner=DiskConfig(path=str(tmp_path / "disk")), delay=delay)
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=1000, max_bytes=None),
                      levels=(level,), namespace="t",
                      prefetch=PrefetchConfig(hot_threshold=16, fetch_mode="inline"))
    with CacheManager(cfg) as m:
        m.put_many([(i, i) for i in range(200)])
        m.checkpoint()
    interrupted = []

    def interrupt_once(keys):
        if len(keys) > 1 and not interrupted:     # a batch (a demand get reads one key)
            interrupted.append(len(keys))
            raise KeyboardInterrupt
        return False

    delay.fail = interrupt_once
    with CacheManager(cfg) as m:
        seen = []
        with pytest.raises(KeyboardInterrupt):
            for r in prefetching(range(200), key=lambda r: r, cache=m, depth=32):
                seen.append(m.get(r))
        assert interrupted and len(seen) < 200
        delay.fail = None
        # the keys of the interrupted batch are not left in flight: they read normally
        assert [m.get(i) for i in range(200)] == list(range(200))


# -- sliding windows: a NaN timestamp is refused by append as it is by extend ---------------

@pytest.mark.parametrize("columns", [["v"], None])
def test_window_append_refuses_a_nan_timestamp(tmp_path, columns):
    """extend() refused NaN times, append() took one and made it the watermark: NaN compares
    False with everything, so no later tuple was ever found late (here one 1.0 behind the
    watermark, with lateness 0, was silently accepted)."""
    from mlcache.structures import SlidingWindow

    rec = (lambda v: (v,)) if columns else (lambda v: v)
    value = "v" if columns else (lambda r: r)
    with SlidingWindow(10.0, columns=columns, value=value, directory=str(tmp_path)) as w:
        w.append(rec(1.0), 1.0)
        with pytest.raises(ValueError, match="NaN"):
            w.append(rec(2.0), math.nan)
        with pytest.raises(ValueError, match="behind the watermark"):
            w.append(rec(3.0), 0.0)
        w.append(rec(4.0), 2.0)
        assert w.result().count == 2 and w.result().sum == 5.0


@pytest.mark.parametrize("args, options, field", [
    # int(inf) raised OverflowError from the validation itself
    ((math.inf,), {"kind": "count"}, "range"),
    ((10,), {"kind": "count", "slide": math.inf}, "slide"),
    # '>=' between str/None and int raised a TypeError that did not name the setting
    ((10.0,), {"lateness": "x"}, "lateness"),
    ((10.0,), {"lateness": None}, "lateness"),
    ((10.0,), {"slide": True}, "slide"),
])
def test_window_settings_are_refused_with_a_config_error(tmp_path, args, options, field):
    from mlcache.structures import SlidingWindow

    with pytest.raises(ConfigError) as info:
        SlidingWindow(*args, directory=str(tmp_path), **options)
    assert info.value.field == field


# -- ForwardingSink(skip_unchanged=True) with array values -----------------------------------

def test_forwarding_sink_skip_unchanged_compares_arrays(redis_url, tmp_path):
    """``new == old`` of two numpy arrays is an array, and ``if ... and new == old`` raised
    "truth value of an array ... is ambiguous" from flush(): the records stayed pending and
    every later flush failed the same way."""
    np = pytest.importorskip("numpy")
    from mlcache import DedupConfig
    from mlcache.sink import ForwardingSink

    cfg = CacheConfig(levels=(RedisConfig(url=redis_url, prefix="sink"),
                              DiskConfig(path=str(tmp_path / "disk"))),
                      namespace="t", dedup=DedupConfig())
    got = []
    with CacheManager(cfg) as m:
        sink = ForwardingSink(got.extend, skip_unchanged=True)
        m.on_flush(sink)
        m.put("a", np.arange(3))
        m.put("b", np.arange(2))
        m.flush()
        m.put("a", np.arange(3))            # unchanged
        m.put("b", np.arange(3))            # changed (and of another shape)
        m.flush()
    assert [k for k, _, _ in got] == ["a", "b", "b"] and sink.skipped == 1
    assert np.array_equal(got[-1][1], np.arange(3)) and np.array_equal(got[-1][2], np.arange(2))


# -- prefetching(ts=...) returning something that is not a number ---------------------------

@pytest.mark.parametrize("bad", [None, "x", math.nan])
@pytest.mark.parametrize("policy", ["lru", "tac"])
def test_prefetching_ts_that_is_not_a_number_names_the_record(redis_url, bad, policy):
    """A ts= returning None or a string failed later with an anonymous TypeError from the
    policy or the hint buffer (or, with LRU and None, and with NaN, was taken silently); a
    NaN time is never ordered. It now raises RecordKeyError at that record, as a ts= that
    raises does."""
    from mlcache.prefetch import RecordKeyError, prefetching

    cfg = CacheConfig(heap=HeapConfig(policy=policy, max_entries=100, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix="ts"),), namespace="t")
    with CacheManager(cfg) as m:
        m.put_many([(i, i) for i in range(20)])
        m.checkpoint()
    with CacheManager(cfg) as m:
        got = []
        with pytest.raises(RecordKeyError, match=r"record 5: ts= returned") as info:
            for r in prefetching(range(20), key=lambda r: r, cache=m, depth=4,
                                 ts=lambda r: bad if r == 5 else float(r)):
                got.append(m.get(r))
        assert got == [0, 1, 2, 3, 4] and info.value.index == 5


@pytest.mark.parametrize("requests", ["-1", "0"])
def test_simulate_refuses_a_non_positive_request_count(capsys, tmp_path, requests):
    """--requests -1 ended in numpy's 'negative dimensions are not allowed' traceback."""
    from mlcache.sim.cli import main as simulate_main

    rc = simulate_main(["--trace", "gen:zipf", "--sizes", "10", "--requests", requests,
                        "--no-plot", "--no-progress", "--csv", str(tmp_path / "x.csv")])
    assert rc == 2
    assert "requests: must be a positive integer" in capsys.readouterr().err


def test_window_reopened_with_another_configuration_closes_its_data_file(tmp_path):
    """Reopening a window directory with another configuration raises ConfigError; the data
    file opened before the check was never closed (a raw descriptor: one leaked per try)."""
    import os

    from mlcache.structures import SlidingWindow

    d = str(tmp_path / "w")
    with SlidingWindow(10.0, directory=d) as w:
        w.append(1.0, 1.0)
    fds = lambda: len(os.listdir("/proc/self/fd"))   # noqa: E731
    before = fds()
    for _ in range(5):
        with pytest.raises(ConfigError, match="another configuration"):
            SlidingWindow(20.0, directory=d)
    assert fds() == before
    with SlidingWindow(10.0, directory=d) as w:    # the right configuration still continues
        w.append(2.0, 2.0)
        assert w.result().count == 2


# -- Spark micro-batch snapshots go through the codec (allow_pickle, signatures) -------------

_RAN: list = []


def _trap_ran() -> None:
    _RAN.append("unpickled")


class _Trap:
    """Unpickling it runs code (what a forged pickle would do)."""

    def __reduce__(self):
        return (_trap_ran, ())


def test_batch_snapshot_is_never_unpickled_with_allow_pickle_false(redis_url):
    """A versioned entry keeps the pre-batch state as bytes; BatchView read them back with a
    bare pickle.loads, so allow_pickle=False (and a signing key) did not cover them: anyone
    able to write the shared Redis could run code in the executors through a forged entry of
    the batch being run. Snapshots now go through the manager's codec."""
    import pickle

    from mlcache.errors import IntegrityError
    from mlcache.integrations.spark._versioned import MARK, BatchView

    _RAN.clear()
    cfg = CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix="bv"),), namespace="t",
                      allow_pickle=False)
    with CacheManager(cfg) as m:
        ns = m.namespace("v")
        # msgpack-encodable as a whole, so the codec stores it under allow_pickle=False
        ns.put("k", [MARK, 5, "other-attempt", 1, 10, pickle.dumps(_Trap())])
        m.checkpoint()
    with CacheManager(cfg) as m:
        view = BatchView(m.namespace("v"), 5, "mine")
        with pytest.raises(IntegrityError):
            view.get("k")
    assert _RAN == []


def test_batch_view_replays_through_the_codec_over_redis(redis_url):
    """The snapshots' round trip through the codec, signed, with values msgpack and
    cloudpickle encode."""
    from mlcache.integrations.spark._versioned import BatchView, unwrap

    cfg = CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix="bv2"),), namespace="t",
                      signing_key=b"0123456789abcdef")
    with CacheManager(cfg) as m:
        ns = m.namespace("v")
        BatchView(ns, 0, "a").put("k", {"n": [1, 2], "t": (3, 4)})
        BatchView(ns, 0, "a").put("s", {1, 2})              # a set: cloudpickle
        first = BatchView(ns, 1, "b")
        first.put("k", {"n": [9]})
        first.put("s", {3})
        m.checkpoint()
        replay = BatchView(ns, 1, "c")
        assert replay.get("k") == {"n": [1, 2], "t": (3, 4)} and replay.get("s") == {1, 2}
        replay.put("k", {"n": [7]})
        assert sorted(replay.changes(), key=repr) == [("k", {"n": [7]}, {"n": [1, 2], "t": (3, 4)})]
        assert unwrap(ns.get("k")) == (True, {"n": [7]})


# -- mlcache demo: bad arguments are reported, not raised as tracebacks ---------------------

def test_demo_reports_a_bad_redis_url_and_port(capsys):
    from mlcache.cli import main as cli_main

    assert cli_main(["demo", "--local", "--quick", "--redis", "http://nope"]) == 2
    assert "mlcache demo: redis.url: must be redis://" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:     # argparse's usage error, exit status 2
        cli_main(["demo", "--local", "--quick", "--metrics-port", "99999"])
    assert info.value.code == 2
    assert "a port is 0..65535, got 99999" in capsys.readouterr().err


def test_stats_reports_a_bad_url_and_watch_interval(capsys):
    """--url notaurl raised urllib's ValueError as a traceback; --watch -1 scraped once and
    then failed in time.sleep."""
    from mlcache.stats_cli import main as stats_main

    assert stats_main(["--url", "notaurl"]) == 1
    assert "cannot scrape notaurl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        stats_main(["--port", "1", "--watch", "-1"])
    assert info.value.code == 2 and "--watch must be a positive" in capsys.readouterr().err


@pytest.mark.parametrize("levels", [5, None, "disk", {"type": "disk"}])
def test_config_from_dict_refuses_levels_that_are_not_a_list(levels):
    """{"levels": 5} or null raised TypeError (not iterable), "disk" complained about
    levels[0] ('d'), a single mapping about its first key."""
    with pytest.raises(ConfigError) as info:
        CacheConfig.from_dict({"levels": levels})
    assert info.value.field == "levels"


# -- SparkCache: decorator arguments are checked on the driver ------------------------------

def test_spark_cache_checks_depth_ts_and_listeners_on_the_driver(redis_url):
    """depth=, ts= and listeners/sink were only looked at on the executors, when a task ran
    (a listener that is not callable after the partition's work was done and flushed)."""
    from mlcache.integrations.spark import SparkCache

    cache = SparkCache(CacheConfig(levels=(RedisConfig(url=redis_url, prefix="sc"),)))

    def fn(records, state):
        return records

    with pytest.raises(ValueError, match="depth="):
        cache.partitions(fn, key="k", depth="fast")
    with pytest.raises(ValueError, match="depth="):
        cache.pandas(fn, key="k", depth=-1)
    with pytest.raises(TypeError, match="ts="):
        cache.partitions(fn, key="k", ts=1.5)
    with pytest.raises(TypeError, match="flush listener"):
        cache.partitions(fn, key="k", listeners=[5])
    with pytest.raises(TypeError, match="flush listener"):
        cache.foreach_batch(lambda df, bid: None, sink="not callable")
    cache.partitions(fn, key="k", ts="t", depth=8, listeners=[print])    # valid: accepted


def test_versioned_view_tells_a_user_list_holding_an_array_from_a_record(redis_url):
    """A plain value [array, ...] of six items made ``rec[0] == MARK`` an array, whose truth
    value raised ValueError (in snapshot()'s unwrap, and instead of BatchView's ReplayError)."""
    np = pytest.importorskip("numpy")
    from mlcache.integrations.spark._versioned import BatchView, ReplayError, unwrap

    value = [np.array(["a", "b"]), 1, 2, 3, 4, 5]
    present, got = unwrap(value)
    assert present and got is value
    cfg = CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                      levels=(RedisConfig(url=redis_url, prefix="uv"),), namespace="t")
    with CacheManager(cfg) as m:
        ns = m.namespace("v")
        ns.put("k", value)
        m.checkpoint()
    with CacheManager(cfg) as m:
        with pytest.raises(ReplayError, match="without a batch id"):
            BatchView(m.namespace("v"), 1, "a").get("k")
