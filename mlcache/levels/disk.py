"""The disk level: a diskcache directory, local and durable, shared by the processes of a host.

diskcache is used for its storage (SQLite in WAL mode, large values in files, safe across
processes and threads) but *not* for its eviction: its default, 'least-recently-stored' with a
1 GB ``size_limit``, silently drops entries, and a level may only let an entry go after the level
below holds it. So the cache runs with ``eviction_policy='none'`` and this module does the byte
accounting itself:

* every value is stored as raw bytes, and its length is recorded in diskcache's ``size`` column
  (a small ``Disk`` subclass; stock diskcache records 0 for values kept inside SQLite), so the
  ``size`` total that diskcache's own triggers maintain in its ``Settings`` table is exactly the
  number of value bytes stored — transactional and the same for every process;
* when ``max_bytes`` is set, reads stamp ``access_time`` (one UPDATE per batch and shard) and
  victims are chosen least-recently-accessed first, across shards;
* a full level that may evict removes its victims and *returns* them from ``put_many``; the store
  of record (``may_evict = False``) raises :class:`~mlcache.errors.CapacityError` before
  changing anything, unless it is ``lossy``.

Every batch call runs in one SQLite transaction per shard touched (``Cache.transact``), with one
statement per batch where diskcache's per-key calls would cost a statement or two per key.
"""
from __future__ import annotations

import contextlib
import errno
import heapq
import os
import sqlite3
import threading
import time
import weakref
from typing import Any, Iterator, Sequence

import diskcache
from diskcache.core import DBNAME, MODE_RAW, UNKNOWN

from ..config import DiskConfig
from ..errors import CacheError, CapacityError, ConfigError, IntegrityError, LevelUnavailableError
from ._fit import batch_delta, capacity_error, plan_fit
from .base import Victims

__all__ = ["DiskLevel"]

_CHUNK = 500          # bound on SQL variables per statement
_PAGE = 256           # rows per page when walking eviction candidates or scanning
_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
# Value files a shard may hold for sync() before a write syncs them itself: the set of their
# paths (about 160 bytes each) grew without bound in a process that never called sync().
_UNSYNCED_LIMIT = 1024

# One statement per batch instead of diskcache's SELECT + UPDATE/INSERT per key (about ten times
# fewer microseconds per key). It writes diskcache's own table exactly as ``Cache.set`` would, so
# diskcache's triggers keep the count and size totals. A value large enough for a file of its
# own is written to its file first (``Disk.store``) and its row names the file; the file it
# replaces is removed only after the commit (``Cache.set`` removed it at once, inside the batch's
# transaction, so a batch that failed later rolled back to a row whose file was gone).
# (NULLs are written in the SQL: binding None costs sqlite3 a failed adapter lookup each.)
_UPSERT_SQL = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size,"
    " mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, {filename}, {value})"
    " ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, expire_time = NULL,"
    " access_time = excluded.access_time, access_count = 0, tag = NULL, size = excluded.size,"
    " mode = excluded.mode, filename = excluded.filename, value = excluded.value"
)
_UPSERT = _UPSERT_SQL.format(filename="NULL", value="?")         # a value inside SQLite
_UPSERT_FILE = _UPSERT_SQL.format(filename="?", value="NULL")    # a value in a file


class _SizedDisk(diskcache.Disk):
    """Records the true length of every bytes value and remembers new value files for sync()."""

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        self.unsynced: set[str] = set()
        self._naming = threading.local()

    def filename(self, key: Any = UNKNOWN, value: Any = UNKNOWN) -> tuple[str, str]:
        name, full_path = super().filename(key, value)
        self._naming.last = full_path
        return name, full_path

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        self._naming.last = None
        try:
            size, mode, filename, db_value = super().store(value, read, key=key)
        except BaseException:
            # a value file cut short (a full disk) would stay behind, named by no row
            if self._naming.last is not None:
                with contextlib.suppress(OSError):
                    os.remove(self._naming.last)
            raise
        if type(value) is bytes:
            size = len(value)
        if filename is not None:
            self.unsynced.add(os.path.join(self._directory, filename))
        return size, mode, filename, db_value


class _Shard(diskcache.Cache):
    """A diskcache ``Cache`` whose ``close()`` closes the connections of every thread.

    diskcache opens one SQLite connection per thread, kept in a ``threading.local``, and its
    ``close()`` closes the calling thread's only: the connections (and the database, WAL and
    shared-memory files they hold open) of the write-back writer or of Spark task threads
    outlived the level. Here ``_con``, through which diskcache reaches SQLite, also records each
    connection, opened without sqlite3's same-thread check so that ``close()`` may close it from
    any thread. A connection is still used by its own thread only; :class:`DiskLevel` closes
    them when no call is in progress. ``tests/test_disk_level.py`` counts the open files to
    catch a diskcache that would open connections some other way.
    """

    def __init__(self, directory: str, *args: Any, **kwargs: Any) -> None:
        self._cons: dict[threading.Thread, sqlite3.Connection] = {}
        self._cons_lock = threading.Lock()
        self._lock_wait = float(kwargs.get("timeout", 60))
        super().__init__(directory, *args, **kwargs)

    @property
    def _sql_retry(self) -> Any:
        """diskcache's retry of a statement that found the database locked, for at most the
        level's ``timeout``: its own retries for 60 s whatever the timeout, and it runs every
        statement of opening a cache so (a manager opened while another process held the
        write lock waited 60 s with ``DiskConfig(timeout=0.2)``), and ``reset`` on top of the
        connection's own wait."""
        sql = self._sql
        limit = self._lock_wait

        def execute(statement: str, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            while True:
                try:
                    return sql(statement, *args, **kwargs)
                except sqlite3.OperationalError as exc:
                    if str(exc) != "database is locked" or time.monotonic() - start >= limit:
                        raise
                    time.sleep(0.001)

        return execute

    def _after_fork_in_child(self) -> None:
        """Set aside the connections of the parent's other threads, for good: one of them may
        have been inside SQLite, holding its connection's mutex, at the fork, and closing the
        connection (or freeing it) would wait for that mutex for ever. The forking thread's own
        is closed and reopened at its next use, as diskcache does."""
        me = threading.current_thread()
        _INHERITED.extend(c for t, c in self._cons.items() if t is not me)
        self._cons = {t: c for t, c in self._cons.items() if t is me}
        self._cons_lock = threading.Lock()

    @property
    def _con(self) -> sqlite3.Connection:
        local = self._local
        con = getattr(local, "con", None)
        if con is not None and local.pid == os.getpid():
            return con
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        pid = os.getpid()
        me = threading.current_thread()
        with self._cons_lock:
            # those of threads that ended, and this thread's own from before a fork
            stale = [self._cons.pop(t) for t in list(self._cons)
                     if t is me or not t.is_alive()]
        for old in stale:
            with contextlib.suppress(sqlite3.Error):
                old.close()
        con = sqlite3.connect(os.path.join(self._directory, DBNAME), timeout=self._timeout,
                              isolation_level=None, check_same_thread=False)
        with self._cons_lock:
            self._cons[me] = con
        self._local.pid = pid
        self._local.con = con
        # as diskcache does: the sqlite_* settings are pragmas of each connection
        try:
            settings = con.execute("SELECT key, value FROM Settings").fetchall()
        except sqlite3.OperationalError:
            settings = []    # a new database: __init__ creates the table
        for key, value in settings:
            if key.startswith("sqlite_"):
                self.reset(key, value, update=False)
        return con

    def close(self) -> None:
        with self._cons_lock:
            cons = list(self._cons.values())
            self._cons.clear()
        with contextlib.suppress(AttributeError):
            del self._local.con
        failure: sqlite3.Error | None = None
        for con in cons:
            try:
                con.close()
            except sqlite3.Error as exc:    # (close the others all the same)
                failure = failure or exc
        if failure is not None:
            raise failure


class _Fanout:
    """The shards of a level with ``shards > 1``, laid out as ``diskcache.FanoutCache`` lays
    them out (``000``, ``001``, ... and the same key hash), built of :class:`_Shard`."""

    def __init__(self, path: str, count: int, **kwargs: Any) -> None:
        self.directory = path
        shards: list[_Shard] = []
        try:
            for i in range(count):
                shards.append(_Shard(os.path.join(path, f"{i:03d}"), **kwargs))
        except BaseException:
            for shard in shards:    # (the shards opened before the failure kept connections)
                with contextlib.suppress(sqlite3.Error):
                    shard.close()
            raise
        self.shards = tuple(shards)

    def check(self, fix: bool = False, retry: bool = False) -> list:
        return [w for shard in self.shards for w in shard.check(fix, retry)]

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


def _fsync(path: str) -> bool:
    """fsync a file or a directory; False if it is gone (replaced or deleted since)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _file_id(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of ``path``, or None if there is no such file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _chunks(seq: Sequence[Any], n: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _make_private_dir(path: str) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)   # makedirs' mode is filtered through the umask


def _check_layout(path: str, shards: int) -> None:
    """Refuse a directory of the other layout (one cache vs shard subdirectories)."""
    entries = os.listdir(path)
    sharded = any(len(e) == 3 and e.isdigit() and os.path.isdir(os.path.join(path, e))
                  for e in entries)
    if (shards == 1 and sharded) or (shards > 1 and DBNAME in entries):
        raise ConfigError("disk.shards", f"{path} holds a disk level of "
                                         f"{'several shards' if sharded else 'shards=1'}; "
                                         f"open it with that shard count or use another path")


def _check_shard_count(shards: tuple[diskcache.Cache, ...], path: str) -> None:
    """The shard count is recorded in every shard's settings; a different count would hash
    keys to other shards and the data would seem to vanish."""
    for shard in shards:
        shard._sql("INSERT OR IGNORE INTO Settings VALUES ('mlcache_shards', ?)", (len(shards),))
        ((recorded,),) = shard._sql(
            "SELECT value FROM Settings WHERE key = 'mlcache_shards'").fetchall()
        if int(recorded) != len(shards):
            raise ConfigError("disk.shards", f"{path} holds a disk level of shards={recorded}; "
                                             f"open it with shards={recorded} or use another path")


# Every open level, for the child of a fork (below), and the SQLite connections a child
# inherited from its parent's other threads (see _Shard._after_fork_in_child).
_LEVELS: weakref.WeakSet[DiskLevel] = weakref.WeakSet()
_INHERITED: list[sqlite3.Connection] = []


class _ForkGate:
    """The SQLite write transactions of this process's disk levels, held back while it forks.

    SQLite keeps the locks of a process's connections in the process's memory, per database
    file. A thread in the middle of a write transaction at a fork (the write-back writer of
    a manager, say) leaves the child a lock table saying one of its connections holds the
    write lock, and that connection's thread does not exist there: every write of the child
    waited for it forever (diskcache retries a busy BEGIN IMMEDIATE without end), in 2 of 20
    forks made while a writer was busy. Before a fork, new transactions wait and the open ones
    are let finish (at most ``_FORK_WAIT`` seconds: one waiting on the forking thread could
    never finish); after it, both processes go on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.open: dict[int, int] = {}    # thread ident -> transactions it has open
        self.forking = False

    def enter(self) -> None:
        me = threading.get_ident()
        with self.lock:
            if self.forking:
                while self.forking and me not in self.open:
                    self.cond.wait()
            self.open[me] = self.open.get(me, 0) + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self.lock:
            n = self.open.pop(me) - 1
            if n:
                self.open[me] = n
            elif self.forking:
                self.cond.notify_all()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def before_fork(self) -> None:
        me = threading.get_ident()
        deadline = time.monotonic() + _FORK_WAIT
        with self.cond:
            self.forking = True
            while any(t != me for t in self.open):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)

    def after_fork_in_parent(self) -> None:
        with self.cond:
            self.forking = False
            self.cond.notify_all()

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        me = threading.get_ident()
        self.open = {t: n for t, n in self.open.items() if t == me}
        self.forking = False


_FORK_WAIT = 5.0
_GATE = _ForkGate()


def _after_fork_in_child() -> None:
    """Only the forking thread lives on in a child: the calls other threads had in progress
    will never return (close() waited for them forever), and a lock they held would never be
    released (a sync() or a first call in a new thread hung)."""
    _GATE.after_fork_in_child()
    for level in list(_LEVELS):
        level._calls = []
        level._idle = threading.Event()
        level._close_lock = threading.Lock()
        level._sync_lock = threading.Lock()
        for shard in level._shards:
            shard._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_GATE.before_fork, after_in_parent=_GATE.after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


class DiskLevel:
    """A byte level on diskcache (one ``Cache``, or shards laid out as ``FanoutCache``'s)."""

    shared = False

    def __init__(self, config: DiskConfig | None = None) -> None:
        self.config = config or DiskConfig()
        self.name = "disk"
        self.lossy = self.config.lossy
        self.may_evict = True
        self.max_bytes = self.config.max_bytes
        self.path = self.config.resolved_path()
        self._closed = False
        # One item per call in progress: close() waits for them to return before it closes the
        # connections they use. (append and pop are atomic: a counter without the two lock
        # acquisitions that added ~40% to _guard's instructions under callgrind.)
        self._calls: list[None] = []
        self._batch = threading.local()   # .stack: the transactions of this thread's batch
        self._close_lock = threading.Lock()
        self._idle = threading.Event()
        settings = dict(eviction_policy="none", cull_limit=0, statistics=0)
        with self._guard("open"):
            _make_private_dir(self.path)
            _check_layout(self.path, self.config.shards)
            self.cache: _Shard | _Fanout
            if self.config.shards > 1:
                self.cache = _Fanout(self.path, self.config.shards, timeout=self.config.timeout,
                                     disk=_SizedDisk, **settings)
                self._shards: tuple[_Shard, ...] = self.cache.shards
                self._hash = self._shards[0].disk.hash
            else:
                self.cache = _Shard(self.path, timeout=self.config.timeout, disk=_SizedDisk,
                                    **settings)
                self._shards = (self.cache,)
            try:
                _check_shard_count(self._shards, self.path)
            except ConfigError:
                self.cache.close()
                raise
            if self.max_bytes is not None:
                for shard in self._shards:
                    shard._sql("CREATE INDEX IF NOT EXISTS Cache_access_time"
                               " ON Cache (access_time)")
        # which database file each shard opened: sync() checks it is still the one at its path
        self._db_files = [_file_id(os.path.join(shard._directory, DBNAME))
                          for shard in self._shards]
        self._sync_lock = threading.Lock()
        _LEVELS.add(self)

    # -- plumbing --------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"DiskLevel(path={self.path!r}, shards={len(self._shards)}, "
                f"max_bytes={self.max_bytes})")

    def _shard_index(self, key: bytes) -> int:
        return self._hash(key) % len(self._shards) if len(self._shards) > 1 else 0

    def _group(self, keys: Sequence[bytes]) -> dict[int, list[bytes]]:
        groups: dict[int, list[bytes]] = {}
        for key in keys:
            groups.setdefault(self._shard_index(key), []).append(key)
        return groups

    @contextlib.contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        """Map storage failures to the error family, naming the level and the operation.

        A closed level refuses every call: diskcache would quietly reopen its connection. A call
        in progress holds close() back (it closes the connection the call is using).
        """
        calls = self._calls
        calls.append(None)     # before the test: close() sets _closed, then waits for calls
        if self._closed:
            calls.pop()
            self._idle.set()   # a close() may be waiting for this call to leave
            raise LevelUnavailableError(f"disk level at {self.path} is closed ({op})",
                                        level=self.name)
        try:
            yield
        except CacheError:
            raise
        except diskcache.Timeout as exc:
            raise LevelUnavailableError(
                f"disk level at {self.path}: {op} timed out waiting for the lock "
                f"({self.config.timeout}s)", level=self.name) from exc
        except sqlite3.OperationalError as exc:
            if "full" in str(exc):
                raise CapacityError(f"disk level at {self.path}: {op} failed, disk full: {exc}",
                                    level=self.name) from exc
            raise LevelUnavailableError(f"disk level at {self.path}: {op} failed: {exc}",
                                        level=self.name) from exc
        except sqlite3.DatabaseError as exc:
            raise LevelUnavailableError(f"disk level at {self.path}: {op} failed: {exc}",
                                        level=self.name) from exc
        except OSError as exc:
            if exc.errno in _FULL_ERRNOS:
                raise CapacityError(f"disk level at {self.path}: {op} failed, no space: {exc}",
                                    level=self.name) from exc
            raise LevelUnavailableError(f"disk level at {self.path}: {op} failed: {exc}",
                                        level=self.name) from exc
        finally:
            calls.pop()
            if self._closed:
                self._idle.set()

    @contextlib.contextmanager
    def _locked(self, indexes: Sequence[int]
                ) -> Iterator[tuple[list[tuple[int, str]], list[tuple[int, str]]]]:
        """One transaction on each shard in ``indexes``, taken in index order (no deadlock).

        Yields two lists of ``(shard, filename)``: value files the batch made obsolete, removed
        only after every transaction committed (a rollback still needs them), and value files
        the batch wrote, removed if it fails unless a committed row names them.
        """
        obsolete: list[tuple[int, str]] = []
        created: list[tuple[int, str]] = []
        gate = _GATE
        gate.enter()
        local = self._batch
        try:
            stale = getattr(local, "stack", None)
            if stale is not None:
                # The last batch of this thread was interrupted in the with statement's exit,
                # before this generator resumed: its transactions are still open, and the
                # collector would have rolled them back later, in the middle of another
                # batch of this thread (diskcache's rollback takes any transaction of the
                # thread for its own). Rolled back now: that batch raised.
                local.stack = None
                with contextlib.suppress(Exception):
                    stale.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
            self._end_dangling(indexes)   # (one an interrupt left open, even in the cleanup)
            with contextlib.ExitStack() as stack:
                local.stack = stack
                for i in sorted(indexes):
                    cm = self._shards[i].transact()
                    # its exit pushed before it runs BEGIN: interrupted in enter_context between
                    # the two, it stayed open outside the stack (and see ``stale`` above)
                    stack.push(cm.__exit__)
                    cm.__enter__()
                yield obsolete, created
            local.stack = None
        except BaseException:
            local.stack = None
            self._end_dangling(indexes)
            self._drop_unreferenced(created)
            raise
        finally:
            gate.leave()
        for i, filename in obsolete:
            self._shards[i].disk.remove(filename)

    def _end_dangling(self, indexes: Sequence[int]) -> None:
        """Roll back a transaction a failed batch left open: diskcache runs BEGIN IMMEDIATE
        before its context starts, so a KeyboardInterrupt landing between the two left this
        thread's connection in a transaction nobody ends, holding the database's write lock
        (every other thread's and process's write then waited for it: the writer thread for
        ever) and taking this thread's later writes into it, never committed (not durable,
        unseen by others). Batches do not nest, so a transaction still open here is such a
        one (a failure inside the batch was rolled back by diskcache)."""
        me = threading.get_ident()
        for i in indexes:
            shard = self._shards[i]
            con = getattr(shard._local, "con", None)
            if con is None or not con.in_transaction or shard._txn_id not in (None, me):
                continue
            shard._txn_id = None
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")

    def _drop_unreferenced(self, files: list[tuple[int, str]]) -> None:
        """Remove the value files of a failed batch that no row names (a shard whose commit
        went through before another's failed keeps its files)."""
        for i, filename in files:
            shard = self._shards[i]
            try:
                named = shard._sql("SELECT 1 FROM Cache WHERE filename = ? LIMIT 1",
                                   (filename,)).fetchone()
            except sqlite3.Error:
                continue    # cannot tell: a stray file is better than a lost value
            if named is None:
                shard.disk.remove(filename)

    def _files(self, index: int, keys: Sequence[bytes]) -> list[tuple[int, str]]:
        shard = self._shards[index]
        found: list[tuple[int, str]] = []
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            rows = shard._sql(f"SELECT filename FROM Cache WHERE raw = 1 AND key IN ({marks})"
                              " AND filename IS NOT NULL", [sqlite3.Binary(k) for k in chunk])
            found.extend((index, name) for (name,) in rows)
        return found

    def _write(self, index: int, items: Sequence[tuple[bytes, bytes]],
               batch: tuple[list[tuple[int, str]], list[tuple[int, str]]]) -> None:
        """Store ``items`` in shard ``index``; call inside ``_locked`` with what it yields."""
        obsolete, created = batch
        shard = self._shards[index]
        limit = shard.disk.min_file_size
        obsolete.extend(self._files(index, [k for k, _ in items]))
        now = time.time()
        small = [(sqlite3.Binary(k), now, now, len(v), MODE_RAW, sqlite3.Binary(v))
                 for k, v in items if len(v) < limit]
        if small:
            shard._con.executemany(_UPSERT, small)
        if len(small) < len(items):
            rows = []
            for k, v in items:
                if len(v) >= limit:
                    size, mode, filename, _ = shard.disk.store(v, False, key=k)
                    created.append((index, filename))
                    rows.append((sqlite3.Binary(k), now, now, size, mode, filename))
            shard._con.executemany(_UPSERT_FILE, rows)

    def _remove(self, index: int, keys: Sequence[bytes],
                batch: tuple[list[tuple[int, str]], list[tuple[int, str]]]) -> None:
        """Delete ``keys`` from shard ``index``; call inside ``_locked`` with what it yields."""
        batch[0].extend(self._files(index, keys))
        shard = self._shards[index]
        for chunk in _chunks(keys):
            marks = ",".join("?" * len(chunk))
            shard._sql(f"DELETE FROM Cache WHERE raw = 1 AND key IN ({marks})",
                       [sqlite3.Binary(k) for k in chunk])

    # -- reads -----------------------------------------------------------------------------

    def _fetch_rows(self, shard: diskcache.Cache, keys: Sequence[bytes],
                    lost_is_error: bool = True) -> dict[bytes, bytes]:
        """The stored values of ``keys``. A value file that is gone while its row still names it
        raises :class:`IntegrityError` (unless ``lost_is_error`` is false: a victim being
        evicted); it was reported as a miss, and the key's value silently started afresh."""
        found: dict[bytes, bytes] = {}
        for chunk in _chunks(keys):
            if len(chunk) == 1:
                rows = shard._sql("SELECT key, mode, filename, value FROM Cache WHERE key = ?"
                                  " AND raw = 1", (sqlite3.Binary(chunk[0]),)).fetchall()
            else:
                marks = ",".join("?" * len(chunk))
                rows = shard._sql("SELECT key, mode, filename, value FROM Cache WHERE raw = 1"
                                  f" AND key IN ({marks})",
                                  [sqlite3.Binary(k) for k in chunk]).fetchall()
            for key, mode, filename, value in rows:
                try:
                    data = shard.disk.fetch(mode, filename, value, False)
                except FileNotFoundError:
                    # Replaced by another process between the SELECT and the read, or lost.
                    data = shard.get(bytes(key), default=None, retry=True)
                    if data is None:
                        if lost_is_error and shard._sql("SELECT 1 FROM Cache WHERE filename = ?",
                                                        (filename,)).fetchone():
                            raise IntegrityError(
                                f"disk level at {self.path}: the value file {filename} of key "
                                f"{bytes(key)!r} is missing (removed behind the level's back?); "
                                f"delete or overwrite the key", level=self.name,
                                key=bytes(key))
                        continue
                found[bytes(key)] = data
        return found

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if type(keys) is not list:
            keys = list(keys)    # iterated twice below (an iterator came back empty)
        if not keys:
            return []
        found: dict[bytes, bytes] = {}
        with self._guard("get"):
            for index, group in self._group(keys).items():
                shard = self._shards[index]
                hits = self._fetch_rows(shard, group)
                found.update(hits)
                if hits and self.max_bytes is not None:
                    self._touch(shard, list(hits))
        return [found.get(k) for k in keys]

    def _touch(self, shard: diskcache.Cache, keys: list[bytes]) -> None:
        now = time.time()
        try:
            for chunk in _chunks(keys):
                marks = ",".join("?" * len(chunk))
                shard._sql(f"UPDATE Cache SET access_time = ? WHERE raw = 1 AND key IN ({marks})",
                           [now, *(sqlite3.Binary(k) for k in chunk)])
        except sqlite3.OperationalError:
            # Recency is advice for victim choice; a busy database must not fail a read.
            pass

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    # -- writes ----------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> Victims:
        batch: dict[bytes, bytes] = {}
        for key, value in items:
            batch[bytes(key)] = value if type(value) is bytes else bytes(value)
        if not batch:
            return []
        with self._guard("put"):
            victims: Victims = []
            if self.max_bytes is None:
                groups = self._group(list(batch))
                with self._locked(list(groups)) as files:
                    for index, group in groups.items():
                        self._write(index, [(k, batch[k]) for k in group], files)
            else:
                with self._locked(range(len(self._shards))) as files:
                    victims = self._put_bounded(batch, self.max_bytes, files)
            if files[1]:
                self._sync_backlog()
        return victims

    def _put_bounded(self, batch: dict[bytes, bytes], limit: int,
                     files: tuple[list[tuple[int, str]], list[tuple[int, str]]]) -> Victims:
        used = self._used()
        new = {k: len(v) for k, v in batch.items()}
        old = self._sizes(list(batch))
        if not (self.may_evict or self.lossy):
            adding = batch_delta(new, old)
            if used + adding > limit:
                raise capacity_error(self.name, used, adding, limit)
        plan = plan_fit(used, limit, new, old, self._candidates())
        victims: Victims = []
        if plan.evict:
            values = self._read_locked(plan.evict)
            victims += [(k, values[k]) for k in plan.evict if k in values]
        passed = set(plan.passthrough)
        victims += [(k, batch[k]) for k in plan.passthrough]
        gone = plan.evict + [k for k in plan.passthrough if k in old]
        for index, group in self._group(gone).items():
            self._remove(index, group, files)
        staying = [k for k in batch if k not in passed]
        for index, group in self._group(staying).items():
            self._write(index, [(k, batch[k]) for k in group], files)
        return victims if self.may_evict else []

    def _read_locked(self, keys: list[bytes]) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for index, group in self._group(keys).items():
            out.update(self._fetch_rows(self._shards[index], group, lost_is_error=False))
        return out

    def _sizes(self, keys: list[bytes]) -> dict[bytes, int]:
        sizes: dict[bytes, int] = {}
        for index, group in self._group(keys).items():
            shard = self._shards[index]
            for chunk in _chunks(group):
                marks = ",".join("?" * len(chunk))
                rows = shard._sql(f"SELECT key, size FROM Cache WHERE raw = 1 AND key IN ({marks})",
                                  [sqlite3.Binary(k) for k in chunk]).fetchall()
                sizes.update((bytes(k), int(s)) for k, s in rows)
        return sizes

    def _candidates(self) -> Iterator[tuple[bytes, int]]:
        """Stored entries, least recently accessed first, merged over the shards."""

        def walk(shard: diskcache.Cache) -> Iterator[tuple[float, int, bytes, int]]:
            last: tuple[float, int] = (float("-inf"), -1)
            while True:
                rows = shard._sql(
                    "SELECT access_time, rowid, key, size FROM Cache WHERE raw = 1 AND "
                    "(access_time, rowid) > (?, ?) ORDER BY access_time, rowid LIMIT ?",
                    (*last, _PAGE)).fetchall()
                for t, rowid, key, size in rows:
                    yield t, rowid, bytes(key), int(size)
                if len(rows) < _PAGE:
                    return
                last = (rows[-1][0], rows[-1][1])

        for _, _, key, size in heapq.merge(*(walk(s) for s in self._shards)):
            yield key, size

    def put(self, key: bytes, value: bytes) -> Victims:
        return self.put_many([(key, value)])

    def delete_many(self, keys: Sequence[bytes]) -> None:
        if not keys:
            return
        with self._guard("delete"):
            groups = self._group(list(dict.fromkeys(bytes(k) for k in keys)))
            with self._locked(list(groups)) as files:
                for index, group in groups.items():
                    self._remove(index, group, files)

    def delete(self, key: bytes) -> None:
        self.delete_many([key])

    # -- listing and accounting ------------------------------------------------------------

    def scan(self, prefix: bytes = b"") -> Iterator[bytes]:
        """Every stored key starting with ``prefix`` (shard by shard, each in key order)."""
        prefix = bytes(prefix)
        end = _prefix_end(prefix)
        for shard in self._shards:
            low, inclusive = prefix, True
            while True:
                with self._guard("scan"):
                    cond = "key >= ?" if inclusive else "key > ?"
                    args: list[Any] = [sqlite3.Binary(low)]
                    if end is not None:
                        cond += " AND key < ?"
                        args.append(sqlite3.Binary(end))
                    rows = shard._sql(
                        f"SELECT key FROM Cache WHERE raw = 1 AND {cond} ORDER BY key LIMIT ?",
                        (*args, _PAGE)).fetchall()
                for (key,) in rows:
                    if isinstance(key, (bytes, memoryview)):
                        yield bytes(key)
                if len(rows) < _PAGE:
                    break
                low, inclusive = bytes(rows[-1][0]), False

    def _used(self) -> int:
        total = 0
        for shard in self._shards:
            ((value,),) = shard._sql("SELECT value FROM Settings WHERE key = 'size'").fetchall()
            total += int(value)
        return total

    def used_bytes(self) -> int:
        """Bytes of values stored (all processes), from diskcache's transactional counter."""
        with self._guard("used_bytes"):
            return self._used()

    def __len__(self) -> int:
        with self._guard("len"):
            return sum(int(s._sql("SELECT value FROM Settings WHERE key = 'count'").fetchone()[0])
                       for s in self._shards)

    def sync(self) -> None:
        """Make every committed write durable: fsync new value files, checkpoint the WAL."""
        with self._guard("sync"), self._sync_lock:
            self._check_files()
            for shard in self._shards:
                self._sync_files(shard)
                with _GATE.transaction():   # (FULL takes the write lock)
                    shard._sql("PRAGMA wal_checkpoint(FULL)").fetchall()

    def _check_files(self) -> None:
        """Raise if a shard's database file was removed or replaced since the level opened it
        (a temp-directory cleaner, ``rm -r`` of the directory): SQLite keeps writing into the
        open file, which no path names any more, so every write since would be lost with the
        process, and a checkpoint must not report it durable."""
        for shard, opened in zip(self._shards, self._db_files):
            path = os.path.join(shard._directory, DBNAME)
            if _file_id(path) != opened:
                raise LevelUnavailableError(
                    f"disk level at {self.path}: its database file {path} was removed or "
                    f"replaced since the level opened it: what was written to it since is in "
                    f"no file and is lost when this process ends", level=self.name)

    def _sync_files(self, shard: diskcache.Cache) -> None:
        """fsync the value files written since the last call and their directories; hold
        ``_sync_lock``. After a failure every file taken stays pending for the next call."""
        pending = shard.disk.unsynced
        root = shard.disk._directory
        taken: list[str] = []
        try:
            dirs: set[str] = set()
            while pending:
                path = pending.pop()
                taken.append(path)
                if _fsync(path):
                    dirs.add(os.path.dirname(path))
            # A new file is reachable after a crash only once its directory entry is on disk
            # too, and so on up for subdirectories diskcache made for it.
            while dirs:
                for d in dirs:
                    _fsync(d)
                dirs = {os.path.dirname(d) for d in dirs
                        if d != root and os.path.dirname(d).startswith(root)}
        except BaseException:
            pending.update(taken)    # (they were lost: the next sync() reported success)
            raise

    def _sync_backlog(self) -> None:
        """Sync the value files of a shard holding more than ``_UNSYNCED_LIMIT`` of them, so
        the set stays bounded without sync(); what sync() promises is unchanged (a file synced
        early is durable earlier). A failure leaves the files pending: sync() reports it."""
        for shard in self._shards:
            if len(shard.disk.unsynced) > _UNSYNCED_LIMIT and self._sync_lock.acquire(False):
                try:
                    self._sync_files(shard)
                except OSError:
                    pass
                finally:
                    self._sync_lock.release()

    def close(self) -> None:
        """Close the connections of every thread that used the level, once the calls in
        progress have returned; any later call, from any thread, raises
        :class:`~mlcache.errors.LevelUnavailableError`."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        _LEVELS.discard(self)
        while True:
            self._idle.clear()
            if not self._calls:
                break
            self._idle.wait()
        try:
            self.cache.close()
        except sqlite3.Error as exc:
            raise LevelUnavailableError(f"disk level at {self.path}: close failed: {exc}",
                                        level=self.name) from exc
