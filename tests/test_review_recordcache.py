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
