"""``mlcache simulate``: replay a trace through policies at several sizes.

    mlcache simulate --trace arc:oltp.arc.gz --policies lru,clock,wtinylfu,tac,belady \\
        --sizes 250,500,1000 [--csv out.csv] [--plot out.png] [--skip-bad-lines]

``--trace`` is ``FORMAT:PATH`` (``arc``, ``lirs``, ``keys``, ``csv``; gzip is detected) or
``gen:NAME`` for a synthetic trace (``zipf``, ``scrambled-zipf``, ``hotspot``, ``loop``,
``scan``, ``shifting``; ``--requests`` sets the length), or ``phase:SPEC_A,SPEC_B`` for Caffeine's
corda -> loop -> corda style phase change built from any two of those (``A, B, A``; each part is
its first ``--requests`` requests). Prints a table of hit %, evictions and
time per (policy, size), writes the rows as CSV and a PNG plot of hit ratio against size
(matplotlib, headless), and shows a progress bar (tqdm) over all the requests to replay.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Sequence

from mlcache._files import replace_atomically
from mlcache.errors import ConfigError

from . import generators
from .player import SimResult, make_policy, play
from .readers import FORMATS, Trace, TraceFormatError, read_trace

__all__ = ["main", "load_trace", "simulate"]

_GENERATORS = {
    "zipf": lambda n: generators.zipf(n),
    "scrambled-zipf": lambda n: generators.scrambled_zipf(n),
    "hotspot": lambda n: generators.hotspot(n),
    "loop": lambda n: generators.loop(1000, n),
    "scan": lambda n: generators.scan(n),
    "shifting": lambda n: generators.shifting_hot_set(n),
}


def load_trace(spec: str, *, skip_bad_lines: bool = False, requests: int = 1_000_000) -> Trace:
    fmt, sep, rest = spec.partition(":")
    if sep and fmt == "phase":
        parts = rest.split(",")
        if len(parts) != 2 or not all(parts):
            raise ConfigError("trace", f"expected phase:SPEC_A,SPEC_B, got {spec!r}")
        a, b = (load_trace(part, skip_bad_lines=skip_bad_lines, requests=requests)
                for part in parts)
        for part in (a, b):  # each phase is at most `requests` long, like a generated trace
            part.keys = part.keys[:requests]  # (phase_change keeps keys only)
        trace = generators.phase_change(a, b)
        trace.skipped = a.skipped + b.skipped    # (the count of --skip-bad-lines was lost)
        return trace
    if sep and fmt == "gen":
        if rest not in _GENERATORS:
            raise ConfigError("trace", f"unknown generator {rest!r}; known: {sorted(_GENERATORS)}")
        return _GENERATORS[rest](requests)
    if sep and fmt.lower() not in FORMATS:
        # (read_trace names only the file formats: this command also takes gen: and phase:)
        raise ConfigError("trace", f"unknown trace format {fmt!r}; known: FORMAT:PATH with "
                          f"FORMAT in {sorted(FORMATS)}, gen:NAME (NAME in "
                          f"{sorted(_GENERATORS)}) or phase:SPEC_A,SPEC_B")
    return read_trace(spec, skip_bad_lines=skip_bad_lines)


def _positive_ints(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError("sizes", f"expected comma-separated integers, got {text!r}") from None
    if not sizes or any(s <= 0 for s in sizes):
        raise ConfigError("capacity", f"sizes must be positive integers, got {text!r}")
    return sizes


def simulate(trace: Trace, policies: Sequence[str], sizes: Sequence[int], *,
             progress: bool = True) -> list[SimResult]:
    """Every policy at every size over ``trace``; policies are validated before any run."""
    for name in policies:
        make_policy(name, 1, trace)  # unknown names -> ConfigError listing the registered ones
    total = len(trace) * len(policies) * len(sizes)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", unit_scale=True, desc=trace.name, file=sys.stderr,
                   leave=False)
    results = []
    try:
        for size in sizes:
            for name in policies:
                if bar is not None:
                    bar.set_postfix_str(f"{name}@{size}")
                results.append(play(name, trace, size,
                                    progress=bar.update if bar is not None else None))
    finally:
        if bar is not None:
            bar.close()
    return results


def _table(results: list[SimResult]) -> str:
    head = ("policy", "size", "hit %", "evictions", "seconds")
    rows = [(r.policy, str(r.capacity), f"{r.hit_ratio:.2f}", str(r.evictions),
             f"{r.seconds:.2f}") for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _write_csv(path: str, trace: Trace, results: list[SimResult]) -> None:
    replace_atomically(path, lambda tmp: _csv_rows(tmp, trace, results))


def _csv_rows(path: str, trace: Trace, results: list[SimResult]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trace", "policy", "size", "requests", "hits", "hit_ratio",
                         "evictions", "rejections", "seconds"])
        for r in results:
            writer.writerow([trace.name, r.policy, r.capacity, r.requests, r.hits,
                             f"{r.hit_ratio:.4f}", r.evictions, r.rejections, f"{r.seconds:.4f}"])


def _plot(path: str, trace: Trace, results: list[SimResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        pts = sorted((r.capacity, r.hit_ratio) for r in results if r.policy == name)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("cache size (entries)")
    ax.set_ylabel("hit ratio (%)")
    ax.set_title(f"{trace.name}: {len(trace):,} requests")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        # a PNG at exactly ``path``: matplotlib would take the format from the extension
        # (a traceback for --plot out.txt) or add ".png" to a name without one
        replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    # (the help text was the module docstring's first line, reST backquotes and all)
    parser = argparse.ArgumentParser(
        prog="mlcache simulate",
        description="Replay a trace through cache policies at several sizes: a table of hit %, "
                    "evictions and time per (policy, size), the rows as CSV and a PNG plot of "
                    "hit ratio against size.",
        epilog=f"Traces: FORMAT:PATH with FORMAT one of {', '.join(sorted(FORMATS))} (gzip is "
               f"detected); gen:NAME, a synthetic trace of --requests requests, NAME one of "
               f"{', '.join(sorted(_GENERATORS))}; phase:SPEC_A,SPEC_B, A then B then A again "
               f"(each its first --requests requests). Example: mlcache simulate --trace "
               f"arc:oltp.arc.gz --policies lru,wtinylfu,belady --sizes 250,500,1000")
    parser.add_argument("--trace", required=True,
                        help="FORMAT:PATH, gen:NAME or phase:SPEC_A,SPEC_B")
    parser.add_argument("--policies", default="lru,clock,wtinylfu,tac,belady",
                        help="comma-separated registered policy names (default: %(default)s)")
    parser.add_argument("--sizes", default="250,500,1000", help="comma-separated cache sizes (default: %(default)s)")
    parser.add_argument("--csv", metavar="PATH", help="CSV output (default: <trace>-sim.csv)")
    parser.add_argument("--plot", metavar="PATH", help="PNG output (default: <trace>-sim.png)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--skip-bad-lines", action="store_true",
                        help="skip malformed trace lines (counted) instead of failing")
    parser.add_argument("--requests", type=int, default=1_000_000,
                        help="length of a generated trace, or of each part of a phase trace "
                             "(default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        sizes = _positive_ints(args.sizes)
        if args.requests <= 0:
            # (a generator failed with numpy's "negative dimensions" traceback; a phase trace
            # was cut from its end instead, keys[:-n])
            raise ConfigError("requests", f"must be a positive integer, got {args.requests}")
        for name, path in (("csv", args.csv), ("plot", None if args.no_plot else args.plot)):
            # (a missing directory failed with a traceback after the whole run)
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise ConfigError(name, f"no directory for {path}")
            if path and os.path.isdir(path):
                raise ConfigError(name, f"{path} is a directory, not a file name")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ConfigError("policies", "give at least one policy name")
        trace = load_trace(args.trace, skip_bad_lines=args.skip_bad_lines,
                           requests=args.requests)
        if not len(trace):
            raise ConfigError("trace", f"{args.trace} holds no requests")
        results = simulate(trace, policies, sizes, progress=not args.no_progress)
    except (ConfigError, TraceFormatError) as exc:
        print(f"mlcache simulate: {exc}", file=sys.stderr)
        return 2
    print(f"trace {trace.name}: {len(trace):,} requests, {trace.unique_keys():,} keys"
          + (f", {trace.skipped} bad lines skipped" if trace.skipped else ""))
    print(_table(results))
    outputs = [("csv", args.csv or f"{trace.name}-sim.csv", _write_csv)]
    if not args.no_plot:
        outputs.append(("plot", args.plot or f"{trace.name}-sim.png", _plot))
    for name, path, write in outputs:
        try:
            write(path, trace, results)
        except OSError as exc:   # (a traceback after the whole run; a default name too)
            print(f"mlcache simulate: {name}: cannot write {path}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        print(f"wrote {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
