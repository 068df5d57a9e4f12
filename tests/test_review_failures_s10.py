"""Session 10 review from the outside: failures a production job meets, injected for real (a
redis-server SIGKILLed and started again on its port, a disk directory removed under a running
manager), and what the user sees. Regression tests for the defects found."""
from __future__ import annotations

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache._redis_server import RedisServer
from mlcache.errors import IntegrityError, LevelUnavailableError


@pytest.fixture()
def own_redis():
    """A private server this test may kill and start again."""
    server = RedisServer().start()
    yield server
    server.cleanup()


def _heap_redis_disk(url: str, path: str, namespace: str = "lost") -> CacheConfig:
    return CacheConfig(heap=HeapConfig(policy="lru", max_entries=10, max_bytes=None),
                       levels=(RedisConfig(url=url, prefix=namespace), DiskConfig(path=path)),
                       namespace=namespace)


def test_writes_a_restarted_redis_lost_are_reported_not_read_stale_from_disk(own_redis, tmp_path):
    """heap -> Redis -> disk: flushed writes live in Redis only until a checkpoint. A server
    restarted without its data lost them; reads fell through to disk's older checkpointed
    version and returned it as the latest (41 of 50 keys read 'v1' after 'v2' was flushed), and
    the next checkpoint() returned as if the store of record had everything, so the loss was
    never reported. Now a read of such a key raises IntegrityError naming the level and the
    key, and the checkpoint raises once naming them, after everything else is checkpointed."""
    cfg = _heap_redis_disk(own_redis.url, str(tmp_path / "store"))
    m = CacheManager(cfg)
    for i in range(50):
        m.put(i, "v1")
    m.checkpoint()
    for i in range(50):
        m.put(i, "v2")
    m.flush()
    own_redis.kill()
    own_redis.start()                # same port, no data (no append-only file)
    lru_victim = 0                   # the LRU heap of 10 holds 40..49
    with pytest.raises(IntegrityError) as err:
        m.get(lru_victim)
    assert err.value.level == "redis" and err.value.key == lru_victim
    assert "redis level, key 0" in str(err.value)
    m.put("late", "also kept")
    with pytest.raises(IntegrityError) as err:
        m.checkpoint()
    assert err.value.level == "redis"
    assert "checkpoint: 50 entries written to the redis level" in str(err.value)
    m.checkpoint()                   # reported once: the next checkpoint (and close) succeed
    assert m.get(lru_victim) == "v1"   # reported: now the older copy below
    m.close()
    with CacheManager(cfg) as again:
        assert again.get("late") == "also kept"
        assert again.get(0) == "v1"


def test_a_write_after_the_loss_replaces_the_lost_entry(own_redis, tmp_path):
    """Putting or deleting a key the restart lost goes on as usual: no error for it after."""
    cfg = _heap_redis_disk(own_redis.url, str(tmp_path / "store"), "lost2")
    with CacheManager(cfg) as m:
        for i in range(30):
            m.put(i, {"n": i})
        m.flush()
        own_redis.kill()
        own_redis.start()
        m.put(0, {"n": "again"})
        m.delete(1)
        assert m.get(0) == {"n": "again"} and m.get(1) is None
        with pytest.raises(IntegrityError):
            m.get(2)
        with pytest.raises(IntegrityError) as err:
            m.checkpoint()
        assert "28 entries" in str(err.value)   # 2..29: not the key put, nor the one deleted
    with CacheManager(cfg) as again:
        assert again.get(0) == {"n": "again"} and again.get(1) is None and again.get(2) is None


def test_keys_and_a_set_loop_do_not_leave_out_what_a_restarted_redis_lost(own_redis, tmp_path):
    """keys() (and a cacheable set's loop, which lists its namespace's keys) listed the
    keys the levels hold: entries a restarted Redis lost were left out silently (a set of 400
    looped over 300 elements while len() said 400). It raises like a read of them."""
    cfg = _heap_redis_disk(own_redis.url, str(tmp_path / "store"), "lost3")
    m = CacheManager(cfg)
    s = m.set("seen")
    for i in range(30):
        m.put(i, i)
        s.add(i)
    m.checkpoint()
    for i in range(30, 60):
        m.put(i, i)
        s.add(i)
    m.flush()
    own_redis.kill()
    own_redis.start()
    with pytest.raises(IntegrityError) as err:
        list(m.keys())
    assert err.value.level == "redis"
    with pytest.raises(IntegrityError):
        sum(s)
    with pytest.raises(IntegrityError):
        m.checkpoint()
    assert sorted(m.keys()) == list(range(30)) + [k for k in range(30, 60) if m.get(k) == k]
    m.close()


def test_a_checkpoint_after_the_disk_directory_was_removed_raises(tmp_path):
    """rm -r of a running manager's disk directory (a temp-directory cleaner): SQLite kept
    writing into the unlinked database file, so flush() and checkpoint() returned as if the
    writes were durable, and a new process found none of them (400 of 400 keys gone after a
    checkpoint that had returned). The checkpoint now raises, naming the directory and the
    file, and keeps raising (a close() stays open) rather than report a durable state."""
    import shutil

    path = tmp_path / "store"
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=10, max_bytes=None),
                      levels=(DiskConfig(path=str(path)),), namespace="gone")
    m = CacheManager(cfg)
    for i in range(50):
        m.put(i, {"v": i})
    m.checkpoint()
    shutil.rmtree(path)
    for i in range(50, 100):
        m.put(i, {"v": i})
    m.flush()
    with pytest.raises(LevelUnavailableError) as err:
        m.checkpoint()
    assert err.value.level == "disk"
    assert str(path) in str(err.value) and "removed or replaced" in str(err.value)
    with pytest.raises(LevelUnavailableError):
        m.close()
    assert not m.closed
    m._wb.stop()                      # (the test's own cleanup: the level cannot be closed)
    for level in m._levels:
        level.close()


def test_a_read_of_a_hung_redis_waits_one_round_not_three(own_redis):
    """Redis hung (SIGSTOP), its writer thread retrying a batch of other keys: a get of an
    evicted key counted as 'overlapped by a write' and went three rounds, each the level's
    retries x socket_timeout (24 s for a 2 s timeout and 3 retries; 60 s with the defaults,
    three times what RedisConfig's retries and socket_timeout say). It goes again only when
    the write it overlapped moved one of its keys. Counted in reads of the level, not in
    seconds."""
    import os
    import signal
    import threading

    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=50, max_bytes=None),
                      levels=(RedisConfig(url=own_redis.url, prefix="hung", socket_timeout=1.0,
                                          retries=0),),
                      namespace="hung", retry_backoff=0.05)
    m = CacheManager(cfg)
    for i in range(200):
        m.put(i, {"v": i})
    m.flush()
    level = m._levels[0]
    reads: list[int] = []
    read = level.get_many

    def counted(keys):
        if not threading.current_thread().name.startswith("mlcache-writer-"):
            reads.append(len(keys))
        return read(keys)

    level.get_many = counted
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        for i in range(200, 400):       # dirty victims: the writer's batches now hang and fail
            m.put(i, {"v": i})
        while m._wb.wseq % 2 == 0:      # a write of keys 200.. is in flight
            threading.Event().wait(0.01)
        with pytest.raises(LevelUnavailableError) as err:
            m.get(0)
        assert err.value.level == "redis"
        assert reads == [1]
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    level.get_many = read
    m.close()
    with CacheManager(cfg) as again:
        assert all(again.get(i) == {"v": i} for i in range(400))


def test_a_key_another_owner_deleted_after_invalidate_local_is_a_miss_not_a_loss(own_redis,
                                                                                 tmp_path):
    """Ownership moving between processes (coherence.md, the Spark integration): A flushed a
    key to Redis (not yet below), B took the key over and deleted it everywhere, A took it back
    with invalidate_local(). The key is deleted, not lost: A's read is a miss and A's checkpoint
    reports nothing (the loss check of fe32fb3 must not take another owner's delete for a
    server's loss once the keys were invalidated)."""
    cfg = _heap_redis_disk(own_redis.url, str(tmp_path / "store"), "owners")
    a, b = CacheManager(cfg), CacheManager(cfg)
    for i in range(30):
        a.put(i, "a")
    a.flush()                         # in Redis, not yet on disk
    b.invalidate_local()
    b.delete(3)
    b.put(4, "b")
    b.checkpoint()
    a.invalidate_local()              # A takes the keys back
    assert a.get(3) is None
    assert a.get(4) == "b"
    assert sorted(a.keys()) == list(range(30))[:3] + list(range(4, 30))
    a.checkpoint()
    assert a.get(5) == "a"
    a.close()
    b.close()
    with CacheManager(cfg) as again:
        assert again.get(3) is None and again.get(4) == "b" and again.get(5) == "a"


_EMBEDDED_USER = """
import sys
from mlcache import CacheConfig, CacheManager, RedisConfig
m = CacheManager(CacheConfig(heap=None, levels=(RedisConfig(url="embedded"),)))
m.put("k", 1)
level = m._levels[0]
print(level._server.port, level._server.directory, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_levels_embedded_redis_does_not_outlive_a_killed_process(sig):
    """RedisConfig(url="embedded") started a private redis-server stopped by close() or a
    finalizer at exit; a process ended by SIGTERM (a scheduler, ``kill``) or SIGKILL runs
    neither, and left the server running with its directory, for good (one per killed
    process). A watchdog now stops it (as the SparkCache's embedded server's, 6579e36)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    user = subprocess.Popen([sys.executable, "-c", _EMBEDDED_USER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port, directory = user.stdout.readline().split()
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5):
            pass
        user.send_signal(getattr(signal, sig))
        user.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            except OSError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"redis-server on port {port} outlived its process ({sig})")
        while os.path.exists(directory) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(directory)
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
