"""Session 8 review of the policies other than W-TinyLFU's hit ratio and of the cachetools
drop-ins: one regression test per defect found."""
from __future__ import annotations

import math
import pickle

import pytest

from mlcache.errors import ConfigError
from mlcache.policies import register_policy
from mlcache.policies.belady import BeladyPolicy
from mlcache.policies.cachetools_compat import TACache, TinyLFUCache
from mlcache.policies.tac import TACPolicy
from mlcache.sim import generators, play


@pytest.mark.parametrize("cls", [TinyLFUCache, TACache])
def test_drop_ins_pickle_and_keep_working(cls):
    cache = cls(4)
    for k in range(10):
        cache[k] = k * 2
    clone = pickle.loads(pickle.dumps(cache))
    assert dict(clone) == dict(cache)
    for k in range(20):
        clone[k] = k
        assert len(clone) <= 4
    assert all(clone[k] == k for k in clone)


@pytest.mark.parametrize("cls", [TinyLFUCache, TACache])
def test_nan_size_is_refused(cls):
    cache = cls(10, getsizeof=lambda v: v)
    cache["a"] = 3
    with pytest.raises(ValueError, match="nan"):
        cache["b"] = float("nan")
    assert dict(cache) == {"a": 3} and cache.currsize == 3


@pytest.mark.parametrize("bad", [float("nan")])
def test_tac_refuses_nan_timestamps(bad):
    p = TACPolicy(3)
    p.insert("a", 1, 1.0)
    with pytest.raises(ValueError, match="nan"):
        p.insert("b", 1, bad)
    with pytest.raises(ValueError, match="nan"):
        p.access("a", bad)
    with pytest.raises(ValueError, match="nan"):
        p.hint("a", bad)
    with pytest.raises(ValueError, match="nan"):
        p.advance(bad)
    assert list(p.keys()) == ["a"] and p.timestamp("a") == 1.0 and p.total_weight == 1


def test_belady_heap_rebuild_with_keys_that_do_not_compare():
    # many keys never used again (ties on "never") of types that do not order, and enough
    # hits to make the heap rebuild: the rebuild compared the keys themselves
    keys = [(i,) if i % 2 else (str(i),) for i in range(3000)] + [1] * 500
    result = play("belady", keys, 50)
    assert result.hits == 499


def test_belady_rebuild_keeps_the_policy_consistent():
    p = BeladyPolicy(2, trace=["x", 1, "y", 2] * 100)
    for k in ["x", 1, "y", 2] * 100:
        if k in p:
            p.access(k)
        else:
            p.insert(k)
        assert len(p) <= 2


@pytest.mark.parametrize("call, word", [
    (lambda: generators.zipf(10, 0), "n_keys"),
    (lambda: generators.scrambled_zipf(10, 0), "n_keys"),
    (lambda: generators.zipf(10, 5, float("nan")), "alpha"),
    (lambda: generators.zipf(10, 5, -1.0), "alpha"),
    (lambda: generators.zipf(-1, 5), "n_requests"),
    (lambda: generators.loop(0, 5), "length"),
    (lambda: generators.shifting_hot_set(10, 5, 2, 0), "phase"),
    (lambda: generators.shifting_hot_set(10, 0, 2, 3), "n_keys"),
    (lambda: generators.hotspot(10, 0), "n_keys"),
    (lambda: generators.hotspot(10, 10, 2.0), "hot_fraction"),
    (lambda: generators.hotspot(10, 10, 0.1, 1.5), "hot_probability"),
])
def test_generators_name_a_bad_parameter(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_generators_still_accept_the_edges():
    assert generators.zipf(0, 5).keys == []
    assert len(generators.zipf(50, 5, 0.0).keys) == 50  # alpha 0: uniform
    assert generators.loop(1, 3).keys == [0, 0, 0]


@pytest.mark.parametrize("cls", [42, type("NoMethods", (), {}), None.__class__])
def test_registry_refuses_what_is_not_a_policy(cls):
    with pytest.raises(ConfigError, match="policy"):
        register_policy("s8-not-a-policy", cls)
    from mlcache.policies import available_policies
    assert "s8-not-a-policy" not in available_policies()


@pytest.mark.parametrize("copier", [lambda c: pickle.loads(pickle.dumps(c)),
                                    lambda c: __import__("copy").deepcopy(c)])
@pytest.mark.parametrize("filled", [0, 3, 50])
def test_tinylfu_cache_copied_while_no_victim_is_cached_still_works(copier, filled):
    # a fresh (or lightly used) cache holds W-TinyLFU's "no victim" sentinel: its copy was a new
    # object the policy then took for a key, and the next miss raised KeyError
    cache = TinyLFUCache(4)
    for k in range(filled):
        cache[k] = k
    clone = copier(cache)
    for k in range(100, 200):
        clone.setdefault(k % 37, k)
        assert len(clone) <= 4
    assert set(clone) == set(clone._policy.keys())


def test_play_by_name_with_an_iterator_and_a_policy_that_needs_the_future():
    # make_policy consumed the iterator for Bélády's future, and the replay saw 0 requests
    requests = [1, 2, 1, 3, 1, 2]
    expected = play("belady", requests, 2)
    for source in (iter(requests), (k for k in requests)):
        result = play("belady", source, 2)
        assert (result.requests, result.hits) == (expected.requests, expected.hits) == (6, 3)


@pytest.mark.parametrize("cls", [TinyLFUCache, TACache])
@pytest.mark.parametrize("maxsize", [10.5, float("inf"), "10", True])
def test_a_maxsize_that_is_not_an_integer_is_named(cls, maxsize):
    with pytest.raises(TypeError, match="maxsize must be an integer"):
        cls(maxsize)


@pytest.mark.parametrize("chunk", [0, -1, 2.5])
def test_play_refuses_a_chunk_that_is_not_positive(chunk):
    # chunk=-1 made range(0, n, -1) empty: n requests reported, none replayed, 0 hits
    with pytest.raises(ValueError, match="chunk"):
        play("lru", [1, 1, 1], 2, chunk=chunk)
    assert play("lru", [1, 1, 1], 2, chunk=1).hits == 2


@pytest.mark.parametrize("columns", [{"ts": [1.0]}, {"weights": [1]}, {"ts": [1.0] * 5},
                                     {"weights": [1] * 4}])
def test_play_refuses_a_trace_whose_columns_do_not_match_its_keys(columns):
    from mlcache.sim.readers import Trace

    trace = Trace(name="t", keys=[1, 2, 3], **columns)
    with pytest.raises(ValueError, match="3 keys but"):
        play("tac", trace, 2)


def test_a_broken_entry_point_neither_hides_the_others_nor_is_forgotten(tmp_path, monkeypatch):
    import sys

    from mlcache.policies import base, get_policy

    (tmp_path / "s8plugin.py").write_text(
        "from mlcache.policies.lru import LRUPolicy\n"
        "class Good(LRUPolicy):\n    name = 's8-good'\n")
    dist = tmp_path / "s8plugin-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: s8plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[mlcache.policies]\ns8-a-broken = s8plugin_missing:Nope\ns8-b-not-policy = s8plugin:Good.name\n"
        "s8-c-good = s8plugin:Good\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(base, "_ENTRY_POINTS_DONE", False, raising=False)
    monkeypatch.setattr(base, "_ENTRY_POINT_FAILURES", [])
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    for _ in range(2):  # the first lookup and every later one say the same
        with pytest.raises(ConfigError) as info:
            get_policy("s8-a-broken")
        assert "s8plugin_missing" in str(info.value) and "s8-b-not-policy" in str(info.value)
    assert get_policy("s8-c-good").__name__ == "Good"
    sys.modules.pop("s8plugin", None)


@pytest.mark.parametrize("n_keys, fraction", [(10, 1.0), (1, 0.5)])
def test_hotspot_keys_stay_in_the_key_space(n_keys, fraction):
    keys = generators.hotspot(2000, n_keys, fraction, 0.5).keys
    assert set(keys) <= set(range(n_keys))


def test_a_lookup_waits_for_plugins_another_thread_is_loading(tmp_path, monkeypatch):
    import sys
    import threading

    from mlcache.policies import base, get_policy

    gate = type(sys)("s8gate")
    gate.started, gate.go = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "s8gate", gate)
    (tmp_path / "s8slow.py").write_text(
        "import s8gate\ns8gate.started.set()\ns8gate.go.wait(10)\n"
        "from mlcache.policies.lru import LRUPolicy\n"
        "class Slow(LRUPolicy):\n    name = 's8-slow'\n")
    dist = tmp_path / "s8slow-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: s8slow\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[mlcache.policies]\ns8-slow = s8slow:Slow\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(base, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(base, "_ENTRY_POINTS_DONE", False, raising=False)
    monkeypatch.setattr(base, "_ENTRY_POINT_FAILURES", [])
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    found: dict = {}

    def look(who):
        try:
            found[who] = get_policy("s8-slow").__name__
        except Exception as exc:
            found[who] = repr(exc)

    first = threading.Thread(target=look, args=("first",))
    first.start()
    assert gate.started.wait(10)        # the first lookup is importing the plugin
    second = threading.Thread(target=look, args=("second",))
    second.start()
    second.join(0.5)                    # it answered "unknown policy" here, before the fix
    gate.go.set()
    first.join(10)
    second.join(10)
    assert found == {"first": "Slow", "second": "Slow"}
    sys.modules.pop("s8slow", None)


def test_a_pickled_or_copied_wtinylfu_policy_keeps_working():
    """W-TinyLFU's "no cached victim" marker was a plain object(): a pickled or deep-copied
    policy got a new object for it, took it for a key and raised KeyError on its next miss."""
    import copy

    from mlcache.policies.wtinylfu import WTinyLFUPolicy

    for copier in (lambda p: pickle.loads(pickle.dumps(p)), copy.deepcopy):
        p = copier(WTinyLFUPolicy(4))
        for i in range(40):
            p.insert(i)
        q = copier(p)
        for i in range(40, 80):
            q.insert(i)
        assert len(p) == len(q) == 4


def test_manager_hint_with_a_policy_without_hint(tmp_path):
    """hint is optional in the Policy protocol, but manager.hint() called the heap policy's
    hint unconditionally: AttributeError from a registered policy without one."""
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    from mlcache.policies.lru import LRUPolicy

    class NoHint(LRUPolicy):
        name = "s8-nohint"

        def __getattribute__(self, attr):
            if attr == "hint":
                raise AttributeError(attr)
            return super().__getattribute__(attr)

    register_policy("s8-nohint", NoHint)
    cfg = CacheConfig(heap=HeapConfig(max_entries=4, max_bytes=None, policy="s8-nohint"),
                      levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(cfg) as m:
        m.put("a", 1)
        m.hint("a", 5.0)      # resident
        m.hint("zz", 6.0)     # absent
        assert m.get("a") == 1
