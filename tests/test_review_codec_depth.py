"""Review, session 8: values of tuples or sets nested past the msgpack decoder's C stack.

Each tuple, set or frozenset of a value is a msgpack ext type, packed and unpacked by a nested
msgpack call whose unpacker keeps ~40 KB on the C stack. A value of tuples nested 200 deep was
encoded, then killed the process with a segfault when it was read back (and 400 deep raised a
bare RecursionError from put). Past MAX_EXT_DEPTH levels a value is pickled instead, and bytes
nested deeper are an IntegrityError."""
from __future__ import annotations

import msgpack
import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
from mlcache.codec import MAX_EXT_DEPTH, MSGPACK, PICKLE, Codec
from mlcache.errors import IntegrityError, SerializationError


def _nested(depth, kind=tuple):
    value = "leaf"
    for _ in range(depth):
        value = kind([value])
    return value


@pytest.mark.parametrize("kind", [tuple, frozenset])
def test_values_up_to_the_limit_stay_msgpack(kind):
    value = _nested(MAX_EXT_DEPTH, kind)
    data = Codec().encode(value)
    assert data[0] == MSGPACK
    assert Codec().decode(data) == value
    assert Codec().decode_many([data]) == [value]


@pytest.mark.parametrize("depth", [MAX_EXT_DEPTH + 1, 200, 400])
@pytest.mark.parametrize("kind", [tuple, frozenset])
def test_deeper_values_are_pickled_and_round_trip(depth, kind):
    value = _nested(depth, kind)
    data = Codec().encode(value)
    assert data[0] == PICKLE
    assert Codec().decode(data) == value


def test_deeper_values_without_pickle_are_a_serialization_error_naming_the_depth():
    with pytest.raises(SerializationError, match=f"tuples nested more than {MAX_EXT_DEPTH}"):
        Codec(allow_pickle=False).encode(_nested(200))


def test_a_deep_value_spilled_to_disk_reads_back(tmp_path):
    """The case that crashed: put, spill to the disk level, get."""
    value = {"state": _nested(200), "n": 1}
    cfg = CacheConfig(heap=HeapConfig(max_entries=1, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(cfg) as m:
        m.put("deep", value)
        m.put("other", 1)
        m.flush()
        m.invalidate_local()
        assert m.get("deep") == value


def _deep_bytes(depth, code=1):
    data = msgpack.packb("leaf")
    for _ in range(depth):
        data = msgpack.packb(msgpack.ExtType(code, b"\x91" + data))
    return bytes((MSGPACK,)) + data


@pytest.mark.parametrize("code", [1, 2, 3])
@pytest.mark.parametrize("depth", [MAX_EXT_DEPTH + 1, 200, 5000])
def test_stored_bytes_nested_too_deep_are_an_integrity_error(depth, code):
    data = _deep_bytes(depth, code)
    for decode in (Codec().decode, lambda d: Codec().decode_many([d])[0]):
        with pytest.raises(IntegrityError, match=f"nested more than {MAX_EXT_DEPTH} deep"):
            decode(data)
