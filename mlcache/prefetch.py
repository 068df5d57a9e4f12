"""Keyed prefetching: hints, the hint buffer, fetch threads, the hot-key filter.

The idea (Zapridou & Ailamaki, "Low-Latency Stateful Stream Processing through Timely and
Accurate Prefetching", ICDE 2026 — Keyed Prefetching with Timestamp-Aware Caching): the key a
stateful step will read is known earlier in the pipeline than the moment the step needs its
state, so the state can be fetched while earlier records are processed, taking lower-level I/O
off the critical path. ``hint(key, ts)`` says "key will be needed at event time ts".

Path of a hint (``Prefetcher.hint``, used by the lookahead operator; ``CacheManager.hint``
checks residency itself and calls ``submit`` for absent keys)::

    count the key in the sketch
    resident in the heap? ──yes──> hot (estimate > threshold)? ──yes──> dropped ("dropped_hot")
         │ no                           │ no
         │                              └──> policy.hint(key, ts)  (TAC renews the entry)
    lateness bound: ts < watermark - lateness ──> dropped ("dropped_late")
         │
    hint buffer: one entry per key (latest ts, first hint time), unprocessed -> in-flight
         │ up to batch_size keys per batch, one MGET / pipeline / diskcache transaction
         │ per level per batch; read by ...
         ├─ the lookahead operator itself, between records ("inline"; fetch_mode "auto" while
         │  the reads hardly wait). From a top level that splits its reads (an unbounded
         │  Redis: RedisLevel.start_get_many) as *split reads*: an MGET of 16 keys (more
         │  when a backlog queued) is sent between two records, its reply taken (without
         │  blocking) between later ones
         │  and staged, installed 2 per record (BatchReads._start_split / poll_read);
         │  otherwise manager._load_into_heap(batch, prefetch=True), keys inserted clean
         │  into the heap at once, then hinted with their own ts
         └─ fetch threads (reads that wait; hints without an operator): with an operator
            attached they only read and *stage* the raw bytes (Prefetcher._fetch_staged), and
            the operator's thread decodes and installs them (Prefetcher.install, 8 per record;
            a get of a staged key installs it at once); without one, _load_into_heap as above.

Why the split: the threads share the GIL with the record loop. A thread returning from I/O
waits up to the switch interval (5 ms), forces a hand-off wherever the loop is, and then holds
the GIL for its Python work; that was the keyed variant's tail. Work that needs the GIL runs on
the operator's thread, between records (docs/implementation/keyed-prefetching.md measures it).
A staged value is installed only if the key is still absent, not deleted, not in the eviction
buffer and not moved by a write since it was read (``WriteBack.moved_since``): a hint never
installs over a newer value. Staging is bounded (``staged_max_keys``/``staged_max_bytes``).

Costs per hint: one dict lookup (residency), one sketch increment that also gives the key's
estimate (4 counters, while the filter is on), and for a resident key one policy hint (TAC: an
entry update, O(1); its heap item moves lazily) — no lock on these paths. A queued key costs
one lock round and a dict insert; its fetch costs 1/batch_size of a batched read plus its
decode and heap insert. Per use: a lock-free check of the buffer and one dict pop.

* **Hot-key filter.** Every hint increments the 4-bit count-min sketch (:mod:`mlcache.sketch`,
  aged by halving; each increment applied at once, in Python: a buffered batch paused the
  record that applied it). A *resident* key whose
  counters all exceed ``prefetch.hot_threshold`` is hot enough to stay resident without help, so
  its hint is dropped: no policy hint, no lock. A hot key that is *not* resident is still
  fetched — in a process the residency check is a dict lookup, so unlike an upstream operator
  in a distributed engine we can afford to look before dropping, and the filter costs no hits.
  Under TAC a hot key's hint is dropped only if TAC keeps the key without it until the use
  (``_survives``: a deep read-ahead otherwise let hot keys last used long ago be evicted).
  ``hot_threshold=16`` disables it. The filter judges itself: in windows of 4096 hints, one in
  which it dropped under a quarter of them switches it off for 15 windows (no counting, no
  estimates), after which it runs a window again (``Prefetcher._hot_window``): on keys with
  little skew (Zipf 0.6: ~6% dropped) it cost ~2 us per hint to save ~1 us per dropped hint.
  The default 12 was chosen on the YSB-like Zipf 1.0 workload (see
  docs/implementation/keyed-prefetching.md): lower thresholds drop more hints but leave hot
  entries un-renewed in TAC, and the hit ratio starts to fall.
* **Hint buffer.** A dict keyed by the canonical key bytes, insertion-ordered, so re-hinting a
  key is O(1) and keeps one entry (latest ts); fetch threads take the oldest entries first,
  which for a read-ahead operator is use order. Rejected: a heap ordered by ts — O(log n) per
  hint for an order the operator already produces.
* **Demand priority, no double fetch.** A fetch thread does not start a batch while a demand
  fetch of the operator is running (``Prefetcher.demand()``), and never holds the manager's lock
  during I/O; a demand get for a key in flight waits for that fetch inside the manager (its
  per-key in-flight futures) instead of reading it again, and a prefetch skips a key a demand
  get is reading; a key used while still unprocessed is cancelled from the buffer and left to
  the demand fetch.
* **Lateness.** The watermark is the ts of the latest record used; a hint whose ts is older than
  ``watermark - lateness`` (``lateness=None`` means 0: the record already passed) is dropped on
  arrival and again when a fetch thread takes it.
* **Accounting.** A prefetched key is *useful* if it is used before it leaves the heap,
  *wasted* if it is evicted unused (found by a periodic sweep), and a use is *late* if the key
  was still queued or in flight. *Slack* is the time from the first hint to the use; *fetch
  latency* the time from the first hint to the key being resident. Both are kept in bounded
  windows for percentiles. Uses are reported by the lookahead operator (``note_use``) and by
  the manager's get (``note_get``, for keys hinted with a bare ``hint``): a heap hit checks one
  dict only while unused prefetches exist, a miss asks whether the key is queued.
* **Failures.** A prefetch batch that raises is counted and its keys remembered; the lookahead
  operator then demand-fetches those records itself and raises only if that fails too.

Threads are created on the first queued hint, rebuilt after ``fork`` (``os.getpid()`` check),
are daemons, hold only a weak reference to the manager, and exit on :meth:`Prefetcher.close`
(called by ``CacheManager.close``) or when the manager is collected.

This module holds the prefetcher's hint path, uses and accounting; the rest is split by
concept: the hint buffer and the hot-key filter in :mod:`mlcache._hints`, reading batches
(fetch threads, inline batches and the choice between them) in :mod:`mlcache._batchreads`,
staging and installing in :mod:`mlcache._staging`, and the lookahead operator
:func:`prefetching` with its depth controller in :mod:`mlcache._lookahead`.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Iterator

from mlcache.policies.base import BasePolicy

from ._batchreads import BatchReads
from ._hints import HintBuffer, HotKeyFilter, _make_filter
from ._lookahead import DepthController, RecordKeyError, prefetching
from ._staging import StagedReads

__all__ = ["Prefetcher", "HintBuffer", "HotKeyFilter", "DepthController", "RecordKeyError",
           "prefetching"]


class _Window:
    """The last ``maxlen`` samples of a quantity, for percentiles."""

    __slots__ = ("_d",)

    def __init__(self, maxlen: int = 2048) -> None:
        self._d: deque[float] = deque(maxlen=maxlen)

    def add(self, x: float) -> None:
        self._d.append(x)

    def __len__(self) -> int:
        return len(self._d)

    def recent(self, n: int) -> list[float]:
        # Fetch threads append while the operator reads. list(deque) copies in one C call, with
        # no thread switch inside; an islice iterator made in one bytecode and consumed in the
        # next can see an append in between and raise "deque mutated during iteration".
        snapshot = list(self._d)
        return snapshot[-n:] if n > 0 else []

    def quantile(self, q: float, last: int | None = None) -> float | None:
        data = self.recent(last) if last else list(self._d)
        return quantile(data, q)


def quantile(data: list[float], q: float) -> float | None:
    if not data:
        return None
    data = sorted(data)
    return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]


class _Cold:
    """The prefetcher's state that the per-record paths (``hint``, ``note_use``, ``pump``)
    read at most once a batch: settings, staging bounds, latency windows, fork and thread
    bookkeeping, and the inline-batch measures.

    Kept apart so that a prefetcher has few attributes: CPython 3.11 keeps an object's
    attributes in a compact array read at a fixed offset only while its class's instances have
    fewer than 30 attribute names; past that they all live in a dict and every ``self._x`` on
    the hint and use paths is a hashed lookup (LOAD_ATTR_WITH_HINT instead of
    LOAD_ATTR_INSTANCE_VALUE). With its mixins' state the prefetcher had 42.
    ``tests/test_prefetch.py`` keeps the count down: put new state here unless a per-record
    path reads it."""

    __slots__ = ("config", "staged_max_bytes", "staged_max_keys", "slack", "fetch_latency",
                 "batch_latency", "_pid", "_threads", "_consumers", "_last_sweep", "_backlog",
                 "_hot_mark", "_hot_windows", "_wait_s", "_cpu_s", "_gap_s", "_on_cpu", "_waits",
                 "_probing", "_last_inline_end", "_split", "_read_lock")

    config: Any                       # the manager's PrefetchConfig
    staged_max_bytes: int             # staged bytes past which fetch threads take no batch
    staged_max_keys: int              # likewise for staged keys
    slack: _Window                    # hint-to-use time of prefetched keys
    fetch_latency: _Window            # hint-to-landing time of prefetched keys
    batch_latency: _Window            # wall time of a batch read
    _pid: int                         # the process the threads and locks belong to
    _threads: list[threading.Thread]  # the fetch threads
    _consumers: "weakref.WeakSet[Any]"  # the lookahead operators attached
    _last_sweep: float                # perf_counter of the last sweep of stale landings
    _backlog: deque[int]              # keys left queued after each take
    _hot_mark: tuple[int, int]        # (hints, dropped_hot) at the hot-filter window's start
    _hot_windows: int                 # hot-filter windows judged since construction
    _wait_s: float | None             # EWMA of an inline batch's wall time not on CPU
    _cpu_s: float | None              # EWMA of an inline batch's CPU time
    _gap_s: float | None              # EWMA of the time between two inline batches
    _on_cpu: float | None             # EWMA share of the loop's wall time on CPU
    _waits: deque[float]              # recent inline batches' waits
    _probing: bool                    # an inline probe batch is being read
    _last_inline_end: tuple[float, float] | None   # (wall, thread CPU) time
    _split: bool | None               # whether the top level splits reads (None: not asked)
    _read_lock: threading.Lock        # held while the outstanding split read is taken


class Prefetcher(BatchReads, StagedReads):
    """The manager's prefetch engine: hint buffer, hot-key filter, fetch threads, statistics.

    The hint path, uses and statistics are here; reading batches and staging come from its
    mixins (``mlcache._batchreads.BatchReads``, ``mlcache._staging.StagedReads``)."""

    def __init__(self, manager: Any) -> None:
        cold = self._cold = _Cold()
        cold.config = cfg = manager.config.prefetch
        self._mref = weakref.ref(manager)
        self._filter = _make_filter(manager)
        # a policy without its own hint (LRU, CLOCK) gains nothing from being told
        policy = getattr(getattr(manager, "_heap", None), "policy", None)
        own_hint = getattr(type(policy), "hint", BasePolicy.hint)
        self._policy_hints = policy is not None and own_hint is not BasePolicy.hint
        # an event-time policy tells when an entry not renewed leaves (see _survives)
        self._survival = None
        if (policy is not None and self._policy_hints
                and all(callable(getattr(policy, n, None)) for n in ("timestamp", "front"))
                and isinstance(getattr(type(policy), "now", None), property)):
            tac = policy
            self._survival = (tac.timestamp, tac.front, lambda: tac.now)
        # Staged bytes wait outside the heap's accounting: bound them (fetch threads take no
        # new batch while the bound is reached; the operator drains them every record).
        heap = manager.config.heap
        cold.staged_max_bytes = (max(256 << 10, heap.max_bytes // 16)
                                 if heap is not None and heap.max_bytes else 16 << 20)
        cold.staged_max_keys = max(4 * cfg.batch_size * cfg.fetch_threads,
                                   heap.max_entries // 8
                                   if heap is not None and heap.max_entries else 0)
        self._reset()

    # the prefetch settings, the staging bounds and the latency windows, kept in _cold
    @property
    def config(self) -> Any:
        return self._cold.config

    @property
    def staged_max_bytes(self) -> int:
        return self._cold.staged_max_bytes

    @staged_max_bytes.setter
    def staged_max_bytes(self, value: int) -> None:
        self._cold.staged_max_bytes = value

    @property
    def staged_max_keys(self) -> int:
        return self._cold.staged_max_keys

    @staged_max_keys.setter
    def staged_max_keys(self, value: int) -> None:
        self._cold.staged_max_keys = value

    @property
    def slack(self) -> _Window:
        return self._cold.slack

    @property
    def fetch_latency(self) -> _Window:
        return self._cold.fetch_latency

    @property
    def batch_latency(self) -> _Window:
        return self._cold.batch_latency

    # -- lifecycle --------------------------------------------------------------------------

    def _reset(self) -> None:
        """(Re)build every per-process piece: called at construction and after a fork."""
        cold = self._cold
        cold._pid = os.getpid()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._buffer = HintBuffer()
        cold._threads = []
        self._closed = False
        self._demand = 0
        self._landed: dict[bytes, float] = {}      # prefetched, not yet used -> t_hint
        self._noted: bytes | None = None            # the key the operator reported last
        m = self._mref()
        if m is not None:
            m._pf_landed = self._landed  # the manager's get path tells us of their first use
        self._failed: dict[bytes, BaseException] = {}
        self._used_inflight: set[bytes] = set()     # used (late) while their fetch ran
        cold._last_sweep = time.perf_counter()
        self.watermark = -math.inf
        self.depth: int | None = None              # set by the lookahead operator
        self.counters = dict.fromkeys(
            ("hints", "sent", "resident", "dropped_hot", "dropped_late", "prefetched",
             "useful", "wasted", "late", "failures", "batches", "inline_batches",
             "staged", "staged_dropped", "hot_filter_off", "split_reads"), 0)
        self._hot = self._filter                   # the filter while it is on, else None
        self._hot_tick = self.HOT_WINDOW          # hints left in the current window
        cold._hot_mark = (0, 0)
        cold._hot_windows = 0
        cold.slack = _Window()
        cold.fetch_latency = _Window()
        cold.batch_latency = _Window()
        cold._backlog = deque(maxlen=64)
        # Staged: read by a fetch thread, not yet decoded nor in the heap (kb -> raw bytes, the
        # hint's ts, the first hint's wall time, wseq when the bytes were known exact). The
        # lookahead operators attached (``attach``) install them from their own thread.
        self._staged: dict[bytes, tuple[bytes, float, float, int]] = {}
        self._staged_bytes = 0
        # staged keys hinted again for a later time: installs are ordered by a staged read's
        # first expected use (its own ts), and the policy is told the latest one
        self._staged_later: dict[bytes, float] = {}
        cold._consumers = weakref.WeakSet()
        # Where batches are read: by an attached operator itself ("inline": the reads do not
        # wait, so a thread would only contend for the GIL) or by the fetch threads.
        self.inline = cold.config.fetch_mode != "threads"
        cold._wait_s = cold._cpu_s = cold._gap_s = cold._on_cpu = None
        cold._waits = deque(maxlen=16)
        cold._probing = False
        cold._last_inline_end = None
        self._thread_batches = 0             # thread batches since the last inline probe
        # the outstanding split read (one at a time), taken by the operator's thread
        self._reading = None
        cold._read_lock = threading.Lock()
        cold._split = None                   # BatchReads._splits, known on first use

    def _check_fork(self) -> None:
        if self._cold._pid != os.getpid():
            self._reset()   # (a split read of the parent's is forgotten, its socket untouched)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the fetch threads and forget queued hints (the manager calls it from close)."""
        if self._cold._pid != os.getpid():
            self._reset()
        with self._cold._read_lock:
            self._drop_read()
        with self._cond:
            self._closed = True
            self._buffer.pending.clear()
            self._staged.clear()
            self._staged_later.clear()
            self._staged_bytes = 0
            self._cond.notify_all()
        me = threading.current_thread()
        for t in self._cold._threads:
            if t is not me:
                t.join(timeout)
        self._cold._threads = []

    stop = close

    @property
    def closed(self) -> bool:
        return self._closed

    # -- hints ------------------------------------------------------------------------------

    def hint(self, kb: bytes, ts: float) -> str:
        """Full hint path for canonical key bytes: residency, hot-key filter, buffer.

        Returns what happened: ``"hot"``, ``"resident"``, ``"late"``, ``"queued"`` or
        ``"closed"``. This runs once per record in the lookahead operator, so it stays short:
        no lock unless the key has to be queued.
        """
        m = self._mref()
        if m is None or self._closed:
            return "closed"
        counters = self.counters
        counters["hints"] += 1
        self._hot_tick -= 1
        if self._hot_tick <= 0:
            self._hot_window()
        f = self._hot
        if m._resident(kb):
            if f is not None and f.hot(kb) and self._survives(kb, ts):
                counters["dropped_hot"] += 1
                return "hot"
            counters["resident"] += 1
            if self._policy_hints:
                m._policy_hint(kb, ts)
            return "resident"
        if f is not None:
            f.count(kb)     # popularity is learnt from every hint; the estimate is not needed
        return self._enqueue(kb, ts)

    def _survives(self, kb: bytes, ts: float) -> bool:
        """Whether a hot resident key stays resident until its use at ``ts`` without this
        hint, so that the hint may be dropped.

        Under an event-time policy (TAC) an entry not renewed leaves once the evictions reach
        its timestamp. The eviction front (the smallest timestamp) moves over the entries used
        in the past at about the rate the clock does (each stays about as long as it takes the
        evictions to go round them), so an entry ``s - front`` ahead of the front is safe for
        about that long: the hint is dropped when that is more than twice the time to the use.
        With a shallow read-ahead a hot key passes easily (used moments ago, needed soon);
        with a deep one (a slow server: thousands of records ahead) a key hot by count but not
        used for a while did not, and its record then missed -- a full round trip in the
        keyed path's tail. Other policies have no such clock: a hot key's hint is dropped."""
        survival = self._survival
        if survival is None:
            return True
        stamp, front, now = survival
        s = stamp(kb)
        if s is None or s >= ts:
            return True          # (stamped for this use or a later one: the hint changes nothing)
        f = front()
        return f is None or s - f > 2.0 * (ts - now())

    # The hot-key filter watches what it achieves: windows of HOT_WINDOW hints; after the
    # first HOT_WARMUP windows (the sketch learns), a window in which it dropped less than
    # HOT_MIN_SHARE of the hints switches it off for HOT_OFF_WINDOWS windows (no sketch
    # increments, no estimates: hints go straight to the policy), then it runs one window again
    # and is judged anew. Its cost is paid on every hint (~1-2 us: a buffered increment and, for
    # a resident key, an estimate); a drop saves one policy hint under the manager's lock
    # (~1 us with TAC). Where it drops little (nexmark, Zipf 0.6: ~6%) it costs more than it
    # saves; where keys are skewed (ysb, Zipf 1.0: ~56%) it does its job and stays on.
    HOT_WINDOW = 4096
    HOT_WARMUP = 2
    HOT_MIN_SHARE = 0.25
    HOT_OFF_WINDOWS = 15

    def _hot_window(self) -> None:
        """End of a hint window: judge the filter by the share of hints it dropped."""
        c = self.counters
        f = self._filter
        if f is None:
            self._hot_tick = 1 << 62
            return
        self._hot_tick = self.HOT_WINDOW
        if self._hot is None:            # off period over: run (and measure) one window
            self._hot = f
        else:
            hints = c["hints"] - self._cold._hot_mark[0]
            share = (c["dropped_hot"] - self._cold._hot_mark[1]) / hints if hints else 1.0
            self._cold._hot_windows += 1
            if self._cold._hot_windows > self.HOT_WARMUP and share < self.HOT_MIN_SHARE:
                self._hot = None
                self._hot_tick = self.HOT_WINDOW * self.HOT_OFF_WINDOWS
                c["hot_filter_off"] += 1
        self._cold._hot_mark = (c["hints"], c["dropped_hot"])

    def submit(self, kb: bytes, ts: float) -> str:
        """Entry from ``CacheManager.hint`` for a key that is not resident: queue it."""
        if self._closed:
            return "closed"
        self.counters["hints"] += 1
        f = self._hot
        if f is not None:
            f.count(kb)    # popularity is learnt from every hint
        return self._enqueue(kb, ts)

    def _enqueue(self, kb: bytes, ts: float) -> str:
        if self._cold._pid != os.getpid():
            self._reset()
        lateness = self._cold.config.lateness or 0.0
        buf = self._buffer
        with self._cond:
            if ts < self.watermark - lateness:
                self.counters["dropped_late"] += 1
                return "late"
            if kb in buf.pending or kb in buf.inflight:
                state = buf.add(kb, ts, 0.0)
            elif self._staged and kb in self._staged:
                # read already, waiting to be installed: the policy is told this later time
                self._stage_later(kb, ts)
                return "queued"
            else:
                buf.pending[kb] = (ts, time.perf_counter(), ts)   # HintBuffer.add, inlined
                state = "new"
            if state == "new":
                self.counters["sent"] += 1
                if not self._thread_idle():
                    # (waking a thread that will find nothing to take costs the record loop a
                    # GIL hand-off per hint)
                    self._cond.notify()
        if len(self._cold._threads) < self._cold.config.fetch_threads:
            self._ensure_threads()
        return "queued"

    # -- uses and demand fetches -----------------------------------------------------------

    def note_get(self, kb: bytes, ts: float | None = None) -> None:
        """The manager's get path used ``kb``, which was prefetched and not yet used (a heap
        hit) or is not resident (a miss, perhaps while its prefetch is queued).

        Keys hinted with a bare ``manager.hint`` are accounted here; a get of the key the
        lookahead operator just reported (its record's own get) is not counted twice.
        """
        if self._cold._pid != os.getpid() or self._closed:
            return
        if kb != self._noted:
            self._use(kb, ts)
        if kb in self._staged:
            # read already, waiting for the operator to install it: decode it now, no I/O
            self.install_keys([kb])

    def note_use(self, kb: bytes, ts: float | None = None) -> float | None:
        """A record needing ``kb`` (at event time ``ts``) reached the stateful step.

        Advances the watermark, classifies the prefetch (useful / late) and returns the slack in
        seconds if the key had been hinted, else ``None``.
        """
        self._noted = kb
        return self._use(kb, ts)

    def _use(self, kb: bytes, ts: float | None) -> float | None:
        if ts is not None and ts > self.watermark:
            self.watermark = ts
        buf = self._buffer
        if kb not in buf.pending and kb not in buf.inflight:
            # Lock-free fast path: a fetch thread adds a key to _landed before it leaves
            # in-flight, so a key seen in neither has landed already or was never queued.
            t0 = self._landed.pop(kb, None)
            if t0 is None:
                staged = self._staged.get(kb)
                if staged is None:
                    return None
                t0 = staged[2]       # read in time; installed by this use's get (no I/O)
            self.counters["useful"] += 1
            s = time.perf_counter() - t0
            self._cold.slack.add(s)
            return s
        now = time.perf_counter()
        with self._lock:
            st = buf.state(kb)
            if st is None:
                t0 = self._landed.pop(kb, None)
                if t0 is None:
                    return None
                self.counters["useful"] += 1
            else:
                where, (hts, t0, first_ts) = st
                self._landed.pop(kb, None)
                if ts is not None and first_ts > ts:
                    # queued by a later record's hint; this record's own hint found the key
                    # resident (it was evicted since): a miss, not a late prefetch
                    return None
                self.counters["late"] += 1
                if where == "inflight":
                    self._used_inflight.add(kb)
                elif ts is None or hts <= ts:
                    # nobody later needs it: the demand fetch loads it; don't fetch it again
                    del buf.pending[kb]
            s = now - t0
            self._cold.slack.add(s)
            return s

    def failure(self, kb: bytes) -> BaseException | None:
        """The error of a failed prefetch of ``kb`` (and forget it), else ``None``."""
        return self._failed.pop(kb, None) if self._failed else None  # dict.pop is atomic

    @contextlib.contextmanager
    def demand(self) -> Iterator[None]:
        """Mark a demand fetch in progress: fetch threads start no new batch meanwhile."""
        with self._lock:
            self._demand += 1
        try:
            yield
        finally:
            with self._cond:
                self._demand -= 1
                if not self._demand:
                    self._cond.notify_all()

    def waiting(self) -> int:
        """Prefetched, staged or queued keys whose records have not come yet."""
        b = self._buffer
        return len(self._landed) + len(self._staged) + len(b.pending) + len(b.inflight)

    # -- statistics -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        self._sweep()
        ms = _ms
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
            out["pending"] = len(self._buffer.pending)
            out["inflight"] = len(self._buffer.inflight)
            out["depth"] = self.depth
            out["saturated"] = self.saturated
            out["staged_now"] = len(self._staged)
            out["staged_bytes"] = self._staged_bytes
            out["mode"] = "inline" if self.inline else "threads"
            out["inline_batch_ms"] = {"wait": ms(self._cold._wait_s), "cpu": ms(self._cold._cpu_s),
                                      "between": ms(self._cold._gap_s),
                                      "on_cpu": self._cold._on_cpu}
            slack = list(self._cold.slack._d)
            lat = list(self._cold.fetch_latency._d)
            blat = list(self._cold.batch_latency._d)
        out["slack_ms"] = {"p1": ms(quantile(slack, 0.01)), "p50": ms(quantile(slack, 0.5)),
                           "p99": ms(quantile(slack, 0.99))}
        out["fetch_latency_ms"] = {"p50": ms(quantile(lat, 0.5)), "p99": ms(quantile(lat, 0.99))}
        out["batch_latency_ms"] = {"p50": ms(quantile(blat, 0.5)),
                                   "p99": ms(quantile(blat, 0.99))}
        hints = out["hints"]
        out["hot_drop_ratio"] = out["dropped_hot"] / hints if hints else 0.0
        out["hot_filter"] = ("disabled" if self._filter is None
                             else "on" if self._hot is not None else "off")
        return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 4)
