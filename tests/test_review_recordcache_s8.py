"""Regression tests of defects found reviewing the record cache and metrics (session 8)."""
from __future__ import annotations

from mlcache import CacheConfig, CacheManager, DedupConfig, DiskConfig


def make(tmp_path, **dedup):
    return CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),),
                                    namespace="t", dedup=DedupConfig(**dedup)))


def test_values_heavier_than_the_budget_are_not_held_until_the_next_flush(tmp_path):
    # A value too heavy for the heap was written down but its live object was also held by
    # the record cache until the next flush: 500 puts of 100 kB with a 4 kB budget held 50 MB.
    # Like Kafka's eviction of a dirty eldest, it now flushes its namespace at once.
    m = make(tmp_path, max_bytes_buffering=4096)
    out = []
    m.on_flush(lambda batch: out.extend(batch))
    m.put("small", 1)
    for i in range(50):
        m.put(i, b"x" * 100_000)
        assert m.stats()["dedup"]["held"] == 0
    assert [k for k, _, _ in out][:2] == ["small", 0]      # the namespace's whole dirty set
    assert len(out) == 51 and m.stats()["dedup"]["dirty"] == 0
    m.flush()
    assert len(out) == 51                                    # forwarded once
    assert m.get(7) == b"x" * 100_000
    m.close()


def test_deletes_do_not_hold_old_values_past_the_budget(tmp_path):
    # A delete keeps the value last flushed (its old value) until the key is forwarded, but
    # a tombstone takes no room in the heap, so deletes never evicted and never flushed:
    # deleting 300 stored keys of 100 kB with a 1 MiB budget held 30 MB of old values.
    m = make(tmp_path, max_bytes_buffering=1 << 20)
    for i in range(300):
        m.put(i, bytes(100_000))
    m.close()
    m = make(tmp_path, max_bytes_buffering=1 << 20)
    out = []
    m.on_flush(lambda batch: out.extend(batch))
    for i in range(300):
        m.delete(i)
        assert len(m._records._old) <= 11     # 1 MiB of 100 kB old values, and the one cut
    m.flush()
    assert sorted(k for k, _, _ in out) == list(range(300))          # each delete once
    assert all(new is None and old == bytes(100_000) for _, new, old in out)
    assert m.get(5) is None
    m.close()


def test_updates_do_not_hold_old_values_past_the_budget(tmp_path):
    # An update keeps the value last flushed until the key is forwarded, outside the heap's
    # count: 300 stored values of 100 kB replaced by small ints (1 MiB budget) held 30 MB.
    m = make(tmp_path, max_bytes_buffering=1 << 20)
    for i in range(300):
        m.put(i, bytes(100_000))
    m.close()
    m = make(tmp_path, max_bytes_buffering=1 << 20)
    out = []
    m.on_flush(lambda batch: out.extend(batch))
    for i in range(300):
        m.put(i, i)
        assert len(m._records._old) <= 11
    m.flush()
    assert sorted(k for k, _, _ in out) == list(range(300))          # each update once
    assert all(new == k and old == bytes(100_000) for k, new, old in out)
    m.close()


def test_skip_unchanged_forwards_a_value_changed_in_place(tmp_path):
    """A dict changed in place and put again arrives as ``old is new``; ForwardingSink's
    skip_unchanged took that for "unchanged" and dropped the change silently."""
    from mlcache import CacheConfig, CacheManager, DiskConfig, ForwardingSink, HeapConfig

    rows = []
    sink = ForwardingSink(rows.extend, skip_unchanged=True)
    cfg = CacheConfig(heap=HeapConfig(policy="dedup"), levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(cfg) as cache:
        cache.on_flush(sink)
        state = {"n": 1}
        cache.put("k", state)
        cache.flush()
        state["n"] = 2
        cache.put("k", state)
        cache.put("same", 5)
        cache.flush()
        cache.put("same", 5)          # an int put again: unchanged, skipped
        cache.flush()
    assert [(k, dict(v)) for k, v, _ in rows if k == "k"] == [("k", {"n": 2}), ("k", {"n": 2})]
    assert [r for r in rows if r[0] == "same"] == [("same", 5, None)]
    assert sink.skipped == 1
