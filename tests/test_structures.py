"""CacheableDict, CacheableList and CacheableSet against dict, list and set.

Stateful hypothesis machines run random operation sequences, with flush, checkpoint and
close+reopen among them, on a 4-entry heap over disk and over Redis -> disk; after every step
the structure must equal its built-in model. Errors must match too (type and message).
"""
from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from mlcache import CacheManager
from mlcache.structures import list_structures

from _structures_support import (LEVELS, MACHINE_SETTINGS, ManagerMachine, machine_for, outcome,
                                 tiny_config)

KEYS = st.one_of(st.integers(-4, 4), st.sampled_from(["a", "b", "", "ü"]),
                 st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])), st.just(b"k"))
VALUES = st.one_of(st.none(), st.integers(-100, 100), st.lists(st.integers(0, 9), max_size=3),
                   st.text(max_size=3))


# -- dict ------------------------------------------------------------------------------------

class DictMachine(ManagerMachine):
    def __init__(self) -> None:
        self.model: dict = {}
        super().__init__()

    def open_structure(self, m):
        return m.dict("d")

    @rule(k=KEYS, v=VALUES)
    def setitem(self, k, v):
        self.s[k] = v
        self.model[k] = v

    @rule(k=KEYS)
    def delitem(self, k):
        def d(obj):
            del obj[k]
        assert outcome(lambda: d(self.s)) == outcome(lambda: d(self.model))

    @rule(k=KEYS)
    def getitem(self, k):
        assert outcome(lambda: self.s[k]) == outcome(lambda: self.model[k])
        assert (k in self.s) == (k in self.model)
        assert self.s.get(k, "dflt") == self.model.get(k, "dflt")

    @rule(k=KEYS, use_default=st.booleans())
    def pop(self, k, use_default):
        if use_default:
            assert self.s.pop(k, "dflt") == self.model.pop(k, "dflt")
        else:
            assert outcome(lambda: self.s.pop(k)) == outcome(lambda: self.model.pop(k))

    @rule()
    def popitem(self):
        if not self.model:
            assert outcome(self.s.popitem) == outcome(self.model.popitem)
            return
        k, v = self.s.popitem()
        assert self.model.pop(k) == v

    @rule(k=KEYS, v=VALUES)
    def setdefault(self, k, v):
        assert self.s.setdefault(k, v) == self.model.setdefault(k, v)

    @rule(items=st.dictionaries(KEYS, VALUES, max_size=5))
    def update(self, items):
        self.s.update(items)
        self.model.update(items)

    @rule(items=st.lists(st.tuples(KEYS, VALUES), max_size=4))
    def update_pairs(self, items):
        self.s.update(items)
        self.model.update(items)

    @rule(data=st.data())
    def clear_sometimes(self, data):
        if data.draw(st.integers(0, 9)) == 0:
            self.s.clear()
            self.model.clear()

    @invariant()
    def same_contents(self):
        assert len(self.s) == len(self.model)
        assert self.s.copy() == self.model
        assert self.s == self.model
        assert sorted(map(repr, self.s)) == sorted(map(repr, self.model))


# -- list ------------------------------------------------------------------------------------

INDEX = st.integers(-9, 9)
SLICES = st.builds(slice, st.one_of(st.none(), INDEX), st.one_of(st.none(), INDEX),
                   st.one_of(st.none(), st.sampled_from([1, 2, 3, -1, -2])))
ITEMS = st.integers(0, 20)


class ListMachine(ManagerMachine):
    def __init__(self) -> None:
        self.model: list = []
        super().__init__()

    def open_structure(self, m):
        return m.list("l", chunk_size=3)

    def both(self, op):
        assert outcome(lambda: op(self.s)) == outcome(lambda: op(self.model))

    @rule(v=ITEMS)
    def append(self, v):
        self.both(lambda o: o.append(v))

    @rule(vs=st.lists(ITEMS, max_size=8))
    def extend(self, vs):
        self.both(lambda o: o.extend(vs))

    @rule(i=st.integers(-12, 12), v=ITEMS)
    def insert(self, i, v):
        self.both(lambda o: o.insert(i, v))

    @rule(i=st.one_of(st.none(), INDEX))
    def pop(self, i):
        self.both(lambda o: o.pop() if i is None else o.pop(i))

    @rule()
    def popleft(self):
        if self.model:
            assert self.s.popleft() == self.model.pop(0)
        else:
            assert outcome(self.s.popleft) == outcome(lambda: self.model.pop(0))

    @rule(i=st.one_of(INDEX, SLICES))
    def getitem(self, i):
        self.both(lambda o: o[i])

    @rule(i=INDEX, v=ITEMS)
    def setitem(self, i, v):
        def op(o):
            o[i] = v
        self.both(op)

    @rule(s=SLICES, vs=st.lists(ITEMS, max_size=5))
    def setslice(self, s, vs):
        def op(o):
            o[s] = vs
        self.both(op)

    @rule(i=st.one_of(INDEX, SLICES))
    def delitem(self, i):
        def op(o):
            del o[i]
        self.both(op)

    @rule(v=ITEMS)
    def remove_index_count(self, v):
        self.both(lambda o: o.count(v))
        self.both(lambda o: o.index(v))
        self.both(lambda o: o.index(v, 1, -1))
        self.both(lambda o: o.remove(v))

    @rule(rev=st.booleans())
    def sort(self, rev):
        self.both(lambda o: o.sort(reverse=rev, key=lambda x: x % 7))

    @rule()
    def reverse(self):
        self.both(lambda o: o.reverse())

    @rule(data=st.data())
    def clear_or_repeat(self, data):
        what = data.draw(st.integers(0, 9))
        if what == 0:
            self.both(lambda o: o.clear())
        elif what == 1 and len(self.model) < 10:
            self.s *= 2
            self.model *= 2

    @invariant()
    def same_contents(self):
        assert len(self.s) == len(self.model)
        assert self.s == self.model
        assert list(self.s) == self.model
        assert list(reversed(self.s)) == self.model[::-1]


# -- set -------------------------------------------------------------------------------------

ELEMS = st.one_of(st.integers(0, 9), st.sampled_from(["a", "b"]),
                  st.tuples(st.integers(0, 1), st.integers(0, 1)))
ELEM_SETS = st.sets(ELEMS, max_size=5)


class SetMachine(ManagerMachine):
    def __init__(self) -> None:
        self.model: set = set()
        super().__init__()

    def open_structure(self, m):
        return m.set("s")

    def both(self, op):
        assert outcome(lambda: op(self.s)) == outcome(lambda: op(self.model))

    @rule(e=ELEMS)
    def add(self, e):
        self.both(lambda o: o.add(e))

    @rule(e=ELEMS)
    def discard_remove(self, e):
        self.both(lambda o: o.discard(e))
        self.both(lambda o: o.remove(e))

    @rule()
    def pop(self):
        if not self.model:
            self.both(lambda o: o.pop())
            return
        e = self.s.pop()
        self.model.remove(e)

    @rule(other=ELEM_SETS, how=st.sampled_from(["update", "difference_update",
                                                "intersection_update",
                                                "symmetric_difference_update"]))
    def in_place(self, other, how):
        self.both(lambda o: getattr(o, how)(other))

    @rule(other=ELEM_SETS)
    def operators(self, other):
        m = self.model
        assert (self.s | other) == (m | other)
        assert (self.s & other) == (m & other)
        assert (self.s - other) == (m - other)
        assert (self.s ^ other) == (m ^ other)
        assert (other - self.s) == (other - m)
        assert (self.s <= other) == (m <= other)
        assert (self.s >= other) == (m >= other)
        assert self.s.issubset(other) == m.issubset(other)
        assert self.s.issuperset(other) == m.issuperset(other)
        assert self.s.isdisjoint(other) == m.isdisjoint(other)
        assert self.s.union(other, {99}) == m.union(other, {99})

    @invariant()
    def same_contents(self):
        assert len(self.s) == len(self.model)
        assert self.s == self.model
        assert self.s.copy() == self.model


@pytest.mark.parametrize("level_kind", LEVELS)
@pytest.mark.parametrize("machine", [DictMachine, ListMachine, SetMachine],
                         ids=["dict", "list", "set"])
def test_structure_matches_builtin(machine, level_kind, request):
    redis_url = request.getfixturevalue("redis_url") if level_kind == "redis-disk" else None
    run_state_machine_as_test(machine_for(machine, level_kind, redis_url),
                              settings=MACHINE_SETTINGS)


# -- targeted behaviour ----------------------------------------------------------------------

@pytest.fixture()
def manager(tmp_path):
    m = CacheManager(tiny_config("disk", str(tmp_path / "disk"), None))
    yield m
    m.close()


def test_bad_keys_raise_like_builtins(manager):
    d, s = manager.dict("bad"), manager.set("bad")
    for key in ([1], {"a": 1}, {1}):
        for container in (d, {}):
            with pytest.raises(TypeError) as mine:
                container[key] = 1  # type: ignore[index]
        with pytest.raises(TypeError, match="unhashable type"):
            d[key] = 1  # type: ignore[index]
        with pytest.raises(TypeError, match="unhashable type"):
            s.add(key)
        assert str(mine.value) == f"unhashable type: '{type(key).__name__}'"
    with pytest.raises(TypeError, match="float"):
        d[1.5] = 1
    assert 1.5 not in d and d.get(1.5) is None
    with pytest.raises(KeyError):
        del d["absent"]
    assert len(d) == 0


def test_list_errors_are_lists(manager):
    cl, pl = manager.list("errs", chunk_size=2), []
    for op in (lambda o: o[0], lambda o: o.pop(), lambda o: o.__setitem__(3, 1),
               lambda o: o.__delitem__(-1), lambda o: o.index(5), lambda o: o.remove(5),
               lambda o: o["x"], lambda o: o.__setitem__(slice(None, None, 2), [1])):
        assert outcome(lambda: op(cl)) == outcome(lambda: op(pl))
    cl.extend([1, 2, 3])
    pl.extend([1, 2, 3])
    for op in (lambda o: o[3], lambda o: o[-4], lambda o: o.pop(7),
               lambda o: o.__setitem__(slice(None, None, 2), [1]),
               lambda o: o.__setitem__(slice(0, 1), 5)):
        assert outcome(lambda: op(cl)) == outcome(lambda: op(pl))


def test_list_queue_use_is_cheap_and_reopens(tmp_path):
    config = tiny_config("disk", str(tmp_path / "disk"), None)
    with CacheManager(config) as m:
        q = m.list("queue", chunk_size=8)
        q.extend(range(100))
        for i in range(90):
            assert q.pop(0) == i
        # popleft moves a head offset: only the chunks still holding elements remain
        assert len(list(m.namespace("list:queue").keys())) == 2
        q.insert(0, -1)
    with CacheManager(config) as m:
        assert m.list("queue") == [-1, *range(90, 100)]


def test_reopen_after_close_keeps_contents_and_len(tmp_path, redis_url):
    config = tiny_config("redis-disk", str(tmp_path / "disk"), redis_url)
    with CacheManager(config) as m:
        d, s = m.dict("users"), m.set("tags")
        d.update({f"u{i}": {"n": i} for i in range(50)})
        del d["u3"]
        s.update(["x", "y", ("z", 1)])
        assert m.dict("users") is d
        assert d.uid == "dict:users"
    with CacheManager(config) as m:
        d = m.dict("users")
        assert len(d) == 49 and d["u7"] == {"n": 7} and "u3" not in d
        assert m.set("tags") == {"x", "y", ("z", 1)}
        assert {("dict", "users"), ("set", "tags")} <= set(list_structures(m))


def test_drop_frees_and_object_stays_usable(manager):
    d = manager.dict("tmp")
    d.update({1: 1, 2: 2})
    d.drop()
    assert len(d) == 0 and list(d) == [] and list(manager.namespace("dict:tmp").keys()) == []
    d[3] = 3
    assert d == {3: 3}


def test_options_of_a_structure_already_open_are_checked(manager):
    # Regression: manager.structure() returned an already-open structure without looking at the
    # options, so other bounds were silently ignored while the same call after close() raised.
    q = manager.quadtree("open-q", (0, 0, 10, 10))
    q.insert(1.0, 1.0, "a")
    assert manager.quadtree("open-q", (0, 0, 10, 10)) is q
    assert manager.structure("quadtree", "open-q") is q
    with pytest.raises(ValueError, match="exists with bounds"):
        manager.quadtree("open-q", (0, 0, 1, 1))
    with pytest.raises(ValueError, match="exists with page_levels"):
        manager.quadtree("open-q", (0, 0, 10, 10), page_levels=None)
    d = manager.dict("open-d")
    assert manager.dict("open-d") is d
