"""Partition ownership epochs in the shared level: Redis, or the host-shared disk directory.

A Spark partition's state may be served by a different Python worker process in every batch
(with ``local[2]`` it hops between the two workers). Each process keeps heap copies of the keys
it served, so before reading it must know whether someone else wrote them since. The epoch store
answers that with one atomic step per partition start:

    acquire(scope, p, owner) -> epoch

``epoch`` is incremented whenever the owner of ``(scope, p)`` changes and kept when the same
owner takes the partition again. A process that remembers the epoch it last held sees a different
number exactly when another process owned the partition in between, and then drops its heap
copies of the partition's keys before reading. Redis does the step in one Lua script (shared by
every host); without Redis a diskcache directory beside the disk level does it in one SQLite
transaction (shared by the processes of one host, which is as far as a local disk level is
shared anyway).

The same store records manager creations per worker process (so a job can check that Spark
reused its workers) and the last committed micro-batch per state.
"""
from __future__ import annotations

import os
import re
import socket
import time
from typing import Any, Callable, Protocol, TypeVar

from mlcache.config import CacheConfig, DiskConfig, RedisConfig
from mlcache.errors import ConfigError, LevelUnavailableError

T = TypeVar("T")

__all__ = ["EpochStore", "RedisEpochStore", "DiskEpochStore", "open_epoch_store", "shared_level",
           "check_shared_bounds",
           "redact_url"]

_ACQUIRE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local epoch = 0
local owner = ''
if cur then
  local i = string.find(cur, '|', 1, true)
  epoch = tonumber(string.sub(cur, 1, i - 1))
  owner = string.sub(cur, i + 1)
end
if owner ~= ARGV[2] then
  epoch = epoch + 1
  redis.call('HSET', KEYS[1], ARGV[1], epoch .. '|' .. ARGV[2])
end
return epoch
"""


def _text(raw: bytes | str) -> str:
    """A Redis reply as text (the client returns bytes; a str passes through)."""
    return raw.decode() if isinstance(raw, bytes) else raw


def redact_url(url: str) -> str:
    """The URL with any password replaced, for error messages."""
    return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)


class EpochStore(Protocol):
    def acquire(self, scope: str, partition: int, owner: str) -> int: ...
    def partitions(self, scope: str) -> list[int]: ...
    def record_creation(self, worker: str) -> int: ...
    def creations(self) -> dict[str, int]: ...
    def record_stats(self, worker: str, stats: str) -> None: ...
    def worker_stats(self) -> dict[str, str]: ...
    def mark_committed(self, scope: str, batch_id: int) -> None: ...
    def last_committed(self, scope: str) -> int | None: ...
    def close(self) -> None: ...


class RedisEpochStore:
    """Epochs as one Redis hash per scope; acquire is a Lua script (atomic on the server)."""

    def __init__(self, cfg: RedisConfig, namespace: str) -> None:
        import redis

        self.url = cfg.url
        tls: dict[str, Any] = {}
        if cfg.url.startswith("rediss://"):
            tls = {k: v for k, v in (("ssl_ca_certs", cfg.ssl_ca_certs),
                                     ("ssl_certfile", cfg.ssl_certfile),
                                     ("ssl_keyfile", cfg.ssl_keyfile)) if v}
        self._client = redis.Redis.from_url(cfg.url, socket_timeout=cfg.socket_timeout,
                                            socket_connect_timeout=cfg.socket_timeout, **tls)
        # Outside the Redis level's key space (``prefix:`` followed by a stored key), as the
        # level keeps its own accounting (``prefix`` NUL ``bytes``): under ``prefix:spark:``
        # these hashes were taken for stored values, so a bounded level's first write failed
        # on them (WRONGTYPE from its STRLEN scan, every flush of every task) and an unbounded
        # level's used_bytes (stats) came out None.
        self._base = f"{cfg.prefix}\x00spark:{namespace}"
        try:
            self._client.ping()
        except Exception as exc:
            raise LevelUnavailableError(
                f"redis.url: cannot reach {redact_url(cfg.url)} from {socket.gethostname()} "
                f"(pid {os.getpid()}): {type(exc).__name__}: {exc}", level="redis") from exc
        self._acquire = self._client.register_script(_ACQUIRE)
        self._retries = cfg.retries
        self._lost = (redis.ConnectionError, redis.TimeoutError, OSError)

    def _run(self, op: str, fn: Callable[[], T], idempotent: bool = True) -> T:
        """``fn()``, with the Redis level's quick reconnects (``retries``, when running it
        twice does no harm), a lost connection raised as the retryable
        :class:`LevelUnavailableError` naming ``redis.url``, as the level raises it; the bare
        redis-py ConnectionError escaped from every partition start and the driver's reads."""
        attempts = self._retries + 1 if idempotent else 1
        for attempt in range(attempts):
            try:
                return fn()
            except self._lost as exc:
                if attempt + 1 >= attempts:
                    raise LevelUnavailableError(
                        f"redis.url: the Spark epoch store at {redact_url(self.url)} failed "
                        f"({op}, {attempts} attempt{'s' if attempts > 1 else ''}) from "
                        f"{socket.gethostname()} (pid {os.getpid()}): {type(exc).__name__}: "
                        f"{exc}", level="redis") from exc
                time.sleep(min(0.2, 0.01 * (2 ** attempt)))
        raise AssertionError("unreachable")

    def acquire(self, scope: str, partition: int, owner: str) -> int:
        # idempotent: a second run by the same owner keeps the epoch the first one set
        return int(self._run("acquire", lambda: self._acquire(
            keys=[f"{self._base}:own:{scope}"], args=[str(partition), owner])))

    def partitions(self, scope: str) -> list[int]:
        raw = self._run("partitions", lambda: self._client.hkeys(f"{self._base}:own:{scope}"))
        return sorted(int(p) for p in raw)

    def record_creation(self, worker: str) -> int:
        # not idempotent: an increment whose reply was lost would count twice
        return int(self._run("record_creation", lambda: self._client.hincrby(
            f"{self._base}:creations", worker, 1), idempotent=False))

    def creations(self) -> dict[str, int]:
        raw = self._run("creations", lambda: self._client.hgetall(f"{self._base}:creations"))
        return {_text(k): int(v) for k, v in raw.items()}

    def record_stats(self, worker: str, stats: str) -> None:
        self._run("record_stats", lambda: self._client.hset(f"{self._base}:stats", worker, stats))

    def worker_stats(self) -> dict[str, str]:
        raw = self._run("worker_stats", lambda: self._client.hgetall(f"{self._base}:stats"))
        return {_text(k): _text(v) for k, v in raw.items()}

    def mark_committed(self, scope: str, batch_id: int) -> None:
        self._run("mark_committed", lambda: self._client.set(
            f"{self._base}:committed:{scope}", int(batch_id)))

    def last_committed(self, scope: str) -> int | None:
        raw = self._run("last_committed",
                        lambda: self._client.get(f"{self._base}:committed:{scope}"))
        return None if raw is None else int(raw)

    def close(self) -> None:
        self._client.close()


class DiskEpochStore:
    """Epochs in a diskcache directory beside the disk level; acquire is one transaction."""

    def __init__(self, cfg: DiskConfig, namespace: str) -> None:
        import diskcache

        self.path = cfg.resolved_path().rstrip(os.sep) + ".spark"
        try:
            self._cache = diskcache.Cache(self.path, timeout=cfg.timeout)
        except Exception as exc:
            raise LevelUnavailableError(
                f"disk.path: cannot open {self.path} on {socket.gethostname()}: {exc}",
                level="disk") from exc
        self._ns = namespace

    def acquire(self, scope: str, partition: int, owner: str) -> int:
        key = (self._ns, "own", scope, int(partition))
        with self._cache.transact(retry=True):
            epoch, held_by = self._cache.get(key, default=(0, ""), retry=True)
            if held_by != owner:
                epoch += 1
                self._cache.set(key, (epoch, owner), retry=True)
        return int(epoch)

    def partitions(self, scope: str) -> list[int]:
        return sorted(k[3] for k in self._cache.iterkeys()
                      if isinstance(k, tuple) and k[:3] == (self._ns, "own", scope))

    def record_creation(self, worker: str) -> int:
        return int(self._cache.incr((self._ns, "creations", worker), retry=True))

    def creations(self) -> dict[str, int]:
        out = {}
        for k in self._cache.iterkeys():
            if isinstance(k, tuple) and k[:2] == (self._ns, "creations"):
                out[k[2]] = int(self._cache.get(k, default=0, retry=True))
        return out

    def record_stats(self, worker: str, stats: str) -> None:
        self._cache.set((self._ns, "stats", worker), stats, retry=True)

    def worker_stats(self) -> dict[str, str]:
        out = {}
        for k in self._cache.iterkeys():
            if isinstance(k, tuple) and k[:2] == (self._ns, "stats"):
                out[k[2]] = self._cache.get(k, default="{}", retry=True)
        return out

    def mark_committed(self, scope: str, batch_id: int) -> None:
        self._cache.set((self._ns, "committed", scope), int(batch_id), retry=True)

    def last_committed(self, scope: str) -> int | None:
        return self._cache.get((self._ns, "committed", scope), retry=True)

    def close(self) -> None:
        self._cache.close()


def shared_level(config: CacheConfig) -> RedisConfig | DiskConfig:
    """The level the epoch store lives in: the config's first Redis level, else its disk
    level; :class:`ConfigError` naming ``levels`` when it has neither."""
    for level in config.levels:
        if isinstance(level, RedisConfig):
            return level
    for level in config.levels:
        if isinstance(level, DiskConfig):
            return level
    raise ConfigError("levels", "Spark state needs a level shared between worker processes "
                      "(redis or disk); a heap-only or arena-only config cannot be coherent")


def check_shared_bounds(config: CacheConfig) -> None:
    """Refuse a shared level with ``max_bytes`` above another level when its victims could
    leave it before a level the other workers read holds them (:class:`ConfigError`).

    A disk level evicts in its own transaction and hands its victims down afterwards: a
    worker reading one of its keys in between gets the older copy below (lost updates: 3 of
    4,000 keys after 8 jobs on local[2] with Redis bounded to 60 KB above the disk, before
    the Redis level kept its victims). A Redis level keeps its victims, stored and leased,
    until the level below holds them (tests/test_redis_victims_s11.py): accepted above shared
    levels, refused above a process's own arena, where other workers would never find them.
    Otherwise the bound goes on the last level, which refuses a write it cannot hold."""
    levels = config.levels
    for i, level in enumerate(levels[:-1]):
        if not isinstance(level, (RedisConfig, DiskConfig)) or level.max_bytes is None:
            continue
        if isinstance(level, RedisConfig):
            private = [lv for lv in levels[i + 1:] if not isinstance(lv, (RedisConfig,
                                                                          DiskConfig))]
            if not private:
                continue
            raise ConfigError(
                "redis.max_bytes",
                f"a redis level with a byte bound above a {private[0].kind} level is not "
                "coherent between Spark workers: its victims, other workers' keys among them, "
                "go down into one process's memory, where the others never find them; put "
                "the bound on a redis level above shared levels only, or leave it unbounded")
        raise ConfigError(
            f"{level.kind}.max_bytes",
            f"a {level.kind} level with a byte bound above another level is not coherent "
            "between Spark workers: it evicts other processes' keys before the level "
            "below holds them, and a worker reading one meanwhile gets an older copy; "
            "leave it unbounded or make it the last level")


def open_epoch_store(config: CacheConfig) -> Any:
    """The store in the config's shared level: its first Redis level, else its disk level."""
    level = shared_level(config)
    if isinstance(level, RedisConfig):
        if level.url == "embedded":
            raise ConfigError("redis.url", "'embedded' starts a private server per process; "
                              "resolve it on the driver first (SparkCache does)")
        return RedisEpochStore(level, config.namespace)
    return DiskEpochStore(level, config.namespace)
