"""The storage side of a cacheable quadtree: page numbering, node keys, and the checks on a
node or page read back from a level (see :class:`~mlcache.structures.CacheableQuadtree`).

A node's id is its page's number shifted left by ``_PAGE_SHIFT`` plus its slot in the page;
a page of ``page_levels`` levels is a list of ``_PAGE_LEN[page_levels]`` slots.
"""
from __future__ import annotations

from typing import Any

import msgpack

from mlcache.levels.heap import _alloc

from ._quadtree_geometry import (FLOAT_POINT, INNER_SIZE, KIDS, LEAF_SIZE, PACKED_HEAD,
                                 PACKED_POINT, PTS, SIZE, node_size)
from ._quadtree_geometry import NODE_CODEC as _NODE_CODEC

__all__: list[str] = []

_PAGE_SHIFT = 9
_SLOT = (1 << _PAGE_SHIFT) - 1
# per page_levels: the slots of a page (4 + 16 + ...) and the first slot whose children
# start a page of their own
_PAGE_LEN = {k: sum(4 ** (i + 1) for i in range(k)) for k in (1, 2, 3, 4)}
_PAGE_INNER = {k: _PAGE_LEN[k] - 4 ** k for k in _PAGE_LEN}
# the memory of a page's list of slots (the nodes are charged their own sizes)
_PAGE_HEAD = {n: 64 + _alloc(8 * n) for n in _PAGE_LEN.values()}


# msgpack of the node ids 0, 1, 2, ...: a node's key is its tree's prefix and this (what
# mlcache.keys.encode_key gives for an int), grown on demand up to _ID_TABLE_MAX ids.
_ID_KEYS: list[bytes] = []
_ID_TABLE_MAX = 1 << 16
_MIN_POINT = FLOAT_POINT + 32   # a point with float coordinates and the smallest datum (None)
_MIN_PACKED = PACKED_POINT + 32   # a packed point with the smallest datum


def _id_key(nid: int) -> bytes:
    table = _ID_KEYS
    if nid < len(table):
        return table[nid]
    if nid < _ID_TABLE_MAX:
        table.extend(msgpack.packb(i) for i in range(len(table), min(_ID_TABLE_MAX,
                                                                     2 * nid + 64)))
        return table[nid]
    return msgpack.packb(nid)


def _loaded_size(value: Any) -> int | None:
    """The size a node or a page read back from a level carries, if it is plausible: an
    inner node's is fixed, a leaf's at least what its points take with the smallest data (a
    wrong one from a damaged entry would otherwise let the heap hold more than its budget), a
    page's its slots' and its nodes'; else None, and the heap weighs the value itself."""
    if type(value) is not list:
        return None
    head = _PAGE_HEAD.get(len(value))
    if head is None or type(value[0]) is float:   # a node (a page's slot 0 is one or None)
        return _node_loaded_size(value)
    total = head
    for node in value:
        if node is not None:
            size = _node_loaded_size(node)
            if size is None:
                return None
            total += size
    return total


def _node_loaded_size(node: Any) -> int | None:
    if type(node) is not list or len(node) != 10 or type(node[SIZE]) is not int:
        return None
    if node[KIDS] is not None:
        return INNER_SIZE if node[SIZE] == INNER_SIZE else None
    pts = node[PTS]
    if type(pts) is not list:
        return None
    if pts and type(pts[0]) is bytes:
        n = len(pts) - 1
        if len(pts[0]) != 24 * n or node[SIZE] < LEAF_SIZE + PACKED_HEAD + _MIN_PACKED * n:
            return None
    elif node[SIZE] < LEAF_SIZE + _MIN_POINT * (len(pts) >> 2):
        return None
    return int(node[SIZE])


def _upgrade(blob: Any) -> list:
    """A node as an earlier version stored it (one msgpack blob of the first nine fields);
    the next change of the node writes it back in the current form."""
    node = _NODE_CODEC.decode(blob)
    node.append(0)
    node[SIZE] = node_size(node)
    return node
