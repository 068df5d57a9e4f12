"""CacheableQuadtree against a brute-force list of points, and nested structures.

The quadtree machine uses capacity 2 and a depth limit of 5 over a coarse coordinate grid, so
splits, merges and stacks of duplicate points at the depth limit all happen within a few
steps; ``verify()`` checks the tree's invariants (counts, bounds, merge threshold) after every
step, and every query is compared with a scan of the model list.
"""
from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, rule,
                                 run_state_machine_as_test)

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.structures import CacheableList, CacheableSet, PlainQuadtree
from mlcache.structures._quadtree_geometry import KIDS, NODE_CODEC, SIZE
from mlcache.structures.quadtree import _loaded_size

from _structures_support import LEVELS, MACHINE_SETTINGS, ManagerMachine, machine_for, tiny_config

BOUNDS = (0.0, 0.0, 64.0, 64.0)
COORD = st.one_of(st.integers(0, 64).map(float), st.sampled_from([0.5, 31.99, 32.0, 63.5]))
# times: floats (a leaf whose points all have float coordinates and times keeps them packed)
# or ints (which must come back as ints: such a leaf keeps its points as objects), mixed in
# one tree, so leaves go from one form to the other by inserts, removes, merges and prunes
TS = st.one_of(st.integers(0, 20).map(float), st.integers(0, 20))
POINTS = st.tuples(COORD, COORD, st.integers(0, 5), TS)


def in_rect(p, x0, y0, x1, y1):
    return x0 <= p[0] <= x1 and y0 <= p[1] <= y1


def cell_of(p, depth):
    x0, y0, x1, y1 = BOUNDS
    ix = iy = 0
    for _ in range(depth):
        mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
        ix, x0, x1 = (2 * ix + 1, mx, x1) if p[0] >= mx else (2 * ix, x0, mx)
        iy, y0, y1 = (2 * iy + 1, my, y1) if p[1] >= my else (2 * iy, y0, my)
    return ix, iy


def as_tuples(points):
    return sorted((p.x, p.y, p.data, p.ts) for p in points)


def typed(points):
    """Points with the type of each field, to check they come back as they went in."""
    return sorted((p[0], p[1], p[2], p[3], type(p[3]).__name__, type(p[0]).__name__,
                   type(p[2]).__name__) for p in points)


class QuadtreeMachine(ManagerMachine):
    def __init__(self) -> None:
        self.model: list[tuple] = []
        super().__init__()

    def open_structure(self, m):
        return m.quadtree("qt", BOUNDS, capacity=2, max_depth=5)

    @rule(p=POINTS)
    def insert(self, p):
        self.s.insert(*p)
        self.model.append(p)

    @rule(ps=st.lists(POINTS, max_size=12))
    def insert_many(self, ps):
        assert self.s.insert_many(ps) == len(ps)
        self.model.extend(ps)

    @rule(p=POINTS)
    def out_of_bounds(self, p):
        with pytest.raises(ValueError, match=r"outside the quadtree bounds \(0\.0, 0\.0, 64\.0"):
            self.s.insert(p[0] + 64.5, p[1], p[2], p[3])
        with pytest.raises(ValueError, match=r"point \(nan"):
            self.s.insert_many([p, (math.nan, 1.0)])

    @rule(data=st.data())
    def remove(self, data):
        if self.model and data.draw(st.booleans()):
            p = data.draw(st.sampled_from(self.model))
            got = self.s.remove(p[0], p[1], p[2])
            assert (got.x, got.y, got.data) == p[:3]
            self.model.remove(next(q for q in self.model if q[:3] == p[:3] and q[3] == got.ts))
        else:
            p = data.draw(POINTS)
            if not any(q[:2] == p[:2] for q in self.model):
                with pytest.raises(ValueError, match="not in the quadtree"):
                    self.s.remove(p[0], p[1])

    @rule(a=POINTS, b=POINTS)
    def rectangle(self, a, b):
        x0, x1 = sorted((a[0], b[0]))
        y0, y1 = sorted((a[1], b[1]))
        want = [p for p in self.model if in_rect(p, x0, y0, x1, y1)]
        assert as_tuples(self.s.range(x0, y0, x1, y1)) == sorted(want)
        assert self.s.count(x0, y0, x1, y1) == len(want)

    @rule(c=POINTS, r=st.sampled_from([0.0, 1.0, 7.5, 20.0, 100.0]))
    def radius(self, c, r):
        want = [p for p in self.model if (p[0] - c[0]) ** 2 + (p[1] - c[1]) ** 2 <= r * r]
        assert as_tuples(self.s.radius(c[0], c[1], r)) == sorted(want)

    @rule(c=POINTS, k=st.integers(0, 6))
    def nearest(self, c, k):
        def d2(p):
            return (p[0] - c[0]) ** 2 + (p[1] - c[1]) ** 2
        got = self.s.nearest(c[0], c[1], k)
        assert [d2(p) for p in got] == sorted(d2(p) for p in self.model)[:k]

    @rule(depth=st.integers(0, 7))
    def density(self, depth):
        want: dict = {}
        for p in self.model:
            cell = cell_of(p, depth)
            want[cell] = want.get(cell, 0) + 1
        assert self.s.grid_counts(depth) == want
        some = list(want)[::2] + [(0, 0)]
        assert self.s.grid_counts(depth, cells=some) == {c: want[c] for c in some if c in want}
        for cell, n in list(want.items())[:3]:
            assert self.s.count(*self.s.cell_bounds(depth, *cell)) >= n

    @rule(t=st.integers(0, 21))
    def prune_older(self, t):
        keep = [p for p in self.model if p[3] >= t]
        assert self.s.prune_older(t) == len(self.model) - len(keep)
        self.model = keep

    @rule(d=st.integers(0, 5))
    def prune_by_predicate(self, d):
        keep = [p for p in self.model if p[2] != d]
        assert self.s.prune(lambda p: p.data == d) == len(self.model) - len(keep)
        self.model = keep

    @invariant()
    def same_points(self):
        assert len(self.s) == len(self.model)
        self.s.verify()
        assert as_tuples(self.s) == sorted(self.model)
        assert typed(self.s) == typed(self.model)


@pytest.mark.parametrize("level_kind", LEVELS)
def test_quadtree_matches_brute_force(level_kind, request):
    redis_url = request.getfixturevalue("redis_url") if level_kind == "redis-disk" else None
    run_state_machine_as_test(machine_for(QuadtreeMachine, level_kind, redis_url),
                              settings=MACHINE_SETTINGS)


@pytest.mark.parametrize("page_levels", [None, 1, 2, 4])
def test_quadtree_matches_brute_force_in_every_page_layout(page_levels):
    """One node per entry (``page_levels=None``, DEBS'22's layout) and pages of 1, 2 or 4
    levels (the default, 3, runs above): splits inside a page, into a page of their own,
    merges that empty a page, over a heap that evicts nearly every step."""
    cls = type(f"QuadtreeMachine_pages_{page_levels}", (QuadtreeMachine,), {
        "open_structure": lambda self, m: m.quadtree("qt", BOUNDS, capacity=2, max_depth=5,
                                                     page_levels=page_levels)})
    run_state_machine_as_test(machine_for(cls, "disk", None), settings=MACHINE_SETTINGS)


def test_page_levels_is_checked_and_kept_on_reopen(tmp_path):
    config = tiny_config("disk", str(tmp_path / "d"), None)
    with CacheManager(config) as m:
        for bad in (0, 5, True, "3"):
            with pytest.raises(ValueError, match="page_levels"):
                m.quadtree(f"bad{bad}", BOUNDS, page_levels=bad)
        m.quadtree("two", BOUNDS, capacity=2, page_levels=2).insert_many(
            [(float(i), float(i), i) for i in range(50)])
    with CacheManager(config) as m:
        qt = m.quadtree("two", BOUNDS)
        assert qt._meta["page_levels"] == 2 and len(qt.points()) == 50 and qt.verify() > 5
    with CacheManager(config) as m:
        with pytest.raises(ValueError, match="page_levels"):
            m.quadtree("two", BOUNDS, page_levels=3)


def test_plain_quadtree_is_the_same_algorithm():
    plain = PlainQuadtree(BOUNDS, capacity=2, max_depth=5)
    pts = [(float(i % 64), float((i * 7) % 64), i, i) for i in range(200)]
    plain.insert_many(pts)
    plain.insert(3.0, 3.0)
    assert plain.verify() > 1 and len(plain) == 201
    assert plain.prune_older(100) == 100 and len(plain) == 101
    plain.verify()


def test_duplicates_stop_at_the_depth_limit(tmp_path):
    with CacheManager(tiny_config("disk", str(tmp_path / "d"), None)) as m:
        qt = m.quadtree("dups", BOUNDS, capacity=2, max_depth=3)
        qt.insert_many([(5.0, 5.0, i) for i in range(50)])
        assert qt.height() == 3 and qt.verify() == 13
        assert len(qt.radius(5.0, 5.0, 0.0)) == 50
        for i in range(49):   # merged below capacity // 2 = 1 point
            qt.remove(5.0, 5.0, i)
        assert len(qt) == 1 and qt.node_count == 1 and qt.verify() == 1  # merged back to a single leaf


def test_reopen_needs_no_bounds_and_rejects_other_bounds(tmp_path):
    config = tiny_config("disk", str(tmp_path / "d"), None)
    with CacheManager(config) as m:
        m.quadtree("q", BOUNDS).insert_many([(1.0, 2.0, "a"), (60.0, 60.0, "b")])
    with CacheManager(config) as m:
        q = m.structure("quadtree", "q")
        assert [p.data for p in q.nearest(0, 0, 2)] == ["a", "b"]
    with CacheManager(config) as m:
        with pytest.raises(ValueError, match="exists with bounds"):
            m.quadtree("q", (0, 0, 1, 1))
        with pytest.raises(ValueError, match="needs bounds"):
            m.quadtree("new", None)


@pytest.mark.parametrize("level_kind", LEVELS)
def test_nested_dict_of_lists_of_sets_survives_eviction_and_reopen(level_kind, tmp_path,
                                                                    request):
    redis_url = request.getfixturevalue("redis_url") if level_kind == "redis-disk" else None
    config = tiny_config(level_kind, str(tmp_path / "d"), redis_url)
    model = {f"user{i}": [{(i, j), f"tag{j}"} | set(range(j)) for j in range(4)]
             for i in range(6)}
    with CacheManager(config) as m:
        outer = m.dict("outer")
        for key, lists in model.items():
            inner = m.list(f"{key}.sessions", chunk_size=2)
            outer[key] = inner
            for elems in lists:
                s = CacheableSet.open(m)            # anonymous: a fresh unique name
                s.update(elems)
                inner.append(s)
        outer["user0"][2].add("late")
        model["user0"][2].add("late")
        m.flush()
        assert isinstance(outer["user3"], CacheableList)
        assert {k: [set(s) for s in v] for k, v in outer.items()} == model
    with CacheManager(config) as m:                 # reopen: resolved from references
        outer = m.dict("outer")
        got = {k: [s.copy() for s in v] for k, v in outer.items()}
        assert got == model
        assert outer["user5"][3] == model["user5"][3]
        outer["user5"][3].discard("tag3")
        assert "tag3" not in m.dict("outer")["user5"][3]


def test_drop_deletes_every_node_and_the_tree_is_reusable(tmp_path):
    with CacheManager(tiny_config("disk", str(tmp_path / "d"), None)) as m:
        qt = m.quadtree("window", BOUNDS, capacity=2)
        qt.insert_many([(float(i), float(i * 3 % 64), i) for i in range(40)])
        qt.remove(1.0, 3.0)
        qt.drop()
        m.checkpoint()
        assert list(m.namespace("quadtree:window").keys()) == []
        assert len(qt) == 0 and qt.range(0, 0, 64, 64) == [] and qt.verify() == 0
        qt.insert(1.0, 1.0, "again")
        assert [p.data for p in qt] == ["again"] and qt.verify() == 1


# -- node sizes: what the heap is charged for a live node ------------------------------------

def _alloc(n: int) -> int:
    """Bytes CPython's allocators take for a request of ``n`` (pymalloc rounds small requests
    to 16; malloc adds a header and rounds to 16; large blocks are mmapped pages)."""
    if n <= 512:
        return (n + 15) & -16
    if n < 131072:
        return (n + 23) & -16
    return (n + 4111) & -4096


def _deep_alloc(obj, seen: set) -> int:
    """Every object reachable from ``obj`` as allocated (shared singletons counted too)."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if type(obj) in (list, dict, set):
        empty = sys.getsizeof(type(obj)())
        total = _alloc(empty) + (_alloc(size - empty) if size > empty else 0)
    else:
        total = _alloc(size)
    if type(obj) in (list, tuple, set, frozenset):
        total += sum(_deep_alloc(item, seen) for item in obj)
    elif type(obj) is dict:
        total += sum(_deep_alloc(k, seen) + _deep_alloc(v, seen) for k, v in obj.items())
    return total


def _node_entries(m, name):
    ns = m.namespace(f"quadtree:{name}")
    return {k: m._data[ns._kb(k)] for k in ns.keys() if ns._kb(k) in m._data}


DATA = st.one_of(st.none(), st.integers(-10**30, 10**30), st.text(max_size=40),
                 st.binary(max_size=30), st.tuples(st.text(max_size=8), st.integers()),
                 st.dictionaries(st.text(max_size=5), st.lists(st.integers(), max_size=4),
                                 max_size=3))
SIZED_POINTS = st.tuples(st.one_of(st.floats(0, 64), st.integers(0, 64)),
                         st.one_of(st.floats(0, 64), st.integers(0, 64)), DATA,
                         st.one_of(st.none(), st.floats(0, 1e9), st.integers(0, 2**62)))
# all floats: these batches go into packed leaves (ASCII strings, the usual data, or any)
PACKED_POINTS = st.tuples(st.floats(0, 64), st.floats(0, 64),
                          st.one_of(st.text(st.characters(max_codepoint=127), max_size=12),
                                    DATA),
                          st.floats(0, 1e9))


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(st.one_of(st.lists(SIZED_POINTS, max_size=40),
                                  st.lists(PACKED_POINTS, max_size=40)), min_size=1, max_size=5),
       page_levels=st.sampled_from([None, 1, 2, 3]))
def test_node_size_bounds_the_memory_of_live_and_reloaded_nodes(batches, page_levels,
                                                                tmp_path_factory):
    """``size`` (what the heap is charged) covers every object a node holds, as allocated,
    both for the live nodes the tree built and for nodes decoded after a reopen; and it
    stays within a small factor of it, so the budget is not wasted. A page (several nodes in
    one entry) is charged its list of slots and its nodes' sizes, which covers it too."""
    config = replace(tiny_config("disk", str(tmp_path_factory.mktemp("d")), None),
                     heap=HeapConfig(max_bytes=1 << 30, policy="lru"))
    for reopen in (False, True):
        with CacheManager(config) as m:
            qt = m.quadtree("sized", BOUNDS, capacity=4, max_depth=6, page_levels=page_levels)
            if not reopen:
                for batch in batches:
                    qt.insert_many(batch)
            qt.verify()   # every node's size is the one computed from scratch
            entries = _node_entries(m, "sized")
            assert entries or not any(batches)
            nodes = list(entries.values())
            if page_levels is not None:
                heap, ns = m._heap, m.namespace("quadtree:sized")
                nodes = []
                for k, page in entries.items():
                    charged = heap.weights[ns._kb(k)] - heap.entry_overhead - 2 * len(ns._kb(k))
                    assert _deep_alloc(page, set()) <= charged, (page, charged)
                    assert charged == _loaded_size(page)
                    nodes.extend(node for node in page if node is not None)
            for node in nodes:
                held = _deep_alloc(node, set())
                assert held <= node[SIZE], (held, node[SIZE], node)
                assert node[SIZE] <= 3 * held + 400, (held, node[SIZE])


class ByteBudgetQuadtreeMachine(QuadtreeMachine):
    """The quadtree machine over a heap bounded in bytes (a few nodes): the sizes the tree
    hands to the heap decide every eviction."""

    def __init__(self) -> None:
        self.model = []
        RuleBasedStateMachine.__init__(self)
        self.dir = tempfile.mkdtemp(prefix="mlcache-struct-")
        self.config = replace(tiny_config("disk", self.dir, None),
                              heap=HeapConfig(max_bytes=12_000, policy="lru"))
        self.m = CacheManager(self.config)
        self.s = self.open_structure(self.m)


def test_quadtree_matches_brute_force_on_a_byte_bounded_heap():
    run_state_machine_as_test(ByteBudgetQuadtreeMachine, settings=MACHINE_SETTINGS)


def test_a_node_stored_as_a_blob_by_an_earlier_version_is_read_and_rewritten(tmp_path):
    config = tiny_config("disk", str(tmp_path / "d"), None)
    with CacheManager(config) as m:
        qt = m.quadtree("old", BOUNDS, capacity=4, page_levels=None)   # as earlier versions
        qt.insert_many([(1.0, 1.0, "a", 1.0), (50.0, 50.0, "b", 2.0)])
        ns = m.namespace("quadtree:old")
        root = ns.get(0)
        ns.put(0, NODE_CODEC.encode(root[:SIZE]))   # the earlier layout: one msgpack blob
    with CacheManager(config) as m:
        qt = m.quadtree("old", BOUNDS)
        assert sorted(p.data for p in qt) == ["a", "b"] and qt.verify() == 1
        qt.insert(2.0, 2.0, "c", 3.0)
        assert type(m.namespace("quadtree:old").get(0)) is list
        assert qt.count(0, 0, 64, 64) == 3 and qt.verify() == 1


def test_quadtree_namespaces_keep_no_key_memo_and_take_no_share_of_the_budget(tmp_path):
    """Node keys are made by the tree, so its namespace keeps no memo: opening trees (the
    event-detection application opens one per interval) does not take key-memo charges off
    the heap's capacity."""
    config = CacheConfig(heap=HeapConfig(max_bytes=4 << 20, policy="lru"),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as m:
        m.quadtree("first", BOUNDS).insert(1.0, 1.0)
        capacity, memo_total = m._heap.capacity, m._cold.memo_total
        trees = []   # kept open (the manager holds structures and namespaces weakly)
        for i in range(40):
            qt = m.quadtree(f"t{i}", BOUNDS, capacity=2)
            qt.insert_many([(float(j % 64), float(j * 7 % 64), j) for j in range(20)])
            assert qt.verify() > 1
            trees.append(qt)
        assert (m._heap.capacity, m._cold.memo_total) == (capacity, memo_total)
        assert m.namespace("quadtree:t3")._memo_max == 0


def test_nodes_loaded_from_a_level_are_weighed_by_their_size(tmp_path):
    """A node read back is charged the size it carries (no walk over it); a size that cannot
    be right (damaged) is ignored and the heap weighs the node itself."""
    config = replace(tiny_config("disk", str(tmp_path / "d"), None),
                     heap=HeapConfig(max_bytes=1 << 30, policy="lru"))
    with CacheManager(config) as m:
        qt = m.quadtree("w", BOUNDS, capacity=4, page_levels=None)
        qt.insert_many([(float(i % 64), float(i * 5 % 64), f"p{i}", float(i)) for i in range(60)])
        ns = m.namespace("quadtree:w")
        bad = next(k for k in ns.keys() if ns.get(k)[KIDS] is None)
        node = ns.get(bad)
        m.namespace("quadtree:w").put(bad, node[:SIZE] + [1])   # damaged: 1 byte
    with CacheManager(config) as m:
        qt = m.quadtree("w", BOUNDS)
        assert len(qt.points()) == 60
        heap, ns = m._heap, m.namespace("quadtree:w")
        charges = {heap.weights[ns._kb(k)] - ns.get(k)[SIZE] - 2 * len(ns._kb(k))
                   for k in ns.keys() if k != bad}
        assert charges == {heap.entry_overhead}
        assert heap.weights[ns._kb(bad)] > 1000


def test_pages_loaded_from_a_level_are_weighed_by_their_slots_and_nodes(tmp_path):
    """In the page layout an entry holds several nodes: read back, it is charged its list of
    slots and the sizes its nodes carry; a page holding a damaged node is weighed by the heap."""
    config = replace(tiny_config("disk", str(tmp_path / "d"), None),
                     heap=HeapConfig(max_bytes=1 << 30, policy="lru"))
    with CacheManager(config) as m:
        qt = m.quadtree("p", BOUNDS, capacity=4, page_levels=2)
        qt.insert_many([(float(i % 64), float(i * 5 % 64), f"p{i}", float(i)) for i in range(200)])
        ns = m.namespace("quadtree:p")
        pages = {k: ns.get(k) for k in ns.keys()}
        assert len(pages) > 2 and all(len(page) == 20 for page in pages.values())
        assert sum(node is not None for page in pages.values() for node in page) == qt.node_count
        bad = max(pages)
        page = [None if n is None else list(n) for n in pages[bad]]
        leaf = next(n for n in page if n is not None and n[KIDS] is None)
        leaf[SIZE] = 1   # damaged
        ns.put(bad, page)
    with CacheManager(config) as m:
        qt = m.quadtree("p", BOUNDS)
        assert len(qt.points()) == 200
        heap, ns = m._heap, m.namespace("quadtree:p")
        for k in ns.keys():
            kb = ns._kb(k)
            charged = heap.weights[kb] - heap.entry_overhead - 2 * len(kb)
            if k == bad:
                assert _loaded_size(ns.get(k)) is None and charged > 1000
            else:
                assert charged == _loaded_size(ns.get(k)) > 0


@pytest.mark.parametrize("page_levels", [None, 1, 3])
def test_a_failing_level_leaves_the_tree_as_it_was(tmp_path, page_levels):
    """Every node an insert, remove or prune changes is read before any is changed, so a
    level failing on a read midway leaves the heap's nodes (or pages) as they were."""
    from mlcache.errors import CacheError

    config = replace(tiny_config("disk", str(tmp_path / "d"), None),
                     heap=HeapConfig(max_entries=3, max_bytes=None, policy="lru"))
    with CacheManager(config) as m:
        qt = m.quadtree("f", BOUNDS, capacity=2, max_depth=5, page_levels=page_levels)
        pts = [(float(i * 7 % 64), float(i * 13 % 64), i, float(i)) for i in range(40)]
        qt.insert_many(pts)
        level = m._levels[0]
        real = level.get_many

        def broken(keys):
            raise CacheError("level down")

        new = [(1.0, 2.0, "x", 1.0), (60.0, 60.0, "y", 2.0)]
        failed = 0
        for op, after in ((lambda: qt.insert_many(new), sorted(pts + new)),
                          (lambda: qt.remove(*pts[5][:2]), sorted(pts[:5] + pts[6:])),
                          (lambda: qt.prune_older(20.0), [p for p in sorted(pts) if p[3] >= 20])):
            m.flush()   # the evicted nodes are on the level only
            level.get_many = broken
            try:
                op()
            except CacheError:
                failed += 1
            finally:
                level.get_many = real
            qt.verify()
            assert as_tuples(qt) == sorted(pts)
            op()   # and with the level back it works
            qt.verify()
            assert as_tuples(qt) == after
            qt.clear()
            qt.insert_many(pts)
        assert failed == 3


@pytest.mark.parametrize("page_levels", [None, 3])
def test_the_metadata_is_charged_what_the_heaps_walk_gives(tmp_path, page_levels):
    """The tree's metadata goes to a byte-bounded heap with a weight worked out from its
    counts (len, nodes, next) and its fixed fields; it must be what the walk gives, through
    inserts, splits, removes, merges, prunes, clear and drop."""
    from mlcache.levels.heap import estimate_size
    from mlcache.structures.base import META_NAMESPACE

    config = CacheConfig(heap=HeapConfig(max_bytes=64 << 20, policy="lru"),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as m:
        heap = m._heap
        qt = m.quadtree("meta", BOUNDS, capacity=4, page_levels=page_levels)
        kb = m.namespace(META_NAMESPACE)._kb((qt.kind, qt.name))

        def check():
            charged = heap.weights[kb] - heap.entry_overhead - 2 * len(kb)
            assert charged == estimate_size(heap.data[kb]), qt._meta

        check()
        for i in range(0, 3000, 300):   # len, nodes and next grow past the small ints
            qt.insert_many([(float(j % 64), float(j * 7 % 64), f"p{j}", float(j))
                            for j in range(i, i + 300)])
            check()
        qt.remove(0.0, 0.0)
        check()
        assert qt.prune_older(2900.0) > 0
        check()
        qt.clear()
        check()
        qt.drop()
        qt.insert(1.0, 1.0, "again", 1.0)
        check()
        assert qt.verify() >= 1
        assert qt._meta_w is not None   # the weight was worked out, not walked by the heap


def test_quadtree_reopens_by_name_without_bounds(tmp_path):
    """manager.quadtree(name, bounds) had bounds required, so reopening by name alone (as the
    class documents) was a TypeError; a new tree without bounds is a ValueError saying so."""
    from mlcache import CacheConfig, CacheManager, DiskConfig

    cfg = CacheConfig(levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(cfg) as m:
        with pytest.raises(ValueError, match="a new quadtree needs bounds"):
            m.quadtree("new")
        m.quadtree("q", (0, 0, 10, 10)).insert(1, 1, "a")
        assert m.quadtree("q") is m.quadtree("q", bounds=(0, 0, 10, 10))
    with CacheManager(cfg) as m:
        q = m.quadtree("q")
        assert len(q) == 1 and q.bounds == (0.0, 0.0, 10.0, 10.0)
        with pytest.raises(ValueError, match="exists with bounds"):
            m.quadtree("q", (0, 0, 5, 5))
