"""Session 8 review of the quadtree and the command-line tools: regression tests.

Each test pins a defect found by probing (a brute-force scan as the model, a real manager over
a real disk level), so that it stays fixed.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.structures import PlainQuadtree

NAN = math.nan


def tiny(path) -> CacheConfig:
    return CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="lru"),
                       levels=(DiskConfig(path=str(path)),))


# -- quadtree: times ---------------------------------------------------------------------------

def test_a_nan_time_does_not_hide_older_points_from_prune_older():
    # NaN times are accepted (and come back as NaN); a NaN was taken as a subtree's time bound,
    # and after a prune the parent's bound skipped the NaN child, so a later prune_older
    # missed a point older than its t
    qt = PlainQuadtree((0, 0, 10, 10), capacity=2)
    qt.insert_many([(1.0, 1.0, "a", NAN), (1.5, 1.5, "b", 4.0), (8.0, 1.0, "c", 1.0),
                    (8.5, 1.0, "d", 6.0)])
    qt.verify()
    assert qt.prune_older(2.0) == 1
    assert qt.prune_older(5.0) == 1
    assert sorted(p.data for p in qt) == ["a", "d"]
    qt.verify()


TIMES = st.one_of(st.sampled_from([NAN, None, 0.0, 3.0]), st.integers(0, 9).map(float))
POINTS = st.tuples(st.integers(0, 16).map(float), st.integers(0, 16).map(float),
                   st.integers(0, 3), TIMES)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(POINTS, max_size=8), max_size=6),
       cuts=st.lists(st.integers(0, 10), max_size=4))
def test_prune_older_matches_a_scan_with_nan_and_missing_times(batches, cuts):
    qt = PlainQuadtree((0, 0, 16, 16), capacity=2, max_depth=4)
    model: list = []
    for batch, t in zip(batches, cuts + [None] * len(batches)):
        qt.insert_many(batch)
        model.extend(batch)
        qt.verify()
        if t is not None:
            keep = [p for p in model if not (p[3] is not None and p[3] < t)]
            assert qt.prune_older(t) == len(model) - len(keep)
            model = keep
            qt.verify()
        assert len(qt) == len(model)


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
