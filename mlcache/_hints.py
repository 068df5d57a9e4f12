"""The two structures a hint passes through before any I/O: the hot-key filter and the hint
buffer of keyed prefetching (:mod:`mlcache.prefetch` routes hints through them).

Kept apart from the prefetcher because each is a self-contained data structure with its own
costs, independent of threads, the manager and the policy.

* :class:`HotKeyFilter` counts every hint in the 4-bit count-min sketch
  (:mod:`mlcache.sketch`); a resident key whose estimate exceeds the threshold stays resident
  without help, so its hint is dropped. Each hint is counted at once (no batch whose
  application pauses one record), and the increment gives the estimate.
* :class:`HintBuffer` keeps one entry per key, insertion-ordered, unprocessed or in flight:
  re-hinting a key is O(1) and keeps its latest event time, and batches are taken oldest
  first, which for a read-ahead operator is the order of use (a heap ordered by ``ts`` was
  rejected: O(log n) per hint for an order the operator already produces).
"""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["HintBuffer", "HotKeyFilter"]


class HintBuffer:
    """Hints not yet fetched (unprocessed) and being fetched (in flight); one entry per key.

    An entry is ``(ts, t_hint, first_ts)``: the latest event time the key was hinted for, the
    wall time of its first hint (slack and fetch latency are measured from it) and the event
    time of that first hint (a use before it was not covered by this entry). Not thread-safe;
    the :class:`Prefetcher` guards it with its lock.
    """

    def __init__(self) -> None:
        self.pending: dict[bytes, tuple[float, float, float]] = {}
        self.inflight: dict[bytes, tuple[float, float, float]] = {}
        # in-flight keys hinted again for a later time: the batch reading them carries the ts
        # they were taken with, and :meth:`done` hands the later one back
        self.later: set[bytes] = set()

    def add(self, kb: bytes, ts: float, now: float) -> str:
        """Record a hint; returns ``"new"``, ``"updated"`` or ``"inflight"``."""
        cur = self.inflight.get(kb)
        if cur is not None:
            if ts > cur[0]:
                self.inflight[kb] = (ts, cur[1], cur[2])
                self.later.add(kb)
            return "inflight"
        cur = self.pending.get(kb)
        if cur is not None:
            if ts > cur[0]:
                self.pending[kb] = (ts, cur[1], cur[2])
            return "updated"
        self.pending[kb] = (ts, now, ts)
        return "new"

    def take(self, n: int, min_ts: float, skip: bytes | None = None
             ) -> tuple[list[tuple[bytes, float, float]], int]:
        """Move up to ``n`` oldest entries to in-flight; drop those with ts < min_ts.

        ``skip`` stays queued (the key of the record about to be handed over: the operator
        leaves it to that record's own demand read). Returns ``(batch, dropped_late)``, batch
        entries being ``(key, ts, t_hint)``.
        """
        batch: list[tuple[bytes, float, float]] = []
        late = 0
        pending = self.pending
        while pending and len(batch) < n:
            it = iter(pending)
            kb = next(it)
            if kb == skip:
                after = next(it, None)
                if after is None:
                    break
                kb = after
            entry = pending.pop(kb)
            ts, t0 = entry[0], entry[1]
            if ts < min_ts:
                late += 1
                continue
            self.inflight[kb] = entry
            batch.append((kb, ts, t0))
        return batch, late

    def done(self, keys: list[bytes]) -> list[tuple[bytes, float]]:
        """The keys' reads are over: they leave in-flight. Returns ``(key, ts)`` for those
        hinted again for a later time while they were read (usually none)."""
        inflight = self.inflight
        later = self.later
        if not later:
            for kb in keys:
                inflight.pop(kb, None)
            return []
        out = []
        for kb in keys:
            cur = inflight.pop(kb, None)
            if kb in later:
                later.discard(kb)
                if cur is not None:
                    out.append((kb, cur[0]))
        return out

    def state(self, kb: bytes) -> tuple[str, tuple[float, float, float]] | None:
        cur = self.pending.get(kb)
        if cur is not None:
            return "pending", cur
        cur = self.inflight.get(kb)
        if cur is not None:
            return "inflight", cur
        return None

    def __len__(self) -> int:
        return len(self.pending) + len(self.inflight)

    def clear(self) -> None:
        self.pending.clear()
        self.inflight.clear()
        self.later.clear()


class HotKeyFilter:
    """Counts hints in the 4-bit count-min sketch; a key is hot once its estimate > threshold.

    Each hint is counted at once, in plain Python (``FrequencySketch.add_hash``, ~2 us), which
    also gives the estimate. Increments used to be buffered and applied in numpy batches of
    2048 (~0.25 us a hint), but the hint that applied a batch paused ~0.5 ms, inside the
    read-ahead of a record: ~100 records of ysb's 200,000 were in the keyed path's p999 for it.
    """

    def __init__(self, capacity: int, threshold: int) -> None:
        from .sketch import FrequencySketch

        self.sketch = FrequencySketch(capacity)
        self.threshold = threshold
        self._add = self.sketch.add_hash
        self._lock = threading.Lock()   # hints come from any thread (manager.hint)

    def count(self, kb: bytes) -> None:
        """Count a hint without estimating (the key is not resident: it is fetched anyway)."""
        h = hash(kb)
        with self._lock:
            self._add(h)

    def hot(self, kb: bytes) -> bool:
        """Count a hint; whether the key's estimate (this hint included) exceeds the
        threshold."""
        h = hash(kb)
        with self._lock:
            return self._add(h) > self.threshold


def _make_filter(manager: Any) -> HotKeyFilter | None:
    """A hot-key filter sized to the heap, or ``None`` when disabled (threshold 16)."""
    threshold = manager.config.prefetch.hot_threshold
    if threshold >= 16:
        return None
    heap = manager.config.heap
    capacity = 4096
    if heap is not None and heap.max_entries:
        capacity = heap.max_entries
    elif heap is not None and heap.max_bytes:
        capacity = heap.max_bytes // 1024
    return HotKeyFilter(min(max(capacity, 1024), 1 << 20), threshold)
