"""CacheManager: routes get/put/delete/hint/flush/checkpoint across the heap and the byte levels.

The data path (DESIGN §2): a read looks in the heap, then the eviction buffer, then waits for a
fetch already in flight, then asks the byte levels in order with one ``get_many`` per level per
batch; what it finds is decoded and inserted into the heap clean (the lower copy stays, so a
clean eviction later costs nothing). A write replaces the heap entry and marks it dirty; dirty
victims go down through :mod:`mlcache.writeback`.

Everything shared is guarded by one re-entrant lock, held only for in-memory work. A heap hit
takes no lock at all: a dict read and an append to a read buffer that is replayed to the policy
in batches. Level I/O runs outside the lock (see writeback's ``wseq`` for how reads stay exact
while writes are in flight; the miss path is in :mod:`mlcache._readpath`). User keys are turned
into canonical byte keys once and memoised (:mod:`mlcache._keyview`), so a hit never runs
msgpack.

The manager itself keeps construction, the hit path and its read buffer, the public API and
stats; the rest is composed from mixins, each in a module of its own: the miss path
(:mod:`mlcache._readpath`), the write side (:mod:`mlcache._writepath`), the hooks of keyed
prefetching (:mod:`mlcache._prefetchhooks`), what a bytes-bounded heap's budget reserves
beside the entries (:mod:`mlcache._heapbudget`) and the key memo (:mod:`mlcache._keyview`).
"""
from __future__ import annotations

import builtins
import importlib
import itertools
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping

from ._heapbudget import _ENTRY_OVERHEAD, _MEMO_MIN, _MEMO_SHARE, HeapBudget
from ._heapbudget import _MEMO_ENTRY  # noqa: F401  (read here by tests/test_reliability_memory)
from ._keyview import KeyView
from ._loans import Loans
from ._namespace import Namespace
from ._prefetchhooks import PrefetchHooks
from ._readpath import (IMMUTABLE, MISSING, Digests, ReadPath, _closed_error, _Load,
                        digest as _digest, event_time, found_by_key)
from ._writepath import WritePath, batch_items
from .codec import Codec
from .config import ArenaConfig, CacheConfig
from .errors import CacheError, ConfigError, SerializationError
from .keys import decode_key, namespace_prefix
from .levels.heap import HeapLevel
from .stats import Stats
from .writeback import EvictionBuffer, LostWrites, WriteBack

__all__ = ["CacheManager", "Namespace", "register_structure"]

_MISSING = MISSING
_IMMUTABLE = IMMUTABLE
_SIMPLE_KEYS = frozenset((str, int, bytes))

_READ_BATCH = 64

_STRUCTURES: dict[str, Callable[..., Any]] = {}


def register_structure(kind: str, factory: Callable[..., Any]) -> None:
    """Register ``factory(manager, name, **kw)`` as ``manager.structure(kind, name, **kw)``."""
    _STRUCTURES[kind] = factory


_LIVE: "weakref.WeakSet[CacheManager]" = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: locks may have been held by threads that do not exist here, and no
    writer or fetch thread was copied; start over with fresh ones (created lazily).

    What the parent had not written yet stays the parent's to write: its dirty entries become
    clean copies here (still read, never written: their digests go, so no flush takes them
    for changes made in place), and the writes and deletes it had queued for a level, and the
    keys an intermediate level holds newer than the one below, are forgotten. The child wrote
    them as its own (evicted, flushed, checkpointed), over what the parent wrote later."""
    for manager in list(_LIVE):
        manager._lock = threading.RLock()
        manager._cold.loading = {}
        wb = manager._wb
        wb.reset_after_fork(manager._lock)
        heap = manager._heap
        if heap is not None:
            for kb in [kb for kb in heap.dirty if kb not in heap.pinned]:
                heap.dirty.discard(kb)
                manager._digests.pop(kb)
                manager._handed.discard(kb)
        manager._cold.loans.clear()   # (as the parent's dirty entries: its to write)
        wb.buffer = EvictionBuffer(len(wb.levels))
        wb.tombstones.clear()
        for newer in wb.newer:
            newer.clear()
        for unsure in wb.unsure:
            unsure.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _release_dropped(wb: WriteBack, levels: list, pid: int, name: str) -> None:
    """A manager garbage-collected without close(): stop its writer threads and close its
    levels. Its writer threads refer to the write-back and the levels, not to the manager, so
    they outlived it, each holding its levels' connections and files (a thread and three file
    descriptors a dropped manager over a disk level). Nothing is written (guarantees.md: no
    durability point at ``__del__``): what was not flushed is lost, as before, and victims
    still queued for a level are no longer written by a thread left behind. Run on a thread
    of its own, as a finalizer may run in any thread, at any allocation, and joining a writer
    there could wait on a lock that thread holds."""
    if pid != os.getpid():
        return   # a forked child's copy: the parent's threads and connections are not ours
    # As an unclosed file or socket does: a dropped manager is a bug in the caller's program
    # (its unflushed writes are gone), silent unless warnings of this category are shown
    # (python -X dev, -W default, pytest).
    warnings.warn(f"CacheManager (namespace {name!r}) was garbage-collected without close(): "
                  "writes it had not flushed or checkpointed are discarded; call close() or "
                  "use it in a with statement", ResourceWarning, stacklevel=2)

    def release() -> None:
        try:
            wb.stop()
        finally:
            for level in levels:
                try:
                    level.close()
                except Exception:   # (nobody to tell: release the others all the same)
                    pass

    threading.Thread(target=release, name="mlcache-release", daemon=True).start()


class _Cold:
    """The manager's state that a heap hit never reads and a put reads at most once a batch:
    names, registries, counters and the bookkeeping of loads and unencodable entries.

    Kept apart so that a manager has few attributes: CPython 3.11 keeps an object's attributes
    in a compact array read at a fixed offset only while its class's instances have fewer than
    30 attribute names; past that they all live in a dict and every ``self._x`` on the hit and
    put paths is a hashed lookup (LOAD_ATTR_WITH_HINT instead of LOAD_ATTR_INSTANCE_VALUE).
    With its mixins' state the manager had 37. ``tests/test_manager.py`` keeps the count down:
    put new state here unless the hit or put path reads it."""

    __slots__ = ("closing", "good_types", "hits", "last_checkpoint_id", "level_names", "loading",
                 "loans", "memo_total", "namespaces", "pin_errors", "release", "stats", "structures",
                 "weighers", "weak_structures")

    memo_total: int  # key memo entries charged to the heap budget (see HeapBudget)
    level_names: list[str]  # the byte levels' names in stats, fastest first
    stats: Stats  # counted on misses and evictions, never on a hit
    hits: int  # heap hits replayed to the policy so far
    pin_errors: dict[bytes, SerializationError]  # dirty entries that could not be encoded
    loans: Loans  # victims still held by the caller (see mlcache._loans)
    good_types: set[type]  # value types seen to encode (see WritePath._put_items)
    loading: dict[bytes, _Load]  # fetches in flight, by key
    # Held weakly: a namespace lives while something uses it (a structure holds its own), and
    # so does a structure that keeps all its state in the manager (``_held_weakly``: this
    # package's kinds); one nested in a value is opened again when read again. Held strongly,
    # every one ever resolved stayed for the manager's life, outside the heap budget. Other
    # registered kinds (any object a factory returns) are kept, as before.
    namespaces: "weakref.WeakValueDictionary[str, Namespace]"
    structures: dict[tuple[str, str], Any]
    weak_structures: "weakref.WeakValueDictionary[tuple[str, str], Any]"
    # (namespace prefix, weigh(value) -> int | None): see CacheManager._weigh_with
    weighers: list[tuple[bytes, Callable[[Any], int | None]]]
    last_checkpoint_id: Any
    closing: int | None  # the thread running close(): other threads' writes are refused
    release: "weakref.finalize"  # releases the threads and levels of a manager dropped open


class CacheManager(ReadPath, WritePath, PrefetchHooks, HeapBudget, KeyView):
    """A multi-level cache: heap -> byte levels, fastest first. Thread-safe; a context manager."""

    def __init__(self, config: CacheConfig | None = None) -> None:
        if config is None:
            config = CacheConfig()
        if not isinstance(config, CacheConfig):
            raise ConfigError("config", f"must be a CacheConfig, got {type(config).__name__}")
        super().__init__(namespace_prefix(config.namespace))
        heap_bytes = config.heap.max_bytes if config.heap is not None else None
        if heap_bytes is not None:
            # The key memo is charged to the heap budget (below): about 1% of it, shared by
            # the manager and its namespaces (see namespace()).
            self._memo_max = max(_MEMO_MIN, min(self._memo_max, heap_bytes // _MEMO_SHARE))
        self._cold = _Cold()
        self._cold.memo_total = self._memo_max
        self.config = config
        self._lock = threading.RLock()
        self._codec = Codec(config.signing_key, config.allow_pickle)
        self._heap = HeapLevel(config.heap) if config.heap is not None else None
        levels = []
        try:
            for i, lc in enumerate(config.levels):
                level = lc.build()
                if i == len(config.levels) - 1:
                    level.may_evict = bool(lc.lossy)
                else:
                    level.may_evict = True
                levels.append(level)
        except BaseException:
            for level in levels:
                level.close()
            raise
        self._levels = levels
        names: list[str] = []
        for level in levels:
            name = level.name
            while name in names or name == "heap":
                name = f"{level.name}{len(names)}"
            names.append(name)
        self._cold.level_names = names
        self._cold.stats = Stats(["heap", *names])
        self._wb = WriteBack(levels, names, self._lock, self._cold.stats,
                             batch_size=config.write_batch_size,
                             buffer_max=config.eviction_buffer_max,
                             retry_attempts=config.retry_attempts,
                             retry_backoff=config.retry_backoff,
                             writer_threads=config.writer_threads)
        # what mutation tracking remembers of clean entries' encodings (a few large ones kept
        # as bytes for a while, so a get-change-put cycle never hashes them)
        raw_keep = 2 << 20 if heap_bytes is None else min(32 << 20, heap_bytes // 64)
        self._prefetch_reserve = 0   # the prefetcher's staged reads, once it exists
        if self._heap is not None and heap_bytes is not None:
            # Dirty victims on their way down left the heap's accounting but not memory; the
            # bound covers the entries queued and the batch being written.
            self._wb.buffer_bytes_max = max(64 * 1024, min(64 << 20, heap_bytes // 32))
            if self._heap.policy.name != "dedup":
                # (the record cache's max_bytes_buffering counts record bytes, as in KIP-63)
                self._heap.entry_overhead = _ENTRY_OVERHEAD
                # Everything else the manager keeps beside the entries, bounded in bytes and
                # taken off the policy's capacity, so entries and all of it fit the budget.
                self._heap.reserve(self._reserved_bytes(raw_keep))
        self._data: dict[bytes, Any] = self._heap.data if self._heap is not None else {}
        self._access = self._heap.policy.access if self._heap is not None else None
        # a policy ordering by event time (TAC) keeps a clock the lookahead operator advances
        self._advance = (getattr(self._heap.policy, "advance", None)
                         if self._heap is not None else None)
        self._event_seq = itertools.count()   # event times of records without ts= (operator)
        self._pf_landed: dict[bytes, float] | None = None  # the prefetcher's unused prefetches
        self._track = bool(config.heap is not None and config.heap.track_mutations)
        self._cold.hits = 0
        self._reads: list[bytes] = []
        self._reads_ts: list[tuple[bytes, float]] = []
        self._digests = Digests(raw_keep)
        self._handed: set[bytes] = set()
        # victims still held by the caller (see mlcache._loans); what waits to be forgotten is
        # bounded by 1/64 of the heap's budget in encoded bytes (objects take a few times more)
        self._cold.loans = Loans(max(4 << 10, self._heap.capacity // 64)
                                 if self._heap is not None and self._heap.by_bytes else 1 << 20)
        self._cold.pin_errors = {}
        self._cold.good_types = set()
        self._cold.loading = {}
        self._cold.namespaces = weakref.WeakValueDictionary()
        self._cold.structures = {}
        self._cold.weak_structures = weakref.WeakValueDictionary()
        # (namespace prefix, weigh(value) -> int | None): structures whose values carry their
        # own size (quadtree nodes) spare the heap a walk over each value loaded from below
        self._cold.weighers = []
        self._prefetcher: Any = None
        self._prefetcher_pid = 0
        self._prefetch_absent = False
        self._closed = False
        _LIVE.add(self)
        self._cold.last_checkpoint_id = None
        self._cold.closing = None
        self._cold.release = weakref.finalize(self, _release_dropped, self._wb, levels,
                                              os.getpid(), config.namespace)
        self._cold.release.atexit = False   # at exit the process releases everything itself
        self._records: Any = None   # the record cache (mlcache.recordcache) when the policy is dedup
        if self._heap is not None and self._heap.policy.name == "dedup":
            from .recordcache import RecordCache

            self._records = RecordCache(self, config.dedup)

    # -- context manager / lifecycle ---------------------------------------------------------

    def __enter__(self) -> "CacheManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __repr__(self) -> str:
        return f"CacheManager(levels={['heap'] if self._heap else []}+{self._cold.level_names})"

    @property
    def last_checkpoint_id(self) -> Any:
        """The id given to the last :meth:`checkpoint` (None before any)."""
        return self._cold.last_checkpoint_id

    @last_checkpoint_id.setter
    def last_checkpoint_id(self, value: Any) -> None:
        self._cold.last_checkpoint_id = value

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise CacheError("this CacheManager is closed")

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None, *, ts: float | None = None) -> Any:
        """The value of ``key``, or ``default`` on a miss (a miss never raises)."""
        if type(key) is str or type(key) in _SIMPLE_KEYS:
            kb = self._memo.get(key)
            if kb is None:
                kb = self._kb(key)
        else:
            kb = self._kb(key)
        # The hit path takes no lock: one dict read (atomic) and an append to the read buffer
        # (thread-safe); the policy learns of hits in batches under the lock.
        value = self._data.get(kb, _MISSING)
        if value is not _MISSING:
            if ts is None:
                reads = self._reads
                reads.append(kb)
                if len(reads) >= 64:   # _READ_BATCH, inlined: this is the hot path
                    with self._lock:
                        self._apply_reads()
            else:
                if type(ts) is not float or ts != ts:
                    ts = event_time(ts)
                timed = self._reads_ts
                timed.append((kb, ts))
                if len(timed) >= 64:
                    with self._lock:
                        self._apply_reads()
            return value
        if ts is not None:
            ts = event_time(ts)
        if self._prefetcher is not None:
            self._prefetcher.note_get(kb, ts)  # a use while its prefetch is queued: late
        return self._load_into_heap((kb,), ts).get(kb, default)

    def _get_kb(self, kb: bytes, default: Any, ts: float | None) -> Any:
        value = self._data.get(kb, _MISSING)
        if value is not _MISSING:
            if ts is None:
                reads = self._reads
                reads.append(kb)
                if len(reads) >= 64:   # _READ_BATCH, inlined: this is the hot path
                    with self._lock:
                        self._apply_reads()
            else:
                if type(ts) is not float or ts != ts:
                    ts = event_time(ts)
                timed = self._reads_ts
                timed.append((kb, ts))
                if len(timed) >= 64:
                    with self._lock:
                        self._apply_reads()
            return value
        if ts is not None:
            ts = event_time(ts)
        if self._prefetcher is not None:
            self._prefetcher.note_get(kb, ts)  # a use while its prefetch is queued: late
        return self._load_into_heap((kb,), ts).get(kb, default)

    def _weigh_with(self, namespace_start: str, weigh: Callable[[Any], int | None]) -> None:
        """Values loaded from below under namespaces starting with ``namespace_start`` are
        weighed by ``weigh(value)`` (the memory as the structure keeps it, or None to let the
        heap weigh it) instead of a walk; once per start, for a structure kind."""
        prefix = f"{self.config.namespace}/{namespace_start}".encode()
        with self._lock:
            if all(p != prefix for p, _ in self._cold.weighers):
                self._cold.weighers.append((prefix, weigh))

    def _get_kbs(self, kbs: list[bytes]) -> list[Any]:
        """The values of ``kbs``, ``MISSING`` for a miss; for structures reading a batch of
        their entries (the quadtree reads one tree level per call). When all are resident it
        is the hit path of ``get`` for each (no lock: a dict read, then the read buffer),
        else one batched ``_load_into_heap``."""
        values = list(map(self._data.get, kbs, itertools.repeat(_MISSING, len(kbs))))
        if _MISSING not in values:
            reads = self._reads
            reads.extend(kbs)
            if len(reads) >= 64:   # _READ_BATCH
                with self._lock:
                    self._apply_reads()
            return values
        found = self._load_into_heap(kbs)
        return [found.get(kb, _MISSING) for kb in kbs]

    def _apply_reads(self) -> None:
        """Lock held: replay buffered heap hits to the policy (and the mutation tracker).

        Caffeine's read buffer: a hit costs an append instead of a lock round trip and a
        policy update; replaying up to ``_READ_BATCH`` hits late changes recency by that much.
        Hits with an event time (``ts``) are buffered apart and replayed with it.
        """
        reads = self._reads
        reads_ts = self._reads_ts
        if not reads and not reads_ts:
            return
        # Taken in place, never swapped for new lists: a hit thread holds the list it read
        # from self._reads and appends after this (no lock on the hit path). An append to a
        # swapped-out list after its replay was lost, and with it the key's mark as handed
        # out, so a flush() missed a change made in place to that value. A slice and a del
        # are each atomic under the GIL: an append between them lands past n and stays.
        n = len(reads)
        items = reads[:n]
        del reads[:n]
        n = len(reads_ts)
        timed = reads_ts[:n]
        del reads_ts[:n]
        access = self._access
        for kb in items:
            access(kb)  # type: ignore[misc]
        for kb, ts in timed:
            access(kb, ts)  # type: ignore[misc]
        if self._pf_landed:
            self._note_landed(items, timed)
        if self._track:
            self._handed.update(items)
            self._handed.update(kb for kb, _ in timed)
        self._cold.hits += len(items) + len(timed)

    def contains(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def get_many(self, keys: Iterable[Any], *, ts: float | None = None) -> dict:
        if ts is not None:
            ts = event_time(ts)
        keys = list(keys)
        kbs = self._kbs(keys)
        return found_by_key(keys, kbs, self._load_into_heap(kbs, ts))

    def _resident(self, key_bytes: bytes) -> bool:
        return key_bytes in self._data

    def invalidate_local(self, namespace: str | None = None) -> int:
        """Forget this process's clean copies of a namespace's keys (``None``: the manager's own
        keys): the heap's, and those of an arena level that has a level below it (an arena is in
        this process's memory too). Dirty entries stay (they are newer than anything below), and
        so does an arena's copy not yet copied down. Used for coherence when another process may
        have changed a shared level; returns the number of copies forgotten."""
        self._check_open()
        prefix = self._prefix if namespace is None else self.namespace(namespace)._prefix
        # A structure's contents under the prefix go with its metadata (kept apart, in the
        # structures' own namespace), and the live object reads it again below: with its old
        # copy it would not see another process's changes, and its next write would have
        # saved that copy over them.
        from mlcache.structures.base import live_under

        structs = live_under(self, prefix)
        metas = {o._metans._kb((o.kind, o._name)) for o in structs}
        # what we wrote to a shared level under the prefix may since have been deleted there
        # by the process that owned it: not a loss if it is gone (see _read_levels)
        self._wb.mark_unsure(prefix, metas)
        # the arenas first: the heap's drop below also forgets reads in flight, which may have
        # read an arena copy
        forgotten = self._forget_arena_copies(prefix)
        for kb in metas:
            forgotten += self._forget_arena_copies(kb)
        heap = self._heap
        if heap is None:
            self._reload_structures(structs)
            return forgotten
        with self._lock:
            self._apply_reads()
            drop = [kb for kb in heap.data
                    if (kb.startswith(prefix) or kb in metas)
                    and kb not in heap.dirty and kb not in heap.pinned]
            victims = []
            for kb in drop:
                value, _ = heap.remove(kb)  # type: ignore[misc]
                victims.append((kb, value, False))
            # like an eviction: a value changed in place is written, not forgotten
            self._handle_victims(victims)
            # and so is a copy lent to a caller (then forgotten: the next read reads below)
            self._check_loans(prefix, forget=True)
            for kb in metas:
                self._check_loans(kb, forget=True)
            self._cold.stats.levels["heap"].evictions["invalidated"] += len(drop)
            # reads in flight or staged by the prefetcher may predate the other process's
            # changes: in flight ones are read again or dropped, staged ones are dropped
            self._wb.forget_reads()
        if self._prefetcher is not None:
            self._prefetcher.drop_staged(prefix)
            for kb in metas:
                self._prefetcher.drop_staged(kb)
        self._wb.ensure_writers()
        self._reload_structures(structs)
        return forgotten + len(drop)

    def _release_loans(self) -> None:
        """Forget the lent values nobody holds any more (writing the ones changed while held):
        for a caller that just let go of many at once (a quadtree's pages read in a batch
        larger than the heap, or held by an operation). It looks when something was lent
        since the last look, or when few are lent (a look over them costs little): a look
        the loans' growth triggered in the middle of the batch found its pages still held."""
        loans = self._cold.loans
        if loans and (loans.lent_since or len(loans) <= 256):
            with self._lock:
                self._check_loans(held_too=False)

    @staticmethod
    def _reload_structures(structs: list) -> None:
        for obj in structs:   # each under its own lock, none of the manager's held
            with obj._lock:
                obj._reload_meta()

    def _forget_arena_copies(self, prefix: bytes) -> int:
        wb = self._wb
        last = len(wb.levels) - 1
        forgotten = 0
        for i, lc in enumerate(self.config.levels):
            if i == last or not isinstance(lc, ArenaConfig):
                continue   # the last level holds the only copy of what it holds
            level = wb.levels[i]
            with wb.io_lock:   # what copy_down holds: newer[i] and the level's keys
                stale = [kb for kb in level.scan(prefix) if kb not in wb.newer[i]]
                if stale:
                    level.delete_many(stale)
                    forgotten += len(stale)
        return forgotten

    # -- writes ------------------------------------------------------------------------------

    def put(self, key: Any, value: Any, *, ts: float | None = None) -> None:
        """Insert or replace in the heap, dirty; written back later (or at once without a heap)."""
        self._put_items([(key, self._kb(key), value)], ts)

    def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        self._put_items(batch_items(items, self._kb), None, lend_own=True)

    def delete(self, key: Any) -> None:
        """Remove ``key`` everywhere (a tombstone hides lower copies until flushed)."""
        self._delete_kbs([self._kb(key)])

    def delete_many(self, keys: Iterable[Any]) -> None:
        self._delete_kbs([self._kb(key) for key in keys])

    # -- keys --------------------------------------------------------------------------------

    def keys(self) -> Iterator[Any]:
        return iter(self._keys_with_prefix(self._prefix))

    def _keys_with_prefix(self, prefix: bytes) -> list[Any]:
        try:
            return self._list_keys(prefix)
        except Exception as exc:
            if self._closed and type(exc) is not CacheError:
                raise _closed_error(exc) from exc   # close() released a level being listed
            raise

    def _list_keys(self, prefix: bytes) -> list[Any]:
        wb = self._wb
        with wb.io_lock:   # no entry is between two levels while we list
            with self._lock:
                self._check_open()
                seen = {kb for kb in self._data if kb.startswith(prefix)}
                for p in wb.buffer.pending:
                    seen.update(kb for kb in p if kb.startswith(prefix))
                dead = set(wb.tombstones)
            upper = set(seen)    # resident or queued: listed whatever the levels hold
            for i, level in enumerate(self._levels):
                newer = wb.newer[i]
                if not (newer and wb.guards_newer(i)):
                    seen.update(level.scan(prefix))
                    continue
                # keys written to this level and not yet below must be listed by it: one it
                # lost would be left out of the list, silently (see _read_levels)
                listed = set(level.scan(prefix))
                seen |= listed
                unsure = wb.unsure[i]
                lost = sorted((i, kb) for kb in newer if kb.startswith(prefix)
                              and kb not in listed and kb not in upper and kb not in dead
                              and kb not in unsure)
                if lost:
                    raise self._lost_error(lost, "read")
        n = len(prefix)
        return [decode_key(kb[n:]) for kb in sorted(seen - dead)]

    # -- flush / checkpoint / close ----------------------------------------------------------

    def flush(self) -> None:
        """Write every dirty heap entry (and every delete) to the next level, and wait."""
        try:
            if self._records is not None:
                self._records.flush_all()   # forward the dirty set first (it stages its writes)
            self._stage_dirty(full_check=False)
            self._wb.drain_all()
        except Exception as exc:
            if self._closed and type(exc) is not CacheError:
                # another thread's close() overtook it (and wrote what it had)
                raise _closed_error(exc) from exc
            raise
        self._raise_pinned()

    def checkpoint(self, checkpoint_id: Any = None) -> None:
        """Make everything durable on the last level (the store of record)."""
        try:
            if self._records is not None:
                self._records.flush_all()
            self._stage_dirty(full_check=True)
            self._wb.drain_all()
            self._raise_pinned()
            self._wb.copy_down()
        except LostWrites as exc:
            # Everything else is copied and synced: a checkpoint that reports lost entries has
            # done all it could, and the next one (a close() again) does not report them twice.
            self._cold.last_checkpoint_id = checkpoint_id
            self._cold.stats.writeback["checkpoints"] += 1
            raise self._lost_error(exc.lost, "checkpoint") from None
        except Exception as exc:
            if self._closed and type(exc) is not CacheError:
                # another thread's close() overtook it (and checkpointed)
                raise _closed_error(exc) from exc
            raise
        self._cold.last_checkpoint_id = checkpoint_id
        self._cold.stats.writeback["checkpoints"] += 1

    def close(self) -> None:
        """Checkpoint and release every level. If the checkpoint fails, stay open."""
        if self._closed:
            return
        prefetcher = self._prefetcher
        if prefetcher is not None and hasattr(prefetcher, "close"):
            prefetcher.close()
            self._prefetcher = None
            self._pf_landed = None
        # A write another thread makes from here on would land after the checkpoint and be
        # dropped with the heap: refused instead (this thread's own, a flush listener's, count)
        with self._lock:
            mine = self._cold.closing is None   # (a second close() racing leaves the first's)
            if mine:
                self._cold.closing = threading.get_ident()
        try:
            self.checkpoint()
        except BaseException:
            if mine:
                with self._lock:
                    self._cold.closing = None
            raise
        with self._lock:
            self._closed = True
        self._cold.release.detach()
        self._wb.stop()
        for level in self._levels:
            level.close()
        with self._lock:
            if self._heap is not None:
                self._heap.drop_all()   # its data is self._data; the bytes accounted go too
            self._data.clear()
            self._digests.clear()
            self._handed.clear()
            self._cold.loans.clear()
            self._reads.clear()   # in place: see _apply_reads
            self._reads_ts.clear()

    # -- flush listeners: the record cache (heap policy "dedup", mlcache.recordcache) ----------

    def on_flush(self, callback: Callable[[list], Any]) -> Callable[[list], Any]:
        """Call ``callback(batch)`` with each flushed batch of ``(key, new, old)``, of every
        namespace (``batch.namespace``); returns ``callback``, so it works as a decorator."""
        return self._record_cache().add_listener(None, callback)

    def remove_flush_listener(self, callback: Callable[[list], Any]) -> None:
        self._record_cache().remove_listener(None, callback)

    def resize_buffering(self, max_bytes: int) -> None:
        """Change the record cache's byte budget at runtime; shrinking evicts fairly."""
        self._record_cache().resize(max_bytes)

    def _record_cache(self) -> Any:
        if self._records is None:
            raise ConfigError("dedup", "flush listeners need the record cache: "
                                       "CacheConfig(dedup=DedupConfig(...))")
        return self._records

    # -- prefetching (the manager's side is in mlcache._prefetchhooks) ---------------------------

    def hint(self, key: Any, ts: float) -> None:
        """Say ``key`` will be needed at event time ``ts`` (policy told; prefetch if absent)."""
        self._hint_kb(self._kb(key), ts)

    # -- namespaces and structures ------------------------------------------------------------

    def namespace(self, name: str, *, memo: bool = True) -> "Namespace":
        """A view with its own key space. ``memo=False`` (for a structure that makes its own
        byte keys, like the quadtree's node ids) gives it no key memo, so it takes no share
        of the memo's bound and no charge on the heap budget; the first call decides."""
        if not isinstance(name, str) or not name or "\x1f" in name:
            raise ConfigError("namespace", f"must be a non-empty string, got {name!r}")
        with self._lock:
            ns = self._cold.namespaces.get(name)
            if ns is None:
                ns = self._cold.namespaces[name] = Namespace(self, name)
                if not memo:
                    ns._memo_max = 0   # _kb then keeps at most the key it just encoded
                self._share_memo()
            return ns

    def structure(self, kind: str, name: str, **kw: Any) -> Any:
        """The cacheable structure ``name`` of ``kind`` (created on first use, then reused)."""
        if kind not in _STRUCTURES:
            importlib.import_module("mlcache.structures")
        factory = _STRUCTURES.get(kind)
        if factory is None:
            raise ConfigError("structure", f"unknown structure kind {kind!r}; "
                                           f"registered: {sorted(_STRUCTURES)}")
        key = (kind, name)
        with self._lock:
            obj = self._cold.weak_structures.get(key)
            if obj is None:
                obj = self._cold.structures.get(key)
        if obj is not None:
            # open already: options given again must still match what it was made with
            # (a quadtree's bounds, page_levels), exactly as a reopen after close() checks them
            check = getattr(obj, "_check_meta", None)
            if kw and check is not None:
                check(obj._meta, **kw)
            return obj
        # The factory reads the structure's metadata, which may go to the lower levels and
        # wait for io_lock; holding self._lock meanwhile deadlocks with a writer thread that
        # holds io_lock and wants self._lock. Build outside, keep the first one built.
        obj = factory(self, name, **kw)
        weak = getattr(type(obj), "_held_weakly", False)
        with self._lock:
            table = self._cold.weak_structures if weak else self._cold.structures
            return table.setdefault(key, obj)

    def dict(self, name: str, **kw: Any) -> Any:
        return self.structure("dict", name, **kw)

    def list(self, name: str, **kw: Any) -> Any:
        return self.structure("list", name, **kw)

    def set(self, name: str, **kw: Any) -> Any:
        return self.structure("set", name, **kw)

    def quadtree(self, name: str, bounds: Any = None, **kw: Any) -> Any:
        """The quadtree ``name``: ``bounds=(x0, y0, x1, y1)`` to make it, none to reopen it."""
        if bounds is not None:
            kw["bounds"] = bounds
        return self.structure("quadtree", name, **kw)

    # -- stats ---------------------------------------------------------------------------------

    def stats(self) -> builtins.dict[str, Any]:   # (``dict`` here is the method above)
        with self._lock:
            self._apply_reads()
            heap_extra: dict[str, Any] = {"hits": self._cold.hits}
            if self._heap is not None:
                heap_extra.update(entries=len(self._heap), dirty=len(self._heap.dirty),
                                  pinned=len(self._heap.pinned),
                                  lent=len(self._cold.loans),   # see mlcache._loans
                                  policy=self._heap.policy.name)
                if self._heap.by_bytes:
                    heap_extra["bytes"] = self._heap.tracked_weight
                    weights = self._heap.weights
                    heap_extra["dirty_bytes"] = sum(weights.get(k, 0) for k in self._heap.dirty)
            h = self._cold.stats.levels["heap"]
            total = self._cold.hits + h.misses
            heap_extra["hit_ratio"] = self._cold.hits / total if total else None
            wb = {"pending": len(self._wb.buffer),
                  "pending_bytes": sum(len(v) for p in self._wb.buffer.pending for v in p.values()),
                  "tombstones": len(self._wb.tombstones),
                  "last_error": repr(self._wb.error) if self._wb.error else None}
            prefetch: dict[str, Any] = {}
            pf = self._prefetcher
            if pf is not None and callable(getattr(pf, "stats", None)):
                prefetch = dict(pf.stats())
            snap = self._cold.stats.snapshot({"heap": heap_extra}, wb, prefetch)
        for name, level in zip(self._cold.level_names, self._levels):
            # A level whose exact count is costly (an unbounded Redis: a SCAN) offers a cheap
            # estimate; stats() is polled by exporters and must not scan on every call.
            used = getattr(level, "used_bytes_estimate", None) or level.used_bytes
            try:
                snap["levels"][name]["used_bytes"] = used()
            except Exception:
                snap["levels"][name]["used_bytes"] = None
        if self._records is not None:
            snap["dedup"] = self._records.stats()
        return snap
