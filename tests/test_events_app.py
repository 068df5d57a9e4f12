"""The event-detection application of ``mlcache bench events`` (DEBS'22) as a test: the same
events with the interval trees as plain objects and in a cache whose heap holds a fraction of
them, the planted bursts found and the one-interval decoys rejected."""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.bench.events import (BOUNDS, EventDetector, hashtag, match_planted,
                                  synthetic_stream)
from mlcache.structures import PlainQuadtree

HISTORY = 6


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(14, 1200, 2, 2, history=HISTORY, seed=11)


def detect(posts, new_tree):
    det = EventDetector(new_tree, history=HISTORY, min_posts=100, batch=500)
    for t, batch in enumerate(posts):
        det.process(t, batch)
    return det.finish()


def test_hashtag_prefers_the_tag_then_the_first_keyword():
    assert hashtag("Some words #Storm at the pier!") == "storm"
    assert hashtag("the an quick fox") == "quick"
    assert hashtag("# . !") == ""


@pytest.mark.parametrize("levels", ["disk", "redis"])
def test_events_are_the_same_with_the_trees_in_a_small_heap(stream, levels, tmp_path, request):
    posts, planted, decoys = stream
    plain = detect(posts, lambda t: PlainQuadtree(BOUNDS, capacity=64, max_depth=14))
    assert len(match_planted(plain, planted)) == len(planted)
    assert match_planted(plain, decoys) == []
    lower = ((DiskConfig(path=str(tmp_path / "d")),) if levels == "disk"
             else (RedisConfig(url=request.getfixturevalue("redis_url")),))
    # a heap of ~200 KB: a fraction of one interval's tree, so nearly every batch evicts
    config = CacheConfig(heap=HeapConfig(max_bytes=200_000, policy="lru"), levels=lower,
                         namespace=f"events-{levels}")
    with CacheManager(config) as m:
        cached = detect(posts, lambda t: m.quadtree(f"interval-{t}", BOUNDS, capacity=64,
                                                    max_depth=14))
        stats = m.stats()["levels"]["heap"]
        assert stats["evictions"].get("dirty", 0) > 0
        assert stats["bytes"] <= 200_000
        # the window rolled: only the last HISTORY + 1 trees are left
        left = [name for kind, name in m.namespace("mlcache.structures").keys()
                if kind == "quadtree"]
        assert len(left) == HISTORY + 1
    assert cached == plain
