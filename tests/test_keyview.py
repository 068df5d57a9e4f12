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
