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

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from .base import _MISSING, Cacheable

__all__ = ["CacheableDict"]


def _readable(key: Any) -> bool:
    """``hash(key)`` (so unhashable keys raise dict's TypeError), then: could it be stored?"""
    hash(key)
    if isinstance(key, (str, bytes, int)):
        return True
    if isinstance(key, tuple):
        return all(_readable(k) for k in key)
    return False


class CacheableDict(Cacheable, MutableMapping):
    """A dict whose entries live in the cache levels. Open with ``manager.dict(name)``."""

    kind = "dict"
    __slots__ = ()

    # -- the five abstract methods -----------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        if not _readable(key):
            raise KeyError(key)
        value = self._ns.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return self._load(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        hash(key)
        stored = self._store(value)
        is_new = not self._ns.contains(key)
        self._ns.put(key, stored)
        if is_new:
            self._add_len(1)

    def __delitem__(self, key: Any) -> None:
        if not _readable(key) or not self._ns.contains(key):
            raise KeyError(key)
        self._ns.delete(key)
        self._add_len(-1)

    def __iter__(self) -> Iterator[Any]:
        # A snapshot: mutating the dict while iterating is then harmless (a dict would raise).
        return iter(list(self._ns.keys()))

    def __len__(self) -> int:
        return int(self._meta["len"])

    # -- faster or dict-exact versions of the mixin methods ----------------------------------

    def __contains__(self, key: object) -> bool:
        return _readable(key) and bool(self._ns.contains(key))

    def get(self, key: Any, default: Any = None) -> Any:
        if not _readable(key):
            return default
        value = self._ns.get(key, _MISSING)
        return default if value is _MISSING else self._load(value)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        value = self._ns.get(key, _MISSING) if _readable(key) else _MISSING
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._ns.delete(key)
        self._add_len(-1)
        return self._load(value)

    def popitem(self) -> tuple[Any, Any]:
        for key in self._ns.keys():
            return key, self.pop(key)
        raise KeyError("popitem(): dictionary is empty")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        hash(key)
        value = self._ns.get(key, _MISSING) if _readable(key) else _MISSING
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
