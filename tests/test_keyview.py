"""The key memo's fast encoding of flat tuple keys is byte for byte keys.encode_key."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from mlcache import CacheConfig, CacheManager
from mlcache._keyview import KeyView
from mlcache.keys import encode_key

_part = st.one_of(st.text(max_size=20), st.binary(max_size=20),
                  st.integers(min_value=-(1 << 70), max_value=1 << 70), st.booleans())


@given(st.tuples(_part) | st.tuples(_part, _part) | st.tuples(_part, _part, _part)
       | st.tuples(_part, st.tuples(_part, _part)))
def test_tuple_keys_encode_as_encode_key(key):
    view = KeyView(b"ns\x1f")
    assert view._kb(key) == b"ns\x1f" + encode_key(key)
    assert view._kb(key) == b"ns\x1f" + encode_key(key)   # memoised


def test_tuple_with_a_float_is_refused_even_when_an_equal_key_is_memoised():
    view = KeyView(b"ns\x1f")
    view._kb(("a", 1))
    with pytest.raises(TypeError, match="float"):
        view._kb(("a", 1.0))
    with pytest.raises(TypeError, match="list"):
        view._kb(("a", [1]))


def test_manager_round_trips_tuple_keys(tmp_path):
    with CacheManager(CacheConfig.from_dict({"levels": [{"type": "disk",
                                                          "path": str(tmp_path)}]})) as m:
        m.put(("card", 1 << 65, b"x"), 1)
        m.put(("card", 7), 2)
        m.flush()
        assert sorted(m.keys(), key=repr) == sorted([("card", 1 << 65, b"x"), ("card", 7)],
                                                    key=repr)


_scalar = st.one_of(st.text(max_size=12), st.binary(max_size=12),
                    st.integers(min_value=-(1 << 70), max_value=1 << 70))
_key = st.one_of(_scalar, st.booleans(), st.tuples(_part, _part), st.tuples(_scalar),
                 st.tuples(_part, st.tuples(_part)), st.just(()))


@given(st.lists(_key, max_size=30), st.lists(_key, max_size=30))
def test_batches_encode_as_encode_key(warm, batch):
    """``_kbs`` (whole-batch checks and encoding for batches of one kind of key) gives the
    bytes of keys.encode_key, cold and memoised, for batches mixing any key kinds."""
    view = KeyView(b"ns\x1f")
    view._kbs(warm)
    assert view._kbs(batch) == [b"ns\x1f" + encode_key(k) for k in batch]
    assert view._kbs(batch) == [b"ns\x1f" + encode_key(k) for k in batch]


@given(st.lists(st.tuples(st.text(max_size=8), st.integers(min_value=-(1 << 70),
                                                            max_value=1 << 70)), max_size=30))
def test_batches_of_flat_tuples_encode_as_encode_key(batch):
    view = KeyView(b"ns\x1f")
    assert view._kbs(batch) == [b"ns\x1f" + encode_key(k) for k in batch]


def test_batch_with_an_equal_key_of_another_type_is_refused():
    view = KeyView(b"ns\x1f")
    view._kbs([("a", 1), ("a", 2)])
    with pytest.raises(TypeError, match="float"):
        view._kbs([("a", 2), ("a", 1.0)])
    view._kbs([1, 2])
    with pytest.raises(TypeError, match="float"):
        view._kbs([2, 1.0])


def test_batch_keeps_the_memo_bounded():
    view = KeyView(b"ns\x1f")
    view._memo_max = 150
    for start in range(0, 1000, 100):
        view._kbs([("k", i) for i in range(start, start + 100)])
        assert len(view._memo) <= 150
    view._memo_max = 0          # a view without a memo keeps none of a batch
    view._memo.clear()
    assert view._kbs([1, 2, 3]) == [b"ns\x1f" + encode_key(k) for k in (1, 2, 3)]
    assert len(view._memo) <= 1


def test_long_tuple_keys_in_a_batch():
    view = KeyView(b"ns\x1f")
    batch = [("x" * 300, 1), ("y" * 100, 2), ("z", 3)]
    assert view._kbs(batch) == [b"ns\x1f" + encode_key(k) for k in batch]
