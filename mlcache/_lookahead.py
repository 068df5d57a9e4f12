"""The lookahead operator ``prefetching(...)`` and its adaptive depth controller.

In a Python loop or a Spark partition the "upstream operator" of the Keyed Prefetching paper is
a read-ahead over the record iterator: the operator keeps ``depth`` records buffered, hints the
key of each record as it is read, and yields records in their original order. By the time a
record is yielded, its key has had ``depth`` records' worth of processing time to arrive.

Depth (``depth="auto"``): deep enough that the slack covers the fetch latency, no deeper (more
depth costs memory and hinted entries evict useful state). Every ``window`` hinted uses the
controller compares

* slack: time from a key's first hint to its use, at its 1st percentile — the slack that 99% of
  uses had at least ("p99 slack" in the issue), with
* the p99 fetch latency (hint to resident) plus a margin (1 ms + 50%: the fetch latency's own
  tail is heavy on a shared machine, and a late record costs far more than a deeper read-ahead),

and rescales the depth proportionally (slack grows linearly with depth): up to ×2 when the slack
falls short, down to ×0.5 when it exceeds the need by more than 50% (hysteresis keeps it from
oscillating). A slower backend lengthens the latency and the depth grows; a faster one shrinks it.
It does not grow while the fetch threads are saturated (a backlog of whole batches keeps waiting
behind them): then the latency is queueing, which a deeper read-ahead would only lengthen; nor
while the distinct keys of the records read ahead — each held in the heap for its record, either
prefetched or renewed by TAC's hint — reach half the heap's entry bound, and it is scaled down
to fit that bound when they exceed it.

Between two records the operator also does the prefetcher's GIL-bound work on its own thread
(see :mod:`mlcache.prefetch`): it installs reads the fetch threads staged, replays buffered heap
hits to the policy, and -- when batches are read inline -- reads one once ``batch_size`` keys are
queued or half the depth was read since the last one (at once when the input is exhausted),
never including the key of the record it is about to hand over: that record's own wait stays in
its own get. With split reads (an unbounded Redis on top) a batch is sent in one record and its
reply taken in a later one; a record whose key is in the read still out waits for that reply.
The records are read ahead 8 at a time, and a record does at most one of the heavier tasks
(taking a reply, installing, sending a batch, reading ahead): the slowest records are the
operator's tail latency, and the median record carries none of them. Inline, latency and slack
are measured from the start of the read (the operator chose when to read), and the depth is
kept at two batches' worth of records at least, so that batches can fill.
"""
from __future__ import annotations

import itertools
import math
import numbers
import sys
from collections import deque
from typing import Any, Callable, Iterable, Iterator

from .errors import CacheError, CapacityError, IntegrityError, LevelUnavailableError

__all__ = ["prefetching", "DepthController", "RecordKeyError", "Lookahead"]

# staged reads installed per record handed over: more than the keys a record can add, so the
# stage drains as fast as the fetch threads fill it
_INSTALL_PER_RECORD = 8
# the same with split reads (their batches are small and come in use order)
_INSTALL_SPLIT = 2
# records between two polls of an outstanding split read
_POLL_EVERY = 4
# buffered heap hits replayed to the policy by the operator between records (the manager
# replays them itself at 64, inside a get)
_REPLAY_AT = 16
# records read ahead at a time, once the read-ahead falls below the depth
_READ_CHUNK = 8


def _bad_ts(t: Any) -> bool:
    """True unless ``t`` is an event time: a real number, not NaN, that float() can hold
    (ints past the largest float do not: float arithmetic on them raises OverflowError)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or t != t:
        return True
    try:
        float(t)
    except (OverflowError, TypeError, ValueError):   # OverflowError: past the largest float
        return True
    return False


def _magnitude(t: Any) -> str:
    try:
        return f"10**{len(str(abs(int(t)))) - 1}"
    except ValueError:   # past sys.get_int_max_str_digits()
        return f"2**{abs(int(t)).bit_length() - 1}"


def _describe_ts(t: Any) -> str:
    if isinstance(t, numbers.Real) and not isinstance(t, bool) and t == t:
        return (f"a number too large in magnitude for an event time (a float, at most "
                f"{sys.float_info.max!r}): {type(t).__name__}, about {_magnitude(t)}")
    return f"{t!r}, not a number"


class RecordKeyError(CacheError):
    """``key=`` (or ``ts=``) failed for a record, or returned an unsupported key type.

    ``index`` is the record's position in the input, ``record`` the record itself; the original
    exception is the ``__cause__``.
    """

    def __init__(self, message: str, *, index: int, record: Any) -> None:
        super().__init__(message)
        self.index = index
        self.record = record


def _quantile(data: list[float], q: float) -> float | None:
    if not data:
        return None
    data = sorted(data)
    return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]


class DepthController:
    """Keeps the lookahead depth where slack p1 >= fetch-latency p99 + margin, no deeper."""

    def __init__(self, initial: int = 32, *, min_depth: int = 4, max_depth: int = 8192,
                 margin: float = 0.001, margin_ratio: float = 0.5, window: int = 128,
                 hysteresis: float = 1.5) -> None:
        if not (1 <= min_depth <= initial <= max_depth):
            raise ValueError("need 1 <= min_depth <= initial <= max_depth")
        self.depth = initial
        self.min_depth = min_depth
        self.max_depth = max_depth
        self.margin = margin
        self.margin_ratio = margin_ratio
        self.window = window
        self.hysteresis = hysteresis
        self._slack: list[float] = []
        self.history: list[int] = [initial]

    def observe(self, slack: float) -> bool:
        """Add one slack sample; True when a window is complete and :meth:`update` is due."""
        self._slack.append(slack)
        return len(self._slack) >= self.window

    def limit(self, max_depth: int) -> int:
        """Cap the depth (a memory bound, not a latency signal)."""
        d = self.depth
        self.depth = max(self.min_depth, min(d, max_depth))
        if self.depth != d:
            self.history.append(self.depth)
        return self.depth

    def need(self, latencies: list[float]) -> float | None:
        lat = _quantile(latencies, 0.99)
        if lat is None:
            return None
        return lat + self.margin + self.margin_ratio * lat

    def update(self, latencies: list[float], may_grow: bool = True) -> int:
        """Rescale the depth from the slack window and recent fetch latencies.

        ``may_grow=False`` holds the depth where it is when the slack falls short: the caller
        knows more depth would not help (the fetch threads are saturated, so the latency is
        queueing) or would cost too much (too many prefetched entries already wait).
        """
        slack = _quantile(self._slack, 0.01)
        self._slack = []
        need = self.need(latencies)
        if slack is None or need is None:
            return self.depth
        d = self.depth
        if slack < need:
            if not may_grow:
                return d
            factor = min(2.0, need / max(slack, 1e-6))
            new = max(d + 1, math.ceil(d * factor))
        elif slack > need * self.hysteresis:
            factor = max(0.5, need * 1.2 / slack)
            new = math.floor(d * factor)
        else:
            new = d
        self.depth = min(self.max_depth, max(self.min_depth, new))
        if self.depth != d:
            self.history.append(self.depth)
        return self.depth


def _resolve(cache: Any) -> tuple[Any, Callable[[Any], bytes]]:
    """``(manager, encode)`` for a manager, a namespace or a structure.

    ``encode`` turns a user key into the canonical bytes the cache object itself uses (a
    namespace or a structure prefixes its own key space); the manager owns the prefetcher.
    """
    fn = getattr(cache, "_prefetch_target", None)
    if callable(fn):
        return fn()
    if callable(getattr(cache, "_get_prefetcher", None)):
        return cache, cache._encode_key
    for attr in ("manager", "_manager"):
        m = getattr(cache, attr, None)
        if m is None or not callable(getattr(m, "_get_prefetcher", None)):
            continue
        for owner in (cache, getattr(cache, "_ns", None), getattr(cache, "namespace", None)):
            enc = getattr(owner, "_encode_key", None)
            if callable(enc):
                return m, enc
        return m, m._encode_key
    raise TypeError(
        "prefetching(cache=...) needs a CacheManager, a Namespace or a cacheable structure, "
        f"not {type(cache).__name__}")


def _prefetcher(m: Any) -> Any:
    """The manager's prefetcher (the one ``hint`` uses), or ``None`` when disabled."""
    return m._get_prefetcher()


class Lookahead(Iterator[Any]):
    """The iterator returned by :func:`prefetching`. ``depth`` is the current lookahead."""

    def __init__(self, iterable: Iterable[Any], key: Callable[[Any], Any],
                 ts: Callable[[Any], float] | None, cache: Any, depth: int | str) -> None:
        if not callable(key):
            raise TypeError("prefetching(key=...) must be a callable record -> key")
        if ts is not None and not callable(ts):
            raise TypeError("prefetching(ts=...) must be a callable record -> event time or None")
        self._m, self._encode = _resolve(cache)
        self._pf = _prefetcher(self._m)
        if depth == "auto":
            heap = self._m.config.heap
            # Entries held for records read ahead wait in the heap beside the state in use.
            self._max_waiting = 0      # 0: a byte-bounded heap, measured as it fills
            if heap is not None and heap.max_entries:
                self._max_waiting = max(4, heap.max_entries // 2)
            self.controller: DepthController | None = DepthController(32, max_depth=1 << 16)
            self.depth = self.controller.depth
        elif isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0:
            self.controller = None
            self.depth = depth
        else:
            raise ValueError(f"prefetching(depth=...) must be 'auto' or an int >= 0, got {depth!r}")
        self._src = iter(iterable)
        # Without ts= a record's event time is a sequence number drawn from the manager, so
        # operators run one after the other (or side by side) on one manager share one clock.
        self._seq = getattr(self._m, "_event_seq", None) or itertools.count()
        self._advance = getattr(self._m, "_advance_clock", None)
        self._key = key
        self._ts = ts
        self._queue: deque[tuple] = deque()
        self._window_keys: dict[bytes, int] = {}   # distinct keys read ahead -> records
        self._index = 0
        self._pumped = 0      # records read when the operator last read a batch itself
        batch = self._pf.config.batch_size if self._pf is not None else 1
        self._batch = batch
        self._every = max(1, self.depth // 2)      # records read at most between its batches
        self._full = min(batch, self._every)       # keys queued that make a batch worth it
        self._warmup = self.depth + 1
        self._exhausted = False
        self.records = 0
        # staged reads installed per record: split reads come a few keys at a time and each
        # install (decode, insert, the victim it evicts) costs ~15 us on the record it lands in
        self._install = _INSTALL_PER_RECORD
        if self._pf is not None:
            self._pf.depth = self.depth
            split, batch = self._pf.attach(self)
            if split:
                self._install = _INSTALL_SPLIT
            self._batch = min(self._batch, batch)
            self._full = min(self._batch, self._every)

    def __iter__(self) -> "Lookahead":
        return self

    def _read(self) -> bool:
        try:
            rec = next(self._src)
        except StopIteration:
            self._exhausted = True
            return False
        except Exception as exc:
            # The input itself failed: the records read before are handed over first and its
            # error comes where a plain loop over the input would meet it (raised here, it
            # reached the caller up to ``depth`` records early, and those records were lost).
            self._exhausted = True
            self._queue.append((None, None, None, self._index, exc))
            return True
        i = self._index
        self._index += 1
        try:
            k = self._key(rec)
            t = self._ts(rec) if self._ts is not None else next(self._seq)
        except Exception as exc:
            err = RecordKeyError(f"record {i}: key=/ts= raised {exc!r}", index=i, record=rec)
            err.__cause__ = exc
            self._queue.append((rec, None, None, i, err))
            return True
        # one expression, cheapest for ints (the sequence numbers used without ts=): an int
        # below 2**1023 fits a float; anything else but a float, or a NaN, is looked at
        if (t.bit_length() > 1023 if t.__class__ is int
                else (t.__class__ is not float or t != t)) and _bad_ts(t):
            # a None, a string or NaN failed later inside the policy or the hint buffer with
            # an error naming neither the record nor ts= (or, NaN, was taken silently); an int
            # past the largest float passed, and the clock's float arithmetic then raised an
            # OverflowError from the read-ahead of a later record
            self._queue.append((rec, None, None, i, RecordKeyError(
                f"record {i}: ts= returned {_describe_ts(t)}", index=i, record=rec)))
            return True
        try:
            kb = self._encode(k)
        except TypeError as exc:
            err = RecordKeyError(f"record {i}: key= returned an unsupported key type "
                                 f"{type(k).__name__}: {exc}", index=i, record=rec)
            err.__cause__ = exc
            self._queue.append((rec, None, None, i, err))
            return True
        except Exception as exc:
            # any other failure to encode the key (a tuple nested past the recursion limit)
            # is this record's too: raised here, it escaped from the read-ahead, records early
            err = RecordKeyError(f"record {i}: key= returned a key that cannot be encoded "
                                 f"({type(k).__name__}): {exc!r}", index=i, record=rec)
            err.__cause__ = exc
            self._queue.append((rec, None, None, i, err))
            return True
        if self._pf is not None and self.depth > 0:
            self._pf.hint(kb, t)
            wk = self._window_keys
            wk[kb] = wk.get(kb, 0) + 1
        self._queue.append((rec, kb, t, i, None))
        return True

    def __next__(self) -> Any:
        q = self._queue
        pf = self._pf
        if pf is not None:
            # Between two records, on this thread: install what the fetch threads read (the
            # decoding and heap inserts hold the GIL, so they run here rather than stall a
            # record from another thread), and read a batch here when that is where the
            # prefetcher reads them (see Prefetcher.pump).
            m = self._m
            # At most one of the heavier tasks per record (taking a split read's reply,
            # installing staged reads, sending a batch, reading a chunk ahead: each ~30-60 us
            # here), so that no record carries several: the slowest records are the keyed
            # path's tail latency. Each has slack (the read-ahead is deep), and together they
            # run in well under half the records, so the median record carries none.
            # (a poll is a system call, ~4 us here, while the reply takes ~15 records to come:
            # asked every _POLL_EVERY records, so that most records pay none)
            busy = (pf._reading is not None and not self.records % _POLL_EVERY
                    and pf.poll_read())
            if len(m._reads_ts) + len(m._reads) >= _REPLAY_AT:
                # the heap hits of the records handed over so far reach the policy here,
                # between records, rather than inside the get of whichever record fills the
                # manager's read buffer (64 policy updates: tens of microseconds)
                with m._lock:
                    m._apply_reads()
            if pf._staged and not busy:
                busy = pf.install(self._install) > 0 or busy
            pending = len(pf._buffer.pending)
            if pending and not busy:
                # a full batch, or whatever waits once half the read-ahead was read since
                # the last batch: no key waits for its batch longer than that, so every key
                # is read at least half the depth before its record
                # (once the input is exhausted, no later record will fill a batch: read now)
                due = self._exhausted or self._index - self._pumped >= self._every
                full = self._full
                if (due or pending >= full) and pf.pump(q[0][1] if q else None,
                                                        1 if due else full):
                    self._pumped = self._index
                    busy = True
        else:
            busy = False
        if (len(q) <= self.depth and not self._exhausted
                and (not busy or len(q) < max(1, self.depth - _READ_CHUNK))):
            # Read ahead in chunks: one record in _READ_CHUNK pays for the reading and hinting
            # of _READ_CHUNK later ones, the others none (the total is the same; the median
            # record no longer carries a read-ahead it does not need yet).
            want = self.depth + _READ_CHUNK
            read = self._read
            while len(q) < want and not self._exhausted:
                read()
        if not q:
            if pf is not None:
                pf.detach(self)
            raise StopIteration
        rec, kb, t, i, err = q.popleft()
        if err is not None:
            raise err
        wk = self._window_keys
        n = wk.get(kb)
        if n is not None:
            if n > 1:
                wk[kb] = n - 1
            else:
                del wk[kb]
        self.records += 1
        # The record's get/put calls that follow happen at its event time: an event-time
        # policy (TAC) stamps those without ts= with it, so an entry just used is older than
        # every entry hinted for a record still read ahead.
        if self._advance is not None:
            self._advance(t)
        pf = self._pf
        if pf is None:
            return rec
        r = pf._reading
        if r is not None and kb in r.wanted:
            pf.poll_read(block=True)    # this record's key is in the read on its way: wait
        slack = pf.note_use(kb, t)
        if pf._failed:
            self._recover(kb, i)
        ctl = self.controller
        # the first records were hinted just before their use: their slack says nothing
        if ctl is not None and slack is not None and i >= self._warmup and ctl.observe(slack):
            # Every distinct key in the window is held in the heap for its record: prefetched,
            # or renewed by TAC's hint. They may take half the heap's entries, whatever the
            # slack says.
            held = max(len(self._window_keys), pf.waiting())
            cap = self._max_waiting or max(64, len(getattr(self._m, "_data", ())) // 2)
            # Read inline, a batch is cheap only when full: keep room for one to fill while
            # the one before is used (two batches' worth of records), the memory cap allowing.
            ctl.min_depth = min(2 * self._batch, max(4, cap)) if pf.inline else 4
            ctl.update(pf._cold.fetch_latency.recent(256), not pf.saturated and held < cap)
            if held:
                # held keys grow about linearly with the records read ahead: stay where they
                # would fit the cap
                ctl.limit(len(self._queue) * cap // held)
            self.depth = ctl.depth
            pf.depth = self.depth
            self._every = max(1, self.depth // 2)
            self._full = min(self._batch, self._every)
        return rec

    def _recover(self, kb: bytes, index: int) -> None:
        """The prefetch of this record's key failed: demand-fetch it now; raise if that fails."""
        pf = self._pf
        prefetch_error = pf.failure(kb)
        if prefetch_error is None:
            return
        try:
            with pf.demand():
                self._m._load_into_heap([kb])
        except Exception as exc:
            # Told as a get of the key tells it: corrupt stored bytes stay an IntegrityError
            # (not retryable), a closed manager a CacheError, and a level that refuses this
            # process (a password the server wants) stays not retryable; the key is the
            # user's. Made a retryable LevelUnavailableError naming the key's bytes, they
            # told the caller to retry reads that can only fail again.
            cls: type[CacheError] = LevelUnavailableError
            if isinstance(exc, IntegrityError):
                cls = IntegrityError
            elif isinstance(exc, CapacityError):
                cls = CapacityError
            elif isinstance(exc, CacheError) and not isinstance(exc, LevelUnavailableError):
                cls = CacheError
            err = cls(
                f"record {index}: the prefetch failed ({prefetch_error!r}) and the demand fetch "
                f"failed too ({exc!r})", level=getattr(exc, "level", None),
                key=self._m._describe_key(kb))
            if isinstance(exc, CacheError):
                err.retryable = exc.retryable
            err.prefetch_error = prefetch_error  # type: ignore[attr-defined]
            err.index = index  # type: ignore[attr-defined]
            raise err from exc

    def close(self) -> None:
        """Stop reading ahead and drop buffered records (and close the source if it can)."""
        self._queue.clear()
        self._exhausted = True
        if self._pf is not None:
            self._pf.detach(self)
        closer = getattr(self._src, "close", None)
        if callable(closer):
            closer()


def prefetching(iterable: Iterable[Any], key: Callable[[Any], Any], *,
                ts: Callable[[Any], float] | None = None, cache: Any,
                depth: int | str = "auto") -> Lookahead:
    """Yield the records of ``iterable`` in order while prefetching their keys' state.

    ``key(record)`` is the key the stateful step will read from ``cache`` (a
    :class:`~mlcache.CacheManager`, a namespace or a cacheable structure); ``ts(record)`` its
    event time (default: a sequence number from the manager, increasing across operators). The
    time goes to the record's hint and, as the policy's "now", to the gets and puts made while
    the record is processed. ``depth`` is the number of records read ahead,
    or ``"auto"`` to adapt it to the measured fetch latency. A failing ``key``/``ts`` raises
    :class:`RecordKeyError` naming the record index when that record is reached; an error
    raised by ``iterable`` itself comes after the records read before it, as in a plain loop.
    """
    return Lookahead(iterable, key, ts, cache, depth)
