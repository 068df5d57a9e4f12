"""Session 8 review of the quadtree and the command-line tools: regression tests.

Each test pins a defect found by probing (a brute-force scan as the model, a real manager over
a real disk level), so that it stays fixed.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlcache.structures import PlainQuadtree

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

NAN = math.nan


def tiny(path) -> CacheConfig:
    return CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="lru"),
                       levels=(DiskConfig(path=str(path)),))


# -- quadtree: times ---------------------------------------------------------------------------

def test_a_nan_time_does_not_hide_older_points_from_prune_older():
    # NaN times are accepted (and come back as NaN); a NaN was taken as a subtree's time bound,
    # and after a prune the parent's bound skipped the NaN child, so a later prune_older
    # missed a point older than its t
    qt = PlainQuadtree((0, 0, 10, 10), capacity=2)
    qt.insert_many([(1.0, 1.0, "a", NAN), (1.5, 1.5, "b", 4.0), (8.0, 1.0, "c", 1.0),
                    (8.5, 1.0, "d", 6.0)])
    qt.verify()
    assert qt.prune_older(2.0) == 1
    assert qt.prune_older(5.0) == 1
    assert sorted(p.data for p in qt) == ["a", "d"]
    qt.verify()


TIMES = st.one_of(st.sampled_from([NAN, None, 0.0, 3.0]), st.integers(0, 9).map(float))
POINTS = st.tuples(st.integers(0, 16).map(float), st.integers(0, 16).map(float),
                   st.integers(0, 3), TIMES)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(POINTS, max_size=8), max_size=6),
       cuts=st.lists(st.integers(0, 10), max_size=4))
def test_prune_older_matches_a_scan_with_nan_and_missing_times(batches, cuts):
    qt = PlainQuadtree((0, 0, 16, 16), capacity=2, max_depth=4)
    model: list = []
    for batch, t in zip(batches, cuts + [None] * len(batches)):
        qt.insert_many(batch)
        model.extend(batch)
        qt.verify()
        if t is not None:
            keep = [p for p in model if not (p[3] is not None and p[3] < t)]
            assert qt.prune_older(t) == len(model) - len(keep)
            model = keep
            qt.verify()
        assert len(qt) == len(model)


def test_a_time_that_cannot_be_compared_changes_nothing(tmp_path):
    # insert_many promises a bad point changes nothing; a str time among float times raised a
    # bare TypeError after the root's count was raised in the heap's live node
    with CacheManager(tiny(tmp_path)) as m:
        qt = m.quadtree("q", (0, 0, 10, 10), capacity=2)
        qt.insert(1.0, 1.0, "a", ts=1.0)
        for bad in ("x", [1], complex(1, 1)):
            with pytest.raises(TypeError, match=r"point \(2\.0, 2\.0\) has a time ts="):
                qt.insert_many([(3.0, 3.0, "ok", 2.0), (2.0, 2.0, "b", bad)])
            assert len(qt) == 1
            qt.verify()
        assert [(p.data, p.ts) for p in qt] == [("a", 1.0)]



# -- quadtree: settings that broke the tree ------------------------------------------------------

def test_max_depth_past_the_recursion_limit_is_refused(tmp_path):
    # a pile of duplicates split down to max_depth=3000 raised RecursionError halfway through
    # the change: the root pointed at children never stored (verify: KeyError)
    with CacheManager(tiny(tmp_path)) as m:
        with pytest.raises(ValueError, match="max_depth must be an integer from 0 to 256"):
            m.quadtree("deep", (0, 0, 1, 1), capacity=1, max_depth=3000)
        with pytest.raises(ValueError, match="max_depth"):
            PlainQuadtree((0, 0, 1, 1), max_depth=257)
        qt = m.quadtree("deep", (0, 0, 1, 1), capacity=1, max_depth=256)
        qt.insert_many([(0.5, 0.5, "a", 1.0), (0.5, 0.5, "b", 2.0), (0.25, 0.75, "c", 1.0)])
        assert qt.height() == 256 and qt.verify() == 1025
        assert qt.prune_older(1.5) == 2
        assert qt.remove(0.5, 0.5).data == "b" and len(qt) == 0
        qt.verify()


def test_bounds_whose_midpoints_overflow_are_refused():
    # bounds past half the largest double: x1 - x0 was inf, so grid_counts put every point in
    # cell (0, 0), and a midpoint (x0 + x1) * 0.5 of an upper quadrant became inf
    big = sys.float_info.max / 2
    for bounds in [(-1e308, -1e308, 1e308, 1e308), (0.0, 0.0, 1.7e308, 1.0)]:
        with pytest.raises(ValueError, match="bounds must lie within"):
            PlainQuadtree(bounds)
    qt = PlainQuadtree((-big, -big, big, big), capacity=1)
    qt.insert_many([(big / 2, big / 2), (-big / 2, -big / 2), (big * 0.9, -big * 0.9), (big, big)])
    assert qt.grid_counts(1) == {(1, 1): 2, (0, 0): 1, (1, 0): 1}
    assert qt.grid_counts(3)[(7, 7)] == 1
    qt.verify()


def _cell_of(p, bounds, depth):
    x0, y0, x1, y1 = bounds
    ix = iy = 0
    for _ in range(depth):
        mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
        ix, x0, x1 = (2 * ix + 1, mx, x1) if p[0] >= mx else (2 * ix, x0, mx)
        iy, y0, y1 = (2 * iy + 1, my, y1) if p[1] >= my else (2 * iy, y0, my)
    return ix, iy


def test_grid_counts_deep_below_a_leaf_does_not_build_every_midpoint():
    # a leaf answered from the list of all 2**levels - 1 midpoints below it: grid_counts(30)
    # over a tree of one point needed ~17 GiB (23 took 7 s); a depth of -1 or 2.5 was a
    # RecursionError
    qt = PlainQuadtree((0, 0, 1, 1))
    qt.insert(0.3, 0.7)
    for depth in (30, 256):
        assert qt.grid_counts(depth) == {_cell_of((0.3, 0.7), (0, 0, 1, 1), depth): 1}
    for bad in (-1, 2.5, True, None):
        with pytest.raises(ValueError, match="depth must be an integer >= 0"):
            qt.grid_counts(bad)


@settings(max_examples=60, deadline=None)
@given(points=st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.75, 4.0]) |
                                 st.floats(0, 4), st.floats(0, 4)), max_size=40),
       depth=st.integers(9, 16), cap=st.sampled_from([1, 4, 64]))
def test_grid_counts_match_a_scan_at_any_depth(points, depth, cap):
    bounds = (0.0, 0.0, 4.0, 4.0)
    qt = PlainQuadtree(bounds, capacity=cap, max_depth=6)
    qt.insert_many(points)
    want: dict = {}
    for p in points:
        cell = _cell_of(p, bounds, depth)
        want[cell] = want.get(cell, 0) + 1
    assert qt.grid_counts(depth) == want
    some = list(want)[::2]
    assert qt.grid_counts(depth, cells=some) == {c: want[c] for c in some}

# -- mlcache simulate: output files --------------------------------------------------------------

SIM = ["--trace", "gen:zipf", "--requests", "2000", "--sizes", "10", "--policies", "lru",
       "--no-progress"]


def _simulate(argv):
    from mlcache.sim.cli import main

    return main(SIM + argv)


def test_simulate_writes_the_plot_as_a_png_at_exactly_the_path_given(tmp_path, capsys):
    # matplotlib took the format from the extension: --plot out (no extension) wrote out.png
    # while the command said it wrote out; --plot out.txt was a traceback after the whole run
    for name in ("noext", "plot.txt"):
        png = tmp_path / name
        assert _simulate(["--csv", str(tmp_path / "o.csv"), "--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {png}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noext", "o.csv", "plot.txt"]


def test_simulate_refuses_a_directory_as_an_output_before_the_run(tmp_path, capsys):
    for flag in ("--csv", "--plot"):
        assert _simulate([flag, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"mlcache simulate: {flag[2:]}: {tmp_path} is a directory")


def test_simulate_reports_an_output_it_cannot_write_in_one_line(tmp_path, capsys):
    # a failed write was a traceback after the whole run (and could leave half a file)
    locked = tmp_path / "ro"
    locked.mkdir()
    (locked / "r.csv").write_text("old\n")
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):   # root writes anywhere: use a path that cannot exist
            target = "/proc/self/mlcache-review.csv"
        else:
            target = str(locked / "r.csv")
        assert _simulate(["--no-plot", "--csv", target]) == 2
    finally:
        locked.chmod(0o755)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"mlcache simulate: csv: cannot write {target}: ")
    assert (locked / "r.csv").read_text() == "old\n"


def test_simulate_replaces_an_output_atomically(tmp_path, capsys):
    out = tmp_path / "r.csv"
    out.write_text("old\n")
    assert _simulate(["--no-plot", "--csv", str(out)]) == 0
    assert out.read_text().startswith("trace,policy,size")
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]   # no temporary left
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- mlcache stats ---------------------------------------------------------------------------------

def _stats(argv, capsys):
    from mlcache.stats_cli import main

    try:
        rc = main(argv)
    except SystemExit as exc:     # argparse's errors
        rc = exc.code
    return rc, capsys.readouterr().err


def test_stats_against_a_port_that_does_not_speak_http_is_one_line(capsys):
    # (a BadStatusLine traceback: e.g. --port of a Redis server by mistake)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer():
        conn, _ = server.accept()
        conn.recv(1024)
        conn.sendall(b"-ERR not http\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        rc, err = _stats(["--port", str(server.getsockname()[1])], capsys)
    finally:
        thread.join(10)
        server.close()
    assert rc == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("mlcache stats: cannot scrape http://127.0.0.1:")
    rc, err = _stats(["--host", "a b"], capsys)      # (an InvalidURL traceback)
    assert rc == 1 and err.startswith("mlcache stats: cannot scrape http://a b:9464/metrics: ")


@pytest.mark.parametrize("argv, named", [
    (["--watch", "inf"], "--watch"), (["--watch", "1e300"], "--watch"),
    (["--port", "70000"], "--port"), (["--port", "-5"], "--port")])
def test_stats_refuses_a_watch_or_port_out_of_range_before_scraping(argv, named, capsys):
    # --watch inf scraped once, then time.sleep's OverflowError traceback
    from mlcache.metrics import serve_stats

    server = serve_stats(lambda: {"": {"levels": {}}})
    try:
        if named == "--watch":
            argv = argv + ["--port", str(server.port)]
        rc, err = _stats(argv, capsys)
    finally:
        server.close()
    assert rc == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("mlcache stats: error: ")
    assert named in err.splitlines()[-1]


# -- mlcache demo ----------------------------------------------------------------------------------

def test_demo_with_its_metrics_port_in_use_is_one_line_and_cleans_up(tmp_path, monkeypatch,
                                                                    capsys):
    # serve() ran before the try: a port in use was an OSError traceback that left the
    # manager open and the demo's temporary directory behind
    from mlcache.cli import main as cli_main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        rc = cli_main(["demo", "--local", "--quick", "--metrics-port", str(port)])
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"mlcache demo: metrics_port: cannot serve on port "
                                           f"{port}: ")
    assert list(tmp_path.iterdir()) == []


def test_demo_with_no_redis_server_reports_why_and_cleans_up(tmp_path, monkeypatch, capsys):
    # the job's LevelUnavailableError ('get failed') was replaced by the cleanup's own ('scan
    # failed'), as a traceback, and the temporary directory was left behind
    from mlcache.cli import main as cli_main
    from mlcache.demo import run_local
    from mlcache.errors import LevelUnavailableError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as s:     # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(LevelUnavailableError, match="get failed"):
        run_local(events=50, cards=10, redis=url, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert cli_main(["demo", "--local", "--quick", "--redis", url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"mlcache demo: redis level at {url}: ")
    assert list(tmp_path.iterdir()) == []


# -- examples/event_detection.py -----------------------------------------------------------------

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "event_detection.py")


def _example(args, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, EXAMPLE, *args], check=False, capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, named", [
    (["--intervals", "12"], "--intervals"), (["--intervals", "-3"], "--intervals"),
    (["--posts", "-1"], "--posts"), (["--bursts", "-1"], "--bursts"),
    (["--heap-mib", "0"], "--heap-mib"), (["--heap-mib", "nan"], "--heap-mib"),
    (["--redis", "http://x"], "--redis")])
def test_the_example_refuses_bad_arguments_in_one_line(args, named, tmp_path):
    # each was a traceback (randrange's empty range, ConfigError, int(nan)); --bursts -1 ran
    # with no bursts
    run = _example(args, tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert named in last and last.startswith("event_detection.py: ")
    assert list(tmp_path.iterdir()) == []


def test_the_example_leaves_no_directory_behind(tmp_path):
    # its disk level's directory (tempfile.mkdtemp) was never removed
    run = _example(["--intervals", "13", "--posts", "50"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert "planted bursts found" in run.stdout
    assert list(tmp_path.iterdir()) == []


# -- mlcache bench: output paths -------------------------------------------------------------------

@pytest.mark.parametrize("argv, why", [
    (["bench", "levels", "--json", "{missing}/x.json"], "no directory"),
    (["bench", "events", "--quick", "--json", "{tmp}"], "is a directory, not a file name"),
    (["bench", "all", "--json", "{missing}/x.json"], "no directory"),
    (["bench", "all", "--report", "{tmp}/afile"], "exists and is not a directory")])
def test_bench_refuses_an_output_it_cannot_write_before_running(argv, why, tmp_path, capsys):
    # --json to a missing directory or a directory was a traceback after the whole run
    from mlcache.cli import main as cli_main

    (tmp_path / "afile").write_text("x")
    argv = [a.format(tmp=tmp_path, missing=tmp_path / "nope") for a in argv]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mlcache bench: {argv[-2]} {argv[-1]}: {why}")


def test_bench_json_is_replaced_atomically(tmp_path):
    from mlcache.bench._report import write_json_atomic as _write_json

    out = tmp_path / "r.json"
    out.write_text("old")
    with pytest.raises(TypeError):
        _write_json(str(out), {"x": object()})      # fails halfway through the dump
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
    _write_json(str(out), {"x": 1})
    assert json.loads(out.read_text()) == {"x": 1}


# -- mlcache inspect ------------------------------------------------------------------------------

def test_inspect_reports_a_disk_path_that_is_a_file_as_an_error(tmp_path, capsys):
    # it said "missing (nothing was ever written there)" and exited 0
    from mlcache.inspect import main as inspect_main

    (tmp_path / "afile").write_text("x")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"levels": [{"type": "disk", "path": str(tmp_path / "afile")}]}))
    assert inspect_main([str(config)]) == 1
    assert "error: not a directory" in capsys.readouterr().out


def test_radius_refuses_a_negative_or_nan_radius():
    # r * r made radius(x, y, -1) the points within 1 (a scan by distance finds none)
    qt = PlainQuadtree((0, 0, 10, 10), capacity=2)
    qt.insert_many([(1.0, 1.0), (1.5, 1.0)])
    for bad in (-1, -0.5, NAN):
        with pytest.raises(ValueError, match="radius r must be a number >= 0"):
            qt.radius(1.0, 1.0, bad)
    assert [p.x for p in qt.radius(1.0, 1.0, 0)] == [1.0]


def test_a_point_of_the_wrong_length_is_refused_before_any_change(tmp_path):
    # a fifth field was dropped silently; one field was a bare IndexError
    with CacheManager(tiny(tmp_path)) as m:
        qt = m.quadtree("q", (0, 0, 10, 10), capacity=2)
        for bad in [(1.0, 1.0, "a", 1.0, "extra"), (1.0,), ()]:
            with pytest.raises(ValueError, match=r"a point is \(x, y\), .* got "):
                qt.insert_many([(2.0, 2.0), bad])
        assert len(qt) == 0
        assert qt.insert_many([(1.0, 1.0), (1.0, 1.0, "a"), (1.0, 1.0, "b", 2.0)]) == 3
        qt.verify()


@pytest.mark.parametrize("kind", ["plain", "cacheable"])
def test_a_prune_that_raises_after_a_merge_leaves_the_node_count(kind, tmp_path):
    # the merge of the first quadrant took its nodes off meta["nodes"] before the predicate
    # raised in the last one: the nodes stayed, their count did not (verify failed, and the
    # next change saved the wrong count)
    pts = [(1.0, 1.0, "a"), (1.5, 1.5, "a"), (2.0, 2.0, "a"), (3.0, 3.0, "a"), (0.5, 0.5, "a"),
           (12.0, 12.0, "boom"), (13.0, 13.0, "b"), (14.0, 14.0, "b")]

    def drop(p):
        if p.data == "boom":
            raise RuntimeError("boom")
        return p.data == "a"

    with CacheManager(tiny(tmp_path)) as m:
        qt = (PlainQuadtree((0, 0, 16, 16), capacity=2) if kind == "plain"
              else m.quadtree("q", (0, 0, 16, 16), capacity=2))
        qt.insert_many(pts)
        before = qt.node_count
        with pytest.raises(RuntimeError, match="boom"):
            qt.prune(drop)
        assert qt.node_count == before and len(qt) == len(pts)
        qt.verify()
        assert qt.prune(lambda p: p.data == "a") == 5
        qt.verify()


def test_nearest_takes_an_integer_k():
    # k=1.5 returned two points (the loop ran while fewer than 1.5 were found)
    qt = PlainQuadtree((0, 0, 10, 10), capacity=2)
    qt.insert_many([(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)])
    for bad in (1.5, "2", None):
        with pytest.raises(TypeError, match="k must be an integer"):
            qt.nearest(0, 0, bad)
    assert [p.x for p in qt.nearest(0, 0, 2)] == [1.0, 2.0]
