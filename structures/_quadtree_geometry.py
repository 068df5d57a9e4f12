"""Node layout and geometry shared by the quadtree classes (see :mod:`.quadtree`)."""
from __future__ import annotations

import math
import sys
import struct
from array import array
from itertools import chain, filterfalse
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Sequence

from mlcache.codec import Codec
from mlcache.levels.heap import estimate_size

__all__ = ["Point"]

X0, Y0, X1, Y1, DEPTH, COUNT, KIDS, PTS, TMIN, SIZE = range(10)
ROOT = 0
# Point data must be plain data msgpack takes exactly (never pickled): checked with this codec
# before a tree changes. It also reads nodes written as one msgpack blob by earlier versions.
NODE_CODEC = Codec(allow_pickle=False)
ANY: Any = object()

# -- the memory a node takes, as the heap is charged for it ----------------------------------
# Upper bounds of what CPython (64-bit) allocates for a node, with the allocator's rounding to
# 16 bytes; checked against a walk over live and decoded nodes in
# tests/test_structures_quadtree.py. A node: its 10-slot list (object 56 -> 64, items 80) and
# eight scalars at 32 each (four bounds, depth, count, tmin, size, and the None in the unused
# slot). An inner node adds its 4-slot children list (64 + 32) and the ids. A leaf adds its
# point list's object (64), its item array's malloc header and rounding (24) and the slack of
# list growth (64). Per point: 4 slots with growth slack (36), then the objects: a float or
# None 32, a str by its length (see ``_datum``), anything else ``sys.getsizeof`` plus 15 for
# the rounding, containers walked. Shared objects (None, small ints, interned strings) are
# counted as if owned, so the bound errs high.
_NODE = 64 + 80 + 9 * 32
INNER_SIZE = _NODE + 64 + 32 + 4 * 32
LEAF_SIZE = _NODE + 64 + 24 + 64
SLOTS_PER_POINT = 36
_ROUND = 15
FLOAT_POINT = SLOTS_PER_POINT + 3 * 32   # a point but its data, when x, y and ts are floats
# A str: an ASCII one is 49 bytes and its characters. Any other: up to 76 + 4 per character,
# plus the UTF-8 copy CPython caches in it once it is encoded (an eviction does), up to 1 + 4
# per character, and that buffer's rounding: 92 + 8 per character; computed from the length,
# never from sys.getsizeof, so a string weighs the same before and after it was encoded.
_ASCII, _WIDE, _WIDE_CHAR = 49 + _ROUND, 92 + _ROUND, 8
ASCII = _ASCII
_FLAT = frozenset((str, bytes, int, float, bool, type(None)))
_FLOATS = frozenset((float, type(None)))
_UNTRACKED = frozenset((bytes, int, float, bool, type(None)))
_STR = {str}
_getsizeof = sys.getsizeof
# A leaf whose points all have float coordinates and a float time (none NaN) keeps them
# *packed*: ``[coords, data, data, ...]``, ``coords`` one ``bytes`` of the doubles x, y, ts per
# point (see ``_recs``), little-endian IEEE 754 whatever the machine, so that a page written
# to a durable level on one machine reads the same on another. Per point: a slot of the list
# with growth slack (9) and 24 bytes of doubles; per leaf: a slot for ``coords`` and the bytes
# object's header and rounding (33 + 23).
PACKED_HEAD = 9 + 56
PACKED_POINT = 9 + 24
_FLOAT_ONLY = {float}
_isnan = math.isnan


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
    if not all(math.isfinite(2.0 * v) for v in (x0, y0, x1, y1)):
        # a node's midpoint is (x0 + x1) * 0.5: past half the largest double the sum is inf,
        # a quadrant's bounds became inf and grid_counts (x1 - x0 inf) put every point in
        # cell (0, 0)
        raise ValueError(f"bounds must lie within +-{sys.float_info.max / 2:.4g} (half the "
                         f"largest float, so that midpoints do not overflow), got {bounds!r}")
    return [x0, y0, x1, y1]


def _min_ts(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


_LITTLE = sys.byteorder == "little"


def doubles(coords: bytes) -> Any:
    """The doubles of a packed leaf's ``coords`` (little-endian bytes), as a sequence with
    slicing and ``tolist()``: a view of the bytes on a little-endian machine (no copy), else
    a byte-swapped array."""
    if _LITTLE:
        return memoryview(coords).cast("d")
    values = array("d", coords)
    values.byteswap()
    return values


def _recs(pts: list) -> Iterator[tuple]:
    """The ``(x, y, data, ts)`` records of a leaf's points, packed or flat."""
    if pts and type(pts[0]) is bytes:
        v = doubles(pts[0]).tolist()
        return zip(v[0::3], v[1::3], pts[1:], v[2::3])
    return zip(pts[0::4], pts[1::4], pts[2::4], pts[3::4])


def _xys(pts: list) -> Iterator[tuple]:
    """The ``(x, y)`` of a leaf's points, packed or flat (no times or data made)."""
    if pts and type(pts[0]) is bytes:
        v = doubles(pts[0])
        return zip(v[0::3].tolist(), v[1::3].tolist())
    return zip(pts[0::4], pts[1::4])


def _columns(pts: list) -> tuple[list, list]:
    """The x and the y of a leaf's points, as two lists, packed or flat."""
    if pts and type(pts[0]) is bytes:
        v = doubles(pts[0])
        return v[0::3].tolist(), v[1::3].tolist()
    return pts[0::4], pts[1::4]


def is_packed(pts: list) -> bool:
    """Whether a leaf's points are packed (``[coords, data, ...]``, see ``PACKED_HEAD``)."""
    return bool(pts) and type(pts[0]) is bytes


def n_points(pts: Sequence[Any]) -> int:
    """How many points a leaf's point list holds, packed or flat."""
    if pts and type(pts[0]) is bytes:
        return len(pts) - 1
    return len(pts) >> 2


def packable(numbers: list) -> bool:
    """Whether ``[x, y, ts, x, y, ts, ...]`` can be packed as doubles exactly: all floats (not
    a subclass, not None, not an int) and no NaN time (x and y are checked against the
    bounds, so never NaN). Times summing to NaN (+inf and -inf, never the usual batch) keep
    the points unpacked too, which is only the slower layout."""
    if not set(map(type, numbers)) <= _FLOAT_ONLY:
        return False
    total = sum(numbers[2::3])
    return total == total


def pack_values(values: list) -> bytes:
    """The doubles ``values`` as little-endian bytes (the ``coords`` of a packed leaf)."""
    packer = _PACKERS.get(len(values))
    if packer is None:
        packer = struct.Struct(f"<{len(values)}d")
        if len(values) <= 3 * 1024:
            _PACKERS[len(values)] = packer
    return packer.pack(*values)


# struct.Struct by number of doubles: packing a leaf's numbers (converted by
# PyFloat_AsDouble) costs half of array("d", ...)'s per-item argument parsing
_PACKERS: dict[int, struct.Struct] = {}


def flat_points(pts: list) -> list:
    """A leaf's points as a flat ``[x, y, data, ts, ...]`` list (a new list)."""
    if pts and type(pts[0]) is bytes:
        return list(chain.from_iterable(_recs(pts)))
    return pts[:]


def packed_points(flat: list) -> list:
    """The point list a leaf keeps for the flat ``[x, y, data, ts, ...]`` records: packed if
    every coordinate and time can be, else ``flat`` itself."""
    if not flat:
        return flat
    n = len(flat) >> 2
    values = [0.0] * (3 * n)
    values[0::3], values[1::3], values[2::3] = flat[0::4], flat[1::4], flat[3::4]
    if not packable(values):
        return flat
    out = [pack_values(values)]
    out.extend(flat[2::4])
    return out


def _min_of(values: Iterable[float | None]) -> float | None:
    """The least of ``values`` but None and NaN (a NaN time is never below a prune's t)."""
    present = [v for v in values if v is not None and v == v]
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


# A split (and a prune) recurses once a level: past Python's recursion limit a pile of
# duplicates split down to a larger max_depth raised RecursionError halfway through the
# change, leaving the root pointing at children that were never stored. 256 halvings make
# cells 2**-256 of the bounds wide, finer than doubles separate points but next to zero.
MAX_DEPTH = 256


def _quadtree_meta(bounds: Any, capacity: int, max_depth: int) -> dict[str, Any]:
    if bounds is None:
        raise ValueError("a new quadtree needs bounds=(x0, y0, x1, y1)")
    b = _check_bounds(bounds)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    if (isinstance(max_depth, bool) or not isinstance(max_depth, int)
            or not 0 <= max_depth <= MAX_DEPTH):
        raise ValueError(f"max_depth must be an integer from 0 to {MAX_DEPTH}, "
                         f"got {max_depth!r}")
    return {"len": 0, "bounds": b, "capacity": capacity, "max_depth": max_depth,
            "next": 1, "nodes": 1}


def _datum(d: Any) -> int:
    """The bytes one point datum takes (see the constants above). Computed from lengths and
    counts, never from ``sys.getsizeof`` of a container, whose tables depend on the object's
    history (a list that shrank, a set decoded from its list), so a datum weighs the same in
    the node that was built and in the one decoded from it."""
    t = type(d)
    if t is str:
        return _ASCII + len(d) if d.isascii() else _WIDE + _WIDE_CHAR * len(d)
    if t is float or d is None:
        return 32
    if t in _UNTRACKED:
        return _getsizeof(d) + _ROUND
    if t is tuple:
        return 40 + 8 * len(d) + _ROUND + sum(map(_datum, d))
    if t is list:                       # slack: up to twice its length after removals
        return 64 + 8 * (2 * len(d) + 8) + 24 + sum(map(_datum, d))
    if t is set or t is frozenset:      # a table of up to 8 slots of 16 bytes per element
        return 232 + 128 * len(d) + 24 + sum(map(_datum, d))
    if t is dict:
        return 128 + 40 * (2 * len(d) + 8) + 24 + sum(_datum(k) + _datum(v)
                                                       for k, v in d.items())
    return estimate_size(d) + _ROUND


def data_size(datas: list) -> int:
    """The bytes the point data ``datas`` take, summed (see ``_datum``).

    All strings (the usual batch) are summed from their lengths in C: a Python call per datum
    would cost more than the rest of the insert's bookkeeping."""
    if set(map(type, datas)) == _STR:
        wide = list(filterfalse(str.isascii, datas))
        return (_ASCII * len(datas) + sum(map(len, datas))
                + (_WIDE - _ASCII) * len(wide) + (_WIDE_CHAR - 1) * sum(map(len, wide)))
    return sum(map(_datum, datas))


def ascii_strings(datas: list) -> bool:
    """Whether ``datas`` (not empty) are all ASCII strings, each weighing ``ASCII + len(d)``.

    In C, and about half the instructions of a set of the types and an ``isascii`` call per
    datum: one join (a ``TypeError`` for anything but strings; the result is ASCII exactly
    when every part is), then a count of the exact type, since a subclass of ``str`` takes
    more memory than its characters and is weighed otherwise."""
    if not datas:
        return False
    try:
        if not "".join(datas).isascii():
            return False
    except TypeError:
        return False
    return list(map(type, datas)).count(str) == len(datas)


def chars(strings: list) -> int:
    """The characters of ``strings`` in all (``sum(map(len, strings))`` in a third of the
    instructions: one join)."""
    return len("".join(strings))


def float_points(recs: list) -> bool:
    """Whether every ``[x, y, data, ts]`` record of ``recs`` has float coordinates and a float
    (or no) time: such a point weighs ``FLOAT_POINT`` plus its data."""
    flat = list(chain.from_iterable(recs))
    return (set(map(type, flat[0::4])) | set(map(type, flat[1::4]))
            | set(map(type, flat[3::4]))) <= _FLOATS


def float_flat(pts: list) -> bool:
    """Whether every point of a flat ``[x, y, data, ts, ...]`` list has float coordinates
    and a float (or no) time (``float_points`` for a leaf's list)."""
    return (set(map(type, pts[0::4])) | set(map(type, pts[1::4]))
            | set(map(type, pts[3::4]))) <= _FLOATS


def points_size(pts: list) -> int:
    """Bytes taken by the points of a leaf's point list (not the list's header)."""
    if pts and type(pts[0]) is bytes:
        datas = pts[1:]
        return PACKED_HEAD + PACKED_POINT * len(datas) + data_size(datas)
    datas = pts[2::4]
    size = SLOTS_PER_POINT * len(datas) + data_size(datas)
    coords = pts[0::4] + pts[1::4] + pts[3::4]
    if set(map(type, coords)) <= _FLOATS:
        return size + 32 * len(coords)
    return size + sum(map(_datum, coords))


def node_size(node: list) -> int:
    """The bytes ``node`` takes, computed from scratch (what ``node[SIZE]`` maintains)."""
    if node[KIDS] is not None:
        return INNER_SIZE
    return LEAF_SIZE + points_size(node[PTS])
