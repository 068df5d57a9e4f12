"""Regression tests from the session-6 review of the disk level, the config, inspect and the
simulator's readers: each test names the defect it pins down."""
from __future__ import annotations

import gzip
import math
import sqlite3
import time

import pytest

from mlcache.config import CacheConfig, DedupConfig, DiskConfig, PrefetchConfig
from mlcache.errors import ConfigError
from mlcache.sim import TraceFormatError, read_trace
from mlcache.sim.cli import main as simulate_main


# -- config ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_prefetch_enabled_must_be_a_bool(value):
    # "false" from a conf file is truthy: it switched prefetching on instead of off
    with pytest.raises(ConfigError, match="prefetch.enabled"):
        PrefetchConfig(enabled=value)
    with pytest.raises(ConfigError, match="prefetch.enabled"):
        CacheConfig.from_dict({"prefetch": {"enabled": value}})


def test_dedup_commit_interval_refuses_nan():
    # NaN passed the "<= 0" test; every comparison with the next commit time was then False,
    # so the record cache forwarded its dirty set on every single write
    with pytest.raises(ConfigError, match="dedup.commit_interval"):
        DedupConfig(commit_interval=math.nan)
    assert DedupConfig(commit_interval=0.5).commit_interval == 0.5



def test_disk_path_must_not_be_empty():
    path = ""
    # an empty path (an unset variable, say) fell back to the shared default directory, so the
    # level silently mixed its data with every other manager using the default
    with pytest.raises(ConfigError, match="disk.path"):
        DiskConfig(path=path)
    with pytest.raises(ConfigError, match="disk.path"):
        CacheConfig.from_dict({"levels": [{"type": "disk", "path": path}]})


@pytest.mark.parametrize("seconds", [math.inf, 1e10])
def test_redis_socket_timeout_must_fit_a_socket(redis_url, seconds):
    # accepted, then the first command died with a bare OverflowError naming no setting
    from mlcache.config import RedisConfig

    with pytest.raises(ConfigError, match="redis.socket_timeout"):
        RedisConfig(url=redis_url, socket_timeout=seconds)
    level = RedisConfig(url=redis_url, prefix="tmo", socket_timeout=1e9).build()
    try:
        level.put_many([(b"k", b"v")])
        assert level.get_many([b"k"]) == [b"v"]
    finally:
        level.close()

# -- simulator trace readers ----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["keys", "csv"])
def test_a_key_of_unicode_digits_is_a_string_key(tmp_path, fmt):
    # "²".isdigit() is True but int("²") fails: the reader died with a bare ValueError that
    # named neither the file nor the line
    path = tmp_path / "sup.txt"
    path.write_text("1\n\u00b2\n7\n", encoding="utf-8")
    trace = read_trace(f"{fmt}:{path}")
    assert trace.keys == [1, "\u00b2", 7]
    assert trace.skipped == 0


def test_a_truncated_or_corrupt_gzip_trace_names_file_and_line(tmp_path, capsys):
    # a truncated .gz died with a bare EOFError (a corrupt one with BadGzipFile) naming
    # neither the file nor the line, and `mlcache simulate` printed a traceback
    data = gzip.compress(b"".join(b"%d\n" % i for i in range(20000)))
    cut = tmp_path / "cut.trace.gz"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(TraceFormatError) as info:
        read_trace(f"lirs:{cut}", skip_bad_lines=True)
    assert info.value.path == str(cut) and 1 < info.value.line <= 20000
    assert str(cut) in str(info.value)
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"\x1f\x8b" + b"not a gzip stream" * 4)
    with pytest.raises(TraceFormatError, match="bad.gz:1:"):
        read_trace(f"keys:{bad}")
    assert simulate_main(["--trace", f"arc:{cut}", "--no-plot", "--no-progress"]) == 2
    assert str(cut) in capsys.readouterr().err


# -- mlcache inspect ------------------------------------------------------------------------------

def test_inspect_leaves_the_eviction_order_of_a_bounded_disk_level_alone(tmp_path):
    # inspect read every value through get_many, which on a bounded level stamps access_time:
    # afterwards the level evicted its most recently used entries first
    from mlcache.inspect import inspect_config

    cfg = DiskConfig(path=str(tmp_path / "disk"), max_bytes=10_000)
    level = cfg.build()
    for i in range(5):
        level.put_many([(b"ns\x1fk%d" % i, b"x" * 100)])
        time.sleep(0.002)
    level.get_many([b"ns\x1fk0"])

    def order():
        con = sqlite3.connect(tmp_path / "disk" / "cache.db")
        try:
            return [bytes(k) for (k,) in con.execute(
                "SELECT key FROM Cache ORDER BY access_time, rowid")]
        finally:
            con.close()

    before = order()
    assert before[-1] == b"ns\x1fk0"
    level.close()
    (usage,) = inspect_config(CacheConfig(heap=None, levels=(cfg,)))
    assert (usage.status, usage.entries, usage.bytes) == ("ok", 5, 5 * (5 + 100))
    assert order() == before


def test_inspect_leaves_the_lru_of_a_bounded_redis_level_alone(redis_url, unique_ns):
    # the same through Redis: its bounded get_many re-scores the keys in the LRU sorted set
    import redis

    from mlcache.config import RedisConfig
    from mlcache.inspect import inspect_config

    cfg = RedisConfig(url=redis_url, prefix=unique_ns, max_bytes=10_000)
    level = cfg.build()
    for i in range(5):
        level.put_many([(b"ns\x1fk%d" % i, b"x" * 100)])
        time.sleep(0.002)
    level.get_many([b"ns\x1fk0"])
    level.close()
    client = redis.Redis.from_url(redis_url)
    try:
        (lru,) = [k for k in client.keys(f"{unique_ns}*") if k.endswith(b"lru")]
        before = client.zrange(lru, 0, -1, withscores=True)
        (usage,) = inspect_config(CacheConfig(heap=None, levels=(cfg,)))
        assert (usage.status, usage.entries) == ("ok", 5)
        assert client.zrange(lru, 0, -1, withscores=True) == before
    finally:
        client.close()


# -- the disk level -------------------------------------------------------------------------------

@pytest.mark.parametrize("shards", [1, 3])
def test_disk_level_refuses_use_after_close(tmp_path, shards):
    # diskcache reopens its SQLite connection on demand: after close() every call still worked
    # and left a connection (and the WAL's file handles) open that nothing would close; Redis
    # and the arena raise LevelUnavailableError
    from mlcache.errors import LevelUnavailableError

    level = DiskConfig(path=str(tmp_path / "d"), shards=shards, max_bytes=1 << 20).build()
    level.put_many([(b"k", b"v")])
    level.close()
    level.close()    # still idempotent
    calls = [lambda: level.get_many([b"k"]), lambda: level.put_many([(b"k2", b"v")]),
             lambda: level.delete_many([b"k"]), lambda: list(level.scan(b"")),
             level.used_bytes, lambda: len(level), level.sync]
    for call in calls:
        with pytest.raises(LevelUnavailableError, match="closed") as info:
            call()
        assert info.value.level == "disk"
    assert all(s._local.__dict__.get("con") is None for s in level._shards)
    again = DiskConfig(path=str(tmp_path / "d"), shards=shards).build()
    try:
        assert again.get_many([b"k", b"k2"]) == [b"v", None]
    finally:
        again.close()


def test_disk_get_many_of_an_iterator_answers_every_key(tmp_path):
    # a generator was consumed by the shard grouping, and the answer, built by iterating the
    # keys again, came back empty: a caller zipping keys with values lost every hit silently
    level = DiskConfig(path=str(tmp_path / "d"), shards=2).build()
    try:
        level.put_many([(b"a", b"1"), (b"b", b"2")])
        assert level.get_many(k for k in (b"a", b"x", b"b")) == [b"1", None, b"2"]
        assert level.get_many(iter(())) == []
    finally:
        level.close()


@pytest.mark.parametrize("shards", [1, 4])
def test_inspect_creates_no_cache_in_a_directory_without_one(tmp_path, shards):
    # "inspecting creates nothing" held only for a path that did not exist: an existing
    # directory without a disk level (an empty one, a wrong path) got a new cache.db (or shard
    # directories) written into it
    from mlcache.inspect import inspect_config

    where = tmp_path / "elsewhere"
    where.mkdir()
    (where / "notes.txt").write_text("not a cache")
    cfg = DiskConfig(path=str(where), shards=shards)
    (usage,) = inspect_config(CacheConfig(heap=None, levels=(cfg,)))
    assert usage.status.startswith("missing")
    assert sorted(p.name for p in where.iterdir()) == ["notes.txt"]
    level = cfg.build()
    level.put_many([(b"ns\x1fk", b"v")])
    level.close()
    (usage,) = inspect_config(CacheConfig(heap=None, levels=(cfg,)))
    assert (usage.status, usage.entries) == ("ok", 1)


@pytest.mark.parametrize("url", ["redis://localhost:6379/0?password=s3cret",
                                 "redis://localhost:6379/0?db=0&password=s3cret&x=1",
                                 "rediss://user:s3cret@localhost:6380/0",
                                 "unix:///tmp/redis.sock?password=s3cret"])
def test_inspect_never_prints_a_password_given_in_the_query(url):
    # redis-py takes password= from the URL's query too; inspect masked only user:pw@
    from mlcache.config import RedisConfig
    from mlcache.inspect import _where

    shown = _where(RedisConfig(url=url))
    assert "s3cret" not in shown and "***" in shown
    assert "localhost" in shown or "/tmp/redis.sock" in shown


def test_redis_config_never_prints_the_url_password():
    # docs/howto/redis-auth-tls.md: "mlcache never prints a URL's password"; the dataclass
    # repr (also inside a CacheConfig's) and the error for a wrong scheme printed it
    from mlcache.config import RedisConfig

    for url in ("redis://user:s3cret@localhost:6379/0", "redis://localhost/0?password=s3cret"):
        cfg = RedisConfig(url=url)
        assert cfg.url == url
        assert "s3cret" not in repr(cfg) and "***" in repr(cfg)
        assert "s3cret" not in repr(CacheConfig(levels=(cfg,)))
        assert CacheConfig.from_dict(CacheConfig(levels=(cfg,)).to_dict()).levels[0].url == url
    with pytest.raises(ConfigError, match="redis.url") as info:
        RedisConfig(url="http://user:s3cret@localhost:6379/0")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("fmt", ["keys", "lirs", "csv"])
def test_a_byte_order_mark_is_not_part_of_the_first_key(tmp_path, fmt):
    # a UTF-8 BOM (files saved by some editors) stuck to the first key: "\ufeff5" became a
    # key of its own beside 5 in keys and csv traces, and a lirs trace refused its line 1
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf5\n6\n5\n")
    assert read_trace(f"{fmt}:{path}").keys == [5, 6, 5]
    gz = tmp_path / "bom.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf5\n6\n5\n"))
    assert read_trace(f"{fmt}:{gz}").keys == [5, 6, 5]


@pytest.mark.parametrize("shards", [1, 2])
def test_a_failed_batch_keeps_the_large_values_it_was_replacing(tmp_path, shards):
    # a value in a file of its own went through Cache.set, which removed the file it replaced
    # at once, inside the batch's transaction: when a later write of the batch failed (here
    # a file size limit, as a full disk would), the rollback restored a row whose file was
    # gone and the old value read as a miss; the new file of the failed batch stayed behind
    import os
    import resource
    import signal

    from mlcache.errors import CacheError

    path = tmp_path / "d"
    level = DiskConfig(path=str(path), shards=shards).build()
    old = {b"big%d" % i: bytes([65 + i]) * 50_000 for i in range(4)}
    level.put_many(list(old.items()))

    def value_files():
        return sorted(f for _, _, fs in os.walk(path) for f in fs if f.endswith(".val"))

    before = value_files()
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(CacheError, match="disk level"):
            level.put_many([*((k, b"n" * 60_000) for k in old), (b"huge", b"h" * 200_000)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    try:
        assert level.get_many([*old, b"huge"]) == [*old.values(), None]
        assert level.used_bytes() == 4 * 50_000
        assert value_files() == before
        level.put_many([(b"big0", b"s"), (b"big1", b"t" * 70_000)])    # a working batch
        assert level.get_many([b"big0", b"big1"]) == [b"s", b"t" * 70_000]
        assert len(value_files()) == 3     # big0 is inline now
    finally:
        level.close()


# -- mlcache stats ---------------------------------------------------------------------------------

def test_stats_names_a_url_that_serves_no_metrics(tmp_path, capsys):
    # a wrong port running some other web server: the exposition parser's ValueError came out
    # as a traceback instead of the one-line error the other scrape failures give
    import functools
    import http.server
    import threading

    from mlcache.stats_cli import main as stats_main

    (tmp_path / "metrics").write_text("<html><body>not an exporter</body></html>\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        assert stats_main(["--url", url]) == 1
        err = capsys.readouterr().err
        assert url in err and "Prometheus" in err
        assert stats_main(["--url", url, "--json"]) == 1
        assert stats_main(["--url", url, "--raw"]) == 0     # shown as served, unparsed
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("option", ["--csv", "--plot"])
def test_simulate_checks_its_output_paths_before_the_run(tmp_path, capsys, option):
    # an output path in a missing directory failed with a traceback after the whole run,
    # its results unwritten
    missing = str(tmp_path / "no-such-dir" / "out")
    args = ["--trace", "gen:zipf", "--requests", "100", "--policies", "lru", "--sizes", "5",
            "--no-progress", "--csv", str(tmp_path / "ok.csv"), "--plot", str(tmp_path / "ok.png")]
    args[args.index(option) + 1] = missing
    assert simulate_main(args) == 2
    captured = capsys.readouterr()
    assert missing in captured.err and "hit %" not in captured.out


@pytest.mark.parametrize("fmt", ["keys", "csv"])
def test_keys_that_are_not_utf8_stay_distinct(tmp_path, fmt):
    # undecodable bytes were replaced by U+FFFD, so "caf\xe9" and "caf\xe8" (a Latin-1 trace)
    # became one key and every request of the one counted as a hit on the other
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9\ncaf\xe8\ncaf\xe9\n")
    trace = read_trace(f"{fmt}:{path}")
    assert len(trace) == 3 and trace.unique_keys() == 2
    assert trace.keys[0] == trace.keys[2] != trace.keys[1]


def test_phase_trace_reports_the_bad_lines_its_parts_skipped(tmp_path, capsys):
    # --skip-bad-lines promises a count; a phase: trace dropped its parts' counts
    from mlcache.sim.cli import load_trace

    a = tmp_path / "a.lirs"
    a.write_text("1\nx\n2\n")
    b = tmp_path / "b.lirs"
    b.write_text("3\ny\nz\n4\n")
    trace = load_trace(f"phase:lirs:{a},lirs:{b}", skip_bad_lines=True)
    assert trace.keys == [1, 2, 3, 4, 1, 2] and trace.skipped == 3
    assert simulate_main(["--trace", f"phase:lirs:{a},lirs:{b}", "--skip-bad-lines",
                          "--policies", "lru", "--sizes", "2", "--no-progress", "--no-plot",
                          "--csv", str(tmp_path / "o.csv")]) == 0
    assert "3 bad lines skipped" in capsys.readouterr().out


def test_sync_makes_new_value_files_reachable_after_a_crash(tmp_path, monkeypatch):
    # regression: sync() fsynced a large value's file but not the directories diskcache
    # made for it, so after a power loss the synced file could have no directory entry
    import os

    import mlcache.levels.disk as disk_mod
    from mlcache.levels.disk import DiskLevel

    synced: list[str] = []
    real = disk_mod._fsync

    def recording(path: str) -> bool:
        synced.append(os.path.normpath(path))
        return real(path)

    monkeypatch.setattr(disk_mod, "_fsync", recording)
    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=1))
    level.put_many([(b"big", b"x" * (1 << 20))])
    level.sync()
    files = [p for p in synced if os.path.isfile(p)]
    assert len(files) == 1
    chain = os.path.dirname(files[0])
    root = os.path.normpath(level._shards[0].disk._directory)
    while True:                      # every directory from the file's up to the shard's
        assert chain in synced, chain
        if chain == root:
            break
        chain = os.path.dirname(chain)
    assert level.get_many([b"big"]) == [b"x" * (1 << 20)]
    level.close()


def test_policy_errors_name_the_field_the_user_set(tmp_path):
    # regression: an unknown arena policy was reported under "policy", and bad heap
    # policy_options under "policy.wtinylfu": fields no config has
    from mlcache import CacheManager
    from mlcache.config import ArenaConfig, HeapConfig

    disk = DiskConfig(path=str(tmp_path / "d"))
    with pytest.raises(ConfigError) as err:
        CacheManager(CacheConfig(heap=None, levels=(ArenaConfig(policy="nope"), disk)))
    assert err.value.field == "arena.policy" and "registered" in str(err.value)
    with pytest.raises(ConfigError) as err:
        CacheManager(CacheConfig(heap=HeapConfig(policy_options={"bogus": 1}), levels=(disk,)))
    assert err.value.field == "heap.policy_options" and "bogus" in str(err.value)
