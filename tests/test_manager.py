"""CacheManager unit behaviour: the data path, bad input, failures, hooks, stats."""
from __future__ import annotations

import threading
import uuid

import pytest

from mlcache import (
    CacheConfig,
    CacheError,
    CacheManager,
    CapacityError,
    ConfigError,
    DiskConfig,
    HeapConfig,
    IntegrityError,
    LevelUnavailableError,
    RedisConfig,
    SerializationError,
)
from mlcache._redis_server import RedisServer
from mlcache.manager import register_structure


def heap(n=3, policy="lru", **kw):
    return HeapConfig(policy=policy, max_entries=n, max_bytes=kw.pop("max_bytes", None), **kw)


@pytest.fixture()
def disk_cfg(tmp_path):
    return CacheConfig(heap=heap(3), levels=(DiskConfig(path=str(tmp_path / "d")),))


@pytest.fixture()
def m(disk_cfg):
    with CacheManager(disk_cfg) as manager:
        yield manager


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()


# -- basics -------------------------------------------------------------------------------------

def test_get_put_delete_and_miss_default(m):
    assert m.get("a") is None and m.get("a", 7) == 7
    m.put("a", [1])
    assert m.get("a") == [1] and "a" in m and m.contains("a")
    m.delete("a")
    assert "a" not in m and m.get("a", "miss") == "miss"
    m.delete("never-there")  # no error


def test_key_types_and_bool_folding(m):
    keys = ["s", 5, b"b", (1, "x", b"y"), ((1, 2), "z"), -(2**70)]
    for i, key in enumerate(keys):
        m.put(key, i)
    for i, key in enumerate(keys):
        assert m.get(key) == i
    m.put(True, "t")
    assert m.get(1) == "t"          # as in a dict, True == 1
    assert sorted(map(repr, m.keys())) == sorted(map(repr, [*keys, 1]))


@pytest.mark.parametrize("bad", [1.5, None, [1], {"a": 1}, (1, 2.0), frozenset([1])])
def test_bad_key_type_raises_type_error_naming_the_type(m, bad):
    name = type(bad).__name__ if not isinstance(bad, tuple) else "float"
    for call in (lambda: m.get(bad), lambda: m.put(bad, 1), lambda: m.delete(bad),
                 lambda: m.get_many(["ok", bad]), lambda: m.hint(bad, 0.0)):
        with pytest.raises(TypeError) as info:
            call()
        assert name in str(info.value)


def test_unserializable_value_raises_at_put_naming_key_and_type(m):
    with pytest.raises(SerializationError) as info:
        m.put("k1", Unpicklable())
    err = info.value
    assert "k1" in str(err) and "Unpicklable" in str(err)
    assert err.key == "k1" and err.value_type is Unpicklable
    assert "k1" not in m


def test_unserializable_found_at_demotion_is_pinned_then_raised_by_flush(m):
    m.put("ok", {"a": 1})                  # dict is now a type known to encode
    bad = {"lock": threading.Lock()}
    m.put("bad", bad)                      # same type: checked when it leaves the heap
    for i in range(6):
        m.put(i, {"i": i})                 # evicts "bad": it stays in the heap, pinned
    assert m.get("bad") is bad
    with pytest.raises(SerializationError) as info:
        m.flush()
    assert info.value.key == "bad" and "dict" in str(info.value)
    assert m.get("bad") is bad             # never dropped
    del bad["lock"]                        # fixed in place: the next flush writes it
    m.flush()
    for i in range(6):
        assert m.get(i) == {"i": i}
    assert m.get("bad") == {}


def test_allow_pickle_false(tmp_path):
    cfg = CacheConfig(heap=heap(2), levels=(DiskConfig(path=str(tmp_path)),), allow_pickle=False)
    with CacheManager(cfg) as m:
        m.put("plain", {"a": (1, {2})})
        with pytest.raises(SerializationError) as info:
            m.put("obj", Unpicklable())
        assert "obj" in str(info.value)


@pytest.mark.parametrize("make, field", [
    (lambda: HeapConfig(max_entries=0), "heap.max_entries"),
    (lambda: HeapConfig(max_entries=None, max_bytes=None), "heap"),
    (lambda: CacheConfig(writer_threads=0), "writer_threads"),
    (lambda: CacheConfig(signing_key=b"short"), "signing_key"),
    (lambda: CacheManager(CacheConfig(heap=HeapConfig(policy="nope"), levels=())), "heap.policy"),
    (lambda: CacheManager({"heap": None}), "config"),
    (lambda: CacheManager(CacheConfig(heap=heap(2), levels=())).namespace(""), "namespace"),
])
def test_invalid_config_raises_config_error_naming_the_field(make, field):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


# -- data path --------------------------------------------------------------------------------------

def test_miss_path_is_batched_per_level(m):
    m.put_many({i: [i] for i in range(50)})
    m.flush()
    before = m.stats()["levels"]["disk"]["loads"]
    got = m.get_many(range(60))
    assert got == {i: [i] for i in range(50)}
    assert m.stats()["levels"]["disk"]["loads"] == before + 1


def test_lower_copy_stays_after_load_and_clean_eviction_writes_nothing(m):
    m.put_many({i: i for i in range(10)})
    m.flush()
    written = m.stats()["levels"]["disk"]["keys_written"]
    for i in range(10):
        assert m.get(i) == i   # loads evict clean entries only
    assert m.stats()["levels"]["disk"]["keys_written"] == written
    assert m.stats()["levels"]["heap"]["evictions"]["clean"] > 0


def test_eviction_buffer_hit_needs_no_io(disk_cfg):
    m = CacheManager(disk_cfg)
    m._wb.stop()                     # writer parked: victims stay in the buffer
    for i in range(6):               # (put_many would lend its own victims until a look)
        m.put(i, [i])
    assert m.stats()["writeback"]["pending"] == 3
    loads = m.stats()["levels"]["disk"]["loads"]
    assert m.get(0) == [0]
    st = m.stats()
    assert st["writeback"]["buffer_hits"] == 1 and st["levels"]["disk"]["loads"] == loads
    m.close()
    with CacheManager(disk_cfg) as again:
        assert again.get_many(range(6)) == {i: [i] for i in range(6)}


def test_tombstone_hides_lower_copies_until_and_after_flush(m, disk_cfg):
    m.put("k", "v")
    m.flush()
    m.delete("k")
    assert m.get("k") is None and "k" not in list(m.keys())
    m.flush()
    assert m._levels[0].get_many([m._encode_key("k")]) == [None]
    m.put("k", "again")
    for i in range(5):
        m.put(i, i)
    assert m.get("k") == "again"


def test_in_place_mutation_is_not_lost(m, disk_cfg):
    m.put("l", [1])
    m.flush()
    for i in range(5):
        m.put(i, i)                   # "l" evicted clean
    value = m.get("l")                # loaded clean
    value.append(2)                   # changed in place, never put back
    for i in range(5, 10):
        m.put(i, i)                   # evicted: the changed digest makes it a write
    assert m.get("l") == [1, 2]
    m.get("l").append(3)
    m.flush()                         # handed out since the last check: checked by flush
    m.close()
    with CacheManager(disk_cfg) as again:
        assert again.get("l") == [1, 2, 3]
        assert m.stats  # the closed manager still answers stats


def test_close_checkpoints_and_reopen_restores(disk_cfg):
    with CacheManager(disk_cfg) as m:
        m.put_many({i: {"i": i} for i in range(20)})
        m.delete(3)
    assert m.closed
    with pytest.raises(CacheError):
        m.put("x", 1)
    with CacheManager(disk_cfg) as m2:
        assert sorted(m2.keys()) == [i for i in range(20) if i != 3]
        assert m2.get(7) == {"i": 7}


def test_namespaces_are_isolated(m):
    a, b = m.namespace("a"), m.namespace("b")
    assert m.namespace("a") is a
    a.put("k", 1)
    b.put("k", 2)
    m.put("k", 0)
    for i in range(10):
        b.put(("x", i), i)   # evictions across namespaces share one heap
    assert (a.get("k"), b.get("k"), m.get("k")) == (1, 2, 0)
    assert list(a.keys()) == ["k"] and len(list(b.keys())) == 11 and list(m.keys()) == ["k"]
    b.delete_many([("x", i) for i in range(10)])
    assert list(b.keys()) == ["k"] and a.get_many(["k", "z"]) == {"k": 1}
    a.flush()
    a.checkpoint()


def test_heap_only_is_a_pure_cache():
    with CacheManager(CacheConfig(heap=heap(2), levels=())) as m:
        for i in range(5):
            m.put(i, i)
        assert [m.get(i) for i in range(5)] == [None, None, None, 3, 4]
        m.flush()
        m.checkpoint()


def test_no_heap_writes_through(tmp_path):
    cfg = CacheConfig(heap=None, levels=(DiskConfig(path=str(tmp_path)),))
    with CacheManager(cfg) as m:
        m.put("a", [1])
        assert m._levels[0].get_many([m._encode_key("a")])[0] is not None
        assert m.get("a") == [1]
        m.delete("a")
        assert m.get("a") is None and list(m.keys()) == []


def test_last_level_full_raises_capacity_error_and_keeps_entries(tmp_path):
    cfg = CacheConfig(heap=heap(2), levels=(DiskConfig(path=str(tmp_path), max_bytes=64),),
                      retry_attempts=1)
    m = CacheManager(cfg)
    m.put_many({i: "x" * 30 for i in range(6)})
    with pytest.raises(CapacityError):
        m.flush()
    assert all(m.get(i) == "x" * 30 for i in range(6))   # nothing lost
    m.delete_many(range(1, 6))
    m.flush()
    m.close()


def test_signed_values_reject_another_key(tmp_path):
    path = str(tmp_path)
    cfg = CacheConfig(heap=heap(2), levels=(DiskConfig(path=path),), signing_key=b"a" * 32)
    with CacheManager(cfg) as m:
        m.put("k", {"v": 1})
    other = CacheConfig(heap=heap(2), levels=(DiskConfig(path=path),), signing_key=b"b" * 32)
    with CacheManager(other) as m2:
        with pytest.raises(IntegrityError) as info:
            m2.get("k")
        assert info.value.key == "k"
    with CacheManager(cfg) as m3:
        assert m3.get("k") == {"v": 1}


def test_redis_down_keeps_entries_and_surfaces_error_then_recovers(tmp_path):
    server = RedisServer().start()
    try:
        cfg = CacheConfig(heap=heap(2), levels=(RedisConfig(url=server.url, retries=0,
                                                            socket_timeout=0.5),),
                          retry_attempts=2, retry_backoff=0.01)
        m = CacheManager(cfg)
        m.put_many({i: [i] for i in range(2)})
        server.stop()
        m.put_many({i: [i] for i in range(2, 8)})   # victims queue up; writer fails, retries
        with pytest.raises(LevelUnavailableError) as info:
            m.flush()
        assert info.value.retryable
        # every entry is still readable from the heap or the eviction buffer, without Redis
        assert [m.get(i) for i in range(8)] == [[i] for i in range(8)]
        assert m.stats()["writeback"]["last_error"] is not None
        server.start()
        m.flush()
        m.close()
        with CacheManager(cfg) as again:
            assert again.get_many(range(8)) == {i: [i] for i in range(8)}
    finally:
        server.cleanup()


def test_heap_redis_disk_overflow_reaches_disk(redis_url, tmp_path):
    ns = "t" + uuid.uuid4().hex[:8]
    cfg = CacheConfig(heap=heap(2), namespace=ns,
                      levels=(RedisConfig(url=redis_url, prefix=ns, max_bytes=200),
                              DiskConfig(path=str(tmp_path))))
    with CacheManager(cfg) as m:
        m.put_many({i: "v" * 20 + str(i) for i in range(40)})
        m.flush()
        st = m.stats()["levels"]
        assert st["redis"]["evictions"]["overflow"] > 0 and st["disk"]["keys_written"] > 0
        assert st["redis"]["used_bytes"] <= 200
        assert m.get_many(range(40)) == {i: "v" * 20 + str(i) for i in range(40)}


# -- hooks, structures, stats ---------------------------------------------------------------------

def test_internal_hooks(m):
    m.put("r", 1)
    kb = m._encode_key("r")
    assert isinstance(kb, bytes) and m._resident(kb)
    m._policy_hint(kb, 5.0)
    m.flush()
    for i in range(5):
        m.put(i, i)
    assert not m._resident(kb)
    out = m._load_into_heap([kb, m._encode_key("nope")], 1.0, prefetch=True)
    assert out == {kb: 1} and m._resident(kb)
    m.hint("r", 2.0)
    m.hint("absent", 3.0)
    assert m.invalidate_local() >= 1 and not m._resident(kb)
    assert m.get("r") == 1


def test_structure_registry(m):
    made = []

    def factory(manager, name, **kw):
        made.append((name, kw))
        return ("structure", name)

    register_structure("test-kind", factory)
    assert m.structure("test-kind", "n", size=3) == ("structure", "n")
    assert m.structure("test-kind", "n") == ("structure", "n")
    assert made == [("n", {"size": 3})]
    with pytest.raises(ConfigError) as info:
        m.structure("no-such-kind", "n")
    assert "no-such-kind" in str(info.value)


def test_stats_shape(m):
    m.put("a", 1)
    m.get("a")
    m.get("b")
    st = m.stats()
    assert set(st) == {"levels", "writeback", "prefetch"}
    assert set(st["levels"]) == {"heap", "disk"}
    h = st["levels"]["heap"]
    assert h["hits"] == 1 and h["misses"] == 1 and h["entries"] == 1
    d = st["levels"]["disk"]
    for field in ("hits", "misses", "loads", "load_ms_p50", "load_ms_p99", "evictions",
                  "bytes_written"):
        assert field in d
    assert d["load_ms_p50"] is not None and d["load_ms_p99"] >= d["load_ms_p50"]
    m.flush()
    assert m.stats()["writeback"]["dirty_flushes"] == 1


def test_default_config_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("MLCACHE_HOME", str(tmp_path))
    with CacheManager() as m:
        m.put("x", {"y": 1})
        assert m.get("x") == {"y": 1}
        assert m.stats()["levels"]["heap"]["policy"] in ("wtinylfu", "lru")


def test_manager_works_in_a_forked_child(tmp_path):
    import os

    cfg = CacheConfig(heap=heap(2), levels=(DiskConfig(path=str(tmp_path)),))
    m = CacheManager(cfg)
    m.put_many({i: [i] for i in range(6)})      # writer thread running in the parent
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            m.put("child", [42])
            m.flush()
            code = 0 if m.get(5) == [5] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    m.close()
    with CacheManager(cfg) as again:
        assert again.get("child") == [42] and again.get(0) == [0]


def test_key_subclasses_key_like_their_base_value(m):
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    m.put(Color.RED, 1)
    m.put(Level.HIGH, 2)
    m.put(("t", Level.HIGH), 3)
    assert m.get("red") == 1 and m.get(3) == 2 and m.get(("t", 3)) == 3
    assert sorted(map(repr, m.keys())) == sorted(map(repr, ["red", 3, ("t", 3)]))


def test_put_that_needs_room_surfaces_the_write_back_error(tmp_path):
    cfg = CacheConfig(heap=heap(1), levels=(DiskConfig(path=str(tmp_path), max_bytes=40),),
                      eviction_buffer_max=2, retry_attempts=1, retry_backoff=0.0)
    m = CacheManager(cfg)
    with pytest.raises(CapacityError):
        for i in range(10):
            m.put(i, "y" * 30)            # the store of record fills; the buffer then too
    assert m.stats()["writeback"]["pending"] >= 2
    written = [i for i in range(10) if m.get(i) is not None]
    assert all(m.get(i) == "y" * 30 for i in written) and len(written) >= 3   # none lost
    with pytest.raises(CapacityError):
        m.close()                         # the checkpoint fails: the manager stays open
    assert not m.closed
    m.delete_many(range(1, 10))
    m.close()
    with CacheManager(cfg) as again:
        assert again.get(0) == "y" * 30


@pytest.mark.parametrize("policy", ["lru", "clock"])
def test_in_place_change_to_a_value_loaded_on_a_miss_is_kept(tmp_path, policy):
    """Regression: CLOCK chose the key it had just inserted as its own victim, so a value read
    from disk was handed to the caller but never held by the heap, and an in-place change to it
    was lost (found by the stateful test, heap -> redis with clock)."""
    cfg = CacheConfig(heap=HeapConfig(policy=policy, max_entries=3, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path / "d")),), namespace="regr")
    with CacheManager(cfg) as m:
        m.put_many([("a", 0), (1, [0]), (2, 0), (0, [0])])
        for k in ("a", 0, 0, "a", 0, 2, 0):
            m.get(k)
        m.get(1).append(1)          # 1 comes back from disk, then changes in place
        m.get(0)
        m.get(0)
        assert m.get(1) == [0, 1]
        m.checkpoint()
    with CacheManager(cfg) as m:
        assert m.get(1) == [0, 1]


def test_the_manager_keeps_its_attributes_inline(tmp_path):
    # CPython 3.11 reads an object's attributes at a fixed offset only while its class's
    # instances have fewer than 30 attribute names (counted over all of them); past that every
    # ``self._x`` on the hit and put paths is a dict lookup (LOAD_ATTR_WITH_HINT). State those
    # paths do not read lives in CacheManager._cold: keep new attributes there, or this low.
    names: set[str] = set()
    for i, h in enumerate((heap(50), heap(50, max_bytes=1 << 16), None)):
        config = CacheConfig(heap=h, levels=(DiskConfig(path=str(tmp_path / str(i))),))
        with CacheManager(config) as m:
            for j in range(300):
                m.put(j, {"n": j})
                m.get(j - 100)
                m.get(j, ts=float(j))
            m.get_many(range(0, 300, 7))
            m.namespace("ns").put("k", 1)
            m.dict("d")["k"] = 1
            m.delete(3)
            m.checkpoint("cp")
            assert m.last_checkpoint_id == "cp"
            names.update(vars(m))   # (vars() makes the dict: only after the work above)
    assert len(names) <= 27, sorted(names)


def test_stats_after_close_account_no_heap_bytes(tmp_path):
    """close() emptied the heap's dict but left its accounted bytes: stats() after close said
    entries=0 with bytes still at their last value (and so did mlcache_used_bytes)."""
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig

    cfg = CacheConfig(heap=HeapConfig(max_bytes=1 << 20), levels=(DiskConfig(path=str(tmp_path)),))
    m = CacheManager(cfg)
    for i in range(100):
        m.put(i, "x" * 100)
    assert m.stats()["levels"]["heap"]["bytes"] > 0
    m.close()
    heap = m.stats()["levels"]["heap"]
    assert heap["entries"] == 0 and heap["bytes"] == 0
