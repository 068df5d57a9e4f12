"""The block repository: SlideM's I/O pattern, reopening, late and bad input."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlcache.errors import ConfigError, SerializationError
from mlcache.structures import SharedWindows, SlidingWindow
from tests.test_window import Oracle, exact, same

COLS = ("g", "v", "w")
CAP = 8  # tuples per block: 256 bytes / (8 bytes x (3 columns + ts))


def spy(win):
    """Record the sequence numbers of the blocks written and read."""
    repo = win._repo
    writes, reads = [], []
    write, read = repo._write, repo._read

    def _write(blk):
        writes.append(blk.seq)
        write(blk)

    def _read(seq):
        reads.append(seq)
        return read(seq)

    repo._write, repo._read = _write, _read
    return writes, reads


@pytest.mark.parametrize("kind", ["count", "time"])
@pytest.mark.parametrize("batch", [False, True])
def test_slidem_writes_each_filled_block_once_and_reads_it_back_once(kind, batch, tmp_path):
    win = SlidingWindow(10 * CAP, kind=kind, columns=COLS, value="v", block_size=256,
                        directory=tmp_path)
    writes, reads = spy(win)
    rows = [(i % 3, float(i), 1.0) for i in range(80 * CAP)]
    ts = [float(i) for i in range(80 * CAP)]
    if batch:
        for i in range(0, len(rows), CAP):
            win.extend(rows[i: i + CAP], ts[i: i + CAP])
    else:
        for r, t in zip(rows, ts):
            win.append(r, t)
    win.result()
    # block 0 stays in the pool as the first ancient block; every later block is written once,
    # when it is filled, and read once, when it becomes the ancient block (the window holds the
    # last 10 blocks: 70..79)
    assert writes == list(range(1, 80))
    assert reads == list(range(1, 71))
    stats = win.io_stats()
    assert stats["writes"] == 79 and stats["reads"] == 70
    assert stats["bytes_written"] == 79 * 256 and stats["bytes_read"] == 70 * 256
    assert stats["resident_blocks"] <= 2 and win.memory_bytes()["pool"] <= 2 * 256
    assert stats["file_slots"] <= 11  # Procedure 2 reuses the slots of expired blocks
    win.close()


def test_ssm_writes_each_block_once_and_space_follows_the_largest_window(tmp_path):
    ranges = [4 * CAP, 7 * CAP, 10 * CAP]
    win = SharedWindows(ranges, kind="count", columns=COLS, value="v", block_size=256,
                        buffer_blocks=3, directory=tmp_path)
    writes, reads = spy(win)
    for i in range(60 * CAP):
        win.append((0, float(i), 1.0))
    assert len(writes) == len(set(writes))
    assert max(reads.count(s) for s in set(reads)) <= len(ranges)
    assert win.io_stats()["live_blocks"] <= 10 + 1
    assert [r.count for r in win.results()] == ranges
    win.close()


def test_ssm_policy_keeps_blocks_the_next_window_needs(tmp_path):
    """With a pool big enough for the spread between windows, each block is read once."""
    ranges = [20 * CAP, 21 * CAP, 22 * CAP, 23 * CAP]
    win = SharedWindows(ranges, kind="count", columns=COLS, value="v", block_size=256,
                        buffer_blocks=8, directory=tmp_path)
    writes, reads = spy(win)
    for i in range(80 * CAP):
        win.append((0, float(i), 1.0))
    assert len(reads) == len(set(reads))
    win.close()


def _feed(win, stream, oracle):
    for t, row in stream:
        oracle.rows.append((t, row))
        win.append(row, t)


@pytest.mark.parametrize("numeric", [True, False])
@pytest.mark.parametrize("shared", [False, True])
def test_reopened_window_continues(numeric, shared, tmp_path):
    ranges = [30.0, 45.0] if shared else [30.0]
    slides: list = []
    opts = dict(slide=5, on_slide=lambda e, r: slides.append((e, r)), group_by="g",
                minmax=True, block_size=256, lateness=3.0, directory=tmp_path / "w")
    if numeric:
        opts.update(columns=COLS, value="v", weight="w")
        row = lambda g, v, w: (g, v, w)  # noqa: E731
    else:
        opts.update(value=1, weight=2, group_by=0)
        row = lambda g, v, w: ["s%d" % g, v, w]  # noqa: E731

    def make():
        return SharedWindows(ranges, **opts) if shared else SlidingWindow(ranges[0], **opts)

    oracle = Oracle("time", ranges)
    stream = [(float(i // 2 - (2 if i % 7 == 3 else 0)), row(i % 4, float(i % 11), 1.0 + i % 3))
              for i in range(600)]
    win = make()
    _feed(win, stream[:301], oracle)
    win.close()
    win = make()  # same directory: continues where it stopped
    emitted_before = len(slides)
    _feed(win, stream[301:], oracle)
    assert len(slides) > emitted_before
    got = win.results() if shared else [win.result()]
    key = (lambda g: g) if numeric else (lambda g: g)
    want = [exact([(key(r[0]), r[1], r[2]) for r in oracle.window(rng)], grouped=True,
                  minmax=True) for rng in ranges]
    for g, w in zip(got, want):
        same(g, w)
    assert win.io_stats()["late_accepted"] > 0
    win.close()


late_streams = st.lists(st.tuples(st.integers(-4, 3), st.integers(0, 2), st.integers(-9, 9)),
                        max_size=80)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=late_streams, lateness=st.integers(0, 3), drop=st.booleans(),
       shared=st.booleans(), minmax=st.booleans())
def test_late_tuples_within_lateness_are_exact(stream, lateness, drop, shared, minmax):
    ranges = [6.0, 10.0] if shared else [6.0]
    oracle = Oracle("time", ranges)
    checks: list = []

    def on_slide(end, result):
        want = [exact(oracle.window(r, end), grouped=True, minmax=minmax) for r in ranges]
        for g, w in zip(result if shared else [result], want):
            same(g, w)
        checks.append(end)

    opts = dict(columns=COLS, value="v", group_by="g", slide=2, on_slide=on_slide,
                minmax=minmax, block_size=96, lateness=float(lateness),
                on_late="drop" if drop else "raise")
    win = SharedWindows(ranges, **opts) if shared else SlidingWindow(ranges[0], **opts)
    now, dropped = None, 0
    for dt, g, v in stream:
        t = (now or 0.0) + dt
        row = (g, float(v), 1.0)
        if now is not None and t < now - lateness:
            if drop:
                win.append(row, t)
                dropped += 1
            else:
                with pytest.raises(ValueError, match="lateness"):
                    win.append(row, t)
            continue
        oracle.rows.append((t, row))
        win.append(row, t)
        now = t if now is None else max(now, t)
    if oracle.rows:
        got = win.results() if shared else [win.result()]
        for g, r in zip(got, ranges):
            same(g, exact(oracle.window(r, now), grouped=True, minmax=minmax))
    assert win.io_stats()["late_dropped"] == dropped
    win.close()


def test_extend_rejects_a_late_batch_before_changing_anything():
    win = SlidingWindow(10.0, columns=COLS, value="v")
    win.extend([(0, 1.0, 1.0), (0, 2.0, 1.0)], [5.0, 6.0])
    with pytest.raises(ValueError, match="behind the watermark 7.0"):
        win.extend([(0, 3.0, 1.0), (0, 4.0, 1.0)], [7.0, 2.0])
    assert win.result().count == 2
    win.close()


def test_records_too_big_for_a_block_name_the_limit():
    with pytest.raises(ValueError, match="block size limit of 64 bytes"):
        SlidingWindow(10.0, columns=tuple("abcdefgh"), block_size=64)
    win = SlidingWindow(10.0, block_size=128)
    with pytest.raises(ValueError, match="exceeds the block size limit of 112 bytes"):
        win.append("x" * 200, 1.0)
    win.append("x" * 50, 1.0)
    with pytest.raises(SerializationError):
        win.append(object(), 2.0)
    win.close()


def test_bad_configuration_and_records():
    for kwargs in ({"kind": "rows"}, {"on_late": "ignore"}, {"lateness": -1},
                   {"block_size": 10}, {"slide": 0}):
        with pytest.raises(ConfigError):
            SlidingWindow(10.0, **kwargs)
    for rng in (0, -1, "ten", True):
        with pytest.raises(ConfigError):
            SlidingWindow(rng)
    with pytest.raises(ConfigError, match="integer"):
        SlidingWindow(2.5, kind="count")
    with pytest.raises(ConfigError, match="value"):
        SlidingWindow(1.0, columns=COLS, value="price")
    with pytest.raises(ValueError, match="at least 2"):
        SlidingWindow(1.0, buffer_blocks=1)
    win = SlidingWindow(10.0, columns=COLS, value="v")
    with pytest.raises(ValueError, match="3 numbers"):
        win.append((1.0, 2.0), 1.0)
    with pytest.raises(ValueError, match="numeric timestamp"):
        win.append((1.0, 2.0, 3.0), None)
    with pytest.raises(ValueError, match="shape"):
        win.extend([[1.0, 2.0]], [1.0])
    win.close()


@pytest.mark.parametrize("numeric", [True, False])
def test_a_refused_record_changes_nothing(numeric):
    """A record refused by append() moved the watermark (and emitted the slides up to its
    timestamp) before it was checked: the next valid tuple behind that timestamp was then
    late, so dropped with on_late="drop" (lost) or refused with a ValueError."""
    slides: list = []
    opts = {"slide": 5, "on_slide": lambda end, result: slides.append(end), "on_late": "drop"}
    if numeric:
        win = SlidingWindow(10.0, columns=("v",), value="v", **opts)
        good, bad, refused = (lambda v: (v,)), ("not a number", 2), ValueError
    else:
        win = SlidingWindow(10.0, value=0, **opts)
        good, bad, refused = (lambda v: [v]), [object()], SerializationError
    win.append(good(1.0), 1.0)
    with pytest.raises(refused):
        win.append(bad, 20.0)
    win.append(good(3.0), 8.0)
    assert slides == [5] and win.late_dropped == 0
    result = win.result()
    assert (result.count, result.sum) == (2, 4.0)
    win.close()


@pytest.mark.parametrize("where", [0, 1, 2])
def test_extend_refuses_a_nan_timestamp_anywhere(where):
    """extend() caught a NaN only in first or last place: one inside an in-order batch went
    into the blocks (append() refuses it), where expiry's binary search expects sorted times."""
    win = SlidingWindow(10.0, columns=("v",), value="v")
    win.append((1.0,), 0.5)
    ts = [1.0, 2.0, 3.0]
    ts[where] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        win.extend([(1.0,), (2.0,), (3.0,)], ts)
    assert win.result().count == 1
    win.close()


@pytest.mark.parametrize("numeric", [True, False])
def test_an_infinite_timestamp_is_refused_by_a_sliding_time_window(numeric):
    """There are infinitely many slide boundaries before an infinite timestamp: append() looped
    forever (expiring and calling on_slide at every boundary), extend() too after ingesting
    the batch up to it."""
    slides: list = []

    def on_slide(end, result):
        slides.append(end)
        assert len(slides) < 1000, "still sliding"     # fail, rather than hang, on a regression

    if numeric:
        win = SlidingWindow(10.0, columns=("v",), value="v", slide=5, on_slide=on_slide)
    else:
        win = SlidingWindow(10.0, value=0, slide=5, on_slide=on_slide)
    row = (lambda v: (v,)) if numeric else (lambda v: [v])
    win.append(row(1.0), 1.0)
    with pytest.raises(ValueError, match="finite timestamps"):
        win.append(row(2.0), math.inf)
    if numeric:
        for ts in ([6.0, math.inf], [math.inf, 7.0]):
            with pytest.raises(ValueError, match="finite timestamps"):
                win.extend([row(3.0), row(4.0)], ts)
    win.append(row(5.0), 6.0)
    assert slides == [5]
    assert (win.result().count, win.result().sum) == (2, 6.0)
    win.close()


def test_refused_buffer_blocks_leave_no_temporary_directory(tmp_path, monkeypatch):
    """buffer_blocks was checked only after the window had made its temporary directory and
    data file, which stayed behind; a string or a float failed with a TypeError or a
    ConfigError naming the policy's capacity."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for bad in (1, 0, "2", 2.5, True):
        with pytest.raises(ConfigError, match="buffer_blocks: .*at least 2"):
            SlidingWindow(10.0, buffer_blocks=bad)
        with pytest.raises(ConfigError, match="buffer_blocks"):
            SharedWindows([1.0, 2.0], columns=COLS, buffer_blocks=bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["count", "time"])
def test_a_failed_block_write_loses_nothing(kind, tmp_path, monkeypatch):
    """A block spilled from the pool left memory before its write: when the write failed (a
    full disk) the block was gone, the window's later expiry read it from slot -1 and failed
    for good, and the recent block was never replaced by a fresh one."""
    import errno
    import os

    win = SlidingWindow(10 * CAP, kind=kind, columns=COLS, value="v", block_size=256,
                        directory=tmp_path)
    write = os.pwrite
    failures = []

    def full_disk(fd, data, offset):
        if len(failures) < 2:
            failures.append(offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data, offset)

    oracle = Oracle(kind, [10 * CAP])
    for i in range(40 * CAP):
        row, ts = (i % 3, float(i % 7), 1.0), float(i)
        if i == 12 * CAP:
            monkeypatch.setattr(os, "pwrite", full_disk)
        try:
            win.append(row, ts)
        except OSError:
            pass                                  # the tuple is in; the spill waits
        oracle.rows.append((ts, row))
    monkeypatch.setattr(os, "pwrite", write)
    assert len(failures) == 2
    same(win.result(), exact(oracle.window(10 * CAP), grouped=False, minmax=False))
    win.close()
    again = SlidingWindow(10 * CAP, kind=kind, columns=COLS, value="v", block_size=256,
                          directory=tmp_path)
    same(again.result(), exact(oracle.window(10 * CAP), grouped=False, minmax=False))
    again.close()


def test_reopening_with_another_configuration_is_refused(tmp_path):
    win = SlidingWindow(10.0, columns=COLS, value="v", directory=tmp_path)
    win.append((0, 1.0, 1.0), 1.0)
    win.close()
    with pytest.raises(ConfigError, match="another configuration"):
        SlidingWindow(20.0, columns=COLS, value="v", directory=tmp_path)
    again = SlidingWindow(10.0, columns=COLS, value="v", directory=tmp_path)
    assert again.result().count == 1 and again.result().sum == 1.0
    again.close()


def test_empty_window_and_count_window_without_timestamps():
    win = SlidingWindow(3, kind="count", value=lambda r: r)
    assert win.result().count == 0 and math.isnan(win.result().avg)
    win.extend([1, 2, 3, 4, 5])
    assert win.result().sum == 12.0
    win.close()


def test_closed_windows_refuse_appends_and_temporary_directories_go_away():
    import gc
    import os

    win = SlidingWindow(10.0, columns=COLS, value="v")
    path = win.directory
    win.append((0, 1.0, 1.0), 1.0)
    win.close()
    assert not os.path.exists(path)
    for call in (lambda: win.append((0, 1.0, 1.0), 2.0), lambda: win.extend([(0, 1.0, 1.0)], [2.0]),
                 win.result):
        with pytest.raises(ValueError, match="closed"):
            call()
    dropped = SlidingWindow(10.0, columns=COLS, value="v")
    path = dropped.directory
    del dropped
    gc.collect()
    assert not os.path.exists(path)


def test_long_streams_compact_the_block_table(tmp_path):
    win = SlidingWindow(20, kind="count", columns=COLS, value="v", block_size=64,
                        directory=tmp_path)  # 2 tuples a block
    for i in range(10_000):
        win.append((0, float(i), 1.0))
    assert win.result().sum == sum(range(9_980, 10_000))
    assert win._repo.table.base > 0  # the released prefix was compacted away
    assert win.memory_bytes()["block_table"] < 256 * 36
    win.close()
    again = SlidingWindow(20, kind="count", columns=COLS, value="v", block_size=64,
                          directory=tmp_path)
    again.extend([(0, 1.0, 1.0)] * 5)
    assert again.result().sum == sum(range(9_985, 10_000)) + 5
    again.close()


def test_extend_takes_a_generator_of_general_records():
    # regression: a count window of general records called len() on the batch
    win = SlidingWindow(3, kind="count")
    win.extend(f"r{i}" for i in range(5))
    assert win.result().count == 3
    numeric = SlidingWindow(3, kind="count", columns=("v",), value="v")
    numeric.extend((float(i),) for i in range(5))
    assert numeric.result().count == 3
    win.close()
    numeric.close()


def test_extend_refuses_records_and_timestamps_of_different_lengths():
    # regression: zip dropped the records past the shorter side, silently
    win = SlidingWindow(10.0)
    with pytest.raises(ValueError, match="3 records and 2 timestamps"):
        win.extend(["a", "b", "c"], [1.0, 2.0])
    assert win.result().count == 0
    win.extend(["a", "b"], [1.0, 2.0])
    assert win.result().count == 2
    win.close()
