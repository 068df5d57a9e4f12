"""Reading a window's aggregates: sums from the running state, min/max from the deques plus an
exact pass over the parts no deque entry covers (the live part of the ancient block, the recent
block, the late tuples)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._window_agg import WindowState, extremes

__all__ = ["window_result"]

_F8 = np.float64


def window_result(self: Any, w: WindowState) -> Any:
    """The aggregates of window ``w`` of engine ``self``: one Aggregate or {group: Aggregate}."""
    exact = _exact_extremes(self, w) if self.minmax else {}
    if not self._grouped:
        lo, hi = _combine(self, w, 0, exact)
        return w.result(0, lo, hi)
    assert self._groups is not None
    out = {}
    for c in w.live_codes():
        lo, hi = _combine(self, w, c, exact)
        out[self._groups.key(c)] = w.result(c, lo, hi)
    return out


def _combine(self: Any, w: WindowState, code: int, exact: dict) -> tuple[Any, Any]:
    if not self.minmax:
        return None, None
    lo, hi = w.block_extreme(code)
    elo, ehi = exact.get(code, (None, None))
    lo = elo if lo is None else (lo if elo is None else min(lo, elo))
    hi = ehi if hi is None else (hi if ehi is None else max(hi, ehi))
    return lo, hi


def _exact_extremes(self: Any, w: WindowState) -> dict[int, tuple[float, float]]:
    """Per group min/max over the live part of the ancient block, the recent block and the
    late tuples — the parts no deque entry covers."""
    cur = self._cur
    parts = []
    if w.seq == cur.seq:
        if cur.applied > w.off:
            parts.append(self._partial(cur.ts, cur.data, w.off, cur.applied))
    else:
        n = self._repo.meta(w.seq)[1]
        if n > w.off:
            ts, data = self._repo.get(w.seq)
            parts.append(self._partial(ts, data, w.off, n))
        if cur.applied:
            parts.append(self._partial(cur.ts, cur.data, 0, cur.applied))
    for t, _, rec in w.late:
        data = np.asarray([rec], _F8) if self.columns is not None else [rec]
        parts.append(self._partial(np.array([t]), data, 0, 1))
    out: dict[int, tuple[float, float]] = {}
    for p in parts:
        for c, lo, hi in zip(*(a.tolist() for a in extremes(p))):
            old = out.get(c)
            out[c] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return out
