"""Sliding windows bigger than memory: SlideM and Shared SlideM (SSM).

``SlidingWindow(range)`` keeps the tuples of one time- or count-based window in a block
repository (:mod:`._window_blocks`): the recent block being filled and the ancient block being
expired stay in memory, everything in between lives in a data file, and the SlideM policy decides
what leaves the buffer pool. Aggregates (count, sum, avg, var, optionally min/max, optionally per
group) are updated on arrival and on expiry and are exact at every slide.

``SharedWindows([r1, r2, ...])`` serves several windows over one stream from one repository: a
tuple is written once and purged only when the largest window expires it, and each window keeps
its own ancient block and aggregates.

Event time is non-decreasing up to ``lateness``: a tuple behind the watermark by at most
``lateness`` is kept in a small in-memory heap (so blocks stay sorted by time and expiry stays a
binary search), a later one raises ``ValueError`` or, with ``on_late="drop"``, is counted and
dropped. See docs/tutorials/windows-bigger-than-memory.md and docs/implementation/slidem.md.

This module is the engine: sealing the recent block into the pool (SlideM's Procedure 1),
expiring every window a block slice at a time from its ancient block, releasing the blocks all
windows have passed (Procedure 2) and reporting slides. Tuples enter through
:mod:`._window_arrival`; the sums and min/max deques are :mod:`._window_agg`, reading them
:mod:`._window_results`, and close/reopen :mod:`._window_persist`.
"""
from __future__ import annotations

import heapq
import math
import operator
import os
import tempfile
import weakref
from typing import Any, Callable, Iterable, Sequence

import msgpack
import numpy as np

from mlcache.errors import ConfigError

from ._window_agg import (_PLAIN_KEYS, Aggregate, GroupTable, WindowState, _hashable,
                          extremes, partial)
from ._window_arrival import WindowArrival, _check_slide_ts, _Cold
from ._window_blocks import BlockRepository, GeneralCodec, NumericCodec
from ._window_persist import discard, dump_state, load_state
from ._window_results import window_result

__all__ = ["SlidingWindow", "SharedWindows", "Aggregate"]

_META = "window.meta"
_DATA = "window.data"
_F8 = np.float64


class _Windows(WindowArrival):
    """The engine shared by :class:`SlidingWindow` and :class:`SharedWindows`; ``append`` and
    ``extend`` come from :class:`~._window_arrival.WindowArrival`."""

    def __init__(self, ranges: Sequence[float], *, kind: str = "time", slide: float | None = None,
                 on_slide: Callable[[float, Any], None] | None = None,
                 columns: Sequence[str] | None = None, value: Any = None, weight: Any = None,
                 group_by: Any = None, minmax: bool = False, block_size: int = 65536,
                 buffer_blocks: int = 2, directory: str | os.PathLike | None = None,
                 lateness: float = 0.0, on_late: str = "raise") -> None:
        self._validate(ranges, kind, slide, block_size, buffer_blocks, lateness, on_late)
        self.kind = kind
        self.ranges = [float(r) if kind == "time" else int(r) for r in ranges]
        self.slide = int(slide) if kind == "count" and slide is not None else slide
        self.on_slide = on_slide
        self.block_size = int(block_size)
        self.lateness = float(lateness)
        self.minmax = bool(minmax)
        self._cold = _Cold()
        self._cold.on_late = on_late
        if columns is not None:
            self.columns: tuple[str, ...] | None = tuple(columns)
            self._codec: Any = NumericCodec(self.columns, self.block_size)
            self._vi, self._wi, self._gi = (self._column(f, n) for f, n in
                                            ((value, "value"), (weight, "weight"),
                                             (group_by, "group_by")))
        else:
            self.columns = None
            self._codec = GeneralCodec(self.block_size)
            self._vf, self._wf, self._gf = (_getter(f) for f in (value, weight, group_by))
        self._grouped = group_by is not None
        self._groups: GroupTable | None = GroupTable(columns is not None) if self._grouped else None
        self._wins = [WindowState(r, self.minmax) for r in self.ranges]
        self._cold.own_dir = directory is None
        self.directory = (tempfile.mkdtemp(prefix="mlcache-window-") if directory is None
                          else os.fspath(directory))
        os.makedirs(self.directory, exist_ok=True)
        meta_path = os.path.join(self.directory, _META)
        reopening = os.path.exists(meta_path)
        if not reopening:  # a fresh window never inherits a stale data file
            with open(os.path.join(self.directory, _DATA), "wb"):
                pass
        self._repo = BlockRepository(os.path.join(self.directory, _DATA), self.block_size,
                                     buffer_blocks, self._codec)
        self._wm = -math.inf
        self._next_slide = math.inf
        self._oldest = 0
        self._cur = self._codec.new_block(0, 0)
        self._closed = False
        if reopening:
            try:
                self._load(meta_path)
            except BaseException:
                # (a directory holding another configuration: the data file's descriptor
                # was left open, one per failed attempt, until the process ended)
                self._repo.close()
                raise
        elif slide is not None:  # a time grid is fixed by the first tuple
            self._next_slide = int(slide) if kind == "count" else -math.inf
        for i, w in enumerate(self._wins):
            self._repo.policy.set_cursor(i, w.seq)
        self.append = self._pick_append()  # type: ignore[method-assign]
        # a window dropped without close() still releases its file (and its temporary
        # directory); its state is only persisted by close()
        self._cold.finalizer = weakref.finalize(self, discard, self._repo,
                                                self.directory if self._cold.own_dir else None)

    # -- validation --------------------------------------------------------------------------
    @staticmethod
    def _validate(ranges: Sequence[float], kind: str, slide: float | None, block_size: int,
                  buffer_blocks: int, lateness: float, on_late: str) -> None:
        if kind not in ("time", "count"):
            raise ConfigError("kind", f"must be 'time' or 'count', got {kind!r}")
        if not ranges:
            raise ConfigError("ranges", "at least one window range is needed")
        for r in ranges:
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not r > 0:
                raise ConfigError("range", f"must be a positive number, got {r!r}")
            # (int() of an infinite range raised OverflowError)
            if kind == "count" and not (math.isfinite(r) and int(r) == r):
                raise ConfigError("range", f"a count window needs an integer range, got {r!r}")
        if slide is not None and (isinstance(slide, bool) or not isinstance(slide, (int, float))
                                  or not slide > 0):
            raise ConfigError("slide", f"must be a positive number, got {slide!r}")
        if kind == "count" and slide is not None and not (math.isfinite(slide)
                                                          and int(slide) == slide):
            raise ConfigError("slide", f"a count window slides by whole tuples, got {slide!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 64:
            raise ConfigError("block_size", f"must be an integer >= 64 bytes, got {block_size!r}")
        # (checked here, before the directory: a temporary one was left behind on refusal)
        if isinstance(buffer_blocks, bool) or not isinstance(buffer_blocks, int) \
                or buffer_blocks < 2:
            raise ConfigError("buffer_blocks", f"must be an integer, at least 2 (one recent, one "
                              f"ancient block), got {buffer_blocks!r}")
        if isinstance(lateness, bool) or not isinstance(lateness, (int, float)) \
                or not lateness >= 0:
            raise ConfigError("lateness", f"must be a number >= 0, got {lateness!r}")
        if on_late not in ("raise", "drop"):
            raise ConfigError("on_late", f"must be 'raise' or 'drop', got {on_late!r}")

    def _column(self, spec: Any, what: str) -> int | None:
        assert self.columns is not None
        if spec is None:
            return None
        if isinstance(spec, str):
            if spec not in self.columns:
                raise ConfigError(what, f"{spec!r} is not one of the columns {self.columns}")
            return self.columns.index(spec)
        if isinstance(spec, int) and 0 <= spec < len(self.columns):
            return spec
        raise ConfigError(what, f"must name a column of {self.columns}, got {spec!r}")

    # -- blocks -------------------------------------------------------------------------------
    def _partial(self, ts: Any, data: Any, lo: int, hi: int) -> Any:
        if self.columns is not None:
            rows = data[lo:hi]
            vals = rows[:, self._vi] if self._vi is not None else np.zeros(hi - lo)
            wts = rows[:, self._wi] if self._wi is not None else None
            g = rows[:, self._gi] if self._gi is not None else None
        else:
            recs = data[lo:hi]
            n = hi - lo
            vals = (np.fromiter(map(self._vf, recs), _F8, n) if self._vf is not None
                    else np.zeros(n))
            wts = np.fromiter(map(self._wf, recs), _F8, n) if self._wf is not None else None
            g = ([k if type(k) in _PLAIN_KEYS else _hashable(k) for k in map(self._gf, recs)]
                 if self._gf is not None else None)
        return partial(vals, wts, g, self._groups)

    def _apply_pending(self) -> None:
        cur = self._cur
        if cur.n > cur.applied:
            p = self._partial(cur.ts, cur.data, cur.applied, cur.n)
            for w in self._wins:
                w.add(p)
            cur.applied = cur.n

    def _seal(self) -> None:
        self._apply_pending()
        cur = self._cur
        if cur.n == 0:
            return
        cur.first_ts = float(cur.ts[0])
        cur.last_ts = float(cur.ts[cur.n - 1])
        if self.minmax:
            codes, lo, hi = extremes(self._partial(cur.ts, cur.data, 0, cur.n))
            for w in self._wins:
                w.push_block(cur.seq, codes, lo, hi)
        self._cur = self._codec.new_block(cur.seq + 1, cur.start + cur.n)
        self._repo.add_sealed(cur)  # last: if a spilled block's write fails, cur is sealed
        self._expire()

    def _expire(self, now: float | None = None) -> None:
        """Expire every window up to event time ``now`` (default: the watermark) or by count,
        then give back the blocks the largest window has left (SlideM Procedure 2)."""
        cur = self._cur
        total = cur.start + cur.applied
        wins = self._wins
        step = len(wins) > 1
        pending: Sequence[int] = range(len(wins))
        while pending:
            # several windows move a block at a time in turn: one running a batch ahead over
            # more blocks than the pool holds had evicted them before the next window read
            # them, so each block was read once per window (SSM's sharing lost to extend)
            moved = []
            for i in pending:
                w = wins[i]
                if self.kind == "time":
                    cutoff = (self._wm if now is None else now) - w.range
                    more = self._expire_window(i, w, cutoff, None, step)
                else:
                    more = self._expire_window(i, w, None, total - w.range, step)
                if more:
                    moved.append(i)
            pending = moved
        self._release_passed()
        self._repo.prefetch()

    def _release_passed(self) -> None:
        """Give back the blocks every window has passed (before any further read, so a dead
        block never takes a frame, let alone a write)."""
        low = min(w.seq for w in self._wins)
        while self._oldest < low:
            self._repo.release(self._oldest)
            self._oldest += 1

    def _expire_window(self, i: int, w: WindowState, cutoff: float | None,
                       target: int | None, step: bool = False) -> bool:
        """Expire window ``w`` up to ``cutoff`` (time) or ``target`` (count); with ``step``,
        stop after moving past one block and say so (True: there may be more to expire)."""
        late = w.late
        while late and (cutoff is not None and late[0][0] <= cutoff):
            t, _, rec = heapq.heappop(late)
            self._sub_one(w, rec, t)
        cur = self._cur
        repo = self._repo
        while True:
            seq, off = w.seq, w.off
            recent = seq == cur.seq
            if recent:
                start, n, first_ts = cur.start, cur.applied, -math.inf
            else:
                start, n, first_ts = repo.meta(seq)
            if off < n:
                if cutoff is not None:
                    if not recent and (first_ts if off == 0 else w.next_ts) > cutoff:
                        return False  # nothing due: do not read the block
                elif start + off >= target:  # type: ignore[operator]
                    return False
                if recent:
                    ts, data = cur.ts, cur.data
                else:
                    ts, data = repo.get(seq)
                if cutoff is not None:
                    end = n if ts[n - 1] <= cutoff else off + int(
                        np.searchsorted(ts[off:n], cutoff, "right"))
                else:
                    end = min(n, target - start)  # type: ignore[operator]
                if end > off:
                    w.add(self._partial(ts, data, off, end), -1)
                    w.off = end
                if end < n:
                    w.next_ts = float(ts[end])
                    return False
            if recent:
                return False
            w.seq, w.off = seq + 1, 0
            repo.policy.set_cursor(i, seq + 1)
            if seq == self._oldest:
                self._release_passed()
            if step:
                return True

    def _sub_one(self, w: WindowState, rec: Any, t: float) -> None:
        if self.columns is not None:
            w.add(self._partial(np.array([t]), np.asarray([rec], _F8), 0, 1), -1)
        else:
            w.add(self._partial(np.array([t]), [rec], 0, 1), -1)

    # -- slides ---------------------------------------------------------------------------------
    def _slide_to(self, ts: float) -> None:
        """Emit every slide boundary ``e < ts``: the window ``(e - range, e]`` is complete."""
        _check_slide_ts(ts, self.slide)  # type: ignore[arg-type]  # (else it never ends)
        self._apply_pending()
        if self._next_slide == -math.inf:  # the first tuple fixes the grid of boundaries
            self._next_slide = math.ceil(ts / self.slide) * self.slide  # type: ignore[operator]
            return
        while ts > self._next_slide:
            e = self._next_slide
            # the next multiple, k * slide: adding slide to the last one drifted (slide=0.1:
            # the 1000th boundary was 99.9999999999986, not 100.0, and left out ts=100.0)
            nxt = (round(e / self.slide) + 1) * self.slide  # type: ignore[operator]
            if not nxt > e:  # (_check_slide_ts keeps this away; never emit one boundary twice)
                raise ValueError(f"slide boundaries do not advance past {e!r} with "
                                 f"slide={self.slide!r}")
            self._expire(e)
            self._emit(e)
            self._next_slide = nxt

    def _slide_count(self) -> None:
        self._apply_pending()
        self._expire()
        total = self._cur.start + self._cur.n
        self._emit(total)
        self._next_slide = (total // self.slide + 1) * self.slide  # type: ignore[operator]

    def _emit(self, end: float) -> None:
        if self.on_slide is not None:
            self.on_slide(end, self._emit_value())

    def _emit_value(self) -> Any:
        return [self._result(w) for w in self._wins]

    # -- results ----------------------------------------------------------------------------------
    def _refresh(self) -> None:
        self._check_open()
        self._apply_pending()
        self._expire()

    def _result(self, w: WindowState) -> Any:
        if w.cancelled():
            self._recompute(w)
        return window_result(self, w)

    def _recompute(self, w: WindowState) -> None:
        """Recompute window ``w``'s sums from its live tuples (a pass over its blocks, read
        outside the pool), when cancellation left them with little precision: see
        :meth:`WindowState.cancelled`. Once per value far larger than the rest leaving."""
        exact = WindowState(w.range, False)
        cur, repo = self._cur, self._repo
        for seq in range(w.seq, cur.seq):
            n = repo.meta(seq)[1]
            lo = w.off if seq == w.seq else 0
            if n > lo:
                ts, data = repo.peek(seq)
                exact.add(self._partial(ts, data, lo, n))
        lo = w.off if w.seq == cur.seq else 0
        if cur.applied > lo:
            exact.add(self._partial(cur.ts, cur.data, lo, cur.applied))
        for t, _, rec in w.late:
            data = np.asarray([rec], _F8) if self.columns is not None else [rec]
            exact.add(self._partial(np.array([t]), data, 0, 1))
        w.set_sums(exact)
        self._cold.recomputes += 1

    # -- accounting, persistence ------------------------------------------------------------------
    def io_stats(self) -> dict[str, Any]:
        """Reads, writes, bytes and their rates, pool memory, live blocks, late tuples."""
        self._repo.recent_n = self._cur.n
        stats = self._repo.stats()
        stats.update(late_accepted=self._cold.late_accepted,
                     late_dropped=self._cold.late_dropped, recomputes=self._cold.recomputes,
                     tuples=self._cur.start + self._cur.n, block_capacity=self._capacity())
        return stats

    def _capacity(self) -> int:
        return self._codec.capacity if self.columns is not None else 0

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held in memory: the buffer pool (resident block frames), per-group state and
        the table of live blocks (36 bytes a block)."""
        state = sum(w.cnt.nbytes + w.sw.nbytes + w.swv.nbytes + w.swv2.nbytes + w.peak.nbytes
                    + 64 * sum(len(d) for d in w.mins.values())
                    + 64 * sum(len(d) for d in w.maxs.values()) + 96 * len(w.late)
                    for w in self._wins)
        stats = self._repo.stats()
        pool, table = stats["pool_bytes"], stats["table_bytes"]
        return {"pool": pool, "group_state": state, "block_table": table,
                "total": pool + state + table}

    @property
    def on_late(self) -> str:
        """What a tuple later than ``lateness`` does: ``"raise"`` or ``"drop"``."""
        return self._cold.on_late

    @on_late.setter
    def on_late(self, how: str) -> None:
        self._cold.on_late = how

    @property
    def late_accepted(self) -> int:
        """Late tuples kept (within ``lateness``)."""
        return self._cold.late_accepted

    @late_accepted.setter
    def late_accepted(self, n: int) -> None:
        self._cold.late_accepted = n

    @property
    def late_dropped(self) -> int:
        """Late tuples dropped (``on_late="drop"``)."""
        return self._cold.late_dropped

    @late_dropped.setter
    def late_dropped(self, n: int) -> None:
        self._cold.late_dropped = n

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this window is closed")

    def close(self) -> None:
        """Write the window to its directory so that reopening it continues the stream (a
        temporary directory is removed instead)."""
        if self._closed:
            return
        if not self._cold.own_dir:
            # saved first, closed after: a write that fails (a full disk) reaches the caller
            # and leaves the window open, so close() can be called again once there is room.
            # (It was marked closed first: the retry returned at once, nothing was saved, and
            # the reopened window had lost every tuple since the previous close.)
            self._apply_pending()
            self._repo.flush()
            meta = self._dump()
            tmp = os.path.join(self.directory, _META + ".tmp")
            with open(tmp, "wb") as fh:
                fh.write(msgpack.packb(meta, use_bin_type=True))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(self.directory, _META))
        self._closed = True
        self.append = self._append_closed  # type: ignore[method-assign]
        self._cold.finalizer()

    def _append_closed(self, record: Any, ts: float | None = None) -> None:
        self._check_open()

    def __enter__(self) -> "_Windows":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dump(self) -> dict[str, Any]:
        return dump_state(self)

    def _load(self, path: str) -> None:
        load_state(self, path)


def _getter(spec: Any) -> Callable[[Any], Any] | None:
    if spec is None or callable(spec):
        return spec
    return operator.itemgetter(spec)


class SlidingWindow(_Windows):
    """One sliding window over a stream, bigger than memory (SlideM).

    ``range`` is in event-time units (``kind="time"``) or tuples (``kind="count"``). Numeric
    records (``columns=("symbol", "price", "volume")``) take the fast path; without ``columns``
    a record is any msgpack-encodable object and ``value``/``weight``/``group_by`` are callables
    or item keys. ``on_slide(end, result)`` is called at every slide boundary.
    """

    def __init__(self, range: float, **options: Any) -> None:
        super().__init__([range], **options)

    @property
    def range(self) -> float:
        return self.ranges[0]

    def result(self) -> Any:
        """The aggregates now: an :class:`Aggregate`, or ``{group: Aggregate}`` when grouped."""
        self._refresh()
        return self._result(self._wins[0])

    def _emit_value(self) -> Any:
        return self._result(self._wins[0])


class SharedWindows(_Windows):
    """Several windows of different ranges over one stream, sharing one repository (SSM).

    Space is bounded by the largest window: a tuple is purged only when the largest window
    expires it. ``results()`` and ``on_slide(end, [result per window])`` list the windows in
    the order of ``ranges``.
    """

    def __init__(self, ranges: Iterable[float], **options: Any) -> None:
        if isinstance(ranges, (str, bytes)) or not isinstance(ranges, Iterable):
            # (list(5) failed with "'int' object is not iterable", naming no argument)
            raise ConfigError("ranges", f"must be a list of window ranges, got {ranges!r}")
        super().__init__(list(ranges), **options)

    def results(self) -> list[Any]:
        self._refresh()
        return [self._result(w) for w in self._wins]
