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
