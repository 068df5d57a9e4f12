"""TAC: Timestamp-Aware Caching — one eviction order by event timestamp.

From the keyed-prefetching work for stream processing: an operator's state is used at known
*event times*. An entry that was used carries the event time of its last access; an entry that
was prefetched (or hinted while resident) carries the event time at which it is expected to be
used. Both live on one axis, and the entry with the smallest timestamp is the one whose use is
furthest in the past and not expected again soon: that is the victim. A hint for a resident
key renews it (its timestamp moves forward to the expected use), so state the prefetcher
announced survives until its tuple arrives, while state already consumed ages out like LRU.

Timestamps never move backwards (``max`` of the old and new time), so out-of-order events do
not make a hinted entry forget its expected use. ``ts=None`` means "now": the largest event time
that has *happened* -- given to an access or insert, or announced with :meth:`advance` -- never
a hint's time (a hint is a future use) and never a wall clock. A hinted entry keeps its expected
use as its key until an access at or after that time. Ties are broken by arrival order (older first), so with no timestamps at all TAC
is exactly LRU.

Costs: a binary heap of ``(ts, seq, key)`` items, one per resident key, with lazy renewal. A
timestamp only moves forward, so an entry's item can only be *behind* it (an item sorts at or
before its entry's true ``(ts, seq)``). An access or hint therefore just updates the entry: O(1),
no push. When an item surfaces at an eviction (or ``next_victim``) and its entry moved on since,
it is pushed again with the entry's current ``(ts, seq)``; when it surfaces accurate it sorts
before every other item, hence before every other entry's true position, and it is the victim.
Each renewal costs at most one re-push, paid only if the entry reaches the top of the heap,
so O(log n) per operation, amortised; a key renewed many times between evictions (a hot key, or
a prefetched key: inserted, hinted with its expected use, used at that time) costs one push, not
one per renewal (before: three pushes per prefetched key). Items of removed keys are discarded
as they surface, and the heap is rebuilt when they outnumber live ones. A sorted container would
give the same bound with a larger constant; the heap needs no dependency. A batch of fresh keys
(a batched read from below) goes in through :meth:`insert_many` in one pass with one eviction.

Weights: ``capacity`` bounds the total weight; eviction pops smallest timestamps until the new
total fits (possibly the newcomer itself, when it is the oldest — e.g. a stale prefetch). A NaN
timestamp is a ValueError (it compares false with every time, so it would break the order).
"""
from __future__ import annotations

import heapq
from typing import Any, Hashable, Iterator

from .base import BasePolicy, _check_capacity, _check_number, register_policy

__all__ = ["TACPolicy"]


def _nan_error() -> ValueError:
    # NaN compares false with every time: an entry stamped NaN could never be renewed and would
    # sit in the heap out of order.
    return ValueError("TAC timestamp must be a number, got nan")


@register_policy("tac")
class TACPolicy(BasePolicy):
    name = "tac"

    def __init__(self, capacity: int, **options: Any) -> None:
        super().__init__(capacity, **options)
        self._entries: dict[Hashable, list] = {}  # key -> [ts, seq, weight, seq of its heap item]
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = 0
        self._now = float("-inf")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._entries))

    def timestamp(self, key: Hashable) -> float | None:
        """The event time ``key`` is ordered by (None if not resident)."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    @property
    def now(self) -> float:
        """The latest event time reached (accesses, inserts, :meth:`advance`); -inf before any."""
        return self._now

    def front(self) -> float | None:
        """Where the evictions are: the timestamp at the top of the eviction order (None if
        empty). An entry that is not renewed leaves once the evictions reach its timestamp.
        Read without reordering, so it may be called without the owner's lock (a prefetch
        hint does); exact after an eviction, else a lower bound (an entry renewed or removed
        since leaves its old item behind until the top is next cleaned)."""
        heap = self._heap
        try:
            return heap[0][0]
        except IndexError:
            return None

    def next_victim(self) -> Hashable:
        """The key an eviction would remove now: the smallest timestamp (KeyError if empty)."""
        key = self._top()
        if key is None:
            raise KeyError("empty policy")
        return key

    def _top(self) -> Hashable | None:
        """Bring the true minimum to the top of the heap (re-pushing renewed entries, dropping
        items of removed keys) and return its key, or None if empty."""
        heap, entries = self._heap, self._entries
        while heap:
            ts, seq, key = heap[0]
            entry = entries.get(key)
            if entry is None or entry[3] != seq:
                heapq.heappop(heap)          # the key was removed (or removed and re-inserted)
            elif entry[1] != seq:            # renewed since pushed: move it to its true place
                entry[3] = entry[1]
                heapq.heapreplace(heap, (entry[0], entry[1], key))
            else:
                return key
        return None

    def _rebuild(self) -> None:
        """Drop the items of removed keys: one accurate item per entry."""
        heap = []
        for k, e in self._entries.items():
            e[3] = e[1]
            heap.append((e[0], e[1], k))
        heapq.heapify(heap)
        self._heap = heap

    def _time(self, ts: float | None) -> float:
        if ts is None:
            return self._now if self._now != float("-inf") else 0.0
        if ts != ts:
            raise _nan_error()
        if ts > self._now:
            self._now = ts
        return ts

    def _renew(self, key: Hashable, ts: float | None) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        t = self._time(ts)
        if t >= entry[0]:  # equal times still refresh the arrival order (LRU among ties)
            entry[0] = t
            self._seq += 1
            entry[1] = self._seq       # its heap item is now behind it: re-pushed if it surfaces

    def access(self, key: Hashable, ts: float | None = None) -> None:
        self._renew(key, ts)

    def advance(self, ts: float) -> None:
        """The event time ``ts`` has been reached (a record at ``ts`` is being processed).

        Accesses and inserts without a timestamp are stamped with this clock. The lookahead
        operator calls it (through the manager) as it hands each record over, so callers that
        ``get``/``put`` without ``ts`` still order used entries by the time of their use,
        behind every entry hinted for a record still to come. Never moves backwards.
        """
        if ts != ts:
            raise _nan_error()
        if ts > self._now:
            self._now = ts

    def hint(self, key: Hashable, ts: float) -> None:
        if ts != ts:
            raise _nan_error()
        entry = self._entries.get(key)
        if entry is not None and ts > entry[0]:
            entry[0] = ts  # expected use: do not advance "now", it has not happened yet
            self._seq += 1
            entry[1] = self._seq

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if not weight >= 0:  # NaN or negative: the total would stop bounding anything
                raise ValueError(f"weight must be a non-negative number, got {weight!r}")
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        entry = self._entries.get(key)
        if entry is not None:
            self.total_weight += weight - entry[2]
            entry[2] = weight
            self._renew(key, ts)
        else:
            self._seq += 1
            entry = [self._time(ts), self._seq, weight, self._seq]
            self._entries[key] = entry
            self.total_weight += weight
            heapq.heappush(self._heap, (entry[0], entry[1], key))
            if len(self._heap) > 2 * len(self._entries) + 64:
                self._rebuild()
        return self._evict() if self.total_weight > self.capacity else []

    def insert_many(self, keys: list, ts: float | None = None, *, fresh: bool = False) -> list:
        """``insert(key, 1, ts)`` for each of ``keys`` in order; the keys that left (each once).

        A batch read from a lower level (the heap level calls it). ``fresh``: the caller knows
        the keys are distinct and none is resident; then the keys go in with one pass and the
        evictions follow in one, for ~1 µs less a key. The same keys leave as key by key: the
        batch's keys weigh 1, share one time and come in arrival order, so key by key every
        eviction removed the least ``(ts, seq)`` present, no key came in below one evicted
        before it, and what left was the shortest prefix of the ``(ts, seq)`` order whose
        removal fits -- what one eviction at the end removes.
        """
        if not fresh:
            return self._insert_each(keys, ts, False)
        t = self._time(ts)
        entries, heap = self._entries, self._heap
        seq = self._seq
        push = heapq.heappush
        for key in keys:
            seq += 1
            entries[key] = [t, seq, 1, seq]
            push(heap, (t, seq, key))
        self._seq = seq
        self.total_weight += len(keys)
        if len(heap) > 2 * len(entries) + 64:
            self._rebuild()
        return self._evict() if self.total_weight > self.capacity else []

    def remove(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_weight -= entry[2]

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict()

    def _evict(self) -> list:
        # (_top written out: this loop runs once per key a full cache takes in)
        victims: list = []
        heap, entries = self._heap, self._entries
        total, capacity = self.total_weight, self.capacity
        pop = heapq.heappop
        while total > capacity and heap:
            ts, seq, key = heap[0]
            entry = entries.get(key)
            if entry is None or entry[3] != seq:
                pop(heap)                    # the key was removed (or removed and re-inserted)
            elif entry[1] != seq:            # renewed since pushed: move it to its true place
                entry[3] = entry[1]
                heapq.heapreplace(heap, (entry[0], entry[1], key))
            else:
                pop(heap)
                del entries[key]
                total -= entry[2]
                victims.append(key)
        self.total_weight = total
        return victims
