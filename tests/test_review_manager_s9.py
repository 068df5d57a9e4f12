"""Regression tests of the session-9 review of the manager's key/value API and data path
(mlcache/manager.py, _readpath, _writepath, levels/heap.py, stats): real levels only (disk in
tmp dirs, Redis from the tests' fixture)."""
from __future__ import annotations

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.levels.heap import estimate_size

_BUDGET = 1 << 20


def _resident_memory(m: CacheManager) -> int:
    """What the heap's resident values take as objects (the heap's own estimate)."""
    return sum(estimate_size(v) for v in m._heap.data.values())


def _grown_in_place(tmp_path, dirty: bool) -> None:
    config = CacheConfig(heap=HeapConfig(max_bytes=_BUDGET),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as m:
        values = {}
        for i in range(20):
            values[i] = []
            m.put(i, values[i])
        if not dirty:
            m.flush()   # clean now; the changes below are made to values got from the heap
        for i in range(20):
            value = values[i] if dirty else m.get(i)
            value.extend(range(i * 10_000, i * 10_000 + 5_000))   # ~200 KB as objects
        m.flush()
        heap = m.stats()["levels"]["heap"]
        # the accounted bytes follow the values as they are now, and the budget holds
        assert heap["bytes"] <= _BUDGET
        assert _resident_memory(m) <= _BUDGET, (heap, _resident_memory(m))
    with CacheManager(config) as again:   # and nothing was lost on the way
        for i in range(20):
            assert again.get(i) == list(range(i * 10_000, i * 10_000 + 5_000))


def test_clean_value_grown_in_place_is_weighed_again_at_flush(tmp_path):
    # A value got from the heap and grown in place kept the weight it was loaded with: 20
    # values of ~200 KB sat in a 1 MiB heap (4 MB as objects) while stats() said ~15 KB, and
    # nothing was ever evicted for them.
    _grown_in_place(tmp_path, dirty=False)


def test_dirty_value_grown_after_put_is_weighed_again_at_flush(tmp_path):
    # The same for a value changed after its put(), before the flush that writes it.
    _grown_in_place(tmp_path, dirty=True)

