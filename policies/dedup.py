"""Dedup: LRU with dirty tracking and whole-namespace flush on dirty eviction (KIP-63).

Kafka Streams puts one *record cache* in front of each state store and of the records it
forwards downstream (KIP-63). Updates to a key overwrite each other in memory; on commit, or
when the cache must evict, every dirty key is written and forwarded once. Its per-store
``NamedCache`` keeps an LRU list of entries plus a ``dirtyKeys`` set in last-update order (a
re-put removes then re-adds the key), and ``evict()`` does: take the eldest entry; if it is dirty,
``flush()`` the *whole* dirty set of that store through its ``DirtyEntryFlushListener`` first,
then drop it. Flushing the whole set rather than the one entry keeps downstream on a consistent
cut: it never sees the update of an old key without the newer updates of that store.

This policy is that metadata, for mlcache keys: one LRU and one dirty order per namespace (the
part of a canonical byte key before ``\\x1f``; every other key type is one namespace). It sees
keys and weights only, and does no I/O. When a dirty eldest must leave, it hands the namespace's
dirty keys, in last-update order, to :attr:`flush_listener` (``fn(namespace, keys)``) and
forgets them as dirty, then evicts the eldest like a clean entry. Inside a manager the listener is
:class:`mlcache.recordcache.RecordCache`, which snapshots the values, forwards them and writes
them down; in the simulator there is none and the policy is plain per-namespace LRU that counts
flushes. Costs: O(1) per insert/access/mark (ordered dicts), O(dirty set) per namespace flush.

Dirty is independent of residency, as in Kafka where a delete is a cached ``null``: ``remove``
(the heap dropped the entry) keeps the key's dirty mark, and :meth:`delete` records a tombstone,
a dirty key with no resident entry, so a delete is forwarded in its place in the order.

Eviction order: an insert evicts from the namespace being written (the one that grows pays, as
Kafka's ``maybeEvict``), falling back to the other namespaces round robin when that namespace
holds nothing but the new key; :meth:`resize` evicts round robin, one entry per namespace in
turn (Kafka's ``ThreadCache.resize``), so shrinking a shared budget is fair to every namespace.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Iterator

from .base import (BasePolicy, _check_capacity, _check_heavy, _check_number, _config_error,
                   register_policy)

__all__ = ["DedupPolicy", "namespace_of"]

_SEP = b"\x1f"
_NO_KEY = object()  # no newcomer to protect (None is a valid key)


def namespace_of(key: Hashable) -> Hashable:
    """The namespace of a canonical mlcache byte key (its prefix up to the separator)."""
    if type(key) is bytes:
        i = key.find(_SEP)
        return key[:i + 1] if i >= 0 else b""
    return None


class _Space:
    """One namespace: its LRU of resident keys (key -> weight) and its dirty keys in order."""

    __slots__ = ("name", "lru", "dirty")

    def __init__(self, name: Hashable) -> None:
        self.name = name
        self.lru: OrderedDict[Hashable, int] = OrderedDict()
        self.dirty: dict[Hashable, None] = {}   # insertion order = last-update order


@register_policy("dedup")
class DedupPolicy(BasePolicy):
    name = "dedup"

    def __init__(self, capacity: int, *, namespace_of: Callable[[Hashable], Hashable] | None = None,
                 flush_listener: Callable[[Hashable, list], None] | None = None) -> None:
        super().__init__(capacity)
        if namespace_of is not None and not callable(namespace_of):
            raise _config_error("policy.dedup.namespace_of", "must be callable")
        self._ns_of = namespace_of or globals()["namespace_of"]
        self.flush_listener = flush_listener
        self._spaces: dict[Hashable, _Space] = {}
        self._home: dict[Hashable, _Space] = {}     # resident key -> its namespace
        self._rr = 0                                  # round-robin cursor over namespaces
        self.namespace_flushes = 0
        self.flushed_keys = 0

    # -- the Policy protocol ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._home)

    def __contains__(self, key: object) -> bool:
        return key in self._home

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._home))

    def _space(self, key: Hashable) -> _Space:
        sp = self._home.get(key)
        if sp is None:
            name = self._ns_of(key)
            sp = self._spaces.get(name)
            if sp is None:
                sp = self._spaces[name] = _Space(name)
        return sp

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if weight > self.capacity or not weight >= 0:
                # Heavier than the whole budget: never admitted (the storage refuses it too).
                _check_heavy(weight, self.capacity)   # (or negative/NaN: a ValueError)
                self.remove(key)
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        sp = self._home.get(key)
        if sp is not None:
            lru = sp.lru
            self.total_weight += weight - lru[key]
            lru.move_to_end(key)
        else:
            sp = self._space(key)
            self._home[key] = sp
            self.total_weight += weight
        sp.lru[key] = weight
        if self.total_weight <= self.capacity:
            return []
        return self._evict(sp, key)

    def access(self, key: Hashable, ts: float | None = None) -> None:
        sp = self._home.get(key)
        if sp is not None:
            sp.lru.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        """Forget the resident entry; a dirty mark stays (the record is still to be flushed)."""
        sp = self._home.pop(key, None)
        if sp is not None:
            self.total_weight -= sp.lru.pop(key)
            if not sp.lru and not sp.dirty:
                self._drop(sp)

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict(None, _NO_KEY)

    # -- dirty tracking -----------------------------------------------------------------------

    def mark_dirty(self, key: Hashable) -> None:
        """``key`` was updated: it moves to the back of its namespace's dirty order."""
        sp = self._home.get(key)
        d = (sp if sp is not None else self._space(key)).dirty
        if key in d:
            del d[key]
        d[key] = None

    def delete(self, key: Hashable) -> None:
        """A tombstone: the entry leaves, the key stays dirty (forwarded as a delete)."""
        self.remove(key)
        self.mark_dirty(key)

    def is_dirty(self, key: Hashable) -> bool:
        sp = self._home.get(key)
        if sp is None:
            sp = self._spaces.get(self._ns_of(key))
            if sp is None:
                return False
        return key in sp.dirty

    def dirty_count(self) -> int:
        return sum(len(sp.dirty) for sp in self._spaces.values())

    def dirty_namespaces(self) -> list[Hashable]:
        return [name for name, sp in self._spaces.items() if sp.dirty]

    def take_dirty(self, namespace: Hashable) -> list:
        """The namespace's dirty keys in last-update order; they are clean from now on."""
        sp = self._spaces.get(namespace)
        if sp is None or not sp.dirty:
            return []
        keys = list(sp.dirty)
        sp.dirty.clear()
        if not sp.lru:
            self._drop(sp)
        return keys

    def restore_dirty(self, namespace: Hashable, keys: Iterable[Hashable]) -> None:
        """Put back keys whose flush failed, ahead of the keys updated since (their order kept).

        A key updated again since the cut is already dirty at the back, where it belongs.
        """
        sp = self._spaces.get(namespace)
        if sp is None:
            sp = self._spaces[namespace] = _Space(namespace)
        back = sp.dirty
        sp.dirty = {k: None for k in keys if k not in back}
        sp.dirty.update(back)
        if not sp.dirty and not sp.lru:
            self._drop(sp)

    # -- eviction -----------------------------------------------------------------------------

    def _drop(self, sp: _Space) -> None:
        # A namespace with neither resident nor dirty keys is forgotten: kept, every namespace
        # ever written stayed in _spaces (memory) and in the scan of _pick, so an insert
        # that evicts from the other namespaces cost O(namespaces ever seen), not O(resident)
        # (50,000 one-key namespaces, half removed: 13 s of inserts). (_pick skipped empty
        # namespaces already; one written again now takes its turn after the others.)
        if self._spaces.get(sp.name) is sp:
            del self._spaces[sp.name]

    def _flush(self, sp: _Space) -> None:
        keys = list(sp.dirty)
        sp.dirty.clear()
        self.namespace_flushes += 1
        self.flushed_keys += len(keys)
        if self.flush_listener is not None:
            self.flush_listener(sp.name, keys)

    def _pick(self, prefer: _Space | None, protect: Hashable) -> _Space | None:
        if prefer is not None and (len(prefer.lru) > 1 or
                                   (prefer.lru and next(iter(prefer.lru)) != protect)):
            return prefer
        spaces = [sp for sp in self._spaces.values()
                  if sp.lru and not (len(sp.lru) == 1 and protect in sp.lru)]
        if not spaces:
            return None
        self._rr = (self._rr + 1) % len(spaces)
        return spaces[self._rr]

    def _evict(self, prefer: _Space | None, protect: Hashable) -> list:
        victims = []
        while self.total_weight > self.capacity:
            sp = self._pick(prefer, protect)
            if sp is None:
                if protect not in self._home:
                    break
                sp = self._home[protect]            # only the new key is left: it goes too
            key = next(iter(sp.lru))
            if key == protect and len(sp.lru) > 1:
                sp.lru.move_to_end(key)
                key = next(iter(sp.lru))
            if key in sp.dirty:
                self._flush(sp)
            self.total_weight -= sp.lru.pop(key)
            del self._home[key]
            victims.append(key)
            if not sp.lru and not sp.dirty:
                self._drop(sp)
        return victims
