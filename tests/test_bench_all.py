"""``mlcache bench all`` plumbing on synthetic reports: raw JSON, Markdown page, PNG plots.

The benchmarks themselves are not run here (each has its own ``--quick`` smoke run).
"""
from __future__ import annotations

import argparse
import json
import sys

from mlcache.bench import all as bench_all
from mlcache.bench._report import BenchReport


def _reports() -> list[dict]:
    a = BenchReport("levels", quick=True)
    a.result("cachetools", throughput=900_000.0)
    a.result("mlcache wtinylfu", throughput=380_000.0, vs_lru=0.42)
    a.result("mlcache lru", throughput=320_000.0, vs_lru=0.36)
    a.goal("heap hit throughput / cachetools", 0.42, ">=", 0.4)
    a.goal("slowdown at 10% heap", 2.5, "<=", 2.0)
    a.note("synthetic | with a pipe")
    b = BenchReport("policies", quick=True)
    for trace in ("zipf", "scan"):
        for pol in ("lru", "wtinylfu"):
            b.result(pol, trace=trace, hit_ratio=0.3 if pol == "lru" else 0.4, nested={"x": 1})
    b.goal("wtinylfu / lru hit ratio", 1.33, ">=", 1.0)
    empty = BenchReport("arena", quick=True)
    return [a.to_dict(), b.to_dict(), empty.to_dict()]


def test_render_writes_page_plots_and_raw(tmp_path):
    run_dir = tmp_path / "run"
    meta = {"date": "2026-01-01T00:00:00+00:00", "machine": "2 cores test", "quick": True,
            "benchmarks": ["levels", "policies", "arena", "spark"],
            "failures": {"spark": "Traceback ...\nRuntimeError: no Java"},
            "notes": ["two sessions merged"]}
    bench_all.write_raw(run_dir, meta, _reports(), {"levels": "table\n"})
    assert (run_dir / "logs" / "levels.log").read_text() == "table\n"

    page = bench_all.render_report(run_dir, run_dir / "report.md")
    text = page.read_text()
    assert "2 cores test" in text and "2026-01-01" in text and "quick" in text
    assert "| [levels](#levels) | 1 / 2 |" in text and "| spark | failed (see below) | | |" in text
    assert "| heap hit throughput / cachetools | 0.42 | >= 0.4 | met |" in text
    assert "| slowdown at 10% heap | 2.50 | <= 2.00 | **not met** |" in text
    assert "RuntimeError: no Java" in text and "> two sessions merged" in text
    assert "synthetic \\| with a pipe" not in text and "synthetic | with a pipe" in text
    for name in ("levels", "policies"):
        png = run_dir / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](plots/{name}.png)" in text
    assert not (run_dir / "plots" / "arena.png").exists()     # nothing to plot
    # repeated variants are told apart by their text columns in the plot labels
    rows = json.loads((run_dir / "raw" / "policies.json").read_text())["results"]
    assert bench_all._labels(rows)[:2] == ["lru / zipf", "wtinylfu / zipf"]

    # The docs page is rendered from the stored run into another folder, raw JSON copied along.
    docs = tmp_path / "docs" / "benchmarks"
    assert bench_all.main(["render", str(run_dir), str(docs / "results.md")]) == 0
    assert (docs / "raw" / "levels.json").exists() and (docs / "plots" / "levels.png").exists()
    assert "[method](method.md)" in (docs / "results.md").read_text()


def test_available_benchmarks_are_the_modules_present():
    names = bench_all.available_benchmarks()
    assert names and set(names) <= set(bench_all.ORDER)
    assert names == [n for n in bench_all.ORDER if n in names]
    assert "levels" in names and "policies" in names


def test_failed_child_is_reported_not_raised(tmp_path, monkeypatch):
    # A child that exits non-zero without writing its JSON is a failure with its output kept.
    monkeypatch.setattr(bench_all, "_child_command",
                        lambda name, quick, path: ["python3", "-c",
                                                   "print('boom'); raise SystemExit(3)"])
    data, log, seconds = bench_all._run_one("levels", True, tmp_path)
    assert data is None and "boom" in log and "exit status 3" in log and seconds >= 0


def test_run_collects_children_and_writes_report(tmp_path, monkeypatch, capsys):
    # The whole `mlcache bench all --quick --report DIR --json PATH` loop, with children that
    # write a small report instead of running a real benchmark (those have their own smoke runs).
    script = ("import json, sys\n"
              "from mlcache.bench._report import BenchReport\n"
              "name, path = sys.argv[1], sys.argv[2]\n"
              "if name == 'dedup': raise SystemExit('dedup broke')\n"
              "r = BenchReport(name, quick=True)\n"
              "r.result('baseline', throughput=10.0); r.result('mlcache', throughput=8.0)\n"
              "r.goal('mlcache / baseline', 0.8, '>=', 0.5)\n"
              "json.dump(r.to_dict(), open(path, 'w'))\n")
    monkeypatch.setattr(bench_all, "_child_command",
                        lambda name, quick, path: [sys.executable, "-c", script, name, str(path)])
    args = argparse.Namespace(quick=True, report=str(tmp_path / "rep"),
                              json=str(tmp_path / "all.json"), only=["levels", "dedup", "arena"])
    assert bench_all.run(args) == 1                       # one benchmark failed
    out = capsys.readouterr().out
    assert "mlcache bench levels (quick)" in out and "[met] mlcache / baseline" in out
    page = (tmp_path / "rep" / "report.md").read_text()
    assert "quick" in page and "| [arena](#arena) | 1 / 1 |" in page
    assert "dedup broke" in page
    combined = json.loads((tmp_path / "all.json").read_text())
    assert [r["benchmark"] for r in combined["reports"]] == ["levels", "arena"]
    assert set(combined["failures"]) == {"dedup"}
    assert (tmp_path / "rep" / "plots" / "levels.png").exists()


def test_mixed_scale_run_is_labelled(tmp_path):
    full = BenchReport("levels")
    full.goal("g", 1.0, ">=", 1.0)
    meta = {"date": "d", "machine": "m", "quick": False, "benchmarks": ["levels", "dedup"],
            "failures": {}}
    bench_all.write_raw(tmp_path, meta, [full.to_dict(), _reports()[0] | {"benchmark": "dedup"}])
    text = bench_all.render_report(tmp_path, tmp_path / "report.md").read_text()
    assert "full, except dedup at quick scale" in text and "*(quick scale)*" in text
