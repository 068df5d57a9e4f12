"""Review (F5): batch-encoded keys (KeyView._kbs / _kb, memo warm or cold) are byte-identical
to ``prefix + keys.encode_key`` for every key type, in any batch mix and order."""
from __future__ import annotations

import collections
import enum

from hypothesis import given, settings, strategies as st

from mlcache._keyview import KeyView, _plain_key
from mlcache.keys import encode_key

PREFIX = b"ns\x1f"

scalars = st.one_of(
    st.text(max_size=40), st.binary(max_size=40), st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([-(1 << 63), (1 << 64) - 1, -(1 << 63) - 1, 1 << 64, 0, -1, 127, 128]),
)
keys_st = st.recursive(scalars, lambda inner: st.tuples(inner) | st.tuples(inner, inner)
                       | st.lists(inner, max_size=4).map(tuple), max_leaves=12)


def _expect(key):
    return PREFIX + encode_key(_plain_key(key))   # subclasses key as their base value


@settings(max_examples=400, deadline=None)
@given(st.lists(keys_st, max_size=12), st.lists(keys_st, max_size=12))
def test_batches_match_encode_key(first, second):
    view = KeyView(PREFIX)
    assert view._kbs(first) == [_expect(k) for k in first]
    # a second batch against a warm memo (equal keys of other types: 1 / True, (1,) / (True,))
    assert view._kbs(second + first) == [_expect(k) for k in second + first]
    assert [view._kb(k) for k in first] == [_expect(k) for k in first]


class Colour(enum.IntEnum):
    RED = 1


class Name(str, enum.Enum):
    A = "a"


Point = collections.namedtuple("Point", "x y")


def test_equal_keys_of_other_types_after_warm_memo():
    odd = [True, False, Colour.RED, Name.A, Point(1, 2), (True, 1), (1, True), 1, "a", (1, 2),
           ((1,), (True,)), b"a", (1 << 64,), (-(1 << 63) - 1,), ("x" * 300,)]
    for order in (odd, odd[::-1]):
        view = KeyView(PREFIX)
        for batch in (order, order[:1], order[1:], order):
            assert view._kbs(list(batch)) == [_expect(k) for k in batch]
            assert [view._kb(k) for k in batch] == [_expect(k) for k in batch]
