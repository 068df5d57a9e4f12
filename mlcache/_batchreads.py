"""Where and how queued hints are read: fetch threads, inline batches, and the choice between
them.

Part of keyed prefetching (:mod:`mlcache.prefetch`), kept apart as its I/O side. Keys are taken
from the hint buffer oldest first, ``batch_size`` at a time, each batch one ``get_many`` per
level; no batch starts while a demand fetch of the lookahead operator runs
(``Prefetcher.demand``), and the manager's lock is never held during I/O. A batch is read by

* a fetch thread: daemons, made on the first queued hint, holding only a weak reference to the
  prefetcher. With a lookahead operator attached they only read and stage the raw bytes
  (:mod:`mlcache._staging`); without one they load the keys into the heap themselves;
* the operator's own thread, between records (``pump``): "inline", keys loaded at once.

Why both: a fetch thread returning from I/O forces a GIL hand-off on the record loop (after up
to the switch interval, anywhere in a record's processing) and then holds the GIL for its
Python work. With ``fetch_mode="auto"`` (``_measure_inline``) batches are read inline unless
their waits -- wall time off CPU, less the share the loop itself spends waiting for a core --
exceed ``_INLINE_WAIT_SHARE`` of the loop's time between batches, as with a slow remote store;
then the threads read them, and every ``_PROBE_EVERY`` thread batches one inline batch measures
again. After the batches, a periodic sweep counts prefetched keys evicted unused as wasted.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._hints import HintBuffer
from .errors import CacheError, LevelUnavailableError

if TYPE_CHECKING:
    from .prefetch import Prefetcher

__all__ = ["BatchReads"]

_FAILED_MAX = 65536
_SWEEP_INTERVAL = 0.5  # seconds between scans for prefetched keys evicted unused
_INLINE_WAIT_SHARE = 0.5  # inline batches' waits above this share of the loop -> threads
_PROBE_EVERY = 64       # thread batches between two inline batches that re-measure the cost
# keys per split read while the reads keep up: its reply is taken and staged between two
# records, so a batch is what one record can carry (~3 us a key) -- the round trip itself waits
# for nobody; a backlog is read in batches of up to batch_size
_SPLIT_BATCH = 16
# keys per batch read inline from a level that cannot split its reads (the disk level): the
# record that reads it also decodes and inserts every value and evicts as many victims (~22 us
# a key on this machine, all of it on that record), so the batch is that record's latency.
# Against 64 keys, 32 halved the keyed p999 on `bench prefetch`'s nexmark at the same
# throughput; 16 cut it again but cost ~10% throughput (each batch's own ~30 us).
_INLINE_BATCH = 32


def _without_frames(error: BaseException) -> BaseException:
    """``error``, and the errors it was raised from, with their tracebacks dropped; for a failure
    remembered until its key's record comes (``Prefetcher._failed``, up to ``_FAILED_MAX``
    keys), which may be never (a record already passed, an operator closed, a bare
    ``manager.hint``). A traceback keeps its frames' locals alive: a read's buffers, the
    reply received so far, the values decoded (153 MiB for 50 failed batches of 1 MiB values).
    What the failure said stays (its class and message, in the error the record raises).
    Exceptions the calling thread is handling (the caller's, which ours may have as their
    context) keep theirs: call it outside an ``except`` block of the error's own."""
    handled: set[int] = set()
    exc: BaseException | None = sys.exc_info()[1]
    while exc is not None and id(exc) not in handled:
        handled.add(id(exc))
        exc = exc.__context__
    todo: list[BaseException | None] = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in handled:
            continue
        handled.add(id(exc))
        exc.__traceback__ = None
        todo += (exc.__cause__, exc.__context__)
    return error


class BatchReads:
    """Mixin for Prefetcher: the fetch threads, inline batches and the choice between them,
    the sweep for wasted prefetches. Uses the prefetcher's lock, buffer and statistics."""

    _cold: Any   # prefetch._Cold: the state no per-record path reads
    counters: dict[str, int]
    watermark: float
    inline: bool
    _mref: Callable[[], Any]
    _lock: threading.Lock
    _cond: threading.Condition
    _buffer: HintBuffer
    _closed: bool
    _demand: int
    _policy_hints: bool
    _landed: dict[bytes, float]
    _failed: dict[bytes, BaseException]
    _used_inflight: set[bytes]
    _staged: dict[bytes, tuple[bytes, float, float, int]]
    _staged_bytes: int
    _staged_later: dict[bytes, float]
    _thread_batches: int
    _fetch_staged: Callable[[Any, list[tuple[bytes, float, float]], float], None]
    _reading: "_SplitRead | None"
    _claim: Callable[..., tuple[list[bytes], list[bytes], int]]
    _stage: Callable[..., int]
    _staged_done: Callable[..., None]
    _install_loaded: Callable[[Any, dict, dict], None]
    _drop_all_staged: Callable[[], None]

    # -- fetch threads ----------------------------------------------------------------------

    def _ensure_threads(self) -> None:
        cold = self._cold
        if len(cold._threads) >= cold.config.fetch_threads or self._closed:
            return
        with self._lock:
            threads = cold._threads
            while len(threads) < cold.config.fetch_threads:
                t = threading.Thread(target=_fetch_loop, args=(weakref.ref(self),),
                                     name=f"mlcache-prefetch-{len(threads)}", daemon=True)
                threads.append(t)
                t.start()

    def _next_batch(self) -> list[tuple[bytes, float, float]] | None:
        """Block until a batch is available; ``None`` when the fetcher should exit."""
        lateness = self._cold.config.lateness or 0.0
        with self._cond:
            while True:
                if self._closed or self._cold._pid != os.getpid():
                    return None
                if self._reading is not None and not self._cold._consumers:
                    return []      # a split read no operator will take: _take_left_read
                if self._buffer.pending and not self._demand and not self._thread_idle():
                    batch, late = self._buffer.take(self._cold.config.batch_size,
                                                    self.watermark - lateness)
                    self.counters["dropped_late"] += late
                    self._cold._backlog.append(len(self._buffer.pending))
                    if batch:
                        return batch
                    continue
                self._cond.wait(0.05 if self._demand or self._buffer.pending else 1.0)
                if self._mref() is None:
                    return None

    def _thread_idle(self) -> bool:
        """Lock held: whether fetch threads should take no batch now."""
        if (self.inline or self._cold._probing) and self._cold._consumers:
            return True      # the operator reads batches itself
        cold = self._cold
        return bool(cold._consumers) and (self._staged_bytes >= cold.staged_max_bytes
                                          or len(self._staged) >= cold.staged_max_keys)

    def _fetch(self, batch: list[tuple[bytes, float, float]], inline: bool = False) -> None:
        m = self._mref()
        keys = [kb for kb, _, _ in batch]
        t_start = time.perf_counter()
        if not inline and self._cold._consumers and m is not None:
            self._fetch_staged(m, batch, t_start)
            return
        cpu0 = time.thread_time() if inline else 0.0
        error: BaseException | None = None
        loaded: dict = {}
        if m is not None:
            try:
                # A key that became resident meanwhile needs no load, only the policy's hint
                # (the manager would answer it from the heap, but it was not prefetched).
                todo = []
                for kb, ts, _ in batch:
                    if m._resident(kb):
                        if self._policy_hints:
                            m._policy_hint(kb, ts)
                    else:
                        todo.append(kb)
                if todo:
                    # One batch = one get_many per level. Keys are inserted at the policy's
                    # "now" (ts=None) and then hinted with their own expected use: inserting
                    # at a future ts would move TAC's clock ahead of the records in flight.
                    loaded = m._load_into_heap(todo, None, prefetch=True)
                    if self._policy_hints and loaded:
                        # one hold of the manager's (re-entrant) lock for the whole batch
                        with m._lock:
                            m._apply_reads()
                            hint, data = m._heap.policy.hint, m._data
                            for kb, ts, _ in batch:
                                if kb in loaded and kb in data:
                                    hint(kb, ts)
            except BaseException as exc:  # a backend failure must not kill the fetch thread
                error = exc
        now = time.perf_counter()
        if inline and error is None:
            self._measure_inline(t_start, now, cpu0, time.thread_time())
        with self._lock:
            self.counters["batches"] += 1
            if inline:
                self.counters["inline_batches"] += 1
            self._cold.batch_latency.add(now - t_start)
            if error is not None:
                self._buffer.done(keys)
                self.counters["failures"] += 1
                if len(self._failed) + len(keys) > _FAILED_MAX:
                    self._failed.clear()
                if isinstance(error, Exception):   # (else raised below, or on the thread's way)
                    _without_frames(error)
                for kb in keys:
                    self._failed[kb] = error
                    self._used_inflight.discard(kb)
                if inline and not isinstance(error, Exception):
                    # On the caller's thread a KeyboardInterrupt (or SystemExit) is the
                    # caller's, not a failed read to fall back from: the batch's keys are
                    # released above, and it goes on up.
                    raise error
                return
            used = self._used_inflight
            for kb, _, t0 in batch:
                was_used = kb in used
                if was_used:
                    used.discard(kb)
                if kb in loaded:
                    if inline:
                        # The operator chose when to read this batch: the time the key
                        # waited for it was its own pacing, not a fetch latency. Both the
                        # latency and the slack are measured from the read's start (else the
                        # depth controller would see a latency growing with the depth).
                        t0 = t_start
                    self._cold.fetch_latency.add(now - t0)
                    if not was_used:
                        self._landed[kb] = t0
            self.counters["prefetched"] += len(loaded)
            later = self._finish(keys)       # after _landed: see note_use's fast path
        if later:
            self._hint_later(m, later)
        if now - self._cold._last_sweep > _SWEEP_INTERVAL:
            self._sweep(m)

    def _finish(self, keys: list[bytes]) -> list[tuple[bytes, float]]:
        """Lock held: the batch's keys leave in-flight. Returns those hinted again for a later
        time while they were read (the buffer kept the latest ts; the batch carried the ts
        they were taken with), for :meth:`_hint_later`; a staged read takes its time here."""
        later = self._buffer.done(keys)
        if not later:
            return later
        staged = self._staged
        out = []
        for kb, ts in later:
            if kb in staged:
                self._stage_later(kb, ts)
            else:
                out.append((kb, ts))
        return out

    def _stage_later(self, kb: bytes, ts: float) -> None:
        """Lock held: the staged read of ``kb`` is installed with the later time ``ts``."""
        if ts > self._staged[kb][1] and ts > self._staged_later.get(kb, -math.inf):
            self._staged_later[kb] = ts

    def _hint_later(self, m: Any, later: list[tuple[bytes, float]]) -> None:
        """Tell the policy of the later uses :meth:`_finish` found (a key a fetch put in the
        heap with the ts of its batch; the policy ignores keys that are not resident)."""
        if m is not None and self._policy_hints:
            for kb, ts in later:
                m._policy_hint(kb, ts)

    def _sweep(self, m: Any = None) -> None:
        """Count prefetched keys that left the heap unused as wasted."""
        m = m if m is not None else self._mref()
        if m is None:
            return
        self._cold._last_sweep = time.perf_counter()
        with self._lock:
            keys = list(self._landed)
        gone = [kb for kb in keys if not m._resident(kb)]
        if gone:
            with self._lock:
                for kb in gone:
                    if self._landed.pop(kb, None) is not None:
                        self.counters["wasted"] += 1

    @property
    def saturated(self) -> bool:
        """The fetch threads cannot keep up: after a batch is taken, typically more than every
        thread's next batch is still waiting.

        Then the fetch latency is mostly queueing, and a deeper read-ahead only lengthens the
        queue (and the time prefetched entries wait in the heap).
        """
        b = self._cold._backlog
        if len(b) < 8:
            return False
        cfg = self._cold.config
        return sorted(b)[len(b) // 2] >= cfg.batch_size * cfg.fetch_threads

    # -- inline batches and the choice of where batches are read ------------------------

    def pump(self, head: bytes | None, threshold: int) -> bool:
        """Operator thread, between records: read a batch of queued keys here when batches are
        read inline (or a probe of the inline cost is due), once ``threshold`` keys wait.
        Returns whether a batch was read.

        ``head`` (the key of the record about to be handed over) is left to that record: a
        record's own wait is never hidden in the operator.
        """
        buf = self._buffer
        probe = not self.inline
        if probe and (self._thread_batches < _PROBE_EVERY or buf.inflight
                      or self._cold.config.fetch_mode != "auto"):
            return False     # a probe waits until the fetch threads are between batches
        if len(buf.pending) < threshold or self._closed or self._reading is not None:
            return False     # (one split read at a time: the next batch waits for its reply)
        lateness = self._cold.config.lateness or 0.0
        split = not probe and self._splits()
        with self._lock:
            size = self._cold.config.batch_size
            if split:
                # small batches while the reads keep up; what queued while the last reply
                # was coming (a slow server) up to batch_size, so that keys per round trip
                # grow with the round trip instead of a backlog
                size = min(size, max(_SPLIT_BATCH, len(buf.pending)))
            elif not probe:
                size = min(size, _INLINE_BATCH)
            batch, late = buf.take(size, self.watermark - lateness, head)
            self.counters["dropped_late"] += late
            self._thread_batches = 0
            self._cold._probing = probe  # threads take no batch meanwhile: the measure stays clean
        try:
            if batch and not (split and self._start_split(batch)):
                self._fetch(batch, inline=True)
        finally:
            if probe:
                with self._cond:
                    self._cold._probing = False
                    self._cond.notify_all()
        return bool(batch)

    # -- split reads: sent between two records, their replies taken between later ones ----

    def _start_split(self, batch: list[tuple[bytes, float, float]]) -> bool:
        """Operator thread: read ``batch`` as a split read if the top level can split its
        reads (``start_get_many``): the request is sent now, the reply taken by
        :meth:`poll_read` between later records, and the values staged, installed a few per
        record (:meth:`install`). The round trip then overlaps the records processed
        meanwhile, and no record waits for a whole batch: a blocking inline batch put its
        round trip, parsing, decoding and inserts into one record's latency (the keyed
        variant's p999). False when the level cannot: the caller reads the batch inline.

        The keys are not registered as loading: a record whose key is still being read waits
        for this reply (:meth:`poll_read` with ``block``, from the operator), and a get from
        elsewhere reads the key itself; what this read then finds resident is dropped, and a
        write since the request was sent is caught by the write sequence, as for any staged
        read."""
        m = self._mref()
        if m is None:
            return False
        lock = self._cold._read_lock
        if not lock.acquire(False):
            return False     # another operator's thread is taking the read out: read inline
        try:
            if self._reading is not None:
                return False
            return self._send_split(m, batch)
        finally:
            lock.release()

    def _send_split(self, m: Any, batch: list[tuple[bytes, float, float]]) -> bool:
        """:meth:`_start_split` with the read lock held."""
        keys = [kb for kb, _, _ in batch]
        t_start = time.perf_counter()
        # The operator chose when to read: latency and slack count from the read's start, as
        # for inline batches (else the depth controller sees a latency growing with the depth)
        meta = {kb: (ts, t_start) for kb, ts, _ in batch}
        staged = 0
        error: BaseException | None = None
        try:
            rescue, mine, seq = self._claim(m, keys, meta)
            if rescue:
                self._install_loaded(m, m._load_into_heap(rescue, None, prefetch=True), meta)
            if mine:
                pending = m._levels[0].start_get_many(mine)
                if pending is not None:
                    self._reading = _SplitRead(pending, keys, mine, meta, seq, t_start)
                    return True
                found, timings = m._read_levels(mine)    # more keys than one request takes
                staged = self._stage(m, mine, meta, found, timings, seq)
        except Exception as exc:
            error = exc
        except BaseException as exc:    # KeyboardInterrupt: the caller's, after the cleanup
            self._staged_done(m, keys, 0, exc, t_start, inline=True)
            raise
        self._staged_done(m, keys, staged, error, t_start, inline=True)
        return True

    def _splits(self) -> bool:
        """Whether the operator's batches are split reads: read inline, from a top level that
        splits its reads (``splits_reads``); else whole batches are loaded at once."""
        cold = self._cold
        if cold._split is None:
            m = self._mref()
            top = m._levels[0] if m is not None and m._levels else None
            cold._split = bool(getattr(top, "splits_reads", False))
        return cold._split and self.inline

    def poll_read(self, block: bool = False) -> bool:
        """Operator thread, between records: take the reply of the outstanding split read if
        it has arrived (``block``: wait for it, because the record about to be handed over
        needs one of its keys), read the keys the top level lacks from the levels below, and
        stage the values. A failed read is counted as a failed batch: its records fetch their
        keys themselves (the lookahead operator's recovery). Returns whether the read ended
        (its reply taken, or failed)."""
        r = self._reading
        if r is None or not self._cold._read_lock.acquire(False):
            return False
        try:
            if self._reading is not r:
                return False
            m = self._mref()
            error: BaseException | None = None
            staged = 0
            try:
                values = r.pending.wait() if block else r.pending.poll()
                if values is None:
                    return False
                self._reading = None
                if m is not None:
                    first = (values, time.perf_counter() - r.t_start)
                    found, timings = m._read_levels(r.mine, first=first)
                    staged = self._stage(m, r.mine, r.meta, found, timings, r.seq)
            except Exception as exc:
                self._reading = None
                error = exc
                if m is not None and m._levels and not isinstance(exc, CacheError):
                    level = m._levels[0]
                    error = LevelUnavailableError(
                        f"{level.name} level: a prefetch read failed: {exc}", level=level.name)
                    error.__cause__ = exc
            except BaseException as exc:
                self._reading = None
                r.pending.cancel()
                self._staged_done(m, r.keys, 0, exc, r.t_start, inline=True)
                raise
            self.counters["split_reads"] += 1
            self._staged_done(m, r.keys, staged, error, r.t_start, inline=True)
            return True
        finally:
            self._cold._read_lock.release()

    def _take_left_read(self) -> None:
        """Fetch thread: a split read is out and no operator is attached to take its reply
        (one stopped without ``close()``: a loop over it left by an exception or a break,
        the operator then collected). Take it here: else its keys stayed in flight for good
        (a later hint of one was taken and never read) and the reply unread on the
        connection. With still no operator attached, what it staged has nobody to wait for
        (as at the last ``detach``)."""
        if not self.poll_read(block=True):
            time.sleep(0.05)     # another thread is taking it
            return
        with self._cond:
            if not self._cold._consumers:
                self._drop_all_staged()

    def _drop_read(self) -> None:
        """Give up the outstanding split read (closing, or after a fork: the parent's)."""
        r = self._reading
        self._reading = None
        if r is not None and self._cold._pid == os.getpid():
            r.pending.cancel()

    def _measure_inline(self, start: float, end: float, cpu0: float, cpu1: float) -> None:
        """Choose where batches are read from what inline batches cost.

        An inline batch's wall time not spent on CPU is a wait (for the level, or for a core)
        that the record loop sits through; a fetch thread could overlap it, but every time the
        thread needs the GIL back it forces a hand-off on the record loop (after up to the
        switch interval, anywhere in a record's processing) and holds the GIL for its Python
        work, stalling that record. So batches are read inline unless their waits take more
        than ``_INLINE_WAIT_SHARE`` of the loop's time between batches: a slow remote store,
        not a local disk or a loopback Redis.

        On a loaded machine the thread is also off CPU while it waits for a core, which no
        fetch thread can overlap; that share is measured on the loop's own work between two
        batches (CPU time against wall time) and taken out of the batch's wait.
        """
        a = 0.25
        cold = self._cold
        wall, cpu = end - start, cpu1 - cpu0
        last = cold._last_inline_end
        cold._last_inline_end = (end, cpu1)
        if last is not None:
            gap_wall, gap_cpu = start - last[0], cpu0 - last[1]
            if gap_wall > 0:
                r = min(1.0, max(0.05, gap_cpu / gap_wall))
                cold._on_cpu = r if cold._on_cpu is None else cold._on_cpu + a * (r - cold._on_cpu)
            gap = end - last[0]
            cold._gap_s = gap if cold._gap_s is None else cold._gap_s + a * (gap - cold._gap_s)
        wait = max(0.0, wall - cpu / (cold._on_cpu or 1.0))
        cold._cpu_s = cpu if cold._cpu_s is None else cold._cpu_s + a * (cpu - cold._cpu_s)
        waits = cold._waits
        if cold._gap_s is None or cold.config.fetch_mode != "auto":
            waits.append(wait)
            return
        if self.inline:
            # A remote store's round trip is a floor under every batch; a busy machine's
            # stalls (a level server or this thread waiting for a core) come and go: judge by
            # the least wait of the recent batches.
            waits.append(wait)
            if len(waits) < 4:
                return
            w = min(waits)
            inline = w <= _INLINE_WAIT_SHARE * cold._gap_s
        else:
            # a probe (fetch threads paused): back inline as soon as a batch waits little
            w = wait
            inline = w <= _INLINE_WAIT_SHARE * cold._gap_s
            if inline:
                waits.clear()
                waits.append(wait)
        cold._wait_s = w
        if not inline:
            cold._last_inline_end = None  # the next inline batch is a probe, not the next
        if inline != self.inline:
            self.inline = inline
            if not inline:
                with self._cond:
                    self._cond.notify_all()


class _SplitRead:
    """A split read in flight (see ``BatchReads._start_split``)."""

    __slots__ = ("pending", "keys", "mine", "wanted", "meta", "seq", "t_start")

    def __init__(self, pending: Any, keys: list[bytes], mine: list[bytes],
                 meta: dict[bytes, tuple[float, float]], seq: int, t_start: float) -> None:
        self.pending = pending            # the level's PendingValues
        self.keys = keys                  # the batch's keys (in flight until the reply)
        self.mine = mine                  # those read
        self.wanted = set(mine)
        self.meta = meta
        self.seq = seq                    # the write sequence when the request was sent
        self.t_start = t_start


def _fetch_loop(pref: weakref.ref[Prefetcher]) -> None:
    """A fetch thread: read batches until the prefetcher closes, forks or is collected."""
    while True:
        p = pref()
        if p is None:
            return
        batch = p._next_batch()
        if batch is None:
            return
        if batch:
            p._fetch(batch)
        else:
            p._take_left_read()
        del p
