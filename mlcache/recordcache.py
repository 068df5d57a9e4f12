"""The record cache: forwarding of deduplicated updates on flush (Kafka Streams' KIP-63).

A manager whose heap policy is ``dedup`` (:class:`mlcache.policies.dedup.DedupPolicy`) owns one
:class:`RecordCache`. The heap is then Kafka's record cache: updates to a key overwrite each other
in memory, and each dirty key is forwarded to the flush listeners once, as ``(key, new, old)``,
and written to the next level once, when the dirty set is flushed — on ``flush()``, when the
commit interval expires, or under eviction pressure.

How the pieces cooperate (the policy decides, the record cache acts, the manager routes):

* **The policy holds the order.** It keeps each namespace's dirty keys in last-update order and
  the LRU. When its eldest entry is dirty it hands the namespace's whole dirty set to
  ``policy.flush_listener`` — :meth:`RecordCache._on_policy_flush` — before the eldest leaves.
* **The cut** (manager lock held, no I/O, no user code): the record cache snapshots each key's
  new value (the live heap object, or the value it holds for a key that is not resident: a
  tombstone, an oversize value) and its old value, and queues the records as one
  :class:`_Cut`. The evicted entry then goes down the ordinary write-back path, so it is never in
  no level; the cut's other keys stay resident and dirty in the heap.
* **Forwarding** (lock released, in the thread that wrote or flushed): cuts are delivered in
  the order they were taken, batch by batch, to the namespace's listeners and the manager's.
  After every listener took a batch, its entries still holding the forwarded value are encoded
  and queued to the write-back buffer (the one store write) and marked clean. Listeners run
  outside the manager lock, so a listener may read and write the cache; its writes are new
  updates, forwarded by a later flush (``flush()`` runs a few rounds so cascades settle).
  One forwarding thread at a time: a cut taken by another thread, or by a nested call from
  a listener, is delivered by the loop already running, so each key's records stay in order.
* **Failure**: a listener that raises stops the flush; the error reaches the caller of
  ``flush()``/``put()``. A write that raises it was applied (what its reading of old values
  or a wall-time commit cut is forwarded after the write, as its own evictions are), except
  the write an event-time commit failed in (see below). Batches every listener took are done (written, never forwarded again);
  the rest return to the front of their namespace's dirty order, with the listeners that did
  take the failed batch remembered, so a retry gives each listener exactly what it missed;
  a key updated since goes to every listener, with as ``old`` the value each saw last.
  A store failure while the forwarded entries are queued (a level down, the write-back buffer
  full) stops the flush the same way, after the batch: the rest of the cut is pending again.

Old values: ``old`` is the value last flushed — the heap value before the first update since
the last flush, read from the lower levels first (one batched read before the write) when the
key is not resident; ``None`` when the key had no value. ``new`` is ``None`` for a delete, so a
``None`` value stored with ``put`` looks like a delete to a listener. Values are the live objects:
a value mutated in place and put again has ``old is new``; put a new object to see both.

Commit interval: with ``DedupConfig(commit_interval=s)`` the dirty set is forwarded when ``s``
seconds passed (``time="wall"``) or when a write's ``ts`` enters a new interval of length
``s`` (``time="event"``, intervals ``[k*s, (k+1)*s)``), before that write is applied, so the
forwarded values are exactly the per-interval final values. The check runs on writes; the writes
of a committed interval go down in the background (``flush()`` waits for them). A failed
event-time commit raises into the write that triggered it (not applied) and is retried by the
next write.
"""
from __future__ import annotations

import math
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Collection, Hashable, Iterable

from .config import DedupConfig
from .errors import ConfigError, SerializationError
from .keys import SEP, decode_key
from .manager import _IMMUTABLE, _digest

__all__ = ["FlushBatch", "RecordCache"]

_TOMBSTONE: Any = object()
_MISSING: Any = object()
_FLUSH_ROUNDS = 8
_INF = float("inf")


class FlushBatch(list):
    """A list of ``(key, new, old)`` from one namespace; ``namespace`` is None for the root.

    ``reason`` says why it was flushed: ``"flush"``, ``"commit"``, ``"evict"`` or ``"resize"``.
    """

    __slots__ = ("namespace", "reason")

    def __init__(self, records: Iterable[tuple], namespace: str | None, reason: str) -> None:
        super().__init__(records)
        self.namespace = namespace
        self.reason = reason


class _Cut:
    __slots__ = ("space", "records", "reason")

    def __init__(self, space: bytes, records: list, reason: str) -> None:
        self.space = space
        self.records = records        # [(kb, new, old)], last-update order
        self.reason = reason


class _Olds(dict):
    """``before_write``'s answer: for keys of one write (``wanted``), the value each holds below,
    read before the write took the lock (``None``: none), and the value any of them had when it
    left the heap since (see ``RecordCache.note_victims``)."""

    __slots__ = ("wanted", "__weakref__")
    wanted: Collection[bytes]


def _idents(listeners: list[Callable]) -> list[tuple[int, int]]:
    """Each listener's identity for a retry: its id and how many times it came before in the
    list (a function registered on a namespace and on the manager is called twice)."""
    count: dict[int, int] = {}
    out = []
    for fn in listeners:
        i = id(fn)
        n = count.get(i, 0)
        count[i] = n + 1
        out.append((i, n))
    return out


class RecordCache:
    """Dirty-set forwarding for one manager (see the module docstring)."""

    def __init__(self, manager: Any, config: DedupConfig | None = None) -> None:
        self.manager = manager
        self.config = config or DedupConfig()
        heap = manager._heap
        self.heap = heap
        self.data = heap.data
        self.policy = heap.policy
        self.policy.flush_listener = self._on_policy_flush
        self._mark_dirty = self.policy.mark_dirty
        self._root = manager._prefix
        self._base = manager.config.namespace + "/"
        self._old: dict[bytes, Any] = {}      # pending key -> value last flushed
        self._held: dict[bytes, Any] = {}     # pending key not in the heap -> its new value
        self._partial: dict[bytes, set[tuple[int, int]]] = {}  # key -> _idents that took it
        # key -> {_ident: the value that listener took} for the listeners that took a record of
        # a failed batch: their next record of the key carries it as old (each listener's old
        # is the last value it saw; the others' is the last value every listener saw)
        self._seen: dict[bytes, dict[tuple[int, int], Any]] = {}
        self._cuts: deque[_Cut] = deque()
        # each thread's last write, between before_write and its note_put/note_delete (a
        # reference to its _Olds, dead once the write returned): a key of one that leaves the
        # heap meanwhile leaves its value there, where note_put finds it (see note_victims).
        # One entry a thread, replaced by its next write: no lock, no clean-up.
        self._writes: dict[int, weakref.ref[_Olds]] = {}
        # Old values held outside the heap's count (a delete's, an update's): the weight each
        # had in the heap; past the budget, the next write cuts their namespaces.
        self._tombs: dict[bytes, int] = {}
        self._tomb_weight = 0
        self._tombs_over = False
        self._listeners: dict[bytes | None, list[Callable]] = {}
        self._fwd_lock = threading.Lock()
        # threads whose write is reading its old values: what that cuts waits for the write's
        # own forwarding, after it is applied (see before_write)
        self._defer: set[int] = set()
        self._fwd_owner: int | None = None
        self._reason = "evict"
        self._interval = self.config.commit_interval
        self._event_time = self.config.time == "event"
        self._next_commit: float | None = (
            None if self._interval is None or self._event_time
            else time.monotonic() + self._interval)
        self._preload = self.config.old_values
        self.stats_counts = {"forwarded": 0, "batches": 0, "flushes": 0, "commits": 0,
                             "evictions": 0, "listener_errors": 0, "written": 0}

    # -- listeners -----------------------------------------------------------------------------

    def add_listener(self, prefix: bytes | None, callback: Callable) -> Callable:
        if not callable(callback):
            raise TypeError(f"a flush listener must be callable(batch), got "
                            f"{type(callback).__name__}")
        with self.manager._lock:
            self._listeners.setdefault(prefix, []).append(callback)
        return callback

    def remove_listener(self, prefix: bytes | None, callback: Callable) -> None:
        with self.manager._lock:
            fns = self._listeners.get(prefix, [])
            if callback in fns:
                fns.remove(callback)

    def stats(self) -> dict[str, Any]:
        with self.manager._lock:   # other threads' writes add namespaces to the policy
            out: dict[str, Any] = dict(self.stats_counts)
            out.update(dirty=self.policy.dirty_count(),
                       namespace_flushes=self.policy.namespace_flushes,
                       held=len(self._held), queued_cuts=len(self._cuts),
                       max_bytes_buffering=self.heap.capacity)
        return out

    # -- write hooks (called by the manager) ---------------------------------------------------

    def before_write(self, kbs: list[bytes], ts: float | None) -> dict[bytes, Any] | None:
        """Outside the lock, before a put/delete: commit on interval expiry, read old values."""
        me = threading.get_ident()
        if self._tombs_over and not self.manager._lock._is_owned():
            # (not from code holding the lock); what it cuts is forwarded by the write, once
            # applied (see _defer)
            self._defer.add(me)
            try:
                self._cut_tombstones()
            finally:
                self._defer.discard(me)
        if self._interval is not None and self._fwd_owner != threading.get_ident():
            self._maybe_commit(ts)
        if not self._preload:
            return None
        olds = _Olds()
        olds.wanted = kbs if len(kbs) < 8 else set(kbs)
        ref = weakref.ref(olds)
        self._writes[me] = ref
        data, old = self.data, self._old
        need = None
        for kb in kbs:
            if kb not in data and kb not in old:
                if need is None:
                    need = []
                need.append(kb)
        if need:
            olds.update(dict.fromkeys(need))
            # What loading them cuts (a dirty entry they evict) is forwarded by the write, once
            # applied: forwarded here, a listener that raised made the put raise before it was
            # applied, while the same error from the put's own evictions comes after (a caller
            # who took it for the sink's and went on had lost that write).
            self._defer.add(me)
            try:
                olds.update(self.manager._load_into_heap(need, ts))
            finally:
                self._defer.discard(me)
        return olds

    def _maybe_commit(self, ts: float | None) -> None:
        interval = self._interval
        assert interval is not None
        if self._event_time:
            if ts is None:
                return
            nxt = self._next_commit
            if nxt is None:
                self._next_commit = self._interval_end(ts)
                return
            if ts < nxt or nxt == _INF:
                return                 # (no interval follows the one of ts=inf)
            end = self._next_commit = self._interval_end(ts)
            self.stats_counts["commits"] += 1
            try:
                self.flush_all("commit", rounds=1)
            except BaseException:
                # The interval is not committed: the next write retries it, before it is
                # applied, so its final values are still forwarded as they are now.
                if self._next_commit == end:
                    self._next_commit = nxt
                raise
            return
        now = time.monotonic()
        if self._next_commit is not None and now < self._next_commit:
            return
        self._next_commit = now + interval
        self.stats_counts["commits"] += 1
        # the dirty set as it is now, forwarded by the write once applied (see _defer): a
        # listener that raised here made the write raise unapplied, and no write retries it
        me = threading.get_ident()
        self._defer.add(me)
        try:
            self.flush_all("commit", rounds=1)
        finally:
            self._defer.discard(me)

    def _interval_end(self, ts: float) -> float:
        """The start of the event-time interval after the one holding ``ts``. For ``ts=inf``
        it is inf (the last interval: nothing ends it); for ``ts=-inf``, the lowest finite
        float, so every finite ts starts a new interval (``inf // s`` is NaN, which no ts
        reaches, and every write would commit)."""
        interval = self._interval
        assert interval is not None
        end = (ts // interval + 1) * interval
        if math.isnan(end):            # ts infinite, or an infinite interval (0 * inf)
            end = -sys.float_info.max if ts == -_INF else _INF
        return end

    def note_put(self, kb: bytes, preloaded: dict[bytes, Any] | None) -> None:
        """Lock held, before the heap insert of ``kb``: capture its old value, mark it dirty."""
        old = self._old
        if kb not in old:
            value = self.data.get(kb, _MISSING)
            if value is not _MISSING:
                old[kb] = value
                heap = self.heap
                if heap.by_bytes:          # the old value leaves the heap's count: weigh it
                    w = heap.weights.get(kb, 1)
                    self._tomb_weight += w - self._tombs.get(kb, 0)
                    self._tombs[kb] = w
                    if self._tomb_weight > heap.capacity:
                        self._tombs_over = True
            else:
                old[kb] = self._current(kb, preloaded)
        if self._held:
            self._held.pop(kb, None)
        if self._partial:
            self._partial.pop(kb, None)
        self._mark_dirty(kb)

    def note_delete(self, kb: bytes, preloaded: dict[bytes, Any] | None) -> None:
        """Lock held, before the heap drops ``kb``: a tombstone, forwarded in its place."""
        if kb not in self._old:
            self._old[kb] = self._current(kb, preloaded)
        if kb in self.data:
            heap = self.heap
            w = heap.weights.get(kb, 1) if heap.by_bytes else 1
            self._tomb_weight += w - self._tombs.get(kb, 0)
            self._tombs[kb] = w
            if self._tomb_weight > heap.capacity:
                self._tombs_over = True      # cut by the next write (the heap drops kb now)
        self._held[kb] = _TOMBSTONE
        if self._partial:
            self._partial.pop(kb, None)
        self.policy.mark_dirty(kb)

    def _current(self, kb: bytes, preloaded: dict[bytes, Any] | None) -> Any:
        value = self.data.get(kb, _MISSING)
        if value is not _MISSING:
            return value
        held = self._held.get(kb, _MISSING)     # only for a key that is pending
        if held is not _MISSING:
            return None if held is _TOMBSTONE else held
        m = self.manager
        raw = m._wb.pending_lookup(kb)
        if raw is not None:
            return m._codec.decode(raw)
        if preloaded is not None:
            return preloaded.get(kb)
        return None

    def _cut_tombstones(self) -> None:
        """Outside the lock: the old values held for deletes and updates outweigh the budget
        (they take no room in the heap: deletes, or small values replacing large ones, never
        evict): cut their namespaces, as a dirty eviction would, and forward them."""
        m = self.manager
        with m._lock:
            if m._closed or not self._tombs_over:
                return
            old = self._old
            live = {kb: w for kb, w in self._tombs.items() if kb in old}
            weight = sum(live.values())
            self._tombs_over = False
            if 2 * weight <= self.heap.capacity:
                self._tombs, self._tomb_weight = live, weight   # most were forwarded since
                return
            self._tombs, self._tomb_weight = {}, 0
            policy = self.policy
            for space in {policy._ns_of(kb): None for kb in live}:
                keys = policy.take_dirty(space)
                if keys:
                    self.stats_counts["evictions"] += 1
                    self._cut(space, keys, "evict")
        self.forward()

    def note_victims(self, victims: list[tuple[bytes, Any, bool]]) -> None:
        """Lock held: a dirty victim still pending (refused as too heavy) keeps its new value
        only until its namespace is cut, at once, as the eviction of a dirty entry cuts it:
        held until the next flush, such values were memory outside the budget, unbounded."""
        if self._writes:
            # A key of a write under way that leaves the heap (evicted by that write's own
            # items or its reading of old values, or by another thread's) may be gone from
            # every place note_put looks before it looks (a clean victim is dropped, a dirty
            # one written down by the writer thread): its value is what downstream saw last,
            # the old of the write's record. (Its old was None, a put_many of 5 keys over a
            # heap of 2 holding 2 of them.)
            live = self._live_writes()
            if live:
                self._note_gone(live, [(kb, value) for kb, value, _ in victims])
        policy = self.policy
        spaces: dict[Any, None] | None = None
        for kb, value, dirty in victims:
            if dirty and policy.is_dirty(kb):
                self._held[kb] = value
                if spaces is None:
                    spaces = {}
                spaces[policy._ns_of(kb)] = None
        if spaces:
            for space in spaces:
                keys = policy.take_dirty(space)
                if keys:
                    self.stats_counts["evictions"] += 1
                    self._cut(space, keys, self._reason)

    def _on_policy_flush(self, space: Hashable, keys: list) -> None:
        """The policy's flush listener (lock held): snapshot the namespace's dirty records."""
        if keys:
            self.stats_counts["evictions"] += self._reason == "evict"
            self._cut(space, keys, self._reason)  # type: ignore[arg-type]

    def _cut(self, space: bytes, keys: list, reason: str) -> None:
        data, held, old = self.data, self._held, self._old
        records = []
        for kb in keys:
            new = data.get(kb, _MISSING)
            if new is _MISSING:
                new = held.pop(kb, None)
                if new is _TOMBSTONE:
                    new = None
            else:
                held.pop(kb, None)
            records.append((kb, new, old.pop(kb, None)))
        if self._writes:
            # a key of a write under way whose value was held outside the heap (an update or
            # delete not yet forwarded) is now nowhere note_put looks: its old is this new
            live = self._live_writes()
            if live:
                self._note_gone(live, [(kb, new) for kb, new, _ in records])
        self._cuts.append(_Cut(space, records, reason))

    def _live_writes(self) -> list[_Olds]:
        """The writes under way (see ``_writes``)."""
        return [olds for olds in (ref() for ref in list(self._writes.values()))
                if olds is not None]

    @staticmethod
    def _note_gone(live: list[_Olds], items: list[tuple[bytes, Any]]) -> None:
        """Lock held: ``items`` (key, value) left the places ``_current`` looks at; a write
        under way (of ``live``) that has the key finds the value in its ``_Olds``."""
        for olds in live:
            wanted = olds.wanted
            for kb, value in items:
                if kb in wanted:
                    olds[kb] = value

    def has_cuts(self) -> bool:
        return bool(self._cuts)

    # -- flushing ------------------------------------------------------------------------------

    def flush_all(self, reason: str = "flush", rounds: int = _FLUSH_ROUNDS) -> None:
        """Cut every namespace's dirty set and forward it; repeat while listeners add updates."""
        m = self.manager
        nested = self._fwd_owner == threading.get_ident()
        for _ in range(1 if nested else rounds):
            with m._lock:
                m._check_open()
                spaces = self.policy.dirty_namespaces()
                for space in spaces:
                    self._cut(space, self.policy.take_dirty(space), reason)
                if self._tombs:
                    self._tombs.clear()      # every held old value was just cut
                    self._tomb_weight = 0
                    self._tombs_over = False
                if spaces:
                    self.stats_counts["flushes"] += 1
            if not spaces and not self._cuts:
                break
            self.forward()
            if nested:
                break
        m._wb.ensure_writers()

    def forward(self) -> None:
        """Deliver the queued cuts in order (one forwarding thread at a time)."""
        me = threading.get_ident()
        if self._fwd_owner == me or me in self._defer:
            return      # a listener's nested call (the running loop delivers), or a write's
        with self._fwd_lock:
            self._fwd_owner = me
            try:
                while True:
                    with self.manager._lock:
                        if not self._cuts:
                            return
                        cut = self._cuts.popleft()
                    self._deliver(cut)
            finally:
                self._fwd_owner = None

    def _targets(self, space: bytes) -> list[Callable]:
        with self.manager._lock:
            return list(self._listeners.get(space, ())) + list(self._listeners.get(None, ()))

    def _namespace_name(self, space: bytes) -> str | None:
        if space == self._root:
            return None
        name = space[:-len(SEP)].decode() if space.endswith(SEP) else space.decode()
        return name[len(self._base):] if name.startswith(self._base) else name

    def _deliver(self, cut: _Cut) -> None:
        listeners = self._targets(cut.space)
        records = cut.records
        size = self.config.batch_size
        name = self._namespace_name(cut.space)
        n = len(cut.space)
        for start in range(0, len(records), size):
            chunk = records[start:start + size]
            if listeners:
                try:
                    self._call(listeners, chunk, name, n, cut.reason)
                except BaseException:
                    self.stats_counts["listener_errors"] += 1
                    self._restore(cut.space, records[start:])
                    raise
            try:
                self._written(chunk)
            except BaseException:
                # the chunk is forwarded and queued; the store failed to make room for it
                # (a level down): the rest of the cut is pending again, like a listener error
                self._restore(cut.space, records[start + size:])
                raise

    def _call(self, listeners: list[Callable], chunk: list, name: str | None, n: int,
              reason: str) -> None:
        partial, seen = self._partial, self._seen
        users = [(decode_key(kb[n:]), new, old) for kb, new, old in chunk]
        idents = None
        for lid, fn in enumerate(listeners):
            if partial or seen:
                if idents is None:
                    idents = _idents(listeners)
                batch = FlushBatch(self._view(users, chunk, idents[lid]), name, reason)
            else:
                batch = FlushBatch(users, name, reason)
            if batch:
                try:
                    fn(batch)
                except BaseException:
                    took = _idents(listeners)[:lid]
                    with self.manager._lock:
                        for kb, new, _ in chunk:
                            partial.setdefault(kb, set()).update(took)
                            saw = seen.setdefault(kb, {})
                            for ident in took:
                                saw[ident] = new
                    raise
        self.stats_counts["forwarded"] += len(chunk)
        self.stats_counts["batches"] += 1

    def _view(self, users: list, chunk: list, ident: tuple[int, int]) -> Iterable[tuple]:
        """Listener ``ident``'s records of a chunk after a failure: without those it took
        already, and with, as old, the value it took last of a key updated since."""
        partial, seen = self._partial, self._seen
        for u, (kb, _, _) in zip(users, chunk):
            if ident in partial.get(kb, ()):
                continue
            saw = seen.get(kb)
            if saw is not None and ident in saw:
                u = (u[0], u[1], saw[ident])
            yield u

    def _written(self, chunk: list) -> None:
        """Lock taken: forwarded entries still holding the forwarded value go down, clean."""
        m = self.manager
        heap, data, wb = self.heap, self.data, m._wb
        encode = m._codec.encode
        written = 0
        store = bool(m._levels)
        with m._lock:
            partial, seen = self._partial, self._seen
            for kb, new, _ in chunk:
                if partial:
                    partial.pop(kb, None)
                if seen:
                    seen.pop(kb, None)
                if kb not in heap.dirty or data.get(kb, _MISSING) is not new:
                    continue   # evicted (already queued), deleted, or updated since the cut
                if kb in heap.pinned:
                    continue
                if not store:
                    heap.dirty.discard(kb)   # heap only: forwarding was its only write
                    continue
                try:
                    raw = encode(new)
                except SerializationError:
                    continue   # stays dirty; the manager's flush reports it
                wb.enqueue(kb, raw)
                heap.dirty.discard(kb)
                if m._track and type(new) not in _IMMUTABLE:
                    m._digests[kb] = _digest(raw)   # in-place changes are still detected
                written += 1
            self.stats_counts["written"] += written
            need_room = wb.needs_room()
        if need_room:
            wb.make_room()

    def _restore(self, space: bytes, records: list) -> None:
        """A flush failed: these records and every queued cut are pending again, in order.

        A key's first record carries the value downstream saw last (its ``old``); its newest
        value is the last record's, or the key's current one when it was updated again since
        (it is then already dirty at the back, where it belongs). The listeners remembered as
        having taken a key's record took an older version than that when the key is in a later
        cut or was updated since, so they get the newer one too.
        """
        with self.manager._lock:
            pending = [(space, records)] + [(c.space, c.records) for c in self._cuts]
            self._cuts.clear()
            data, old, held, partial = self.data, self._old, self._held, self._partial
            newest: dict[bytes, Any] = {}      # key -> its newest restored value
            since: set[bytes] = set()          # keys updated again since their cut
            order: dict[bytes, list] = {}
            for sp, recs in pending:
                keys = order.setdefault(sp, [])
                for kb, new, prev in recs:
                    if kb in newest:           # cut again later: a newer version
                        newest[kb] = new
                        partial.pop(kb, None)
                        continue
                    newest[kb] = new
                    if kb in old:
                        since.add(kb)
                        partial.pop(kb, None)
                    else:
                        keys.append(kb)
                    old[kb] = prev
            for kb, new in newest.items():
                if kb in since:
                    continue
                if new is None and kb not in data:
                    held[kb] = _TOMBSTONE
                elif data.get(kb, _MISSING) is not new:
                    held[kb] = new
                else:
                    held.pop(kb, None)
            for sp, keys in order.items():
                self.policy.restore_dirty(sp, keys)

    # -- budget --------------------------------------------------------------------------------

    def resize(self, max_bytes: int) -> None:
        """Change the shared budget; shrinking evicts round robin across namespaces."""
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ConfigError("dedup.max_bytes_buffering",
                              f"must be a positive integer, got {max_bytes!r}")
        m = self.manager
        heap = self.heap
        with m._lock:
            m._check_open()
            heap.capacity = max_bytes
            if heap.by_bytes:
                heap.max_bytes = max_bytes
            else:
                heap.max_entries = max_bytes
            self._reason = "resize"
            try:
                victims = heap._take(self.policy.resize(max_bytes))
            finally:
                self._reason = "evict"
            if victims:
                m._handle_victims(victims)
            need_room = m._wb.needs_room()
        self.forward()
        if need_room:
            m._wb.make_room()
        m._wb.ensure_writers()
