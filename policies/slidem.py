"""SlideM: Bélády-style block replacement for sliding windows bigger than memory.

A sliding window has a fully predictable access pattern: a tuple is written once at the head of
the window and read once when it expires at the tail. Blocks of tuples therefore have known next
uses, and the clairvoyant rule (Bélády's MIN: evict what is needed farthest in the future) can be
applied exactly instead of being approximated.

*Single window* (SlideM, ICPE 2013). The block needed soonest is the ancient one (least recently
written, LRW); every later block is needed later in the order it was written, so the block needed
farthest away is the most recently written (MRW) one. Victim = the newest sealed block, which is
why a window of any length runs in two blocks of memory: one being filled, one being expired.
When the ancient block is exhausted its successor is known, so it is prefetched at once.

*Shared windows* (Shared SlideM, SSM). Several windows of different ranges read one repository;
each window ``i`` has its own ancient block ``a_i``. A block ``b`` is next used by the window
whose ancient block is the nearest one at or below it, after ``b - a_i`` blocks; windows already
past ``b`` never use it again. Victim = the block maximising ``min_i (b - a_i)`` over windows with
``a_i <= b`` (a block no window will use again has infinite distance and goes first). Distances
are measured in block sequence numbers, which is time for a stream of steady rate. With several
windows no block is prefetched: the frame it would take may be the next one another window needs.

*Plain keys.* The class satisfies the generic :class:`~mlcache.policies.base.Policy` contract, so
it can bound any level: integer keys are taken as block sequence numbers, other keys get their
insertion ordinal, and without window cursors the victim is the farthest position (the largest
sequence number) — the most-recently-written rule, which is also a scan-resistant MRU.
``access`` does not reorder: a block's next use depends on the windows, not on past reads.

Cost: ``insert``/``remove`` O(log n) without cursors (a lazy max-heap), O(n log w) per victim
with ``w`` cursors (a scan of resident blocks; buffer pools hold few blocks).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import numbers
from typing import Any, Hashable, Iterator

from .base import BasePolicy, _check_capacity, _check_heavy, _check_number, register_policy

__all__ = ["SlideMPolicy"]

_INF = float("inf")


@register_policy("slidem")
class SlideMPolicy(BasePolicy):
    name = "slidem"

    def __init__(self, capacity: int, **options: Any) -> None:
        super().__init__(capacity, **options)
        self._weights: dict[Hashable, int] = {}
        self._pos: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._ordinal = itertools.count()
        self._entry: dict[Hashable, int] = {}
        self._cursors: dict[Hashable, int] = {}
        self._sorted: list[int] = []

    # -- the generic Policy contract -------------------------------------------------------
    def __len__(self) -> int:
        return len(self._weights)

    def __contains__(self, key: object) -> bool:
        return key in self._weights

    def keys(self) -> Iterator[Hashable]:
        return iter(self._weights)

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if weight > self.capacity or not weight >= 0:
                # Heavier than the whole capacity: refused, before it is counted (an infinite
                # weight counted then taken off left a NaN total that never exceeds the
                # capacity).
                _check_heavy(weight, self.capacity)   # (or negative/NaN: a ValueError)
                self.remove(key)
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        old = self._weights.get(key)
        if old is not None:
            self.total_weight -= old
        else:
            n = next(self._ordinal)
            # (an int, not a float: float() of an int key past 1e308 raised OverflowError,
            # and past 2**53 distinct blocks got one position)
            pos = key if type(key) is int else n
            self._pos[key] = pos
            self._entry[key] = n
            heapq.heappush(self._heap, (-pos, -n, key))
            if len(self._heap) > 2 * len(self._weights) + 64:
                self._heap = [(-self._pos[k], -e, k) for k, e in self._entry.items()]
                heapq.heapify(self._heap)
        self._weights[key] = weight
        self.total_weight += weight
        return self._evict()

    def access(self, key: Hashable, ts: float | None = None) -> None:
        return None

    def remove(self, key: Hashable) -> None:
        if key in self._weights:
            self._forget(key)

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict()

    # -- the window side ---------------------------------------------------------------------
    def set_cursor(self, window: Hashable, seq: int) -> None:
        """Window ``window`` now expires from block ``seq`` (its ancient block)."""
        if isinstance(seq, bool) or not isinstance(seq, numbers.Integral):
            # checked before it is kept: None or a str stayed among the cursors, and every
            # later set_cursor failed to sort them; a NaN made every distance meaningless
            raise TypeError(f"set_cursor: seq must be a block sequence number (an int), "
                            f"got {seq!r}")
        self._cursors[window] = seq
        self._sorted = sorted(self._cursors.values())

    def drop_cursor(self, window: Hashable) -> None:
        if self._cursors.pop(window, None) is not None:
            self._sorted = sorted(self._cursors.values())

    def distance(self, key: Hashable) -> float:
        """Blocks until the next use of ``key`` by any window (infinite: never used again)."""
        if not self._sorted:
            return self._pos.get(key, _INF)
        pos = self._pos[key]
        i = bisect.bisect_right(self._sorted, pos)
        return _INF if i == 0 else pos - self._sorted[i - 1]

    def prefetch_candidates(self, newest: int) -> list[int]:
        """Blocks to load now: the single window's next ancient block, if sealed and not resident.

        With several windows nothing is prefetched (see the module header).
        """
        if len(self._cursors) != 1:
            return []
        seq = self._sorted[0]
        return [] if seq > newest or seq in self._weights else [seq]

    # -- internals -------------------------------------------------------------------------------
    def _forget(self, key: Hashable) -> None:
        self.total_weight -= self._weights.pop(key)
        del self._pos[key]
        del self._entry[key]

    def _evict(self) -> list:
        victims = []
        while self.total_weight > self.capacity and self._weights:
            key = self._victim()
            self._forget(key)
            victims.append(key)
        if not self._weights:
            self._heap.clear()
        return victims

    def _victim(self) -> Hashable:
        if self._sorted:
            return max(self._weights, key=lambda k: (self.distance(k), self._pos[k]))
        heap = self._heap
        while True:
            negpos, negn, key = heap[0]
            if self._entry.get(key) == -negn:
                return key
            heapq.heappop(heap)
