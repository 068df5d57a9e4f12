"""The Redis level: redis-py, pipelined, namespaced, shared between processes.

Every key lives under ``config.prefix + ":"`` followed by the canonical byte key, so several
managers (or test runs) share one server without seeing each other. Batches are one round trip
where Redis allows it: ``MGET`` for reads, ``MSET`` for writes, ``UNLINK`` for deletes, each
chunked and pipelined.

Optional byte bound (``max_bytes``). Redis is shared, so the accounting lives in Redis too, beside
the data but outside its key space (``prefix + "\\x00bytes"``: a counter of value bytes;
``prefix + "\\x00lru"``: a sorted set of keys by last access time). A bounded write is an
optimistic transaction: ``WATCH`` the counter, read the sizes the batch replaces, plan the victims
(:mod:`mlcache.levels._fit`, least recently accessed first), then ``MULTI``/``EXEC`` the whole
change; a concurrent writer touches the counter, so the plan is redone instead of corrupting
the bound. Victims are returned to the manager, or ``CapacityError`` is raised before anything
changes when this level is the store of record. Above another level (``hold_victims``, set by
the write-back) the transaction removes no victim: they stay stored, counted and leased
(``prefix + "\x00held"``: key -> lease expiry; no other writer evicts them) until ``release``,
after the level below holds them, removes those still unchanged; until then the level is over
``max_bytes`` by at most the held victims' size. Another process reading a victim meanwhile
finds it here, never the older copy below. The last level (nothing below) removes its
victims in the transaction. An unbounded level keeps no accounting and pays nothing for it. A Lua script would do the same in one round trip but would keep the eviction
arithmetic in a second language; the batch sizes the manager uses make the extra round trips cheap.

Listing (``scan(prefix)``: a namespace's or a structure's keys) reads the listing index, a sorted
set beside the data (``prefix + "\x00keys"``; member ``b"k" + key``, score 0): the members
from ``prefix`` on in lexicographic order (``ZRANGEBYLEX``), a page of 1,000 per script call,
each checked to be stored (a member whose key is gone is skipped and removed). O(log N + the
keys listed), where a ``SCAN MATCH`` was O(every key in the database): iterating a set of 10
took 15 ms beside 10,000 others. Every write keeps it in the same transaction as the data (the
unbounded level's MSET and UNLINK are sent between ``MULTI`` and ``EXEC``; the bounded level's
transaction and the release script add and remove the members too), so no reader, writer or
listing ever sees a key stored that the index misses; an operation cut short applies nothing.
Data stored before the index existed (an older version, or the index lost) is added by one
``SCAN`` of the level the first time it is listed, then the empty member (the sentinel) says
the index is complete; a key written meanwhile is added by its writer. A process of a version
without the index writing to the same prefix after that is not supported: its new keys would
not be listed. The cost: ~8 us of Python per write of 32 keys (a ZADD packed with the MSET)
and ~130 bytes of Redis memory a key (the bounded level's LRU set is the same again).

Connections are made lazily and rebuilt when ``os.getpid()`` changes, so a level created before a
fork (a Spark Python worker) never shares a socket with its parent. Connection failures and
timeouts are retried ``config.retries`` times, quickly, then raised as
:class:`~mlcache.errors.LevelUnavailableError` (retryable): the manager keeps dirty entries and
retries later, it never drops them.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Sequence, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..codec import Encoded
from ..config import RedisConfig, redacted_url
from ..errors import CacheError, CapacityError, LevelUnavailableError
from ._fit import batch_delta, capacity_error, plan_fit
from ._resp import PendingValues, read_replies, request_values
from .base import HeldVictims, Victims

__all__ = ["RedisLevel", "glob_escape"]

T = TypeVar("T")
_CHUNK = 1000
_PAGE = 128
_USED_TTL = 10.0   # seconds an unbounded level's byte count is reused by stats()
_READ_SIZE = 1 << 20   # bytes asked of the socket per read (redis-py's default: 64 KiB)
# a piece of a value this long is sent as it is, not joined to its header (a write-back's
# pages, ~10 KB in bench events, are not copied; an iovec entry costs the kernel less)
_DIRECT = 4 * 1024
_IOV = 512             # buffers per sendmsg (the kernel takes at most IOV_MAX, 1024 on Linux)
_GLOB = re.compile(rb"([*?\[\]\\])")
_RELEASE_CHUNK = 512   # held victims released per script call
# A held victim is leased (a sorted set, key -> expiry) until released: no other process
# evicts it meanwhile, so one process at a time hands a key down. Long enough for a write to
# the level below that waits for its lock (DiskConfig.timeout, 60 s by default) and is
# retried; a holder that dies leaves keys stored, counted, and out of eviction this long.
_LEASE = 300.0
# Gives up the lease of each held victim (KEYS[4:]) and, when ARGV[1] is "1", removes each one
# whose value is still the one handed down (ARGV[4:], beside its key), from the LRU set
# (KEYS[2]) and the listing index (ARGV[2]; ARGV[3]: the length of the data keys' prefix) too,
# taking its bytes off the counter (KEYS[1]), atomically: a value another process wrote
# meanwhile stays. Value equality, not a version: if the level holds the very bytes the level
# below now holds, removing them changes no read's answer.
_RELEASE = """
local gone, freed = {}, 0
if ARGV[1] == '1' then
  for i = 4, #KEYS do
    local v = ARGV[i]
    if redis.call('GET', KEYS[i]) == v then
      gone[#gone + 1] = KEYS[i]
      freed = freed + #v
    end
  end
end
redis.call('ZREM', KEYS[3], unpack(KEYS, 4))
if #gone > 0 then
  redis.call('UNLINK', unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
  redis.call('DECRBY', KEYS[1], freed)
  local plen = tonumber(ARGV[3])
  for i, k in ipairs(gone) do gone[i] = 'k' .. string.sub(k, plen + 1) end
  redis.call('ZREM', ARGV[2], unpack(gone))
end
return freed
"""
_RELEASE_SHA = hashlib.sha1(_RELEASE.encode()).hexdigest()
# One page of the listing index (KEYS[1], see "Listing" in the module docstring): {next start,
# the members from ARGV[1] on (a ZRANGEBYLEX start) starting with ARGV[2] whose key (ARGV[3] ..
# the member's bytes after its first) is stored}; the next start is "" after the last page.
# Members whose key is gone are removed on the way. {"-"} when the index is not built (no
# sentinel, the empty member).
_LIST = """
if not redis.call('ZSCORE', KEYS[1], '') then return {'-'} end
local page = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], '+', 'LIMIT', 0, 1000)
local out, dead, n = {''}, {}, #ARGV[2]
if #page == 1000 then out[1] = '(' .. page[1000] end
for _, m in ipairs(page) do
  if string.sub(m, 1, n) ~= ARGV[2] then
    out[1] = ''
    break
  end
  if redis.call('EXISTS', ARGV[3] .. string.sub(m, 2)) == 1 then
    out[#out + 1] = m
  else
    dead[#dead + 1] = m
  end
end
if #dead > 0 then redis.call('ZREM', KEYS[1], unpack(dead)) end
return out
"""
_LIST_SHA = hashlib.sha1(_LIST.encode()).hexdigest()
_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_SIMPLE = (b"+", b":", b"-", b"*", b"$")   # the first byte of a write's replies


def glob_escape(data: bytes) -> bytes:
    """Escape the bytes that are special in a Redis ``MATCH`` pattern."""
    return _GLOB.sub(rb"\\\1", data)


def _chunks(seq: Sequence[Any], n: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def _mset_packed(pairs: Sequence[tuple[bytes, bytes | Encoded]]) -> list[Any]:
    """``MSET`` of ``pairs`` in the Redis protocol, as buffers to send one after another:
    the small pieces joined, every piece of at least ``_DIRECT`` bytes (the payloads of an
    :class:`~mlcache.codec.Encoded`) a buffer of its own, as it is. redis-py packs a large
    argument the same way (a separate buffer, not copied); a value in pieces is one argument
    it cannot express."""
    out: list[Any] = []
    small: list[Any] = [b"*%d\r\n$4\r\nMSET\r\n" % (2 * len(pairs) + 1)]
    for key, value in pairs:
        small.append(b"$%d\r\n%b\r\n$%d\r\n" % (len(key), key, len(value)))
        for part in (value.parts if type(value) is Encoded else (value,)):
            if len(part) >= _DIRECT:
                out.append(b"".join(small))
                out.append(part)
                small = []
            else:
                small.append(part)
        small.append(b"\r\n")
    out.append(b"".join(small))
    return out


def _sendmsg_all(sock: socket.socket, buffers: list[Any]) -> None:
    """Send every byte of ``buffers`` in order with gathering writes, resuming after a
    partial send (a socket with a timeout sends what fits, then waits for room)."""
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        sent = sock.sendmsg(views[:_IOV])
        done = 0
        while done < len(views) and sent >= views[done].nbytes:
            sent -= views[done].nbytes
            done += 1
        del views[:done]
        if sent:
            views[0] = views[0][sent:]


def _send_all(conn: Any, buffers: list[Any]) -> None:
    """``conn.send_packed_command(buffers)`` with one ``sendmsg`` (a gathering write) per up
    to ``_IOV`` buffers on a plain socket instead of one ``sendall`` per buffer.

    Each socket call releases the GIL and takes it back, and a writer thread taking it back
    waits for the thread running Python to let go (up to the switch interval): three calls
    per large value (header, payload, trailer) made the writer thread's write of 1 MB take
    twice as long as the same write on the main thread. TLS sockets have no ``sendmsg``:
    redis-py sends those."""
    sock = getattr(conn, "_sock", None)
    if type(sock) is not socket.socket or len(buffers) < 2:
        conn.send_packed_command(buffers)
        return
    conn.check_health()
    try:
        _sendmsg_all(sock, buffers)
    except socket.timeout:
        conn.disconnect()
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc
    except BaseException:
        conn.disconnect()   # a command half sent: the connection is out of step
        raise


def _send_packed(client: redis.Redis, buffers: list[Any], replies: int,
                 own: Any = None) -> None:
    """Send commands already in the Redis protocol on one pooled connection (pipelined) and
    read their ``replies``; a command's error is raised once every reply has been read, so
    the connection stays in step. A broken connection is dropped (redis-py's own
    ``send_packed_command`` and ``read_response`` disconnect on socket errors), and the
    caller's retry takes a fresh one. ``own``: a connection of the calling thread's own (see
    ``RedisLevel.hold_connection``), used instead of one from the pool; dropped, it connects
    again on its next send."""
    if own is not None:
        _send_on(own, buffers, replies)
        return
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        _send_on(conn, buffers, replies)
    finally:
        pool.release(conn)


def _send_on(conn: Any, buffers: list[Any], replies: int) -> None:
    error: Exception | None = None
    try:
        _send_all(conn, buffers)
        sock = getattr(conn, "_sock", None)
        if type(sock) is socket.socket and sock.recv(1, socket.MSG_PEEK) in _SIMPLE:
            # read here, not by redis-py (see _resp.read_replies): a plain socket, and the
            # first reply one a write has (a RESP3 push first: redis-py's to read)
            try:
                error = read_replies(sock, replies, conn._parser.parse_error)
            except TimeoutError:
                raise redis.TimeoutError("Timeout reading from socket") from None
            except (ValueError, IndexError, redis.InvalidResponse) as exc:
                raise redis.ConnectionError(f"unexpected reply to a write: {exc}") from exc
            except OSError as exc:
                raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
            replies = 0
        for _ in range(replies):
            try:
                reply = conn.read_response()
            except redis.ResponseError as exc:
                error = error or exc
            else:
                if type(reply) is list:   # an EXEC's: the errors of its commands are in it
                    error = error or next((r for r in reply if isinstance(r, Exception)), None)
    except BaseException:
        conn.disconnect()
        raise
    if error is not None:
        raise error


def _zadd_packed(key: bytes, keys: Sequence[bytes]) -> bytes:
    """``ZADD key 0 k<key>...`` of ``keys`` (the listing index, see ``RedisLevel.scan``) in
    the Redis protocol."""
    return b"*%d\r\n$4\r\nZADD\r\n$%d\r\n%b\r\n%b" % (
        2 * len(keys) + 2, len(key), key,
        b"".join([b"$1\r\n0\r\n$%d\r\nk%b\r\n" % (len(k) + 1, k) for k in keys]))


def _zrem_packed(key: bytes, keys: Sequence[bytes]) -> bytes:
    """``ZREM key k<key>...`` of ``keys`` in the Redis protocol."""
    return b"*%d\r\n$4\r\nZREM\r\n$%d\r\n%b\r\n%b" % (
        len(keys) + 2, len(key), key,
        b"".join([b"$%d\r\nk%b\r\n" % (len(k) + 1, k) for k in keys]))


def _unlink_packed(keys: Sequence[bytes]) -> bytes:
    """``UNLINK`` of ``keys`` in the Redis protocol."""
    return b"*%d\r\n$6\r\nUNLINK\r\n%b" % (
        len(keys) + 1, b"".join([b"$%d\r\n%b\r\n" % (len(k), k) for k in keys]))


def _evalsha_packed(keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    """``EVALSHA`` of the release script over ``keys`` and ``args`` in the Redis protocol."""
    n = b"%d" % len(keys)
    return b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%b\r\n$%d\r\n%b\r\n%b" % (
        len(keys) + len(args) + 3, _RELEASE_SHA.encode(), len(n), n,
        b"".join([b"$%d\r\n%b\r\n" % (len(a), a) for a in (*keys, *args)]))


def _mget_packed(keys: Sequence[bytes]) -> bytes:
    """``MGET`` of ``keys`` in the Redis protocol: one ``%`` format per key and a join (redis-py's
    ``pack_command`` checks, encodes and measures each argument in Python: ~0.4 us a key,
    this ~0.1, measured on MGETs of 100)."""
    return b"*%d\r\n$4\r\nMGET\r\n%b" % (
        len(keys) + 1, b"".join([b"$%d\r\n%b\r\n" % (len(k), k) for k in keys]))


def _raise_if_connection_lost(exc: redis.WatchError) -> None:
    """redis-py raises ``WatchError`` both when a watched key changed (plan again) and when
    the connection failed while watching (``__context__``: the ConnectionError or
    TimeoutError), EXEC's reply lost included: that one is raised as what it is, so the
    level's retry (which checks whether the transaction was applied) handles it. Planned
    again at once, an applied plan's victims were lost, and a connection the server keeps
    closing (a value over its ``proto-max-bulk-len``) was retried in a busy loop forever."""
    lost = exc.__context__
    if isinstance(lost, (redis.ConnectionError, redis.TimeoutError, OSError)):
        raise lost


def _stop_server(server: Any, pid: int) -> None:
    """Stop an embedded server, in the process that started it only (a forked child that
    exits must not stop its parent's server)."""
    if os.getpid() == pid:
        server.cleanup()


class RedisLevel:
    """A byte level on a Redis server (``url="embedded"``: a private server for this level)."""

    shared = True
    # put_many takes values in pieces (mlcache.codec.Encoded) and sends them without joining
    accepts_pieces = True

    def __init__(self, config: RedisConfig | None = None) -> None:
        self.config = config or RedisConfig()
        self.name = "redis"
        self.lossy = self.config.lossy
        self.may_evict = True
        # set by hold_victims() (the write-back, on a level above another): victims stay
        # stored until release(), once the level below holds them
        self._holds = False
        self.max_bytes = self.config.max_bytes
        self.prefix = self.config.prefix.encode() + b":"
        self._meta = self.config.prefix.encode() + b"\x00"
        self._bytes_key = self._meta + b"bytes"
        self._lru_key = self._meta + b"lru"
        self._held_key = self._meta + b"held"     # leases of held victims (_LEASE)
        self._index = self._meta + b"keys"        # the listing index (scan)
        self._lock = threading.Lock()
        self._client: redis.Redis | None = None
        self._pid: int | None = None
        self._server: Any = None        # mlcache._redis_server.RedisServer for "embedded"
        self._server_pid: int | None = None
        self._server_stop: Any = None   # weakref.finalize stopping the server
        self._accounting_ready = False
        self._used_cache: tuple[float, int, float] | None = None   # (when, bytes, seconds taken)
        self._closed = False
        # the connections threads keep for their own writes (hold_connection), per thread:
        # (the client it was made for, the connection); all of them, to close with the level
        self._own = threading.local()
        self._owned: set[Any] = set()
        # (client, connection) of split reads (start_get_many), made on first use
        self._reader: tuple[Any, Any] | None = None

    @property
    def sends_as_is(self) -> int | None:
        """Values at least this long are written as they are, not copied into the command
        (the unbounded level's ``put_many``); None when the level copies them (bounded: its
        transaction goes through redis-py). The write-back sizes its writes by this."""
        return _DIRECT if self.max_bytes is None else None

    def __repr__(self) -> str:
        return (f"RedisLevel(url={redacted_url(self.config.url)!r}, prefix={self.config.prefix!r}, "
                f"max_bytes={self.max_bytes})")

    # -- connection ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL connected to (for ``"embedded"``, the private server's, started on demand)."""
        if self.config.url != "embedded":
            return self.config.url
        if self._server is None:
            from .._redis_server import RedisServer

            if self._closed:   # (an error message of a call racing with close())
                raise LevelUnavailableError("redis level is closed", level=self.name)
            server = self._server = RedisServer().start(watchdog=True)
            self._server_pid = os.getpid()
            # Stopped by close(), or at the latest when this process exits: the writer thread
            # keeps the level alive, so a manager never closed left its server running after
            # the process ended, for good, with its directory. A process killed (SIGTERM,
            # SIGKILL) runs no finalizer: the server's watchdog stops it then.
            self._server_stop = weakref.finalize(self, _stop_server, server, self._server_pid)
        return str(self._server.url)

    def _connect(self) -> redis.Redis:
        pid = os.getpid()
        client = self._client
        if client is not None and self._pid == pid:
            return client
        with self._lock:
            if self._closed:
                raise LevelUnavailableError("redis level is closed", level=self.name)
            if self._client is None or self._pid != pid:
                # After a fork the parent's sockets are dropped, not closed: closing them here
                # would shut down connections the parent is still using.
                cfg = self.config
                kwargs: dict[str, Any] = dict(
                    max_connections=cfg.max_connections,
                    timeout=cfg.socket_timeout or None,
                    socket_timeout=cfg.socket_timeout or None,
                    socket_connect_timeout=cfg.socket_timeout or None,
                    retry=Retry(NoBackoff(), 0),    # our own quick retries, see _run
                    # redis-py reads replies in 64 KiB socket reads by default, each copied
                    # into a buffer and out again: a 1 MB value took 16+ reads and ~0.5 ms
                    # more CPU than one 1 MiB read; small batched replies are a bit faster too
                    socket_read_size=_READ_SIZE,
                )
                url = self.url
                if url.startswith("rediss://"):
                    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
                        if getattr(cfg, name) is not None:
                            kwargs[name] = getattr(cfg, name)
                pool = redis.BlockingConnectionPool.from_url(url, **kwargs)
                self._client = redis.Redis(connection_pool=pool)
                self._pid = pid
                self._accounting_ready = False
            return self._client

    def hold_connection(self) -> None:
        """Give the calling thread a connection of its own for its writes (``put_many`` and
        ``delete_many`` of an unbounded level) until :meth:`release_connection`.

        For a write-back writer thread, which writes a batch every few milliseconds: each
        pool checkout polls the socket (a system call, so the thread gives up the GIL and
        must wait to take it back from the thread running Python) and runs redis-py's
        bookkeeping, about a quarter of the writer's CPU in ``mlcache bench events``. The
        connection is made beside the pool, not taken from it, so a pool of one connection
        is never emptied by a writer (the readers would wait for it forever)."""
        self._own.held = True

    def release_connection(self) -> None:
        """End :meth:`hold_connection` for the calling thread and close its connection."""
        own = self._own
        own.held = False
        held = getattr(own, "conn", None)
        own.conn = None
        if held is not None:
            with self._lock:
                self._owned.discard(held[1])
            held[1].disconnect()

    def _own_connection(self, client: redis.Redis) -> Any:
        """The calling thread's own connection for ``client``, made on first use, or None
        if the thread holds none."""
        own = self._own
        if not getattr(own, "held", False):
            return None
        held = getattr(own, "conn", None)
        if held is not None and held[0] is client:
            return held[1]
        conn = self._side_connection(client, held)
        own.conn = (client, conn)
        return conn

    def _side_connection(self, client: redis.Redis, held: tuple[Any, Any] | None) -> Any:
        """A connection for ``client`` made beside its pool and closed with the level,
        replacing ``held`` (the one made before, for an older client). On first use, or a new
        client after a fork: the parent's connection is dropped, not closed (the parent still
        uses its socket)."""
        pool = client.connection_pool
        conn = pool.connection_class(**pool.connection_kwargs)
        with self._lock:
            if self._closed:
                raise LevelUnavailableError("redis level is closed", level=self.name)
            if held is not None:
                self._owned.discard(held[1])
            self._owned.add(conn)
        return conn

    def _run(self, op: str, fn: Callable[[redis.Redis], T]) -> T:
        attempts = self.config.retries + 1
        for attempt in range(attempts):
            try:
                return fn(self._connect())
            except CacheError:
                raise
            except redis.AuthenticationError as exc:  # (a ConnectionError: never retried)
                raise _auth_error(self, op, exc) from exc
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                if attempt + 1 >= attempts:
                    raise LevelUnavailableError(
                        f"redis level at {redacted_url(self.url)}: {op} failed after {attempts} "
                        f"attempts: {exc}", level=self.name) from exc
                time.sleep(min(0.2, 0.01 * (2 ** attempt)))
            except redis.ResponseError as exc:
                # redis-py maps the server's "OOM ..." reply to OutOfMemoryError and strips
                # the code from the message (the prefix test alone never matched)
                if isinstance(exc, redis.exceptions.OutOfMemoryError) or \
                        str(exc).startswith("OOM"):
                    raise CapacityError(f"redis level at {redacted_url(self.url)}: {op}: {exc}",
                                        level=self.name) from exc
                if str(exc).startswith(("NOAUTH", "WRONGPASS")):
                    raise _auth_error(self, op, exc) from exc
                raise LevelUnavailableError(f"redis level at {redacted_url(self.url)}: {op}: {exc}",
                                            level=self.name) from exc
        raise AssertionError("unreachable")

    # -- reads -----------------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        full = list(map(self.prefix.__add__, keys))
        bounded = self.max_bytes is not None

        def go(client: redis.Redis) -> list[bytes | None]:
            if len(full) <= _CHUNK and not bounded:
                # packed here and the reply read by _resp, not by redis-py: a batched miss's
                # MGET costs ~0.5 us CPU a key less (~0.3 packing, ~0.2-0.4 reading)
                return request_values(client, _mget_packed(full))
            pipe = client.pipeline(transaction=False)
            now = time.time()
            for chunk in _chunks(full):
                pipe.mget(chunk)
                if bounded:
                    pipe.zadd(self._lru_key, {k: now for k in chunk}, xx=True)
            replies = pipe.execute()
            out: list[bytes | None] = []
            for reply in replies[::2] if bounded else replies:
                out.extend(reply)
            return out

        return self._run("get", go)

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    @property
    def splits_reads(self) -> bool:
        """Whether :meth:`start_get_many` splits reads (an unbounded level, not over TLS)."""
        return self.max_bytes is None and not str(self.config.url).startswith("rediss://")

    def start_get_many(self, keys: Sequence[bytes]) -> PendingValues | None:
        """Send the read of ``keys`` and return at once: the reply is taken later, without
        blocking, from the returned :class:`~mlcache.levels._resp.PendingValues` (the values in
        the order of ``keys``, None for absent ones). For keyed prefetching, whose operator reads
        ahead on the record loop's thread: the round trip then overlaps the records processed
        meanwhile instead of being waited for in one of them.

        None when this level cannot split its read: a bounded level (its reads also refresh its
        LRU index, in a transaction), a TLS connection, or more keys than one ``MGET`` takes.
        The read has a connection of its own, made beside the pool (so a pool of one connection
        is never emptied by a read nobody waits for), one per process, used by one read at a
        time: the caller keeps at most one outstanding."""
        if not keys or self.max_bytes is not None or len(keys) > _CHUNK:
            return None
        try:
            client = self._connect()
            held = self._reader
            if held is None or held[0] is not client:
                held = self._reader = (client, self._side_connection(client, held))
            conn = held[1]
            conn.connect()
            sock = getattr(conn, "_sock", None)
            if type(sock) is not socket.socket:
                return None      # TLS: its reads go through redis-py
            conn.send_packed_command([_mget_packed(list(map(self.prefix.__add__, keys)))])
        except CacheError:
            raise
        except redis.AuthenticationError as exc:
            raise _auth_error(self, "get", exc) from exc
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise LevelUnavailableError(
                f"redis level at {redacted_url(self.url)}: get failed: {exc}",
                level=self.name) from exc
        return PendingValues(conn, sock, self.config.socket_timeout or None)

    # -- writes ----------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[bytes, bytes | Encoded]]) -> Victims:
        if self.max_bytes is None:
            # Unbounded: the MSET is packed here and sent with one gathering sendmsg, values
            # in pieces (a large write-back) as they are, never joined. redis-py's mset packs
            # each argument in Python and sends each large value with a sendall of its own
            # (each gives up the GIL, which a writer thread then waits to take back); a
            # write-back of a few 10 KB entries cost ~3x more CPU on the writer thread.
            batch: dict[bytes, bytes | Encoded] = {}
            for key, value in items:
                batch[bytes(key)] = value if type(value) is bytes or type(value) is Encoded \
                    else bytes(value)
            if not batch:
                return []

            # each key joins its unit's listing index in the same transaction as it is
            # stored (see scan)
            index = [_zadd_packed(self._index, chunk) for chunk in _chunks(list(batch))]

            def go_plain(client: redis.Redis) -> Victims:
                full = [(self.prefix + k, v) for k, v in batch.items()]
                commands = [_mset_packed(chunk) for chunk in _chunks(full, _CHUNK)]
                buffers = [_MULTI, *index, *(c for command in commands for c in command), _EXEC]
                _send_packed(client, buffers, len(index) + len(commands) + 2,
                             self._own_connection(client))
                return []

            try:
                return self._run("put", go_plain)
            except LevelUnavailableError as exc:
                self._raise_if_over_bulk_limit(batch, exc)
                raise
        bounded: dict[bytes, bytes] = {}
        for key, value in items:
            # (an Encoded value is joined here: a bounded level reads the sizes it replaces)
            bounded[bytes(key)] = value if type(value) is bytes else bytes(value)
        if not bounded:
            return []
        limit = self.max_bytes
        if self._holds and self.may_evict:
            # The EXEC removes nothing the caller needs back (victims stay until released):
            # a retry after a lost reply simply plans again, no marker needed.
            try:
                return self._run("put", lambda client: self._put_bounded(
                    client, bounded, limit, None, None))
            except LevelUnavailableError as exc:
                self._raise_if_over_bulk_limit(bounded, exc)
                raise
        # If the connection drops after EXEC reached the server, the retry must not plan again
        # as if nothing happened: the victims of the applied plan would be gone from Redis and
        # never handed back. The transaction sets a marker; a retry that finds it returns the
        # victims of the attempt that was applied.
        marker = self._meta + b"applied:" + os.urandom(12).hex().encode()
        pending: list[Victims] = []

        def go(client: redis.Redis) -> Victims:
            if pending and client.exists(marker):
                client.delete(marker)
                return pending[-1]
            pending.clear()
            return self._put_bounded(client, bounded, limit, marker, pending)

        try:
            return self._run("put", go)
        except LevelUnavailableError as exc:
            if pending and pending[-1]:
                # An EXEC was sent and nothing says it was not applied (its reply lost, the
                # marker unreachable): its victims may be gone from Redis. The caller writes
                # them below (a copy of an entry still here is harmless; a lost one is not).
                exc.maybe_victims = list(pending[-1])   # type: ignore[attr-defined]
            self._raise_if_over_bulk_limit(bounded, exc)
            raise

    def _raise_if_over_bulk_limit(self, batch: dict[bytes, Any],
                                  exc: LevelUnavailableError) -> None:
        """After a failed write: if the batch holds a value longer than the server takes (its
        ``proto-max-bulk-len``, 512 MiB by default, at least 1 MiB), raise ``exc`` again with
        a message naming that key, its size and the limit. Redis answers such a command with
        "Protocol error: invalid bulk length" and closes the connection, which said nothing
        of which value. Asks the server only when a value of 1 MiB or more was in the batch."""
        big = [(k, len(v)) for k, v in batch.items() if len(v) >= 1 << 20]
        if not big:
            return
        try:
            reply: Any = self._run("config", lambda client: client.config_get(
                "proto-max-bulk-len"))
            limit = int(reply["proto-max-bulk-len"])
        except Exception:  # noqa: BLE001 (unreachable, CONFIG not allowed: the error as it was)
            return
        over = [(k, n) for k, n in big if n > limit]
        if not over:
            return
        from ..keys import split_key

        try:
            key: Any = split_key(over[0][0])[1]
        except Exception:  # noqa: BLE001 (not a key mlcache made: its bytes)
            key = over[0][0]
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        error = LevelUnavailableError(
            f"redis level at {redacted_url(self.url)}: put: the value of key {key!r} is "
            f"{over[0][1]} bytes{more}, over the server's proto-max-bulk-len ({limit}): Redis "
            f"refuses it, and the batch holding it stays queued (delete the key, store it "
            f"smaller, or raise the server's limit)", level=self.name, key=key)
        maybe = getattr(exc, "maybe_victims", None)
        if maybe is not None:
            error.maybe_victims = maybe   # type: ignore[attr-defined]
        raise error from exc

    def _ensure_accounting(self, client: redis.Redis) -> None:
        """Start the byte counter from what is stored (data written while unbounded counts)."""
        if self._accounting_ready:
            return
        if not client.exists(self._bytes_key):
            total = 0
            for keys in self._scan_pages(client, b""):
                pipe = client.pipeline(transaction=False)
                for k in keys:
                    pipe.strlen(k)
                sizes = pipe.execute()
                total += sum(sizes)
                client.zadd(self._lru_key, {k: 0 for k in keys}, nx=True)
            client.set(self._bytes_key, total, nx=True)
        self._accounting_ready = True

    def _sizes(self, client: redis.Redis, full: Sequence[bytes]) -> list[int]:
        pipe = client.pipeline(transaction=False)
        for k in full:
            pipe.strlen(k)
        return [int(n) for n in pipe.execute()]

    def _candidates(self, client: redis.Redis, leased: dict[bytes, int] | None = None
                    ) -> Iterator[tuple[bytes, int]]:
        """Stored entries, least recently accessed first: (key without prefix, size).
        ``leased`` (full key: size), victims other writes hold, come first: they are on their
        way out, so a plan counts them as freed but does not take them (see ``_hold_plan``)."""
        plen = len(self.prefix)
        if leased:
            for member, size in leased.items():
                yield member[plen:], size
        start = 0
        while True:
            members: Any = client.zrange(self._lru_key, start, start + _PAGE - 1)
            if not members:
                return
            for member, size in zip(members, self._sizes(client, members)):
                if not leased or member not in leased:
                    yield member[plen:], size
            start += len(members)

    def _sizes_leased(self, client: redis.Redis, batch: dict[bytes, bytes]
                      ) -> tuple[list[int], dict[bytes, int]]:
        """``_sizes`` of the batch's keys, and the victims other writes hold now (their lease
        not expired; the batch's own keys left out): full key -> size. One round trip, two
        when there are such victims."""
        pipe = client.pipeline(transaction=False)
        for k in batch:
            pipe.strlen(self.prefix + k)
        pipe.zrangebyscore(self._held_key, time.time(), "+inf")
        *sizes, members = pipe.execute()
        if members:
            plen = len(self.prefix)
            members = [m for m in members if m[plen:] not in batch]
        leased = dict(zip(members, self._sizes(client, members))) if members else {}
        return [int(n) for n in sizes], leased

    def hold_victims(self) -> None:
        """Keep victims stored until ``release`` (called by the write-back on a level above
        another; see :mod:`mlcache.levels.base`). ``put_many`` then returns
        :class:`~mlcache.levels.base.HeldVictims` and removes none of them itself: the
        level is over ``max_bytes`` by at most their size (and the size of the older copies
        of values it passed through) until they are released. Without it (the last level,
        a level used on its own) victims leave in the same transaction as the write."""
        self._holds = True

    def release(self, victims: HeldVictims, remove: bool = True) -> None:
        """Remove the victims ``put_many`` held, now that the level below holds them: each
        one only if it still has the value handed down (a newer value written meanwhile by
        another process stays, above the older copy below), with its LRU entry and its bytes
        on the counter, atomically (a Lua script; idempotent, so retried like any call).
        Their leases end either way; ``remove=False`` (the level below does not hold them)
        ends the leases only: they are stored here, and evicted again later."""
        held = getattr(victims, "held", None)
        if not held:
            return
        head = [self._bytes_key, self._lru_key, self._held_key]
        flag = [b"1" if remove else b"0", self._index, b"%d" % len(self.prefix)]

        def go(client: redis.Redis) -> None:
            for chunk in _chunks(held, _RELEASE_CHUNK):
                keys = [*head, *(self.prefix + k for k, _ in chunk)]
                args = [*flag, *(v if remove else b"" for _, v in chunk)]
                try:
                    # packed here, like the MGETs and MSETs (redis-py's evalsha packs each
                    # argument in Python: ~1/3 of what holding victims adds to a write)
                    _send_packed(client, [_evalsha_packed(keys, args)], 1,
                                 self._own_connection(client))
                except redis.exceptions.NoScriptError:
                    client.eval(_RELEASE, len(keys), *keys, *args)

        self._run("release", go)

    def _put_bounded(self, client: redis.Redis, batch: dict[bytes, bytes], limit: int,
                     marker: bytes | None, pending: list[Victims] | None) -> Victims:
        """One bounded write (see the module docstring). ``marker`` None: the level holds its
        victims (``hold_victims``) and returns :class:`HeldVictims`."""
        self._ensure_accounting(client)
        hold = marker is None
        keys = list(batch)
        new = {k: len(v) for k, v in batch.items()}
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self._bytes_key)
                    used = int(pipe.get(self._bytes_key) or 0)
                    leased: dict[bytes, int] | None = None
                    if hold:
                        sizes, leased = self._sizes_leased(client, batch)
                    else:
                        sizes = self._sizes(client, [self.prefix + k for k in keys])
                    old = {k: n for k, n in zip(keys, sizes) if n}
                    if not (self.may_evict or self.lossy):
                        adding = batch_delta(new, old)
                        if used + adding > limit:
                            pipe.unwatch()
                            raise capacity_error(self.name, used, adding, limit)
                    plan = plan_fit(used, limit, new, old, self._candidates(client, leased))
                    if hold:
                        return self._hold_plan(client, pipe, batch, plan, old, leased or {})
                    victims: Victims = []
                    if plan.evict:
                        values: Any = client.mget([self.prefix + k for k in plan.evict])
                        victims = [(k, v) for k, v in zip(plan.evict, values) if v is not None]
                    passed = set(plan.passthrough)
                    victims += [(k, batch[k]) for k in plan.passthrough]
                    gone = [self.prefix + k for k in (*plan.evict, *plan.passthrough)]
                    stay = {self.prefix + k: v for k, v in batch.items() if k not in passed}
                    pipe.multi()
                    if gone:
                        pipe.unlink(*gone)
                        pipe.zrem(self._lru_key, *gone)
                        self._index_pipe(pipe, False, (*plan.evict, *plan.passthrough))
                    if stay:
                        self._index_pipe(pipe, True, [k for k in batch if k not in passed])
                        pipe.mset(stay)
                        now = time.time()
                        pipe.zadd(self._lru_key, {k: now for k in stay})
                    pipe.incrby(self._bytes_key, plan.used_after - used)
                    assert marker is not None and pending is not None
                    pipe.set(marker, b"1", ex=600)
                    result = victims if self.may_evict else []
                    pending.append(result)
                    pipe.execute()
                    try:
                        client.delete(marker)
                    except (redis.ConnectionError, redis.TimeoutError):
                        pass                  # it expires by itself
                    return result
                except redis.WatchError as exc:
                    _raise_if_connection_lost(exc)
                    continue

    def _hold_plan(self, client: redis.Redis, pipe: Any, batch: dict[bytes, bytes],
                   plan: Any, old: dict[bytes, int], leased: dict[bytes, int]) -> HeldVictims:
        """``_put_bounded``'s transaction when the level holds its victims (the counter
        watched, ``plan`` made): write the batch but remove nothing; return the victims read
        (and, for a key whose new value is passed through, its older copy) as held, leased
        to this write. Victims another write holds (``leased``) count as freed in the plan
        but are left to it: were two processes to hand one key down at once, the older
        value could reach the level below last (one holds v1 and is slow to write it; the
        key is rewritten v2, evicted, written below and released by another; then v1 lands
        below, over v2)."""
        if leased:
            plan.evict = [k for k in plan.evict if self.prefix + k not in leased]
        read = [*plan.evict, *(k for k in plan.passthrough if k in old)]
        stored: dict[bytes, bytes] = {}
        if read:
            values: Any = client.mget([self.prefix + k for k in read])
            stored = {k: v for k, v in zip(read, values) if v is not None}
        passed = [(k, batch[k]) for k in plan.passthrough]
        skip = set(plan.passthrough)
        stay = {k: v for k, v in batch.items() if k not in skip}
        # the counter changes by what the batch replaces only: victims and the older copies
        # of passed-through values stay (and count) until released
        delta = sum(len(v) - old.get(k, 0) for k, v in stay.items())
        pipe.multi()
        stale = [self.prefix + k for k in plan.evict if k not in stored]
        if stale:   # in the LRU set, gone from the store (deleted by other means)
            pipe.zrem(self._lru_key, *stale)
        if stay:
            self._index_pipe(pipe, True, list(stay))
            pipe.mset({self.prefix + k: v for k, v in stay.items()})
            now = time.time()
            pipe.zadd(self._lru_key, {self.prefix + k: now for k in stay})
        pipe.incrby(self._bytes_key, delta)
        if stored:
            now = time.time()
            pipe.zremrangebyscore(self._held_key, "-inf", now)     # expired leases
            pipe.zadd(self._held_key, {self.prefix + k: now + _LEASE for k in stored})
        pipe.execute()
        evicted = [(k, stored[k]) for k in plan.evict if k in stored]
        return HeldVictims(evicted + passed, list(stored.items()), passed)

    def _index_pipe(self, pipe: Any, add: bool, keys: Sequence[bytes]) -> None:
        """Add ``keys`` (without the prefix) to the listing index, or remove them, on a
        redis-py pipeline (a bounded level's transaction)."""
        for chunk in _chunks(keys):
            if add:
                pipe.zadd(self._index, {b"k" + k: 0 for k in chunk})
            else:
                pipe.zrem(self._index, *(b"k" + k for k in chunk))

    def put(self, key: bytes, value: bytes) -> Victims:
        return self.put_many([(key, value)])

    def delete_many(self, keys: Sequence[bytes]) -> None:
        if not keys:
            return
        plain = list(dict.fromkeys(bytes(k) for k in keys))
        full = [self.prefix + k for k in plain]
        if self.max_bytes is None:
            # the keys leave their listing index in the same transaction (see scan)
            index = [_zrem_packed(self._index, chunk) for chunk in _chunks(plain)]

            def go(client: redis.Redis) -> None:
                # packed here and pipelined on one connection, like put_many's MSETs (a
                # redis-py pipeline costs ~0.3 ms of Python per call; the writer thread
                # deletes a whole structure's entries at once)
                commands = [_MULTI, *(_unlink_packed(chunk) for chunk in _chunks(full)),
                            *index, _EXEC]
                _send_packed(client, commands, len(commands), self._own_connection(client))

            self._run("delete", go)
            return

        def go_bounded(client: redis.Redis) -> None:
            self._ensure_accounting(client)
            with client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(self._bytes_key)
                        freed = sum(self._sizes(client, full))
                        pipe.multi()
                        pipe.unlink(*full)
                        pipe.zrem(self._lru_key, *full)
                        self._index_pipe(pipe, False, plain)
                        pipe.decrby(self._bytes_key, freed)
                        pipe.execute()
                        return
                    except redis.WatchError as exc:
                        _raise_if_connection_lost(exc)
                        continue

        self._run("delete", go_bounded)

    def delete(self, key: bytes) -> None:
        self.delete_many([key])

    # -- listing and accounting ------------------------------------------------------------

    def _scan_pages(self, client: redis.Redis, prefix: bytes) -> Iterator[list[bytes]]:
        pattern = glob_escape(self.prefix + prefix) + b"*"
        cursor = 0
        keys: Any
        while True:
            cursor, keys = client.scan(cursor, match=pattern, count=1000)
            if keys:
                yield keys
            if cursor == 0:
                return

    def scan(self, prefix: bytes = b"") -> Iterator[bytes]:
        """Every stored key starting with ``prefix``, each once: a range of the listing
        index, O(log N + the keys listed), not O(every key in the database)."""
        prefix = bytes(prefix)
        keys = self._run("scan", lambda client: self._list(client, prefix))
        yield from keys

    def _list(self, client: redis.Redis, prefix: bytes) -> list[bytes]:
        """The keys of the listing index starting with ``prefix`` whose values are stored,
        in pages of 1,000 (one script call each). The index is built first if it is not
        (data written before there was one, or the index lost): a ``SCAN`` of the level adds
        every stored key, then the sentinel (the empty member) says it is complete; a key
        written meanwhile is added by its writer."""
        first = b"[k" + prefix
        start = first
        out: list[bytes] = []
        while True:
            args = (self._index, start, b"k" + prefix, self.prefix)
            try:
                reply: Any = client.evalsha(_LIST_SHA, 1, *args)
            except redis.exceptions.NoScriptError:
                reply = client.eval(_LIST, 1, *args)
            if reply[0] == b"-":
                self._build_index(client)
                start = first
                out.clear()
                continue
            out.extend(m[1:] for m in reply[1:])
            start = reply[0]
            if not start:
                return out

    def _build_index(self, client: redis.Redis) -> None:
        plen = len(self.prefix)
        for page in self._scan_pages(client, b""):
            client.zadd(self._index, {b"k" + k[plen:]: 0 for k in page})
        client.zadd(self._index, {b"": 0})

    def used_bytes(self) -> int:
        """Bytes of values stored under this prefix (O(1) when bounded, a SCAN otherwise)."""
        if self.max_bytes is not None:
            def counted(client: redis.Redis) -> int:
                self._ensure_accounting(client)
                return int(client.get(self._bytes_key) or 0)

            return self._run("used_bytes", counted)

        def summed(client: redis.Redis) -> int:
            return sum(sum(self._sizes(client, page)) for page in self._scan_pages(client, b""))

        return self._run("used_bytes", summed)

    def used_bytes_estimate(self) -> int:
        """``used_bytes`` for ``manager.stats()``, which dashboards poll: O(1) when bounded (the
        counter); unbounded, a full count is a SCAN plus a STRLEN per key, so the last count is
        reused for ``_USED_TTL`` seconds, or a hundred times as long as it took, whichever is
        longer (a poll loop then spends at most ~1% of Redis's time counting)."""
        if self.max_bytes is not None:
            return self.used_bytes()
        now = time.monotonic()
        cached = self._used_cache
        if cached is not None and now - cached[0] < max(_USED_TTL, 100 * cached[2]):
            return cached[1]
        used = self.used_bytes()
        self._used_cache = (now, used, time.monotonic() - now)
        return used

    def ping(self) -> bool:
        return bool(self._run("ping", lambda client: client.ping()))

    def sync(self) -> None:
        """Nothing to do: every call returns once Redis has applied it; on-disk durability is
        the server's own ``appendonly``/``appendfsync`` setting."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            if self._client is not None and self._pid == os.getpid():
                self._client.connection_pool.disconnect()
                for conn in self._owned:
                    conn.disconnect()
            self._owned.clear()
            self._reader = None
            self._client = None
            if self._server is not None:
                self._server_stop()
            self._server = None


def _auth_error(level: Any, op: str, exc: Exception) -> LevelUnavailableError:
    """The server wants a password the URL does not give (or refused the one it gives): say
    so and where it goes; not retryable (retrying cannot change the answer)."""
    err = LevelUnavailableError(
        f"redis level at {redacted_url(level.url)}: {op}: the server requires a password, or "
        f"refused the one given: put it in the URL, redis://:PASSWORD@host:port/db (or "
        f"redis://USER:PASSWORD@host:port/db for an ACL user); the server said: {exc}",
        level=level.name)
    err.retryable = False
    return err
