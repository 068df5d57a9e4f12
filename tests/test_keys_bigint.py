"""Keys: an int too large for decimal text is refused like any other unsupported key."""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig
from mlcache.keys import decode_key, encode_key
from mlcache.prefetch import RecordKeyError, prefetching


def test_an_int_past_the_decimal_text_limit_is_an_unsupported_key(tmp_path):
    # encode_key raised the interpreter's ValueError ("Exceeds the limit (4300 digits)"), not
    # the TypeError of an unsupported key: the lookahead operator, which turns a key's
    # TypeError into a RecordKeyError naming the record, let it escape from its read-ahead.
    huge = 10 ** 5000
    for key in (huge, (1, huge), -huge):
        with pytest.raises(TypeError, match="too large"):
            encode_key(key)
    big = 10 ** 100                      # big ints within the limit still round-trip
    assert decode_key(encode_key((big, -big))) == (big, -big)
    with CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "d")),))) as m:
        with pytest.raises(TypeError, match="too large"):
            m.put(huge, 1)
        it = prefetching([1, 2, huge, 3], key=lambda r: r, cache=m, depth=8)
        assert next(it) == 1 and next(it) == 2
        with pytest.raises(RecordKeyError, match="record 2") as info:
            next(it)
        assert info.value.index == 2
