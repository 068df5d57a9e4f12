"""Codec: exact-type round trips, pickle fallback, signatures, corrupt input."""
from __future__ import annotations

import collections
import dataclasses
import threading

import pytest
from hypothesis import given, settings, strategies as st

from mlcache.codec import MSGPACK, PICKLE, SIGNED, Codec
from mlcache.errors import IntegrityError, SerializationError

KEY = b"k" * 32


@dataclasses.dataclass
class Point:
    x: int
    y: int


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**64, max_value=2**200),
    st.integers(min_value=-2**200, max_value=-2**63 - 1),
    st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
)
hashables = st.recursive(scalars, lambda c: st.one_of(st.tuples(c, c), st.frozensets(c, max_size=3)),
                         max_leaves=6)
values = st.recursive(
    scalars,
    lambda c: st.one_of(
        st.lists(c, max_size=4),
        st.tuples(c, c),
        st.dictionaries(hashables, c, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=12,
)


def same(a, b):
    """Equal and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a == b and all(same(k, next(k2 for k2 in b if k2 == k)) and same(a[k], b[k])
                              for k in a)
    return a == b


@settings(max_examples=200, deadline=None)
@given(values)
def test_plain_data_round_trips_with_exact_types(value):
    codec = Codec()
    data = codec.encode(value)
    assert data[0] == MSGPACK
    assert same(codec.decode(data), value)


@settings(max_examples=50, deadline=None)
@given(values)
def test_signed_round_trip(value):
    codec = Codec(signing_key=KEY)
    data = codec.encode(value)
    assert data[0] & SIGNED
    assert same(codec.decode(data), value)


def test_non_msgpack_types_fall_back_to_pickle():
    codec = Codec()
    for value in (Point(1, 2), collections.OrderedDict(a=1), collections.Counter("aab"),
                  lambda x: x + 1, [Point(3, 4)], {"p": Point(0, 0)}):
        data = codec.encode(value)
        assert data[0] == PICKLE
        out = codec.decode(data)
        if callable(value):
            assert out(1) == 2
        else:
            assert out == value and type(out) is type(value)


def test_cycles_fall_back_to_pickle():
    a: list = [1]
    a.append(a)
    out = Codec().decode(Codec().encode(a))
    assert out[0] == 1 and out[1] is out


def test_unencodable_raises_serialization_error_naming_type():
    with pytest.raises(SerializationError) as info:
        Codec().encode(threading.Lock())
    assert "lock" in str(info.value).lower()
    assert info.value.value_type is type(threading.Lock())


def test_allow_pickle_false_never_pickles_or_unpickles():
    strict = Codec(allow_pickle=False)
    assert strict.decode(strict.encode({"a": (1, 2)})) == {"a": (1, 2)}
    with pytest.raises(SerializationError) as info:
        strict.encode(Point(1, 2))
    assert "Point" in str(info.value)
    pickled = Codec().encode(Point(1, 2))
    with pytest.raises(IntegrityError):
        strict.decode(pickled)


def test_unsigned_bytes_rejected_when_key_set():
    data = Codec().encode({"a": 1})
    with pytest.raises(IntegrityError):
        Codec(signing_key=KEY).decode(data)


def test_tampered_and_wrong_key_rejected():
    codec = Codec(signing_key=KEY)
    data = bytearray(codec.encode({"a": [1, 2, 3]}))
    data[-1] ^= 1
    with pytest.raises(IntegrityError):
        codec.decode(bytes(data))
    with pytest.raises(IntegrityError):
        Codec(signing_key=b"x" * 32).decode(codec.encode(1))
    pickled = codec.encode(Point(1, 2))
    forged = bytes([pickled[0]]) + b"\0" * 32 + pickled[33:]
    with pytest.raises(IntegrityError):
        codec.decode(forged)


@pytest.mark.parametrize("value", [{"a": [1, 2, 3], "b": "x" * 40}, Point(1, 2), 2**100])
def test_truncated_and_corrupt_bytes_raise_integrity_error(value):
    for codec in (Codec(), Codec(signing_key=KEY)):
        data = codec.encode(value)
        for cut in range(0, len(data) - 1):
            with pytest.raises(IntegrityError):
                codec.decode(data[:cut])
    with pytest.raises(IntegrityError):
        Codec().decode(b"\x7f garbage")
    with pytest.raises(IntegrityError):
        Codec().decode(b"\x02 not a pickle")


@settings(max_examples=100, deadline=None)
@given(st.lists(values, max_size=6))
def test_decode_many_is_decode_of_each(batch):
    for codec in (Codec(), Codec(signing_key=KEY)):
        encoded = [codec.encode(v) for v in batch]
        assert all(same(a, b) for a, b in zip(codec.decode_many(encoded), batch))
        assert len(codec.decode_many(encoded)) == len(batch)


@pytest.mark.parametrize("bad", [b"", b"\x01", b"\x01\x92\x01", b"\x01\x01\x05", b"\x7f x",
                                 b"\x02 not a pickle", b"\x81" + b"\x00" * 40])
def test_decode_many_raises_what_decode_raises(bad):
    codec = Codec()
    good = codec.encode({"a": 1})
    with pytest.raises(IntegrityError) as one:
        codec.decode(bad)
    with pytest.raises(IntegrityError) as many:
        codec.decode_many([good, bad, good])
    assert str(many.value) == str(one.value)


def test_large_values_tune_the_allocator_once():
    """A value from 256 KiB on raises glibc's thresholds for its size (mlcache._malloc), so a
    cache moving such values reuses freed buffers; a no-op where it does not apply."""
    from mlcache import _malloc

    codec = Codec()
    big = {"payload": b"\x00" * (3 << 20)}
    assert same(codec.decode(codec.encode(big)), big)
    if _malloc._mallopt is not None:
        assert _malloc.tuned_for() >= 3 << 20
    before = _malloc.tuned_for()
    codec.decode(codec.encode({"small": 1}))
    assert _malloc.tuned_for() == before
