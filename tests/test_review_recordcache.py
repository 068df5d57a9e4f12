"""Regression tests of defects found reviewing the record cache (session 6)."""
from __future__ import annotations

from mlcache import CacheConfig, CacheManager, DedupConfig, DiskConfig


def make(tmp_path, **dedup):
    return CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),),
                                    namespace="t", dedup=DedupConfig(**dedup)))


def test_heap_only_record_cache_forwards_and_flushes():
    # With no level below the heap there is no store write: the forwarded entries are done.
    # The record cache queued them to a write-back buffer with no level (an IndexError after
    # the listener took the batch, on every flush, and close() failed the same way).
    m = CacheManager(CacheConfig(levels=(), dedup=DedupConfig()))
    out = []
    m.on_flush(out.extend)
    m.put("a", 1)
    m.put("a", 2)
    m.put("b", 1)
    m.flush()
    assert out == [("a", 2, None), ("b", 1, None)]
    assert m.get("a") == 2 and m.stats()["dedup"]["dirty"] == 0
    m.put("a", 3)
    m.close()
    assert out[-1] == ("a", 3, 2)


def test_event_time_commit_after_an_infinite_ts_keeps_deduplicating(tmp_path):
    # ts=inf is a valid event time; the next interval boundary came out NaN (inf // s), no ts
    # compares below NaN, so every later write committed: one batch per write, no dedup.
    m = make(tmp_path, commit_interval=60, time="event")
    out = []
    m.on_flush(lambda batch: out.append(sorted(batch)))
    m.put("a", 1, ts=0)
    m.put("a", 2, ts=float("inf"))            # enters a new interval: minute 0 is committed
    for i in range(5):
        m.put("b", i, ts=float("inf"))         # the same (last) interval: no commit
    assert out == [[("a", 1, None)]]
    m.flush()
    assert out[-1] == [("a", 2, 1), ("b", 4, None)]
    m.close()
    m = make(tmp_path, commit_interval=60, time="event")
    m.on_flush(lambda batch: out.append(sorted(batch)))
    m.put("c", 1, ts=-float("inf"))
    m.put("c", 2, ts=-float("inf"))
    m.put("c", 3, ts=5)                        # a later interval than -inf's
    assert out[-1] == [("c", 2, None)]
    m.close()


def test_failed_event_time_commit_is_retried_by_the_next_write(tmp_path):
    # The commit of minute 0 failed (the listener raised into the put that entered minute 1),
    # but the boundary had already moved on: no later write retried it, minute 0's final value
    # was overwritten by minute 1's writes and never forwarded.
    m = make(tmp_path, commit_interval=60, time="event")
    out = []
    down = [False]

    def sink(batch):
        if down[0]:
            raise ConnectionError("sink unavailable")
        out.append(sorted(batch))

    m.on_flush(sink)
    m.put("a", 1, ts=0)
    m.put("a", 2, ts=30)
    down[0] = True
    try:
        m.put("a", 3, ts=61)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the failed commit must reach the put")
    assert m.get("a") == 2                   # the put that raised was not applied
    down[0] = False
    m.put("a", 3, ts=62)                     # the caller retries: minute 0 is committed first
    m.put("a", 4, ts=70)
    m.put("a", 5, ts=125)
    assert out == [[("a", 2, None)], [("a", 4, 2)]]
    m.close()
