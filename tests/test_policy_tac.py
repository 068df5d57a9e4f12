"""TAC's eviction order against a brute-force reference (lazy renewal must not change it)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlcache.policies.lru import LRUPolicy
from mlcache.policies.tac import TACPolicy


class Reference:
    """TAC by definition: every entry has (ts, arrival seq); evict the smallest, O(n) each."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.entries = {}   # key -> [ts, seq, weight]
        self.seq = 0
        self.now = None

    def _time(self, ts):
        if ts is None:
            return 0.0 if self.now is None else self.now
        if self.now is None or ts > self.now:
            self.now = ts
        return ts

    def _stamp(self, entry, t):
        self.seq += 1
        entry[0], entry[1] = t, self.seq

    def access(self, key, ts=None):
        e = self.entries.get(key)
        if e is None:
            return
        t = self._time(ts)
        if t >= e[0]:
            self._stamp(e, t)

    def hint(self, key, ts):
        e = self.entries.get(key)
        if e is not None and ts > e[0]:
            self._stamp(e, ts)

    def advance(self, ts):
        if self.now is None or ts > self.now:
            self.now = ts

    def insert(self, key, weight=1, ts=None):
        e = self.entries.get(key)
        if e is not None:
            e[2] = weight
            self.access(key, ts)
        else:
            e = [0.0, 0, weight]
            self._stamp(e, self._time(ts))
            self.entries[key] = e
        return self.evict()

    def remove(self, key):
        self.entries.pop(key, None)

    def resize(self, capacity):
        self.capacity = capacity
        return self.evict()

    def evict(self):
        victims = []
        while sum(e[2] for e in self.entries.values()) > self.capacity and self.entries:
            key = min(self.entries, key=lambda k: self.entries[k][:2])
            del self.entries[key]
            victims.append(key)
        return victims


OPS = st.lists(st.tuples(st.sampled_from(["insert", "insert_now", "access", "access_now", "hint",
                                          "advance", "remove", "resize", "victim"]),
                         st.integers(0, 25), st.integers(1, 6), st.integers(0, 40)),
               min_size=20, max_size=200)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, capacity=st.integers(1, 30))
def test_victims_match_the_definition(ops, capacity):
    p, ref = TACPolicy(capacity), Reference(capacity)
    for op, key, w, t in ops:
        ts = float(t)
        if op == "insert":
            assert p.insert(key, w, ts) == ref.insert(key, w, ts)
        elif op == "insert_now":
            assert p.insert(key, w) == ref.insert(key, w)
        elif op == "access":
            p.access(key, ts), ref.access(key, ts)
        elif op == "access_now":
            p.access(key), ref.access(key)
        elif op == "hint":
            p.hint(key, ts), ref.hint(key, ts)
        elif op == "advance":
            p.advance(ts), ref.advance(ts)
        elif op == "remove":
            p.remove(key), ref.remove(key)
        elif op == "resize":
            assert p.resize(w * 5) == ref.resize(w * 5)
        elif ref.entries:
            assert p.next_victim() == min(ref.entries, key=lambda k: ref.entries[k][:2])
        assert sorted(p.keys()) == sorted(ref.entries)
        assert all(p.timestamp(k) == e[0] for k, e in ref.entries.items())
        assert p.total_weight == sum(e[2] for e in ref.entries.values())
        # one heap item per resident key, plus items of removed keys, bounded
        assert len(p._heap) <= 2 * len(ref.entries) + 65


def test_without_timestamps_it_is_lru():
    tac, lru = TACPolicy(50), LRUPolicy(50)
    import random

    rng = random.Random(3)
    for _ in range(5000):
        k = int(rng.paretovariate(1.0)) % 400
        if k in tac:
            tac.access(k)
            lru.access(k)
        else:
            assert tac.insert(k) == lru.insert(k)


def test_renewals_between_evictions_cost_no_push():
    # a prefetched key is inserted, hinted with its expected use and used at that time: the
    # hint and the use only update the entry; its heap item moves once, when it surfaces
    p = TACPolicy(1000)
    for k in range(1000):
        p.insert(k)
    n = len(p._heap)
    for k in range(1000):
        p.hint(k, 10.0 + k)
        p.access(k, 10.0 + k)
        p.access(k)
    assert len(p._heap) == n
    assert p.insert("new") == [0]   # key 0's use (10.0) is the oldest; the newcomer is at 999+10
    assert p.timestamp("new") == 1009.0


def test_front_and_now_tell_where_the_evictions_and_the_clock_are():
    p = TACPolicy(3)
    assert p.front() is None and p.now == float("-inf")
    p.insert("a", ts=5.0)
    p.insert("b", ts=7.0)
    p.insert("c", ts=9.0)
    assert p.front() == 5.0 and p.now == 9.0
    p.hint("a", 20.0)                       # renewed: its old item stays until cleaned
    assert p.front() <= 7.0                 # a lower bound, read without reordering
    assert p.insert("d", ts=10.0) == ["b"]  # an eviction cleans the top
    assert p.front() == 9.0 and p.timestamp("a") == 20.0
    p.advance(12.0)
    assert p.now == 12.0


BATCH_OPS = st.lists(st.tuples(st.sampled_from(["batch", "batch_now", "access", "hint", "remove",
                                                "insert", "weighted", "advance"]),
                               st.integers(0, 12), st.integers(1, 6), st.integers(0, 40)),
                     min_size=5, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=BATCH_OPS, capacity=st.integers(1, 20))
def test_insert_many_of_fresh_keys_matches_inserting_them_one_by_one(ops, capacity):
    # insert_many(fresh=True) takes the batch in one pass and evicts once: the same keys stay
    # (and the same leave) as key by key, checked against the definition, weighted entries
    # resident or not
    p, ref = TACPolicy(capacity), Reference(capacity)
    fresh_key = iter(range(1000, 10**6))
    for op, key, n, t in ops:
        ts = float(t)
        if op in ("batch", "batch_now"):
            keys = [next(fresh_key) for _ in range(n * 3)]   # distinct, never resident
            lost = p.insert_many(keys, ts if op == "batch" else None, fresh=True)
            want: list = []
            for k in keys:
                want.extend(ref.insert(k, 1, ts if op == "batch" else None))
            assert sorted(lost) == sorted(dict.fromkeys(want))
        elif op == "insert":
            assert p.insert(key, 1, ts) == ref.insert(key, 1, ts)
        elif op == "weighted":
            assert p.insert(key, n, ts) == ref.insert(key, n, ts)
        elif op == "access":
            p.access(key, ts), ref.access(key, ts)
        elif op == "hint":
            p.hint(key, ts), ref.hint(key, ts)
        elif op == "advance":
            p.advance(ts), ref.advance(ts)
        else:
            p.remove(key), ref.remove(key)
        assert sorted(p.keys()) == sorted(ref.entries)
        assert all(p.timestamp(k) == e[0] for k, e in ref.entries.items())
        assert p.total_weight == sum(e[2] for e in ref.entries.values())
        if ref.entries:
            assert p.next_victim() == min(ref.entries, key=lambda k: ref.entries[k][:2])


def test_insert_many_of_keys_not_known_fresh_reports_each_key_that_left_once():
    p = TACPolicy(3)
    p.insert("a", 1, 1.0)
    # "a" is resident (renewed, not added), "b" comes twice: neither is fresh
    lost = p.insert_many(["a", "b", "c", "b", "d", "e"], 2.0)
    # a renewed (seq 2), b, c added, b renewed, d evicts a, e evicts c
    assert lost == ["a", "c"]
    assert sorted(p.keys()) == ["b", "d", "e"]
    p.insert_many(["f", "f"], 3.0)      # the same key twice, not fresh: it left once at most
    assert sorted(p.keys()) == ["d", "e", "f"]
