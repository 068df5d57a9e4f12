"""The heap level: live Python objects, bounded by a Policy (entry count, bytes, or both).

The heap owns the values and the accounting; its policy only answers "who leaves" (STYLE 1).
Keys are the canonical byte keys of :mod:`mlcache.keys`, so the heap, the eviction buffer and
the byte levels all speak of an entry by the same name. Each entry has a dirty flag: a dirty
entry is newer than every copy below and must be written back before it may leave; a clean one
is dropped on eviction because an identical copy lives below.

Weights: with ``max_bytes`` the policy is bounded in bytes of memory: an entry weighs
:func:`estimate_size` of its value (a cheap walk over a sample of the contents that counts what
the allocator really hands out, not ``sys.getsizeof``), never less than its encoded size when the
caller knows it, plus ``entry_overhead`` for the bookkeeping around it. Memory the owner needs
beside the entries (buffers, memos, the policy's own tables) is taken off the policy's capacity
with :meth:`HeapLevel.reserve`, so the entries and that memory together stay within
``max_bytes``. With both bounds the policy counts bytes and the heap enforces the entry count by
asking the policy for extra victims (a temporary ``resize``), so one policy decides both.

Pinned entries are victims that could not be encoded: they stay readable in the heap, outside
the policy, until the value becomes encodable, is replaced or is deleted (the manager reports
them on the next flush).
"""
from __future__ import annotations

import collections
import enum
import inspect
import sys
from typing import Any, Hashable, Iterator, cast

from ..config import HeapConfig
from ..errors import ConfigError

__all__ = ["HeapLevel", "estimate_size", "resolve_policy"]

_SAMPLE = 32
_MAX_DEPTH = 3
_SCALARS = (int, float, bool, str, bytes, type(None), complex)
_FLAT = frozenset((bytes, str, bytearray, int, float, bool, type(None)))
# Containers whose items live in a second allocation beside the object: getsizeof counts both,
# the allocator rounds each (the object part is getsizeof of an empty one).
_SPLIT = {t: sys.getsizeof(t()) for t in (list, dict, set, frozenset, bytearray)}
_SHARED = (type(None), bool)   # singletons: a reference costs nothing
# containers walked by isinstance when not of an exact type above (subclasses, deque)
_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)
_SLOTS: dict[type, tuple[Any, ...]] = {}   # slot descriptors by class, see _slots_of
_MEMBER = type(type("_S", (), {"__slots__": ("x",)}).__dict__["x"])   # a slot's descriptor


def _alloc(n: int) -> int:
    """Bytes the allocator really takes for a request of ``n`` (CPython on 64-bit Linux):
    pymalloc rounds up to 16 up to 512 bytes (a float's 24 bytes take 32), malloc adds an
    8-byte header and rounds to 16, mmap (large blocks) rounds to pages."""
    if n <= 512:
        return (n + 15) & -16
    if n < 131072:
        return (n + 23) & -16
    return (n + 4111) & -4096


def estimate_size(value: Any, _depth: int = 0) -> int:
    """Approximate deep size in bytes as allocated (``sys.getsizeof`` of each object, rounded
    the way the allocator rounds it); samples big containers and stops at a small depth.
    Shared singletons (None, booleans, small ints) cost nothing."""
    t = type(value)
    if t in _SHARED or (t is int and -5 <= value <= 256):
        return 0
    try:
        size = sys.getsizeof(value, 64)
    except Exception:
        # a __sizeof__ that fails or returns a negative or non-int: weighing is an estimate,
        # and a put must not fail half done over it: the object's own struct instead
        size = object.__sizeof__(value)
    split = _SPLIT.get(t)
    if split is not None and size > split:
        size = _alloc(split) + _alloc(size - split)
    else:
        size = _alloc(size)
    if t in _SCALARS or _depth >= _MAX_DEPTH:
        return size
    if t is dict:
        n = len(value)
        if not n:
            return size
        items = value.items()
        total = 0
        for i, (k, v) in enumerate(items):
            if i == _SAMPLE:
                break
            total += estimate_size(k, _depth + 1) + estimate_size(v, _depth + 1)
        return size + total * n // min(n, _SAMPLE)
    if t in (list, tuple, set, frozenset):
        n = len(value)
        if not n:
            return size
        total = 0
        for i, item in enumerate(value):
            if i == _SAMPLE:
                break
            total += estimate_size(item, _depth + 1)
        return size + total * n // min(n, _SAMPLE)
    if isinstance(value, _CONTAINERS):
        # a subclass (Counter, defaultdict, OrderedDict) or a deque: its contents too, not
        # only its table (a defaultdict(list) of 1,000 lists weighed 26 KB for 458 KB)
        size += _contents_size(value, _depth)
    if isinstance(t, enum.EnumMeta):
        return 0   # an enum member is a singleton, shared like None (its __dict__ is big)
    slots = _SLOTS.get(t)
    if slots is None:
        slots = _slots_of(t)
    for slot in slots:
        # __slots__ hold their values outside any __dict__ (a dataclass(slots=True) record
        # of a 1,000-float list weighed 48 bytes for 32 KB); read through the slot itself, so
        # an unset one raises AttributeError without calling a __getattr__
        try:
            size += estimate_size(slot.__get__(value, t), _depth + 1)
        except Exception:
            pass
    try:
        attrs = getattr(value, "__dict__", None)
    except Exception:   # a __getattr__ raising something else than AttributeError
        attrs = None
    if type(attrs) is dict:
        size += estimate_size(attrs, _depth + 1)
    return size


def _slots_of(t: type) -> tuple[Any, ...]:
    """The slot descriptors of ``t`` and its bases (the members ``__slots__`` made), at most
    ``_SAMPLE`` of them; remembered per type."""
    slots = [member for klass in t.__mro__ for member in vars(klass).values()
             if type(member) is _MEMBER]
    if len(_SLOTS) >= 4096:   # classes made on the fly: keep the memo bounded
        _SLOTS.clear()
    out = _SLOTS[t] = tuple(slots[:_SAMPLE])
    return out


def _contents_size(value: Any, depth: int) -> int:
    """What :func:`estimate_size` adds for the contents of a container that is not of an
    exact built-in type: its items, sampled the same way (nothing if iterating it fails)."""
    try:
        n = len(value)
        if not n:
            return 0
        items = iter(value.items()) if isinstance(value, dict) else iter(value)
        total = 0
        for i, item in enumerate(items):
            if i == _SAMPLE:
                break
            if isinstance(value, dict):
                total += estimate_size(item[0], depth + 1) + estimate_size(item[1], depth + 1)
            else:
                total += estimate_size(item, depth + 1)
        return total * n // min(n, _SAMPLE)
    except Exception:
        return 0


def resolve_policy(name: str) -> tuple[type, bool]:
    """The policy class for ``name`` and whether it is the stand-in for a missing ``wtinylfu``."""
    from mlcache.policies import get_policy

    try:
        return get_policy(name), False
    except ConfigError as exc:
        if name == "wtinylfu":
            # The default policy ships in its own module; a build without it degrades to LRU
            # rather than refusing the default configuration.
            return get_policy("lru"), True
        raise ConfigError("heap.policy", str(exc).split(": ", 1)[-1]) from None


class HeapLevel:
    """Live objects keyed by canonical bytes, with dirty flags, bounded by a policy."""

    name = "heap"
    shared = False
    # Bytes charged per entry for the bookkeeping around the value (dict slots, policy node,
    # dirty flag, ...) and, when set, twice the key's length; the manager sets it, a bare
    # HeapLevel charges values only.
    entry_overhead = 0
    # A bytes-bounded heap sizes a frequency sketch for one entry per this many bytes of
    # budget; the policy grows it when more entries are resident (and the heap follows).
    bytes_per_expected_entry = 16384

    def __init__(self, config: HeapConfig) -> None:
        self.config = config
        self.max_entries = config.max_entries
        self.max_bytes = config.max_bytes
        self.by_bytes = config.max_bytes is not None
        cls, fallback = resolve_policy(config.policy)
        options = {} if fallback else dict(config.policy_options)
        capacity = config.max_bytes if self.by_bytes else config.max_entries
        assert capacity is not None
        self.capacity = capacity
        if (self.by_bytes and "expected_entries" not in options
                and "expected_entries" in inspect.signature(cls).parameters):
            # Capacity in bytes says nothing of the entry count; a sketch sized as if every
            # byte were an entry (up to 64K entries: 2.5 MiB) would cost more than it helps.
            options["expected_entries"] = max(64, capacity // self.bytes_per_expected_entry)
        try:
            self.policy = cls(capacity, **options)
        except ConfigError as exc:   # the policy names itself; the user set heap.policy_options
            raise ConfigError("heap.policy_options", str(exc)) from None
        except TypeError as exc:
            raise ConfigError("heap.policy_options", str(exc)) from None
        batch = getattr(self.policy, "insert_many", None)
        # a policy's insert_many that can skip its checks when told the keys are fresh
        self._fresh_ok = batch is not None and "fresh" in inspect.signature(batch).parameters
        self.data: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()
        self.weights: dict[bytes, int] = {}   # kept when bounded by bytes (by count: all 1)
        self.pinned: set[bytes] = set()
        self.tracked_weight = 0
        # Memory charged to the budget beside the entries: the owner's (reserve()) and the
        # policy's own tables (a frequency sketch), followed as the sketch grows.
        self.reserved = 0
        self._sketch = getattr(self.policy, "sketch", None) if self.by_bytes else None
        if self._sketch is not None and not hasattr(self._sketch, "nbytes"):
            self._sketch = None
        self._sketch_bytes = self._sketch.nbytes if self._sketch is not None else 0
        self._sketch_cap = self._sketch.capacity if self._sketch is not None else 0
        if self._sketch_bytes:
            self._apply_capacity()

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def keys(self) -> Iterator[bytes]:
        return iter(list(self.data))

    @property
    def used_bytes(self) -> int:
        return sum(self.weights.values()) if self.by_bytes else 0

    def weigh(self, value: Any, size: int | None) -> int:
        if not self.by_bytes:
            return 1
        if size is None or type(value) not in _FLAT:
            # The budget is memory: a container takes several times its encoded size (a dict
            # of 24 floats: ~280 bytes of msgpack, ~1.6 KB of objects), so never weigh it less.
            estimate = estimate_size(value)
            size = estimate if size is None else max(size, estimate)
        return max(1, size + self.entry_overhead)

    @property
    def policy_bytes(self) -> int:
        """Bytes of the policy's own tables charged to the budget (its frequency sketch)."""
        return self._sketch_bytes

    def reserve(self, nbytes: int) -> list[tuple[bytes, Any, bool]]:
        """Charge ``nbytes`` of memory kept beside the entries (buffers, memos) to a
        bytes-bounded heap: the policy's capacity becomes ``max_bytes`` minus it and the
        policy's tables, never less than half of ``max_bytes``. Returns the victims."""
        self.reserved = max(0, int(nbytes))
        return self._apply_capacity()

    def _apply_capacity(self) -> list[tuple[bytes, Any, bool]]:
        if not self.by_bytes or self.max_bytes is None:
            return []
        sketch = self._sketch
        if sketch is not None:
            self._sketch_bytes, self._sketch_cap = sketch.nbytes, sketch.capacity
        capacity = max(self.max_bytes // 2, self.max_bytes - self.reserved - self._sketch_bytes)
        if capacity == self.capacity:
            return []
        self.capacity = capacity
        return self._take(self.policy.resize(capacity))

    def insert(self, key: bytes, value: Any, *, dirty: bool, size: int | None = None,
               ts: float | None = None, weight: int | None = None,
               ) -> list[tuple[bytes, Any, bool]]:
        """Insert or replace; return the victims as ``(key, value, was_dirty)``.

        The victims may include ``key`` itself when the policy declines to admit it.
        ``weight``: the value's memory in bytes as its owner keeps it (a structure that
        maintains its nodes' sizes), used instead of weighing the value.
        """
        if weight is None:
            weight = self.weigh(value, size)
        else:
            weight = max(1, weight + self.entry_overhead) if self.by_bytes else 1
        if self.entry_overhead:
            weight += len(key) << 1   # the canonical key, a second copy when the memo missed
        data = self.data
        if weight > self.capacity:
            # Heavier than the whole heap: never admitted, and not worth flushing the heap for.
            self.remove(key)
            return [(key, value, dirty)]
        if key in self.pinned:
            self.pinned.discard(key)
        elif self.by_bytes:
            self.tracked_weight -= self.weights.get(key, 0)
        data[key] = value
        if self.by_bytes:
            # (bounded by count, every weight is 1: the policy counts, nothing here needs it)
            self.weights[key] = weight
            self.tracked_weight += weight
        if dirty:
            self.dirty.add(key)
        else:
            self.dirty.discard(key)
        victims = self._take(self.policy.insert(key, weight, ts))
        sketch = self._sketch
        if sketch is not None and sketch.capacity != self._sketch_cap:
            victims.extend(self._apply_capacity())   # the policy grew its sketch
        if self.max_entries is not None and self.by_bytes:
            while len(data) - len(self.pinned) > self.max_entries:
                extra = self.policy.resize(max(1, self.tracked_weight - 1))
                self.policy.resize(self.capacity)
                if not extra:
                    break
                victims.extend(self._take(extra))
        return victims

    def insert_many(self, keys: list[bytes], values: list[Any], sizes: Any, *,
                    ts: float | None = None, weights: list[int | None] | None = None,
                    absent: bool = False) -> tuple[list[tuple[bytes, Any, bool]], list[bytes]]:
        """Insert a batch of clean entries (values just read from a lower level), distinct keys,
        as :meth:`insert` would one by one; return ``(victims, refused)``: ``refused`` lists
        the keys of the batch that did not stay (the policy declined them, or a later key of
        the batch pushed them out: unchanged either way), ``victims`` the other entries that
        left, as :meth:`insert` gives them.

        With a heap bounded by entry count (every weight 1) and no key of the batch resident,
        the entries go in with one ``dict.update`` call and the policy takes the keys in one
        ``insert_many`` call when it has one (W-TinyLFU), else key by key. ``sizes``: an
        iterable of the encoded sizes (only a byte-bounded heap reads it); ``absent``: the
        caller knows no key is resident (not checked again).
        """
        data = self.data
        lost: list[tuple[bytes, Any, bool]]
        if self.by_bytes or self.entry_overhead or (
                not absent and not data.keys().isdisjoint(keys)):
            lost = []
            insert = self.insert
            for i, (key, value, size) in enumerate(zip(keys, values, sizes)):
                out = insert(key, value, dirty=False, size=size, ts=ts,
                             weight=None if weights is None else weights[i])
                if out:
                    lost.extend(out)
        else:
            if len(keys) != len(values):
                raise ValueError("insert_many: as many values as keys")
            # Absent keys are neither pinned nor dirty, and weigh 1 (no byte bound: no weights
            # kept, see insert).
            data.update(zip(keys, values))
            policy = self.policy
            batch = getattr(policy, "insert_many", None)
            if batch is not None:
                # distinct (the caller's promise) and absent: the policy need not check
                lost_keys = batch(keys, ts, fresh=True) if self._fresh_ok else batch(keys, ts)
            else:
                insert = policy.insert
                lost_keys = []
                for key in keys:
                    out = insert(key, 1, ts)
                    if out:
                        lost_keys.extend(out)
            if not lost_keys:
                return [], []
            lost = self._take(lost_keys)
        if not lost:
            return [], []
        mine = dict.fromkeys(keys)
        refused = [k for k, _, _ in lost if k in mine]
        if refused:
            lost = [v for v in lost if v[0] not in mine]
        return lost, refused

    def reweigh(self, key: bytes, size: int, weight: int | None = None
                ) -> list[tuple[bytes, Any, bool]]:
        """A resident value was changed in place (its new encoding is ``size`` bytes): weigh
        it again, as :meth:`insert` would, and return the victims if it no longer fits (the
        entry itself when it is now heavier than the heap). ``weight``: as for insert."""
        if not self.by_bytes or key in self.pinned or key not in self.data:
            return []
        value = self.data[key]
        if weight is None:
            weight = self.weigh(value, size)
        else:
            weight = max(1, weight + self.entry_overhead)
        if self.entry_overhead:
            weight += len(key) << 1
        old = self.weights.get(key, 0)
        if weight == old:
            return []
        if weight > self.capacity:
            dirty = key in self.dirty
            self.remove(key)
            return [(key, value, dirty)]
        self.weights[key] = weight
        self.tracked_weight += weight - old
        victims = self._take(self.policy.insert(key, weight, None))
        sketch = self._sketch
        if sketch is not None and sketch.capacity != self._sketch_cap:
            victims.extend(self._apply_capacity())
        return victims

    def _take(self, keys: list[Hashable]) -> list[tuple[bytes, Any, bool]]:
        # the policy hands back the keys it was given: this level's byte keys
        out: list[tuple[bytes, Any, bool]] = []
        data, dirty, weights = self.data, self.dirty, self.weights
        for k in cast("list[bytes]", keys):
            value = data.pop(k)
            self.tracked_weight -= weights.pop(k, 0)
            was_dirty = k in dirty
            if was_dirty:
                dirty.discard(k)
            out.append((k, value, was_dirty))
        return out

    def remove(self, key: bytes) -> tuple[Any, bool] | None:
        """Drop ``key``; return ``(value, was_dirty)`` or None if absent."""
        if key not in self.data:
            return None
        value = self.data.pop(key)
        weight = self.weights.pop(key, 0)
        if key in self.pinned:
            self.pinned.discard(key)
        else:
            self.tracked_weight -= weight
            self.policy.remove(key)
        was_dirty = key in self.dirty
        self.dirty.discard(key)
        return value, was_dirty

    def pin(self, key: bytes, value: Any, dirty: bool) -> None:
        """Keep a victim that could not be written down, outside the policy."""
        self.data[key] = value
        self.weights[key] = 0
        self.pinned.add(key)
        if dirty:
            self.dirty.add(key)

    def unpin(self, key: bytes) -> None:
        if key in self.pinned:
            self.pinned.discard(key)
            self.data.pop(key, None)
            self.weights.pop(key, None)
            self.dirty.discard(key)

    def compact(self) -> None:
        """Give back the table of a dirty set a flush emptied (a set keeps its table when its
        entries are discarded: room for every entry once dirty would stay allocated)."""
        dirty = self.dirty
        size = sys.getsizeof(dirty)
        if size > 4096 and 128 * len(dirty) < size:   # under 1/8 full (16 bytes per slot)
            self.dirty = set(dirty)

    def clear(self) -> None:
        for key in list(self.data):
            self.remove(key)

    def drop_all(self) -> None:
        """Forget every entry at once, without telling the policy (the manager's close():
        nothing is read or written afterwards), so the accounted bytes read 0 like the
        entries."""
        self.data.clear()
        self.dirty.clear()
        self.weights.clear()
        self.pinned.clear()
        self.tracked_weight = 0
