"""``mlcache bench all``: every benchmark in turn, one report with tables, goals and plots.

Each benchmark runs in its own child process (``mlcache bench NAME --json ...``): a benchmark
that crashes, leaks threads or leaves a Redis server behind cannot spoil the ones after it, and
each starts from a cold interpreter as it would on its own. The parent only shows progress,
collects the JSON reports and writes, under ``--report DIR``::

    DIR/report.md         date, machine, and per benchmark its table, goals met/not met, plot
    DIR/plots/NAME.png    goals (value / target) and the main figures per variant
    DIR/raw/NAME.json     the benchmark's own ``--json`` output, untouched
    DIR/logs/NAME.log     what the benchmark printed

``python -m mlcache.bench.all render SRC_DIR PAGE.md`` re-renders a page (with its plots and raw
JSON next to it) from ``SRC_DIR/raw``: that is how docs/benchmarks/results.md is produced from a
run, without running anything again.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from ._report import BenchReport, _fmt, goal_met, machine_description, write_json_atomic

__all__ = ["run", "available_benchmarks", "render_report", "plot_report", "main"]

# The order of DESIGN §9; Spark last since it is the slowest to start.
ORDER = ("levels", "policies", "prefetch", "events", "windows", "dedup", "arena", "spark")

# Result columns worth a plot, best first (a substring match ranks a column); workload sizes
# and other parameters are never plotted.
_PREFERRED = ("hit", "throughput", "ops_per_s", "slowdown", "p999", "p99", "p50", "per_key_us",
              "store_writes", "seconds")
_PARAMETERS = {"capacity", "requests", "keys", "ops", "accesses", "events", "cards", "batches",
               "intervals", "updates", "seed", "depth", "n", "size", "paper"}
_PANELS = 3
_MAX_ROWS = 24


def available_benchmarks() -> list[str]:
    """The benchmark modules present in this build, in report order."""
    import importlib.util

    return [n for n in ORDER if importlib.util.find_spec(f"mlcache.bench.{n}") is not None]


def _child_command(name: str, quick: bool, json_path: Path) -> list[str]:
    cmd = [sys.executable, "-c", "import sys; from mlcache.cli import main; sys.exit(main())",
           "bench", name, "--json", str(json_path)]
    if quick:
        cmd.append("--quick")
    return cmd


def _run_one(name: str, quick: bool, work: Path) -> tuple[dict[str, Any] | None, str, float]:
    json_path = work / f"{name}.json"
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    start = time.perf_counter()
    proc = subprocess.run(_child_command(name, quick, json_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    log = proc.stdout
    if proc.returncode != 0 or not json_path.exists():
        return None, log + f"\n[exit status {proc.returncode}]\n", seconds
    with open(json_path) as fh:
        data = json.load(fh)
    data["seconds"] = round(seconds, 1)
    return data, log, seconds


def run(args: argparse.Namespace) -> int:
    """Run every available benchmark; print each table; write ``--report``/``--json``."""
    from tqdm import tqdm

    quick = bool(getattr(args, "quick", False))
    names = list(getattr(args, "only", None) or available_benchmarks())
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    reports: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    logs: dict[str, str] = {}

    def meta() -> dict[str, Any]:
        return {"date": started, "machine": machine_description(), "quick": quick,
                "benchmarks": names, "failures": failures}

    with tempfile.TemporaryDirectory(prefix="mlcache-bench-") as tmp:
        bar = tqdm(names, desc="mlcache bench all", unit="bench", file=sys.stderr)
        for name in bar:
            bar.set_postfix_str(name)
            data, log, seconds = _run_one(name, quick, Path(tmp))
            logs[name] = log
            if data is None:
                failures[name] = log[-3000:]
                tqdm.write(f"mlcache bench {name}: FAILED after {seconds:.0f} s", file=sys.stderr)
            else:
                reports.append(data)
                tqdm.write(_as_report(data).format() + f"\n({seconds:.0f} s)\n")
                sys.stdout.flush()
            if getattr(args, "report", None):
                # Stored as each one finishes, so an interrupted run still leaves the finished ones.
                write_raw(Path(args.report), meta(), reports, logs)
        bar.close()
    if getattr(args, "report", None):
        out = Path(args.report)
        write_raw(out, meta(), reports, logs)
        page = render_report(out, out / "report.md")
        print(f"report: {page}")
    if getattr(args, "json", None):
        write_json_atomic(args.json, {**meta(), "reports": reports})
    return 1 if failures else 0


def _as_report(data: dict[str, Any]) -> BenchReport:
    return BenchReport(benchmark=data["benchmark"], quick=bool(data.get("quick")),
                       results=list(data.get("results", [])), goals=list(data.get("goals", [])),
                       notes=list(data.get("notes", [])))


def write_raw(out: Path, meta: dict[str, Any], reports: Iterable[dict[str, Any]],
              logs: dict[str, str] | None = None) -> None:
    """Store a run under ``out``: ``raw/_run.json``, ``raw/NAME.json`` and ``logs/NAME.log``."""
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    write_json_atomic(raw / "_run.json", meta)
    for data in reports:
        write_json_atomic(raw / f"{data['benchmark']}.json", data)
    if logs:
        (out / "logs").mkdir(exist_ok=True)
        for name, text in logs.items():
            (out / "logs" / f"{name}.log").write_text(text)


def _load_raw(src: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    raw = src / "raw"
    with open(raw / "_run.json") as fh:
        meta = json.load(fh)
    reports: list[dict[str, Any]] = []
    for name in [*ORDER, *sorted(p.stem for p in raw.glob("*.json"))]:
        path = raw / f"{name}.json"
        if path.exists() and not any(r["benchmark"] == name for r in reports) \
                and not name.startswith("_"):
            with open(path) as fh:
                reports.append(json.load(fh))
    return meta, reports


# -- the page -------------------------------------------------------------------------------------

def _met(goal: dict[str, Any]) -> bool:
    return goal_met(goal)


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        v = json.dumps(v, separators=(",", ":"))
    return _fmt(v).replace("|", "\\|").replace("\n", " ")


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols = _columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def render_report(src: Path, page: Path) -> Path:
    """Write ``page`` (Markdown) from the run stored in ``src``; plots and raw JSON go next to it.

    ``src`` and the page's folder may be the same (the ``--report`` case) or differ (the docs
    page rendered from a stored run).
    """
    src, page = Path(src), Path(page)
    meta, reports = _load_raw(src)
    dest = page.parent
    dest.mkdir(parents=True, exist_ok=True)
    if dest.resolve() != src.resolve():
        if (dest / "raw").exists():
            shutil.rmtree(dest / "raw")
        shutil.copytree(src / "raw", dest / "raw")
    (dest / "plots").mkdir(exist_ok=True)

    kind = "quick (`--quick`, smaller scale: smoke figures, not the ones to quote)" if \
        meta.get("quick") else "full"
    quick_ones = [r["benchmark"] for r in reports if r.get("quick")]
    if quick_ones and not meta.get("quick"):
        kind = (f"full, except {', '.join(quick_ones)} at quick scale (`--quick`: smaller, "
                f"smoke figures)")
    done = {r["benchmark"] for r in reports} | set(meta.get("failures", {}))
    pending = [n for n in meta.get("benchmarks", []) if n not in done]
    if pending:
        kind += (f" — **incomplete**: {len(done)} of {len(done) + len(pending)} benchmarks "
                 f"finished; not run yet: {', '.join(pending)}")
    lines = [
        "# Benchmark results",
        "",
        "<!-- generated by `python -m mlcache.bench.all render`; do not edit by hand -->",
        "",
        f"- **Run:** {kind}",
        f"- **Date:** {meta.get('date', '?')}",
        f"- **Machine:** {meta.get('machine', '?')}",
        f"- **Command:** `mlcache bench all{' --quick' if meta.get('quick') else ''} "
        f"--report DIR`",
        "",
        "How these numbers are produced, and how to read them, is on the "
        "[method](method.md) page. Each benchmark below ran once, in its own process, on this "
        "shared machine; the raw JSON of each is in `raw/` next to this page.",
        "",
    ]
    for note in meta.get("notes", []):
        lines += [f"> {note}", ""]
    summary = ["| benchmark | goals met | seconds | finished |", "|---|---|---|---|"]
    for data in reports:
        goals = data.get("goals", [])
        met = sum(_met(g) for g in goals)
        unmeasured = sum(g.get("value") is None for g in goals)
        count = f"{met} / {len(goals)}" + (f" ({unmeasured} not measured)" if unmeasured else "")
        summary.append(f"| [{data['benchmark']}](#{data['benchmark']}) | {count} "
                       f"| {_cell(data.get('seconds'))} | {data.get('date', '')} |")
    for name in meta.get("failures", {}):
        summary.append(f"| {name} | failed (see below) | | |")
    for name in pending:
        summary.append(f"| {name} | not run | | |")
    lines += ["## Summary", "", *summary, ""]

    for data in reports:
        name = data["benchmark"]
        lines += [f"## {name}", ""]
        if data.get("quick") and not meta.get("quick"):
            lines += ["*(quick scale)*", ""]
        goals = data.get("goals", [])
        if goals:
            lines += ["| goal | measured | target | |", "|---|---|---|---|"]
            for g in goals:
                if g.get("value") is None:
                    lines.append(f"| {_cell(g['name'])} | not measured: "
                                 f"{_cell(g.get('unmeasured', ''))} | {g['op']} "
                                 f"{_cell(g['target'])} | **not measured** |")
                    continue
                lines.append(f"| {_cell(g['name'])} | {_cell(g['value'])} | {g['op']} "
                             f"{_cell(g['target'])} | {'met' if _met(g) else '**not met**'} |")
            lines.append("")
        if plot_report(data, dest / "plots" / f"{name}.png"):
            lines += [f"![{name}](plots/{name}.png)", ""]
        rows = data.get("results", [])
        if rows:
            lines += ["??? note \"All figures\"", ""]
            lines += ["    " + ln for ln in _table(rows)]
            lines.append("")
        for n in data.get("notes", []):
            lines += [f"> {n}", ""]
    for name, log in meta.get("failures", {}).items():
        lines += [f"## {name}", "", "This benchmark failed; the end of its output:", "",
                  "```text", log.strip()[-2000:], "```", ""]
    page.write_text("\n".join(lines))
    return page


# -- plots ----------------------------------------------------------------------------------------

def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _labels(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Name each row by its text columns (variant, trace, ...), so repeated variants stay apart."""
    text_cols = [c for c in _columns(rows)
                 if all(isinstance(r.get(c), str) or r.get(c) is None for r in rows)]
    return [" / ".join(str(r[c]) for c in text_cols if r.get(c) is not None) or str(i)
            for i, r in enumerate(rows)]


def _plot_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    cols = [c for c in _columns(rows)
            if c not in _PARAMETERS
            and sum(_numeric(r.get(c)) for r in rows) >= max(2, len(rows) // 3)
            and len({r.get(c) for r in rows if _numeric(r.get(c))}) > 1]
    ranked: list[str] = []
    for p in _PREFERRED:
        ranked += [c for c in cols if p in c and c not in ranked]
    ranked += [c for c in cols if c not in ranked]
    return ranked[:_PANELS]


def _margin(goal: dict[str, Any]) -> float:
    """How far a goal is from its target, clipped to [-1, 1]: > 0 met with room, < 0 missed,
    0 exactly on target. Relative to the target; a goal whose target is 0 (a difference such as
    "hit% minus theine's hit% >= 0") is shown in its own units, so a miss by 0.07 points draws a
    short bar, not a full one. A goal not measured (or measured as NaN) is a full miss."""
    if goal.get("value") is None or not math.isfinite(float(goal["value"])):
        return -1.0
    v, t, op = float(goal["value"]), float(goal["target"]), goal["op"]
    scale = abs(t) if abs(t) > 1e-12 else 1.0
    if op in (">=", ">"):
        m = (v - t) / scale
    elif op in ("<=", "<"):
        m = (t - v) / scale
    else:
        m = -abs(v - t) / scale
    return max(-1.0, min(1.0, m))


def plot_report(data: dict[str, Any], path: Path) -> bool:
    """One PNG per benchmark: goals as value/target (1 = on target) and the main result columns.

    Returns False when there is nothing to plot, or no matplotlib (the bench extra) to plot
    with: the page is still written, without the figure.
    """
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    goals = list(data.get("goals", []))
    rows = list(data.get("results", []))[:_MAX_ROWS]
    cols = _plot_columns(rows) if rows else []
    panels = (1 if goals else 0) + len(cols)
    if panels == 0:
        return False
    height = max(2.5, 0.32 * max(len(goals), len(rows)) + 1.2)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels + 1.5, height), squeeze=False)
    ax_iter = iter(axes[0])
    if goals:
        ax = next(ax_iter)
        margins = [_margin(g) for g in goals]
        colors = ["#2e7d32" if _met(g) else "#c62828" for g in goals]
        names = [_short(g["name"], 38) for g in goals]
        ax.barh(range(len(goals)), margins, color=colors)
        ax.scatter(margins, range(len(goals)), color=colors, s=12, zorder=3)
        for y, (g, m) in enumerate(zip(goals, margins)):
            value = "n/a" if g.get("value") is None else f"{float(g['value']):.3g}"
            ax.text(0.02 if m < 0 else -0.02, y, f"{value} {g['op']} "
                    f"{float(g['target']):.3g}", fontsize=6, va="center",
                    ha="left" if m < 0 else "right")
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_xlim(-1.05, 1.05)
        ax.set_yticks(range(len(goals)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title("goals: margin to target, relative (absolute when the target is 0)\n"
                     "(right of 0 and green: met)",
                     fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    labels = [_short(s, 30) for s in _labels(rows)]
    for i, col in enumerate(cols):
        ax = next(ax_iter)
        vals = [float(r[col]) if _numeric(r.get(col)) else 0.0 for r in rows]
        ax.barh(range(len(rows)), vals, color="#1565c0")
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(col, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    shown = len(data.get("results", []))
    cut = f" — first {len(rows)} of {shown} result rows" if shown > len(rows) and cols else ""
    fig.suptitle(f"mlcache bench {data['benchmark']}{' (quick)' if data.get('quick') else ''}"
                 f"{cut}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# -- python -m mlcache.bench.all ------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlcache.bench.all", description=__doc__
                                     .splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write a Markdown page from a stored run")
    r.add_argument("src", help="a --report DIR of `mlcache bench all`")
    r.add_argument("page", help="the page to write, e.g. docs/benchmarks/results.md")
    go = sub.add_parser("run", help="like `mlcache bench all`, optionally for some benchmarks")
    go.add_argument("--quick", action="store_true")
    go.add_argument("--report", metavar="DIR")
    go.add_argument("--json", metavar="PATH")
    go.add_argument("--only", nargs="+", choices=ORDER, help="run only these benchmarks")
    args = parser.parse_args(argv)
    if args.command == "render":
        print(render_report(Path(args.src), Path(args.page)))
        return 0
    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
