"""Fuzzing the codec's decoder: random and mutated inputs raise only IntegrityError or
SerializationError, never anything else, and a signed codec never returns a value for bytes
that differ from what it signed.

CI runs a few thousand cases; ``make stress`` runs the same properties over >= 100K cases
(``FUZZ_SCALE`` examples per property, see ``test_fuzz_stress``).
"""
from __future__ import annotations

import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mlcache.codec import MSGPACK, PICKLE, SIGNED, Codec
from mlcache.errors import IntegrityError, SerializationError

KEY = b"fuzz-signing-key-0123456789abcdef"
CODECS = {
    "default": Codec(),
    "msgpack-only": Codec(allow_pickle=False),
    "signed": Codec(KEY),
    "signed-msgpack-only": Codec(KEY, allow_pickle=False),
}
ALLOWED = (IntegrityError, SerializationError)



class Plain:
    """Not msgpack-encodable: takes the pickle path of the default codec."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return type(other) is Plain and other.v == self.v


@st.composite
def mutated(draw, encoded: bytes) -> bytes:
    data = bytearray(encoded)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "dup", "head"]))
        if op in ("flip", "set") and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = data[i] ^ (1 << draw(st.integers(0, 7))) if op == "flip" \
                else draw(st.integers(0, 255))
        elif op == "truncate":
            data = data[:draw(st.integers(0, len(data)))]
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "dup" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i:i] = data[i:i + draw(st.integers(1, 16))]
        elif op == "head":
            fmt = draw(st.sampled_from([MSGPACK, PICKLE, 0, 3, 0x7f]))
            head = fmt | (SIGNED if draw(st.booleans()) else 0)
            if data:
                data[0] = head
            else:
                data.append(head)
    return bytes(data)


def _decode_ok_or_refused(codec: Codec, data: bytes, original: bytes | None = None) -> None:
    try:
        codec.decode(data)
    except ALLOWED:
        return
    except BaseException as exc:   # the property: nothing else escapes
        raise AssertionError(f"{type(exc).__name__} escaped decode({data!r}): {exc}") from exc
    if codec.signing_key is not None:
        # A signed codec accepts only what it signed, byte for byte (never a wrong value).
        assert original is not None and data == original, data


def check_random(data: bytes, name: str) -> None:
    _decode_ok_or_refused(CODECS[name], data)


def _corpus() -> list:
    """Plain values of every shape the msgpack path handles, built once (drawing recursive
    values per example would cost more than the decode being fuzzed)."""
    import random

    rng = random.Random(1234)

    def value(depth: int):
        kind = rng.randrange(12 if depth < 3 else 7)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.randrange(-2**70, 2**70) >> rng.randrange(70)
        if kind == 3:
            return rng.random() * 10 ** rng.randrange(-5, 300)
        if kind == 4:
            return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(20)))
        if kind == 5:
            return rng.randbytes(rng.randrange(40))
        if kind == 6:
            return 2 ** rng.randrange(64, 200)
        if kind == 7:
            return [value(depth + 1) for _ in range(rng.randrange(5))]
        if kind == 8:
            return tuple(value(depth + 1) for _ in range(rng.randrange(4)))
        if kind == 9:
            return {str(i): value(depth + 1) for i in range(rng.randrange(4))}
        if kind == 10:
            return {(i, str(i)): value(depth + 1) for i in range(rng.randrange(3))}
        return {rng.randrange(100) for _ in range(rng.randrange(5))} | {("t", 1)}

    return [value(0) for _ in range(300)]


CORPUS = _corpus()
ENCODED = {name: [c.encode(v) for v in CORPUS] for name, c in CODECS.items()}
ENCODED_PICKLE = {name: [CODECS[name].encode(Plain(v)) for v in CORPUS[:100]]
                  for name in ("default", "signed")}


def check_mutated(enc: bytes, source: str, target: str, draw) -> None:
    data = draw(mutated(enc))
    signed_same = CODECS[source].signing_key == CODECS[target].signing_key
    _decode_ok_or_refused(CODECS[target], data, enc if signed_same else None)


def _settings(n: int):
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def _properties(n: int):
    @_settings(n)
    @given(st.binary(max_size=300), st.sampled_from(sorted(CODECS)))
    def random_bytes(data, name):
        check_random(data, name)

    @_settings(n)
    @given(st.sampled_from(sorted(CODECS)), st.sampled_from(sorted(CODECS)), st.data())
    def mutated_msgpack(source, target, data):
        enc = data.draw(st.sampled_from(ENCODED[source]))
        check_mutated(enc, source, target, data.draw)

    @_settings(n)
    @given(st.sampled_from(["default", "signed"]), st.sampled_from(sorted(CODECS)), st.data())
    def mutated_pickle(source, target, data):
        enc = data.draw(st.sampled_from(ENCODED_PICKLE[source]))
        check_mutated(enc, source, target, data.draw)

    return random_bytes, mutated_msgpack, mutated_pickle


CI_EXAMPLES = int(os.environ.get("FUZZ_CI_EXAMPLES", "800"))
STRESS_EXAMPLES = int(os.environ.get("FUZZ_SCALE", "35000"))


@pytest.mark.parametrize("prop", range(3), ids=["random", "mutated-msgpack", "mutated-pickle"])
def test_fuzz_decoder(prop):
    _properties(CI_EXAMPLES)[prop]()


@pytest.mark.stress
@pytest.mark.timeout(3600)     # 35,000 cases of one property take ~10 minutes on a busy machine
@pytest.mark.parametrize("prop", range(3), ids=["random", "mutated-msgpack", "mutated-pickle"])
def test_fuzz_decoder_stress(prop):
    """3 x 35,000 = 105,000 cases by default."""
    _properties(STRESS_EXAMPLES)[prop]()


def test_known_nasty_inputs():
    """Hand-picked inputs a decoder typically mishandles."""
    nasty = [
        b"", b"\x01", b"\x02", b"\x81", b"\x82" + b"\x00" * 31,
        b"\x01\xdd\xff\xff\xff\xff",                  # array32 claiming 4G elements
        b"\x01\xdf\xff\xff\xff\xff",                  # map32 claiming 4G pairs
        b"\x01\xc6\xff\xff\xff\xff",                  # bin32 claiming 4 GB
        b"\x01" + b"\x91" * 100_000,                   # deeply nested arrays
        b"\x01" + b"\xc7\x03\x01\x91\xc7" * 2000,     # nested ext types (recursion)
        b"\x01\xd4\x04" + b"9",                        # bigint ext of one digit
        b"\x01\xc7\x10\x04" + b"1" * 16,
        b"\x01\xc8\x27\x10\x04" + b"9" * 10_000,       # bigint beyond int's digit limit
        b"\x01\xd4\x63\x00",                           # unknown ext type
        b"\x01\x81\x91\x01\x02",                       # unhashable map key
        b"\x01\xc1",                                   # reserved byte
        b"\x01\xa3ab",                                 # truncated str
        b"\x01\xa2\xff\xfe",                           # invalid utf-8
        b"\x01\x01\x02",                               # extra data
        b"\x02" + pickle.dumps(1)[:-1],                # truncated pickle
        b"\x02\x80\x05\x95\xff\xff\xff\xff\xff\xff\xff\x7f",   # frame claiming 2**63 bytes
    ]
    for data in nasty:
        for codec in CODECS.values():
            _decode_ok_or_refused(codec, data)
