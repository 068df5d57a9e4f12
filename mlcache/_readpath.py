"""The miss path of :class:`~mlcache.manager.CacheManager`: one batched read through the levels.

Kept apart from the manager because it is the subtle part: keys another thread is fetching are
waited for, keys in the eviction buffer come back without I/O, the byte levels are read without
the I/O lock and read again under it if a write overlapped (see :mod:`mlcache.writeback`), and a
key written or deleted while it was being read keeps that newer state.
"""
from __future__ import annotations

import numbers
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from .codec import Encoded
from .errors import CacheError, IntegrityError, LevelUnavailableError

__all__ = ["ReadPath", "MISSING", "IMMUTABLE", "Digests", "digest", "found_by_key",
           "same_bytes"]

MISSING: Any = object()
IMMUTABLE = frozenset((str, bytes, int, float, bool, type(None), complex))
_KEEP_RAW_MIN = 16 * 1024   # encodings at least this long are kept a while instead of hashed
_KEEP_RAW_MAX = 64 << 20    # ... and up to this long even beyond the budget, if newest


def digest(data: bytes) -> int:
    # In-process only, so the salted built-in hash is fine and far cheaper than a crypto hash.
    # One int, not a (len, hash) tuple: it is kept for every clean heap entry (64-96 bytes less
    # each, tests/test_reliability_memory.py); a 64-bit SipHash collision is as unlikely.
    return hash(data)


def same_bytes(stored: Any, raw: bytes) -> bool:
    """Whether ``raw`` (a fresh encoding) equals what ``stored`` remembers: the encoding itself
    (compared byte for byte) or its :func:`digest`."""
    if type(stored) is bytes or type(stored) is Encoded:
        return stored == raw
    return bool(digest(raw) == stored)


class Digests:
    """What mutation tracking remembers of each clean heap entry's encoding.

    A digest costs a pass over the bytes (about 1 ms per MB here, as much as a CRC32 of the
    value), and it is wasted when the entry is written again before anyone compares: the usual
    get, change, put cycle. So a large encoding is first kept as it is (the bytes were just read
    or written; keeping them is free) and hashed only when it is pushed out of a small byte
    budget, oldest first; a put or delete of the key drops it without hashing. The newest one is
    kept even when it alone exceeds the budget, up to ``_KEEP_RAW_MAX`` (a 1 MB value under a
    small heap: hashing it at once cost 0.1-0.2 ms per miss, and the put that follows would
    have dropped it). Comparing a kept encoding is a byte comparison, exact. Small encodings
    are hashed at once (it is cheap).
    Lock held for every call (the manager's lock).
    """

    __slots__ = ("_d", "_raw", "_raw_bytes", "budget")

    def __init__(self, budget: int) -> None:
        self._d: dict[bytes, Any] = {}          # kb -> digest (an int) or the kept bytes
        self._raw: dict[bytes, bytes] = {}      # kept encodings, oldest first
        self._raw_bytes = 0
        self.budget = budget

    def remember(self, kb: bytes, raw: bytes) -> None:
        """``raw`` is the encoding of ``kb``'s value as it is now (clean)."""
        kept = self._raw
        if kept and kb in kept:
            self._raw_bytes -= len(kept.pop(kb))
        n = len(raw)
        # (an Encoded -- a write-back in pieces read back from the eviction buffer -- is kept
        # as it is: hashing it would join and hash a large value)
        if n < _KEEP_RAW_MIN or n > max(self.budget, _KEEP_RAW_MAX) or \
                (type(raw) is not bytes and type(raw) is not Encoded):
            self._d[kb] = hash(raw)   # digest(raw), inlined: once per key loaded
            return
        self._d[kb] = raw
        kept[kb] = raw
        self._raw_bytes += n
        while self._raw_bytes > self.budget and len(kept) > 1:
            old = next(iter(kept))
            data = kept.pop(old)
            self._raw_bytes -= len(data)
            self._d[old] = digest(data)

    def __setitem__(self, kb: bytes, value: int) -> None:
        if kb in self._raw:
            self._raw_bytes -= len(self._raw.pop(kb))
        self._d[kb] = value

    def pop(self, kb: bytes, default: Any = None) -> Any:
        if kb in self._raw:
            self._raw_bytes -= len(self._raw.pop(kb))
        return self._d.pop(kb, default)

    def get(self, kb: bytes, default: Any = None) -> Any:
        return self._d.get(kb, default)

    def __contains__(self, kb: object) -> bool:
        return kb in self._d

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
        self._raw.clear()
        self._raw_bytes = 0


def _clear(keys: list[bytes], tombstones: set[bytes], queued: dict[bytes, bytes] | None,
           loading: dict[bytes, Any] | None = None) -> bool:
    """No key of ``keys`` is tombstoned, queued in the eviction buffer or (with ``loading``)
    being read by another thread: set operations over the batch, not a loop per key."""
    return ((not tombstones or tombstones.isdisjoint(keys))
            and (not queued or queued.keys().isdisjoint(keys))
            and (not loading or loading.keys().isdisjoint(keys)))


def _unmark(keys: list[bytes], load: "_Load", loading: dict[bytes, Any]) -> None:
    """Lock held: drop the in-flight markers ``load`` set for ``keys`` (a marker another
    reader put in its place stays)."""
    if len(loading) == len(keys) and list(loading.values()).count(load) == len(keys):
        loading.clear()    # only ours: the usual case, without a loop per key
        return
    pop = loading.pop
    for kb in keys:
        other = pop(kb, load)
        if other is not load:   # another reader's marker: keep it
            loading[kb] = other


def found_by_key(keys: list[Any], kbs: list[bytes], found: dict[bytes, Any]) -> dict:
    """What ``get_many(keys)`` returns: ``found`` (by byte key) by the caller's keys."""
    if len(found) == len(kbs):   # every key found, none twice: C-level
        return dict(zip(keys, map(found.__getitem__, kbs)))
    return {key: found[kb] for key, kb in zip(keys, kbs) if kb in found}


class _Load:
    """A fetch in flight for some keys; others wanting them wait on ``done``.

    The event is made on first use (an Event is a Condition and a lock: ~5-15 us here, per
    batch, and most batches have nobody waiting). A reader that finds the marker takes
    ``done`` while it holds the manager's lock; the loader removes its markers under that
    lock before it calls :meth:`finish`, so it sees every event a waiter took (and when none
    was, nobody can wait any more)."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done: threading.Event | None = None

    @property
    def done(self) -> threading.Event:
        event = self._done
        if event is None:
            event = self._done = threading.Event()
        return event

    def finish(self) -> None:
        """The fetch is over (its markers removed): wake the waiters, if any."""
        event = self._done
        if event is not None:
            event.set()


def event_time(ts: Any) -> float:
    """``ts`` as an event time (a float), or a clear error naming it.

    Checked where the caller passes it, before any state changes: a ``ts`` that is not a real
    number would otherwise fail later inside the policy (on a put, after the value is already in
    the heap but not in the policy, which then never evicts it), and a NaN orders nowhere, so
    TAC would never evict its entry. Infinite times are allowed (``inf``: needed last).
    """
    if isinstance(ts, bool) or not isinstance(ts, numbers.Real):
        raise TypeError(f"ts must be a real number (an event time), got {type(ts).__name__} "
                        f"{ts!r}")
    try:
        t = float(ts)
    except OverflowError:  # an int (or Fraction) past the largest float
        raise ValueError(f"ts must fit a float (an event time), got a number of "
                         f"{ts.bit_length() if isinstance(ts, int) else '?'} bits") from None
    if t != t:
        raise ValueError("ts must not be NaN")
    return t


def _closed_error(exc: BaseException) -> CacheError:
    """What a read or a checkpoint that close() overtook raises: close() released the levels
    under it, which then failed as a closed client fails (a Redis level closed under a read
    raised redis-py's AttributeError or ValueError, a disk level a retryable
    LevelUnavailableError: retrying it could only find the manager closed)."""
    return CacheError(f"this CacheManager is closed (close() ran during this call, which "
                      f"then failed: {type(exc).__name__}: {exc})")


class ReadPath:
    """Mixin for CacheManager: the batched miss path. Uses the manager's state (lock, heap,
    write-back, codec, stats)."""

    _lock: Any
    _data: dict[bytes, Any]
    _heap: Any
    _levels: list[Any]
    _wb: Any
    _codec: Any
    _digests: Digests
    _handed: set[bytes]
    _lend: Callable[..., None]
    _access: Any
    _track: bool
    _cold: Any   # the manager's _Cold: level_names, loading, hits, weighers, stats
    _reads: list[bytes]
    _reads_ts: list[tuple[bytes, float]]
    _records: Any
    _check_open: Callable[[], None]
    _closed: bool
    _apply_reads: Callable[[], None]
    _describe_key: Callable[[bytes], Any]
    _handle_victims: Callable[..., Any]

    def _load_into_heap(self, keys_bytes: Iterable[bytes], ts: float | None = None, *,
                        prefetch: bool = False) -> dict[bytes, Any]:
        """Read ``keys_bytes`` through every level into the heap; the batched miss path.

        Resident keys are answered from the heap, tombstoned ones are misses, keys in the
        eviction buffer come back without I/O, keys another thread is fetching are waited for
        (a prefetch skips them), and the rest are read with one ``get_many`` per level. A key
        written or deleted meanwhile keeps the newer state. Returns the keys found.
        """
        out: dict[bytes, Any] = {}
        todo = list(dict.fromkeys(keys_bytes))
        heap_st = self._cold.stats.levels["heap"]
        rounds = 0
        while todo:
            rounds += 1
            mine: list[bytes] = []
            waits: list[threading.Event] = []
            retry: list[bytes] = []
            misses = 0
            with self._lock:
                self._check_open()
                if self._reads or self._reads_ts:
                    self._apply_reads()
                data, wb, loading = self._data, self._wb, self._cold.loading
                tombstones = wb.tombstones
                queued = wb.buffer.pending[0] if wb.levels else None
                loans = self._cold.loans
                if (data.keys().isdisjoint(todo) and _clear(todo, tombstones, queued, loading)
                        and (not loans or loans.keys().isdisjoint(todo))):
                    # The usual batched miss: no key resident, deleted, queued or being read
                    # by another thread; checked with C-level set operations over the batch.
                    mine = todo
                    misses = len(todo)
                    todo = []
                # Else per key, only dict and set lookups: this loop runs for every key.
                for kb in todo:
                    value = data.get(kb, MISSING)
                    if value is not MISSING:
                        out[kb] = value
                        if not prefetch:
                            self._cold.hits += 1
                            if self._access is not None:
                                self._access(kb, ts)
                            if self._track:
                                self._handed.add(kb)
                        continue
                    if kb in tombstones:
                        misses += 1
                        continue
                    if loans:
                        loan = loans.pop(kb, None)
                        if loan is not None:   # held by a caller since it left the heap
                            out[kb] = self._readmit(kb, loan, ts)
                            if not prefetch:
                                self._cold.hits += 1
                            continue
                    if loading:
                        other = loading.get(kb)
                        if other is not None:
                            if prefetch:
                                continue
                            if rounds < 3:
                                waits.append(other.done)   # under the lock: see _Load
                                retry.append(kb)
                                continue
                            # Still loading after two waits: read it ourselves, don't spin.
                    if queued:
                        raw = queued.get(kb)
                        if raw is not None:
                            value = self._codec.decode(raw)
                            self._cold.stats.writeback["buffer_hits"] += 1
                            out[kb] = self._admit(kb, value, raw, ts)
                            continue
                    misses += 1
                    mine.append(kb)
                if not prefetch:
                    heap_st.misses += misses
                if mine:
                    load = _Load()
                    loading.update(dict.fromkeys(mine, load))
                    seq = wb.wseq
            if mine:
                cleared = False
                try:
                    cleared = self._read_lower(mine, out, ts, prefetch, seq, load, loading)
                except LevelUnavailableError as exc:
                    if self._closed:
                        raise _closed_error(exc) from exc
                    # A write of some of these keys may have been in flight to the level that
                    # failed (taken from the buffer, not yet back in it): once it is over,
                    # they are in the buffer again, and the next round reads them there.
                    # Only then: a write of other keys failing over and over against the same
                    # dead level (its writer retrying) made every read of an evicted key wait
                    # three rounds of the level's timeouts before raising.
                    with self._lock:
                        overlapped = wb.wseq != seq or seq % 2 == 1
                        moved = wb.moved_since(seq) if overlapped else None
                    if (not overlapped or rounds >= 3
                            or (moved is not None and moved.isdisjoint(mine))):
                        raise
                    with wb.io_lock:
                        pass
                    retry.extend(mine)
                except Exception as exc:
                    if self._closed and type(exc) is not CacheError:
                        raise _closed_error(exc) from exc
                    raise
                finally:
                    if not cleared:
                        with self._lock:
                            _unmark(mine, load, loading)
                    load.finish()
            for event in waits:
                event.wait()
            todo = retry
        # A read may push dirty victims into the buffer but never waits for room there (and
        # never fails because a write failed): back-pressure is for puts.
        self._wb.ensure_writers()
        if self._records is not None and not prefetch and self._records.has_cuts():
            self._records.forward()
        return out

    def _read_lower(self, keys: list[bytes], out: dict[bytes, Any], ts: float | None,
                    prefetch: bool, seq: int | None = None, load: _Load | None = None,
                    loading: dict[bytes, _Load] | None = None) -> bool:
        """Read ``keys`` from the byte levels, then resolve and insert under the lock.

        ``seq`` is ``wseq`` as it was (lock held) before the read, when the caller took it.
        ``load``: the caller's in-flight marker of ``keys`` in ``loading``; when no write
        overlapped the read, the markers are cleared under the same lock as the insert and
        True is returned (else the caller clears them)."""
        wb = self._wb
        if seq is None:
            with self._lock:
                seq = wb.wseq
        lost: list[tuple[int, bytes]] = []
        found, timings = self._read_levels(keys, lost=lost)
        values = self._decode_all(found)
        with self._lock:
            if wb.wseq == seq and seq % 2 == 0:
                if lost and not prefetch:
                    self._raise_lost(lost)
                self._resolve(keys, found, values, timings, out, ts, prefetch, True)
                if load is not None and loading is not None:
                    _unmark(keys, load, loading)
                    return True
                return False
            # A write overlapped the read. Only the keys it moved can have been between two
            # levels (or half deleted) while we read them; the others read exactly.
            moved = wb.moved_since(seq)
            if moved is not None:
                keep = [kb for kb in keys if kb not in moved]
                if keep:
                    if lost and not prefetch:
                        self._raise_lost([(i, kb) for i, kb in lost if kb not in moved])
                    self._resolve(keep, found, values, timings, out, ts, prefetch)
                    if len(keep) == len(keys):
                        return False
                    keys = [kb for kb in keys if kb in moved]
        # Keys a write moved (or any key, when the write could not say which it moves): read
        # them again while no write can run.
        with wb.io_lock:
            origin: dict[bytes, str] = {}
            lost = []
            found, timings = self._read_levels(keys, origin, lost)
            values = self._decode_all(found, origin)
            with self._lock:
                if lost and not prefetch:
                    self._raise_lost(lost)
                self._resolve(keys, found, values, timings, out, ts, prefetch, True)
        return False

    def _raise_lost(self, lost: list[tuple[int, bytes]]) -> None:
        """Lock held, no write overlapping the read of ``lost``: raise for the keys a level
        lost (see ``_read_levels``) that were not written or deleted meanwhile (their new
        state answers)."""
        data, wb = self._data, self._wb
        queued = wb.buffer.pending[0] if wb.levels else {}
        lost = [(i, kb) for i, kb in lost
                if kb not in data and kb not in wb.tombstones and kb not in queued
                and wb.lost_from(i, (kb,))]
        if lost:
            raise self._lost_error(lost, "read")

    def _lost_error(self, lost: list[tuple[int, bytes]], op: str) -> IntegrityError:
        """The error for entries written to a level above the last and gone from it since:
        ``lost`` holds ``(level index, byte key)``."""
        names = self._cold.level_names
        i, kb = lost[0]
        key = self._describe_key(kb)
        shown = ", ".join(repr(self._describe_key(k)) for _, k in lost[:5])
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        why = ("lost by the server (restarted without its data, evicted under its own "
               "maxmemory, or flushed)")
        if op == "read":
            return IntegrityError(
                f"{names[i]} level, key {key!r}: written there and not checkpointed below, and "
                f"now gone, {why}; put or delete the key to go on (the next checkpoint() "
                f"reports every such key, after which reads return the older copy below, if "
                f"any)", level=names[i], key=key)
        return IntegrityError(
            f"checkpoint: {len(lost)} entries written to the {names[i]} level and not yet "
            f"copied below are gone from it, {why}: {shown}{more}; everything else is "
            f"checkpointed, and the levels below keep these keys' previous versions, if any",
            level=names[i], key=key)

    def _read_levels(self, keys: list[bytes], origin: dict[bytes, str] | None = None,
                     lost: list[tuple[int, bytes]] | None = None,
                     first: tuple[list[bytes | None], float] | None = None
                     ) -> tuple[dict[bytes, bytes], list[tuple]]:
        """First level holding each key answers; a level's buffer is consulted just above it.
        ``origin`` (when given) receives the name of the level each found key came from.
        ``first``: the top level's answer for ``keys`` and its time, read already (a
        prefetch's split read, see :meth:`Prefetcher.poll_read`); the levels below are read.
        A key an unbounded level above the last misses although it holds the key newer than
        the level below (``WriteBack.newer``) is not read below (that copy is older): it
        is left out of the result and added to ``lost`` (when given) as ``(level, key)``,
        to raise once the caller knows no write overlapped the read."""
        found: dict[bytes, bytes] = {}
        timings = []
        remaining = keys
        pending = self._wb.buffer.pending
        levels = self._levels
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if not remaining:
                break
            if i > 0 and pending[i]:
                with self._lock:
                    p = pending[i]
                    rest = []
                    for kb in remaining:
                        raw = p.get(kb)
                        if raw is None:
                            rest.append(kb)
                        else:
                            found[kb] = raw
                            if origin is not None:
                                origin[kb] = f"write-back buffer of {self._cold.level_names[i]}"
                remaining = rest
                if not remaining:
                    break
            t0 = time.perf_counter()
            try:
                values: Any
                if i == 0 and first is not None:
                    values, elapsed = first
                else:
                    values = level.get_many(remaining)
                    elapsed = time.perf_counter() - t0
            except IntegrityError as exc:
                if isinstance(exc.key, bytes):  # a level names the stored key: give the user's
                    exc.key = self._describe_key(exc.key)
                raise
            before = len(found)
            # batch-level comprehensions, not a Python loop with a branch per key
            if None in values:
                hits = {kb: raw for kb, raw in zip(remaining, values) if raw is not None}
            else:
                hits = dict(zip(remaining, values))
            if found:
                found.update(hits)
            else:
                found = hits
            if origin is not None:
                origin.update(dict.fromkeys(hits, self._cold.level_names[i]))
            n_hits = len(found) - before
            n_rest = len(remaining) - n_hits
            timings.append((self._cold.level_names[i], elapsed, n_hits, n_rest))
            if i < last and n_rest:
                remaining = [kb for kb, raw in zip(remaining, values) if raw is None]
                newer = self._wb.newer[i]
                if newer and not newer.isdisjoint(remaining) and self._wb.guards_newer(i):
                    gone = self._wb.lost_from(i, remaining)
                    if gone:
                        if lost is not None:
                            lost.extend((i, kb) for kb in gone)
                        gone_set = set(gone)
                        remaining = [kb for kb in remaining if kb not in gone_set]
            else:
                remaining = []
        return found, timings

    def _decode_all(self, found: dict[bytes, bytes],
                    origin: dict[bytes, str] | None = None) -> list[Any]:
        """The values of ``found``'s encodings, in its order."""
        try:
            return self._codec.decode_many(list(found.values()))
        except CacheError:
            pass
        # Some bytes are bad: decode one by one to name the key and where its bytes live (read
        # again, with the level recorded, only now), so the operator can inspect or delete them.
        decode = self._codec.decode
        out = []
        for kb, raw in found.items():
            try:
                out.append(decode(raw))
            except CacheError as exc:
                key = self._describe_key(kb)
                level = origin.get(kb) if origin is not None else self._origin_of(kb)
                where = f"{level} level" if level else "a lower level"
                if type(exc) is IntegrityError:
                    raise IntegrityError(f"{where}, key {key!r}: {exc}", level=level,
                                         key=key) from exc
                exc.key, exc.level = key, level
                raise
        return out

    def _origin_of(self, kb: bytes) -> str | None:
        """The level (or write-back buffer) ``kb`` is read from now; for error messages."""
        origin: dict[bytes, str] = {}
        try:
            self._read_levels([kb], origin)
        except Exception:
            return None
        return origin.get(kb)

    def _count_reads(self, timings: list[tuple], prefetched: int) -> None:
        """Lock held: per level, one batched read's hits, misses and time (``_read_levels``'
        timings); ``prefetched``: keys a prefetch found."""
        levels = self._cold.stats.levels
        for name, elapsed, hits, misses in timings:
            st = levels[name]
            st.loads += 1
            st.hits += hits
            st.misses += misses
            st.keys_loaded += hits
            st.load_time.record(elapsed)
        if prefetched:
            self._cold.stats.prefetch["keys_loaded"] += prefetched

    def _resolve(self, keys: list[bytes], found: dict[bytes, bytes], values: list[Any],
                 timings: list[tuple], out: dict[bytes, Any], ts: float | None,
                 prefetch: bool, whole: bool = False) -> None:
        """Lock held: keep whatever happened to a key during the read, else admit what we read.
        ``values``: the decoded values of ``found``, in its order. ``whole``: ``found`` holds
        only keys of ``keys``."""
        # close() may have run while we read: a closed manager's heap takes nothing more
        self._check_open()
        self._count_reads(timings, len(found) if prefetch else 0)
        data, wb = self._data, self._wb
        tombstones = wb.tombstones
        queued = wb.buffer.pending[0] if wb.levels else None
        loans = self._cold.loans
        if whole and data.keys().isdisjoint(keys) and _clear(keys, tombstones, queued) and (
                not loans or loans.keys().isdisjoint(keys)):
            # Nothing happened to any key while it was read (the usual case), checked over
            # the batch with set operations: everything found goes in, as one batch.
            if found:
                self._admit_batch(list(found), list(found.values()), values, out, ts)
            return
        decoded = dict(zip(found, values))
        admit = self._admit
        batch: list[tuple[bytes, Any, bytes]] = []
        for kb in keys:
            value = data.get(kb, MISSING)
            if value is not MISSING:          # written meanwhile: the newer value wins
                out[kb] = value
                continue
            if tombstones and kb in tombstones:    # deleted meanwhile
                continue
            if loans:
                loan = loans.pop(kb, None)
                if loan is not None:           # evicted meanwhile, and held by a caller
                    out[kb] = self._readmit(kb, loan, ts)
                    continue
            if queued:
                raw = queued.get(kb)
                if raw is not None:            # written and evicted meanwhile
                    out[kb] = admit(kb, self._codec.decode(raw), raw, ts)
                    continue
            raw = found.get(kb)
            if raw is not None:
                batch.append((kb, decoded[kb], raw))
        if batch:
            self._admit_many(batch, out, ts)

    def _admit_many(self, items: list[tuple[bytes, Any, bytes]], out: dict[bytes, Any],
                    ts: float | None) -> None:
        """Lock held: :meth:`_admit` for a batch read from below (each into ``out``), with the
        lookups bound once and the victims of the whole batch handled together."""
        heap = self._heap
        if heap is None:
            for kb, value, _ in items:
                out[kb] = value
            return
        insert = heap.insert
        track = self._track
        digests = self._digests
        remember, remembered, kept = digests.remember, digests._d, digests._raw
        immutable = IMMUTABLE
        victims_all: list[tuple[bytes, Any, bool]] = []
        declined: list[bytes] = []
        weight_of = self._weight_of if self._cold.weighers else None
        for kb, value, raw in items:
            if track and type(value) not in immutable:
                n = len(raw)
                if n < _KEEP_RAW_MIN and not kept:
                    remembered[kb] = hash(raw)   # Digests.remember of a small encoding, inlined
                else:
                    remember(kb, raw)
            else:
                n = len(raw)
            victims = insert(kb, value, dirty=False, size=n, ts=ts,
                             weight=None if weight_of is None else weight_of(kb, value))
            if victims:
                if any(k == kb for k, _, _ in victims):
                    # not admitted: just decoded, so unchanged; nothing to check or write,
                    # but it is being returned: lent, so a change to it is still written
                    self._digests.pop(kb, None)
                    if track and type(value) not in immutable:
                        self._lend(kb, value, raw, n)
                    declined.append(kb)
                    victims = [v for v in victims if v[0] != kb]
                    self._cold.stats.levels["heap"].evictions["not_admitted"] += 1
                victims_all.extend(victims)
            out[kb] = value
        if track:
            # before the victims: an entry of this batch evicted by a later one is forgotten;
            # one not admitted is not marked (a change to it is not tracked: see _admit)
            handed = self._handed
            handed.update([kb for kb, _, _ in items])
            if declined:
                handed.difference_update(declined)
        if victims_all:
            self._handle_victims(victims_all)

    def _admit_batch(self, kbs: list[bytes], raws: list[bytes], values: list[Any],
                     out: dict[bytes, Any], ts: float | None) -> None:
        """Lock held: insert a batch read from below (distinct keys, their encodings and
        values), none of it resident, deleted or queued; each into ``out``.
        :meth:`_admit_many` with the per-key work done over the batch: the mutation digests
        in one ``dict.update`` (all values mutable, all encodings small: the usual case),
        one heap insert, the victims handled together."""
        heap = self._heap
        if heap is None:
            out.update(zip(kbs, values))
            return
        track = self._track
        digests = self._digests
        if track:
            if (not digests._raw and max(map(len, raws)) < _KEEP_RAW_MIN
                    and IMMUTABLE.isdisjoint(map(type, values))):
                digests._d.update(zip(kbs, map(hash, raws)))   # Digests.remember, inlined
            else:
                remember = digests.remember
                immutable = IMMUTABLE
                for kb, value, raw in zip(kbs, values, raws):
                    if type(value) not in immutable:
                        remember(kb, raw)
        weights = (list(map(self._weight_of, kbs, values)) if self._cold.weighers else None)
        victims, refused = heap.insert_many(kbs, values, map(len, raws), ts=ts,
                                            weights=weights, absent=True)
        out.update(zip(kbs, values))
        if track:
            # before the victims: an entry of this batch evicted by a later one is forgotten
            self._handed.update(kbs)
        if refused:
            # not admitted: just decoded, so unchanged; nothing to check or write (and no mark
            # to keep: a change to a value the heap does not hold is not tracked, and the
            # marks of a scan the policy declines would pile up until the next flush)
            pop = digests.pop
            for kb in refused:
                pop(kb, None)
            if track:
                self._handed.difference_update(refused)
                # but each is being returned: lent, so a change to it is still written
                gone = set(refused)
                for kb, value, raw in zip(kbs, values, raws):
                    if kb in gone and type(value) not in IMMUTABLE:
                        self._lend(kb, value, raw, len(raw))
            self._cold.stats.levels["heap"].evictions["not_admitted"] += len(refused)
        if victims:
            self._handle_victims(victims)

    def _readmit(self, kb: bytes, loan: tuple[Any, Any, int], ts: float | None) -> Any:
        """Lock held: take a lent object back into the heap, clean, with what was last written
        for it as its digest (so a change made while it was out is written like any other);
        the object itself, as a dict would return it (see mlcache._loans)."""
        value, stored, n = loan
        heap = self._heap
        victims = heap.insert(kb, value, dirty=False, size=n, ts=ts,
                              weight=self._weight_of(kb, value) if self._cold.weighers else None)
        if victims and any(k == kb for k, _, _ in victims):
            self._cold.loans.lend(kb, loan)   # not admitted again: still lent
            victims = [v for v in victims if v[0] != kb]
        else:
            if type(stored) is int:
                self._digests[kb] = stored
            else:
                self._digests.remember(kb, stored)   # (kept within its budget, or hashed)
            self._handed.add(kb)
        if victims:
            self._handle_victims(victims)
        return value

    def _weight_of(self, kb: bytes, value: Any) -> int | None:
        """The weight a structure keeps in a value it reads back (see ``_weigh_with``), or
        None: the heap then weighs the value itself (a walk over a sample of it)."""
        for prefix, weigh in self._cold.weighers:
            if kb.startswith(prefix):
                return weigh(value)
        return None

    def _admit(self, kb: bytes, value: Any, raw: bytes, ts: float | None) -> Any:
        """Lock held: insert a value read from below into the heap, clean."""
        heap = self._heap
        if heap is None:
            return value
        if self._track and type(value) not in IMMUTABLE:
            self._digests.remember(kb, raw)
        victims = heap.insert(kb, value, dirty=False, size=len(raw), ts=ts,
                              weight=self._weight_of(kb, value) if self._cold.weighers else None)
        admitted = True
        if victims:
            if any(k == kb for k, _, _ in victims):
                # not admitted: just decoded, so unchanged; nothing to check or write, and no
                # mark; but it is being returned: lent, so a change to it is still written
                self._digests.pop(kb, None)
                if self._track and type(value) not in IMMUTABLE:
                    self._lend(kb, value, raw, len(raw))
                admitted = False
                victims = [v for v in victims if v[0] != kb]
                self._cold.stats.levels["heap"].evictions["not_admitted"] += 1
            self._handle_victims(victims)
        if self._track and admitted:
            self._handed.add(kb)
        return value
