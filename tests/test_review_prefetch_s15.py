"""Session 15 differential review of keyed prefetching's read path (split reads, staged reads,
the lookahead operator, the hot-key filter) and of held ("lent") values: the same programs
run against a plain dict of expected state and against mlcache with a heap of a few entries
(everything evicted and read back), a real redis-server and disk in tmp dirs, compared after
every step."""
from __future__ import annotations

import time
import uuid

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig, RedisConfig


class _Operator:
    """Something to attach: the prefetcher stages reads only while an operator is attached."""


def _ns() -> str:
    return "s15" + uuid.uuid4().hex[:8]


def _lent_and_changed(m, key):
    """Put ``key`` (flushed: clean below), hold it, evict it: it is lent; then change it in
    place. Returns the held object."""
    m.put(key, [1])
    for i in range(12):
        m.put(("o", i), [i])
    m.flush()
    held = m.get(key)
    for i in range(12):
        m.get(("o", i))
    kb = m._kb(key)
    assert kb not in m._data and kb in m._cold.loans
    held.append(2)          # after its eviction: the key's value is now [1, 2], as in a dict
    return held


@pytest.mark.parametrize("mode", ["split", "threads"])
def test_a_staged_prefetch_never_installs_the_older_copy_over_a_held_value(
        redis_url, tmp_path, mode):
    # Regression: the staged reads' claim, stage and install checked residency, deletes, the
    # eviction buffer and the write sequence, but not the loans: a key lent to its holder
    # (evicted while held, then changed in place) was read from below, and that older copy
    # installed in the heap. The next get returned [1], not the held object, and a flush then
    # wrote [1, 2] below while the heap kept serving [1].
    ns = _ns()
    level = RedisConfig(url=redis_url, prefix=ns) if mode == "split" else \
        DiskConfig(path=str(tmp_path / "d"))
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=4, max_bytes=None),
                      levels=(level,), namespace=ns,
                      prefetch=PrefetchConfig(fetch_mode="auto" if mode == "split" else "threads"))
    with CacheManager(cfg) as m:
        held = _lent_and_changed(m, "card")
        kb = m._kb("card")
        pf = m._get_prefetcher()
        op = _Operator()
        split, _ = pf.attach(op)
        assert split == (mode == "split")
        pf.hint(kb, 1e12)
        if split:
            assert pf.pump(None, 1)
            pf.poll_read(block=True)
        else:
            for _ in range(500):                   # the fetch thread reads and stages it
                if not pf._buffer.pending and not pf._buffer.inflight:
                    break
                time.sleep(0.01)
        pf.install(100)
        got = m.get("card")
        assert got == [1, 2] and got is held
        pf.detach(op)
        m.flush()
        assert m.get("card") == [1, 2]
    with CacheManager(cfg) as again:
        assert again.get("card") == [1, 2]
