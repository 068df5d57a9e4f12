"""Node layout and geometry shared by the quadtree classes (see :mod:`.quadtree`)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from mlcache.codec import Codec

__all__ = ["Point"]

X0, Y0, X1, Y1, DEPTH, COUNT, KIDS, PTS, TMIN = range(9)
ROOT = 0
# A cacheable tree's node entry is one msgpack blob (types kept exactly, never pickled).
NODE_CODEC = Codec(allow_pickle=False)
ANY: Any = object()


class Point(NamedTuple):
    x: float
    y: float
    data: Any = None
    ts: float | None = None


def _check_bounds(bounds: Any) -> list[float]:
    try:
        x0, y0, x1, y1 = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be (x0, y0, x1, y1), got {bounds!r}") from None
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or not (x0 < x1 and y0 < y1):
        raise ValueError(f"bounds must be finite with x0 < x1 and y0 < y1, got {bounds!r}")
    return [x0, y0, x1, y1]


def _min_ts(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


def _recs(pts: list) -> Iterator[tuple]:
    """The ``(x, y, data, ts)`` records of a leaf's flat point list."""
    return zip(pts[0::4], pts[1::4], pts[2::4], pts[3::4])


def _min_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _quadrant(node: list, x: float, y: float) -> int:
    return (x >= (node[X0] + node[X1]) * 0.5) | ((y >= (node[Y0] + node[Y1]) * 0.5) << 1)


def _child_bounds(node: list, q: int) -> tuple[float, float, float, float]:
    mx, my = (node[X0] + node[X1]) * 0.5, (node[Y0] + node[Y1]) * 0.5
    x0, x1 = (mx, node[X1]) if q & 1 else (node[X0], mx)
    y0, y1 = (my, node[Y1]) if q & 2 else (node[Y0], my)
    return x0, y0, x1, y1


def _mindist2(node: list, x: float, y: float) -> float:
    dx = node[X0] - x if x < node[X0] else (x - node[X1] if x > node[X1] else 0.0)
    dy = node[Y0] - y if y < node[Y0] else (y - node[Y1] if y > node[Y1] else 0.0)
    return dx * dx + dy * dy


def _quadtree_meta(bounds: Any, capacity: int, max_depth: int) -> dict[str, Any]:
    if bounds is None:
        raise ValueError("a new quadtree needs bounds=(x0, y0, x1, y1)")
    b = _check_bounds(bounds)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an integer >= 0, got {max_depth!r}")
    return {"len": 0, "bounds": b, "capacity": capacity, "max_depth": max_depth,
            "next": 1, "nodes": 1}
