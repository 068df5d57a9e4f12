"""CacheableSet: a ``MutableSet`` whose elements are manager keys, one entry per element.

Elements follow the manager's key rules (``str``, ``int``, ``bytes``, tuples of them); as in a
set, ``1``, ``1.0`` and ``True`` are one element, so an integral float, a ``numpy`` integer or
any other number equal to an int (``Fraction(4, 2)``) is stored as the ``int`` it equals. ``len`` is O(1) from the metadata. Operators that build a
new set (``|``, ``&``, ``-``, ``^``, ``union``, ...) return a plain Python ``set`` (a
``frozenset`` when the left operand is one), as ``copy()`` does: a new cacheable set needs a
name, so making one is an explicit ``manager.set(name)`` followed by ``update``.

As with ``set``, the operators take sets only (any ``collections.abc.Set``: ``set``,
``frozenset``, another ``CacheableSet``, dict key views) and the named methods any iterables;
an in-place method that fails part-way (an unhashable element) keeps what it did before, and a
loop over the set raises ``RuntimeError`` if the set changed size.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableSet
from collections.abc import Set as AbstractSet
from typing import Any

from .base import Cacheable, locked
from .dict import _BAD, _key, _write_key

__all__ = ["CacheableSet"]

_PRESENT = 1
_POP_KEEP = 4096   # elements of a listing kept for the next pops


def _lookup(elem: Any) -> Any:
    """The stored key for a membership test; a set or frozenset (unhashable or not) is never an
    element here, as ``{1} in set()`` is simply False."""
    if isinstance(elem, (set, frozenset)):
        return _BAD
    return _key(elem)


class CacheableSet(Cacheable, MutableSet):
    """A set whose elements live in the cache levels. Open with ``manager.set(name)``."""

    kind = "set"
    _meta_counts = ("len",)   # the metadata is weighed from its length (see Cacheable)
    # Elements of the last listing not yet popped (at most ``_POP_KEEP``), each checked to be
    # still a member when its turn comes: pop() listed every key of the namespace (a scan of
    # the heap and each level) to take one, O(len) a pop, where set.pop is O(1).
    __slots__ = ("_pop_keys",)
    _pop_keys: list[Any]

    def _attach(self) -> None:
        self._pop_keys = []

    def _forget_written(self) -> None:
        self._pop_keys = []

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> set[Any]:
        return set(it)

    # -- the abstract methods ----------------------------------------------------------------

    def __contains__(self, elem: object) -> bool:
        k = _lookup(elem)
        return k is not _BAD and bool(self._ns.contains(k))

    def __iter__(self) -> Iterator[Any]:
        # The elements are listed once; like set's iterator, the loop raises RuntimeError at its
        # next step if the set changed size meanwhile.
        # An element removed meanwhile by changes that kept the size is skipped, as a set's
        # loop never yields it.
        n, ver = self._meta["len"], self._ver
        for elem in list(self._ns.keys()):
            if self._meta["len"] != n:
                raise RuntimeError("Set changed size during iteration")
            if self._ver != ver and elem not in self:
                continue
            yield elem
        if self._meta["len"] != n:
            raise RuntimeError("Set changed size during iteration")

    def __len__(self) -> int:
        return int(self._meta["len"])

    def _add_len(self, delta: int) -> None:
        self._ver += 1
        super()._add_len(delta)

    def add(self, elem: Any) -> None:
        elem = _write_key(elem)
        with self._lock:
            if not self._ns.contains(elem):
                self._ns.put(elem, _PRESENT)
                self._add_len(1)

    @locked
    def discard(self, elem: Any) -> None:
        k = _lookup(elem)
        if k is not _BAD and self._ns.contains(k):
            self._ns.delete(k)
            self._add_len(-1)

    # -- set API -----------------------------------------------------------------------------

    @locked
    def remove(self, elem: Any) -> None:
        k = _lookup(elem)
        if k is _BAD or not self._ns.contains(k):
            raise KeyError(elem)
        self._ns.delete(k)
        self._add_len(-1)

    @locked
    def pop(self) -> Any:
        keys = self._pop_keys
        listed = False
        while True:
            while keys:
                elem = keys.pop()
                if self._ns.contains(elem):
                    self._ns.delete(elem)
                    self._add_len(-1)
                    return elem
            if listed:
                raise KeyError("pop from an empty set")
            # one listing serves the next _POP_KEEP pops (a bounded share of it is kept, so a
            # big set holds no copy of its members outside the heap budget)
            keys = self._pop_keys = list(self._ns.keys())[-_POP_KEEP:]
            listed = True

    @locked
    def clear(self) -> None:
        keys = list(self._ns.keys())
        if keys:
            self._ns.delete_many(keys)
        if self._meta["len"]:
            self._ver += 1
            self._meta["len"] = 0
            self._save_meta()

    @locked
    def _add_many(self, new: dict[Any, None]) -> None:
        if not new:
            return
        keys = list(new)
        present = self._ns.get_many(keys)
        added = [k for k in keys if k not in present]
        if added:
            self._ns.put_many([(k, _PRESENT) for k in added])
            self._add_len(len(added))

    @locked
    def _discard_many(self, gone: dict[Any, None]) -> None:
        if not gone:
            return
        keys = list(gone)
        present = [k for k in self._ns.get_many(keys)]
        if present:
            self._ns.delete_many(present)
            self._add_len(-len(present))

    def update(self, *others: Iterable[Any]) -> None:
        new: dict[Any, None] = {}
        try:
            for other in others:
                for elem in other:
                    new[_write_key(elem)] = None
        finally:
            # set.update keeps the elements added before an error
            self._add_many(new)

    def difference_update(self, *others: Iterable[Any]) -> None:
        gone: dict[Any, None] = {}
        try:
            for other in others:
                if other is self:
                    self.clear()
                    gone.clear()
                    continue
                for elem in other:
                    k = _lookup(elem)
                    if k is not _BAD:
                        gone[k] = None
        finally:
            self._discard_many(gone)

    @locked
    def intersection_update(self, *others: Iterable[Any]) -> None:
        keep = self.copy().intersection(*others)
        if len(keep) != len(self):
            self._discard_many(dict.fromkeys(self.copy() - keep))

    @locked
    def symmetric_difference_update(self, *args: Iterable[Any]) -> None:
        if len(args) != 1:
            raise TypeError("set.symmetric_difference_update() takes exactly one argument "
                            f"({len(args)} given)")
        other = args[0]
        if other is self:
            self.clear()
            return
        flip = {_write_key(e): None for e in other}
        if not flip:
            return
        # one read, then the writes: a second read between them (a level down) left the
        # elements removed and none added
        present = self._ns.get_many(list(flip))
        gone = list(present)
        new = [k for k in flip if k not in present]
        if gone:
            self._ns.delete_many(gone)
        if new:
            self._ns.put_many([(k, _PRESENT) for k in new])
        self._add_len(len(new) - len(gone))

    def copy(self) -> set[Any]:
        """A plain ``set`` with the current elements."""
        return set(self._ns.keys())

    def union(self, *others: Iterable[Any]) -> set[Any]:
        return self.copy().union(*others)

    def intersection(self, *others: Iterable[Any]) -> set[Any]:
        return self.copy().intersection(*others)

    def difference(self, *others: Iterable[Any]) -> set[Any]:
        return self.copy().difference(*others)

    def symmetric_difference(self, other: Iterable[Any]) -> set[Any]:
        return self.copy().symmetric_difference(other)

    def issubset(self, other: Iterable[Any]) -> bool:
        return self.copy().issubset(other)

    def _probe(self, elems: Iterable[Any], want: bool) -> bool:
        """Whether every element of ``elems`` is a member (``want=True``) or none is
        (``want=False``), looked up a batch at a time (64 first, then up to 1,024, so a
        generator is read little ahead of an early answer): one membership test per element
        made a level round trip each, ~100 us an element for a set over Redis where listing
        it costs ~13."""
        batch: list[Any] = []
        size = 64
        for elem in elems:
            k = _lookup(elem)
            if k is _BAD:
                if want:
                    return False
                continue
            batch.append(k)
            if len(batch) >= size:
                if not self._probe_batch(batch, want):
                    return False
                batch = []
                size = min(2 * size, 1024)
        return not batch or self._probe_batch(batch, want)

    def _probe_batch(self, keys: list[Any], want: bool) -> bool:
        found = self._ns.get_many(keys)
        if want:
            return all(k in found for k in keys)
        return not found

    def issuperset(self, other: Iterable[Any]) -> bool:
        return self._probe(other, True)

    def isdisjoint(self, other: Iterable[Any]) -> bool:
        return self._probe(other, False)

    # Set's comparisons, with the membership tests batched (the mixin's test each element)
    def __le__(self, other: Any) -> bool:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        if len(self) > len(other):
            return False
        if isinstance(other, CacheableSet):
            return other._probe(self, True)
        return all(elem in other for elem in self)

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        if len(self) < len(other):
            return False
        return self._probe(other, True)

    # -- operators: sets only, like set's --------------------------------------------------

    @staticmethod
    def _plain(other: Any) -> Any:
        """``other`` as a plain set for an operator, or None if it is no set."""
        if isinstance(other, CacheableSet):
            return other.copy()
        if isinstance(other, (set, frozenset)):
            return other
        if isinstance(other, AbstractSet):
            return set(other)
        return None

    def __or__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else self.copy() | o

    def __and__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else self.copy() & o

    def __sub__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else self.copy() - o

    def __xor__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else self.copy() ^ o

    # Reflected: ``frozenset | cacheable`` gives a frozenset, as ``frozenset | set`` does.
    def __ror__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else type(o)(o | self.copy())

    def __rand__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else type(o)(o & self.copy())

    def __rsub__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else type(o)(o - self.copy())

    def __rxor__(self, other: Any) -> Any:
        o = self._plain(other)
        return NotImplemented if o is None else type(o)(o ^ self.copy())

    def __ior__(self, other: Any) -> Any:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        if other is not self:
            self.update(other)
        return self

    def __iand__(self, other: Any) -> Any:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        if other is not self:
            self.intersection_update(other)
        return self

    def __isub__(self, other: Any) -> Any:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        self.difference_update(other)
        return self

    def __ixor__(self, other: Any) -> Any:
        if not isinstance(other, AbstractSet):
            return NotImplemented
        self.symmetric_difference_update(other)
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CacheableSet):
            other = other.copy()
        if not isinstance(other, (set, frozenset)):
            return MutableSet.__eq__(self, other)
        return len(self) == len(other) and self.copy() == other

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __repr__(self) -> str:
        # A set's repr: the elements (``name`` and ``len`` say which structure it is).
        return repr(self.copy())
