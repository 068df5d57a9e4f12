"""CacheableQuadtree: a point-region quadtree whose nodes are manager entries.

A node is one entry, keyed by an integer id (the root is 0), holding a short list::

    [x0, y0, x1, y1, depth, count, children, points, tmin]

``children`` is ``None`` at a leaf, else the ids of the four quadrants (SW, SE, NW, NE);
``points`` is ``None`` inside, and at a leaf one flat list ``[x, y, data, ts, x, y, data, ts,
...]``; ``count`` is the number of points in the subtree, so density questions
(``count(rect)``, ``grid_counts(depth)``) stop at the highest node that lies inside the region
and never read its leaves; ``tmin`` is a lower bound of the subtree's timestamps, so
``prune_older(t)`` skips subtrees with nothing to drop.

In the cache, a node entry is that list packed into one msgpack ``bytes`` blob, unpacked when
read and packed when written back. Three reasons, measured on ``mlcache bench events``: the
heap weighs a value it is handed by walking it, and a blob weighs in one step (walking nested
lists took a third of the insert time); a blob's memory is its encoded size, so the heap's
byte budget is what the process really spends; and a blob is one object the garbage collector
never scans. Packing or unpacking a node of a few dozen points is one C call. Point ``data``
must therefore be plain data msgpack can take (str, numbers, bytes, tuples, lists, dicts, sets,
None, or a structure, stored as a reference); anything else raises ``SerializationError``
before the tree changes.

A leaf splits when it holds more than ``capacity`` points, unless it is at ``max_depth``
(identical points cannot be separated by splitting, so the depth limit is what keeps a burst of
duplicates from recursing forever). An inner node whose subtree falls to ``capacity // 2``
points or fewer, by ``remove`` or a prune, merges its children back into one leaf; the gap
between the split and the merge thresholds keeps a node near the boundary from flapping.
Bounds are closed: a point on the upper edge belongs to the tree and to the upper quadrant.

Every operation reads nodes level by level with one ``get_many`` per level and writes the
touched nodes with one ``put_many``, so a cold tree costs one round trip per level, not per
node. ``insert_many`` routes a whole batch down together: each node on the way is read and
written once per batch instead of once per point, which is how a stream job should feed it.

:class:`~mlcache.structures.PlainQuadtree` (in ``_quadtree_plain``) is the very same code over
a plain ``dict`` of nodes, the all-in-heap baseline of ``mlcache bench events``.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._quadtree_geometry import ANY as _ANY
from ._quadtree_geometry import (COUNT, DEPTH, KIDS, PTS, ROOT, TMIN, X0, X1, Y0, Y1, Point,
                                 _check_bounds, _child_bounds, _min_of, _min_ts, _mindist2,
                                 _quadrant, _quadtree_meta, _recs)
from ._quadtree_geometry import NODE_CODEC as _NODE_CODEC
from .base import Cacheable

__all__ = ["CacheableQuadtree", "Point"]


class _QuadtreeOps:
    """The algorithms, written against ``self._ns`` (get/get_many/put/put_many/delete_many),
    ``self._meta`` and ``self._save_meta()``; shared by the cacheable and the plain tree."""

    __slots__ = ()
    _ns: Any
    _meta: dict[str, Any]
    _save_meta: Callable[[], None]
    _store: Callable[[Any], Any]
    _load: Callable[[Any], Any]
    _check_data: Callable[[list], None]

    # -- shape -------------------------------------------------------------------------------

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = self._meta["bounds"]
        return (x0, y0, x1, y1)

    @property
    def capacity(self) -> int:
        return int(self._meta["capacity"])

    @property
    def max_depth(self) -> int:
        return int(self._meta["max_depth"])

    @property
    def node_count(self) -> int:
        return int(self._meta["nodes"])

    def __len__(self) -> int:
        return int(self._meta["len"])

    def _root_node(self) -> list:
        x0, y0, x1, y1 = self._meta["bounds"]
        return [x0, y0, x1, y1, 0, 0, None, [], None]

    def _point(self, x: Any, y: Any, data: Any, ts: Any) -> list:
        x0, y0, x1, y1 = self._meta["bounds"]
        if not (x0 <= x <= x1 and y0 <= y <= y1):
            raise ValueError(f"point ({x!r}, {y!r}) is outside the quadtree bounds "
                             f"({x0!r}, {y0!r}, {x1!r}, {y1!r})")
        return [x, y, self._store(data), ts]

    def _as_point(self, rec: Any) -> Point:
        return Point(rec[0], rec[1], self._load(rec[2]), rec[3])

    # -- insert ------------------------------------------------------------------------------

    def insert(self, x: float, y: float, data: Any = None, ts: float | None = None) -> None:
        """Add one point (duplicates allowed). ``ts`` is what ``prune_older`` compares."""
        self.insert_many(((x, y, data, ts),))

    def insert_many(self, points: Iterable[Any]) -> int:
        """Add ``(x, y)``, ``(x, y, data)`` or ``(x, y, data, ts)`` tuples; returns how many.

        All points are checked before anything is written, so a bad point changes nothing."""
        recs = []
        for p in points:
            n = len(p)
            recs.append(self._point(p[0], p[1], p[2] if n > 2 else None, p[3] if n > 3 else None))
        if not recs:
            return 0
        self._check_data([r[2] for r in recs])   # fails before any change
        capacity, max_depth = self._meta["capacity"], self._meta["max_depth"]
        touched: dict[int, list] = {}
        groups: dict[int, list] = {ROOT: recs}
        while groups:
            found = self._nodes(list(groups))
            deeper: dict[int, list] = {}
            for nid, batch in groups.items():
                node = found.get(nid) or self._root_node()
                touched[nid] = node
                node[COUNT] += len(batch)
                tmin = node[TMIN]
                for rec in batch:
                    if rec[3] is not None and (tmin is None or rec[3] < tmin):
                        tmin = rec[3]
                node[TMIN] = tmin
                kids = node[KIDS]
                if kids is None:
                    pts = node[PTS]
                    for rec in batch:
                        pts.extend(rec)
                    if len(pts) > 4 * capacity and node[DEPTH] < max_depth:
                        self._split(node, pts, touched, capacity, max_depth)
                    else:
                        node[PTS] = pts
                    continue
                mx, my = (node[X0] + node[X1]) * 0.5, (node[Y0] + node[Y1]) * 0.5
                for rec in batch:
                    kid = kids[(rec[0] >= mx) | ((rec[1] >= my) << 1)]
                    sub = deeper.get(kid)
                    if sub is None:
                        deeper[kid] = [rec]
                    else:
                        sub.append(rec)
            groups = deeper
        self._keep(list(touched.items()))
        self._meta["len"] += len(recs)
        self._save_meta()
        return len(recs)

    def _split(self, node: list, pts: list, touched: dict[int, list], capacity: int,
               max_depth: int) -> None:
        first = self._meta["next"]
        self._meta["next"] = first + 4
        self._meta["nodes"] += 4
        kids = [first, first + 1, first + 2, first + 3]
        parts: list[list] = [[], [], [], []]
        for rec in _recs(pts):
            parts[_quadrant(node, rec[0], rec[1])].extend(rec)
        node[KIDS], node[PTS] = kids, None
        for q in range(4):
            part = parts[q]
            child = [*_child_bounds(node, q), node[DEPTH] + 1, len(part) // 4, None, None,
                     _min_of(part[3::4])]
            touched[kids[q]] = child
            if len(part) > 4 * capacity and child[DEPTH] < max_depth:
                self._split(child, part, touched, capacity, max_depth)
            else:
                child[PTS] = part

    # -- remove and merge --------------------------------------------------------------------

    def remove(self, x: float, y: float, data: Any = _ANY) -> Point:
        """Remove one point at ``(x, y)`` (with this ``data`` if given) and return it;
        ``ValueError`` if there is none, like ``list.remove``."""
        path: list[tuple[int, list]] = []
        nid = ROOT
        while True:
            node = self._node(nid)
            if node is None:
                raise ValueError(f"point ({x!r}, {y!r}) is not in the quadtree")
            path.append((nid, node))
            if node[KIDS] is None:
                break
            nid = node[KIDS][_quadrant(node, x, y)]
        pts = node[PTS]
        stored = _ANY if data is _ANY else self._store(data)
        for j in range(0, len(pts), 4):
            if pts[j] == x and pts[j + 1] == y and (stored is _ANY or pts[j + 2] == stored):
                break
        else:
            raise ValueError(f"point ({x!r}, {y!r}) is not in the quadtree")
        rec = pts[j:j + 4]
        del pts[j:j + 4]
        node[PTS] = pts
        for _, n in path:
            n[COUNT] -= 1
        touched: dict[int, list] = dict(path)
        gone: list[int] = []
        for pid, parent in reversed(path[:-1]):
            if parent[COUNT] > self._merge_below():
                break
            self._collapse(parent, touched, gone)
        for nid in gone:
            touched.pop(nid, None)
        self._keep(list(touched.items()))
        if gone:
            self._ns.delete_many(gone)
        self._meta["len"] -= 1
        self._save_meta()
        return self._as_point(rec)

    def _merge_below(self) -> int:
        return int(self._meta["capacity"]) // 2

    def _collapse(self, node: list, touched: dict[int, list], gone: list[int]) -> None:
        """Turn an inner node into a leaf holding all its subtree's points."""
        points: list = []
        tmin = None
        before = len(gone)
        frontier = list(node[KIDS])
        while frontier:
            found = self._nodes([k for k in frontier if k not in touched])
            nxt = []
            for kid in frontier:
                child = touched[kid] if kid in touched else found[kid]
                gone.append(kid)
                if child[KIDS] is None:
                    flat = child[PTS]
                    points.extend(flat)
                    tmin = _min_ts(tmin, _min_of(flat[3::4]))
                else:
                    nxt.extend(child[KIDS])
            frontier = nxt
        self._meta["nodes"] -= len(gone) - before
        node[KIDS], node[PTS] = None, points
        node[COUNT], node[TMIN] = len(points) // 4, tmin

    # -- queries -----------------------------------------------------------------------------

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
                total += sum(1 for r in _recs(node[PTS])
                             if x0 <= r[0] <= x1 and y0 <= r[1] <= y1)
            return True

        self._walk(visit)
        return total

    def radius(self, x: float, y: float, r: float) -> list[Point]:
        """Points within distance ``r`` of ``(x, y)`` (``dx*dx + dy*dy <= r*r``)."""
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
                for rec in _recs(node[PTS]):
                    cx, cy = ix, iy
                    x0, y0, x1, y1 = node[X0], node[Y0], node[X1], node[Y1]
                    for _ in range(depth - nd):
                        mx, my = (x0 + x1) * 0.5, (y0 + y1) * 0.5
                        if rec[0] >= mx:
                            cx, x0 = 2 * cx + 1, mx
                        else:
                            cx, x1 = 2 * cx, mx
                        if rec[1] >= my:
                            cy, y0 = 2 * cy + 1, my
                        else:
                            cy, y1 = 2 * cy, my
                    if wanted is None or (cx, cy) in wanted[depth]:
                        out[(cx, cy)] = out.get((cx, cy), 0) + 1
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

    # -- prune -------------------------------------------------------------------------------

    def prune(self, predicate: Callable[[Point], bool]) -> int:
        """Remove every point for which ``predicate(point)`` is true; returns how many.
        Subtrees left under-full are merged."""
        return self._prune(lambda rec: bool(predicate(self._as_point(rec))), None)

    def prune_older(self, t: float) -> int:
        """Remove points with a timestamp ``< t`` (points without one stay); returns how many."""
        return self._prune(lambda rec: rec[3] is not None and rec[3] < t, t)

    def _prune(self, drop: Callable[[list], bool], t: float | None) -> int:
        touched: dict[int, list] = {}
        gone: list[int] = []
        root = self._node(ROOT)
        if root is None:
            return 0
        removed = self._prune_node(ROOT, root, drop, t, touched, gone)
        for nid in gone:
            touched.pop(nid, None)
        if touched:
            self._keep(list(touched.items()))
        if gone:
            self._ns.delete_many(gone)
        if removed:
            self._meta["len"] -= removed
            self._save_meta()
        return removed

    def _prune_node(self, nid: int, node: list, drop: Callable[[list], bool], t: float | None,
                    touched: dict[int, list], gone: list[int]) -> int:
        if node[COUNT] == 0 or (t is not None and (node[TMIN] is None or node[TMIN] >= t)):
            return 0
        if node[KIDS] is None:
            pts = node[PTS]
            keep = [v for rec in _recs(pts) if not drop(rec) for v in rec]
            removed = (len(pts) - len(keep)) // 4
            if removed:
                node[PTS], node[COUNT], node[TMIN] = (keep, len(keep) // 4,
                                                      _min_of(keep[3::4]))
                touched[nid] = node
            return removed
        kids = node[KIDS]
        found = self._nodes(kids)
        removed = 0
        tmin = None
        for kid in kids:
            child = found[kid]
            removed += self._prune_node(kid, child, drop, t, touched, gone)
            tmin = _min_ts(tmin, child[TMIN])
        if removed:
            node[COUNT] -= removed
            node[TMIN] = tmin
            touched[nid] = node
            if node[COUNT] <= self._merge_below():
                self._collapse(node, touched, gone)
        return removed

    # -- whole tree --------------------------------------------------------------------------

    def clear(self) -> None:
        ids: list[int] = []
        frontier = [ROOT]
        while frontier:
            found = self._nodes(frontier)
            ids.extend(k for k in frontier if k in found)
            frontier = [k for nid in frontier if nid in found and found[nid][KIDS]
                        for k in found[nid][KIDS]]
        if ids:
            self._ns.delete_many(ids)
        self._meta.update(len=0, nodes=1, next=1)
        self._save_meta()

    def _empty_meta(self) -> dict[str, Any]:
        return {**self._meta, "len": 0, "nodes": 1, "next": 1}

    def height(self) -> int:
        """Depth of the deepest node."""
        deepest = 0

        def visit(node: list) -> bool:
            nonlocal deepest
            deepest = max(deepest, node[DEPTH])
            return True

        self._walk(visit)
        return deepest

    def verify(self) -> int:
        """Check every structural invariant (counts, bounds, timestamps, merge threshold);
        raise ``AssertionError`` on the first violation; return the number of nodes."""
        nodes = 0
        total = 0
        merge_below = self._merge_below()
        if self._node(ROOT) is None:
            assert self._meta["len"] == 0 and self._meta["nodes"] == 1
            return 0

        def visit(node: list) -> bool:
            nonlocal nodes, total
            nodes += 1
            if node[KIDS] is None:
                pts = node[PTS]
                assert 4 * node[COUNT] == len(pts), node
                for rec in _recs(pts):
                    assert node[X0] <= rec[0] <= node[X1] and node[Y0] <= rec[1] <= node[Y1]
                    assert rec[3] is None or (node[TMIN] is not None and node[TMIN] <= rec[3])
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


class CacheableQuadtree(_QuadtreeOps, Cacheable):
    """A quadtree whose nodes live in the cache levels.

    Open with ``manager.quadtree(name, bounds=(x0, y0, x1, y1), capacity=32, max_depth=16)``;
    reopening by name needs no bounds (given ones must match)."""

    kind = "quadtree"
    __slots__ = ()

    # A node entry is one msgpack blob: see the module docstring.
    def _nodes(self, ids: Iterable[int]) -> dict[int, list]:
        decode = _NODE_CODEC.decode
        return {k: decode(v) for k, v in self._ns.get_many(ids).items()}

    def _node(self, nid: int) -> list | None:
        blob = self._ns.get(nid)
        return None if blob is None else _NODE_CODEC.decode(blob)

    def _keep(self, items: Iterable[tuple[int, list]]) -> None:
        encode = _NODE_CODEC.encode
        self._ns.put_many([(k, encode(node)) for k, node in items])

    @staticmethod
    def _check_data(values: list) -> None:
        _NODE_CODEC.encode(values)

    def _new_meta(self, bounds: Any = None, capacity: int = 32,  # type: ignore[override]
                  max_depth: int = 16) -> dict[str, Any]:
        return _quadtree_meta(bounds, capacity, max_depth)

    def _check_meta(self, meta: dict[str, Any], bounds: Any = None,  # type: ignore[override]
                    capacity: int | None = None, max_depth: int | None = None) -> None:
        super()._check_meta(meta)
        if bounds is not None and _check_bounds(bounds) != list(meta["bounds"]):
            raise ValueError(f"quadtree {self._name!r} exists with bounds "
                             f"{tuple(meta['bounds'])}, not {tuple(bounds)}")

    def drop(self) -> None:
        # Node ids are handed out in order, so every node that ever existed is below
        # ``next``: delete them blindly rather than list the namespace, which scans every
        # level (a Redis SCAN over the whole key space) on each roll of a window.
        self._ns.delete_many(list(range(int(self._meta.get("next", 1)))))
        self._metans.delete((self.kind, self._name))
        self._meta = self._empty_meta()

    def __repr__(self) -> str:
        return (f"<CacheableQuadtree {self._name!r} len={self._meta.get('len', 0)} "
                f"bounds={tuple(self._meta.get('bounds', ()))}>")
