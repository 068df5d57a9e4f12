"""The Spark integration's pieces that need no SparkSession: config, epochs, versioned views.

These run in one process against real levels (disk, and the session Redis server); the
behaviour under real Spark is in test_spark.py.
"""
from __future__ import annotations

import threading

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import ConfigError, LevelUnavailableError
from mlcache.integrations.spark import (SparkCache, check_picklable, config_fingerprint,
                                        config_from_spark_conf, open_epoch_store)
from mlcache.integrations.spark._versioned import BatchView, ReplayError, unwrap


def _disk_config(tmp_path, ns):
    return CacheConfig(levels=(DiskConfig(path=str(tmp_path / "disk")),), namespace=ns)


def test_spark_conf_builds_a_config():
    conf = {
        "spark.mlcache.heap.max_bytes": "1048576",
        "spark.mlcache.heap.policy": "lru",
        "spark.mlcache.levels": "redis,disk",
        "spark.mlcache.redis.url": "redis://cache:6379/1",
        "spark.mlcache.disk.path": "/tmp/somewhere",
        "spark.mlcache.namespace": "fraud",
        "spark.mlcache.prefetch.enabled": "false",
        "spark.app.name": "ignored",
    }
    cfg = config_from_spark_conf(conf)
    assert cfg.heap.max_bytes == 1 << 20 and cfg.heap.policy == "lru"
    assert [lv.kind for lv in cfg.levels] == ["redis", "disk"]
    assert cfg.levels[0].url == "redis://cache:6379/1"
    assert cfg.levels[1].path == "/tmp/somewhere"
    assert cfg.namespace == "fraud" and cfg.prefetch.enabled is False
    assert config_from_spark_conf({"spark.app.name": "x"}) is None


def test_spark_conf_errors_name_the_setting():
    with pytest.raises(ConfigError, match=r"spark\.mlcache\.heap\.max_bytes"):
        config_from_spark_conf({"spark.mlcache.heap.max_bytes": "-3"})
    with pytest.raises(ConfigError, match=r"spark\.mlcache\.levels"):
        config_from_spark_conf({"spark.mlcache.levels": "redis,tape"})
    with pytest.raises(ConfigError, match=r"spark\.mlcache\.bogus"):
        config_from_spark_conf({"spark.mlcache.bogus.thing": "1"})


def test_unpicklable_config_names_the_setting(tmp_path):
    cfg = CacheConfig(heap=HeapConfig(policy_options={"lock": threading.Lock()}),
                      levels=(DiskConfig(path=str(tmp_path / "d")),))
    with pytest.raises(ConfigError, match=r"heap\.policy_options\.lock.*pickled"):
        check_picklable(cfg)
    with pytest.raises(ConfigError, match=r"heap\.policy_options\.lock"):
        SparkCache(cfg)


def test_heap_only_config_is_refused(unique_ns):
    with pytest.raises(ConfigError, match="levels"):
        open_epoch_store(CacheConfig(levels=(), namespace=unique_ns))


def test_unreachable_redis_names_the_url():
    cfg = CacheConfig(levels=(RedisConfig(url="redis://u:secret@127.0.0.1:1/0",
                                          socket_timeout=0.5),))
    with pytest.raises(LevelUnavailableError, match=r"redis\.url.*127\.0\.0\.1:1") as info:
        open_epoch_store(cfg)
    assert "secret" not in str(info.value)


def test_fingerprint_is_stable_and_discriminating(tmp_path):
    a = _disk_config(tmp_path, "a")
    assert config_fingerprint(a) == config_fingerprint(_disk_config(tmp_path, "a"))
    assert config_fingerprint(a) != config_fingerprint(_disk_config(tmp_path, "b"))


@pytest.mark.parametrize("shared", ["disk", "redis"])
def test_epochs_move_only_when_the_owner_changes(shared, tmp_path, unique_ns, redis_url):
    cfg = (_disk_config(tmp_path, unique_ns) if shared == "disk"
           else CacheConfig(levels=(RedisConfig(url=redis_url),), namespace=unique_ns))
    store = open_epoch_store(cfg)
    try:
        assert store.acquire("s", 3, "A") == 1
        assert store.acquire("s", 3, "A") == 1      # same owner again: nothing to drop
        assert store.acquire("s", 3, "B") == 2
        assert store.acquire("s", 3, "A") == 3      # A must notice B was there
        assert store.acquire("s", 0, "B") == 1
        assert store.partitions("s") == [0, 3]
        assert store.record_creation("w1") == 1 and store.record_creation("w1") == 2
        assert store.creations() == {"w1": 2}
        assert store.last_committed("s") is None
        store.mark_committed("s", 7)
        assert store.last_committed("s") == 7
    finally:
        store.close()


def test_batch_view_replay_reads_the_pre_batch_state(tmp_path, unique_ns):
    with CacheManager(_disk_config(tmp_path, unique_ns)) as m:
        ns = m.namespace("v")

        def run(batch, attempt, increments):
            view = BatchView(ns, batch, attempt)
            for k in increments:
                view.put(k, view.get(k, 0) + 1)
            return view

        run(0, "a0", ["x", "x", "y"])
        assert unwrap(ns.get("x")) == (True, 2)
        run(1, "a1", ["x", "z"])                     # the first attempt of batch 1 "fails"...
        view = run(1, "a2", ["x", "z"])              # ...and is replayed
        assert unwrap(ns.get("x")) == (True, 3) and unwrap(ns.get("z")) == (True, 1)
        assert sorted(view.changes()) == [("x", 3, 2), ("z", 1, None)]
        deleted = BatchView(ns, 2, "a3")
        deleted.delete("y")
        assert not deleted.contains("y") and sorted(deleted.keys()) == ["x", "z"]
        assert BatchView(ns, 3, "a4").get("y") is None
        with pytest.raises(ReplayError, match="batch ids must not go backwards"):
            BatchView(ns, 1, "a5").get("y")


def test_batch_view_survives_in_place_mutation(tmp_path, unique_ns):
    with CacheManager(_disk_config(tmp_path, unique_ns)) as m:
        ns = m.namespace("v")
        BatchView(ns, 0, "a").put("k", [1])
        first = BatchView(ns, 1, "b")
        value = first.get("k")
        value.append(2)                              # mutated in place, then written
        first.put("k", value)
        again = BatchView(ns, 1, "c")                # a replay of batch 1
        assert again.get("k") == [1]


def test_executor_manager_is_one_per_process_and_rebuilt_after_fork(tmp_path, unique_ns):
    import os
    from concurrent.futures import ThreadPoolExecutor

    from mlcache.integrations.spark import executor_manager, worker_context

    cfg = _disk_config(tmp_path, unique_ns)
    with ThreadPoolExecutor(8) as pool:
        managers = list(pool.map(lambda _: executor_manager(cfg), range(32)))
    assert all(m is managers[0] for m in managers)
    assert executor_manager(cfg.to_dict()) is managers[0]     # same config, as a mapping
    pid = os.fork()
    if pid == 0:  # the child must build its own manager, never reuse the parent's
        try:
            ok = executor_manager(cfg) is not managers[0] and worker_context(cfg).pid == os.getpid()
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    store = open_epoch_store(cfg)
    try:
        creations = store.creations()
    finally:
        store.close()
    assert sorted(int(w.split(":")[1]) for w in creations) == sorted([os.getpid(), pid])
    assert set(creations.values()) == {1}


@pytest.mark.parametrize("levels", ["disk,disk", "redis, disk, redis"])
def test_spark_conf_a_level_listed_twice_is_refused(levels):
    """levels=disk,disk was accepted as two levels on one path (each kind has one set of
    settings in the Spark conf, so a repeat can only be the same level twice)."""
    from mlcache.errors import ConfigError
    from mlcache.integrations.spark import config_from_spark_conf

    conf = {"spark.mlcache.levels": levels, "spark.mlcache.disk.path": "/tmp/mlcache-twice",
            "spark.mlcache.redis.url": "redis://cache:6379/0"}
    with pytest.raises(ConfigError, match=r"spark\.mlcache\.levels: level '(disk|redis)' is "
                                          r"listed 2 times"):
        config_from_spark_conf(conf)
