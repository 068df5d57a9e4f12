"""What a bytes-bounded heap's budget covers beside the values: per-entry bookkeeping and the
manager's bounded side memory.

Kept apart from the manager because it is accounting, measured and guarded by tests rather
than routed: ``HeapConfig.max_bytes`` bounds everything the cache keeps in this process, not
only the values. Each resident entry is charged ``_ENTRY_OVERHEAD`` bytes beside its value
(the heap adds it to the weight; not under the "dedup" policy, whose record cache counts record
bytes as KIP-63 does); the rest -- the eviction buffer and the batch being written,
a level client's copy of that batch, the encodings mutation tracking keeps, the key memos of
the manager and its namespaces, the write log, the prefetcher's staged reads -- is bounded
each and reserved off the policy's capacity (``HeapLevel.reserve``), recharged whenever one of
those bounds grows (a namespace's memo, the prefetcher once it exists), so that the entries
and all of it fit the budget (tests/test_reliability_memory.py).
"""
from __future__ import annotations

from typing import Any

from ._readpath import Digests
from .writeback import _WLOG_KEYS

__all__ = ["HeapBudget"]

# Bytes charged per resident entry beside its value, as allocated (the allocator's rounding
# included): the canonical key's object (its bytes, twice, are charged by the heap), slots in
# the heap's data and weights dicts and dirty set, the weight, the policy's node, the mutation
# digest and the handed-out mark. The worst case measured over table fill levels (~645 bytes),
# guarded by tests/test_reliability_memory.py::test_entry_overhead_covers_the_bookkeeping.
_ENTRY_OVERHEAD = 680
# The key memo, charged to the heap budget: one entry per _MEMO_SHARE bytes of it, at least
# _MEMO_MIN, each costing at most _MEMO_ENTRY (dict slot, the user key, its canonical bytes;
# measured: 140 B for an int key, 170 for a short str, 220 for a (str, int) tuple).
_MEMO_SHARE = 16384
_MEMO_MIN = 256
_MEMO_ENTRY = 232
# A key the write log keeps (writeback._WLOG_KEYS of them at most): often an evicted entry's.
_LOGGED_KEY = 64


class HeapBudget:
    """Mixin for CacheManager: the reserve a bytes-bounded heap's budget keeps for the
    manager's side memory, and the key memos' shared bound."""

    _heap: Any
    _wb: Any
    _digests: Digests
    _memo_max: int
    _cold: Any   # the manager's _Cold: memo_total, namespaces
    _prefetch_reserve: int
    _handle_victims: Any

    def _reserved_bytes(self, raw_keep: int) -> int:
        """Memory a bytes-bounded heap's budget covers beside its entries (each bounded):
        the eviction buffer with the batch being written, a level client's copy of that
        batch (up to a batch: the Redis level joins values under 16 KB behind their
        headers), the large encodings mutation tracking keeps, the key memos, the write log,
        and once hints are used the prefetcher's staged reads."""
        buffer = self._wb.buffer_bytes_max or 0
        batch = self._wb.batch_bytes_max or 0
        return (buffer + batch + raw_keep + self._cold.memo_total * _MEMO_ENTRY
                + _WLOG_KEYS * _LOGGED_KEY + self._prefetch_reserve)

    def _recharge(self) -> None:
        """Lock held: take the current reserve off a bytes-bounded heap's capacity."""
        heap = self._heap
        if heap is not None and heap.by_bytes and heap.entry_overhead:
            self._handle_victims(heap.reserve(self._reserved_bytes(self._digests.budget)))

    def _share_memo(self) -> None:
        """Lock held: the key memos of the manager and its namespaces share one bound (each
        view keeps at least _MEMO_MIN keys); a bytes-bounded heap is charged for the total.
        Namespaces without a memo (``_memo_max == 0``) take no share."""
        heap = self._heap
        if heap is None or not heap.by_bytes or heap.entry_overhead == 0:
            return
        memos = [view for view in self._cold.namespaces.values() if view._memo_max]
        views = 1 + len(memos)
        share = max(_MEMO_MIN, self._cold.memo_total // views)
        self._memo_max = share
        for view in memos:
            view._memo_max = share
        if share * views > self._cold.memo_total:
            self._cold.memo_total = share * views
            self._recharge()
