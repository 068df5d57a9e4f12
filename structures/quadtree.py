"""CacheableQuadtree: a point-region quadtree whose nodes are kept in manager entries.

A node is a short list, identified by an integer id (the root is 0)::

    [x0, y0, x1, y1, depth, count, children, points, tmin, size]

Nodes are stored in *pages*: one entry holds a group of four sibling nodes and their
descendants ``page_levels - 1`` levels down (3 by default: up to 84 nodes; the root page holds
the root and two levels), as a list of slots, ``None`` where no node is. A node's id is its
page number and its slot, both fixed by the tree's shape (see ``_kid_ids``), so a split knows
where its children go without reading anything. DEBS'22 makes every node an entry
(``page_levels=None`` does that here, and trees made by earlier versions keep it); but the
application's insert batches touch most leaves of the newest tree, so a batch paid a put
(dirty mark, policy update, weight) for each of ~230 nodes and a read per node per level, and
the tree's eviction, write and delete per node: ``mlcache bench events`` spent more in those
than in the tree's own work. With pages a batch puts ~15 entries and reads one or two per
level, and an aging tree moves down in ~20 writes.

``children`` is ``None`` at a leaf, else the ids of the four quadrants (SW, SE, NW, NE);
``points`` is ``None`` inside, and at a leaf a list in one of two forms: *packed*,
``[coords, data, data, ...]`` with ``coords`` one ``bytes`` of the doubles ``x, y, ts`` of
every point, when all of them are floats (the usual stream: a leaf is then a handful of
objects, which the heap, the garbage collector and the encoder of an evicted page walk far
faster than four objects a point), else flat, ``[x, y, data, ts, x, y, data, ts, ...]``, so
that ints, ``None`` times and float subclasses come back as they went in. A leaf goes flat
when a point that cannot be packed joins it, and is packed again when a split, merge, prune
or remove rebuilds it from points that all can be; ``count`` is the number of points in the subtree, so density questions
(``count(rect)``, ``grid_counts(depth)``) stop at the highest node that lies inside the region
and never read its leaves; ``tmin`` is a lower bound of the subtree's timestamps, so
``prune_older(t)`` skips subtrees with nothing to drop; ``size`` is the memory the node takes
in bytes (see below).

Nodes live in the heap as these very lists, inside their page's list. An operation reads
them (heap hits hand out the live objects), changes them and puts their pages back, which for
a resident page is a dict write and a dirty mark; a page is encoded (msgpack) only when it
leaves the heap, by eviction or a flush. An operation that changes the tree holds the pages it
read until it is done and changes those objects, so a page evicted and read again midway
(a tiny heap) does not split the operation's changes over two copies.
An earlier version stored each node as a packed msgpack blob, so that the heap could weigh it
in one step; it paid a pack per change and an unpack per read, hit or not (``mlcache bench
events``: 1.56x the plain-object baseline at heap=30%, most of it in the codec). Weighing is
what a live node would make costly instead: the heap walks a value it is handed. So the tree
keeps ``size`` itself, an upper bound of the node's allocations (see ``_quadtree_geometry``),
updated by the change that made it (an insert adds its points' sizes; a split, merge or prune
recomputes the few nodes it rebuilds); a page weighs its list of slots and its nodes' sizes,
summed at each put.

Point ``data`` must be plain data msgpack takes exactly (str, numbers, bytes, tuples, lists,
dicts, sets, None, or a structure, stored as a reference); anything else raises
``SerializationError`` before the tree changes. A change never leaves a half-changed node in
the heap when a level fails: ``insert_many`` reads every node it will change before changing
any, and ``remove`` and the prunes change copies of the nodes they read.

A leaf splits when it holds more than ``capacity`` points, unless it is at ``max_depth``
(identical points cannot be separated by splitting, so the depth limit is what keeps a burst of
duplicates from recursing forever). An inner node whose subtree falls to ``capacity // 2``
points or fewer, by ``remove`` or a prune, merges its children back into one leaf; the gap
between the split and the merge thresholds keeps a node near the boundary from flapping.
Bounds are closed: a point on the upper edge belongs to the tree and to the upper quadrant.

Every operation reads nodes level by level with one batched read per level (of the pages
holding them) and writes the touched pages with one batched put, so a cold tree costs one
round trip per level, not per node. ``insert_many`` routes a whole batch down together: each node on the way is read and
written once per batch instead of once per point, which is how a stream job should feed it.

:class:`~mlcache.structures.PlainQuadtree` (in ``_quadtree_plain``) is the very same code over
a plain ``dict`` of nodes, the all-in-heap baseline of ``mlcache bench events``; it keeps no
sizes.

The code is in parts: this module has the inserts and splits (``_QuadtreeOps``) and the
cacheable tree's node store; ``_quadtree_shrink`` removes, prunes and merges;
``_quadtree_query`` has the queries and ``verify``; ``_quadtree_pages`` the page numbering,
node keys and the checks on what is read back; ``_quadtree_geometry`` the node layout,
packed points and sizes. (What the application allocates for nodes, inserts and splits, stays
here: ``mlcache bench events`` counts node memory by the file that allocates it.)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from mlcache._readpath import MISSING as _MISSING

from ._quadtree_geometry import ANY as _ANY
from ._quadtree_geometry import (ASCII, COUNT, DEPTH, INNER_SIZE, KIDS, LEAF_SIZE, PACKED_HEAD,
                                 PACKED_POINT, PTS, ROOT, SIZE, TMIN, X0, X1, Y0, Y1, Point,
                                 _check_bounds, _child_bounds, _min_of, _quadrant, _quadtree_meta,
                                 _recs, ascii_strings, chars, data_size, doubles, flat_points,
                                 node_size, pack_values, packed_points, points_size)
from ._quadtree_geometry import NODE_CODEC as _NODE_CODEC
from ._quadtree_pages import (_ID_KEYS, _PAGE_HEAD, _PAGE_INNER, _PAGE_LEN, _PAGE_SHIFT, _SLOT,
                              _id_key, _loaded_size, _upgrade)
from ._quadtree_shrink import _QuadtreeShrink
from .base import Cacheable

__all__ = ["CacheableQuadtree", "Point"]


class _QuadtreeOps(_QuadtreeShrink):
    """The algorithms, written against ``self._nodes``/``_node``/``_keep``/``_forget``,
    ``self._meta`` and ``self._save_meta()``; shared by the cacheable and the plain tree.
    ``_sized``: whether nodes keep their ``size`` (the plain tree has no heap to tell)."""

    __slots__ = ()
    _sized = False
    _meta: dict[str, Any]
    _save_meta: Callable[[], None]
    _store: Callable[[Any], Any]
    _load: Callable[[Any], Any]
    _keep: Callable[[list], None]
    _forget: Callable[[list], None]

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
        return [x0, y0, x1, y1, 0, 0, None, [], None, LEAF_SIZE if self._sized else 0]

    def _point(self, x: Any, y: Any, data: Any, ts: Any) -> list:
        x0, y0, x1, y1 = self._meta["bounds"]
        if not (x0 <= x <= x1 and y0 <= y <= y1):
            raise ValueError(f"point ({x!r}, {y!r}) is outside the quadtree bounds "
                             f"({x0!r}, {y0!r}, {x1!r}, {y1!r})")
        return [x, y, self._store(data), ts]

    def _admit(self, recs: list, datas: list) -> bool:
        """Make the data of an insert's ``[x, y, ts, data]`` records what the tree stores and
        check it, raising before any change; return whether every datum is an ASCII string
        (what a sized tree weighs from lengths alone). The plain tree stores anything."""
        return False

    def _resize(self, node: list) -> None:
        if self._sized:
            node[SIZE] = node_size(node)

    # -- insert ------------------------------------------------------------------------------

    def insert(self, x: float, y: float, data: Any = None, ts: float | None = None) -> None:
        """Add one point (duplicates allowed). ``ts`` is what ``prune_older`` compares."""
        self.insert_many(((x, y, data, ts),))

    def insert_many(self, points: Iterable[Any]) -> int:
        """Add ``(x, y)``, ``(x, y, data)`` or ``(x, y, data, ts)`` tuples; returns how many.

        All points are checked before anything is written, so a bad point changes nothing."""
        bx0, by0, bx1, by1 = self._meta["bounds"]
        recs = []
        # whether the points can be packed (see _quadtree_geometry.packable): checked here,
        # a few bytecodes a point, rather than by a pass over the batch
        packs = True
        for p in points:
            n = len(p)
            if n != 4 and not 2 <= n <= 3:
                # (a fifth field was dropped silently, fewer than two an IndexError)
                raise ValueError(f"a point is (x, y), (x, y, data) or (x, y, data, ts), "
                                 f"got {p!r}")
            x, y = p[0], p[1]
            if not (bx0 <= x <= bx1 and by0 <= y <= by1):
                self._point(x, y, None, None)   # raises the ValueError naming the point
            ts = p[3] if n > 3 else None
            if packs and not (type(x) is float and type(y) is float and type(ts) is float
                              and ts == ts):
                packs = False
            # [x, y, ts, data]: the three numbers together, as a packed leaf keeps them
            recs.append([x, y, ts, p[2] if n > 2 else None])
        if not recs:
            return 0
        datas = [r[3] for r in recs]
        # stores nested structures as references and checks the data (before any change);
        # whether all data are ASCII strings
        ascii_data = self._admit(recs, datas)
        # Route the batch down first, reading every node on the way (the only I/O), and
        # change the nodes after: a level failing midway leaves them as they were.
        # Each node's new time bound is worked out here too, so that times that cannot be
        # compared (a str and a float) raise before any change. A NaN time is never below a
        # prune's t, so it stays out of the bound (which holds only what a prune must find).
        route: list[tuple[int, list, list, Any]] = []
        groups: dict[int, list] = {ROOT: recs}
        while groups:
            found = self._nodes(list(groups))
            deeper: dict[int, list] = {}
            for nid, batch in groups.items():
                node = found.get(nid) or self._root_node()
                tmin = node[TMIN]
                try:
                    for rec in batch:
                        if rec[2] is not None and (rec[2] < tmin if tmin is not None
                                                   else rec[2] == rec[2]):
                            tmin = rec[2]
                except TypeError:
                    raise TypeError(f"point ({rec[0]!r}, {rec[1]!r}) has a time ts={rec[2]!r} "
                                    f"that cannot be compared with the tree's times "
                                    f"(such as {tmin!r})") from None
                route.append((nid, node, batch, tmin))
                kids = node[KIDS]
                if kids is None:
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
        capacity, max_depth = self._meta["capacity"], self._meta["max_depth"]
        sized = self._sized
        # float coordinates and times (the usual batch) go into the leaves packed (see
        # _quadtree_geometry.PACKED_HEAD)
        # all ASCII strings (the usual data): a packed leaf's share weighs _ASCII + len each
        ascii_data = sized and packs and ascii_data
        touched: dict[int, list] = {}
        for nid, node, batch, tmin in route:
            touched[nid] = node
            node[COUNT] += len(batch)
            node[TMIN] = tmin
            if node[KIDS] is not None:
                continue
            pts = node[PTS]
            if packs and (not pts or type(pts[0]) is bytes):
                numbers = list(chain.from_iterable(batch))
                new_data = numbers[3::4]
                del numbers[3::4]
                coords = pack_values(numbers)
                if pts:
                    pts[0] += coords
                else:
                    pts.append(coords)
                    if sized:
                        node[SIZE] += PACKED_HEAD
                start = len(pts)
                pts.extend(new_data)
                if start - 1 + len(batch) > capacity and node[DEPTH] < max_depth:
                    self._split_packed(nid, node, pts, touched, capacity, max_depth)
                elif ascii_data:
                    node[SIZE] += ((PACKED_POINT + ASCII) * len(batch)
                                   + chars(new_data))
                elif sized:
                    node[SIZE] += PACKED_POINT * len(batch) + data_size(new_data)
                continue
            if pts and type(pts[0]) is bytes:   # a packed leaf gets points that cannot be
                pts = node[PTS] = flat_points(pts)
                self._resize(node)
            start = len(pts)
            for rec in batch:
                pts += (rec[0], rec[1], rec[3], rec[2])
            if len(pts) > 4 * capacity and node[DEPTH] < max_depth:
                self._split(nid, node, pts, touched, capacity, max_depth)
            elif sized:
                node[SIZE] += points_size(pts[start:])
        # deepest first: the heap's recency then favours the upper levels, which every
        # operation reads, over the leaves a batch touches once
        self._keep(list(touched.items())[::-1])
        self._meta["len"] += len(recs)
        self._save_meta()
        return len(recs)

    def _kid_ids(self, nid: int) -> list[int]:
        """Ids for the four children of node ``nid`` (being split): the next four."""
        first = self._meta["next"]
        self._meta["next"] = first + 4
        return [first, first + 1, first + 2, first + 3]

    def _split(self, nid: int, node: list, pts: list, touched: dict[int, list], capacity: int,
               max_depth: int) -> None:
        """Split leaf ``node`` holding the flat points ``pts`` (points that cannot be packed)."""
        kids = self._kid_ids(nid)
        self._meta["nodes"] += 4
        parts: list[list] = [[], [], [], []]
        for rec in _recs(pts):
            parts[_quadrant(node, rec[0], rec[1])].extend(rec)
        node[KIDS], node[PTS] = kids, None
        sized = self._sized
        if sized:
            node[SIZE] = INNER_SIZE
        for q in range(4):
            part = parts[q]
            cx0, cy0, cx1, cy1 = _child_bounds(node, q)
            # a list display of its items: exactly 10 slots (a starred one over-allocates)
            child = [cx0, cy0, cx1, cy1, node[DEPTH] + 1, len(part) // 4, None, None,
                     _min_of(part[3::4]), 0]
            touched[kids[q]] = child
            if len(part) > 4 * capacity and child[DEPTH] < max_depth:
                self._split(kids[q], child, part, touched, capacity, max_depth)
            else:
                child[PTS] = part = packed_points(part)
                if sized:
                    child[SIZE] = LEAF_SIZE + points_size(part)

    def _split_packed(self, nid: int, node: list, pts: list, touched: dict[int, list],
                      capacity: int, max_depth: int) -> None:
        """Split leaf ``node`` holding the packed points ``pts``."""
        v = doubles(pts[0]).tolist()
        datas = pts[1:]
        # ascii: every datum an ASCII string, each weighing ASCII + its length (checked once)
        self._split_records(nid, node, list(zip(v[0::3], v[1::3], v[2::3])), datas, touched,
                            capacity, max_depth, self._sized and ascii_strings(datas))

    def _split_records(self, nid: int, node: list, xyts: list, datas: list,
                       touched: dict[int, list], capacity: int, max_depth: int,
                       ascii: bool) -> None:
        kids = self._kid_ids(nid)
        self._meta["nodes"] += 4
        mx, my = (node[X0] + node[X1]) * 0.5, (node[Y0] + node[Y1]) * 0.5
        parts: tuple[list, ...] = ([], [], [], [])
        dparts: tuple[list, ...] = ([], [], [], [])
        for xyt, datum in zip(xyts, datas):
            q = (xyt[0] >= mx) | ((xyt[1] >= my) << 1)
            parts[q].append(xyt)
            dparts[q].append(datum)
        node[KIDS], node[PTS] = kids, None
        sized = self._sized
        if sized:
            node[SIZE] = INNER_SIZE
        for q in range(4):
            part, dpart = parts[q], dparts[q]
            cx0, cy0, cx1, cy1 = _child_bounds(node, q)
            # a list display of its items: exactly 10 slots (a starred one over-allocates)
            child = [cx0, cy0, cx1, cy1, node[DEPTH] + 1, len(part), None, None,
                     min(map(_TS, part)) if part else None, 0]
            touched[kids[q]] = child
            if len(part) > capacity and child[DEPTH] < max_depth:
                self._split_records(kids[q], child, part, dpart, touched, capacity, max_depth,
                                    ascii)
                continue
            if part:
                cpts = [pack_values(list(chain.from_iterable(part)))]
                cpts.extend(dpart)
            else:
                cpts = []
            child[PTS] = cpts
            if ascii:
                child[SIZE] = (LEAF_SIZE + PACKED_HEAD + (PACKED_POINT + ASCII) * len(part)
                               + chars(dpart)) if part else LEAF_SIZE
            elif sized:
                child[SIZE] = LEAF_SIZE + points_size(cpts)

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
            self._forget(ids)
        self._meta.update(len=0, nodes=1, next=1)
        self._save_meta()

    def _empty_meta(self) -> dict[str, Any]:
        return {**self._meta, "len": 0, "nodes": 1, "next": 1}

class CacheableQuadtree(_QuadtreeOps, Cacheable):
    """A quadtree whose nodes live in the cache levels.

    Open with ``manager.quadtree(name, bounds=(x0, y0, x1, y1), capacity=32, max_depth=16,
    page_levels=3)``; reopening by name needs no options (given ones must match).

    ``page_levels``: how many tree levels one cache entry (a *page*) holds: a group of four
    sibling nodes and their descendants ``page_levels - 1`` levels down (the root page: the
    root and ``page_levels - 1`` levels); ``None`` stores one node per entry, the layout of
    DEBS'22 and of trees made by earlier versions (which keep it when reopened)."""

    kind = "quadtree"
    __slots__ = ("_held",)
    _held: dict[int, Any] | None   # the pages a changing operation holds (see _holding)
    _sized = True
    _memo_keys = False   # node keys come from _kbs
    # the metadata is weighed from these and its fixed part (see Cacheable): every insert
    # batch puts it, and the heap's walk over its eight fields was ~10M instructions over
    # mlcache bench events
    _meta_counts = ("len", "nodes", "next")

    @classmethod
    def open(cls, manager: Any, name: str | None = None, **options: Any) -> Any:
        # nodes loaded from a level are weighed by the size they carry, not by a walk
        # (~20 us a node, three times its decode)
        weigh_with = getattr(manager, "_weigh_with", None)
        if weigh_with is not None:
            weigh_with(f"{cls.kind}:", _loaded_size)
        tree = super().open(manager, name, **options)
        try:
            tree._held
        except AttributeError:
            tree._held = None
        return tree

    # The node store goes to the manager's batched primitives (the ones its Namespace calls)
    # with byte keys made here: a Namespace call would build its own (key, bytes) pairs and
    # result dict on every level of every operation, a put could not carry the size, and the
    # manager's key memo is sized to the heap budget, a few hundred keys at 30% of this
    # benchmark's state, so node keys would be encoded again on nearly every access.
    def _kbs(self, ids: Iterable[int]) -> list[bytes]:
        prefix = self._ns._prefix
        table = _ID_KEYS
        try:
            return [prefix + table[nid] for nid in ids]
        except IndexError:
            return [prefix + _id_key(nid) for nid in ids]

    def _nodes(self, ids: Iterable[int]) -> dict[int, list]:
        if self._meta.get("page_levels"):
            return self._page_nodes(ids)   # (which lets its pages go itself)
        # the nodes the previous read returned (a batch larger than the heap evicts its own
        # first values, lent while they were being returned) are let go by now
        self._manager._release_loans()
        ids = list(ids)
        values = self._manager._get_kbs(self._kbs(ids))
        out = dict(zip(ids, values))
        if values and (len(set(map(type, values))) > 1 or type(values[0]) is not list):
            for nid, node in list(out.items()):   # misses, or nodes of the earlier layout
                if node is _MISSING:
                    del out[nid]
                elif type(node) is not list:
                    out[nid] = _upgrade(node)
        return out

    def _node(self, nid: int) -> list | None:
        if self._meta.get("page_levels"):
            return self._page_nodes((nid,)).get(nid)
        node = self._manager._get_kb(self._ns._prefix + _id_key(nid), None, None)
        return node if node is None or type(node) is list else _upgrade(node)

    def _keep(self, items: list[tuple[int, list]]) -> None:
        if self._meta.get("page_levels"):
            pages: dict[int, list] = {}
            for nid, node in items:
                pid = nid >> _PAGE_SHIFT
                page = pages.get(pid)
                if page is None:
                    page = pages[pid] = self._page(pid)
                page[nid & _SLOT] = node
            self._put_pages(pages)
            return
        kbs = self._kbs([nid for nid, _ in items])
        self._manager._put_items([(nid, kb, node) for (nid, node), kb in zip(items, kbs)],
                                 None, [node[SIZE] for _, node in items])

    def _forget(self, ids: Iterable[int]) -> None:
        if self._meta.get("page_levels"):
            pages: dict[int, list] = {}
            for nid in ids:
                pid = nid >> _PAGE_SHIFT
                page = pages.get(pid)
                if page is None:
                    page = pages[pid] = self._page(pid)
                page[nid & _SLOT] = None
            empty = [pid for pid, page in pages.items() if not any(page)]
            for pid in empty:
                del pages[pid]
            if pages:
                self._put_pages(pages)
            if empty:
                self._manager._delete_kbs(self._kbs(empty))
            return
        self._manager._delete_kbs(self._kbs(ids))

    # -- pages -------------------------------------------------------------------------------
    # A node's id is its page's number shifted left by _PAGE_SHIFT plus its slot in the page:
    # slots 0-3 hold a group of four siblings (the root page: the root alone, in slot 0), and
    # the children of the node in slot s take slots 4s+4 .. 4s+7 while that stays inside the
    # page's ``page_levels`` levels; deeper children start a page of their own. Slots are
    # fixed by the shape, so a split finds its children's ids without reading anything, and a
    # page is a list of that many slots, None where no node is. Pages are numbered in order
    # of creation (``meta["next"]``), page 0 is the root's.

    def _kid_ids(self, nid: int) -> list[int]:
        levels = self._meta.get("page_levels")
        if not levels:
            return super()._kid_ids(nid)
        slot = nid & _SLOT
        if slot < _PAGE_INNER[levels]:
            first = nid - slot + 4 * slot + 4
        else:
            pid = self._meta["next"]
            self._meta["next"] = pid + 1
            if self._held is not None:
                self._held[pid] = None   # known absent: no read for it
            first = pid << _PAGE_SHIFT
        return [first, first + 1, first + 2, first + 3]

    def _page_nodes(self, ids: Iterable[int]) -> dict[int, list]:
        held = self._held
        meta = self._meta
        if not meta["len"] and meta["nodes"] == 1:
            # an empty tree is at most an empty root leaf, which the operations make when
            # they find none: no read (a new tree's would go through every level for nothing)
            if held is not None:
                held.setdefault(ROOT, None)
            return {}
        ids = list(ids)
        pids = list(dict.fromkeys([nid >> _PAGE_SHIFT for nid in ids]))
        values = self._manager._get_kbs(self._kbs(pids))
        pages = {}
        for pid, page in zip(pids, values):
            if page is _MISSING:
                page = None
            if held is not None:
                page = held.setdefault(pid, page)
            if page is not None:
                pages[pid] = page
        out = {}
        for nid in ids:
            page = pages.get(nid >> _PAGE_SHIFT)
            if page is not None:
                node = page[nid & _SLOT]
                if node is not None:
                    out[nid] = node
        if held is None:
            # the pages themselves are let go here (the nodes out holds do not hold them):
            # those the heap lent while this batch read them (see _nodes) go now
            del values, pages
            page = None
            self._manager._release_loans()
        return out

    def _page(self, pid: int) -> list:
        """Page ``pid`` to change: the object this operation read (an operation changes the
        pages it read, never copies it reads again), else read now, else a new empty one."""
        held = self._held
        if held is not None and pid in held:
            page = held[pid]
        else:
            page = self._manager._get_kbs(self._kbs((pid,)))[0]
            if page is _MISSING:
                page = None
        if page is None:
            page = [None] * _PAGE_LEN[self._meta["page_levels"]]
        if held is not None:
            held[pid] = page
        return page

    def _put_pages(self, pages: dict[int, list]) -> None:
        pids = list(pages)
        head = _PAGE_HEAD[len(pages[pids[0]])]
        self._manager._put_items(
            [(pid, kb, page) for (pid, page), kb in zip(pages.items(), self._kbs(pids))],
            None, [head + sum(map(_size_of, filter(None, page))) for page in pages.values()])

    def _holding(self, op: Callable[..., Any], *args: Any) -> Any:
        """Run a changing operation holding the pages it reads, so that its changes go into
        those very objects (see ``_page``); queries hold nothing."""
        if self._held is not None or not self._meta.get("page_levels"):
            return op(*args)
        self._held = {}
        try:
            return op(*args)
        finally:
            self._held = None
            # pages the heap evicted while the operation held them were lent (the manager
            # keeps a value someone holds: mlcache._loans); the changed ones were put back,
            # the others are let go now rather than at the next flush
            self._manager._release_loans()

    def insert_many(self, points: Iterable[Any]) -> int:
        return self._holding(super().insert_many, points)

    def remove(self, x: float, y: float, data: Any = _ANY) -> Point:
        return self._holding(super().remove, x, y, data)

    def _prune(self, drop: Callable[[Sequence[Any]], bool], t: float | None) -> int:
        return self._holding(super()._prune, drop, t)

    def clear(self) -> None:
        return self._holding(super().clear)

    # -- the rest ----------------------------------------------------------------------------

    def _admit(self, recs: list, datas: list) -> bool:
        if ascii_strings(datas):
            return True   # msgpack takes any ASCII string: nothing to check
        types = set(map(type, datas))
        if any(issubclass(t, Cacheable) for t in types):
            store = self._store
            for r in recs:
                r[3] = store(r[3])
            datas = [r[3] for r in recs]
        self._check_data(datas)
        return False

    @staticmethod
    def _check_data(values: list) -> None:
        _NODE_CODEC.encode(values)

    def _new_meta(self, bounds: Any = None, capacity: int = 32,  # type: ignore[override]
                  max_depth: int = 16, page_levels: int | None = 3) -> dict[str, Any]:
        meta = _quadtree_meta(bounds, capacity, max_depth)
        if page_levels is not None:
            if isinstance(page_levels, bool) or page_levels not in _PAGE_LEN:
                raise ValueError(f"page_levels must be None or an integer from 1 to "
                                 f"{max(_PAGE_LEN)}, got {page_levels!r}")
            meta["page_levels"] = page_levels
        return meta

    def _check_meta(self, meta: dict[str, Any], bounds: Any = None,  # type: ignore[override]
                    capacity: int | None = None, max_depth: int | None = None,
                    page_levels: Any = _ANY) -> None:
        super()._check_meta(meta)
        if bounds is not None and _check_bounds(bounds) != list(meta["bounds"]):
            raise ValueError(f"quadtree {self._name!r} exists with bounds "
                             f"{tuple(meta['bounds'])}, not {tuple(bounds)}")
        if page_levels is not _ANY and page_levels != meta.get("page_levels"):
            raise ValueError(f"quadtree {self._name!r} exists with page_levels="
                             f"{meta.get('page_levels')!r}, not {page_levels!r}")

    def drop(self) -> None:
        # Node (or page) ids are handed out in order, so every entry that ever existed is
        # below ``next``: delete them blindly rather than list the namespace, which scans
        # every level (a Redis SCAN over the whole key space) on each roll of a window.
        self._manager._delete_kbs(self._kbs(range(int(self._meta.get("next", 1)))))
        self._metans.delete((self.kind, self._name))
        self._meta = self._empty_meta()

    def __repr__(self) -> str:
        return (f"<CacheableQuadtree {self._name!r} len={self._meta.get('len', 0)} "
                f"bounds={tuple(self._meta.get('bounds', ()))}>")


_size_of = itemgetter(SIZE)
_TS = itemgetter(2)      # of an (x, y, ts) triple
