"""A ``ts`` that is not an event time is refused where it is passed, before any state changes
(it used to fail inside the policy after a put had already placed the value in the heap, which
then went over its bound; a NaN made an entry TAC never evicted)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mlcache import CacheConfig, CacheManager
from mlcache.config import DiskConfig, HeapConfig


@pytest.fixture()
def tac_cache(tmp_path):
    config = CacheConfig(heap=HeapConfig(max_entries=3, policy="tac"),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as cache:
        yield cache


BAD = [("x", TypeError), (None, None), (True, TypeError), ([1], TypeError),
       (float("nan"), ValueError), (np.float64("nan"), ValueError),
       (10**400, ValueError)]  # past the largest float: was a bare OverflowError


@pytest.mark.parametrize("ts,error", [b for b in BAD if b[1]])
def test_bad_ts_is_refused_before_any_change(tac_cache, ts, error):
    for i in range(3):
        tac_cache.put(i, i, ts=float(i))
    with pytest.raises(error, match="ts must"):
        tac_cache.put("b", 2, ts=ts)
    assert tac_cache.get("b") is None              # nothing was stored
    with pytest.raises(error, match="ts must"):
        tac_cache.get(0, ts=ts)                    # a hit
    with pytest.raises(error, match="ts must"):
        tac_cache.get("absent", ts=ts)             # a miss
    with pytest.raises(error, match="ts must"):
        tac_cache.get_many([0, 1], ts=ts)
    with pytest.raises(error, match="ts must"):
        tac_cache.hint(1, ts)
    ns = tac_cache.namespace("n")
    with pytest.raises(error, match="ts must"):
        ns.put("k", 1, ts=ts)
    with pytest.raises(error, match="ts must"):
        ns.get("k", ts=ts)
    with pytest.raises(error, match="ts must"):
        ns.get_many(["k"], ts=ts)
    # the heap still holds what it held, within its bound, and keeps evicting by ts
    for i in range(3, 10):
        tac_cache.put(i, i, ts=float(i))
    assert tac_cache.stats()["levels"]["heap"]["entries"] <= 3
    assert all(tac_cache.get(i) == i for i in range(10))


def test_numbers_of_any_real_type_are_event_times(tac_cache):
    for i, ts in enumerate([1, 2.5, np.int64(3), np.float32(4.0), math.inf]):
        tac_cache.put(i, i, ts=ts)
        assert tac_cache.get(i, ts=ts) == i
    tac_cache.hint(0, 10)
    assert tac_cache.get_many([0, 1], ts=np.float64(11.0)) == {0: 0, 1: 1}
