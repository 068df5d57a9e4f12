"""Prometheus export of ``manager.stats()`` (optional extra ``metrics``: ``prometheus-client``).

A custom collector reads the stats at scrape time, so the data path pays nothing for being
observed: no counter is mirrored into a Prometheus object on every ``get``. The rejected
alternative, ``prometheus_client.Counter`` objects incremented on the hit path, would cost a
lock and a dict lookup per access for figures the manager already keeps.

Families (all prefixed ``mlcache_``; ``level`` is heap, arena, redis or disk)::

    hits_total / misses_total{level}          keys found / not found at that level
    loads_total / keys_loaded_total{level}    batched reads and the keys they returned
    load_seconds{level}                       histogram of batched read times (log2 buckets)
    keys_written_total / written_bytes_total{level}
    evictions_total{level,cause}              entries leaving a level, by cause
    entries / used_bytes{level}               what a level holds now
    dirty_entries / dirty_bytes               written, not yet below the heap (heap + buffer)
    writeback_events_total{event}             write-back counters (dirty flushes, retries, ...)
    prefetch_events_total{event}              hints, prefetched, useful, wasted, late, ...
    prefetch_pending / prefetch_inflight      keys waiting / being fetched
    prefetch_staged / prefetch_staged_bytes   reads staged by fetch threads, not yet installed
    prefetch_usefulness                       useful / (useful + wasted)

:class:`StatsCollector` takes any function returning ``{source: stats_dict}``, so one exporter can
also serve the stats many Spark workers published (``source`` becomes a ``worker`` label).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

__all__ = ["StatsCollector", "ManagerCollector", "MetricsServer", "serve", "serve_stats"]

_PREFIX = "mlcache"
# Bucket i of mlcache.stats.LatencyHistogram counts loads under 2**i µs; Prometheus wants
# cumulative counts at upper bounds in seconds. 2**26 µs is about 67 s: beyond is +Inf.
_MAX_BUCKET = 26

# Prefetch figures that only ever grow (counters); other numeric ones are gauges.
_PREFETCH_COUNTERS = ("hints", "sent", "resident", "dropped_hot", "dropped_late", "prefetched",
                      "useful", "wasted", "late", "failures", "batches", "keys_loaded",
                      "inline_batches", "staged", "staged_dropped", "split_reads")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


class StatsCollector:
    """A Prometheus collector over ``source() -> {name: manager.stats()}``.

    With one source named ``""`` no ``worker`` label is added (the single-manager case).
    """

    def __init__(self, source: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._source = source

    def describe(self) -> list[Any]:
        # Families vary with the levels configured; nothing to pre-register.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        snaps = dict(self._source())
        extra = ["worker"] if any(snaps) else []

        def fam(cls: Any, name: str, doc: str, labels: list[str]) -> Any:
            return cls(f"{_PREFIX}_{name}", doc, labels=[*extra, *labels])

        hits = fam(CounterMetricFamily, "hits", "keys found at this level", ["level"])
        misses = fam(CounterMetricFamily, "misses", "keys not found at this level", ["level"])
        loads = fam(CounterMetricFamily, "loads", "batched reads of this level", ["level"])
        loaded = fam(CounterMetricFamily, "keys_loaded", "keys returned by batched reads",
                     ["level"])
        written = fam(CounterMetricFamily, "keys_written", "keys written to this level",
                      ["level"])
        wbytes = fam(CounterMetricFamily, "written_bytes", "encoded bytes written to this level",
                     ["level"])
        evictions = fam(CounterMetricFamily, "evictions", "entries leaving a level, by cause",
                        ["level", "cause"])
        latency = fam(HistogramMetricFamily, "load_seconds",
                      "time of one batched read from this level", ["level"])
        entries = fam(GaugeMetricFamily, "entries", "entries held by the level", ["level"])
        used = fam(GaugeMetricFamily, "used_bytes", "bytes held by the level", ["level"])
        ratio = fam(GaugeMetricFamily, "hit_ratio", "hits / (hits + misses) so far", ["level"])
        dirty_n = fam(GaugeMetricFamily, "dirty_entries",
                      "entries written but not yet on the level below the heap "
                      "(dirty heap entries + eviction buffer)", [])
        dirty_b = fam(GaugeMetricFamily, "dirty_bytes",
                      "bytes not yet on the level below the heap: dirty heap entries (when the "
                      "heap is bounded in bytes) + encoded entries in the eviction buffer", [])
        wb = fam(CounterMetricFamily, "writeback_events", "write-back counters", ["event"])
        pf = fam(CounterMetricFamily, "prefetch_events", "keyed prefetching counters", ["event"])
        pf_pending = fam(GaugeMetricFamily, "prefetch_pending", "hinted keys waiting", [])
        pf_inflight = fam(GaugeMetricFamily, "prefetch_inflight", "keys being fetched", [])
        pf_staged = fam(GaugeMetricFamily, "prefetch_staged",
                        "reads staged by fetch threads, not yet installed", [])
        pf_staged_b = fam(GaugeMetricFamily, "prefetch_staged_bytes",
                          "bytes of reads staged by fetch threads", [])
        pf_useful = fam(GaugeMetricFamily, "prefetch_usefulness", "useful / (useful + wasted)",
                        [])
        pf_latency = fam(GaugeMetricFamily, "prefetch_fetch_latency_seconds",
                         "hint-to-resident time of prefetched keys", ["quantile"])

        for source, snap in snaps.items():
            w = [source] if extra else []
            for level, st in (snap.get("levels") or {}).items():
                lv = [*w, level]
                for family, key in ((hits, "hits"), (misses, "misses"), (loads, "loads"),
                                    (loaded, "keys_loaded"), (written, "keys_written"),
                                    (wbytes, "bytes_written")):
                    v = _num(st.get(key))
                    if v is not None:
                        family.add_metric(lv, v)
                for cause, n in (st.get("evictions") or {}).items():
                    if _num(n) is not None:
                        evictions.add_metric([*lv, str(cause)], float(n))
                buckets = _buckets(st.get("load_us_log2"))
                if buckets is not None and level != "heap":  # the heap never loads
                    total_s = (_num(st.get("load_ms_sum")) or 0.0) / 1000.0
                    latency.add_metric(lv, buckets, total_s)
                v = _num(st.get("entries"))
                if v is not None:
                    entries.add_metric(lv, v)
                v = _num(st.get("used_bytes"))
                if v is None:
                    v = _num(st.get("bytes"))
                if v is not None:
                    used.add_metric(lv, v)
                v = _num(st.get("hit_ratio"))
                if v is not None:
                    ratio.add_metric(lv, v)
            heap = (snap.get("levels") or {}).get("heap") or {}
            wbs = snap.get("writeback") or {}
            dirty_n.add_metric(w, float((_num(heap.get("dirty")) or 0)
                                        + (_num(wbs.get("pending")) or 0)))
            dirty_b.add_metric(w, float((_num(heap.get("dirty_bytes")) or 0)
                                        + (_num(wbs.get("pending_bytes")) or 0)))
            for event, n in wbs.items():
                if event not in ("pending", "pending_bytes", "tombstones") \
                        and _num(n) is not None:
                    wb.add_metric([*w, event], float(n))
            pfs = snap.get("prefetch") or {}
            for event in _PREFETCH_COUNTERS:
                v = _num(pfs.get(event))
                if v is not None:
                    pf.add_metric([*w, event], v)
            for family, key in ((pf_pending, "pending"), (pf_inflight, "inflight"),
                                (pf_staged, "staged_now"), (pf_staged_b, "staged_bytes")):
                v = _num(pfs.get(key))
                if v is not None:
                    family.add_metric(w, v)
            useful, wasted = _num(pfs.get("useful")), _num(pfs.get("wasted"))
            if useful is not None and wasted is not None and useful + wasted:
                pf_useful.add_metric(w, useful / (useful + wasted))
            for q, v in ((pfs.get("fetch_latency_ms") or {}).items()):
                if _num(v) is not None:
                    pf_latency.add_metric([*w, {"p50": "0.5", "p99": "0.99"}.get(q, q)],
                                          float(v) / 1000.0)
        yield from (hits, misses, loads, loaded, written, wbytes, evictions, latency, entries,
                    used, ratio, dirty_n, dirty_b, wb, pf, pf_pending, pf_inflight, pf_staged,
                    pf_staged_b, pf_useful, pf_latency)


def _buckets(counts: Any) -> list[tuple[str, float]] | None:
    if not isinstance(counts, list):
        return None
    out: list[tuple[str, float]] = []
    seen = 0.0
    for i in range(_MAX_BUCKET + 1):
        seen += float(counts[i]) if i < len(counts) else 0.0
        out.append((repr((1 << i) / 1e6), seen))
    out.append(("+Inf", float(sum(counts))))
    return out


class ManagerCollector(StatsCollector):
    """The collector of one :class:`~mlcache.CacheManager` (reads ``manager.stats()``)."""

    def __init__(self, manager: Any) -> None:
        super().__init__(lambda: {"": manager.stats()})


@dataclass
class MetricsServer:
    """A running exporter: ``url`` to scrape, ``close()`` to stop it."""

    host: str
    port: int
    _server: Any
    _thread: Any

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_stats(source: Callable[[], Mapping[str, Mapping[str, Any]]], port: int = 0,
                host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``/metrics`` for ``source`` on ``host:port`` (0: a free port) in a daemon thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(source))  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(host=host, port=server.server_port, _server=server, _thread=thread)


def serve(manager: Any, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Serve the metrics of ``manager`` on ``host:port`` (0: a free port); see the module doc."""
    return serve_stats(lambda: {"": manager.stats()}, port, host)
