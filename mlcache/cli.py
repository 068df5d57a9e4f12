"""The ``mlcache`` command: ``demo``, ``bench``, ``simulate``, ``inspect``, ``stats``.

Each benchmark lives in ``mlcache/bench/<name>.py`` and exposes ``add_arguments(parser)``
(optional) and ``run(args) -> BenchReport``; this module only dispatches, so adding a benchmark
never touches the CLI.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

__all__ = ["main"]

BENCHMARKS = ("levels", "policies", "prefetch", "events", "windows", "dedup", "arena", "spark")


def _bench_module(name: str):
    return importlib.import_module(f"mlcache.bench.{name}")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark against its baselines in one process")
    names = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name in (*BENCHMARKS, "all"):
        p = names.add_parser(name, help=f"the {name} benchmark" if name != "all" else "every benchmark")
        p.add_argument("--quick", action="store_true",
                       help="same shape, smaller scale (< 2 min)" if name != "all" else
                       "every benchmark at its --quick scale (< 2 min each)")
        p.add_argument("--json", metavar="PATH", help="write results and goals as JSON")
        if name == "all":
            p.add_argument("--report", metavar="DIR", help="write a Markdown report with plots")
            continue
        try:
            mod = _bench_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != f"mlcache.bench.{name}":
                raise
            p.set_defaults(missing=True)
            continue
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(p)


def _port(text: str) -> int:
    """``--metrics-port``: 0 (a free port) to 65535 (a larger number failed with socket's
    OverflowError traceback once the job had started)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {port}")
    return port


def _output_problem(path: str, directory: bool) -> str | None:
    """Why the output ``path`` (a file, or a ``directory`` made if need be) cannot be
    written, or None: checked before a benchmark runs (a bad --json was a traceback after
    the whole run)."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"no directory {parent}"
    if directory and os.path.exists(path) and not os.path.isdir(path):
        return "exists and is not a directory"
    if not directory and os.path.isdir(path):
        return "is a directory, not a file name"
    return None


def _run_bench(args: argparse.Namespace) -> int:
    for flag, path, directory in (("--json", args.json, False),
                                  ("--report", getattr(args, "report", None), True)):
        problem = path and _output_problem(path, directory)
        if problem:
            print(f"mlcache bench: {flag} {path}: {problem}", file=sys.stderr)
            return 2
    if args.bench == "all":
        from .bench import all as bench_all

        return bench_all.run(args)
    if getattr(args, "missing", False):
        print(f"mlcache bench {args.bench}: this benchmark is not available in this build",
              file=sys.stderr)
        return 2
    from .bench._report import write_json_atomic

    report = _bench_module(args.bench).run(args)
    report.emit(None)
    if args.json:
        try:
            write_json_atomic(args.json, report.to_dict())
        except OSError as exc:
            print(f"mlcache bench: --json {args.json}: cannot write: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # Whoever read the output stopped (`mlcache inspect cfg.json --json | head`): end
        # quietly as cat or grep do, not with a traceback. Python's own flush of stdout at
        # exit would fail the same way, so stdout goes to /dev/null first.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + 13   # what a shell reports for a process ended by SIGPIPE
    except KeyboardInterrupt:
        # Ctrl-C: the demo and the benchmarks clean up on the way out (their finally blocks);
        # the user asked for it, so one line, not the traceback of wherever the job was
        print("mlcache: interrupted", file=sys.stderr)
        return 128 + 2


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["simulate"]:
        # argparse's REMAINDER drops a leading "--option"; hand the rest over untouched.
        from .sim.cli import main as sim_main

        return sim_main(args_list[1:])
    if args_list[:1] == ["stats"]:
        from .stats_cli import main as stats_main

        return stats_main(args_list[1:])
    parser = argparse.ArgumentParser(
        prog="mlcache", description="A multi-level cache for stateful Python and PySpark jobs: "
        "run the demo, the benchmarks or the policy simulator, look at what a configuration's "
        "levels hold, or read a running exporter's figures. `mlcache COMMAND --help` for each.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run the main demo job on the embedded default",
        description="Synthetic card transactions through a per-card risk state ten times the "
        "heap budget, heap -> disk (or heap -> Redis -> disk with --redis): a Structured "
        "Streaming job on Spark local[2] when PySpark is installed, else (or with --local) one "
        "process. Prints what each level did and checks the state against an independent "
        "tally.")
    demo.add_argument("--quick", action="store_true", help="a smaller run")
    demo.add_argument("--redis", metavar="URL", help="add a Redis level: a URL or 'embedded'")
    demo.add_argument("--local", action="store_true", help="single process, no Spark")
    demo.add_argument("--metrics-port", type=_port, metavar="PORT",
                      help="serve Prometheus metrics on 127.0.0.1:PORT while the job runs "
                           "(read them with `mlcache stats --port PORT`)")
    _add_bench(sub)
    sim = sub.add_parser("simulate", help="replay a trace through policies", add_help=False)
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    insp = sub.add_parser("inspect", help="entries and bytes per level of a config")
    insp.add_argument("config", help="a JSON file with a CacheConfig (see CacheConfig.from_dict)")
    insp.add_argument("--json", action="store_true", help="print the figures as JSON")
    insp.add_argument("--keys-only", action="store_true", help="count keys, do not read values")
    stats = sub.add_parser("stats", help="read a running exporter's Prometheus metrics",
                           add_help=False)
    stats.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "bench":
        return _run_bench(args)
    if args.command == "demo":
        from .demo import main as demo_main
        from .errors import ConfigError, LevelUnavailableError

        try:
            return demo_main(args)
        except ConfigError as exc:    # e.g. --redis with a URL that is not redis://...
            print(f"mlcache demo: {exc}", file=sys.stderr)
            return 2
        except LevelUnavailableError as exc:    # --redis with no server there (a traceback)
            print(f"mlcache demo: {exc}", file=sys.stderr)
            return 2
    if args.command == "simulate":
        from .sim.cli import main as sim_main

        return sim_main(args.rest)
    if args.command == "inspect":
        from .inspect import main as inspect_main

        return inspect_main(args)
    if args.command == "stats":
        from .stats_cli import main as stats_main

        return stats_main(args.rest)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
