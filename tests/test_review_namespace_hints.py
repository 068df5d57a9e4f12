"""Review, session 7: namespaces, hints after close, deeply nested keys, huge int event times.

Real managers on real disk levels in tmp dirs; no mocks.
"""
from __future__ import annotations

import sys

import msgpack
import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig
from mlcache.errors import CacheError, ConfigError, IntegrityError
from mlcache.keys import MAX_KEY_DEPTH, check_key, decode_key, encode_key
from mlcache.prefetch import RecordKeyError, prefetching


def _disk(path, **kw):
    return CacheConfig(levels=(DiskConfig(path=str(path)),), **kw)


# -- 1. a manager's namespace may not contain the separator of child namespaces -------------------

@pytest.mark.parametrize("name", ["app/users", "/", "a/", "/a", "x/y/z"])
def test_manager_namespace_with_slash_is_refused_naming_field_and_character(name):
    with pytest.raises(ConfigError) as info:
        CacheConfig(namespace=name)
    assert info.value.field == "namespace"
    assert "'/'" in str(info.value)


def test_from_env_namespace_with_slash_is_refused():
    with pytest.raises(ConfigError) as info:
        CacheConfig.from_env({"MLCACHE_NAMESPACE": "app/users"})
    assert info.value.field == "namespace"


def test_manager_and_child_namespaces_on_one_directory_never_share_keys(tmp_path):
    """"app/users" was accepted and its keys were those of namespace("users") of a manager
    "app" on the same directory: each read the other's values."""
    with CacheManager(_disk(tmp_path, namespace="app")) as app, \
            CacheManager(_disk(tmp_path, namespace="app.users")) as dotted:
        app.namespace("users").put("k", "child")
        app.namespace("a/b").put("k", "nested child")    # a child's name may hold "/"
        dotted.put("k", "manager")
        app.checkpoint()
        dotted.checkpoint()
    with CacheManager(_disk(tmp_path, namespace="app")) as app, \
            CacheManager(_disk(tmp_path, namespace="app.users")) as dotted:
        assert app.namespace("users").get("k") == "child"
        assert app.namespace("a/b").get("k") == "nested child"
        assert app.get("k") is None
        assert dotted.get("k") == "manager"
        assert list(dotted.keys()) == ["k"]


# -- 2. a hint after close() is refused like put/delete ------------------------------------------

@pytest.mark.parametrize("heap, enabled", [
    (HeapConfig(policy="lru", max_entries=10, max_bytes=None), True),
    (HeapConfig(policy="tac", max_entries=10, max_bytes=None), False),
    (None, True),
    (None, False),
])
def test_hint_after_close_raises_like_put(tmp_path, heap, enabled):
    m = CacheManager(CacheConfig(heap=heap, levels=(DiskConfig(path=str(tmp_path)),),
                                 prefetch=PrefetchConfig(enabled=enabled)))
    ns = m.namespace("n")
    m.put("k", 1)
    m.hint("k", 1.0)
    m.close()
    for call in (lambda: m.put("k", 2), lambda: m.hint("k", 2.0), lambda: m.hint("absent", 2.0),
                 lambda: ns.hint("k", 2.0)):
        with pytest.raises(CacheError, match="closed"):
            call()


# -- 3. a deeply nested tuple key is an unsupported key, not a RecursionError or a crash ----------

def _nested(depth):
    key = ("leaf",)
    for _ in range(depth - 1):
        key = (key, 1)
    return key


def test_key_nested_to_the_limit_round_trips(tmp_path):
    key = _nested(MAX_KEY_DEPTH)
    assert decode_key(encode_key(key)) == key
    with CacheManager(_disk(tmp_path, heap=None)) as m:
        m.put(key, "v")
        assert m.get(key) == "v"
        assert list(m.keys()) == [key]


@pytest.mark.parametrize("depth", [MAX_KEY_DEPTH + 1, 250, 5000])
def test_key_nested_past_the_limit_is_a_type_error_from_every_entry(tmp_path, depth):
    """5000 levels raised a bare RecursionError from check_key; 250 levels were stored, and
    listing them (keys()) overflowed the C stack in msgpack's nested unpackb calls."""
    key = _nested(depth)
    with pytest.raises(TypeError, match="nested more than"):
        check_key(key)
    with pytest.raises(TypeError, match="nested more than"):
        encode_key(key)
    with CacheManager(_disk(tmp_path)) as m:
        ns = m.namespace("n")
        for call in (lambda: m.put(key, 1), lambda: m.get(key), lambda: m.delete(key),
                     lambda: m.put_many({key: 1}), lambda: m.get_many(["a", key]),
                     lambda: m.hint(key, 1.0), lambda: ns.put(key, 1), lambda: ns.get(key)):
            with pytest.raises(TypeError, match="nested more than"):
                call()
        assert list(m.keys()) == []
    recs = [("a", 0), (key, 1), ("b", 2)]
    with CacheManager(_disk(tmp_path)) as m:
        it = prefetching(recs, key=lambda r: r[0], cache=m, depth=4)
        assert next(it) == ("a", 0)
        with pytest.raises(RecordKeyError, match="record 1") as info:
            next(it)
        assert isinstance(info.value.__cause__, TypeError)


# -- 4. an event time past the largest float is refused where it enters --------------------------

@pytest.mark.parametrize("huge", [10**400, -(10**309), 2**1024])
@pytest.mark.parametrize("policy", ["lru", "tac"])
def test_prefetching_ts_past_the_largest_float_names_the_record(tmp_path, huge, policy):
    """An int ts past ~1.8e308 passed the number check (it is an int, and not NaN); the
    prefetcher's float arithmetic on it then raised a bare OverflowError from the read-ahead
    of a later record, records early and naming none."""
    cfg = CacheConfig(heap=HeapConfig(policy=policy, max_entries=100, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path)),),
                      prefetch=PrefetchConfig(hot_threshold=16))
    with CacheManager(cfg) as m:
        m.put_many([(i, i) for i in range(20)])
        m.checkpoint()
    with CacheManager(cfg) as m:
        got = []
        with pytest.raises(RecordKeyError, match=r"record 5: ts= returned a number too large"
                           ) as info:
            for r in prefetching(range(20), key=lambda r: r, cache=m, depth=4,
                                 ts=lambda r: huge if r == 5 else r):
                got.append(m.get(r))
        assert got == [0, 1, 2, 3, 4] and info.value.index == 5


def test_prefetching_ts_ints_that_fit_a_float_are_taken(tmp_path):
    big = int(sys.float_info.max)           # the largest float, as an int: still a time
    cfg = CacheConfig(heap=HeapConfig(policy="tac", max_entries=100, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(cfg) as m:
        m.put_many([(i, i) for i in range(10)])
        got = [m.get(r) for r in prefetching(range(10), key=lambda r: r, cache=m, depth=4,
                                            ts=lambda r: big if r == 9 else 2**64 + r)]
        assert got == list(range(10))


@pytest.mark.parametrize("huge", [10**400, -(10**309)])
def test_hint_ts_past_the_largest_float_is_a_value_error_naming_ts(tmp_path, huge):
    with CacheManager(_disk(tmp_path, prefetch=PrefetchConfig(hot_threshold=16))) as m:
        m.put("k", 1)
        for call in (lambda: m.hint("k", huge), lambda: m.hint("absent", huge),
                     lambda: m.namespace("n").hint("k", huge)):
            with pytest.raises(ValueError, match="ts must fit a float"):
                call()
        m.hint("k", int(sys.float_info.max))


def _deep_key_bytes(depth):
    # the bytes of a tuple key ``depth`` deep, built without recursion, as a version before the
    # bound (or any other writer with access to the store) could have left them
    data = msgpack.packb("leaf")
    for _ in range(depth):
        data = msgpack.packb(msgpack.ExtType(1, b"\x91" + data))
    return data


@pytest.mark.parametrize("depth", [MAX_KEY_DEPTH + 1, 200, 5000])
def test_stored_key_nested_past_the_limit_is_an_integrity_error_not_a_segfault(tmp_path, depth):
    """938 bytes of a key nested 200 deep, found in a level, killed the process with a segfault
    in keys() (msgpack's nested unpackb calls on the C stack); it is now an IntegrityError
    naming the bytes, and a key at the limit still decodes."""
    assert decode_key(_deep_key_bytes(MAX_KEY_DEPTH)) == _nested_plain(MAX_KEY_DEPTH)
    with pytest.raises(IntegrityError, match=f"nested more than {MAX_KEY_DEPTH} deep"):
        decode_key(_deep_key_bytes(depth))
    with CacheManager(_disk(tmp_path)) as m:
        m.put("fine", 1)
        m.flush()
        level = m._levels[0]
        level.put(m._prefix + _deep_key_bytes(depth), b"")
        with pytest.raises(IntegrityError, match="not a valid mlcache key"):
            list(m.keys())
        assert m.get("fine") == 1


def _nested_plain(depth):
    key = "leaf"
    for _ in range(depth):
        key = (key,)
    return key


@pytest.mark.parametrize("data", [b"\xc1", b"\x92\x01", b"\xc7\x02\x02zz", b"\x01\x02",
                                  b"\xa2\xff\xfe"])
def test_corrupt_key_bytes_are_an_integrity_error_naming_them(data):
    """Key bytes that do not parse raised msgpack's own errors (FormatError, ExtraData, or a
    ValueError from int()), none of them an mlcache error saying a stored key was bad."""
    with pytest.raises(IntegrityError, match="not a valid mlcache key") as info:
        decode_key(data)
    assert repr(data[:4])[2:-1] in str(info.value)
