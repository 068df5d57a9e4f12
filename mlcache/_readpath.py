"""The miss path of :class:`~mlcache.manager.CacheManager`: one batched read through the levels.

Kept apart from the manager because it is the subtle part: keys another thread is fetching are
waited for, keys in the eviction buffer come back without I/O, the byte levels are read without
the I/O lock and read again under it if a write overlapped (see :mod:`mlcache.writeback`), and a
key written or deleted while it was being read keeps that newer state.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable

from .errors import CacheError, IntegrityError

__all__ = ["ReadPath", "MISSING", "IMMUTABLE", "digest"]

MISSING: Any = object()
IMMUTABLE = frozenset((str, bytes, int, float, bool, type(None), complex))


def digest(data: bytes) -> tuple[int, int]:
    # In-process only, so the salted built-in hash is fine and far cheaper than a crypto hash.
    return len(data), hash(data)


class _Load:
    """A fetch in flight for some keys; others wanting them wait on ``done``."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class ReadPath:
    """Mixin for CacheManager: the batched miss path. Uses the manager's state (lock, heap,
    write-back, codec, stats)."""

    _lock: Any
    _data: dict[bytes, Any]
    _heap: Any
    _levels: list[Any]
    _level_names: list[str]
    _wb: Any
    _codec: Any
    _stats: Any
    _loading: dict[bytes, _Load]
    _digests: dict[bytes, tuple[int, int]]
    _handed: set[bytes]
    _access: Any
    _track: bool
    _hits: int

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
        heap_st = self._stats.levels["heap"]
        rounds = 0
        while todo:
            rounds += 1
            mine: list[bytes] = []
            waits: list[_Load] = []
            retry: list[bytes] = []
            with self._lock:
                self._check_open()
                if self._reads or self._reads_ts:
                    self._apply_reads()
                data, wb = self._data, self._wb
                for kb in todo:
                    value = data.get(kb, MISSING)
                    if value is not MISSING:
                        out[kb] = value
                        if not prefetch:
                            self._hits += 1
                            if self._access is not None:
                                self._access(kb, ts)
                            if self._track:
                                self._handed.add(kb)
                        continue
                    if kb in wb.tombstones:
                        if not prefetch:
                            heap_st.misses += 1
                        continue
                    load = self._loading.get(kb)
                    if load is not None:
                        if prefetch:
                            continue
                        if rounds < 3:
                            waits.append(load)
                            retry.append(kb)
                            continue
                        # Still loading after two waits: read it ourselves rather than spin.
                    raw = wb.pending_lookup(kb)
                    if raw is not None:
                        value = self._codec.decode(raw)
                        self._stats.writeback["buffer_hits"] += 1
                        out[kb] = self._admit(kb, value, raw, ts)
                        continue
                    if not prefetch:
                        heap_st.misses += 1
                    mine.append(kb)
                load = _Load()
                for kb in mine:
                    self._loading[kb] = load
            if mine:
                try:
                    self._read_lower(mine, out, ts, prefetch)
                finally:
                    with self._lock:
                        for kb in mine:
                            if self._loading.get(kb) is load:
                                del self._loading[kb]
                    load.done.set()
            for w in waits:
                w.done.wait()
            todo = retry
        # A read may push dirty victims into the buffer but never waits for room there (and
        # never fails because a write failed): back-pressure is for puts.
        self._wb.ensure_writers()
        if self._records is not None and not prefetch and self._records.has_cuts():
            self._records.forward()
        return out

    def _read_lower(self, keys: list[bytes], out: dict[bytes, Any], ts: float | None,
                    prefetch: bool) -> None:
        """Read ``keys`` from the byte levels, then resolve and insert under the lock."""
        wb = self._wb
        with self._lock:
            seq = wb.wseq
        if seq % 2 == 0:
            origin: dict[bytes, str] = {}
            found, timings = self._read_levels(keys, origin)
            decoded = self._decode_all(found, origin)
            with self._lock:
                if wb.wseq == seq:
                    self._resolve(keys, found, decoded, timings, out, ts, prefetch)
                    return
        # A write overlapped the read (an entry may have been between levels): read again
        # while no write can run.
        with wb.io_lock:
            origin = {}
            found, timings = self._read_levels(keys, origin)
            decoded = self._decode_all(found, origin)
            with self._lock:
                self._resolve(keys, found, decoded, timings, out, ts, prefetch)

    def _read_levels(self, keys: list[bytes], origin: dict[bytes, str] | None = None
                     ) -> tuple[dict[bytes, bytes], list[tuple]]:
        """First level holding each key answers; a level's buffer is consulted just above it.
        ``origin`` (when given) receives the name of the level each found key came from."""
        found: dict[bytes, bytes] = {}
        timings = []
        remaining = keys
        pending = self._wb.buffer.pending
        for i, level in enumerate(self._levels):
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
                                origin[kb] = f"write-back buffer of {self._level_names[i]}"
                remaining = rest
                if not remaining:
                    break
            t0 = time.perf_counter()
            values = level.get_many(remaining)
            elapsed = time.perf_counter() - t0
            rest = []
            for kb, raw in zip(remaining, values):
                if raw is None:
                    rest.append(kb)
                else:
                    found[kb] = raw
                    if origin is not None:
                        origin[kb] = self._level_names[i]
            timings.append((self._level_names[i], elapsed, len(remaining) - len(rest), len(rest)))
            remaining = rest
        return found, timings

    def _decode_all(self, found: dict[bytes, bytes],
                    origin: dict[bytes, str] | None = None) -> dict[bytes, Any]:
        decode = self._codec.decode
        out = {}
        for kb, raw in found.items():
            try:
                out[kb] = decode(raw)
            except CacheError as exc:
                # Name where the bad bytes live, so the operator can inspect or delete them.
                key = self._describe_key(kb)
                level = origin.get(kb) if origin is not None else None
                where = f"{level} level" if level else "a lower level"
                if type(exc) is IntegrityError:
                    raise IntegrityError(f"{where}, key {key!r}: {exc}", level=level,
                                         key=key) from exc
                exc.key, exc.level = key, level
                raise
        return out

    def _resolve(self, keys: list[bytes], found: dict[bytes, bytes], decoded: dict[bytes, Any],
                 timings: list[tuple], out: dict[bytes, Any], ts: float | None,
                 prefetch: bool) -> None:
        """Lock held: keep whatever happened to a key during the read, else admit what we read."""
        for name, elapsed, hits, misses in timings:
            st = self._stats.levels[name]
            st.loads += 1
            st.hits += hits
            st.misses += misses
            st.keys_loaded += hits
            st.load_time.record(elapsed)
        if prefetch:
            self._stats.prefetch["keys_loaded"] += len(found)
        data, wb = self._data, self._wb
        for kb in keys:
            value = data.get(kb, MISSING)
            if value is not MISSING:          # written meanwhile: the newer value wins
                out[kb] = value
                continue
            if kb in wb.tombstones:            # deleted meanwhile
                continue
            raw = wb.pending_lookup(kb)
            if raw is not None:                # written and evicted meanwhile
                out[kb] = self._admit(kb, self._codec.decode(raw), raw, ts)
                continue
            raw = found.get(kb)
            if raw is not None:
                out[kb] = self._admit(kb, decoded[kb], raw, ts)

    def _admit(self, kb: bytes, value: Any, raw: bytes, ts: float | None) -> Any:
        """Lock held: insert a value read from below into the heap, clean."""
        heap = self._heap
        if heap is None:
            return value
        if self._track and type(value) not in IMMUTABLE:
            self._digests[kb] = digest(raw)
        victims = heap.insert(kb, value, dirty=False, size=len(raw), ts=ts)
        if victims:
            if any(k == kb for k, _, _ in victims):
                # not admitted: just decoded, so unchanged; nothing to check or write
                self._digests.pop(kb, None)
                victims = [v for v in victims if v[0] != kb]
                self._stats.levels["heap"].evictions["not_admitted"] += 1
            self._handle_victims(victims)
        if self._track:
            self._handed.add(kb)
        return value
