"""``mlcache demo``: a stateful streaming job whose state is ten times the memory it may use.

Synthetic card transactions (card ids drawn from a Zipf law, so a few cards are hot and most are
cold) stream through a per-card running risk state — count, running mean and variance of the
amount (Welford), an exponentially decaying velocity, the last few amounts, a home country — and
every transaction is scored against its card's state. The state lives in a
:class:`~mlcache.CacheManager`: a heap sized to a tenth of the state over local disk by default,
``--redis URL`` (or ``embedded``) puts Redis in between. The job code is plain ``get``/``put``.

At the end the job checks every card's transaction count against an independent tally, so the
demo also shows that nothing was lost on the way through the levels, and prints per-level
figures and throughput. :func:`run_local` is the single-process job; the CLI calls it for
``--local`` and whenever no Spark version of the demo is installed.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from .config import CacheConfig, DiskConfig, HeapConfig, LevelConfig, RedisConfig
from .errors import ConfigError

__all__ = ["main", "run_local", "DemoResult", "transactions"]

HOME_COUNTRIES = 30
CHUNK = 2_000
ALERT = 4.0


@dataclass
class DemoResult:
    events: int
    cards: int
    alerts: int
    seconds: float
    heap_budget: int
    state_bytes: int
    mismatches: int
    stats: dict[str, Any]

    @property
    def throughput(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def transactions(n_events: int, n_cards: int, *, zipf_s: float = 1.0,
                 seed: int = 7) -> dict[str, np.ndarray]:
    """The synthetic stream as columns: card, ts, amount, country (vectorised, reproducible)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_cards + 1) ** zipf_s
    ranks = rng.choice(n_cards, size=n_events, p=weights / weights.sum())
    card = rng.permutation(n_cards)[ranks]          # hot cards are not the small ids
    ts = np.cumsum(rng.exponential(1.0, size=n_events))      # seconds
    amount = np.round(rng.lognormal(3.0, 1.0, size=n_events), 2)
    home = card % HOME_COUNTRIES
    abroad = rng.random(n_events) < 0.03
    country = np.where(abroad, rng.integers(0, HOME_COUNTRIES, size=n_events), home)
    return {"card": card, "ts": ts, "amount": amount, "country": country}


def new_state(country: int) -> dict[str, Any]:
    return {"n": 0, "mean": 0.0, "m2": 0.0, "velocity": 0.0, "last_ts": 0.0,
            "home": country, "recent": []}


def score(state: dict[str, Any], ts: float, amount: float, country: int) -> float:
    """Update the card's running state in place with one transaction; return its risk score."""
    n = state["n"] + 1
    delta = amount - state["mean"]
    mean = state["mean"] + delta / n
    state["m2"] += delta * (amount - mean)
    state["n"], state["mean"] = n, mean
    gap = ts - state["last_ts"] if n > 1 else 3600.0
    state["velocity"] = state["velocity"] * math.exp(-gap / 60.0) + 1.0
    state["last_ts"] = ts
    recent = state["recent"]
    recent.append(amount)
    if len(recent) > 5:
        del recent[0]
    std = math.sqrt(state["m2"] / (n - 1)) if n >= 10 else 0.0
    z = (amount - mean) / std if std > 0 else 0.0
    burst = max(0.0, state["velocity"] - 8.0)
    return max(0.0, z) + burst + (2.0 if country != state["home"] else 0.0)


def _state_size() -> int:
    sample = new_state(3)
    for i in range(5):
        score(sample, 1000.0 + i, 42.5 + i, 3)
    return len(msgpack.packb(sample))


def run_local(*, events: int = 300_000, cards: int = 75_000, redis: str | None = None,
              disk_path: str | None = None, heap_fraction: float = 0.1, zipf_s: float = 1.0,
              progress: bool = True, seed: int = 7,
              metrics_port: int | None = None) -> DemoResult:
    """Run the job in this process and return its figures (``main`` prints them)."""
    from tqdm import tqdm

    from .manager import CacheManager

    stream = transactions(events, cards, zipf_s=zipf_s, seed=seed)
    distinct = int(np.unique(stream["card"]).size)
    state_bytes = distinct * _state_size()
    heap_budget = max(16_384, int(state_bytes * heap_fraction))
    levels: list[LevelConfig] = []
    redis_level = None
    if redis:
        # (before the directory is made: a URL refused here left an empty one behind)
        levels.append(RedisConfig(url=redis, prefix=f"mlcache-demo-{uuid.uuid4().hex[:8]}"))
    own_dir = disk_path is None
    path = disk_path or tempfile.mkdtemp(prefix="mlcache-demo-")
    try:
        levels.append(DiskConfig(path=path))
        config = CacheConfig(heap=HeapConfig(max_bytes=heap_budget), levels=tuple(levels),
                             namespace="demo")
        cache = CacheManager(config)
    except BaseException:
        if own_dir:
            shutil.rmtree(path, ignore_errors=True)
        raise
    tally = np.bincount(stream["card"], minlength=cards)
    alerts = 0
    metrics = bar = None
    failed = True
    try:
        # (inside the try: a port in use left the manager open and the directory behind)
        if metrics_port is not None:
            from .metrics import serve

            try:
                metrics = serve(cache, metrics_port)
            except OSError as exc:
                raise ConfigError("metrics_port", f"cannot serve on port {metrics_port}: "
                                                  f"{exc.strerror or exc}") from exc
            print(f"metrics: {metrics.url} (mlcache stats --port {metrics.port})", flush=True)
        cols = [stream[c].tolist() for c in ("card", "ts", "amount", "country")]
        bar = tqdm(total=events, unit="tx", disable=not progress, mininterval=0.5,
                   desc="card risk state")
        start = time.perf_counter()
        get, put = cache.get, cache.put
        for lo in range(0, events, CHUNK):
            for card, ts, amount, country in zip(*(c[lo:lo + CHUNK] for c in cols)):
                key = ("card", card)
                state = get(key)
                if state is None:
                    state = new_state(card % HOME_COUNTRIES)
                if score(state, ts, amount, country) > ALERT:
                    alerts += 1
                put(key, state)
            bar.update(min(CHUNK, events - lo))
        cache.checkpoint()
        seconds = time.perf_counter() - start
        bar.close()
        seen = np.nonzero(tally)[0].tolist()
        got = cache.get_many([("card", c) for c in seen])
        mismatches = sum(1 for c in seen if got.get(("card", c), {}).get("n") != int(tally[c]))
        stats = cache.stats()
        failed = False
    finally:
        # Each step runs whatever the one before did, and when the job itself failed (Redis
        # unreachable, say) a cleanup failing the same way does not hide why: the cleanup's
        # error replaced the job's, and the temporary directory was left behind.
        try:
            if bar is not None:
                bar.close()    # (twice is harmless) before any error is printed
            if metrics is not None:
                metrics.close()
            try:
                cache.close()
            except Exception:
                if not failed:
                    raise
            if redis:
                from .levels.redis import RedisLevel

                redis_level = RedisLevel(levels[0])  # type: ignore[arg-type]
                try:
                    if redis != "embedded":    # leave a shared server as we found it
                        redis_level.delete_many(list(redis_level.scan(b"")))
                except Exception:
                    if not failed:
                        raise
                finally:
                    redis_level.close()
        finally:
            if own_dir:
                shutil.rmtree(path, ignore_errors=True)
    return DemoResult(events=events, cards=distinct, alerts=alerts, seconds=seconds,
                      heap_budget=heap_budget, state_bytes=state_bytes, mismatches=mismatches,
                      stats=stats)


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def report(result: DemoResult) -> str:
    lines = [
        f"processed {result.events:,} transactions of {result.cards:,} cards in "
        f"{result.seconds:.1f} s: {result.throughput:,.0f} tx/s, {result.alerts:,} alerts",
        f"state ~{_fmt_bytes(result.state_bytes)} encoded, heap budget "
        f"{_fmt_bytes(result.heap_budget)} "
        f"({result.state_bytes / result.heap_budget:.0f}x smaller)",
        f"check against an independent tally: {result.mismatches} cards differ",
        "",
        f"{'level':<8}{'hits':>10}{'misses':>10}{'hit ratio':>11}{'keys written':>14}"
        f"{'bytes written':>15}{'evictions':>11}{'load p50 ms':>13}{'used':>12}",
    ]
    for name, s in result.stats["levels"].items():
        ratio = s.get("hit_ratio")
        lines.append(
            f"{name:<8}{s.get('hits', 0):>10,}{s.get('misses', 0):>10,}"
            f"{(f'{ratio:.1%}' if ratio is not None else '-'):>11}"
            f"{s.get('keys_written', 0):>14,}{_fmt_bytes(s.get('bytes_written')):>15}"
            f"{sum((s.get('evictions') or {}).values()):>11,}"
            f"{(s.get('load_ms_p50') if s.get('load_ms_p50') is not None else '-')!s:>13}"
            f"{_fmt_bytes(s.get('used_bytes', s.get('bytes'))):>12}")
    wb = result.stats.get("writeback", {})
    if wb:
        lines.append("")
        lines.append("write-back: " + ", ".join(f"{k}={v}" for k, v in wb.items() if v is not None))
    return "\n".join(lines)


def _spark_demo() -> Any:
    """``mlcache.demo_spark.main(args)`` (the Spark job) when PySpark is installed, else ``None``."""
    try:
        import pyspark  # noqa: F401

        from . import demo_spark
    except ImportError:
        return None
    return getattr(demo_spark, "main", None)


def _check_redis(config: RedisConfig) -> None:
    """Raise :class:`LevelUnavailableError` if the server at ``config.url`` does not answer
    (one read of a key nobody has); an embedded server is started by the job itself."""
    if config.url == "embedded":
        return
    from .levels.redis import RedisLevel

    level = RedisLevel(config)
    try:
        level.get_many([b"reachable?"])
    finally:
        level.close()


def _check_port(port: int | None) -> None:
    """Raise :class:`ConfigError` if the exporter could not listen on ``127.0.0.1:port``
    (bound and released at once, with the reuse flag the exporter's server sets)."""
    if not port:
        return
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError("metrics_port", f"cannot serve on port {port}: "
                                              f"{exc.strerror or exc}") from None


def main(args: argparse.Namespace | None = None) -> int:
    """Entry point of ``mlcache demo [--quick] [--redis URL|embedded] [--local]
    [--metrics-port PORT]``."""
    quick = bool(getattr(args, "quick", False))
    redis = getattr(args, "redis", None) or os.environ.get("MLCACHE_DEMO_REDIS")
    if redis:
        # A URL the Redis level refuses, or a server not there, is reported now in one line,
        # before Spark starts: the Spark job found either out later (a server not there after
        # ~55 s, as 350 lines of Spark and Python tracebacks) and left its directory behind.
        _check_redis(RedisConfig(url=redis, prefix=f"mlcache-demo-{uuid.uuid4().hex[:8]}"))
    # (likewise a port in use: the Spark demo's exporter raised OSError with a traceback)
    _check_port(getattr(args, "metrics_port", None))
    if not getattr(args, "local", False):
        spark_main = _spark_demo()
        if spark_main is not None:
            return int(spark_main(args) or 0)
    size: dict[str, int] = (dict(events=60_000, cards=20_000) if quick
                            else dict(events=300_000, cards=75_000))
    where = "heap -> redis -> disk" if redis else "heap -> disk"
    print(f"mlcache demo: {size['events']:,} card transactions through {where}"
          f"{' (quick)' if quick else ''}", flush=True)
    result = run_local(redis=redis, metrics_port=getattr(args, "metrics_port", None),
                       events=size["events"], cards=size["cards"])
    print(report(result), flush=True)
    return 0 if result.mismatches == 0 else 1
