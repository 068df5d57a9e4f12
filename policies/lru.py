"""Least recently used: the baseline every other policy is compared with."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator

from .base import BasePolicy, _check_capacity, _check_heavy, _check_number, register_policy

__all__ = ["LRUPolicy"]


@register_policy("lru")
class LRUPolicy(BasePolicy):
    name = "lru"

    def __init__(self, capacity: int, **options: Any) -> None:
        super().__init__(capacity, **options)
        self._order: OrderedDict[Hashable, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def keys(self) -> Iterator[Hashable]:
        return iter(self._order)

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if weight > self.capacity or not weight >= 0:
                # can never fit: refuse it without emptying the cache
                _check_heavy(weight, self.capacity)   # (or negative/NaN: a ValueError)
                self.remove(key)
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        order = self._order
        old = order.get(key)
        if old is not None:
            self.total_weight -= old
            order.move_to_end(key)
        order[key] = weight
        self.total_weight += weight
        return self._evict()

    def access(self, key: Hashable, ts: float | None = None) -> None:
        try:
            self._order.move_to_end(key)
        except KeyError:
            pass

    def remove(self, key: Hashable) -> None:
        weight = self._order.pop(key, None)
        if weight is not None:
            self.total_weight -= weight

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict()

    def _evict(self) -> list:
        victims = []
        order = self._order
        while self.total_weight > self.capacity and order:
            key, weight = order.popitem(last=False)
            self.total_weight -= weight
            victims.append(key)
        return victims
