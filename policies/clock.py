"""CLOCK (second chance): LRU's approximation with O(1) hits that touch only a bit.

Entries sit in insertion order with a reference bit. A hit sets the bit; the hand evicts the
first entry whose bit is clear, clearing bits (and giving a second chance) as it passes. Kept
as an ordered dict used as a ring, so a hit is one dict store, cheaper than LRU's reordering.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator

from .base import BasePolicy, _check_capacity, _check_heavy, _check_number, register_policy

__all__ = ["ClockPolicy"]

_NO_KEY = object()  # no newcomer to protect (None is a valid key)


@register_policy("clock")
class ClockPolicy(BasePolicy):
    name = "clock"

    def __init__(self, capacity: int, **options: Any) -> None:
        super().__init__(capacity, **options)
        self._ring: OrderedDict[Hashable, int] = OrderedDict()  # key -> weight
        self._referenced: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._ring)

    def __contains__(self, key: object) -> bool:
        return key in self._ring

    def keys(self) -> Iterator[Hashable]:
        return iter(self._ring)

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if weight > self.capacity or not weight >= 0:
                # can never fit: refuse it without disturbing the rest
                _check_heavy(weight, self.capacity)   # (or negative/NaN: a ValueError)
                self.remove(key)
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        old = self._ring.get(key)
        if old is not None:
            self.total_weight -= old
            self._referenced.add(key)
        self._ring[key] = weight
        self.total_weight += weight
        return self._evict(protect=key)

    def access(self, key: Hashable, ts: float | None = None) -> None:
        if key in self._ring:
            self._referenced.add(key)

    def remove(self, key: Hashable) -> None:
        weight = self._ring.pop(key, None)
        if weight is not None:
            self.total_weight -= weight
            self._referenced.discard(key)

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict()

    def _evict(self, protect: Hashable = _NO_KEY) -> list:
        # The hand chooses among the entries that were there before the insert: the newcomer
        # replaces the victim, as in CLOCK proper, instead of being its own victim (a value just
        # loaded and handed to the caller must stay resident, or in-place changes to it would
        # have no entry to be detected on).
        victims = []
        ring, referenced = self._ring, self._referenced
        while self.total_weight > self.capacity and ring:
            key, weight = ring.popitem(last=False)
            if (key in referenced or key == protect) and len(ring) > 0:
                referenced.discard(key)
                ring[key] = weight  # second chance: back to the tail of the ring
                continue
            referenced.discard(key)
            self.total_weight -= weight
            victims.append(key)
        return victims
