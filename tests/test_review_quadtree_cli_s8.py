"""Session 8 review of the quadtree and the command-line tools: regression tests.

Each test pins a defect found by probing (a brute-force scan as the model, a real manager over
a real disk level), so that it stays fixed.
"""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig


def tiny(path) -> CacheConfig:
    return CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="lru"),
                       levels=(DiskConfig(path=str(path)),))


# -- quadtree: times ---------------------------------------------------------------------------

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
