"""Batched reads and writes of the Spark partition views (get_many/put_many/delete_many).

Each batched call must have exactly the effects of the single-key calls made in order: the same
values seen, the same stored records (pre-batch snapshots included, so that a replay is exact),
the same written keys and changes, and on a ReplayError the same keys written before it. Every
case runs twice over real levels, once with single-key calls and once batched, from the same
stored state, and compares everything stored. No SparkSession: the views and a partition scope
are used directly, as in test_spark_units.py.
"""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.integrations.spark._scope import PartitionScope
from mlcache.integrations.spark._versioned import BatchView, PlainView, ReplayError, unwrap
from mlcache.structures import CacheableList, CacheableSet

KEYS = ["a", "b", "c", "d", "e", 7, ("t", 1)]


@pytest.fixture(params=["heap", "tiny-heap"])
def manager(request, tmp_path, unique_ns):
    heap = (HeapConfig() if request.param == "heap"
            else HeapConfig(max_entries=3, max_bytes=None, policy="lru"))
    m = CacheManager(CacheConfig(heap=heap, levels=(DiskConfig(path=str(tmp_path / "d")),),
                                 namespace=unique_ns))
    yield m
    m.close()


def stored(ns) -> dict:
    """Every entry of ``ns`` as stored (records with their snapshots)."""
    return {k: ns.get(k) for k in sorted(ns.keys(), key=repr)}


def prepare(ns) -> None:
    """State before batch 3: a, b, c, 7 from batch 1 (c holds None, 7 a list), and a first
    attempt of batch 3 that wrote a and d and deleted b before it failed."""
    first = BatchView(ns, 1, "one")
    first.put_many([("a", 1), ("b", {"x": [2]}), ("c", None), (7, [7, 7])])
    failed = BatchView(ns, 3, "failed")
    failed.put("a", 100)
    failed.put("d", "from the failed run")
    failed.delete("b")


def single(view, op, arg):
    if op == "get_many":
        out = {}
        for k in arg:
            v = view.get(k, KeyError)
            if v is not KeyError:
                out[k] = v
        return out
    if op == "put_many":
        for k, v in arg:
            view.put(k, v)
    elif op == "delete_many":
        for k in arg:
            view.delete(k)
    return None


def batched(view, op, arg):
    return getattr(view, op)(arg)


SCRIPT = [
    ("get_many", ["a", "b", "zz", "c", "a", 7]),
    ("put_many", [("a", 2), ("e", "new"), ("b", {"x": [3]}), ("a", 3)]),
    ("get_many", ["a", "b", "d", "e", ("t", 1)]),
    ("delete_many", ["c", "d", "nothing", "c"]),
    ("put_many", [(("t", 1), (1, 2)), ("d", "again")]),
    ("get_many", KEYS + ["nothing"]),
    ("delete_many", []),
    ("put_many", []),
    ("get_many", []),
]


def run_script(m, name, call, view_of):
    ns = m.namespace(name)
    prepare(ns)
    view = view_of(ns)
    results = [call(view, op, arg) for op, arg in SCRIPT]
    return ns, view, results


@pytest.mark.parametrize("kind", ["batch", "plain"])
def test_batched_calls_do_what_single_calls_do(manager, kind):
    def view_of(ns):
        return BatchView(ns, 3, "replay") if kind == "batch" else PlainView(ns)

    ns1, v1, r1 = run_script(manager, "single", single, view_of)
    ns2, v2, r2 = run_script(manager, "batched", batched, view_of)
    assert r1 == r2
    assert stored(ns1) == stored(ns2)
    assert v1.written() == v2.written()
    assert list(v1.changes()) == list(v2.changes())
    if kind == "batch":
        assert v1._before == v2._before
        # the replay read the pre-batch state, not the failed attempt's writes
        assert r2[0] == {"a": 1, "b": {"x": [2]}, "c": None, 7: [7, 7]}
        manager.flush()
        # a second replay of batch 3 starts again from the state before batch 3
        again = BatchView(ns2, 3, "third")
        assert again.get_many(KEYS) == {"a": 1, "b": {"x": [2]}, "c": None, 7: [7, 7]}
        # and batch 4 sees what this replay left
        assert BatchView(ns2, 4, "next").get_many(KEYS) == {
            "a": 3, "b": {"x": [3]}, "e": "new", 7: [7, 7], ("t", 1): (1, 2), "d": "again"}


@pytest.mark.parametrize("op", ["put_many", "delete_many", "get_many"])
@pytest.mark.parametrize("bad", ["later batch", "unversioned"])
def test_replay_error_part_way_leaves_what_single_calls_leave(manager, op, bad):
    def setup(name):
        ns = m.namespace(name)
        BatchView(ns, 1, "one").put_many([("x", 1), ("y", 2), ("z", 3)])
        if bad == "later batch":
            BatchView(ns, 9, "future").put("bad", 0)
        else:
            ns.put("bad", "written without a batch id")
        return ns

    m = manager
    keys = ["x", "y", "bad", "z"]
    arg = [(k, 10) for k in keys] if op == "put_many" else keys
    outcomes = []
    for name, call in (("s", single), ("b", batched)):
        ns = setup(name)
        view = BatchView(ns, 5, "now")
        with pytest.raises(ReplayError) as info:
            call(view, op, arg)
        outcomes.append((str(info.value), stored(ns), view.written(), view._before))
    assert outcomes[0] == outcomes[1]
    if op == "put_many":
        assert unwrap(outcomes[1][1]["x"]) == (True, 10)
        assert unwrap(outcomes[1][1]["z"]) == (True, 3)   # not reached


def test_a_mutated_read_does_not_change_the_snapshot(manager):
    """get_many snapshots the pre-batch value when it reads it, as get does, so a value
    changed in place and written back still replays from the pre-batch state."""
    ns = manager.namespace("mut")
    BatchView(ns, 0, "a").put_many({"k": [1], "j": {"n": 1}})
    first = BatchView(ns, 1, "b")
    got = first.get_many(["k", "j"])
    got["k"].append(2)
    got["j"]["n"] = 2
    first.put_many(got)
    assert BatchView(ns, 1, "c").get_many(["k", "j"]) == {"k": [1], "j": {"n": 1}}
    assert BatchView(ns, 2, "d").get_many(["k", "j"]) == {"k": [1, 2], "j": {"n": 2}}


def replay_structures(m):
    """A dict, a set and a list over a partition scope: batch 0, a failed batch 1, its replay,
    batch 2. (A set's and a list's batched operations call the views' batched methods
    directly: over the views as they were, without them, they raised AttributeError.)"""
    def scope(batch, attempt):
        return PartitionScope(m, "st", 2, batch, attempt)

    s0 = scope(0, "zero")
    d, st = s0.dict("d"), CacheableSet.open(s0, "s")
    lst = CacheableList.open(s0, "l", chunk_size=4)
    d.update({f"k{i}": i for i in range(10)})
    st.update(range(5))
    lst.extend(range(6))
    m.flush()

    def batch1(attempt):
        s1 = scope(1, attempt)
        d1 = s1.dict("d")
        st1 = CacheableSet.open(s1, "s")
        lst1 = CacheableList.open(s1, "l")
        seen = (d1.copy(), st1.copy(), lst1.copy(), d1 == {f"k{i}": i for i in range(10)})
        d1.update({f"k{i}": i * 10 for i in range(5, 15)})
        del d1["k0"]
        st1.update(range(3, 8))
        st1.difference_update([0, 1])
        lst1.extend(range(100, 107))
        lst1[1] = "one"
        m.flush()
        return seen, d1.copy(), st1.copy(), lst1.copy(), len(d1), len(st1), len(lst1)

    first = batch1("failed")
    replay = batch1("replay")
    s2 = scope(2, "after")
    after = (s2.dict("d").copy(), CacheableSet.open(s2, "s").copy(),
             CacheableList.open(s2, "l").copy())
    cleared = s2.dict("d")
    cleared.clear()
    return first, replay, after, cleared.copy(), len(cleared)


class _SingleKeyBatchView(BatchView):
    """A BatchView whose batched calls make one single-key call per key, as a dict over the
    views did before they had batched calls."""

    def get_many(self, keys):
        return single(self, "get_many", list(keys))

    def put_many(self, items):
        single(self, "put_many", list(items.items() if isinstance(items, dict) else items))

    def delete_many(self, keys):
        single(self, "delete_many", list(keys))


def test_structures_over_a_partition_scope_replay_exactly(manager):
    first, replay, after, cleared, n = replay_structures(manager)
    assert first == replay                       # the replay saw and left what the first run did
    seen, d, st, lst, nd, nst, nlst = replay
    assert seen == ({f"k{i}": i for i in range(10)}, set(range(5)), list(range(6)), True)
    assert d == {**{f"k{i}": i for i in range(1, 5)}, **{f"k{i}": i * 10 for i in range(5, 15)}}
    assert list(d) == [f"k{i}" for i in range(1, 15)]
    assert st == set(range(2, 8)) and lst == [0, "one", 2, 3, 4, 5, *range(100, 107)]
    assert (nd, nst, nlst) == (14, 6, 13)
    assert after == (d, st, lst)
    assert cleared == {} and n == 0


def test_dict_over_a_scope_gives_the_same_state_batched_or_not(tmp_path, unique_ns):
    """The dict, the one structure that worked over the views before they had batched calls
    (one get/put per key), leaves the same entries either way."""
    out = []
    for batched_views in (False, True):
        path = tmp_path / ("b" if batched_views else "s")
        with CacheManager(CacheConfig(levels=(DiskConfig(path=str(path)),),
                                      namespace=unique_ns)) as m:
            s = PartitionScope(m, "st", 0, 0, "zero")
            if not batched_views:
                for name in ("mlcache.structures", "dict:d", "dict.order:d"):
                    s.namespace(name).__class__ = _SingleKeyBatchView
            d = s.dict("d")
            d.update({f"k{i}": i for i in range(40)})
            for i in range(0, 40, 3):
                del d[f"k{i}"]
            d.update({f"k{i}": -i for i in range(30, 50)})
            eq = d == {k: v for k, v in d.items()}
            out.append((d.copy(), list(d), eq,
                        {name: stored(m.namespace(f"st.p0/{name}"))
                         for name in ("mlcache.structures", "dict:d", "dict.order:d")}))
    assert out[0] == out[1]
