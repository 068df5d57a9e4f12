"""Regression tests of the disk level from the session-7 review: each names the defect it pins."""
from __future__ import annotations

import os
import threading

import pytest

import mlcache.levels.disk as disk_mod
from mlcache.config import DiskConfig
from mlcache.levels.disk import DiskLevel

BIG = 40_000    # above diskcache's min_file_size (32 KiB): the value goes to a file of its own


def _recording_fsync(monkeypatch) -> list[str]:
    synced: list[str] = []
    real = disk_mod._fsync

    def recording(path: str) -> bool:
        synced.append(os.path.normpath(path))
        return real(path)

    monkeypatch.setattr(disk_mod, "_fsync", recording)
    return synced


def _value_files(path: str) -> set[str]:
    return {os.path.normpath(os.path.join(d, f))
            for d, _, names in os.walk(path) for f in names if f.endswith(".val")}


@pytest.mark.parametrize("shards", [1, 3])
def test_value_files_waiting_for_sync_stay_bounded_and_durable(tmp_path, monkeypatch, shards):
    # regression: every value file written was remembered for sync() (~160 bytes a path) and
    # only sync() let go of them: a process that never checkpointed grew without bound, even
    # when it rewrote one key (the replaced files stayed in the set)
    monkeypatch.setattr(disk_mod, "_UNSYNCED_LIMIT", 8)
    synced = _recording_fsync(monkeypatch)
    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=shards))
    try:
        for i in range(60):
            level.put_many([(b"k%d" % i, os.urandom(BIG))])
            level.put_many([(b"same", os.urandom(BIG))])
            assert all(len(s.disk.unsynced) <= 8 for s in level._shards)
        early = set(synced)
        assert early, "nothing was synced before sync()"
        # every file synced early had its directory entries synced up to the shard's root
        roots = {os.path.normpath(s.disk._directory) for s in level._shards}
        for path in early & _value_files(level.path):
            chain = os.path.dirname(path)
            while True:
                assert chain in early, chain
                if chain in roots:
                    break
                chain = os.path.dirname(chain)
        level.sync()                       # the promise of sync(): every file on disk is synced
        assert _value_files(level.path) <= set(synced)
        assert all(not s.disk.unsynced for s in level._shards)
        assert level.get_many([b"k0", b"k59"]) != [None, None]
    finally:
        level.close()


def test_a_failed_sync_keeps_the_files_it_had_not_made_durable(tmp_path, monkeypatch):
    # regression: sync() popped each path before its fsync; after a failure the paths it had
    # taken were forgotten, and the next sync() returned without making them durable
    level = DiskLevel(DiskConfig(path=str(tmp_path / "d")))
    try:
        level.put_many([(b"a", os.urandom(BIG)), (b"b", os.urandom(BIG))])
        real = disk_mod._fsync

        def failing(path: str) -> bool:
            raise OSError(5, "Input/output error", path)

        monkeypatch.setattr(disk_mod, "_fsync", failing)
        with pytest.raises(Exception, match="Input/output error"):
            level.sync()
        synced: list[str] = []
        monkeypatch.setattr(disk_mod, "_fsync", lambda p: synced.append(p) or real(p))
        level.sync()
        assert {os.path.normpath(p) for p in synced} >= _value_files(level.path)
    finally:
        level.close()


# -- close: every thread's connection -------------------------------------------------------------

def _open_files_under(path: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path + os.sep):
            found.append(target)
    return found


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc fds")


@needs_proc
@pytest.mark.parametrize("shards", [1, 3])
def test_close_closes_the_connections_of_every_thread(tmp_path, shards):
    # regression: diskcache keeps one SQLite connection per thread and its close() closes the
    # calling thread's only; the connections of the writer thread or of Spark task threads, and
    # the database, WAL and shared-memory files they hold, stayed open while those threads lived.
    # (This also fails if diskcache opens a connection other than through Cache._con.)
    from mlcache.errors import LevelUnavailableError

    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=shards, max_bytes=1 << 24))
    used, release = threading.Barrier(4), threading.Event()
    outcomes: list[str] = []

    def worker(n: int) -> None:
        level.put_many([(b"w%d-%d" % (n, i), os.urandom(i * 9000)) for i in range(6)])
        level.get_many([b"w%d-%d" % (n, i) for i in range(6)])
        used.wait()
        release.wait()
        for call in (lambda: level.get_many([b"w0-1"]), lambda: level.put_many([(b"x", b"y")]),
                     lambda: list(level.scan(b"")), level.sync, lambda: len(level)):
            try:
                call()
            except LevelUnavailableError as exc:
                outcomes.append("closed" if "is closed" in str(exc) else repr(exc))
            else:
                outcomes.append("answered")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    used.wait()
    assert _open_files_under(level.path)
    level.close()
    try:
        assert _open_files_under(level.path) == []     # the other threads are still alive
    finally:
        release.set()
        for t in threads:
            t.join()
    assert outcomes == ["closed"] * 15
    assert _open_files_under(level.path) == []
    again = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=shards))
    try:
        assert again.get_many([b"w2-5"]) != [None]
    finally:
        again.close()


@needs_proc
def test_close_while_other_threads_read_and_write(tmp_path):
    # close() used to pull the connection from under a call in progress on another thread; now
    # it waits for the calls in progress and every later call says the level is closed
    from mlcache.errors import LevelUnavailableError

    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=2))
    started = threading.Barrier(5)
    errors: list[str] = []
    done = [0] * 4

    def worker(n: int) -> None:
        i = 0
        while True:
            try:
                level.put_many([(b"k%d-%d" % (n, i % 50), os.urandom(40 if i % 3 else BIG))])
                level.get_many([b"k%d-%d" % (n, j) for j in range(10)])
                if i % 7 == 0:
                    level.delete_many([b"k%d-%d" % (n, i % 50)])
            except LevelUnavailableError as exc:
                if "is closed" not in str(exc):
                    errors.append(repr(exc))
                    started.abort()
                return
            except Exception as exc:     # noqa: BLE001 - any other error is the defect
                errors.append(repr(exc))
                started.abort()          # (rather than leave the test waiting)
                return
            i += 1
            done[n] = i
            if i == 20:
                started.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        started.wait()
    finally:
        level.close()
        for t in threads:
            t.join()
    assert errors == []
    assert min(done) >= 20
    assert _open_files_under(level.path) == []


# -- one directory, several levels ----------------------------------------------------------------

@pytest.mark.parametrize("shards", [1, 3])
def test_two_levels_on_one_directory_in_one_process_share_it_exactly(tmp_path, shards):
    # A disk directory is shared by the processes of a host (its data, byte count and recency
    # order live in SQLite), and two levels opened on it in one process are two more openers:
    # each sees the other's writes, the byte count is the directory's, and closing one leaves
    # the other working (close() closes the connections of its own level only).
    path = str(tmp_path / "d")
    a = DiskLevel(DiskConfig(path=path, shards=shards, max_bytes=300_000))
    b = DiskLevel(DiskConfig(path=path, shards=shards, max_bytes=300_000))
    victims: dict[bytes, bytes] = {}
    last: dict[bytes, bytes] = {}
    lock = threading.Lock()

    def writer(level: DiskLevel, tag: bytes) -> None:
        for i in range(150):
            key, value = tag + b"%d" % (i % 40), os.urandom((i * 7919) % BIG + 1)
            out = level.put_many([(key, value)])
            with lock:
                last[key] = value
                victims.update(out)

    threads = [threading.Thread(target=writer, args=(lv, tag))
               for lv, tag in ((a, b"a"), (b, b"b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        keys = sorted(a.scan(b""))
        assert keys == sorted(b.scan(b"")) and set(keys) <= set(last)
        values = a.get_many(keys)
        assert values == b.get_many(keys) == [last[k] for k in keys]
        assert set(last) - set(keys) <= set(victims)        # the others were handed back
        assert a.used_bytes() == b.used_bytes() == sum(map(len, values)) <= 300_000
        assert len(a) == len(b) == len(keys)
        a.close()
        b.put_many([(b"after", b"a closed")])
        assert b.get_many([b"after", keys[0]]) == [b"a closed", values[0]]
    finally:
        a.close()
        b.close()


def test_two_managers_on_one_directory_in_one_process(tmp_path):
    # the same at the manager's level: what one checkpoints the other reads (after dropping its
    # own clean heap copies, as across processes), and closing one leaves the other working
    from mlcache import CacheConfig, CacheManager, HeapConfig

    cfg = CacheConfig(heap=HeapConfig(max_entries=10),
                      levels=(DiskConfig(path=str(tmp_path / "d")),))
    first, second = CacheManager(cfg), CacheManager(cfg)
    try:
        for i in range(100):
            first.put(("first", i), "x" * i)
            second.put(("second", i), "y" * i)
        first.checkpoint()
        second.checkpoint()
        first.invalidate_local()
        second.invalidate_local()
        assert all(first.get(("second", i)) == "y" * i for i in range(100))
        assert all(second.get(("first", i)) == "x" * i for i in range(100))
        first.close()
        second.put("late", 1)
        second.checkpoint()
        assert second.get(("first", 99)) == "x" * 99
    finally:
        first.close()
        second.close()
    third = CacheManager(cfg)
    try:
        assert third.get("late") == 1 and third.get(("second", 5)) == "y" * 5
    finally:
        third.close()


# -- a value file lost behind the level's back ----------------------------------------------------

@pytest.mark.parametrize("shards", [1, 3])
def test_a_lost_value_file_is_an_integrity_error_not_a_miss(tmp_path, shards):
    # regression: a value file removed behind the level's back (a tmp cleaner, a disk error)
    # read as a miss while its row stayed (listed by scan, counted by used_bytes): the store of
    # record answered "no such key" and the caller's state silently started afresh
    from mlcache.errors import IntegrityError

    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=shards, max_bytes=1 << 20))
    try:
        level.put_many([(b"big", b"x" * BIG), (b"small", b"s")])
        (lost,) = _value_files(level.path)
        os.remove(lost)
        with pytest.raises(IntegrityError, match="missing") as err:
            level.get_many([b"small", b"big"])
        assert err.value.level == "disk" and "b'big'" in str(err.value)
        assert level.get_many([b"small"]) == [b"s"]             # other keys are unaffected
        level.put_many([(b"big", b"y" * BIG)])                   # overwriting repairs it
        assert level.get_many([b"big"]) == [b"y" * BIG]
        os.remove(*_value_files(level.path))
        level.delete_many([b"big"])                              # and so does deleting
        assert level.get_many([b"big"]) == [None] and level.used_bytes() == 1
        level.put_many([(b"old", b"o" * BIG)])
        os.remove(*_value_files(level.path))
        level.put_many([(b"new", b"n" * (1 << 20))])             # evicting it is no error
        assert level.get_many([b"old", b"new"]) == [None, b"n" * (1 << 20)]
    finally:
        level.close()


def test_a_lost_value_file_reaches_the_manager_caller(tmp_path):
    from mlcache import CacheConfig, CacheManager, HeapConfig
    from mlcache.errors import IntegrityError

    cfg = CacheConfig(heap=HeapConfig(max_entries=10),
                      levels=(DiskConfig(path=str(tmp_path / "d")),))
    m = CacheManager(cfg)
    try:
        m.put("state", "z" * BIG)
        m.checkpoint()
        m.invalidate_local()
        os.remove(*_value_files(m._levels[0].path))
        with pytest.raises(IntegrityError) as err:
            m.get("state")
        assert err.value.level == "disk"
        assert err.value.key == "state"  # the caller's key, not None nor the stored bytes
    finally:
        m.close()


# -- fork -----------------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_during_another_thread_s_call_can_use_sync_and_close(tmp_path):
    # regression: close() waits for the calls in progress, and a child forked while another
    # thread was inside a call inherited that call, which would never return there: the child's
    # close() hung. A lock held by another thread at the fork (sync's) hung the child's sync(),
    # and closing the parent's other threads' connections in the child could wait for ever on a
    # mutex one of them held. (The call in progress here waits on sync's lock, not inside
    # SQLite: a fork while a thread is inside SQLite may leave SQLite's own locks taken.)
    import multiprocessing
    import time

    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=2))
    level.put_many([(b"a", b"1")])
    release = threading.Event()
    others_used = threading.Barrier(2)

    def holder() -> None:
        level.get_many([b"a"])                       # a connection of this thread's
        with level._sync_lock:
            others_used.wait()
            release.wait()

    threads = [threading.Thread(target=holder), threading.Thread(target=level.sync)]
    threads[0].start()
    others_used.wait()
    threads[1].start()                               # waits inside the call for sync's lock
    while len(level._calls) < 1:
        time.sleep(0.01)

    def child() -> None:
        assert level.get_many([b"a"]) == [b"1"]
        level.put_many([(b"c", b"x" * BIG)])
        level.sync()
        level.close()
        os._exit(0)

    proc = multiprocessing.get_context("fork").Process(target=child)
    try:
        proc.start()
        proc.join(120)                               # (a bound on a hang, not a timing)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
        assert proc.exitcode == 0
    finally:
        release.set()
        for t in threads:
            t.join()
    assert level.get_many([b"c"]) == [b"x" * BIG]
    level.close()
