"""Staged reads of keyed prefetching: fetch threads read, the operator's thread decodes and
installs.

Part of :mod:`mlcache.prefetch`, kept apart because it is where a prefetch has to stay exact.
With a lookahead operator attached, a fetch thread only does the I/O: one batched read of the
levels (the keys registered as being read, so a demand get waits for it rather than reading
again), the raw bytes checked as the manager's miss path checks them, then *staged*. The
operator's thread installs staged reads between records (``install``, the soonest expected
uses first) and a get of a staged key installs it at once (``install_keys``), without I/O.
Why: decoding and inserting need the GIL; on the operator's thread they run between records
instead of forcing a hand-off in the middle of one.

A staged value is installed only while still exact: the key not resident (a newer write or
load won), not deleted, not in the eviction buffer, and not moved between levels by a write
since it was read (``WriteBack.moved_since``). Staging is bounded in keys and bytes
(``staged_max_keys``/``staged_max_bytes``: fetch threads take no batch while it is full) and
dropped when the last operator detaches, or by ``drop_staged`` when lower copies may have
changed under another process.
"""
from __future__ import annotations

import heapq
from itertools import islice
import threading
import time
from collections.abc import Callable
from typing import Any

from ._batchreads import _FAILED_MAX, _INLINE_BATCH, _SPLIT_BATCH, _without_frames
from ._hints import HintBuffer
from ._readpath import _Load

__all__ = ["StagedReads"]

_MISSING: Any = object()


class StagedReads:
    """Mixin for Prefetcher: staging reads on fetch threads and installing them on the
    operator's thread. Uses the prefetcher's lock, buffer and statistics."""

    counters: dict[str, int]
    _cold: Any   # prefetch._Cold: the state no per-record path reads
    _mref: Callable[[], Any]
    _lock: threading.Lock
    _cond: threading.Condition
    _buffer: HintBuffer
    _policy_hints: bool
    _landed: dict[bytes, float]
    _failed: dict[bytes, BaseException]
    _used_inflight: set[bytes]
    _staged: dict[bytes, tuple[bytes, float, float, int]]
    _staged_bytes: int
    _staged_later: dict[bytes, float]
    _stage_later: Callable[[bytes, float], None]
    _thread_batches: int
    _thread_idle: Callable[[], bool]
    _finish: Callable[[list[bytes]], list[tuple[bytes, float]]]
    _hint_later: Callable[[Any, list[tuple[bytes, float]]], None]
    _reading: Any
    inline: bool
    poll_read: Callable[..., bool]
    _splits: Callable[[], bool]

    def attach(self, operator: Any) -> tuple[bool, int]:
        """A lookahead operator will install staged reads and may read batches itself.
        Returns ``(split, batch)``: whether its batches are split reads (see
        ``BatchReads._start_split``) and the keys it should queue before reading one."""
        with self._cond:
            self._cold._consumers.add(operator)
        if self._splits():
            return True, _SPLIT_BATCH
        return False, min(self._cold.config.batch_size, _INLINE_BATCH)

    def detach(self, operator: Any) -> None:
        """The operator is done; with no operator left, staged reads have nobody to wait for."""
        if self._reading is not None and len(self._cold._consumers) <= 1:
            self.poll_read(block=True)   # its reply is on its way: take it, in step
        with self._cond:
            self._cold._consumers.discard(operator)
            if self._cold._consumers:
                return
            self._drop_all_staged()

    def _drop_all_staged(self) -> None:
        """Lock held, no operator attached: staged reads have nobody to install them."""
        self.counters["staged_dropped"] += len(self._staged)
        self._staged.clear()
        self._staged_later.clear()
        self._staged_bytes = 0
        self._cond.notify_all()

    def _fetch_staged(self, m: Any, batch: list[tuple[bytes, float, float]],
                      t_start: float) -> None:
        """Fetch thread with an operator attached: one batched read of the levels, the raw
        bytes staged (after the same exactness checks as the manager's miss path); decoding
        and the heap insert are left to the operator's thread."""
        keys = [kb for kb, _, _ in batch]
        meta = {kb: (ts, t0) for kb, ts, t0 in batch}
        error: BaseException | None = None
        staged = 0
        try:
            load = _Load()
            rescue, mine, seq = self._claim(m, keys, meta, load)
            if rescue:
                # in the eviction buffer: back into the heap without I/O (as a demand get would)
                self._install_loaded(m, m._load_into_heap(rescue, None, prefetch=True), meta)
            if mine:
                try:
                    found, timings = m._read_levels(mine)
                    staged = self._stage(m, mine, meta, found, timings, seq)
                finally:
                    loading = m._cold.loading
                    with m._lock:
                        for kb in mine:
                            if loading.get(kb) is load:
                                del loading[kb]
                    load.done.set()
        except BaseException as exc:  # a backend failure must not kill the fetch thread
            error = exc
        self._staged_done(m, keys, staged, error, t_start)

    def _claim(self, m: Any, keys: list[bytes], meta: dict[bytes, tuple[float, float]],
               load: Any = None) -> tuple[list[bytes], list[bytes], int]:
        """Sort a batch's keys before reading them: resident ones are only hinted; deleted,
        staged or already loading ones are left; those in the eviction buffer are returned to
        be rescued without I/O, the rest to be read (registered as loading by ``load`` when
        given, so a demand get waits for this read), with the write sequence to check them
        against once read."""
        rescue: list[bytes] = []
        mine: list[bytes] = []
        with m._lock:
            m._check_open()
            data, wb, loading = m._data, m._wb, m._cold.loading
            tomb = wb.tombstones
            queued = wb.buffer.pending[0] if wb.levels else None
            loans = m._cold.loans
            for kb in keys:
                if kb in data:
                    if self._policy_hints:
                        m._policy_hint(kb, meta[kb][0])
                elif kb in tomb or kb in loading or kb in self._staged:
                    continue        # deleted, being read by someone else, or read already
                elif (queued and kb in queued) or (loans and kb in loans):
                    # (lent: the held object is the key's value, perhaps changed since it
                    # was written; it goes back into the heap, as a get takes it back)
                    rescue.append(kb)
                else:
                    mine.append(kb)
            if mine and load is not None:
                loading.update(dict.fromkeys(mine, load))
            seq = wb.wseq
        return rescue, mine, seq

    def _stage(self, m: Any, mine: list[bytes], meta: dict[bytes, tuple[float, float]],
               found: dict[bytes, bytes], timings: list[tuple], seq: int) -> int:
        """Stage the raw bytes read for ``mine`` that are still exact (not written, deleted or
        moved since ``seq``); a key whose record already waits is installed at once. Returns
        the number staged."""
        good: dict[bytes, bytes] = {}
        late: list[tuple[bytes, bytes, float, float, int]] = []
        staged = 0
        with m._lock:
            m._count_reads(timings, len(found))
            data, wb = m._data, m._wb
            tomb = wb.tombstones
            queued = wb.buffer.pending[0] if wb.levels else None
            now_seq = wb.wseq
            moved = () if now_seq == seq and not seq & 1 else wb.moved_since(seq)
            if moved is not None:
                for kb in mine:
                    raw = found.get(kb)
                    # a key written, deleted or moved while we read keeps that state; the
                    # record's own get reads it
                    if (raw is None or kb in moved or kb in data or kb in tomb
                            or (queued and kb in queued)):
                        continue
                    good[kb] = raw
        with self._lock:
            used = self._used_inflight
            st_d = self._staged
            for kb, raw in good.items():
                ts, t0 = meta[kb]
                if kb in used:
                    late.append((kb, raw, ts, t0, now_seq))  # its get waits: now
                else:
                    st_d[kb] = (raw, ts, t0, now_seq)
                    self._staged_bytes += len(raw)
                    staged += 1
        if late:
            self._install_entries(m, late, used=True)
        return staged

    def _staged_done(self, m: Any, keys: list[bytes], staged: int,
                     error: BaseException | None, t_start: float, inline: bool = False) -> None:
        """A staged batch is over: its statistics, its failure (the operator demand-fetches
        the keys of a failed batch), its keys out of flight."""
        now = time.perf_counter()
        with self._lock:
            self.counters["batches"] += 1
            if inline:
                self.counters["inline_batches"] += 1
            else:
                self._thread_batches += 1
            self.counters["staged"] += staged
            self._cold.batch_latency.add(now - t_start)
            if inline:
                # the operator chose when to read: a staged key's latency is its read's (the
                # time it then waits to be installed is the operator's pacing; its record's
                # get installs it without I/O), as for the batches loaded at once
                for _ in range(staged):
                    self._cold.fetch_latency.add(now - t_start)
            if error is not None:
                self.counters["failures"] += 1
                if len(self._failed) + len(keys) > _FAILED_MAX:
                    self._failed.clear()
                if isinstance(error, Exception):   # (a KeyboardInterrupt is raised on)
                    _without_frames(error)
                for kb in keys:
                    self._failed[kb] = error
            for kb in keys:
                self._used_inflight.discard(kb)
            later = self._finish(keys)       # after staging: see note_use's fast path
        if later:
            self._hint_later(m, later)

    def _install_loaded(self, m: Any, loaded: dict, meta: dict) -> None:
        """Account keys a fetch put in the heap directly (eviction-buffer rescues)."""
        if not loaded:
            return
        if self._policy_hints:
            with m._lock:
                for kb in loaded:
                    m._policy_hint(kb, meta[kb][0])
        now = time.perf_counter()
        with self._lock:
            for kb in loaded:
                self._cold.fetch_latency.add(now - meta[kb][1])
                if kb not in self._used_inflight:
                    self._landed[kb] = meta[kb][1]
            self.counters["prefetched"] += len(loaded)

    def install(self, limit: int) -> int:
        """Operator thread: decode and insert up to ``limit`` staged reads, those expected
        soonest first.

        Fetch threads stage their batches in the order the batches finish, which with several
        threads is not the order of use: when more than ``limit`` reads wait, the ones with the
        smallest expected-use time go first, so the next record's key is never left behind
        keys needed later.
        """
        if not self._staged:
            return 0
        with self._cond:
            staged = self._staged
            cold = self._cold
            # fetch threads held back by the staging bound get room now (not when they are
            # idle because the operator reads its batches itself: a wake-up each install
            # cost those threads' hand-offs of the GIL)
            full = (self._staged_bytes >= cold.staged_max_bytes
                    or len(staged) >= cold.staged_max_keys)
            if len(staged) <= limit:
                chosen = list(staged)
            elif self._splits():
                # staged by the operator's own split reads only, each batch taken oldest
                # first: the dict's order is the order of use
                chosen = list(islice(staged, limit))
            else:
                chosen = heapq.nsmallest(limit, staged, key=lambda kb: staged[kb][1])
            items = []
            later = self._staged_later
            for kb in chosen:
                raw, ts, t0, seq = staged.pop(kb)
                self._staged_bytes -= len(raw)
                if later and kb in later:
                    ts = later.pop(kb)     # hinted again for a later use: the policy's time
                items.append((kb, raw, ts, t0, seq))
            if full:
                self._cond.notify_all()
        m = self._mref()
        return self._install_entries(m, items, used=False) if m is not None else 0

    def install_keys(self, kbs: list[bytes]) -> int:
        """A get needs these keys now: install them from the stage, without I/O."""
        with self._lock:
            items = []
            for kb in kbs:
                entry = self._staged.pop(kb, None)
                if entry is not None:
                    self._staged_bytes -= len(entry[0])
                    raw, ts, t0, seq = entry
                    ts = self._staged_later.pop(kb, ts)
                    items.append((kb, raw, ts, t0, seq))
        m = self._mref()
        return self._install_entries(m, items, used=True) if items and m is not None else 0

    def _install_entries(self, m: Any, items: list[tuple[bytes, bytes, float, float, int]],
                         used: bool) -> int:
        """Decode staged reads and insert those still exact into the heap, clean.

        A staged value is dropped if the key is resident (written or loaded meanwhile: that is
        newer or the same), deleted, in the eviction buffer (written and evicted: newer), lent
        (held by a caller since it left the heap: that object is the key's value), or
        moved between levels by a write since it was read (``wseq``/``moved_since``); the next
        get then reads it the usual way. ``used``: a record is waiting for these keys (their
        use was counted already).
        """
        if not items:
            return 0
        decode = m._codec.decode
        decoded = []
        bad: list[tuple[bytes, Exception]] = []
        for item in items:
            try:
                decoded.append((item, decode(item[1])))
            except Exception as exc:
                bad.append((item[0], exc))
        for kb, failed in bad:
            # bad bytes: the record's own read will raise, naming the level and key
            self._failed[kb] = _without_frames(failed)
        installed: list[tuple[bytes, float]] = []
        dropped = 0
        with m._lock:
            if m._closed:
                return 0
            if m._reads or m._reads_ts:
                m._apply_reads()     # hits before this insert reach the policy first
            data, wb = m._data, m._wb
            tomb = wb.tombstones
            queued = wb.buffer.pending[0] if wb.levels else None
            wseq = wb.wseq
            moved_by: dict[int, Any] = {}
            hint = m._heap.policy.hint if self._policy_hints and m._heap is not None else None
            admit = m._admit
            loans = m._cold.loans
            for (kb, raw, ts, t0, seq), value in decoded:
                # (lent since it was read: the held object is the key's value, not this copy)
                if kb in data or kb in tomb or (queued and kb in queued) or (
                        loans and kb in loans):
                    dropped += 1
                    continue
                if wseq != seq or seq & 1:
                    moved = moved_by.get(seq, _MISSING)
                    if moved is _MISSING:
                        moved = moved_by[seq] = wb.moved_since(seq)
                    if moved is None or kb in moved:
                        dropped += 1
                        continue
                admit(kb, value, raw, None)
                if hint is not None and kb in data:
                    hint(kb, ts)
                installed.append((kb, t0))
        m._wb.ensure_writers()
        now = time.perf_counter()
        # staged by the operator's own reads: their latency was taken when they were staged
        timed = not self._splits()
        with self._lock:
            for kb, t0 in installed:
                if timed:
                    self._cold.fetch_latency.add(now - t0)
                if not used:
                    self._landed[kb] = t0
            self.counters["prefetched"] += len(installed)
            self.counters["staged_dropped"] += dropped
        return len(installed)

    def drop_staged(self, prefix: bytes = b"") -> int:
        """Forget staged reads of keys starting with ``prefix`` (their lower copies may have
        changed under another process: ``CacheManager.invalidate_local``)."""
        with self._lock:
            gone = [kb for kb in self._staged if kb.startswith(prefix)]
            for kb in gone:
                self._staged_bytes -= len(self._staged.pop(kb)[0])
                self._staged_later.pop(kb, None)
            self.counters["staged_dropped"] += len(gone)
            self._cond.notify_all()
        return len(gone)
