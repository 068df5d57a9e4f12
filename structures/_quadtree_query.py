"""The read-only side of the quadtree: range, count, radius, k-nearest and density queries.

Kept apart from the operations that change a tree (:mod:`.quadtree`). Every query walks the
tree breadth-first with one ``_nodes`` (a ``get_many``) per level, so a cold tree costs one
round trip per level, and stops at nodes its region does not need: ``count`` and
``grid_counts`` read the per-node counts of the highest nodes inside the region and never their
leaves.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from operator import index
from typing import Any

from ._quadtree_geometry import (COUNT, DEPTH, KIDS, PTS, ROOT, SIZE, TMIN, X0, X1, Y0, Y1,
                                 Point, _child_bounds, _columns, _mindist2, _recs, _xys,
                                 n_points, node_size)

__all__: list[str] = []


def _halvings(lo: float, hi: float, levels: int) -> list[float]:
    """The midpoints ``levels`` successive halvings of ``[lo, hi]`` make, in order (the
    arithmetic of the halvings themselves: ``(lo + hi) * 0.5`` of each part)."""
    if not levels:
        return []
    mid = (lo + hi) * 0.5
    return _halvings(lo, mid, levels - 1) + [mid] + _halvings(mid, hi, levels - 1)


def _cell(lo: float, hi: float, levels: int, v: float) -> int:
    """The cell of ``v`` after ``levels`` halvings of ``[lo, hi]`` (``v >= mid`` goes right):
    what ``bisect_right`` over ``_halvings(lo, hi, levels)`` gives, without its 2**levels
    midpoints."""
    i = 0
    for _ in range(levels):
        mid = (lo + hi) * 0.5
        if v >= mid:
            i, lo = 2 * i + 1, mid
        else:
            i, hi = 2 * i, mid
    return i


def _deep_cells(node: list, levels: int, xs: list, ys: list) -> Counter:
    """``Counter`` of the ``(ix, iy)`` cells of points ``xs``, ``ys`` in leaf ``node``,
    ``levels`` halvings down."""
    x0, x1, y0, y1 = node[X0], node[X1], node[Y0], node[Y1]
    return Counter((_cell(x0, x1, levels, x), _cell(y0, y1, levels, y))
                   for x, y in zip(xs, ys))


# past this many halvings below a leaf, grid_counts finds each point's cell by halving (a
# loop per point) rather than from the list of every midpoint, which has 2**levels - 1 items
# (grid_counts(30) over a tree of one point took all the memory there was)
_HALVINGS_MAX = 10


class _QuadtreeQueries:
    """Queries over ``self._nodes`` / ``self._node`` and ``self._meta``."""

    __slots__ = ()
    _meta: dict[str, Any]
    _nodes: Callable[[Iterable[int]], dict[int, list]]
    _node: Callable[[int], "list | None"]
    _load: Callable[[Any], Any]
    _merge_below: Callable[[], int]
    _sized: bool

    def _as_point(self, rec: Any) -> Point:
        return Point(rec[0], rec[1], self._load(rec[2]), rec[3])

    def _walk(self, visit: Callable[[list], bool]) -> None:
        """Breadth-first over the nodes ``visit`` descends into (one get_many per level)."""
        frontier = [ROOT]
        while frontier:
            found = self._nodes(frontier)
            nxt: list[int] = []
            for nid in frontier:
                node = found.get(nid)
                if node is not None and visit(node) and node[KIDS] is not None:
                    nxt.extend(node[KIDS])
            frontier = nxt

    def range(self, x0: float, y0: float, x1: float, y1: float) -> list[Point]:
        """Points with ``x0 <= x <= x1`` and ``y0 <= y <= y1``."""
        out: list[Point] = []

        def visit(node: list) -> bool:
            if node[X0] > x1 or node[X1] < x0 or node[Y0] > y1 or node[Y1] < y0:
                return False
            if node[KIDS] is None:
                out.extend(self._as_point(r) for r in _recs(node[PTS])
                           if x0 <= r[0] <= x1 and y0 <= r[1] <= y1)
            return True

        self._walk(visit)
        return out

    def count(self, x0: float, y0: float, x1: float, y1: float) -> int:
        """How many points ``range(x0, y0, x1, y1)`` would return, from the per-node counts."""
        total = 0

        def visit(node: list) -> bool:
            nonlocal total
            if node[X0] > x1 or node[X1] < x0 or node[Y0] > y1 or node[Y1] < y0:
                return False
            if x0 <= node[X0] and node[X1] <= x1 and y0 <= node[Y0] and node[Y1] <= y1:
                total += node[COUNT]
                return False
            if node[KIDS] is None:
                total += sum(1 for px, py in _xys(node[PTS])
                             if x0 <= px <= x1 and y0 <= py <= y1)
            return True

        self._walk(visit)
        return total

    def radius(self, x: float, y: float, r: float) -> list[Point]:
        """Points within distance ``r`` of ``(x, y)`` (``dx*dx + dy*dy <= r*r``)."""
        if not r >= 0:
            # (r * r made radius(x, y, -5) the points within 5; NaN found none)
            raise ValueError(f"radius r must be a number >= 0, got {r!r}")
        r2 = r * r
        out: list[Point] = []

        def visit(node: list) -> bool:
            if _mindist2(node, x, y) > r2:
                return False
            if node[KIDS] is None:
                for rec in _recs(node[PTS]):
                    dx, dy = rec[0] - x, rec[1] - y
                    if dx * dx + dy * dy <= r2:
                        out.append(self._as_point(rec))
            return True

        self._walk(visit)
        return out

    def nearest(self, x: float, y: float, k: int = 1) -> list[Point]:
        """The ``k`` points closest to ``(x, y)``, nearest first (ties in any order)."""
        try:
            k = index(k)     # (k=1.5 returned 2 points)
        except TypeError:
            raise TypeError(f"k must be an integer, got {k!r}") from None
        if k <= 0:
            return []
        heap: list[tuple[float, int, int, Any]] = [(0.0, 0, 0, ROOT)]
        seq = 1
        out: list[Point] = []
        while heap and len(out) < k:
            d2, _, is_point, item = heapq.heappop(heap)
            if is_point:
                out.append(self._as_point(item))
                continue
            node = self._node(item)
            if node is None:
                continue
            if node[KIDS] is None:
                for rec in _recs(node[PTS]):
                    dx, dy = rec[0] - x, rec[1] - y
                    heapq.heappush(heap, (dx * dx + dy * dy, seq, 1, rec))
                    seq += 1
            else:
                found = self._nodes(node[KIDS])
                for kid in node[KIDS]:
                    child = found[kid]
                    if child[COUNT]:
                        heapq.heappush(heap, (_mindist2(child, x, y), seq, 0, kid))
                        seq += 1
        return out

    def grid_counts(self, depth: int, cells: Iterable[tuple[int, int]] | None = None,
                    ) -> dict[tuple[int, int], int]:
        """Points per cell of the ``2**depth`` x ``2**depth`` grid over the bounds, as
        ``{(ix, iy): count}`` for non-empty cells; cell ``(ix, iy)`` is the quadrant reached
        by ``depth`` halvings. Reads no node deeper than ``depth``; with ``cells``, only the
        nodes on the way to those cells (a density lookup for a few regions)."""
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            # (a RecursionError from the halvings for -1 or 2.5)
            raise ValueError(f"depth must be an integer >= 0, got {depth!r}")
        bx0, by0, bx1, by1 = self._meta["bounds"]
        out: dict[tuple[int, int], int] = {}
        wanted: list[set] | None = None
        if cells is not None:
            wanted = [set() for _ in range(depth + 1)]
            for cx, cy in cells:
                for level in range(depth + 1):
                    wanted[level].add((cx >> (depth - level), cy >> (depth - level)))

        def visit(node: list) -> bool:
            if node[COUNT] == 0:
                return False
            nd = node[DEPTH]
            side = 1 << nd
            ix = int(round((node[X0] - bx0) / (bx1 - bx0) * side))
            iy = int(round((node[Y0] - by0) / (by1 - by0) * side))
            if wanted is not None and (nd > depth or (ix, iy) not in wanted[nd]):
                return False
            if nd == depth:
                out[(ix, iy)] = out.get((ix, iy), 0) + node[COUNT]
                return False
            if node[KIDS] is None:
                # a point's cell is where depth - nd halvings of the leaf take it: as many
                # cells right as there are halving lines at or left of it (x >= mx goes
                # right), the lines made by the very same halvings; counted in C
                levels = depth - nd
                xs, ys = _columns(node[PTS])
                if levels <= _HALVINGS_MAX:
                    local = Counter(zip(
                        map(bisect_right, repeat(_halvings(node[X0], node[X1], levels)), xs),
                        map(bisect_right, repeat(_halvings(node[Y0], node[Y1], levels)), ys)))
                else:
                    local = _deep_cells(node, levels, xs, ys)
                for (lx, ly), n in local.items():
                    cell = ((ix << levels) + lx, (iy << levels) + ly)
                    if wanted is None or cell in wanted[depth]:
                        out[cell] = out.get(cell, 0) + n
                return False
            return True

        self._walk(visit)
        return out

    def cell_bounds(self, depth: int, ix: int, iy: int) -> tuple[float, float, float, float]:
        """The rectangle of grid cell ``(ix, iy)`` at ``depth`` (as ``grid_counts`` uses)."""
        x0, y0, x1, y1 = self._meta["bounds"]
        for level in range(depth - 1, -1, -1):
            mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
            if (ix >> level) & 1:
                x0 = mx
            else:
                x1 = mx
            if (iy >> level) & 1:
                y0 = my
            else:
                y1 = my
        return x0, y0, x1, y1

    def __iter__(self) -> Iterator[Point]:
        leaves: list[list] = []

        def visit(node: list) -> bool:
            if node[KIDS] is None:
                leaves.append(node)
            return True

        self._walk(visit)
        for leaf in leaves:
            for rec in _recs(leaf[PTS]):
                yield self._as_point(rec)

    def points(self) -> list[Point]:
        return list(self)


    def height(self) -> int:
        """Depth of the deepest node."""
        deepest = 0

        def visit(node: list) -> bool:
            nonlocal deepest
            deepest = max(deepest, node[DEPTH])
            return True

        self._walk(visit)
        return deepest

    # -- invariants ---------------------------------------------------------------------------

    def verify(self) -> int:
        """Check every structural invariant (counts, bounds, timestamps, merge threshold,
        sizes); raise ``AssertionError`` on the first violation; return the number of nodes."""
        nodes = 0
        total = 0
        merge_below = self._merge_below()
        if self._node(ROOT) is None:
            assert self._meta["len"] == 0 and self._meta["nodes"] == 1
            return 0
        sized = self._sized

        def visit(node: list) -> bool:
            nonlocal nodes, total
            nodes += 1
            if sized:
                assert node[SIZE] == node_size(node), ("size", node[SIZE], node_size(node))
            if node[KIDS] is None:
                pts = node[PTS]
                assert node[COUNT] == n_points(pts), node
                if pts and type(pts[0]) is bytes:
                    assert len(pts[0]) == 24 * (len(pts) - 1), node
                for rec in _recs(pts):
                    assert node[X0] <= rec[0] <= node[X1] and node[Y0] <= rec[1] <= node[Y1]
                    assert rec[3] is None or rec[3] != rec[3] or (
                        node[TMIN] is not None and node[TMIN] <= rec[3])
                assert node[COUNT] <= self._meta["capacity"] or \
                    node[DEPTH] >= self._meta["max_depth"], "leaf over capacity"
                total += node[COUNT]
                return False
            assert node[PTS] is None and len(node[KIDS]) == 4
            kids = self._nodes(node[KIDS])
            assert sum(kids[k][COUNT] for k in node[KIDS]) == node[COUNT], "count mismatch"
            assert node[COUNT] > merge_below, "under-full inner node not merged"
            for q, k in enumerate(node[KIDS]):
                assert tuple(kids[k][:4]) == _child_bounds(node, q)
                assert kids[k][DEPTH] == node[DEPTH] + 1
                if kids[k][TMIN] is not None:
                    assert node[TMIN] is not None and node[TMIN] <= kids[k][TMIN]
            return True

        self._walk(visit)
        assert total == self._meta["len"], (total, self._meta["len"])
        assert nodes == self._meta["nodes"], (nodes, self._meta["nodes"])
        return nodes
