"""``mlcache stats``: scrape a running exporter (``mlcache demo --metrics-port PORT``, or
:func:`mlcache.metrics.serve` in your job) and print its figures per level.

    mlcache stats --port 9464                 # http://127.0.0.1:9464/metrics
    mlcache stats --url http://host:9464/metrics --raw
    mlcache stats --port 9464 --watch 2       # again every 2 s until Ctrl-C
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any, Sequence

__all__ = ["main", "scrape", "summarize", "format_summary"]


def scrape(url: str, timeout: float = 5.0) -> str:
    """The exposition text served at ``url``."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8")


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding quantile ``q`` of a cumulative histogram."""
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return None
    for le, seen in buckets:
        if seen >= q * total:
            return le
    return None


def summarize(text: str) -> dict[str, Any]:
    """Parse an exposition into ``{"levels": {worker/level: {...}}, "global": {worker: {...}}}``."""
    from prometheus_client.parser import text_string_to_metric_families

    levels: dict[str, dict[str, Any]] = defaultdict(dict)
    glob: dict[str, dict[str, Any]] = defaultdict(dict)
    hist: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("mlcache_"):
            continue
        name = family.name[len("mlcache_"):]
        for s in family.samples:
            labels = dict(s.labels)
            worker = labels.pop("worker", "")
            level = labels.pop("level", None)
            if level is not None:
                where = f"{worker}/{level}" if worker else level
                if s.name.endswith("_bucket"):
                    le = float(labels["le"])
                    hist[where].append((le, s.value))
                elif name == "evictions":
                    levels[where]["evictions"] = levels[where].get("evictions", 0) + s.value
                elif name == "load_seconds":
                    continue
                else:
                    levels[where][name] = s.value
            else:
                key = name
                for k in ("event", "quantile"):
                    if k in labels:
                        key = f"{name}.{labels[k]}"
                glob[worker or "-"][key] = s.value
    for where, buckets in hist.items():
        buckets.sort()
        for q in (0.5, 0.99):
            v = _quantile(buckets, q)
            levels[where][f"load_ms_p{int(q * 100)}"] = None if v is None else v * 1000
    return {"levels": dict(levels), "global": dict(glob)}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v.is_integer():
            return f"{int(v):,}"
        return f"{v:.3g}"
    return str(v)


def _short(key: str, group: str) -> str:
    """``prefetch_events.hints`` -> ``hints``; ``prefetch_fetch_latency_seconds.0.5`` ->
    ``fetch_latency_seconds[0.5]``; ``prefetch_pending`` -> ``pending``."""
    base, _, label = key.partition(".")
    base = base[len(group) + 1:] if base.startswith(group + "_") else base
    if not label:
        return base
    return label if base == "events" else f"{base}[{label}]"


def format_summary(summary: dict[str, Any]) -> str:
    cols = ("hits", "misses", "hit_ratio", "loads", "load_ms_p50", "load_ms_p99", "evictions",
            "keys_written", "entries", "used_bytes")
    rows = [[where, *(_fmt(st.get(c)) for c in cols)] for where, st in summary["levels"].items()]
    header = ["level", *cols]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    for worker, figures in summary["global"].items():
        lines.append("")
        if worker != "-":
            lines.append(f"[{worker}]")
        for group in ("dirty", "writeback", "prefetch"):
            items = [f"{_short(k, group)}={_fmt(v)}"
                     for k, v in sorted(figures.items()) if k.startswith(group)]
            if items:
                lines.append(f"{group}: " + ", ".join(items))
    return "\n".join(lines)


# a day: time.sleep takes no more than the platform's time_t (inf was an OverflowError)
_MAX_WATCH = 86_400.0


def _port(text: str) -> int:
    from .cli import _port as port

    return port(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mlcache stats",
                                     description="Scrape a running exporter (mlcache demo "
                                     "--metrics-port PORT, or mlcache.metrics.serve in\nyour "
                                     "job) and print its figures per level.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--url", help="the /metrics URL of an exporter")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, default=9464, help="used when --url is not given")
    parser.add_argument("--raw", action="store_true", help="print the exposition as served")
    parser.add_argument("--json", action="store_true", help="print the parsed figures as JSON")
    parser.add_argument("--watch", type=float, metavar="SECONDS",
                        help="scrape again every SECONDS (up to a day) until interrupted")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.watch is not None and not 0 < args.watch <= _MAX_WATCH:
        # (time.sleep raised ValueError after the first scrape, OverflowError for inf)
        parser.error(f"--watch must be a positive number of seconds up to {_MAX_WATCH:g}, "
                     f"got {args.watch}")
    url = args.url or f"http://{args.host}:{args.port}/metrics"
    try:
        while True:
            try:
                text = scrape(url)
            # ValueError: not a URL; HTTPException: an invalid host, or a port that does not
            # speak HTTP (a BadStatusLine traceback before)
            except (urllib.error.URLError, OSError, ValueError,
                    http.client.HTTPException) as exc:
                # (a BadStatusLine holds the line it got, its CR LF included)
                why = (f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                       if isinstance(exc, http.client.HTTPException) else exc)
                print(f"mlcache stats: cannot scrape {url}: {why}", file=sys.stderr)
                return 1
            if args.raw:
                print(text, end="")
            else:
                try:
                    summary = summarize(text)
                except ValueError as exc:    # not an exposition (a traceback before)
                    print(f"mlcache stats: {url} did not serve Prometheus metrics: {exc}",
                          file=sys.stderr)
                    return 1
                if args.json:
                    print(json.dumps(summary, indent=2))
                else:
                    print(f"# {url} at {time.strftime('%H:%M:%S')}")
                    print(format_summary(summary), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
            print()
    except KeyboardInterrupt:
        return 0
