"""A packed quadtree leaf stores its doubles little-endian, whatever the machine.

Regression: the coordinates of a packed leaf were packed with the native byte order
(``struct`` ``"d"``, read back with ``memoryview.cast("d")``), so a durable level written on a
big-endian machine would read back as other numbers on a little-endian one.
"""
from __future__ import annotations

import struct

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.structures import PlainQuadtree
from mlcache.structures import _quadtree_geometry as geometry
from mlcache.structures._quadtree_geometry import PTS, doubles, pack_values, packed_points

BOUNDS = (0.0, 0.0, 100.0, 100.0)
POINTS = [(1.5, 2.25, "a", 10.125), (80.0, 3.0, "b", -7.5), (4.0, 99.75, "c", 1e300)]


def _little(points):
    return struct.pack(f"<{3 * len(points)}d", *(v for x, y, _d, t in points for v in (x, y, t)))


def test_pack_values_is_little_endian():
    values = [1.5, -2.0, 3.25e-300, 1e300]
    assert pack_values(values) == struct.pack("<4d", *values)
    # explicitly so, not by the accident of a little-endian machine (native "d" packs the
    # same bytes here, and other ones on a big-endian machine)
    assert geometry._PACKERS[4].format == "<4d"
    flat = [v for x, y, d, t in POINTS for v in (x, y, d, t)]
    assert packed_points(flat)[0] == _little(POINTS)


def test_a_durable_level_stores_the_doubles_little_endian(tmp_path):
    config = CacheConfig(heap=HeapConfig(max_entries=50, max_bytes=None),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(config) as m:
        tree = m.quadtree("t", BOUNDS, capacity=8, page_levels=None)   # the root is entry 0
        tree.insert_many(POINTS)
    with CacheManager(config) as m:
        disk = m._levels[-1]
        raws = [raw for raw in disk.get_many(list(disk.scan(b""))) if raw is not None]
        leaves = []
        for raw in raws:
            node = m._codec.decode(raw)
            if type(node) is list and len(node) == 10 and type(node[PTS]) is list:
                leaves.append(node[PTS])
        assert any(pts and pts[0] == _little(POINTS) for pts in leaves), leaves
        tree = m.quadtree("t", BOUNDS)
        assert sorted((p.x, p.y, p.data, p.ts) for p in tree) == sorted(POINTS)


def test_the_plain_tree_packs_little_endian_too():
    tree = PlainQuadtree(BOUNDS, capacity=8)
    tree.insert_many(POINTS)
    assert tree._nodes_by_id[0][PTS][0] == _little(POINTS)


def test_doubles_reads_the_stored_order_on_either_kind_of_machine(monkeypatch):
    values = [1.5, -2.0, 3.25e-300, 1e300]
    assert doubles(struct.pack("<4d", *values)).tolist() == values
    # the other branch, for a machine whose native order is not the stored one: it swaps
    # the bytes, so fed the other order from here it must recover the values too
    monkeypatch.setattr(geometry, "_LITTLE", not geometry._LITTLE)
    other = ">" if struct.pack("=d", 1.0) == struct.pack("<d", 1.0) else "<"
    assert doubles(struct.pack(f"{other}4d", *values)).tolist() == values
