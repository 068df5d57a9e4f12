"""Write-back: the eviction buffer, tombstones, writer threads, flush and checkpoint.

Entries flow down only. A dirty heap victim is encoded by the thread that evicted it and put in
the :class:`EvictionBuffer`, one ordered dict per destination level (``pending[0]`` feeds the
first byte level). Writer threads drain it in batches: one ``put_many`` per level per batch.
When a byte level overflows it returns its own victims, which the same batch writes to the level
below before it finishes, so an entry is never in no place. A shared level that can (a bounded
Redis level) keeps them until then, and releases them once the level below holds them, so it
is never in no place *another process* can see either. The last level is the store of
record and refuses to drop (``may_evict = False``) unless it is lossy.

Ordering rules that keep reads exact:

* All writes to the byte levels happen under one I/O lock, in the order batches were taken,
  so two versions of one key can never be written out of order.
* ``wseq`` is odd while a batch is being written. A reader that reads the levels without the
  I/O lock checks afterwards that ``wseq`` did not move. If it did, it asks ``moved_since``
  which keys the overlapping writes moved (each write logs them when it starts: its own keys,
  or "unknown" when a bounded level may cascade victims whose names only come back from the
  write); only those keys may have been in transit between two levels, and only those are
  read again holding the I/O lock. Misses never wait for a write of other keys.
* A delete leaves a tombstone: reads see a miss at once, and the tombstone is removed only after
  every level has deleted the key. A later put of the key drops the tombstone (the heap copy is
  newer than anything below, and it reaches every level before its older copies could be seen).
* ``newer[i]`` holds the keys byte level ``i`` holds newer than level ``i + 1``; checkpoint copies
  them down level by level, so the store of record ends up with everything.

Failures (Redis down, a full store of record) never lose an entry: a failed batch goes back to
the buffer of the level it was meant for, the writer backs off and retries, and the error is
raised to the next ``flush``/``checkpoint``, or to a ``put`` that needs room in a full buffer.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Sequence

from .codec import Encoded
from .errors import CacheError, LevelUnavailableError
from .levels.base import HeldVictims
from .stats import Stats

__all__ = ["EvictionBuffer", "WriteBack"]

_MAX_BACKOFF = 2.0
_MIN_BACKOFF = 0.01  # a background writer never spins on a failing level
# A writer that wakes to a short queue waits this long for a batch to fill before writing it.
# Each batch the writer thread writes costs ~0.3 ms of CPU beyond the write (taking the GIL back
# after each blocking call, thread switches), so a longer wait (50 ms, whole-buffer batches) cut
# the writer's CPU in bench events; but the buffer then filled more often and the putting
# thread wrote it synchronously, which cost bench levels' DEBS'22 goal (wall time) up to 0.2x:
# an A/B of both settings, alternating, gave 0.98-1.09 with these and 0.99-1.31 with those.
_LINGER = 0.005
_WLOG = 64       # writes remembered for readers that overlapped them (``moved_since``)
_WLOG_KEYS = 2048  # ... and at most this many of their keys (the log keeps evicted keys alive)
# ``newer[i]`` (see WriteBack.bound_newer): a byte key in a set costs ~75 bytes (measured: 22 MiB
# for 3 * 10**5 keys); it is copied down early past max(_NEWER_MIN_KEYS, buffer bound / this).
_NEWER_KEY_BYTES = 75
_NEWER_MIN_KEYS = 10_000


class _Pending(dict[bytes, bytes]):
    """An ordered dict of encoded entries that keeps the total length of its values, so the
    buffer can be bounded in bytes (it holds memory the heap budget no longer counts)."""

    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def __setitem__(self, key: bytes, data: bytes) -> None:
        old = dict.get(self, key)
        if old is not None:
            self.nbytes -= len(old)
        dict.__setitem__(self, key, data)
        self.nbytes += len(data)

    def __delitem__(self, key: bytes) -> None:
        self.nbytes -= len(dict.pop(self, key))

    _NONE: Any = object()

    def pop(self, key: bytes, default: Any = _NONE) -> Any:
        data: bytes | None
        if default is _Pending._NONE:
            data = dict.pop(self, key)
        else:
            data = dict.pop(self, key, None)
            if data is None:
                return default
        self.nbytes -= len(data)
        return data

    def clear(self) -> None:
        dict.clear(self)
        self.nbytes = 0


class EvictionBuffer:
    """Encoded entries on their way down, one ordered dict per destination level."""

    def __init__(self, levels: int) -> None:
        self.pending: list[_Pending] = [_Pending() for _ in range(levels)]

    def __len__(self) -> int:
        return sum(len(p) for p in self.pending)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pending)

    def add(self, index: int, key: bytes, data: bytes) -> None:
        p = self.pending[index]
        p.pop(key, None)  # re-adding moves the key to the back of the queue
        p[key] = data

    def discard(self, key: bytes) -> None:
        for p in self.pending:
            p.pop(key, None)

    def take(self, index: int, n: int, max_bytes: int | None = None, as_is: int | None = None,
             total_max: int | None = None) -> list[tuple[bytes, bytes]]:
        """The ``n`` oldest entries for level ``index``, fewer when their encodings reach
        ``max_bytes`` (always at least one). With ``as_is``, encodings at least that long do
        not count toward ``max_bytes`` (the level sends them as they are, no copy), and all
        count toward ``total_max``."""
        p = self.pending[index]
        out = []
        total = copied = 0
        for key in list(itertools.islice(p, n)):
            data = p.pop(key)
            out.append((key, data))
            size = len(data)
            total += size
            if as_is is not None:
                if size < as_is:
                    copied += size
                if (max_bytes is not None and copied >= max_bytes) or \
                        (total_max is not None and total >= total_max):
                    break
            elif max_bytes is not None and total >= max_bytes:
                break
        if not p and sys.getsizeof(p) > 4096:
            # A dict keeps its table when emptied by pops: after a large flush drained, start
            # a small one rather than keep room for the whole dirty set.
            self.pending[index] = _Pending()
        return out


def _joined(items: list[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
    """``items`` with every value in pieces (:class:`~mlcache.codec.Encoded`, a large
    write-back) joined into bytes, for a level that takes bytes only."""
    if not any(type(v) is Encoded for _, v in items):
        return items
    return [(k, bytes(v) if type(v) is Encoded else v) for k, v in items]


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, CacheError):
        return exc.retryable
    return isinstance(exc, (OSError, ConnectionError, TimeoutError))


class WriteBack:
    """Moves encoded entries down the byte levels; shares the manager's lock for its state."""

    def __init__(self, levels: Sequence[Any], names: Sequence[str], lock: Any, stats: Stats,
                 *, batch_size: int, buffer_max: int, retry_attempts: int, retry_backoff: float,
                 writer_threads: int) -> None:
        self.levels = list(levels)
        self.names = list(names)
        for level in self.levels[:-1]:
            # a level that can keeps its victims until the level below holds them (_write)
            hold = getattr(level, "hold_victims", None)
            if hold is not None:
                hold()
        self.lock = lock                    # the manager's lock: buffer, tombstones, wseq
        self.io_lock = threading.Lock()     # serialises every write to the byte levels
        self._start_lock = threading.Lock()  # one set of writer threads per process
        self.stats = stats
        self.batch_size = batch_size
        self.buffer_max = buffer_max
        # Set by the manager from the heap budget: the bytes of encodings queued *and* being
        # written (a batch taken from the buffer is still in memory until its write returns).
        self.buffer_bytes_max: int | None = None
        self.inflight_bytes = 0             # encodings taken by a write that has not returned
        self.retry_attempts = retry_attempts
        self.retry_backoff = retry_backoff
        self.writer_threads = writer_threads if self.levels else 0
        self.buffer = EvictionBuffer(len(self.levels))
        self.tombstones: set[bytes] = set()
        self.newer: list[set[bytes]] = [set() for _ in self.levels]  # guarded by io_lock
        # keys of newer[i] whose absence from level i is not a loss: invalidate_local said
        # another process may have changed them (deleted them, as their owner, say); a write
        # of ours vouches for a key again
        self.unsure: list[set[bytes]] = [set() for _ in self.levels]  # guarded by io_lock
        # len(newer[i]) after its last copy down: it is copied down early once it grows by
        # newer_max beyond that (keys a level lost stay until reported, so not from zero)
        self._newer_base = [0 for _ in self.levels]   # guarded by io_lock
        self._bound_lock = threading.Lock()
        self.wseq = 0
        # (wseq at the start of a write, the keys it moves or None if unknown), oldest first;
        # writes that started before ``_wlog_floor`` were forgotten. Guarded by the lock.
        self._wlog: deque[tuple[int, tuple[bytes, ...] | None]] = deque()
        self._wlog_keys = 0
        self._wlog_floor = 0
        self.error: BaseException | None = None  # the last background failure, if unresolved
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pid = 0

    # -- called with the manager lock held -------------------------------------------------

    # Event.set() takes the event's lock and notifies every time; it is skipped when the
    # event is already set. Safe: the writer clears the event before it looks for work, so
    # an entry added while the event is still set is added before that look.
    def enqueue(self, key: bytes, data: bytes) -> None:
        self.buffer.add(0, key, data)
        self.stats.writeback["dirty_evictions"] += 1
        if not self._wake.is_set():
            self._wake.set()

    def delete(self, key: bytes) -> None:
        self.buffer.discard(key)
        self.tombstones.add(key)
        if not self._wake.is_set():
            self._wake.set()

    def needs_room(self) -> bool:
        if len(self.buffer) > self.buffer_max:
            return True
        limit = self.buffer_bytes_max
        return (limit is not None and len(self.buffer) > 1
                and self.buffer.nbytes + self.inflight_bytes > limit)

    @property
    def batch_bytes_max(self) -> int | None:
        """Bytes of encodings one write takes at most (beyond its first entry): a quarter of
        the buffer's bound, so the buffer keeps room while a batch is written and puts seldom
        find it full. A level client's copy of a batch is charged to the heap budget beside
        the buffer (see ``CacheManager._reserved_bytes``)."""
        limit = self.buffer_bytes_max
        return None if limit is None else max(1, limit // 4)

    def _take_bounds(self, index: int) -> tuple[int | None, int | None, int | None]:
        """``take``'s bounds for a write into level ``index``: ``batch_bytes_max`` bounds the
        bytes a level client copies (what the heap budget reserves beside the buffer); a
        level that sends long values as they are (``sends_as_is``: the unbounded Redis
        level) copies only the short ones, so a write to it takes up to half the buffer.
        Fewer, larger writes: each costs a writer thread two round trips for the GIL (the
        send and the reply), ~0.2 ms of CPU while another thread runs Python; at heap=30%
        in ``mlcache bench events`` the aging trees' pages went down in ~400 writes of two
        10 KB pages."""
        limit = self.buffer_bytes_max
        as_is = getattr(self.levels[index], "sends_as_is", None)
        if limit is None or as_is is None:
            return self.batch_bytes_max, None, None
        return self.batch_bytes_max, as_is, max(1, limit // 2)

    def _log_write(self, keys: Iterable[bytes] | None) -> None:
        """Lock held, right after ``wseq`` became odd: the keys this write may move."""
        log = self._wlog
        moved = None if keys is None else tuple(keys)
        log.append((self.wseq, moved))
        if moved:
            self._wlog_keys += len(moved)
        while len(log) > 1 and (len(log) > _WLOG or self._wlog_keys > _WLOG_KEYS):
            start, old = log.popleft()
            self._wlog_floor = start + 1
            if old:
                self._wlog_keys -= len(old)

    def forget_reads(self) -> None:
        """Lock held: a read that started before now may have seen lower levels another process
        has since changed (``CacheManager.invalidate_local``). Logged as a write of unknown
        keys, so such a read is read again (demand) or dropped (prefetch), like one a write
        of ours overlapped."""
        self.wseq += 1
        self._log_write(None)
        self.wseq += 1

    def moved_since(self, seq: int) -> set[bytes] | None:
        """Lock held: every key a write running at or started after ``wseq == seq`` may have
        moved between levels (or deleted), or None if that is not known."""
        if seq < self._wlog_floor:
            return None
        out: set[bytes] = set()
        for start, keys in reversed(self._wlog):
            if start < seq:
                break
            if keys is None:
                return None
            out.update(keys)
        return out

    def guards_newer(self, index: int) -> bool:
        """Whether a key of ``newer[index]`` missing from level ``index`` is a lost write: an
        unbounded, non-lossy level above the last drops nothing of its own accord (a bounded
        one hands its victims down, and another process's bounded writes may evict ours), so
        such a key was lost by the server (restarted without its data, evicted under its own
        ``maxmemory``, flushed by someone)."""
        return (index < len(self.levels) - 1 and self._exact(index)
                and not getattr(self.levels[index], "lossy", False))

    def lost_from(self, index: int, keys: Iterable[bytes]) -> list[bytes]:
        """Of ``keys``, missing from level ``index``, those it lost: written there by us, not
        yet below, and not invalidated since (see ``unsure``)."""
        newer, unsure = self.newer[index], self.unsure[index]
        return [kb for kb in keys if kb in newer and kb not in unsure]

    def mark_unsure(self, prefix: bytes, also: Iterable[bytes] = ()) -> None:
        """``invalidate_local``: another process may have changed (deleted) the keys under
        ``prefix`` (and ``also``) that the levels hold newer than below: their absence is no
        longer a loss. Takes the I/O lock."""
        also = set(also)
        with self.io_lock:
            for newer, unsure in zip(self.newer, self.unsure):
                if newer:
                    unsure.update(kb for kb in newer if kb.startswith(prefix) or kb in also)

    def _exact(self, index: int) -> bool:
        """Whether a write into level ``index`` moves only its own keys: the last level keeps
        or refuses (a lossy one may drop, which readers may see or not), an unbounded level
        above it never hands victims down."""
        if index >= len(self.levels) - 1:
            return True
        level = self.levels[index]
        return hasattr(level, "max_bytes") and level.max_bytes is None

    def pending_lookup(self, key: bytes) -> bytes | None:
        return self.buffer.pending[0].get(key) if self.levels else None

    def reset_after_fork(self, lock: Any) -> None:
        self.lock = lock
        self.io_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._bound_lock = threading.Lock()
        self._newer_base = [0 for _ in self.levels]   # the manager clears newer[] here
        self.inflight_bytes = 0   # a write the parent was running does not exist here
        self._wake = threading.Event()
        self._threads = []
        self._pid = 0
        if len(self.buffer) or self.tombstones:
            self._wake.set()

    # -- writer threads --------------------------------------------------------------------

    def ensure_writers(self) -> None:
        """Start the writer threads in this process (again after a fork)."""
        if self._pid == os.getpid() or not self.writer_threads or self._stop.is_set():
            return
        # Called unlocked from the read, put and prefetch paths: two threads' first calls must
        # not both start a set of writers (the first set would never be joined by stop()).
        with self._start_lock:
            if self._pid == os.getpid() or self._stop.is_set():
                return
            threads = [threading.Thread(target=self._writer_loop, name=f"mlcache-writer-{i}",
                                        daemon=True) for i in range(self.writer_threads)]
            self._threads = threads
            self._pid = os.getpid()
            for t in threads:
                t.start()

    def _work_waiting(self) -> bool:
        return bool(len(self.buffer) or self.tombstones or self.newer_over())

    def _writer_loop(self) -> None:
        # a level that can (Redis) gives this thread a connection of its own: a batch every
        # few milliseconds would otherwise check one out of the pool and back each time
        holding = [level for level in self.levels if hasattr(level, "hold_connection")]
        for level in holding:
            level.hold_connection()
        try:
            self._write_until_stopped()
        finally:
            for level in holding:
                level.release_connection()

    def _write_until_stopped(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._wake.wait(1.0)
            if self._stop.is_set():
                break
            self._wake.clear()
            queued, full = self.buffer.pending[0], self.batch_bytes_max
            if len(queued) < self.batch_size and (full is None or queued.nbytes < full):
                # Linger for a batch to fill; a batch already full in bytes (one 1 MB value)
                # goes at once, or the next put finds the buffer over its bound and writes it
                # itself, synchronously, while this thread sleeps.
                self._stop.wait(_LINGER)
            while self._work_waiting() and not self._stop.is_set():
                try:
                    # Deletes first: they may free the room a full store of record needs for
                    # the writes queued behind them (a key is never both tombstoned and queued).
                    if self.tombstones:
                        self.flush_tombstones()
                    elif len(self.buffer):
                        self.drain_once()
                    else:
                        # the queue is written: copy down what newer[] keeps past its bound
                        # (a failure is retried here and by the next flush, which raises it)
                        self.bound_newer()
                    attempt = 0
                    self.error = None
                    if self._work_waiting():
                        # Let a reader waiting for the I/O lock in before the next batch (the
                        # lock is not fair, and a miss must not starve behind a long
                        # write-back). Not after the last: giving up the GIL costs this
                        # thread a wait for the thread running Python and two switches.
                        time.sleep(0)
                except Exception as exc:  # kept and surfaced to the next flush/put
                    self.error = exc
                    self.stats.writeback["writer_errors"] += 1
                    attempt += 1
                    backoff = max(_MIN_BACKOFF, self.retry_backoff) * (2 ** min(attempt, 6))
                    self._stop.wait(min(_MAX_BACKOFF, backoff))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            # (a thread not started: ensure_writers interrupted between creating and starting)
            if t is not threading.current_thread() and t.ident is not None:
                t.join(timeout=10)
        self._threads = []

    # -- draining ----------------------------------------------------------------------------

    def drain_once(self) -> int:
        """Write one batch (deepest destination first); return how many entries it took."""
        with self.io_lock:
            with self.lock:
                index = next((i for i in range(len(self.levels) - 1, -1, -1)
                              if self.buffer.pending[i]), None)
                if index is None:
                    return 0
                items = self.buffer.take(index, self.batch_size, *self._take_bounds(index))
                count, taken = len(items), sum(len(v) for _, v in items)
                self.inflight_bytes += taken
                self.wseq += 1
                self._log_write([k for k, _ in items] if self._exact(index) else None)
            try:
                self._write(index, items)
            finally:
                del items
                with self.lock:
                    self.inflight_bytes -= taken
                    self.wseq += 1
            return count

    def _write(self, index: int, items: list[tuple[bytes, bytes]]) -> None:
        """Put ``items`` into level ``index`` and cascade its victims down; io_lock held.

        A level holding its victims (``hold_victims``, see :mod:`mlcache.levels.base`)
        still stores them when it returns them: they are released only once the level below
        holds them, so another process reading one meanwhile finds it above, never the older
        copy below. On failure the entries that had not reached a level go back to that
        level's buffer, except held victims, which simply stay where they are.
        """
        last = len(self.levels) - 1
        carry: list[tuple[bytes, Any]] = items
        held: HeldVictims | None = None     # carry, still stored in level i - 1
        i = index
        while carry and i <= last:
            level = self.levels[i]
            st = self.stats.levels[self.names[i]]
            if not getattr(level, "accepts_pieces", False):
                carry = _joined(carry)
            try:
                victims = level.put_many(carry)
            except BaseException as exc:    # a KeyboardInterrupt too: the batch is put back
                if held is None:
                    self._requeue(i, carry)
                else:
                    self._keep_held(i - 1, held)
                # a failed write that may have been applied (a bounded Redis level's EXEC
                # whose reply was lost) names the victims it may have removed: queued below
                maybe = getattr(exc, "maybe_victims", None)
                if maybe and i < last:
                    self._requeue(i + 1, maybe)
                raise
            st.writes += 1
            st.keys_written += len(carry)
            st.bytes_written += sum(len(v) for _, v in carry)
            if held is not None:
                self._release(i - 1, held)
            if i < last:
                self.newer[i].update(k for k, _ in carry)
                if self.unsure[i]:
                    self.unsure[i].difference_update(k for k, _ in carry)
            held = None
            if victims:
                st.evictions["overflow"] += len(victims)
                if i < last:
                    if isinstance(victims, HeldVictims):
                        held = victims      # newer here than below until the next write
                    else:
                        self.newer[i].difference_update(k for k, _ in victims)
                elif level.lossy:
                    st.evictions["dropped"] += len(victims)
            carry = list(victims or ())
            i += 1

    def _keep_held(self, index: int, held: HeldVictims) -> None:
        """Writing the victims level ``index`` holds to the level below failed: they stay
        there, newer than below (a checkpoint copies them). A value it passed through (not
        stored) goes back to that level's queue, ahead of its older copy, which stays too
        (our reads see the queue first; the next write passes the value through again and
        releases the older copy once the level below holds the value)."""
        passed = {k for k, _ in held.passed}
        self.newer[index].update(k for k, _ in held if k not in passed)
        if held.passed:
            self._requeue(index, held.passed)
        evicted = [(k, v) for k, v in held.held if k not in passed]
        if evicted:
            try:
                # their leases end: any write may evict them again (else they expire); the
                # older copies of values passed through stay ours, for the next write
                self.levels[index].release(HeldVictims([], evicted, []), remove=False)
            except CacheError:
                pass

    def _release(self, index: int, held: HeldVictims) -> None:
        """The level below level ``index`` holds its victims ``held``: release them there.
        If that fails (the level unreachable), a victim left there has the value below, which
        is harmless (it is evicted and released again later), but an older copy of a value
        passed through would hide the newer one below: that value is written again."""
        self.newer[index].difference_update(k for k, _ in held)
        try:
            self.levels[index].release(held)
        except CacheError:
            self.stats.writeback["unreleased"] += len(held.held)
            olds = {k for k, _ in held.held}
            again = [(k, v) for k, v in held.passed if k in olds]
            if again:
                self._requeue(index, again)

    def _requeue(self, index: int, items: list[tuple[bytes, bytes]]) -> None:
        with self.lock:
            p = self.buffer.pending[index]
            for key, data in items:
                # A newer copy queued meanwhile wins; a deleted key stays deleted.
                if key not in p and key not in self.tombstones:
                    p[key] = data
            self.stats.writeback["requeued"] += len(items)

    def flush_tombstones(self) -> None:
        with self.io_lock:
            with self.lock:
                if not self.tombstones:
                    return
                keys = sorted(self.tombstones)
                self.wseq += 1
                self._log_write(keys)
            try:
                for i, level in enumerate(self.levels):
                    level.delete_many(keys)
                    self.stats.levels[self.names[i]].deletes += len(keys)
                with self.lock:
                    self.tombstones.difference_update(keys)
                    for newer in self.newer:
                        newer.difference_update(keys)
                    for unsure in self.unsure:
                        if unsure:
                            unsure.difference_update(keys)
                    self.stats.writeback["tombstones_flushed"] += len(keys)
            finally:
                with self.lock:
                    self.wseq += 1

    def _with_retries(self, step: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            try:
                return step()
            except Exception as exc:
                attempt += 1
                self.stats.writeback["retries"] += 1
                if not _retryable(exc) or attempt >= self.retry_attempts:
                    raise
                time.sleep(min(_MAX_BACKOFF, self.retry_backoff * (2 ** (attempt - 1))))

    def drain_all(self) -> None:
        """Write everything buffered and every tombstone, then copy down early what ``newer``
        keeps past its bound (``bound_newer``); raise if a level stays unavailable."""
        try:
            self._with_retries(self.flush_tombstones)   # may free room for the writes below
            while True:
                while len(self.buffer):
                    self._with_retries(self.drain_once)
                self._with_retries(self.flush_tombstones)
                # A writer thread may have taken the last batch after the loop above looked at
                # the buffer; if that write failed, its entries are back in the buffer. Done
                # only when, with no write in flight, nothing is queued or tombstoned.
                if self._settled():
                    break
            self.bound_newer(self._with_retries)
        except Exception as exc:
            self.error = exc
            raise
        self.error = None

    def _settled(self) -> bool:
        """Whether nothing is queued or tombstoned while no write is in flight."""
        with self.io_lock, self.lock:
            return not len(self.buffer) and not self.tombstones

    def make_room(self) -> None:
        """Called by a put after the buffer outgrew ``buffer_max``: write until it fits."""
        while self.needs_room():
            try:
                if self.tombstones:
                    self._with_retries(self.flush_tombstones)
                self._with_retries(self.drain_once)
            except Exception as exc:
                if isinstance(exc, CacheError):
                    raise
                raise LevelUnavailableError(f"write-back failed: {exc}") from exc

    def copy_down(self) -> None:
        """Checkpoint step: copy what each byte level holds newer than the next one down.

        In batches of ``batch_size`` keys, fewer when values are large (a batch's bytes kept
        near ``batch_bytes_max``, as the writer's): each batch is read and written before the
        next is read, so a checkpoint never holds a whole level's newer entries in memory
        (one read of everything took ~390 MiB for 190 MB in Redis under a 4 MiB heap)."""
        lost: list[tuple[int, bytes]] = []
        for i in range(len(self.levels) - 1):
            self._copy_level(i, lost, self._with_retries)
        for level in self.levels:
            sync = getattr(level, "sync", None)
            if sync is not None:
                sync()
        if lost:
            raise LostWrites(lost)

    @property
    def newer_max(self) -> int:
        """How many keys ``newer[i]`` may grow by before they are copied down early: as many
        as the eviction buffer's byte bound (1/32 of the heap budget, see the manager) holds
        at ~75 bytes a key, never fewer than 10**4 (~0.75 MB)."""
        return max(_NEWER_MIN_KEYS, (self.buffer_bytes_max or 0) // _NEWER_KEY_BYTES)

    def newer_over(self) -> bool:
        """Whether some ``newer[i]`` outgrew its bound (a read of a few lengths, no lock)."""
        cap = self.newer_max
        return any(len(newer) > base + cap
                   for newer, base in zip(self.newer[:-1], self._newer_base))

    def bound_newer(self, retry: Callable[[Callable[[], Any]], Any] | None = None) -> None:
        """Copy down early every level whose ``newer`` set outgrew ``newer_max`` keys since its
        last copy: what a checkpoint would copy, by the same code, so the keys this process
        must remember stay bounded in a job that flushes often and checkpoints seldom. Moving
        a copy down early is what an eviction does anyway. Keys the level lost (see
        ``guards_newer``) stay in ``newer``: reads, ``keys()`` and the next checkpoint report
        them, as without this. A failed copy leaves its keys in ``newer`` and raises; the
        bound then waits for ``newer_max`` more keys (a flush reports a failing level below
        once, not at every call). ``retry`` wraps each batch (``_with_retries`` at a flush;
        the writer thread retries with its own back-off)."""
        if not self.newer_over():
            return
        with self._bound_lock:      # one copy at a time (the writer's, or a flush's)
            cap = self.newer_max
            for i in range(len(self.levels) - 1):
                if len(self.newer[i]) <= self._newer_base[i] + cap:
                    continue
                try:
                    self._copy_level(i, None, retry)
                    self.stats.writeback["early_copies"] += 1
                except BaseException:
                    if retry is not None:   # a flush reports it; the writer tries again
                        with self.io_lock:
                            self._newer_base[i] = len(self.newer[i])
                    raise
                with self.io_lock:
                    self._newer_base[i] = len(self.newer[i])

    def _copy_level(self, i: int, lost: list[tuple[int, bytes]] | None,
                    retry: Callable[[Callable[[], Any]], Any] | None) -> None:
        """Copy the keys ``newer[i]`` holds now from level ``i`` to level ``i + 1``, a batch at
        a time under the I/O lock. A key a guarded level lost is added to ``lost`` and
        forgotten (a checkpoint reports it once) or, with ``lost`` None, kept in ``newer``."""
        guard = self.guards_newer(i)
        with self.io_lock:
            todo = sorted(self.newer[i])
        # bounded in bytes: the first batch is one entry, then as many as fit the bound
        pos, n = 0, self.batch_size if self.batch_bytes_max is None else 1
        while pos < len(todo):
            def step(pos: int = pos, n: int = n) -> tuple[int, int]:
                """Copy the batch at ``pos``; the next position and batch length."""
                with self.io_lock:
                    newer = self.newer[i]
                    keys = [k for k in todo[pos:pos + n] if k in newer]
                    if not keys:
                        return pos + n, n
                    with self.lock:
                        self.wseq += 1
                        self._log_write(keys if self._exact(i + 1) else None)
                    try:
                        values = self.levels[i].get_many(keys)
                        items = [(k, v) for k, v in zip(keys, values) if v is not None]
                        unsure = self.unsure[i]
                        gone: list[bytes] = []
                        if guard and len(items) < len(keys):
                            # written there and gone since: reported once (the level below
                            # keeps its older copy, which reads return after)
                            gone = [k for k, v in zip(keys, values)
                                    if v is None and k not in unsure]
                        newer.difference_update(keys)
                        if unsure:
                            unsure.difference_update(keys)
                        if gone:
                            if lost is not None:
                                lost.extend((i, k) for k in gone)
                            else:
                                newer.update(gone)   # left for reads and the checkpoint
                        try:
                            self._write(i + 1, items)
                        except BaseException:
                            # The copy is still on level i; remember it is newer there.
                            newer.update(k for k, _ in items)
                            raise
                        self.stats.writeback["checkpoint_copies"] += len(items)
                    finally:
                        with self.lock:
                            self.wseq += 1
                size, limit = sum(len(v) for _, v in items), self.batch_bytes_max
                if limit is not None and items:
                    # the next batch's length from this one's bytes per entry
                    return pos + n, max(1, min(self.batch_size,
                                               len(items) * limit // max(1, size)))
                return pos + n, n
            pos, n = step() if retry is None else retry(step)
            if lost is None and pos < len(todo):
                # between two batches of an early copy (the job goes on meanwhile), let a
                # reader's miss or a put that needs room take the I/O lock (it is not fair)
                time.sleep(0)
        with self.io_lock:
            self._newer_base[i] = min(self._newer_base[i], len(self.newer[i]))


class LostWrites(Exception):
    """``copy_down`` found entries flushed to a level above the last gone from it: ``lost``
    holds ``(level index, byte key)``; the manager raises an IntegrityError naming them."""

    def __init__(self, lost: list[tuple[int, bytes]]) -> None:
        super().__init__(f"{len(lost)} entries lost")
        self.lost = lost
