"""Prometheus export: a real manager doing work, scraped over HTTP, exposition parsed."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig, RedisConfig
from mlcache.cli import main as cli_main
from mlcache.demo import run_local
from mlcache.metrics import serve, serve_stats
from mlcache.stats_cli import main as stats_main
from mlcache.stats_cli import format_summary, summarize

FAMILIES = {"mlcache_hits", "mlcache_misses", "mlcache_load_seconds", "mlcache_evictions",
            "mlcache_dirty_bytes", "mlcache_dirty_entries", "mlcache_prefetch_events",
            "mlcache_keys_written", "mlcache_used_bytes"}


def _scrape(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(samples: list, name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scrape_of_a_working_manager(tmp_path, redis_url, unique_ns):
    config = CacheConfig(heap=HeapConfig(max_entries=200, max_bytes=None),
                         levels=(RedisConfig(url=redis_url, prefix=unique_ns),
                                 DiskConfig(path=str(tmp_path / "disk"))),
                         prefetch=PrefetchConfig(enabled=True), namespace="metrics")
    stop = threading.Event()
    rounds = [0]
    with CacheManager(config) as m, serve(m) as server:
        assert server.host == "127.0.0.1" and server.port > 0

        def work() -> None:
            i = 0
            while not stop.is_set() or rounds[0] < 2:
                for k in range(i, i + 300):
                    m.put(k % 1500, {"n": k, "pad": "x" * 50})
                for k in range(i, i + 300, 3):
                    m.hint((k + 700) % 1500, k)
                    m.get((k + 700) % 1500)
                i += 300
                rounds[0] += 1

        worker = threading.Thread(target=work)
        worker.start()
        try:
            while rounds[0] < 2:
                time.sleep(0.05)
            first = _scrape(server.url)
            while rounds[0] < 5:
                time.sleep(0.05)
            second = _scrape(server.url)
        finally:
            stop.set()
            worker.join()
        m.flush()
        third = _scrape(server.url)

    for fams in (first, second, third):
        assert FAMILIES <= set(fams)
    heap_lookups = lambda f: (_value(f["mlcache_hits"], "mlcache_hits_total", level="heap")
                              + _value(f["mlcache_misses"], "mlcache_misses_total", level="heap"))
    assert heap_lookups(third) >= heap_lookups(second) >= heap_lookups(first) > 0
    for lv in ("heap", "redis", "disk"):
        assert any(s.labels.get("level") == lv for s in third["mlcache_hits"])
    # Entries left the heap (capacity evictions), and were written below it.
    assert _value(third["mlcache_evictions"], "mlcache_evictions_total", level="heap") > 0
    assert _value(third["mlcache_keys_written"], "mlcache_keys_written_total", level="redis") > 0
    # The load histogram is cumulative and its count matches its +Inf bucket.
    redis_buckets = [s for s in third["mlcache_load_seconds"]
                     if s.name == "mlcache_load_seconds_bucket" and s.labels["level"] == "redis"]
    counts = [s.value for s in redis_buckets]
    assert counts == sorted(counts) and redis_buckets[-1].labels["le"] == "+Inf"
    assert counts[-1] == _value(third["mlcache_load_seconds"], "mlcache_load_seconds_count",
                                level="redis") > 0
    assert _value(third["mlcache_prefetch_events"], "mlcache_prefetch_events_total",
                  event="hints") > 0
    # every counter the prefetcher keeps is exported (the staged-read ones were missing)
    events = {s.labels["event"] for s in third["mlcache_prefetch_events"]}
    assert {"inline_batches", "split_reads", "staged", "staged_dropped"} <= events
    assert "mlcache_prefetch_staged" in third and "mlcache_prefetch_staged_bytes" in third
    # After flush nothing is dirty any more.
    assert _value(third["mlcache_dirty_entries"], "mlcache_dirty_entries") == 0
    assert _value(third["mlcache_dirty_bytes"], "mlcache_dirty_bytes") == 0


def test_dirty_bytes_before_flush(tmp_path):
    config = CacheConfig(heap=HeapConfig(max_bytes=1 << 20),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as m, serve(m) as server:
        for k in range(50):
            m.put(k, "v" * 100)
        fams = _scrape(server.url)
        assert _value(fams["mlcache_dirty_entries"], "mlcache_dirty_entries") == 50
        assert _value(fams["mlcache_dirty_bytes"], "mlcache_dirty_bytes") >= 50 * 100


def test_worker_label_for_many_sources(tmp_path):
    managers = [CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / f"d{i}")),)))
                for i in range(2)]
    try:
        for i, m in enumerate(managers):
            for k in range(10 * (i + 1)):
                m.put(k, k)
                m.get(k)
        with serve_stats(lambda: {f"w{i}": m.stats() for i, m in enumerate(managers)}) as srv:
            fams = _scrape(srv.url)
            text = format_summary(summarize(urllib.request.urlopen(srv.url).read().decode()))
    finally:
        for m in managers:
            m.close()
    hits = {s.labels["worker"]: s.value for s in fams["mlcache_hits"]
            if s.labels["level"] == "heap"}
    assert hits == {"w0": 10.0, "w1": 20.0}
    assert "w0/heap" in text and "w1/disk" in text and "[w1]" in text
    assert "dirty: bytes=" in text


def test_stats_cli_prints_levels(tmp_path, capsys):
    with CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "d")),))) as m, \
            serve(m) as server:
        for k in range(20):
            m.put(k, k)
        m.flush()
        m.get(3)
        assert stats_main(["--url", server.url]) == 0
        out = capsys.readouterr().out
        assert "heap" in out and "disk" in out and "hits" in out
        assert cli_main(["stats", "--port", str(server.port), "--raw"]) == 0
        assert "mlcache_hits_total" in capsys.readouterr().out
        assert cli_main(["stats", "--url", server.url, "--json"]) == 0
        assert '"heap"' in capsys.readouterr().out
        summary = summarize(urllib.request.urlopen(server.url).read().decode())
        assert summary["levels"]["heap"]["hits"] >= 1
    assert stats_main(["--port", str(_free_port())]) == 1     # nothing listening


def test_local_demo_serves_metrics_while_it_runs(tmp_path):
    port = _free_port()
    scraped: list[dict] = []
    result: list = []
    job = threading.Thread(target=lambda: result.append(
        run_local(events=30_000, cards=6_000, disk_path=str(tmp_path / "d"), progress=False,
                  metrics_port=port)))
    job.start()
    url = f"http://127.0.0.1:{port}/metrics"
    while job.is_alive() and not scraped:
        try:
            scraped.append(_scrape(url))
        except OSError:
            time.sleep(0.02)
    job.join()
    assert result and result[0].mismatches == 0
    assert scraped, "the demo finished before its exporter answered"
    assert FAMILIES - {"mlcache_prefetch_events"} <= set(scraped[0])
