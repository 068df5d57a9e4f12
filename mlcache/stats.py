"""Counters and load-time histograms per level, write-back figures and a place for prefetching's.

Cheap on the hit path: a heap hit costs one integer increment (the manager keeps that counter
itself and copies it in when :meth:`Stats.snapshot` is called); only loads are timed. Load times go
into a fixed log2 histogram in microseconds (a bucket per power of two, so p50/p99 are accurate
to a factor of two at constant memory and O(1) per record), which is what a dashboard needs and
what a reservoir would cost more to give.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["LatencyHistogram", "LevelStats", "Stats"]

_BUCKETS = 40  # 2**39 µs ~ 6 days: enough for any load


class LatencyHistogram:
    """Log2 buckets of microseconds; percentiles answer the bucket's upper bound."""

    __slots__ = ("counts", "total", "sum_us")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0
        self.sum_us = 0.0

    def record(self, seconds: float) -> None:
        us = seconds * 1e6
        self.counts[min(int(us).bit_length(), _BUCKETS - 1)] += 1
        self.total += 1
        self.sum_us += us

    def percentile(self, q: float) -> float | None:
        """Upper bound in milliseconds of the bucket holding the ``q`` quantile (0 < q <= 1)."""
        if not self.total:
            return None
        rank = q * self.total
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return (1 << i) / 1000.0
        return (1 << (_BUCKETS - 1)) / 1000.0

    def snapshot(self) -> dict[str, Any]:
        last = max((i for i, n in enumerate(self.counts) if n), default=-1)
        return {
            "load_ms_p50": self.percentile(0.50),
            "load_ms_p99": self.percentile(0.99),
            "load_ms_mean": (self.sum_us / self.total / 1000.0) if self.total else None,
            # The buckets themselves (bucket i: loads under 2**i µs), trailing empties cut, and
            # the sum: what a Prometheus histogram needs (mlcache.metrics), even across processes.
            "load_us_log2": self.counts[:last + 1],
            "load_ms_sum": self.sum_us / 1000.0,
        }


class LevelStats:
    """What one level saw: key hits/misses, batched loads and their time, writes, evictions."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hits = 0
        self.misses = 0
        self.loads = 0           # batched reads (one get_many)
        self.keys_loaded = 0     # keys found and decoded
        self.load_time = LatencyHistogram()
        self.writes = 0          # batched writes (one put_many)
        self.keys_written = 0
        self.bytes_written = 0
        self.deletes = 0
        self.evictions: Counter[str] = Counter()

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hits": self.hits,
            "misses": self.misses,
            "hit_ratio": self.hits / (self.hits + self.misses) if self.hits + self.misses else None,
            "loads": self.loads,
            "keys_loaded": self.keys_loaded,
            "writes": self.writes,
            "keys_written": self.keys_written,
            "bytes_written": self.bytes_written,
            "deletes": self.deletes,
            "evictions": dict(self.evictions),
        }
        out.update(self.load_time.snapshot())
        return out


class Stats:
    """All of a manager's figures; ``snapshot()`` is what ``manager.stats()`` returns."""

    def __init__(self, level_names: list[str]) -> None:
        self.levels: dict[str, LevelStats] = {n: LevelStats(n) for n in level_names}
        self.writeback: Counter[str] = Counter()
        # Filled by mlcache.prefetch (hints sent, dropped as hot, useful, wasted, late, ...).
        self.prefetch: Counter[str] = Counter()

    def level(self, name: str) -> LevelStats:
        return self.levels[name]

    def snapshot(self, extra_levels: dict[str, dict[str, Any]] | None = None,
                 writeback: dict[str, Any] | None = None,
                 prefetch: dict[str, Any] | None = None) -> dict[str, Any]:
        levels = {name: st.snapshot() for name, st in self.levels.items()}
        for name, extra in (extra_levels or {}).items():
            levels.setdefault(name, {}).update(extra)
        wb: dict[str, Any] = dict(self.writeback)
        wb.update(writeback or {})
        pf: dict[str, Any] = dict(self.prefetch)
        pf.update(prefetch or {})
        return {"levels": levels, "writeback": wb, "prefetch": pf}
