"""Review of CacheableList against list: the corners the stateful machine does not reach.

Every case runs the same operation on a ``CacheableList`` (a 4-entry heap over disk, or over
Redis -> disk, chunks of 3 so that nearly every step crosses chunks and evicts) and on a plain
list, and compares the results or the exceptions (type and message) and the contents after.
Only the type's own name in a message ("CacheableList" for "list") can differ.
"""
from __future__ import annotations

import itertools
import operator

import pytest

from mlcache import CacheManager
from mlcache.structures import CacheableList

from _structures_support import outcome
from _structures_support import manager  # noqa: F401  (the fixture)

VALUES = list(range(8))




class Pair:
    """A fresh CacheableList and list with the same contents per call."""

    def __init__(self, manager: CacheManager) -> None:
        self.m = manager
        self.n = 0

    def make(self, values=VALUES, chunk: int = 3) -> tuple[CacheableList, list]:
        self.n += 1
        cl = self.m.list(f"l{self.n}", chunk_size=chunk)
        cl.extend(values)
        return cl, list(values)

    def check(self, op, values=VALUES, chunk: int = 3) -> None:
        cl, pl = self.make(values, chunk)
        mine, theirs = outcome(lambda: op(cl)), outcome(lambda: op(pl))
        assert mine == theirs
        assert cl.copy() == pl and len(cl) == len(pl)


@pytest.fixture()
def pair(manager):
    return Pair(manager)


SLICE_PARTS = [None, -9, -3, 0, 2, 9]
STEPS = [None, 1, 2, -1, -2, 3]
SLICES = [slice(a, b, c) for a, b, c in itertools.product(SLICE_PARTS, SLICE_PARTS, STEPS)]


def test_slices_read_assign_delete_with_steps(pair):
    for s in SLICES:
        pair.check(lambda o: o[s])

        def delete(o, s=s):
            del o[s]
        pair.check(delete)
        for values in ([], [9], [9, 9, 9], [9] * 10, iter([7, 8, 9])):
            vals = list(values) if not isinstance(values, list) else values

            def assign(o, s=s, vals=vals):
                o[s] = iter(vals) if len(vals) == 3 else vals
            pair.check(assign)


def test_slice_assignment_errors_and_self(pair):
    def ext_mismatch(o):
        o[::2] = [1, 2]
    pair.check(ext_mismatch)      # ValueError: attempt to assign sequence of size 2 to ...

    def not_iterable(o):
        o[1:3] = 5
    pair.check(not_iterable)

    def ext_not_iterable(o):
        o[::2] = 5
    pair.check(ext_not_iterable)

    def from_self(o):
        o[1:3] = o
    pair.check(from_self)

    def reversed_self(o):
        o[::-1] = o
    pair.check(reversed_self)


def test_iadd_mul_and_repeat(pair):
    for other in ((1, 2), range(3), "ab", 5, [1]):
        def iadd(o, other=other):
            o += other
        pair.check(iadd)

    def iadd_self(o):
        o += o
    pair.check(iadd_self)
    for k in (0, -1, 1, 2, 3, True, 1.5):
        pair.check(lambda o: o * k)
        pair.check(lambda o: k * o)

        def imul(o, k=k):
            o *= k
        pair.check(imul)   # regression: 1.5 raised AttributeError, not list's TypeError


def test_comparisons_with_lists_and_cacheable_lists(pair):
    for other in ([0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 8], [], VALUES, VALUES + [0]):
        other_cl, _ = pair.make(other)
        for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
                   operator.ne):
            pair.check(lambda o: op(o, other))
            pair.check(lambda o: op(other, o))
            cl, pl = pair.make()
            assert op(cl, other_cl) == op(pl, other)
            assert op(other_cl, cl) == op(other, pl)
    cl, _ = pair.make()
    assert (cl == (0, 1)) is False and (cl != (0, 1)) is True
    with pytest.raises(TypeError, match="'<' not supported"):
        cl < (0, 1)  # noqa: B015


def test_sort_is_stable_takes_keywords_only_and_detects_changes(pair):
    values = [5, 3, 8, 1, 4, 7, 2, 6, 0]
    for reverse in (False, True):
        pair.check(lambda o: o.sort(key=lambda x: x % 3, reverse=reverse), values)
    pair.check(lambda o: o.sort(None), values)              # no positional arguments
    pair.check(lambda o: o.sort(), [5, 3, "a", 1])         # unorderable: unchanged
    pair.check(lambda o: o.sort(key=lambda x: 1 / (x - 3)), values)  # key raises: unchanged
    # a key function that changes the list: ValueError, the list holds the sorted elements
    pair.check(lambda o: o.sort(key=lambda x: o.append(x) or -x), values)


def test_index_start_stop_insert_pop_remove(pair):
    for start in (-100, -3, 0, 2, 100):
        for stop in (-100, -2, 0, 5, 100):
            pair.check(lambda o: o.index(4, start, stop))
        pair.check(lambda o: o.index(4, start))
    pair.check(lambda o: o.index(4, None, 5))   # regression: None was taken for "the end"
    pair.check(lambda o: o.index(1, 1.0))
    pair.check(lambda o: o.index(99))
    for i in (-100, -9, -8, -1, 0, 3, 8, 9, 100):
        pair.check(lambda o: o.insert(i, "x"))
    pair.check(lambda o: o.insert(1.0, "x"))    # regression: AttributeError, not TypeError
    pair.check(lambda o: o.pop(1.0))
    pair.check(lambda o: o.pop(), [])
    pair.check(lambda o: o.pop(3), [])
    pair.check(lambda o: o.pop(30))
    pair.check(lambda o: o.remove(99))
    pair.check(lambda o: (3 in o, 99 in o, 3.0 in o, o.count(1)))


def test_repr_reversed_copy_clear(pair):
    pair.check(repr)             # regression: was "<CacheableList 'l1' len=8>"
    pair.check(str)
    pair.check(lambda o: repr(o), [])
    pair.check(lambda o: list(reversed(o)))
    pair.check(lambda o: o.copy())
    pair.check(lambda o: o.clear())
    cl, pl = pair.make([1])
    cl.append(cl)
    pl.append(pl)
    assert repr(cl) == repr(pl) == "[1, [...]]"


def test_mutation_during_iteration_behaves_like_list(pair):
    """Regression: iteration used a snapshot of batches, so a loop did not see appends,
    removals or replacements a list's loop sees."""
    def loop_append(o):
        out = []
        for x in o:
            out.append(x)
            if len(o) < 12:
                o.append(x + 100)
        return out
    pair.check(loop_append)

    def loop_remove(o):
        out = []
        for x in o:
            out.append(x)
            if x % 2 == 0:
                o.remove(x)
        return out
    pair.check(loop_remove)

    def loop_replace_next(o):
        out = []
        for i, x in enumerate(o):
            out.append(x)
            if i + 1 < len(o):
                o[i + 1] = -x
        return out
    pair.check(loop_replace_next, list(range(200)))

    def reversed_popleft(o):
        out = []
        for x in reversed(o):
            out.append(x)
            if o:
                o.pop(0)
        return out
    pair.check(reversed_popleft)

    def reversed_append(o):
        out = []
        for x in reversed(o):
            out.append(x)
            if len(o) < 12:
                o.append(x)
        return out
    pair.check(reversed_append)

    def exhausted_stays_exhausted(o):
        it = iter(o)
        first = list(it)
        o.append(1)
        return first, list(it)
    pair.check(exhausted_stays_exhausted)


def test_nested_structures_still_work(manager):
    outer = manager.list("outer", chunk_size=2)
    inner = manager.list("inner", chunk_size=2)
    inner.extend([3, 1, 2])
    outer.extend([inner, "x"])
    outer[0].sort()
    assert outer[0] is inner and inner == [1, 2, 3]
    assert repr(outer) == "[[1, 2, 3], 'x']"
    assert [list(v) if isinstance(v, CacheableList) else v for v in outer] == [[1, 2, 3], "x"]


def test_extend_keeps_elements_taken_before_an_error(pair):
    """Regression: an iterable that raised part-way left the CacheableList unchanged, where
    list.extend (and ``+=``) keeps what it took."""
    def extend_failing(o):
        def gen():
            yield 8
            yield 9
            raise RuntimeError("boom")
        o.extend(gen())
    pair.check(extend_failing)

    def iadd_failing(o):
        def gen():
            yield 8
            raise RuntimeError("boom")
        o += gen()
    pair.check(iadd_failing)


def test_copy_module_gives_plain_copies(manager):
    """Regression: copy.copy/deepcopy fell back to __reduce__ and gave a StructureRef."""
    import copy

    outer = manager.list("outer-copy", chunk_size=2)
    inner = manager.list("inner-copy", chunk_size=2)
    inner.extend([1, 2])
    outer.extend([inner, 3])
    shallow, deep = copy.copy(outer), copy.deepcopy(outer)
    assert type(shallow) is list and shallow[0] is inner and shallow == [[1, 2], 3]
    assert type(deep) is list and type(deep[0]) is list and deep == [[1, 2], 3]
    d, s = manager.dict("d-copy"), manager.set("s-copy")
    d["k"] = inner
    s.add(1)
    assert copy.copy(d) == {"k": inner} and type(copy.deepcopy(d)["k"]) is list
    assert type(copy.copy(s)) is set and copy.deepcopy(s) == {1}
