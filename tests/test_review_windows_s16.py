"""Differential review of sliding windows (session 16): regression tests for the defects found
by driving SlidingWindow / SharedWindows against an in-memory list of the window's events."""
from __future__ import annotations

import pytest

from mlcache.structures import SharedWindows, SlidingWindow


@pytest.mark.parametrize("how", ["append", "extend", "late", "shared"])
def test_a_general_record_reused_by_the_caller_is_kept_as_it_was_appended(how):
    # a dict reused for each record (rec["v"] = x; append(rec)) is a common pattern; the
    # window held the caller's object, so every tuple of the recent block (and every late
    # tuple) took the last value before the aggregates were taken: sum 90, not 45
    if how == "shared":
        win = SharedWindows([100.0, 5.0], value="v", block_size=4096)
    else:
        win = SlidingWindow(100.0, value="v", block_size=4096, lateness=50.0)
    rec = {"v": 0}
    if how == "extend":
        for i in range(10):
            rec["v"] = i
            win.extend([rec], [float(i)])
    else:
        for i in range(10):
            rec["v"] = i
            win.append(rec, ts=float(20 - i if how == "late" else i))
    rec["v"] = 1000
    got = win.results()[0] if how == "shared" else win.result()
    assert (got.count, got.sum) == (10, 45.0)
    win.close()


@pytest.mark.parametrize("how", ["append", "extend", "late"])
def test_an_unhashable_group_key_is_refused_at_append_and_the_window_continues(how):
    # the key was read only when the block's aggregates were taken: append accepted a record
    # grouped by a dict, and that seal / result and every later one raised TypeError
    win = SlidingWindow(10.0, value="v", group_by=lambda r: r["g"], block_size=256,
                        lateness=5.0)
    win.append({"v": 1, "g": "a"}, ts=3.0)
    bad = {"v": 2, "g": {"nested": 1}}
    with pytest.raises(ValueError, match="group keys must be hashable"):
        if how == "extend":
            win.extend([{"v": 5, "g": "b"}, bad], [4.0, 4.0])
        else:
            win.append(bad, ts=1.0 if how == "late" else 4.0)
    with pytest.raises(KeyError):   # the caller's own function failing reaches the caller
        win.append({"v": 2}, ts=4.0)
    win.append({"v": 3, "g": ["x", 1]}, ts=5.0)   # a list is a key (as a tuple)
    got = win.result()
    assert {k: a.sum for k, a in got.items()} == {"a": 1.0, ("x", 1): 3.0}
    win.close()


@pytest.mark.parametrize("how", ["append", "extend", "general", "general-extend"])
def test_a_timestamp_too_large_for_the_slide_is_refused_not_a_hang(how):
    # floats near 2e16 are 4 apart: the next boundary (k + 1) * 1.0 rounded back to k * 1.0,
    # so the loop emitting boundaries before the tuple never ended (on_slide at 2e16 for ever)
    slides = []

    def on_slide(end, result):
        slides.append(end)
        if len(slides) > 100:
            raise RuntimeError(f"on_slide called {len(slides)} times, last at {end!r}")

    general = how.startswith("general")
    opts = {} if general else {"columns": ("v",)}
    win = SlidingWindow(10.0, value=(lambda r: r) if general else "v", slide=1.0,
                        on_slide=on_slide, **opts)
    rec = 1.0 if general else (1.0,)
    for t in (1.0, 2.0, 3.0):
        win.append(rec, ts=t)
    before = win.result()
    with pytest.raises(ValueError, match="too large for slide"):
        if how.endswith("extend"):
            win.extend([rec, rec], [4.0, 2e16])
        else:
            win.append(rec, ts=2e16)
    assert win.result() == before and slides == [1.0, 2.0]
    win.append(rec, ts=4.5)   # the window goes on
    assert slides == [1.0, 2.0, 3.0, 4.0] and win.result().count == 4
    win.close()


@pytest.mark.parametrize("kind", ["time", "count"])
@pytest.mark.parametrize("bad", [5.0, [7.0], (7.0,), "123", b"123"],
                         ids=["number", "list-of-one", "one", "string", "bytes"])
def test_a_numeric_record_short_of_columns_is_refused_not_broadcast(kind, bad):
    # numpy's row store copied a number, or a record of one number, into every column:
    # (7.0,) on ("g", "v", "w") became group 7, value 7, weight 7
    win = SlidingWindow(10, kind=kind, columns=("g", "v", "w"), value="v", weight="w",
                        group_by="g")
    win.append((1.0, 2.0, 3.0), ts=1.0)
    with pytest.raises(ValueError, match=r"3 numbers \('g', 'v', 'w'\)"):
        win.append(bad, ts=2.0)
    assert {g: (a.count, a.sum) for g, a in win.result().items()} == {1: (1, 6.0)}
    one = SlidingWindow(10, kind=kind, columns=("v",), value="v")   # one column: a number is
    one.append(5.0, ts=1.0)                                          # a record, as before
    one.append((6.0,), ts=2.0)
    with pytest.raises(ValueError):
        one.append("7", ts=3.0)   # text is not a number, even of the right length
    assert (one.result().count, one.result().sum) == (2, 11.0)
    win.close()
    one.close()


@pytest.mark.parametrize("numeric", [True, False])
def test_a_close_that_fails_on_a_full_disk_can_be_retried(tmp_path, monkeypatch, numeric):
    # close() marked the window closed before writing it: when a block write failed (a full
    # disk) the retry returned at once, no metadata was written, and the window reopened on
    # the directory was empty (every tuple since the previous close lost)
    import errno
    import os

    opts = dict(kind="count", block_size=64, directory=tmp_path / "w")
    opts.update(columns=("v",), value="v") if numeric else opts.update(value=0)
    win = SlidingWindow(100, **opts)
    for i in range(40):
        win.append((float(i),) if numeric else [i])
    write = os.pwrite

    def full_disk(fd, buf, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(OSError):
        win.close()
    monkeypatch.setattr(os, "pwrite", write)
    win.append((40.0,) if numeric else [40])   # still open
    win.close()
    again = SlidingWindow(100, **opts)
    assert (again.result().count, again.result().sum) == (41, float(sum(range(41))))
    again.close()


@pytest.mark.parametrize("kind", ["time", "count"])
def test_one_large_extend_does_not_grow_the_data_file_beyond_the_window(kind):
    # extend sealed a whole batch before expiring anything, so every block of the batch took
    # a data-file slot: 200,000 ticks into a window of a few blocks left a 780-slot file (and
    # 780 block writes), where appending them, or extending in small batches, keeps ~8
    import numpy as np

    win = SlidingWindow(1000, kind=kind, columns=("v",), value="v", block_size=4096)
    ts = np.arange(200_000, dtype=float)
    win.extend(ts.reshape(-1, 1), ts)
    got = win.result()
    assert (got.count, got.sum) == (1000, float(ts[-1000:].sum()))
    stats = win.io_stats()
    assert stats["file_slots"] <= 1000 // stats["block_capacity"] + 3, stats
    win.close()


@pytest.mark.parametrize("ranges", [5, None, "60"])
def test_shared_windows_name_ranges_that_are_not_a_list(ranges):
    # SharedWindows(60) (one range, as SlidingWindow takes it) was a TypeError "'int' object
    # is not iterable", naming nothing; "60" was taken as the ranges "6" and "0"
    from mlcache.errors import ConfigError

    with pytest.raises(ConfigError, match="ranges"):
        SharedWindows(ranges)


@pytest.mark.parametrize("shared", [False, True])
def test_min_max_state_is_bounded_by_the_window_between_results(shared):
    # the min/max deques dropped the entries of passed blocks only when a result was read: a
    # rising value never pops the min deque from the back, so until the next result() it grew
    # with the stream (a 100-tuple window: 25,000 entries, 1.6 MB, after 100,000 tuples)
    import numpy as np

    opts = dict(kind="count", columns=("v",), value="v", minmax=True, block_size=64)
    win = SharedWindows([100, 40], **opts) if shared else SlidingWindow(100, **opts)
    for k in range(0, 20_000, 1000):
        win.extend(np.arange(k, k + 1000, dtype=float).reshape(-1, 1))
    assert win.memory_bytes()["group_state"] < 20_000, win.memory_bytes()
    got = win.results()[0] if shared else win.result()
    assert (got.count, got.min, got.max) == (100, 19_900.0, 19_999.0)
    win.close()


def test_extend_after_an_on_slide_failure_on_a_grouped_count_window():
    # on_slide raising left a count window's boundary due; the next extend stored an empty
    # slice before it, and a grouped window failed on it, that extend and every later one,
    # with numpy's "zero-size array to reduction operation maximum"
    import numpy as np

    calls = []

    def on_slide(end, result):
        calls.append(end)
        if len(calls) == 1:
            raise RuntimeError("sink down")

    win = SlidingWindow(10, kind="count", slide=5, on_slide=on_slide, columns=("g", "v"),
                        value="v", group_by="g")
    for i in range(4):
        win.append((0.0, float(i)))
    with pytest.raises(RuntimeError):
        win.append((0.0, 4.0))
    win.extend(np.array([[0.0, 5.0], [1.0, 6.0]]))
    assert calls == [5, 5]   # the boundary that was due is reported, then the batch goes in
    assert {g: a.count for g, a in win.result().items()} == {0: 6, 1: 1}
    win.close()


def test_shared_windows_read_a_block_once_when_a_batch_spans_more_than_the_pool():
    # each window was expired in turn over the whole batch: the first, running ahead over
    # more blocks than the pool holds, evicted them before the next window read them, so two
    # equal windows read every block twice through extend (SSM's sharing lost); block by
    # block in turn, they read it once, as one window does
    import numpy as np

    ts = np.arange(20_000, dtype=float)
    opts = dict(columns=("v",), value="v", block_size=256, buffer_blocks=6)
    one = SlidingWindow(2000.0, **opts)
    two = SharedWindows([2000.0, 2000.0], **opts)
    for win in (one, two):
        for i in range(0, len(ts), 500):
            win.extend(ts[i:i + 500].reshape(-1, 1), ts[i:i + 500])
    assert [r.count for r in two.results()] == [one.result().count] * 2 == [2000, 2000]
    assert two.io_stats()["reads"] <= one.io_stats()["reads"] + 1, (two.io_stats(),
                                                                     one.io_stats())
    one.close()
    two.close()
