"""Online spatio-temporal event detection on geotagged posts (the DEBS 2022 application).

Posts arrive interval by interval. Each interval's posts go into a quadtree of their own, held
in mlcache (`manager.quadtree(...)`); trees older than the window are dropped as it rolls. A
grid cell whose post count (from the tree's per-node counts) is far above its recent history
is a candidate; touching candidates form a region; regions in consecutive intervals merge into
an event with a duration; short or small events are filtered out.

The posts are synthetic: a static background (cities plus uniform noise), planted bursts at
known places and times, and one-interval decoys. The script prints the events it detected
next to the planted bursts.

    python examples/event_detection.py                 # heap -> disk, heap at 20 % of the state
    python examples/event_detection.py --redis embedded
    python examples/event_detection.py --intervals 30 --posts 5000 --heap-mib 2

The application itself (`EventDetector`) is the one `mlcache bench events` times.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.bench.events import BOUNDS, EventDetector, match_planted, synthetic_stream
from mlcache.errors import ConfigError, LevelUnavailableError

HISTORY = 6   # intervals of history a cell's count is compared with


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _mib(text: str) -> float:
    try:
        mib = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(mib) and mib * 2**20 >= 1):
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB, got {text}")
    return mib


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", type=_count, default=24,
                   help=f"at least {HISTORY + 7} ({HISTORY + 3} with --bursts 0)")
    p.add_argument("--posts", type=_count, default=4000, help="background posts per interval")
    p.add_argument("--bursts", type=_count, default=4)
    p.add_argument("--heap-mib", type=_mib, default=1.5, help="heap budget in MiB")
    p.add_argument("--redis", metavar="URL", help="a Redis level between heap and disk "
                                                  "(a URL or 'embedded')")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    # bursts start after the history and last up to 5 intervals; decoys need 2 intervals
    # after the history (a randrange traceback before)
    least = HISTORY + (7 if args.bursts else 3)
    if args.intervals < least:
        p.error(f"argument --intervals: at least {least} with --bursts {args.bursts}, "
                f"got {args.intervals}")

    stream, planted, decoys = synthetic_stream(args.intervals, args.posts, args.bursts, 2,
                                               history=HISTORY, seed=args.seed)
    # (the disk level's directory was left in the temporary directory by every run)
    with tempfile.TemporaryDirectory(prefix="events-") as path:
        try:
            events, seconds, heap = _detect(args, stream, path)
        except (ConfigError, LevelUnavailableError) as exc:   # --redis (a traceback before)
            print(f"{p.prog}: --redis {args.redis}: {exc}", file=sys.stderr)
            sys.exit(2)

    n = sum(len(p) for p in stream)
    print(f"{n} posts in {args.intervals} intervals, {seconds:.2f} s "
          f"({n / seconds:,.0f} posts/s), heap hit ratio {heap.get('hit_ratio') or 0:.3f}")
    print(f"\n{len(events)} events detected:")
    for start_t, end_t, cells, count, tag, x, y, profile in events:
        print(f"  intervals {start_t:>2}-{end_t:<2}  at ({x:6.1f}, {y:6.1f})  {count:4d} posts "
              f"in {len(cells)} cells  #{tag}  posts in its area per interval: {list(profile)}")
    found = match_planted(events, planted)
    print(f"\nplanted bursts found: {len(found)}/{len(planted)}")
    for b in planted:
        mark = "found " if b in found else "MISSED"
        print(f"  [{mark}] intervals {b.start:>2}-{b.end:<2} at ({b.x:6.1f}, {b.y:6.1f})  "
              f"#{b.keyword}")
    print(f"decoys (one interval) reported as events: {len(match_planted(events, decoys))}")


def _detect(args: argparse.Namespace, stream: list, path: str) -> tuple:
    levels: tuple = (DiskConfig(path=path),)
    if args.redis:
        levels = (RedisConfig(url=args.redis),) + levels
    config = CacheConfig(heap=HeapConfig(max_bytes=int(args.heap_mib * 2**20), policy="lru"),
                         levels=levels, namespace="events")

    with CacheManager(config) as m:
        detector = EventDetector(
            lambda t: m.quadtree(f"interval-{t}", BOUNDS, capacity=64, max_depth=14),
            history=HISTORY)
        start = time.perf_counter()
        for t, posts in enumerate(stream):
            detector.process(t, posts)
        events = detector.finish()
        seconds = time.perf_counter() - start
        heap = m.stats()["levels"]["heap"]
    return events, seconds, heap


if __name__ == "__main__":
    main()
