"""The heap level: live Python objects, bounded by a Policy (entry count, bytes, or both).

The heap owns the values and the accounting; its policy only answers "who leaves" (STYLE 1).
Keys are the canonical byte keys of :mod:`mlcache.keys`, so the heap, the eviction buffer and
the byte levels all speak of an entry by the same name. Each entry has a dirty flag: a dirty
entry is newer than every copy below and must be written back before it may leave; a clean one
is dropped on eviction because an identical copy lives below.

Weights: with ``max_bytes`` the policy is bounded in bytes and an entry weighs its encoded size
when the caller knows it (a load, or a put that was encoded anyway), else :func:`estimate_size`,
a cheap ``sys.getsizeof`` walk over a sample of the contents. With both bounds the policy counts
bytes and the heap enforces the entry count by asking the policy for extra victims (a temporary
``resize``), so one policy decides both.

Pinned entries are victims that could not be encoded: they stay readable in the heap, outside
the policy, until the value becomes encodable, is replaced or is deleted (the manager reports
them on the next flush).
"""
from __future__ import annotations

import sys
from typing import Any, Hashable, Iterator

from ..config import HeapConfig
from ..errors import ConfigError

__all__ = ["HeapLevel", "estimate_size", "resolve_policy"]

_SAMPLE = 32
_MAX_DEPTH = 3
_SCALARS = (int, float, bool, str, bytes, type(None), complex)
_FLAT = frozenset((bytes, str, bytearray, int, float, bool, type(None)))


def estimate_size(value: Any, _depth: int = 0) -> int:
    """Approximate deep size in bytes; samples big containers and stops at a small depth."""
    size = sys.getsizeof(value, 64)
    t = type(value)
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
    attrs = getattr(value, "__dict__", None)
    if type(attrs) is dict:
        size += estimate_size(attrs, _depth + 1)
    return size


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
    # Bytes charged per entry for the bookkeeping around the value (key object, dict slots,
    # policy node, dirty flag); the manager sets it, a bare HeapLevel charges values only.
    entry_overhead = 0

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
        try:
            self.policy = cls(capacity, **options)
        except ConfigError:
            raise
        except TypeError as exc:
            raise ConfigError("heap.policy_options", str(exc)) from None
        self.data: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()
        self.weights: dict[bytes, int] = {}
        self.pinned: set[bytes] = set()
        self.tracked_weight = 0

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

    def insert(self, key: bytes, value: Any, *, dirty: bool, size: int | None = None,
               ts: float | None = None) -> list[tuple[bytes, Any, bool]]:
        """Insert or replace; return the victims as ``(key, value, was_dirty)``.

        The victims may include ``key`` itself when the policy declines to admit it.
        """
        weight = self.weigh(value, size)
        data = self.data
        if weight > self.capacity:
            # Heavier than the whole heap: never admitted, and not worth flushing the heap for.
            self.remove(key)
            return [(key, value, dirty)]
        if key in self.pinned:
            self.pinned.discard(key)
        else:
            self.tracked_weight -= self.weights.get(key, 0)
        data[key] = value
        self.weights[key] = weight
        self.tracked_weight += weight
        if dirty:
            self.dirty.add(key)
        else:
            self.dirty.discard(key)
        victims = self._take(self.policy.insert(key, weight, ts))
        if self.max_entries is not None and self.by_bytes:
            while len(data) - len(self.pinned) > self.max_entries:
                extra = self.policy.resize(max(1, self.tracked_weight - 1))
                self.policy.resize(self.capacity)
                if not extra:
                    break
                victims.extend(self._take(extra))
        return victims

    def _take(self, keys: list[Hashable]) -> list[tuple[bytes, Any, bool]]:
        out = []
        data, dirty, weights = self.data, self.dirty, self.weights
        for k in keys:
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

    def clear(self) -> None:
        for key in list(self.data):
            self.remove(key)
