"""Review (F5): Codec.decode_many gives decode()'s values and errors for any input, and
encode_parts joins to encode() (HMAC included)."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from mlcache.codec import Codec, Encoded

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10)


def _outcome(fn, data):
    try:
        return ("ok", fn(data))
    except Exception as exc:   # noqa: BLE001
        return ("err", type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=6), st.lists(st.binary(max_size=12), max_size=4),
       st.randoms())
def test_decode_many_matches_decode(vals, junk, rnd):
    codec = Codec()
    items = [codec.encode(v) for v in vals] + junk + [b"\x01" + j for j in junk]
    rnd.shuffle(items)
    want = [_outcome(codec.decode, d) for d in items]
    errors = [w for w in want if w[0] == "err"]
    try:
        got = codec.decode_many(items)
    except Exception as exc:   # noqa: BLE001
        assert errors and ("err", type(exc), str(exc)) == errors[0]
    else:
        assert not errors
        assert [("ok", g) for g in got] == want


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from([None, b"k" * 32]))
def test_encode_parts_join_to_encode(value, key):
    codec = Codec(signing_key=key) if key else Codec()
    parts = codec.encode_parts(value)
    joined = bytes(parts)
    assert joined == codec.encode(value)
    assert len(parts) == len(joined)
    assert codec.decode(parts) == codec.decode(joined)


def test_decode_many_takes_encoded_pieces_like_decode():
    codec = Codec()
    big = b"x" * (1 << 20)
    pieces = codec.encode_parts({"a": big})
    plain = codec.encode(1)
    items = [pieces, plain] if isinstance(pieces, Encoded) else [Encoded([plain]), plain]
    assert codec.decode_many(items) == [codec.decode(d) for d in items]


def test_decode_many_takes_small_encoded_pieces_like_decode():
    codec = Codec()
    plain = codec.encode([1, "a"])
    items = [Encoded([plain[:1], plain[1:]]), plain]
    assert codec.decode_many(items) == [codec.decode(d) for d in items]
