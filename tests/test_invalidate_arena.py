"""invalidate_local() forgets an arena's clean copies too (an arena is process memory), and
never the copies of an arena that is the last level (they are the only ones).

Session 8: the coherence recipe (two processes on one shared level, invalidate_local before
reading what the other wrote) read stale values through an arena above the shared level, because
invalidate_local dropped heap copies only; the Spark integration's workaround deleted an arena's
entries even when the arena was the last level, losing them."""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.config import ArenaConfig


def _arena(**kw):
    return ArenaConfig(max_bytes=1 << 20, **kw)


def test_two_managers_over_one_disk_read_each_others_writes_through_an_arena(tmp_path):
    cfg = CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None),
                      levels=(_arena(), DiskConfig(path=str(tmp_path / "d"))))
    first, second = CacheManager(cfg), CacheManager(cfg)
    try:
        for i in range(50):
            second.put(i, "old")
        second.checkpoint()      # second's arena and the disk hold "old"
        first.invalidate_local()
        assert all(first.get(i) == "old" for i in range(50))
        for i in range(50):
            first.put(i, "new")
        first.checkpoint()
        assert second.invalidate_local() >= 50
        assert [second.get(i) for i in range(50)] == ["new"] * 50
    finally:
        first.close()
        second.close()


def test_arena_copies_not_yet_copied_down_are_kept(tmp_path):
    cfg = CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None),
                      levels=(_arena(), DiskConfig(path=str(tmp_path / "d"))))
    with CacheManager(cfg) as m:
        for i in range(20):
            m.put(i, i)
        m.flush()            # into the arena only: newer than the disk
        m.invalidate_local()
        assert [m.get(i) for i in range(20)] == list(range(20))


def _spark_drop_local(m, namespace):
    from integrations.spark._executor import drop_local

    drop_local(m, namespace)


@pytest.mark.parametrize("forget", [lambda m, ns: m.invalidate_local(ns), _spark_drop_local],
                         ids=["invalidate_local", "spark_drop_local"])
def test_an_arena_that_is_the_last_level_keeps_its_entries(tmp_path, forget):
    cfg = CacheConfig(heap=HeapConfig(max_entries=2, max_bytes=None), levels=(_arena(),))
    with CacheManager(cfg) as m:
        ns = m.namespace("s")
        for i in range(10):
            ns.put(i, i)
        m.checkpoint()
        forget(m, "s")
        assert [ns.get(i) for i in range(10)] == list(range(10))
