"""CacheableDict: a ``MutableMapping`` whose items are manager entries, one per key.

``len`` is O(1): the count lives in the metadata and changes only when a key is really added
or removed, which costs one ``contains`` (or one batched ``get_many`` in ``update``) per write
of a key this object has not seen. Iteration lists the keys of the structure's namespace merged
across all levels, tombstones respected, in no particular order (a plain dict keeps insertion
order; keeping it here would need an ordered index entry rewritten on every insert).
``popitem`` therefore removes *some* item, not the last inserted one.

Keys are what the manager accepts: ``str``, ``int``, ``bytes`` and tuples of them. An
unhashable key raises ``TypeError`` exactly as a dict does; another hashable but unsupported
key (a float) raises the manager's ``TypeError`` on write and is simply absent on read.
"""
from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from .base import _MISSING, Cacheable

__all__ = ["CacheableDict"]


_BAD: Any = object()


def _key(key: Any) -> Any:
    """The manager key standing for ``key``, or ``_BAD`` if no stored key can equal it.

    ``hash(key)`` comes first, so an unhashable key raises dict's ``TypeError``. Then, as a dict
    treats ``1 == 1.0 == True`` as one key, an integral float and any other integer type
    (``numpy.int64``) are folded into ``int``; a tuple is folded element-wise."""
    t = type(key)
    if t is str or t is int or t is bytes:
        return key
    hash(key)
    if isinstance(key, (str, bytes, int)):
        return key
    if isinstance(key, float):
        return int(key) if key.is_integer() else _BAD
    if isinstance(key, tuple):
        parts = tuple(_key(k) for k in key)
        if any(p is _BAD for p in parts):
            return _BAD
        return key if all(p is k for p, k in zip(parts, key)) else parts
    if hasattr(t, "__index__"):
        return operator.index(key)
    return _BAD


def _write_key(key: Any) -> Any:
    """``_key`` for a write: a key no stored key can stand for goes to the manager as it is,
    which raises its ``TypeError`` naming the type."""
    k = _key(key)
    return key if k is _BAD else k


def _readable(key: Any) -> bool:
    """Could ``key`` be stored? (``hash(key)`` first, so unhashable keys raise dict's TypeError.)"""
    return _key(key) is not _BAD


class CacheableDict(Cacheable, MutableMapping):
    """A dict whose entries live in the cache levels. Open with ``manager.dict(name)``."""

    kind = "dict"
    __slots__ = ()

    # -- the five abstract methods -----------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        k = _key(key)
        if k is _BAD:
            raise KeyError(key)
        value = self._ns.get(k, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return self._load(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _write_key(key)
        stored = self._store(value)
        is_new = not self._ns.contains(key)
        self._ns.put(key, stored)
        if is_new:
            self._add_len(1)

    def __delitem__(self, key: Any) -> None:
        k = _key(key)
        if k is _BAD or not self._ns.contains(k):
            raise KeyError(key)
        self._ns.delete(k)
        self._add_len(-1)

    def __iter__(self) -> Iterator[Any]:
        # A snapshot: mutating the dict while iterating is then harmless (a dict would raise).
        return iter(list(self._ns.keys()))

    def __len__(self) -> int:
        return int(self._meta["len"])

    # -- faster or dict-exact versions of the mixin methods ----------------------------------

    def __contains__(self, key: object) -> bool:
        k = _key(key)
        return k is not _BAD and bool(self._ns.contains(k))

    def get(self, key: Any, default: Any = None) -> Any:
        k = _key(key)
        if k is _BAD:
            return default
        value = self._ns.get(k, _MISSING)
        return default if value is _MISSING else self._load(value)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        k = _key(key)
        value = self._ns.get(k, _MISSING) if k is not _BAD else _MISSING
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._ns.delete(k)
        self._add_len(-1)
        return self._load(value)

    def popitem(self) -> tuple[Any, Any]:
        for key in self._ns.keys():
            return key, self.pop(key)
        raise KeyError("popitem(): dictionary is empty")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        key = _write_key(key)
        value = self._ns.get(key, _MISSING)
        if value is not _MISSING:
            return self._load(value)
        self._ns.put(key, self._store(default))
        self._add_len(1)
        return default

    def update(self, other: Any = (), /, **kwargs: Any) -> None:  # type: ignore[override]
        items: dict[Any, Any] = {}
        if isinstance(other, Mapping):
            for k in other:
                items[k] = other[k]
        elif hasattr(other, "keys"):
            for k in other.keys():
                items[k] = other[k]
        else:
            for k, v in other:
                items[k] = v
        items.update(kwargs)
        if not items:
            return
        keys = list(items)
        present = self._ns.get_many(keys)
        self._ns.put_many([(k, self._store(v)) for k, v in items.items()])
        self._add_len(len(keys) - len(present))

    def clear(self) -> None:
        keys = list(self._ns.keys())
        if keys:
            self._ns.delete_many(keys)
        if self._meta["len"]:
            self._meta["len"] = 0
            self._save_meta()

    def copy(self) -> dict[Any, Any]:
        """A plain ``dict`` with the current items (nested structures stay structures)."""
        keys = list(self._ns.keys())
        found = self._ns.get_many(keys)
        return {k: self._load(found[k]) for k in keys if k in found}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(self) != len(other):
            return False
        mine = self.copy()
        return mine == (other.copy() if isinstance(other, CacheableDict) else dict(other.items()))

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __or__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = self.copy()
        out.update(other)
        return out

    def __ror__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = dict(other)
        out.update(self.copy())
        return out

    def __ior__(self, other: Any) -> "CacheableDict":
        self.update(other)
        return self

    @classmethod
    def fromkeys(cls, *args: Any) -> Any:  # pragma: no cover - a dict classmethod
        raise TypeError("CacheableDict.fromkeys: open a dict with manager.dict(name), then "
                        "call update(dict.fromkeys(...))")
