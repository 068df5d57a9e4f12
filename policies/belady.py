"""Bélády's optimum (OPT / MIN): evict the entry whose next use is farthest in the future.

L. A. Bélády, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
Journal 5(2), 1966. For unit-size entries, evicting the entry re-referenced farthest in the
future maximises hits; it is the bound every online policy in the simulator is measured
against. It needs the whole trace, so it exists for the simulator only (``needs_future``): the
player builds it with ``trace=keys``.

The variant is OPT *with bypass*: a newcomer whose next use is farther than every resident's is
not admitted (returned as its own victim), as in Caffeine's simulator and the published OPT
figures for the ARC and LIRS traces.

The policy follows the trace with a cursor: each ``insert``/``access`` of the key at the
cursor advances it and learns that request's next use from a table precomputed in one
backward pass. A call that does not match the cursor (tests, or a caller replaying a different
order) looks the key's next occurrence up by bisection, so the policy stays correct — merely
less clairvoyant — off the script. Keys absent from the future are evicted first.

Costs: O(n) memory and preprocessing for a trace of n requests; a max-heap of next uses with
lazy deletion makes each request O(log capacity) amortised. With weights it evicts farthest
first until the new entry fits — a heuristic, since weighted OPT is NP-hard.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Any, Hashable, Iterator, Sequence

from .base import BasePolicy, _check_capacity, _check_number, _config_error, register_policy

__all__ = ["BeladyPolicy"]


@register_policy("belady")
class BeladyPolicy(BasePolicy):
    name = "belady"
    needs_future = True

    def __init__(self, capacity: int, *, trace: Sequence[Hashable] | None = None,
                 **options: Any) -> None:
        super().__init__(capacity, **options)
        if trace is None:
            raise _config_error("policy.belady.trace", "Bélády needs the whole trace (trace=keys)")
        self._trace = list(trace)
        n = len(self._trace)
        self._never = n + 1
        nxt = [0] * n
        last: dict[Hashable, int] = {}
        for i in range(n - 1, -1, -1):
            key = self._trace[i]
            nxt[i] = last.get(key, self._never)
            last[key] = i
        self._next = nxt
        self._positions: dict[Hashable, list[int]] | None = None  # built on first off-script call
        self._cursor = 0
        self._entries: dict[Hashable, list] = {}  # key -> [next_use, weight, seq of last push]
        self._heap: list[tuple[int, int, Hashable]] = []  # (-next_use, -seq, key)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._entries))

    def _next_use(self, key: Hashable) -> int:
        """The next request of ``key`` after the current one; advances the cursor."""
        c = self._cursor
        if c < len(self._trace) and self._trace[c] == key:
            self._cursor = c + 1
            return self._next[c]
        if self._positions is None:
            self._positions = {}
            for i, k in enumerate(self._trace):
                self._positions.setdefault(k, []).append(i)
        pos = self._positions.get(key)
        if not pos:
            return self._never
        j = bisect.bisect_left(pos, c)
        return pos[j] if j < len(pos) else self._never

    def _push(self, key: Hashable, entry: list) -> None:
        self._seq += 1
        entry[2] = self._seq
        heapq.heappush(self._heap, (-entry[0], -self._seq, key))
        if len(self._heap) > 2 * len(self._entries) + 64:
            # each entry's own sequence number: items never tie, so keys are never compared
            # (keys need not be orderable: ("a",) against (1,) is a TypeError)
            self._heap = [(-e[0], -e[2], k) for k, e in self._entries.items()]
            heapq.heapify(self._heap)

    def access(self, key: Hashable, ts: float | None = None) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry[0] = self._next_use(key)
            self._push(key, entry)

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        try:
            if not weight >= 0:  # NaN or negative: the total would stop bounding anything
                raise ValueError(f"weight must be a non-negative number, got {weight!r}")
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        entry = self._entries.get(key)
        if entry is not None:
            self.total_weight += weight - entry[1]
            entry[1] = weight
            entry[0] = self._next_use(key)
        else:
            entry = [self._next_use(key), weight, 0]
            self._entries[key] = entry
            self.total_weight += weight
        self._push(key, entry)
        return self._evict() if self.total_weight > self.capacity else []

    def remove(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_weight -= entry[1]

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self.capacity = capacity
        return self._evict()

    def _evict(self) -> list:
        victims = []
        heap, entries = self._heap, self._entries
        while self.total_weight > self.capacity and heap:
            neg_next, _, key = heapq.heappop(heap)
            entry = entries.get(key)
            if entry is None or entry[0] != -neg_next:
                continue  # stale
            del entries[key]
            self.total_weight -= entry[1]
            victims.append(key)
        return victims
