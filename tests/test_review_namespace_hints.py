"""Review, session 7: namespaces, hints after close, deeply nested keys, huge int event times.

Real managers on real disk levels in tmp dirs; no mocks.
"""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig
from mlcache.errors import CacheError, ConfigError


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
