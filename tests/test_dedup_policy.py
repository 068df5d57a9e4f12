"""The dedup policy alone: the Policy contract, dirty order, whole-namespace flush, fairness."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlcache.policies import available_policies, get_policy
from mlcache.policies.dedup import DedupPolicy


def ns_key(ns: str, k: int) -> bytes:
    return ns.encode() + b"\x1f" + str(k).encode()


def test_registered_and_runs_in_the_simulator():
    from mlcache.sim.player import make_policy, play

    assert "dedup" in available_policies()
    assert get_policy("dedup") is DedupPolicy
    trace = [i % 7 for i in range(200)] + list(range(100))
    res = play(make_policy("dedup", 5), trace)
    lru = play(make_policy("lru", 5), trace)
    assert res.hits == lru.hits          # one namespace and nothing dirty: exactly LRU


def test_contract_capacity_victims_unknown_keys_weights():
    p = DedupPolicy(10)
    resident: dict = {}
    for i in range(40):
        w = 1 + i % 4
        victims = p.insert(i, w)
        resident[i] = w
        for v in victims:
            assert v in resident
            del resident[v]
            assert v not in p
        assert p.total_weight == sum(resident.values()) <= 10
        assert len(p) == len(resident)
    p.access("nope")
    p.remove("nope")
    assert p.insert("big", 11) == ["big"] and "big" not in p
    assert p.resize(3) and p.total_weight <= 3


def test_dirty_order_is_last_update_order_and_eviction_flushes_the_namespace():
    flushed = []
    p = DedupPolicy(4, flush_listener=lambda ns, keys: flushed.append((ns, keys)))
    a = [ns_key("a", i) for i in range(4)]
    for k in a:
        p.insert(k)
        p.mark_dirty(k)
    p.mark_dirty(a[0])                       # updated again: moves to the back
    p.insert(ns_key("b", 0))                 # no room: eldest of b is the newcomer, so a pays
    assert flushed == [(b"a\x1f", [a[1], a[2], a[3], a[0]])]
    assert p.dirty_count() == 0
    p.insert(ns_key("a", 9))
    assert len(flushed) == 1                 # a clean eldest leaves without a flush


def test_tombstone_and_restore():
    p = DedupPolicy(8)
    k1, k2, k3 = (ns_key("n", i) for i in range(3))
    for k in (k1, k2):
        p.insert(k)
        p.mark_dirty(k)
    p.delete(k1)
    assert k1 not in p and p.is_dirty(k1)
    cut = p.take_dirty(b"n\x1f")
    assert cut == [k2, k1] and not p.is_dirty(k2)
    p.insert(k3)
    p.mark_dirty(k3)
    p.mark_dirty(k1)                          # updated again after the cut
    p.restore_dirty(b"n\x1f", cut)
    assert p.take_dirty(b"n\x1f") == [k2, k3, k1]


def test_resize_evicts_round_robin_across_namespaces():
    p = DedupPolicy(60)
    for ns in ("a", "b", "c"):
        for i in range(20):
            p.insert(ns_key(ns, i))
    victims = p.resize(30)
    per = {ns: sum(1 for v in victims if v.startswith(ns.encode())) for ns in "abc"}
    assert sum(per.values()) == 30 and max(per.values()) - min(per.values()) <= 1


def test_insert_evicts_from_the_growing_namespace():
    p = DedupPolicy(10)
    for i in range(5):
        p.insert(ns_key("quiet", i))
    for i in range(50):
        p.insert(ns_key("busy", i))
    assert all(ns_key("quiet", i) in p for i in range(5))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("iamdrx"), st.sampled_from("abc"),
                          st.integers(0, 15), st.integers(1, 5)), max_size=200),
       st.integers(1, 20))
def test_capacity_never_exceeded_and_dirty_keys_are_flushed_before_they_leave(ops, cap):
    flushed: list = []
    p = DedupPolicy(cap, flush_listener=lambda ns, keys: flushed.extend(keys))
    dirty: set = set()
    for op, ns, k, w in ops:
        key = ns_key(ns, k)
        flushed.clear()
        if op == "i":
            victims = p.insert(key, w)
        elif op == "a":
            p.access(key)
            victims = []
        elif op == "m":
            p.mark_dirty(key)
            dirty.add(key)
            victims = []
        elif op == "d":
            p.delete(key)
            dirty.add(key)
            victims = []
        elif op == "r":
            victims = p.resize(max(1, w * 3))
        else:
            p.remove(key)
            victims = []
        for v in victims:
            if v in dirty and v != key:
                assert v in flushed           # never leaves dirty without its flush
        dirty -= set(flushed)
        assert p.total_weight <= p.capacity
        assert len(p) == len(list(p.keys()))
        assert {k for k in dirty} == {k for sp in p._spaces.values() for k in sp.dirty}
