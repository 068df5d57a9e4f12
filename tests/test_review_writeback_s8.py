"""Session 8 review of the write path and the Redis level: regression tests for the defects
found, each against a real redis-server (a private one where the test stops it)."""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig
from mlcache._redis_server import RedisServer
from mlcache.errors import CacheError, LevelUnavailableError
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


class _DropAfterExec:
    """A TCP proxy in front of a real server that, once armed, forwards a client's EXEC and
    then closes that connection without passing the server's replies back: the transaction
    is applied, its reply lost (a network drop at the worst moment)."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port_to))
            state = {"exec": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state),
                             daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        seen = b""
        while True:
            try:
                data = client.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            seen = (seen + data)[-64:]
            if self.armed.is_set() and b"\r\nEXEC\r\n" in seen:
                state["exec"] = True
            server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        while True:
            try:
                data = server.recv(1 << 16)
            except OSError:
                return
            if not data:
                client.close()
                return
            if state["exec"] and self.armed.is_set():
                # the EXEC was applied by the server; its reply never arrives
                self.armed.clear()
                self.dropped.set()
                client.shutdown(socket.SHUT_RDWR)
                client.close()
                server.close()
                return
            client.sendall(data)

    def close(self) -> None:
        self.sock.close()


def test_a_bounded_write_whose_exec_reply_is_lost_hands_back_its_victims(redis_url):
    # A bounded level's write is a WATCH/MULTI/EXEC transaction. When the connection dropped
    # after the server applied EXEC, redis-py raised WatchError ("a ConnectionError occurred
    # while watching"), which the level took for a concurrent writer and planned again on a
    # fresh connection: the first plan's victims were already unlinked from Redis and were
    # never handed back, so they were in no level at all. (The level keeps a marker for
    # exactly this, but only its own retry looked at it.)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = _DropAfterExec(port)
    level = RedisLevel(RedisConfig(url=proxy.url, prefix="lost", max_bytes=1000, retries=2))
    level.may_evict = True
    try:
        first = [(b"old%d" % i, b"o" * 100) for i in range(8)]
        assert level.put_many(first) == []
        proxy.armed.set()
        victims = level.put_many([(b"new%d" % i, b"n" * 100) for i in range(5)])
        assert proxy.dropped.is_set()
        stored = {k for k in level.scan()}
        handed = {k for k, _ in victims}
        # every old entry is still in Redis or was handed back (for the level below)
        assert {k for k, _ in first} <= stored | handed, sorted({k for k, _ in first} - stored)
        assert all(v == b"o" * 100 for k, v in victims if k.startswith(b"old"))
        assert level.used_bytes() <= 1000
    finally:
        level.close()
        proxy.close()


def test_a_bounded_write_the_server_drops_raises_instead_of_spinning(own_redis):
    # A connection the server closes under every attempt of a bounded write (here: a value
    # over the server's proto-max-bulk-len, a protocol error that closes the connection) was
    # the same WatchError, retried at once and forever: the writer spun at full CPU holding
    # the I/O lock, and flush() never returned. It is a connection failure: retried
    # RedisConfig.retries times, then LevelUnavailableError.
    import redis as redis_py

    client = redis_py.Redis.from_url(own_redis.url)
    client.config_set("proto-max-bulk-len", 1 << 20)
    client.close()
    level = RedisLevel(RedisConfig(url=own_redis.url, prefix="big", max_bytes=10 << 20,
                                   retries=1))
    outcome = {}

    def write():
        try:
            level.put_many([(b"small", b"s"), (b"big", b"x" * (2 << 20))])
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            outcome["error"] = exc

    t = threading.Thread(target=write, daemon=True)
    t.start()
    t.join(60)   # a hang guard, not a timing assertion: the write fails in milliseconds
    try:
        assert not t.is_alive(), "the bounded write never returned"
        assert isinstance(outcome.get("error"), LevelUnavailableError), outcome
    finally:
        level.close()


def test_checkpoint_copies_a_level_down_in_batches_not_all_at_once(redis_url, tmp_path):
    # checkpoint() copied what Redis held newer than the disk level with one get_many of
    # every such key: the whole lot in memory at once (~390 MiB traced for 190 MB under a
    # 4 MiB heap), where flush and the writer keep to the heap budget's batch bound. Now in
    # batches, each read and written before the next.
    import redis as redis_py

    config = CacheConfig(heap=HeapConfig(max_bytes=4 << 20),
                         levels=(RedisConfig(url=redis_url, prefix="cd", max_bytes=400 << 20),
                                 DiskConfig(path=str(tmp_path / "disk"))))
    value = bytes(64 << 10)
    m = CacheManager(config)
    try:
        for i in range(400):                        # 25 MiB, all of it newer in Redis
            m.put(i, b"%d:" % i + value)
        m.flush()
        assert len(m._wb.newer[0]) > 300
        tracemalloc.start()
        try:
            m.checkpoint()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert not m._wb.newer[0]
        assert peak < 8 << 20, f"checkpoint held {peak / 2**20:.1f} MiB at its peak"
    finally:
        m.close()
    client = redis_py.Redis.from_url(redis_url)
    client.flushall()                                # only the disk level has it now
    client.close()
    with CacheManager(config) as again:
        assert all(again.get(i) == b"%d:" % i + value for i in range(400))


def test_a_put_from_another_thread_during_close_is_refused_not_lost(redis_url):
    # close() checkpoints, then marks the manager closed and clears the heap. A put another
    # thread made in between (here: while the checkpoint copies down) returned normally and
    # was then dropped with the heap: acknowledged, never written. Writes from other threads
    # are refused once close() has begun ("this CacheManager is closed"); the closing
    # thread's own (flush listeners, structures) are still taken and checkpointed.
    config = CacheConfig(heap=HeapConfig(max_entries=100, max_bytes=None),
                         levels=(RedisConfig(url=redis_url, prefix="closing"),))
    m = CacheManager(config)
    m.put("before", 1)
    real_copy_down = m._wb.copy_down
    outcome = {}

    def put_elsewhere():
        for op, call in (("put", lambda: m.put("during", 2)),
                         ("put_many", lambda: m.put_many({"during2": 3})),
                         ("delete", lambda: m.delete("before"))):
            try:
                call()
                outcome[op] = "ok"
            except CacheError as exc:
                outcome[op] = str(exc)

    def copy_down():
        t = threading.Thread(target=put_elsewhere)
        t.start()
        t.join(10)
        real_copy_down()

    m._wb.copy_down = copy_down
    m.close()
    assert m.closed
    with CacheManager(config) as again:
        for op, key, value in (("put", "during", 2), ("put_many", "during2", 3),
                               ("delete", "before", None)):
            if outcome[op] == "ok":   # acknowledged: it must have been kept
                assert again.get(key) == value, (op, outcome)
            else:
                assert "closed" in outcome[op]
        if outcome["delete"] != "ok":
            assert again.get("before") == 1


def test_invalidate_local_after_close_raises_like_the_other_calls(redis_url):
    # it returned 0, as if there had been nothing to forget, where every other call of a
    # closed manager raises
    m = CacheManager(CacheConfig(heap=HeapConfig(max_entries=10, max_bytes=None),
                                 levels=(RedisConfig(url=redis_url, prefix="inv"),)))
    m.put("k", 1)
    m.close()
    for call in (m.invalidate_local, lambda: m.invalidate_local("other")):
        with pytest.raises(CacheError, match="closed"):
            call()


def test_a_bounded_write_failing_after_exec_was_applied_loses_no_victim(redis_url, tmp_path):
    # The same lost EXEC reply, with no retry left (RedisConfig.retries=0): the level raised
    # LevelUnavailableError, the write-back requeued the batch, and the next attempt planned
    # afresh: the victims the applied plan had unlinked from Redis were in no level. The
    # error now carries the victims the failed write may have removed, and the write-back
    # queues them for the level below (a copy of one still in Redis is harmless).
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = _DropAfterExec(port)
    config = CacheConfig(heap=HeapConfig(policy="lru", max_entries=1, max_bytes=None),
                         levels=(RedisConfig(url=proxy.url, prefix="applied", max_bytes=1200,
                                             retries=0),
                                 DiskConfig(path=str(tmp_path / "disk"))),
                         retry_attempts=3, retry_backoff=0.01)
    value = {i: b"v" * 100 for i in range(12)}
    try:
        with CacheManager(config) as m:
            for i in range(8):
                m.put(i, value[i])
            m.flush()
            assert m.stats()["levels"]["redis"]["evictions"].get("overflow", 0) == 0
            proxy.armed.set()
            for i in range(8, 12):
                m.put(i, value[i])
            m.flush()
            assert proxy.dropped.is_set()
            assert all(m.get(i) == value[i] for i in range(12))
        import redis as redis_py

        client = redis_py.Redis.from_url(redis_url)
        client.flushall()                # the store of record alone must have everything
        client.close()
        with CacheManager(config) as again:
            missing = [i for i in range(12) if again.get(i) != value[i]]
            assert not missing, missing
    finally:
        proxy.close()


@pytest.mark.parametrize("max_bytes", [None, 10 << 20])
def test_a_value_over_the_servers_bulk_limit_is_named_in_the_error(own_redis, max_bytes):
    # A value longer than the server's proto-max-bulk-len (512 MiB by default; here set to
    # its 1 MiB minimum) is refused by Redis with "Protocol error: invalid bulk length", and
    # the connection closed. The error said only that (bounded: "Connection closed by
    # server"): nothing named the key, and every flush failed the same way while the batch
    # holding it stayed queued. It now names the key, its size and the server's limit.
    import redis as redis_py

    client = redis_py.Redis.from_url(own_redis.url)
    client.config_set("proto-max-bulk-len", 1 << 20)
    client.close()
    config = CacheConfig(heap=HeapConfig(policy="lru", max_entries=1, max_bytes=None),
                         levels=(RedisConfig(url=own_redis.url, prefix="bulk", retries=0,
                                             max_bytes=max_bytes),),
                         retry_attempts=1)
    m = CacheManager(config)
    m.put(("blob", 7), b"x" * (2 << 20))
    m.put("small", 1)
    with pytest.raises(LevelUnavailableError) as info:
        m.flush()
    message = str(info.value)
    assert "('blob', 7)" in message and "proto-max-bulk-len" in message, message
    assert "1048576" in message, message
    assert info.value.key == ("blob", 7)
    # deleting the key the error names lets everything else through
    m.delete(("blob", 7))
    m.flush()
    m.close()
    with CacheManager(config) as again:
        assert again.get("small") == 1 and again.get(("blob", 7)) is None


def test_put_many_larger_than_the_heap_keeps_the_eviction_buffer_bound(redis_url):
    # put_many queued the encodings of every victim of the whole batch before making room
    # (one lock hold for the batch): a 20 MB batch into a 4 MiB heap held ~20 MB of
    # encodings at once (tracemalloc: 22.9 MiB over the batch's own objects), where the
    # buffer's bound is 1/32 of the budget. A batch now writes what its victims queued
    # when the buffer is full, as a put does, and goes on.
    config = CacheConfig(heap=HeapConfig(max_bytes=4 << 20),
                         levels=(RedisConfig(url=redis_url, prefix="many"),))
    with CacheManager(config) as m:
        m.put("warm", b"x")
        m.flush()
        items = [(i, b"%d:" % i + bytes(1000)) for i in range(20000)]
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            m.put_many(items)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert peak < 10 << 20, f"put_many held {peak / 2**20:.1f} MiB at its peak"
        assert all(m.get(k) == v for k, v in items[::97])
    with CacheManager(config) as again:
        assert all(again.get(k) == v for k, v in items)


def test_put_many_with_redis_down_still_takes_every_item_then_raises(own_redis):
    # making room between the batch's items fails when Redis is down: the rest of the batch
    # is still taken (in the heap or the buffer) and the error raised at the end, as a
    # single put's (the value was taken, a retry is harmless)
    config = CacheConfig(heap=HeapConfig(max_bytes=1 << 20),
                         levels=(RedisConfig(url=own_redis.url, prefix="down", retries=0),),
                         retry_attempts=1)
    m = CacheManager(config)
    m.put("warm", b"x")
    m.flush()
    own_redis.kill()
    items = [(i, b"%d:" % i + bytes(1000)) for i in range(3000)]
    with pytest.raises(LevelUnavailableError):
        m.put_many(items)
    assert all(m.get(k) == v for k, v in items)     # from the heap and the buffer: no I/O
    own_redis.start()
    m.close()
    with CacheManager(config) as again:
        assert all(again.get(k) == v for k, v in items)
