"""How tuples enter a sliding window: one at a time, in batches, or late.

SlideM writes each tuple once, at the head of the window, into the *recent* block; this module
is that write, kept apart from the engine in :mod:`.window` (blocks, expiry, slides, results)
because it is the per-event cost and is written for it:

* ``append`` is bound once per window to the path for its records (numeric time, numeric
  count, general), so a numeric tuple costs a comparison with the watermark and two numpy
  stores; a full block is sealed (SlideM's Procedure 1) and aggregates are updated a block
  slice at a time, not per tuple.
* ``extend`` is the vectorised path: an in-order numeric batch is copied into blocks a slice
  at a time, split at slide boundaries, with one partial aggregate per slice for every window.
* A tuple behind the watermark by at most ``lateness`` goes to a small per-window heap rather
  than into the blocks, so blocks stay sorted by time; a later one raises or, with
  ``on_late="drop"``, is counted and dropped.

A record is checked before it changes anything: a refused record never moves the watermark.
Mixed into the engine: a method found through the class costs a call nothing more.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._window_agg import _PLAIN_KEYS, WindowState, _hashable

__all__ = ["WindowArrival"]

_F8 = np.float64
_INF = math.inf
_NINF = -math.inf
_TEXT = (str, bytes)   # a record that is text is refused, not read as one number per column
_INFINITE_TS = "a sliding time window needs finite timestamps, got inf"


def _check_slide_ts(ts: float, slide: float) -> None:
    """A timestamp a sliding time window can place on its grid of boundaries ``k * slide``:
    finite, and small enough that floats near it are closer than ``slide``. Past that,
    ``(k + 1) * slide`` rounds back to ``k * slide`` (``ts=2e16``, ``slide=1``: floats there are
    4 apart) and the next boundary never passed the tuple: append looped for ever, calling
    ``on_slide`` at the same boundary. ``-inf`` is let through (it fixes no grid and expires at
    once, as on a window without slides)."""
    if ts == _INF:  # infinitely many boundaries precede it
        raise ValueError(_INFINITE_TS)
    if ts > _NINF and math.ulp(ts) >= slide:
        raise ValueError(f"timestamp {ts!r} is too large for slide={slide!r}: floats there are "
                         f"{math.ulp(ts):g} apart, so slide boundaries cannot be told apart "
                         f"(use timestamps relative to a recent origin, or a coarser slide)")


def _ts_error(ts: Any) -> ValueError:
    if ts is None:
        return ValueError("a time window needs a numeric timestamp, its event time, for each "
                          "tuple: append(record, ts=...)")
    return ValueError(f"a time window needs a numeric timestamp, got {ts!r}")


class _Cold:
    """A window's state that ``append`` never reads: what it does with late tuples, their
    counters and how the window releases its files.

    Kept apart so that a window has few attributes: CPython 3.11 keeps an object's attributes
    in a compact array read at a fixed offset only while its class's instances have fewer than
    30 attribute names; past that they all live in a dict and each ``self._x`` of ``append``
    (~6 a tuple) is a hashed lookup (LOAD_ATTR_WITH_HINT). A window had 30 (33 over column and
    general windows), now 24 (27). ``tests/test_window.py`` keeps the count down."""

    __slots__ = ("finalizer", "late_accepted", "late_dropped", "late_seq", "on_late", "own_dir",
                 "recomputes")

    late_accepted: int  # late tuples kept (``lateness``)
    late_dropped: int   # late tuples dropped (``on_late="drop"``)
    late_seq: int       # ties among late tuples of one timestamp keep arrival order
    on_late: str        # "raise" or "drop" a tuple later than ``lateness``
    own_dir: bool       # the directory is a temporary one, removed by close()
    finalizer: Any      # weakref.finalize releasing the data file (and a temporary directory)
    recomputes: int     # exact recomputations of a window's sums (``_Windows._recompute``)

    def __init__(self) -> None:
        self.late_accepted = self.late_dropped = self.late_seq = self.recomputes = 0


class WindowArrival:
    """``append``, ``extend`` and late tuples, mixed into the window engine (module doc)."""

    kind: str
    slide: float | None
    columns: tuple[str, ...] | None
    block_size: int
    lateness: float
    _cold: _Cold
    _codec: Any
    _cur: Any
    _wm: float
    _next_slide: float
    _wins: list[WindowState]
    _vi: int | None  # the value and weight columns of a numeric window
    _wi: int | None
    _vf: Callable[[Any], Any] | None  # and of a general one
    _wf: Callable[[Any], Any] | None
    _gf: Callable[[Any], Any] | None  # the group key of a general record

    if TYPE_CHECKING:  # the engine's steps (structures.window._Windows)
        def _check_open(self) -> None: ...
        def _partial(self, ts: Any, data: Any, lo: int, hi: int) -> Any: ...
        def _apply_pending(self) -> None: ...
        def _seal(self) -> None: ...
        def _expire(self, now: float | None = None) -> None: ...
        def _slide_to(self, ts: float) -> None: ...
        def _slide_count(self) -> None: ...

    def append(self, record: Any, ts: float | None = None) -> None:
        """Add one tuple (``ts``: its event time; optional for count windows)."""
        self._pick_append()(record, ts)

    def _pick_append(self) -> Callable[..., None]:
        if self.columns is None:
            return self._append_general
        return self._append_time if self.kind == "time" else self._append_count

    def _append_time(self, record: Sequence[float], ts: float | None = None) -> None:
        """Add one tuple with event time ``ts`` (the per-event path: a few numpy stores)."""
        try:
            if not ts >= self._wm:  # type: ignore[operator]  # (also False for NaN)
                if ts != ts:
                    raise ValueError("a time window needs numeric timestamps, got NaN")
                return self._late(record, ts)  # type: ignore[arg-type]
        except TypeError:
            raise _ts_error(ts) from None
        cur = self._cur
        i = cur.n
        try:
            cur.data[i] = record   # first: a refused record must not move the watermark
            if len(record) != self._codec.ncols or isinstance(record, _TEXT):
                # (numpy broadcast a short one to the row, and a string's number: "123" on
                # three columns was (123, 123, 123))
                self._short_record(record)
        except (ValueError, TypeError):
            self._short_record(record)
        # finite value and weight (row i is not counted until cur.n moves: a refusal leaves
        # nothing); read from the record, a float compare, else from the stored row
        vi = self._vi
        if vi is not None:
            try:
                if not _NINF < record[vi] < _INF:
                    raise self._not_finite(record)
            except (TypeError, IndexError):
                if not _NINF < float(cur.data[i, vi]) < _INF:
                    raise self._not_finite(record) from None
        wi = self._wi
        if wi is not None:
            try:
                if not _NINF < record[wi] < _INF:
                    raise self._not_finite(record)
            except (TypeError, IndexError):
                if not _NINF < float(cur.data[i, wi]) < _INF:
                    raise self._not_finite(record) from None
        # (ts is a number here: None or any other type failed the watermark test above)
        if ts > self._next_slide:  # type: ignore[operator]
            self._slide_to(ts)  # type: ignore[arg-type]  # row i is not counted yet, cur kept
        self._wm = ts  # type: ignore[assignment]
        cur.ts[i] = ts
        cur.n = i + 1
        if i + 1 == self._codec.capacity:
            self._seal()

    def _append_count(self, record: Sequence[float], ts: float | None = None) -> None:
        cur = self._cur
        i = cur.n
        try:
            cur.data[i] = record
            if len(record) != self._codec.ncols or isinstance(record, _TEXT):
                self._short_record(record)
        except (ValueError, TypeError):
            self._short_record(record)
        vi = self._vi   # finite value and weight: as _append_time checks them
        if vi is not None:
            try:
                if not _NINF < record[vi] < _INF:
                    raise self._not_finite(record)
            except (TypeError, IndexError):
                if not _NINF < float(cur.data[i, vi]) < _INF:
                    raise self._not_finite(record) from None
        wi = self._wi
        if wi is not None:
            try:
                if not _NINF < record[wi] < _INF:
                    raise self._not_finite(record)
            except (TypeError, IndexError):
                if not _NINF < float(cur.data[i, wi]) < _INF:
                    raise self._not_finite(record) from None
        cur.ts[i] = 0.0 if ts is None else ts
        cur.n = i + 1
        if i + 1 == self._codec.capacity:
            self._seal()
        if cur.start + i + 1 >= self._next_slide:
            self._slide_count()

    def _append_general(self, record: Any, ts: float | None = None,
                        size: int | None = None) -> None:
        """(``size``: the record's, from ``extend``, which checked the record and passes
        its snapshot already.)"""
        if self.kind == "time":
            try:
                if not ts >= self._wm:  # type: ignore[operator]
                    if ts != ts:   # NaN would become the watermark: no tuple would be late
                        raise ValueError("a time window needs numeric timestamps, got NaN")
                    return self._late(record, ts)  # type: ignore[arg-type]
            except TypeError:
                raise _ts_error(ts) from None
        if size is None:  # first: a refused record changes nothing
            record, size = self._codec.snapshot(record)   # a copy: the caller may reuse its own
            self._check_general(record)
        if self.kind == "time":
            if ts > self._next_slide:  # type: ignore[operator]
                self._slide_to(ts)  # type: ignore[arg-type]
            self._wm = ts  # type: ignore[assignment]
        if self._cur.nbytes + size > self.block_size:
            self._seal()
        cur = self._cur
        cur.ts.append(0.0 if ts is None else float(ts))
        cur.data.append(record)
        cur.nbytes += size
        cur.n += 1
        if self.kind == "count" and cur.start + cur.n >= self._next_slide:
            self._slide_count()

    def _not_finite(self, record: Any) -> ValueError:
        """The sums are kept by adding a tuple when it arrives and subtracting it when it
        expires: a NaN or infinite value or weight (nan - nan, inf - inf) would leave every
        later result NaN, long after its tuple left. Refused, as a bad record."""
        return ValueError(f"a window's values and weights must be finite numbers, got "
                          f"{record!r}")

    def _check_general(self, record: Any) -> None:
        """A general window's value and weight of ``record``: finite numbers; its group key:
        hashable. (The key is read when the block's aggregates are taken, at a seal, a slide
        or a result: an unhashable one, a dict, failed there, for the record appended and at
        every later seal or result, the window stuck for good.)"""
        gf = self._gf
        if gf is not None:
            k = gf(record)
            if type(k) not in _PLAIN_KEYS:
                try:
                    hash(_hashable(k))
                except TypeError:
                    raise ValueError(f"a window's group keys must be hashable, got {k!r} from "
                                     f"{record!r}") from None
        for f in (self._vf, self._wf):
            if f is not None:
                x = f(record)
                try:
                    ok = -_INF < x < _INF
                except TypeError:
                    raise ValueError(f"a window's values and weights must be numbers, got "
                                     f"{x!r} from {record!r}") from None
                if not ok:
                    raise self._not_finite(record)

    def _check_batch(self, records: list, tss: list) -> list[tuple[Any, int]]:
        """What ``append`` would refuse in a batch of general records, checked before any of
        them goes in: each record's encoding (its snapshot and size, returned) and value and
        weight, and on a time window each timestamp against the watermark the batch moves."""
        snaps = [self._codec.snapshot(rec) for rec in records]
        for rec, _ in snaps:
            self._check_general(rec)
        if self.kind == "time":
            wm = self._wm
            raising = self._cold.on_late == "raise"
            for t in tss:
                try:
                    if not t >= wm:
                        if t != t:
                            raise ValueError("a time window needs numeric timestamps, got NaN")
                        if raising and t < wm - self.lateness:
                            raise self._late_error(t, wm)
                        continue
                except TypeError:
                    raise _ts_error(t) from None
                if self.slide is not None:
                    _check_slide_ts(t, self.slide)
                wm = t
        return snaps

    def _check_rows(self, rows: np.ndarray) -> None:
        """A batch of numeric records: finite values and weights, else refused whole."""
        for c in (self._vi, self._wi):
            if c is not None:
                bad = np.flatnonzero(~np.isfinite(rows[:, c]))
                if len(bad):
                    raise ValueError(f"a window's values and weights must be finite numbers: "
                                     f"record {int(bad[0])} of the batch is "
                                     f"{tuple(rows[bad[0]].tolist())!r}")

    def _short_record(self, record: Any) -> None:
        """Raise for a numeric record that is not one number per column; except a plain
        number on a window of one column. A row store broadcasts what it is given: a number,
        or a record of one number, was copied into every column (``(7.0,)`` on columns
        ``("g", "v", "w")`` was the tuple ``(7, 7, 7)``), a value and weight never given."""
        if self._codec.ncols == 1 and np.ndim(record) == 0 and not isinstance(record,
                                                                                (str, bytes)):
            try:
                self._cur.data[self._cur.n] = record
                return
            except (ValueError, TypeError):
                pass
        raise self._bad_record(record) from None

    def _bad_record(self, record: Any) -> ValueError:
        assert self.columns is not None
        return ValueError(f"a record of this window is {len(self.columns)} numbers "
                          f"{self.columns}, got {record!r}")

    def extend(self, batch: Any, ts: Any = None) -> None:
        """Add many tuples: ``extend(records, ts)`` with parallel sequences or numpy arrays (the
        vectorised path for numeric windows), or ``extend(pairs)`` of ``(record, ts)``. A batch
        is refused whole: a bad record or timestamp anywhere leaves the window unchanged."""
        self._check_open()
        if ts is None and self.kind == "time":
            pairs = list(batch)
            for p in pairs:
                try:
                    pair = len(p) == 2
                except TypeError:
                    pair = False
                if not pair:
                    raise ValueError(f"extend() on a time window needs the event times: "
                                     f"extend(records, ts=...) or (record, ts) pairs; got "
                                     f"{p!r} as a pair")
            batch = [p[0] for p in pairs]
            ts = [p[1] for p in pairs]
        if self.columns is None:
            records = list(batch)   # any iterable, a generator too
            tss = [None] * len(records) if ts is None else list(ts)
            # zip would drop the records past the shorter side without a word
            if len(tss) != len(records):
                raise ValueError(f"extend() got {len(records)} records and {len(tss)} "
                                 "timestamps")
            # a refused batch changes nothing, as a numeric one: checked whole first (it went
            # in a record at a time, so a bad record at i left records 0..i-1 in the window)
            snaps = self._check_batch(records, tss)
            append = self._append_general
            for (rec, size), t in zip(snaps, tss):
                append(rec, t, size)
            return
        if not hasattr(batch, "__len__"):
            batch = list(batch)   # numpy reads a generator as one object
        rows = np.asarray(batch, _F8)
        n = len(rows)
        if n == 0:
            return
        if rows.ndim == 1 and len(self.columns) == 1:
            rows = rows.reshape(n, 1)
        if rows.ndim != 2 or rows.shape[1] != len(self.columns):
            raise ValueError(f"extend() needs records of {len(self.columns)} numbers "
                             f"{self.columns}, got an array of shape {rows.shape}")
        tsa = np.zeros(n, _F8) if ts is None else np.asarray(ts, _F8).reshape(-1)
        if len(tsa) != n:
            raise ValueError(f"extend() got {n} records and {len(tsa)} timestamps")
        self._check_rows(rows)
        if self.kind == "count":
            self._ingest_count(rows, tsa)
            return
        # (every comparison with a NaN is False, so a NaN anywhere takes the checked path)
        if tsa[0] >= self._wm and (tsa[1:] >= tsa[:-1]).all():
            if self.slide is not None:  # before any of the batch goes in
                _check_slide_ts(float(tsa[-1]), self.slide)
                _check_slide_ts(float(tsa[0]), self.slide)
            self._ingest_time(rows, tsa)  # in order: the common case
            return
        if np.isnan(tsa).any():
            raise ValueError("a time window needs numeric timestamps, got NaN")
        if self.slide is not None:
            _check_slide_ts(float(tsa.max()), self.slide)
            _check_slide_ts(float(tsa.min()), self.slide)
        prev = np.maximum.accumulate(np.concatenate(([self._wm], tsa[:-1])))
        late = np.flatnonzero(tsa < prev)
        if len(late) == 0:
            self._ingest_time(rows, tsa)
            return
        too_late = late[tsa[late] < prev[late] - self.lateness]
        if len(too_late) and self._cold.on_late == "raise":
            i = int(too_late[0])
            raise self._late_error(float(tsa[i]), float(prev[i]))
        pos = 0
        for i in late.tolist():  # in-order runs go the vectorised way, late tuples one by one
            if i > pos:
                self._ingest_time(rows[pos:i], tsa[pos:i])
            self._late(tuple(rows[i].tolist()), float(tsa[i]))
            pos = i + 1
        if pos < n:
            self._ingest_time(rows[pos:], tsa[pos:])

    def _ingest_time(self, rows: np.ndarray, tsa: np.ndarray) -> None:
        pos, n = 0, len(rows)
        while pos < n:
            end = n
            if self._next_slide < math.inf:  # stop at the next slide boundary
                end = pos + int(np.searchsorted(tsa[pos:], self._next_slide, "right"))
            if end > pos:
                self._wm = float(tsa[end - 1])
                self._store(rows[pos:end], tsa[pos:end])
                self._expire()
            if end < n:
                self._slide_to(float(tsa[end]))
            pos = end

    def _ingest_count(self, rows: np.ndarray, tsa: np.ndarray) -> None:
        pos, n = 0, len(rows)
        while pos < n:
            total = self._cur.start + self._cur.n
            end = n if self._next_slide == math.inf else min(n, pos + self._next_slide - total)
            self._store(rows[pos:end], tsa[pos:end])
            self._expire()
            pos = end
            if self._cur.start + self._cur.n >= self._next_slide:
                self._slide_count()

    def _store(self, rows: np.ndarray, tsa: np.ndarray) -> None:
        """Copy a batch into blocks; its partial aggregate goes to every window at once."""
        if not len(rows):
            # (a count window whose boundary is still due, its on_slide having raised, gets
            # an empty slice before it: a grouped window's partial of no rows has no codes,
            # and every later extend failed with numpy's "zero-size array to reduction")
            return
        self._apply_pending()
        p = self._partial(tsa, rows, 0, len(rows))
        for w in self._wins:
            w.add(p)
        cap = self._codec.capacity
        pos, n = 0, len(rows)
        while pos < n:
            cur = self._cur
            k = min(cap - cur.n, n - pos)
            cur.ts[cur.n: cur.n + k] = tsa[pos: pos + k]
            cur.data[cur.n: cur.n + k] = rows[pos: pos + k]
            cur.n += k
            cur.applied = cur.n
            pos += k
            if cur.n == cap:
                # expiring as each block is sealed, as append does, gives the slots of the
                # blocks the windows have passed back before the next block is written: a
                # batch sealed whole first grew the data file to the batch, not the window
                # (extend of 200,000 ticks into a window of 5 blocks: 780 slots, 3 MB)
                self._seal()

    def _late(self, record: Any, ts: float) -> None:
        if ts < self._wm - self.lateness:
            if self._cold.on_late == "drop":
                self._cold.late_dropped += 1
                return
            raise self._late_error(ts, self._wm)
        if self.columns is not None:
            row = np.asarray(record, _F8).reshape(1, -1)
            if row.shape[1] != len(self.columns):
                raise self._bad_record(record)
            self._check_rows(row)
            record = tuple(row[0].tolist())
            p = self._partial(np.array([ts]), row, 0, 1)
        else:
            record = self._codec.snapshot(record)[0]   # kept in the heap: a copy
            self._check_general(record)
            p = self._partial(np.array([ts]), [record], 0, 1)
        cold = self._cold
        cold.late_accepted += 1
        cold.late_seq += 1
        for w in self._wins:
            if self.kind == "count" or ts > self._wm - w.range:
                w.add(p)
                heapq.heappush(w.late, (ts, cold.late_seq, record))

    def _late_error(self, ts: float, wm: float) -> ValueError:
        return ValueError(f"timestamp {ts!r} is {wm - ts:g} behind the watermark {wm!r}, beyond "
                          f"the allowed lateness of {self.lateness:g} (set lateness= to accept "
                          f"it, or on_late='drop' to count and drop such tuples)")
