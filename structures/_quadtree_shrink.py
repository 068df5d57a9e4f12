"""Taking points out of a quadtree: ``remove``, ``prune``/``prune_older``, and the merge of an
under-full subtree back into one leaf (the rest of the algorithms are in :mod:`.quadtree`).

An inner node whose subtree falls to ``capacity // 2`` points or fewer merges its children
back into one leaf; the gap between that and the split threshold (``capacity``) keeps a node
near the boundary from flapping. These operations change *copies* of the nodes they read:
a merge reads more nodes after the first changes are decided, and a level failing midway must
leave the heap's nodes (the live originals) as they were.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._quadtree_geometry import ANY as _ANY
from ._quadtree_geometry import (COUNT, KIDS, PTS, ROOT, TMIN, Point, _min_of, _min_ts,
                                 _quadrant, _recs, flat_points, n_points, packed_points)
from ._quadtree_query import _QuadtreeQueries

__all__: list[str] = []


class _QuadtreeShrink(_QuadtreeQueries):
    """Removal, prunes and merges, over ``self._nodes``/``_node``/``_keep``/``_forget``,
    ``self._meta`` and ``self._save_meta()`` (see ``_QuadtreeOps``)."""

    __slots__ = ()
    _save_meta: Callable[[], None]
    _store: Callable[[Any], Any]
    _keep: Callable[[list], None]
    _forget: Callable[[list], None]
    _resize: Callable[[list], None]

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
        pts = flat_points(node[PTS])
        stored = _ANY if data is _ANY else self._store(data)
        for j in range(0, len(pts), 4):
            if pts[j] == x and pts[j + 1] == y and (stored is _ANY or pts[j + 2] == stored):
                break
        else:
            raise ValueError(f"point ({x!r}, {y!r}) is not in the quadtree")
        rec = pts[j:j + 4]
        # change copies: merging below reads nodes, and a failed read must leave these as
        # they were (the heap holds the originals)
        path = [(pid, n[:]) for pid, n in path]
        node = path[-1][1]
        node[PTS] = packed_points(pts[:j] + pts[j + 4:])
        for _, n in path:
            n[COUNT] -= 1
        self._resize(node)
        touched: dict[int, list] = dict(path)
        gone: list[int] = []
        nodes = self._meta["nodes"]
        try:
            for pid, parent in reversed(path[:-1]):
                if parent[COUNT] > self._merge_below():
                    break
                self._collapse(parent, touched, gone)
        except BaseException:
            self._meta["nodes"] = nodes   # a merge's count, for nodes left as they were
            raise
        for nid in gone:
            touched.pop(nid, None)
        self._keep(list(touched.items()))
        if gone:
            self._forget(gone)
        self._meta["len"] -= 1
        self._save_meta()
        return self._as_point(rec)

    def _merge_below(self) -> int:
        return int(self._meta["capacity"]) // 2

    def _collapse(self, node: list, touched: dict[int, list], gone: list[int]) -> None:
        """Turn an inner node (a copy the caller owns) into a leaf holding all its subtree's
        points."""
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
                    flat = flat_points(child[PTS])
                    points.extend(flat)
                    tmin = _min_ts(tmin, _min_of(flat[3::4]))
                else:
                    nxt.extend(child[KIDS])
            frontier = nxt
        self._meta["nodes"] -= len(gone) - before
        node[KIDS], node[PTS] = None, packed_points(points)
        node[COUNT], node[TMIN] = len(points) // 4, tmin
        self._resize(node)

    # -- prune -------------------------------------------------------------------------------

    def prune(self, predicate: Callable[[Point], bool]) -> int:
        """Remove every point for which ``predicate(point)`` is true; returns how many.
        Subtrees left under-full are merged."""
        return self._prune(lambda rec: bool(predicate(self._as_point(rec))), None)

    def prune_older(self, t: float) -> int:
        """Remove points with a timestamp ``< t`` (points without one stay); returns how many."""
        return self._prune(lambda rec: rec[3] is not None and rec[3] < t, t)

    def _prune(self, drop: Callable[[Sequence[Any]], bool], t: float | None) -> int:
        touched: dict[int, list] = {}
        gone: list[int] = []
        root = self._node(ROOT)
        if root is None:
            return 0
        nodes = self._meta["nodes"]
        try:
            removed = self._prune_node(ROOT, root, drop, t, touched, gone)
        except BaseException:
            # (a predicate raising, or a level failing, after a subtree had merged: the
            # nodes are left as they were, and so must their count be, which verify() and
            # node_count read and the next change saved)
            self._meta["nodes"] = nodes
            raise
        for nid in gone:
            touched.pop(nid, None)
        if touched:
            self._keep(list(touched.items()))
        if gone:
            self._forget(gone)
        if removed:
            self._meta["len"] -= removed
            self._save_meta()
        return removed

    def _prune_node(self, nid: int, node: list, drop: Callable[[Sequence[Any]], bool], t: float | None,
                    touched: dict[int, list], gone: list[int]) -> int:
        """Prune the subtree of ``node``; a changed node goes to ``touched`` as a copy."""
        if node[COUNT] == 0 or (t is not None and (node[TMIN] is None or node[TMIN] >= t)):
            return 0
        if node[KIDS] is None:
            pts = node[PTS]
            keep = [v for rec in _recs(pts) if not drop(rec) for v in rec]
            removed = n_points(pts) - len(keep) // 4
            if removed:
                node = node[:]
                node[PTS], node[COUNT], node[TMIN] = (packed_points(keep), len(keep) // 4,
                                                      _min_of(keep[3::4]))
                self._resize(node)
                touched[nid] = node
            return removed
        kids = node[KIDS]
        found = self._nodes(kids)
        removed = 0
        tmin = None
        for kid in kids:
            removed += self._prune_node(kid, found[kid], drop, t, touched, gone)
            tmin = _min_ts(tmin, touched.get(kid, found[kid])[TMIN])
        if removed:
            node = node[:]
            node[COUNT] -= removed
            node[TMIN] = tmin
            touched[nid] = node
            if node[COUNT] <= self._merge_below():
                self._collapse(node, touched, gone)
        return removed
