"""Session 8 review of the write path and the Redis level: regression tests for the defects
found, each against a real redis-server (a private one where the test stops it)."""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
from mlcache._redis_server import RedisServer
from mlcache.errors import LevelUnavailableError
from mlcache.levels.redis import RedisLevel


@pytest.fixture()
def own_redis():
    """A private server this test may stop and start again."""
    server = RedisServer().start()
    yield server
    server.cleanup()


def _on_writer() -> bool:
    return threading.current_thread().name.startswith("mlcache-writer-")


def test_flush_does_not_return_while_a_writer_batch_it_staged_fails(own_redis):
    # flush() stages a and b; it writes a itself and the writer thread takes b after flush's
    # last look at the buffer. Redis stops while b is in flight: b goes back to the buffer.
    # flush() used to wait for the write to end and return as if b had reached Redis (and
    # clear the writer's error), so the caller's durability point was not one.
    config = CacheConfig(heap=HeapConfig(policy="lru", max_entries=100, max_bytes=None),
                         levels=(RedisConfig(url=own_redis.url, prefix="s8", retries=0,
                                             socket_timeout=2.0),),
                         write_batch_size=1, retry_attempts=1, retry_backoff=0.01)
    m = CacheManager(config)
    wb, level = m._wb, m._levels[0]
    flush_took, writer_in, release = threading.Event(), threading.Event(), threading.Event()
    real_drain, real_put = wb.drain_once, level.put_many
    writer_calls = []

    def drain_once():
        if _on_writer():
            flush_took.wait(10)          # the writer takes its batch after flush took one
            return real_drain()
        n = real_drain()
        flush_took.set()
        writer_in.wait(10)               # ... and before flush looks at the buffer again
        return n

    def put_many(items):
        if _on_writer():
            writer_calls.append(items)
            if len(writer_calls) == 1:
                writer_in.set()
                release.wait(10)
        return real_put(items)

    wb.drain_once, level.put_many = drain_once, put_many
    m.put("a", 1)
    m.put("b", 2)
    outcome = {}

    def flush():
        try:
            m.flush()
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            outcome["error"] = exc

    t = threading.Thread(target=flush)
    t.start()
    assert writer_in.wait(10)
    own_redis.kill()                     # Redis stops while the writer's batch is in flight
    release.set()
    t.join(20)
    assert not t.is_alive()
    assert "ok" not in outcome, "flush() returned though a batch it staged was not written"
    assert isinstance(outcome["error"], LevelUnavailableError)
    # nothing lost: once Redis is back (empty: it kept nothing), a flush writes the batch the
    # writer had in flight
    held = {m._kb(k): k for k in ("a", "b")}[writer_calls[0][0][0]]
    own_redis.start()
    wb.drain_once, level.put_many = real_drain, real_put
    m.flush()
    m.close()
    with CacheManager(config) as again:
        assert again.get(held) == {"a": 1, "b": 2}[held]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is a process that exited (its parent has not reaped it)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_an_embedded_server_does_not_outlive_a_process_that_never_closed(tmp_path):
    # A manager left open at exit (no close(): an exception, a forgotten with) left its private
    # redis-server running after the process ended, with its temporary directory, for good:
    # the writer thread keeps the level alive, and nothing stopped the server at exit.
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        from mlcache import CacheConfig, CacheManager, HeapConfig, RedisConfig
        m = CacheManager(CacheConfig(heap=HeapConfig(max_entries=10, max_bytes=None),
                                     levels=(RedisConfig(url="embedded"),)))
        for i in range(50):
            m.put(i, i)
        m.flush()
        server = m._levels[0]._server
        print(server.proc.pid, server.directory, flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    pid, directory = int(out[0]), out[1]
    try:
        for _ in range(100):
            if not _alive(pid):
                break
            time.sleep(0.05)
        assert not _alive(pid), "the embedded redis-server outlived its process"
        assert not os.path.exists(directory)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_embedded_server_is_not_stopped_by_a_forked_child_exiting():
    # the parent's server stays up when a child forked from it exits normally
    level = RedisLevel(RedisConfig(url="embedded", prefix="fork"))
    try:
        level.put_many([(b"k", b"v")])
        pid = os.fork()
        if pid == 0:   # the child runs the exit hooks of a normal interpreter shutdown
            code = 1
            try:
                code = 0 if level.get_many([b"k"]) == [b"v"] else 1
                atexit._run_exitfuncs()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert level.get_many([b"k"]) == [b"v"]
    finally:
        level.close()
