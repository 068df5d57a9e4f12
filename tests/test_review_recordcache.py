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
    out.clear()
    m = make(tmp_path, commit_interval=float("inf"), time="event")   # one interval: no commit
    m.on_flush(lambda batch: out.append(sorted(batch)))
    for ts in (-5.0, -3.0, 0.0, 1e300):
        m.put("d", ts, ts=ts)
    assert out == []
    m.close()
    assert out == [[("d", 1e300, None)]]


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


def _two_listeners(m, during_b):
    """Listener a takes every batch; b fails once, after running ``during_b`` (what another
    thread may do while the listeners run outside the lock; done here from b itself, which
    gives the same state deterministically)."""
    seen_a, seen_b = [], []
    failed = [False]

    def a(batch):
        seen_a.extend(batch)

    def b(batch):
        if not failed[0]:
            failed[0] = True
            during_b()
            raise ConnectionError("b down")
        seen_b.extend(batch)

    m.on_flush(a)
    m.on_flush(b)
    return seen_a, seen_b


def test_update_during_a_failed_flush_reaches_every_listener(tmp_path):
    # a took k=1; k was updated to 2 while b ran; b raised. a was remembered as having taken
    # k's record, so the retry gave k=2 to b only: a never saw k's current value.
    m = make(tmp_path)
    seen_a, seen_b = _two_listeners(m, lambda: m.put("k", 2))
    m.put("k", 1)
    try:
        m.flush()
    except ConnectionError:
        pass
    m.flush()
    assert seen_a[0] == ("k", 1, None) and seen_a[-1][:2] == ("k", 2)
    assert seen_b == [("k", 2, None)]
    m.close()


def test_delete_cut_during_a_failed_flush_is_forwarded(tmp_path):
    # k=1 was being forwarded; k was deleted and that delete cut (queued) while b ran; b raised.
    # The restore kept the first record's value (k=1) and skipped the later one, so the retry
    # forwarded k=1 again instead of the delete, to b only.
    m = make(tmp_path)

    def delete_and_cut():
        m.delete("k")
        m.flush()           # nested: cuts the delete, the running loop would deliver it

    seen_a, seen_b = _two_listeners(m, delete_and_cut)
    m.put("k", 1)
    try:
        m.flush()
    except ConnectionError:
        pass
    m.flush()
    assert seen_a[0] == ("k", 1, None) and seen_a[-1][:2] == ("k", None)
    assert seen_b == [("k", None, None)]
    assert m.get("k") is None
    m.close()


def test_listener_registered_twice_gets_both_deliveries_after_a_failure(tmp_path):
    # One function on a namespace and on the manager is called twice per batch. Its first call
    # took the batch, its second raised; the retry skipped it altogether (remembered by id).
    m = make(tmp_path)
    ns = m.namespace("n")
    got = []
    calls = [0]

    def f(batch):
        calls[0] += 1
        if calls[0] == 2:
            raise ConnectionError("second delivery failed")
        got.append(list(batch))

    ns.on_flush(f)
    m.on_flush(f)
    ns.put("a", 1)
    try:
        m.flush()
    except ConnectionError:
        pass
    m.flush()
    assert got == [[("a", 1, None)], [("a", 1, None)]]
    m.close()


def test_sink_counts_a_skipped_record_once_across_a_retry():
    # The skipped counter grew before fn ran; when fn raised, the retry skipped the same
    # records again and counted them twice (records and batches count only accepted calls).
    from mlcache import ForwardingSink

    calls = [0]

    def fn(rows):
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionError("sink unavailable")

    sink = ForwardingSink(fn, skip_unchanged=True, deletes=False)
    records = [("a", 1, 1), ("b", 2, None), ("c", None, 3)]
    try:
        sink.forward(records)
    except ConnectionError:
        pass
    assert sink.skipped == 0 and sink.records == 0
    assert sink.forward(records) == 1
    assert (sink.skipped, sink.records, sink.batches) == (2, 1, 1)


def test_stats_reads_the_dirty_sets_under_the_manager_lock(tmp_path):
    # manager.stats() calls the record cache's stats() after releasing its lock; counting the
    # dirty keys walked the policy's namespace table while other threads' first writes to a
    # namespace added to it: "dictionary changed size during iteration" in whoever polled
    # stats() (an exporter thread). The count is taken under the manager lock now.
    m = make(tmp_path)
    policy = m._records.policy
    owned = []
    count = policy.dirty_count

    def dirty_count():
        owned.append(m._lock._is_owned())
        return count()

    policy.dirty_count = dirty_count
    m.namespace("n").put("k", 1)
    assert m.stats()["dedup"]["dirty"] == 1
    assert owned == [True]
    m.close()


def test_store_failure_while_forwarding_leaves_the_rest_of_the_cut_pending():
    # A chunk forwarded, its writes queued, the write-back buffer full and the store (Redis)
    # down: make_room() raised between two chunks. The cut had left the queue, so its other
    # chunks were neither forwarded nor dirty any more: a retry never forwarded them.
    from mlcache import RedisConfig
    from mlcache._redis_server import RedisServer

    server = RedisServer().start()
    try:
        m = CacheManager(CacheConfig(levels=(RedisConfig(url=server.url),), namespace="t",
                                     eviction_buffer_max=16, retry_attempts=1,
                                     retry_backoff=0.0,
                                     dedup=DedupConfig(batch_size=4)))
        out = []
        m.on_flush(out.extend)
        for i in range(100):
            m.put(i, i)
        server.stop()
        try:
            m.flush()
        except Exception:
            pass
        else:
            raise AssertionError("the store is down: the flush must fail")
        assert len(out) < 100
        server = RedisServer(port=server.port).start()
        m.flush()
        assert sorted(k for k, _, _ in out) == list(range(100))
        assert len(out) == 100                        # each record forwarded once
        m.close()
    finally:
        server.stop()


def test_sink_refuses_a_record_that_is_not_a_key_new_old_triple():
    # A 3-character string unpacked as (key, new, old) and went to fn; a wrong-length record
    # (or one record passed instead of a list) failed with a bare unpacking error.
    import pytest

    from mlcache import ForwardingSink

    got = []
    sink = ForwardingSink(got.extend)
    for records in (["abc"], [("a", 1)], ("a", 1, None), [b"xyz"]):
        with pytest.raises(TypeError, match=r"\(key, new, old\)"):
            sink.forward(records)
    assert got == [] and sink.records == 0
    assert sink.forward([("a", 1, None), ["b", 2, 1]]) == 2
