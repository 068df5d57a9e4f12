"""The write side of :class:`~mlcache.manager.CacheManager`: what puts, deletes, evictions and
flushes send towards the byte levels.

Kept apart from the manager as the counterpart of :mod:`mlcache._readpath`. A put replaces the
heap entry and marks it dirty, after checking once per value type that values encode (so a
:class:`~mlcache.errors.SerializationError` names the key at the put, not later on a writer
thread); without a heap it goes straight to the eviction buffer. A delete leaves a tombstone
that hides lower copies until it is written. A victim leaving the heap is dropped when clean
and unchanged, written when dirty or changed in place (its mutation digest differs), and
pinned in the heap with the error kept when it cannot be encoded. A flush or checkpoint stages
dirty and changed entries into the eviction buffer in chunks bounded in bytes. Writing the
buffer down (writer threads, retries, the I/O lock) is :mod:`mlcache.writeback`'s.
"""
from __future__ import annotations

import reprlib
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from sys import getrefcount
from typing import Any

from ._loans import LOAN_REFS, VICTIM_REFS, same_encoding, shared_object
from ._readpath import IMMUTABLE, Digests, event_time, same_bytes
from .errors import CacheError, SerializationError

__all__ = ["WritePath", "batch_items"]


def batch_items(items: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
                kb: Callable[[Any], bytes]) -> list[tuple[Any, bytes, Any]]:
    """``put_many``'s argument as ``(key, its bytes, value)``; an item of an iterable that is
    not a ``(key, value)`` pair is a ``TypeError`` naming its position, not the interpreter's
    "not enough values to unpack"."""
    if isinstance(items, Mapping):
        return [(key, kb(key), value) for key, value in items.items()]
    out = []
    for i, pair in enumerate(items):
        try:
            key, value = pair
        except (TypeError, ValueError):
            raise TypeError(f"put_many: item {i} is {reprlib.repr(pair)}, not a (key, value) "
                            "pair") from None
        out.append((key, kb(key), value))
    return out


class WritePath:
    """Mixin for CacheManager: puts, deletes, heap victims and flush staging. Uses the
    manager's state (lock, heap, write-back, codec, stats, mutation tracking)."""

    _lock: Any
    _heap: Any
    _levels: list[Any]
    _wb: Any
    _codec: Any
    _records: Any
    _digests: Digests
    _handed: set[bytes]
    _track: bool
    _cold: Any   # the manager's _Cold: pin_errors, good_types, stats
    _reads: list[bytes]
    _reads_ts: list[tuple[bytes, float]]
    _check_open: Callable[[], None]
    _apply_reads: Callable[[], None]
    _weight_of: Callable[[bytes, Any], int | None]

    # -- puts and deletes --------------------------------------------------------------------

    def _encode_for(self, key: Any, value: Any) -> bytes:
        try:
            return self._codec.encode(value)
        except SerializationError as exc:
            raise SerializationError(
                f"cannot store key {key!r}: value of type {type(value).__name__} is not "
                f"serializable ({exc})", key=key, value_type=type(value)) from exc

    def _put_items(self, items: list[tuple[Any, bytes, Any]], ts: float | None,
                   weights: list[int] | None = None, *, lend_own: bool = False) -> None:
        if ts is not None:
            ts = event_time(ts)
        # ``weights``: per item, the value's memory in bytes as the caller maintains it (the
        # quadtree's live nodes), so the heap does not walk the value to weigh it.
        # Check encodability once per value type (cheap amortised), so a SerializationError
        # names the key here rather than later on a writer thread. Values of a type seen to
        # encode before are checked again only when they leave the heap.
        encoded: dict[bytes, tuple[Any, bytes]] = {}  # kb -> (the value encoded, its bytes)
        raws: list[bytes | None] = []
        heap = self._heap
        good_types = self._cold.good_types
        for key, kb, value in items:
            raw = None
            if heap is None or type(value) not in good_types:
                raw = self._encode_for(key, value)
                encoded[kb] = (value, raw)
                good_types.add(type(value))
            raws.append(raw)
        # A batch evicts some of its own values as it goes (a policy refuses them, or the batch
        # is larger than the heap). The batch, and the caller's mapping, reference each, so the
        # reference count cannot tell whether the caller holds one after the call: a public
        # put_many (``lend_own``) lends them all, and the next look forgets those nobody holds
        # (one more encoding each, to write a change made before they were dropped). A
        # structure writing its own objects (quadtree nodes, list chunks), which puts them
        # again after every change, does not (``fresh``: see _queue_victims). One put's own
        # value is lent: it was refused.
        fresh = ({kb for _, kb, _ in items} if len(items) > 1 and self._track and not lend_own
                 else None)
        rc = self._records
        pre = rc.before_write([kb for _, kb, _ in items], ts) if rc is not None else None
        # A batch whose victims fill the eviction buffer stops to write it before it goes on
        # (its bound holds for put_many too), unless our lock is held by a caller (writing
        # then could deadlock with a writer thread) or a write already failed: the rest is
        # still taken and the error raised at the end, as for a single put.
        nested = self._lock._is_owned()  # type: ignore[attr-defined]
        n, start, error = len(items), 0, None
        check_room = n > 1 and not nested and heap is not None and bool(self._levels)
        while True:
            with self._lock:
                self._check_open()
                cold = self._cold
                if cold.closing is not None and cold.closing != threading.get_ident():
                    raise CacheError("this CacheManager is closed")   # close() is under way
                if self._reads or self._reads_ts:
                    self._apply_reads()
                wb = self._wb
                pin_errors = cold.pin_errors
                loans = cold.loans
                if check_room:   # the victims' queue, its bounds (a cheap test per victim)
                    queued, most, most_bytes = (wb.buffer.pending[0], wb.buffer_max,
                                                wb.buffer_bytes_max or sys.maxsize)
                for i in range(start, n):
                    key, kb, value = items[i]
                    raw = raws[i]
                    wb.tombstones.discard(kb)
                    self._digests.pop(kb, None)
                    self._handed.discard(kb)
                    if loans:
                        loans.pop(kb, None)   # the held object is no longer the key's value
                    pin_errors.pop(kb, None)
                    if heap is None:
                        assert raw is not None
                        wb.buffer.add(0, kb, raw)
                        continue
                    if wb.levels:
                        wb.buffer.pending[0].pop(kb, None)  # superseded by the heap copy
                    if rc is not None:
                        rc.note_put(kb, pre)
                    victims = heap.insert(kb, value, dirty=True,
                                          size=len(raw) if raw is not None else None, ts=ts,
                                          weight=None if weights is None else weights[i])
                    if victims:
                        self._handle_victims(victims, encoded, fresh)
                        if check_room and i + 1 < n and error is None and (
                                len(queued) > most or queued.nbytes > most_bytes) and \
                                wb.needs_room():
                            start = i + 1
                            break
                else:
                    start = n
                need_room = wb.needs_room()
            if start == n:
                break
            try:
                self._wb.make_room()
            except Exception as exc:  # noqa: BLE001 (raised once the rest is taken)
                error = exc
        if rc is not None and rc.has_cuts():
            rc.forward()
        if error is not None:
            raise error
        if nested:
            # called back from code holding our lock: writing now could deadlock with a
            # writer thread, so leave it to the writer (woken by the enqueue)
            self._wb.ensure_writers()
        elif heap is None:
            if self._levels:
                self._wb.drain_all()
        elif need_room:
            self._wb.make_room()
        else:
            self._wb.ensure_writers()

    def _delete_kbs(self, kbs: list[bytes]) -> None:
        rc = self._records
        pre = rc.before_write(kbs, None) if rc is not None else None
        with self._lock:
            self._check_open()
            closing = self._cold.closing
            if closing is not None and closing != threading.get_ident():
                raise CacheError("this CacheManager is closed")   # close() is under way
            for kb in kbs:
                if rc is not None:
                    rc.note_delete(kb, pre)
                if self._heap is not None:
                    self._heap.remove(kb)
                self._digests.pop(kb, None)
                self._handed.discard(kb)
                self._cold.loans.pop(kb, None)
                self._cold.pin_errors.pop(kb, None)
                if self._levels:
                    self._wb.delete(kb)
        if rc is not None and rc.has_cuts():
            rc.forward()   # what reading the old values cut, once the deletes are applied
        if self._heap is None and self._levels:
            self._wb.drain_all()
        else:
            self._wb.ensure_writers()

    # -- victims: what leaves the heap ------------------------------------------------------

    def _handle_victims(self, victims: list[tuple[bytes, Any, bool]],
                        encoded: Mapping[bytes, tuple[Any, bytes]] | None = None,
                        fresh: set[bytes] | None = None) -> None:
        """Lock held: drop clean victims (unless mutated in place), queue dirty ones."""
        heap_st = self._cold.stats.levels["heap"]
        pin_errors = self._cold.pin_errors
        if self._records is not None:
            self._records.note_victims(victims)
        if not self._levels:
            # Heap only: nowhere to write, so a victim leaves for good, and encoding it (to
            # compare, or to write) would only cost: one that cannot be encoded was pinned,
            # outside the bound, with an error every flush and close() raised.
            for kb, value, dirty in victims:
                self._handed.discard(kb)
                self._digests.pop(kb, None)
                if pin_errors:
                    pin_errors.pop(kb, None)
                if dirty:
                    heap_st.evictions["dirty"] += 1
                    heap_st.evictions["dropped"] += 1
                else:
                    heap_st.evictions["clean"] += 1
            return
        try:
            self._queue_victims(victims, encoded, heap_st, pin_errors, fresh)
        except BaseException:
            # A KeyboardInterrupt (or a MemoryError) in the middle of the batch: the victims
            # not yet queued have left the heap and were in no level's queue, so acknowledged
            # writes vanished, and a later read returned an older copy from below. Kept as
            # pinned dirty entries instead, readable and written by the next flush.
            heap = self._heap
            assert heap is not None
            queued = self._wb.buffer.pending[0]
            for kb, value, dirty in victims:
                if dirty and kb not in heap.data and kb not in queued:
                    heap.pin(kb, value, dirty=True)
            raise

    def _queue_victims(self, victims: list[tuple[bytes, Any, bool]],
                       encoded: Mapping[bytes, tuple[Any, bytes]] | None, heap_st: Any,
                       pin_errors: dict, fresh: set[bytes] | None = None) -> None:
        track = self._track
        # (the loop's shape is what VICTIM_REFS measured: keep the two alike)
        for kb, value, dirty in victims:
            self._handed.discard(kb)
            digest = self._digests.pop(kb, None)
            if not dirty:
                if digest is None:
                    heap_st.evictions["clean"] += 1
                    continue
                try:
                    raw = self._codec.encode(value)
                except SerializationError as exc:
                    self._pin(kb, value, exc)
                    continue
                if same_bytes(digest, raw):
                    heap_st.evictions["clean"] += 1
                    if getrefcount(value) > VICTIM_REFS:   # still held: see mlcache._loans
                        self._lend(kb, value, digest, len(raw))
                    continue
                self._cold.stats.writeback["mutations_detected"] += 1
            else:
                enc = encoded.get(kb) if encoded else None
                raw = enc[1] if enc is not None and enc[0] is value else None
                if raw is None:
                    try:
                        # leaving the heap, nothing compares it: large bytes stay uncopied
                        raw = self._codec.encode_parts(value)
                    except SerializationError as exc:
                        self._pin(kb, value, exc)
                        continue
            heap_st.evictions["dirty"] += 1
            if pin_errors:
                pin_errors.pop(kb, None)   # failed at a flush, fixed in place since
            self._wb.enqueue(kb, raw)
            if track and type(value) not in IMMUTABLE and getrefcount(value) > VICTIM_REFS \
                    and (fresh is None or kb not in fresh):
                self._lend(kb, value, raw, len(raw))

    def _lend(self, kb: bytes, value: Any, stored: Any, n: int) -> None:
        """Lock held: ``value`` left the heap (or was not admitted) while someone holds it;
        ``stored``: its encoding as written (``n`` bytes), or that encoding's digest. See
        mlcache._loans."""
        if shared_object(value):
            return   # held by everyone for good, and a read gives it back: see shared_object
        if self._cold.loans.lend(kb, (value, stored, n)):
            self._check_loans(held_too=False)

    def _check_loans(self, prefix: bytes | None = None, forget: bool = False,
                     held_too: bool = True) -> None:
        """Lock held: look at the loans (all, or those under ``prefix``): write each one changed
        since it was lent or last written, and forget those nobody holds any more (``forget``:
        all of them). ``held_too=False`` (the look their growth triggers): only the ones nobody
        holds are encoded, to be forgotten."""
        loans = self._cold.loans
        if not loans:
            return
        codec, wb = self._codec, self._wb
        # One object lent under several keys (v = get(a); put(b, v), both evicted): the other
        # loans' references are not the caller's, else they would keep each other for good.
        lent = loans.lent if loans.shared else None
        look_at_held = forget or held_too or lent is not None
        # (the loop's shape is what LOAN_REFS measured: keep the two alike)
        for kb in list(loans):
            if prefix is not None and not kb.startswith(prefix):
                continue
            loan = loans[kb]
            obj = loan[0]
            dead = getrefcount(obj) <= LOAN_REFS
            if not (dead or look_at_held):
                continue
            if not dead and lent is not None:   # (the n loans of obj hold n - 1 of these)
                dead = getrefcount(obj) - lent[id(obj)] < LOAN_REFS
                if not (dead or forget or held_too):
                    continue
            try:
                raw = codec.encode_parts(obj)   # (large bytes stay the object's own)
            except SerializationError as exc:
                loans.pop(kb)
                self._pin(kb, obj, exc)   # back in the heap, its error raised by the flush
                continue
            stored = loan[1]
            if not same_encoding(stored, raw):
                wb.enqueue(kb, raw)
                self._cold.stats.writeback["mutations_detected"] += 1
                stored = raw
            if dead or forget:
                loans.pop(kb)
            else:
                loans.lend(kb, (obj, stored, len(raw)))
        loans.looked()

    def _pin(self, kb: bytes, value: Any, exc: SerializationError) -> None:
        assert self._heap is not None
        self._heap.pin(kb, value, dirty=True)
        key = self._describe_key(kb)
        self._cold.pin_errors[kb] = SerializationError(
            f"cannot write back key {key!r}: value of type {type(value).__name__} is not "
            f"serializable ({exc}); it stays in the heap until fixed or deleted",
            key=key, value_type=type(value))
        self._cold.stats.levels["heap"].evictions["pinned"] += 1

    def _describe_key(self, kb: bytes) -> Any:
        try:
            from .keys import split_key

            return split_key(kb)[1]
        except Exception:
            return kb

    # -- flush staging -----------------------------------------------------------------------

    def _stage_dirty(self, full_check: bool) -> None:
        """Encode dirty and in-place-mutated entries into the eviction buffer and write them.

        In chunks: with a byte-bounded heap, encodings are staged until the buffer holds about
        its byte bound, then written before the next chunk is encoded, so a flush never holds
        the whole dirty set encoded beside the objects (a transient the budget cannot cover).
        The caller drains what the last chunk staged. Entries changed between chunks are
        taken as they are then (a newer put is simply staged, a deleted or evicted one skipped).
        """
        with self._lock:
            self._check_open()
            self._apply_reads()
            heap = self._heap
            if heap is None or not self._levels:
                return  # heap only: there is nowhere to write to
            dirty = [kb for kb in heap.dirty if kb not in heap.pinned]
            check: list[bytes] = []
            if self._track:
                check = list(self._digests) if full_check else list(self._handed)
                self._handed.clear()
        limit = self._wb.buffer_bytes_max
        i = j = 0
        while True:
            with self._lock:
                self._check_open()
                if i < len(dirty):
                    i = self._stage_chunk(dirty, i, limit)
                if i == len(dirty) and j < len(check):
                    j = self._check_chunk(check, j, limit)
                if i == len(dirty) and j == len(check):
                    self._check_loans()
                    self._stage_unpinned()
                    self._heap.compact()
                    return
            self._wb.drain_all()

    def _stage_chunk(self, dirty: list[bytes], i: int, limit: int | None) -> int:
        """Lock held: stage ``dirty[i:]`` until the buffer reaches ``limit``; the next index."""
        heap = self._heap
        assert heap is not None
        data, digests, buffer = heap.data, self._digests, self._wb.buffer
        weights = heap.weights if heap.by_bytes else None
        overhead = heap.entry_overhead
        pin_errors = self._cold.pin_errors
        n = len(dirty)
        while i < n:
            kb = dirty[i]
            i += 1
            if kb not in heap.dirty or kb in heap.pinned:
                continue   # written, evicted or deleted since the flush began
            value = data[kb]
            try:
                raw = self._codec.encode(value)
            except SerializationError as exc:
                pin_errors[kb] = SerializationError(
                    f"cannot write back key {self._describe_key(kb)!r}: value of type "
                    f"{type(value).__name__} is not serializable ({exc})",
                    key=self._describe_key(kb), value_type=type(value))
                continue
            self._wb.enqueue(kb, raw)
            heap.dirty.discard(kb)
            if pin_errors:
                pin_errors.pop(kb, None)   # failed at an earlier flush, fixed in place since
            if self._track and type(value) not in IMMUTABLE:
                digests.remember(kb, raw)
            self._cold.stats.writeback["dirty_flushes"] += 1
            if weights is not None and len(raw) + overhead > weights.get(kb, 0):
                # its encoding alone outweighs what the put weighed: changed in place since
                self._reweigh(kb, value, raw)
            if limit is not None and buffer.nbytes >= limit:
                break
        return i

    def _check_chunk(self, check: list[bytes], j: int, limit: int | None) -> int:
        """Lock held: write clean entries changed in place (digest differs), from ``check[j:]``
        until the buffer reaches ``limit``; the next index."""
        heap = self._heap
        assert heap is not None
        data, digests, buffer = heap.data, self._digests, self._wb.buffer
        n = len(check)
        while j < n:
            kb = check[j]
            j += 1
            digest = digests.get(kb)
            if digest is None or kb in heap.dirty or kb not in data:
                continue
            value = data[kb]
            try:
                raw = self._codec.encode(value)
            except SerializationError as exc:
                heap.dirty.add(kb)
                self._cold.pin_errors[kb] = SerializationError(
                    f"cannot write back key {self._describe_key(kb)!r}: value of type "
                    f"{type(value).__name__} is not serializable ({exc})",
                    key=self._describe_key(kb), value_type=type(value))
                continue
            if not same_bytes(digest, raw):
                digests.remember(kb, raw)
                self._wb.enqueue(kb, raw)
                self._cold.stats.writeback["mutations_detected"] += 1
                self._reweigh(kb, value, raw)
                if limit is not None and buffer.nbytes >= limit:
                    break
        return j

    def _reweigh(self, kb: bytes, value: Any, raw: bytes) -> None:
        """Lock held: ``kb``'s value was changed in place (``raw``: its encoding now, just
        queued to be written): a bytes-bounded heap weighs it again, so the budget follows
        what the value takes now, and evicts if it no longer fits."""
        heap = self._heap
        if heap is None or not heap.by_bytes or self._records is not None:
            return   # (the record cache weighs records as they were put, as in KIP-63)
        weight = self._weight_of(kb, value) if self._cold.weighers else None
        victims = heap.reweigh(kb, len(raw), weight)
        if victims:
            self._handle_victims(victims)

    def _stage_unpinned(self) -> None:
        """Lock held: pinned victims that became encodable leave the heap now."""
        heap = self._heap
        assert heap is not None
        data = heap.data
        for kb in list(heap.pinned):
            value = data[kb]
            try:
                raw = self._codec.encode(value)
            except SerializationError:
                continue
            heap.unpin(kb)
            self._cold.pin_errors.pop(kb, None)
            self._wb.enqueue(kb, raw)

    def _raise_pinned(self) -> None:
        with self._lock:
            errors = list(self._cold.pin_errors.values())
        if errors:
            raise errors[0]
