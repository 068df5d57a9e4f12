"""CacheableSet: a ``MutableSet`` whose elements are manager keys, one entry per element.

Elements follow the manager's key rules (``str``, ``int``, ``bytes``, tuples of them).
``len`` is O(1) from the metadata. Operators that build a new set (``|``, ``&``, ``-``, ``^``,
``union``, ...) return a plain Python ``set``, as ``copy()`` does: a new cacheable set needs a
name, so making one is an explicit ``manager.set(name)`` followed by ``update``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableSet
from typing import Any

from .base import Cacheable
from .dict import _readable

__all__ = ["CacheableSet"]

_PRESENT = 1


class CacheableSet(Cacheable, MutableSet):
    """A set whose elements live in the cache levels. Open with ``manager.set(name)``."""

    kind = "set"
    __slots__ = ()

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> set[Any]:
        return set(it)

    # -- the abstract methods ----------------------------------------------------------------

    def __contains__(self, elem: object) -> bool:
        return _readable(elem) and bool(self._ns.contains(elem))

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._ns.keys()))

    def __len__(self) -> int:
        return int(self._meta["len"])

    def add(self, elem: Any) -> None:
        hash(elem)
        if not self._ns.contains(elem):
            self._ns.put(elem, _PRESENT)
            self._add_len(1)

    def discard(self, elem: Any) -> None:
        if _readable(elem) and self._ns.contains(elem):
            self._ns.delete(elem)
            self._add_len(-1)

    # -- set API -----------------------------------------------------------------------------

    def remove(self, elem: Any) -> None:
        if not _readable(elem) or not self._ns.contains(elem):
            raise KeyError(elem)
        self._ns.delete(elem)
        self._add_len(-1)

    def pop(self) -> Any:
        for elem in self._ns.keys():
            self.remove(elem)
            return elem
        raise KeyError("pop from an empty set")

    def clear(self) -> None:
        keys = list(self._ns.keys())
        if keys:
            self._ns.delete_many(keys)
        if self._meta["len"]:
            self._meta["len"] = 0
            self._save_meta()

    def update(self, *others: Iterable[Any]) -> None:
        new: dict[Any, None] = {}
        for other in others:
            for elem in other:
                hash(elem)
                new[elem] = None
        if not new:
            return
        keys = list(new)
        present = self._ns.get_many(keys)
        added = [k for k in keys if k not in present]
        if added:
            self._ns.put_many([(k, _PRESENT) for k in added])
            self._add_len(len(added))

    def difference_update(self, *others: Iterable[Any]) -> None:
        for other in others:
            for elem in list(other):
                self.discard(elem)

    def intersection_update(self, *others: Iterable[Any]) -> None:
        keep = self.copy()
        for other in others:
            keep &= set(other)
        for elem in self.copy() - keep:
            self.discard(elem)

    def symmetric_difference_update(self, other: Iterable[Any]) -> None:
        for elem in set(other):
            if elem in self:
                self.discard(elem)
            else:
                self.add(elem)

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

    def issuperset(self, other: Iterable[Any]) -> bool:
        return all(elem in self for elem in other)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CacheableSet):
            other = other.copy()
        if not isinstance(other, (set, frozenset)):
            return MutableSet.__eq__(self, other)
        return len(self) == len(other) and self.copy() == other

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq
