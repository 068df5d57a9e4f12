"""Configuration: frozen dataclasses, validated at construction, errors that name the field.

``CacheConfig()`` with no arguments is the embedded default: a bytes-bounded heap over a local
disk level. Levels below the heap are an ordered tuple, fastest first, so any combination the
design allows (heap only, heap -> disk, heap -> arena -> redis -> disk, redis only, ...) is one
value. ``from_dict`` and ``from_env`` are the alternative constructors; explicit arguments win
over the environment, the environment over the defaults.
"""
from __future__ import annotations

import abc
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Union
from urllib.parse import unquote

from .errors import ConfigError

__all__ = [
    "HeapConfig",
    "DiskConfig",
    "RedisConfig",
    "ArenaConfig",
    "PrefetchConfig",
    "DedupConfig",
    "CacheConfig",
    "LevelConfig",
    "default_disk_path",
]

MiB = 1 << 20
_MAX_SOCKET_TIMEOUT = 1e9   # seconds; a socket refuses more than 2**63 ns (~9.2e9 s)


def default_disk_path() -> str:
    base = os.environ.get("MLCACHE_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mlcache")
    return os.path.join(base, "disk")


def redacted_url(url: str) -> str:
    """``url`` with its credentials starred, for printing: ``user:pw@`` and a ``password=`` in
    the query (redis-py reads both)."""
    head, q, query = url.partition("?")
    if "@" in head:
        scheme, _, rest = head.partition("://")
        head = f"{scheme}://***@{rest.rpartition('@')[2]}"
    if q:
        query = "&".join(f"{part.partition('=')[0]}=***"
                         if unquote(part.partition("=")[0]).lower() == "password" else part
                         for part in query.split("&"))
    return head + q + query


def _positive(name: str, value: Any, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


def _non_negative(name: str, value: Any) -> None:
    # ``not value >= 0`` also refuses NaN, which compares False with everything
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(name, f"must be a non-negative number, got {value!r}")


def _flag(name: str, value: Any) -> None:
    # a string such as "no" or "false" (from a conf file) is truthy: refuse it rather than
    # read it as True (allow_pickle, lossy: a typo would turn a safety off)
    if not isinstance(value, bool):
        raise ConfigError(name, f"must be True or False, got {value!r}")


@dataclass(frozen=True)
class HeapConfig:
    """The in-process level of live Python objects.

    Bounded by ``max_entries`` or ``max_bytes`` (a weigher: encoded size when known, else an
    estimate) or both. ``policy`` names a registered policy.
    """

    policy: str = "wtinylfu"
    max_entries: int | None = None
    max_bytes: int | None = 64 * MiB
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    track_mutations: bool = True

    def __post_init__(self) -> None:
        _positive("heap.max_entries", self.max_entries)
        _positive("heap.max_bytes", self.max_bytes)
        if self.max_entries is None and self.max_bytes is None:
            raise ConfigError("heap", "set max_entries or max_bytes (or both)")
        if not isinstance(self.policy, str) or not self.policy:
            raise ConfigError("heap.policy", f"must be a policy name, got {self.policy!r}")
        if not isinstance(self.policy_options, Mapping):
            raise ConfigError("heap.policy_options", "must be a mapping")
        _flag("heap.track_mutations", self.track_mutations)


@dataclass(frozen=True)
class LevelConfig(abc.ABC):
    """Base of the configs of the byte levels below the heap."""

    kind: ClassVar[str] = ""
    max_bytes: int | None = None
    lossy: bool = False

    def __post_init__(self) -> None:
        _positive(f"{self.kind}.max_bytes", self.max_bytes)
        _flag(f"{self.kind}.lossy", self.lossy)

    @abc.abstractmethod
    def build(self) -> Any:
        """Create the level this config describes (a :class:`mlcache.levels.Level`)."""


@dataclass(frozen=True)
class DiskConfig(LevelConfig):
    """A diskcache directory: local, durable, shared by the processes of one host."""

    kind: ClassVar[str] = "disk"
    path: str | None = None
    shards: int = 1
    timeout: float = 60.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("disk.shards", self.shards, allow_none=False)
        _non_negative("disk.timeout", self.timeout)
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            # ("" fell back to the shared default directory without a word)
            raise ConfigError("disk.path", f"must be a non-empty string path or None (the "
                                           f"default directory), got {self.path!r}")

    def resolved_path(self) -> str:
        return os.path.abspath(os.path.expanduser(self.path or default_disk_path()))

    def build(self) -> Any:
        from .levels.disk import DiskLevel

        return DiskLevel(self)


@dataclass(frozen=True)
class RedisConfig(LevelConfig):
    """A Redis server: ``redis://``/``rediss://`` URL (auth in the URL) or ``"embedded"``."""

    kind: ClassVar[str] = "redis"
    url: str = "redis://localhost:6379/0"
    prefix: str = "mlcache"
    max_connections: int = 16
    socket_timeout: float = 5.0
    retries: int = 3
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.url, str) or not (
            self.url == "embedded" or self.url.startswith(("redis://", "rediss://", "unix://"))
        ):
            shown = redacted_url(self.url) if isinstance(self.url, str) else self.url
            raise ConfigError("redis.url",
                              f"must be redis://, rediss://, unix:// or 'embedded', got {shown!r}")
        if not isinstance(self.prefix, str):
            raise ConfigError("redis.prefix", f"must be a string, got {self.prefix!r}")
        _positive("redis.max_connections", self.max_connections, allow_none=False)
        _non_negative("redis.socket_timeout", self.socket_timeout)
        if self.socket_timeout > _MAX_SOCKET_TIMEOUT:
            # (inf, or anything past ~9.2e9 s, failed at the first command with a bare
            # OverflowError from the socket module)
            raise ConfigError("redis.socket_timeout",
                              f"must be at most {_MAX_SOCKET_TIMEOUT:g} seconds (0: none), "
                              f"got {self.socket_timeout!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError("redis.retries", f"must be an integer >= 0, got {self.retries!r}")

    def __repr__(self) -> str:
        # the dataclass repr printed the URL's password (in a CacheConfig's repr too)
        fields = ", ".join(
            f"{f.name}={redacted_url(self.url) if f.name == 'url' else getattr(self, f.name)!r}"
            for f in dataclasses.fields(self))
        return f"RedisConfig({fields})"

    def build(self) -> Any:
        from .levels.redis import RedisLevel

        return RedisLevel(self)


@dataclass(frozen=True)
class ArenaConfig(LevelConfig):
    """A Pravega-style block arena in process memory with a hard byte bound."""

    kind: ClassVar[str] = "arena"
    max_bytes: int | None = 64 * MiB
    block_size: int = 4096
    buffer_size: int = 2 * MiB
    policy: str = "lru"

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("arena.max_bytes", self.max_bytes, allow_none=False)
        _positive("arena.block_size", self.block_size, allow_none=False)
        _positive("arena.buffer_size", self.buffer_size, allow_none=False)
        if self.buffer_size % self.block_size:
            raise ConfigError("arena.buffer_size", "must be a multiple of block_size")
        if not 64 <= self.block_size <= 32768:
            raise ConfigError("arena.block_size", f"must be in 64..32768, got {self.block_size}")
        blocks = self.buffer_size // self.block_size
        if blocks < 2 or 8 * blocks > self.block_size:
            # block 0 holds 8 bytes of metadata for every block of its buffer
            raise ConfigError("arena.buffer_size", f"must hold 2..{self.block_size // 8} blocks "
                              f"of {self.block_size} bytes, got {blocks}")
        if not isinstance(self.policy, str) or not self.policy:
            raise ConfigError("arena.policy", f"must be a policy name, got {self.policy!r}")

    def build(self) -> Any:
        from .levels.arena import ArenaLevel

        return ArenaLevel(self)


@dataclass(frozen=True)
class PrefetchConfig:
    """Keyed prefetching: fetch threads, batch size, hot-key filter, lateness bound.

    ``hot_threshold``: a resident key whose sketch count exceeds it gets no hint (16 turns the
    filter off; 12 was chosen by measurement, see docs/implementation/keyed-prefetching.md).
    ``lateness``: hints for event times older than the latest used one minus this are dropped
    (``None`` means 0). ``fetch_mode``: where the lookahead operator's batches are read --
    ``"inline"`` (on the operator's thread, between records), ``"threads"`` (fetch threads read,
    the operator's thread decodes and inserts) or ``"auto"`` (inline unless the reads wait for
    more than half the loop's time; see docs/implementation/keyed-prefetching.md). Hints made
    without the operator are always read by the fetch threads. ``batch_size``: keys per
    batched read; the operator reads whole batches inline (a level that cannot split its reads,
    such as the disk level) at most 32 at a time, since one record carries each.
    """

    enabled: bool = True
    fetch_threads: int = 2
    batch_size: int = 64
    hot_threshold: int = 12
    lateness: float | None = None
    fetch_mode: str = "auto"

    def __post_init__(self) -> None:
        _flag("prefetch.enabled", self.enabled)
        _positive("prefetch.fetch_threads", self.fetch_threads, allow_none=False)
        _positive("prefetch.batch_size", self.batch_size, allow_none=False)
        if (isinstance(self.hot_threshold, bool) or not isinstance(self.hot_threshold, int)
                or not (0 <= self.hot_threshold <= 16)):
            raise ConfigError("prefetch.hot_threshold",
                              "must be an integer in 0..16 (4-bit counters)")
        if self.lateness is not None:
            _non_negative("prefetch.lateness", self.lateness)
        if self.fetch_mode not in ("auto", "inline", "threads"):
            raise ConfigError("prefetch.fetch_mode",
                              f"must be 'auto', 'inline' or 'threads', got {self.fetch_mode!r}")


@dataclass(frozen=True)
class DedupConfig:
    """The record cache (KIP-63): deduplicated updates forwarded to flush listeners.

    Setting ``CacheConfig(dedup=DedupConfig(...))`` makes the heap the record cache: its policy
    becomes ``dedup`` and ``max_bytes_buffering`` (when given) its byte budget, shared by every
    namespace of the manager. ``commit_interval`` forwards the dirty set every that many seconds
    (``time="wall"``) or event-time units of the ``ts`` given to writes (``time="event"``); None
    forwards only on ``flush()`` and under eviction pressure. ``batch_size`` bounds the records
    handed to a listener at once; ``old_values=False`` skips reading the old value of a key
    written without being resident (listeners then get ``old=None`` for it).
    """

    max_bytes_buffering: int | None = None
    commit_interval: float | None = None
    time: str = "wall"
    batch_size: int = 1024
    old_values: bool = True

    def __post_init__(self) -> None:
        _positive("dedup.max_bytes_buffering", self.max_bytes_buffering)
        if self.commit_interval is not None and (
            isinstance(self.commit_interval, bool)
            # ``not > 0`` also refuses NaN (it compares False with every commit time, so the
            # dirty set was forwarded on every write)
            or not isinstance(self.commit_interval, (int, float)) or not self.commit_interval > 0
        ):
            raise ConfigError("dedup.commit_interval",
                              f"must be a positive number or None, got {self.commit_interval!r}")
        if self.time not in ("wall", "event"):
            raise ConfigError("dedup.time", f"must be 'wall' or 'event', got {self.time!r}")
        _positive("dedup.batch_size", self.batch_size, allow_none=False)
        if not isinstance(self.old_values, bool):
            raise ConfigError("dedup.old_values", f"must be a bool, got {self.old_values!r}")


LEVEL_KINDS: dict[str, type[LevelConfig]] = {
    "disk": DiskConfig,
    "redis": RedisConfig,
    "arena": ArenaConfig,
}

AnyLevel = Union[DiskConfig, RedisConfig, ArenaConfig]


@dataclass(frozen=True)
class CacheConfig:
    """Everything a :class:`~mlcache.CacheManager` needs.

    ``heap=None`` leaves the heap out (every access goes to the first byte level);
    ``levels`` lists the byte levels below the heap, fastest first; the last is the store of
    record. ``namespace`` separates managers that share a Redis or a disk directory; it may
    not contain ``"/"``, which joins it to the names of the manager's child namespaces.
    """

    heap: HeapConfig | None = field(default_factory=HeapConfig)
    levels: tuple[LevelConfig, ...] = field(default_factory=lambda: (DiskConfig(),))
    namespace: str = "default"
    signing_key: bytes | None = field(default=None, repr=False)   # a secret: never printed
    allow_pickle: bool = True
    writer_threads: int = 1
    write_batch_size: int = 256
    eviction_buffer_max: int = 4096
    retry_attempts: int = 5
    retry_backoff: float = 0.05
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    dedup: DedupConfig | None = None

    def __post_init__(self) -> None:
        if self.heap is not None and not isinstance(self.heap, HeapConfig):
            raise ConfigError("heap", f"must be a HeapConfig or None, got {type(self.heap).__name__}")
        if isinstance(self.levels, list):
            object.__setattr__(self, "levels", tuple(self.levels))
        if not isinstance(self.levels, tuple) or not all(
            isinstance(lv, LevelConfig) for lv in self.levels
        ):
            raise ConfigError("levels", "must be a sequence of DiskConfig/RedisConfig/ArenaConfig")
        if self.heap is None and not self.levels:
            raise ConfigError("levels", "a cache needs at least one level (heap or a byte level)")
        if not isinstance(self.namespace, str) or not self.namespace or "\x1f" in self.namespace:
            raise ConfigError("namespace", f"must be a non-empty string, got {self.namespace!r}")
        if "/" in self.namespace:
            # "/" joins the manager's namespace to a child's name (manager.namespace(name)):
            # managers "a/b" and "a" would share keys, "a/b"'s own with "a"'s namespace("b")
            raise ConfigError("namespace", "must not contain '/' (it separates the manager's "
                                           "namespace from its child namespaces' names), "
                                           f"got {self.namespace!r}")
        if isinstance(self.signing_key, str):
            object.__setattr__(self, "signing_key", self.signing_key.encode())
        if self.signing_key is not None and (
            not isinstance(self.signing_key, bytes) or len(self.signing_key) < 16
        ):
            raise ConfigError("signing_key", "must be bytes of length >= 16")
        _flag("allow_pickle", self.allow_pickle)
        if not isinstance(self.prefetch, PrefetchConfig):
            raise ConfigError("prefetch", f"must be a PrefetchConfig, "
                                          f"got {type(self.prefetch).__name__}")
        _positive("writer_threads", self.writer_threads, allow_none=False)
        _positive("write_batch_size", self.write_batch_size, allow_none=False)
        _positive("eviction_buffer_max", self.eviction_buffer_max, allow_none=False)
        _positive("retry_attempts", self.retry_attempts, allow_none=False)
        _non_negative("retry_backoff", self.retry_backoff)
        if self.dedup is not None:
            if not isinstance(self.dedup, DedupConfig):
                raise ConfigError("dedup", f"must be a DedupConfig or None, "
                                           f"got {type(self.dedup).__name__}")
            if self.heap is None:
                raise ConfigError("dedup", "the record cache is the heap: set heap=HeapConfig(...)")
            budget = self.dedup.max_bytes_buffering
            object.__setattr__(self, "heap", dataclasses.replace(
                self.heap, policy="dedup",
                policy_options=self.heap.policy_options if self.heap.policy == "dedup" else {},
                max_bytes=budget if budget is not None else self.heap.max_bytes))

    # -- alternative constructors ------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CacheConfig":
        """Build from plain data, e.g. parsed JSON/YAML or Spark conf.

        ``{"heap": {"max_bytes": 1 << 26}, "levels": [{"type": "redis", "url": "embedded"},
        {"type": "disk", "path": "/tmp/x"}]}``; ``"heap": null`` leaves the heap out.
        """
        if not isinstance(data, Mapping):
            raise ConfigError("config", f"must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(sorted(unknown)[0], f"unknown setting; known: {sorted(known)}")
        kwargs: dict[str, Any] = dict(data)
        if "heap" in data and data["heap"] is not None:
            kwargs["heap"] = _build(HeapConfig, data["heap"], "heap")
        if "levels" in data:
            if isinstance(data["levels"], (str, bytes, Mapping)) or not isinstance(
                    data["levels"], (list, tuple)):
                # (an int or null raised TypeError; a string was iterated by characters)
                raise ConfigError("levels", f"must be a list of level settings, "
                                            f"got {type(data['levels']).__name__}")
            levels = []
            for i, spec in enumerate(data["levels"]):
                if isinstance(spec, LevelConfig):
                    levels.append(spec)
                    continue
                if not isinstance(spec, Mapping) or spec.get("type") not in LEVEL_KINDS:
                    raise ConfigError(f"levels[{i}].type", f"must be one of {sorted(LEVEL_KINDS)}")
                spec = dict(spec)
                kind = spec.pop("type")
                levels.append(_build(LEVEL_KINDS[kind], spec, f"levels[{i}]"))
            kwargs["levels"] = tuple(levels)
        if "prefetch" in data and isinstance(data["prefetch"], Mapping):
            kwargs["prefetch"] = _build(PrefetchConfig, data["prefetch"], "prefetch")
        if "dedup" in data and isinstance(data["dedup"], Mapping):
            kwargs["dedup"] = _build(DedupConfig, data["dedup"], "dedup")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "levels":
                value = [dict(type=lv.kind, **_plain(lv)) for lv in value]
            elif dataclasses.is_dataclass(value):
                value = _plain(value)
            out[f.name] = value
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "CacheConfig":
        """Build from ``MLCACHE_*`` variables; keyword overrides win over the environment.

        ``MLCACHE_HEAP_MAX_BYTES``, ``MLCACHE_HEAP_MAX_ENTRIES``, ``MLCACHE_HEAP_POLICY``,
        ``MLCACHE_LEVELS`` (comma list of ``arena,redis,disk``; default ``disk``, or
        ``redis,disk`` when a Redis URL is given), ``MLCACHE_REDIS_URL``, ``MLCACHE_DISK_PATH``,
        ``MLCACHE_NAMESPACE``, ``MLCACHE_SIGNING_KEY``, ``MLCACHE_ALLOW_PICKLE``.
        """
        env = os.environ if environ is None else environ
        heap: dict[str, Any] = {}
        for name, conv in (("max_bytes", int), ("max_entries", int), ("policy", str)):
            raw = env.get(f"MLCACHE_HEAP_{name.upper()}")
            if raw is not None:
                try:
                    heap[name] = conv(raw)
                except ValueError:
                    raise ConfigError(f"MLCACHE_HEAP_{name.upper()}", f"not a {conv.__name__}: {raw!r}")
        data: dict[str, Any] = {}
        if heap:
            data["heap"] = heap
        redis_url = env.get("MLCACHE_REDIS_URL")
        names = env.get("MLCACHE_LEVELS") or ("redis,disk" if redis_url else "")
        if names:
            levels: list[dict[str, Any]] = []
            kinds = [n.strip() for n in names.split(",") if n.strip()]
            if "levels" not in overrides:
                # a setting for a level the list leaves out would be dropped without a word
                for var, kind in (("MLCACHE_REDIS_URL", "redis"), ("MLCACHE_DISK_PATH", "disk")):
                    if env.get(var) and kind not in kinds:
                        raise ConfigError(var, f"is set, but MLCACHE_LEVELS={names!r} has no "
                                               f"{kind} level to use it: add {kind} to "
                                               f"MLCACHE_LEVELS or unset {var}")
            for name in kinds:
                if name not in LEVEL_KINDS:
                    raise ConfigError("MLCACHE_LEVELS", f"unknown level {name!r}; known: {sorted(LEVEL_KINDS)}")
                spec: dict[str, Any] = {"type": name}
                if name == "redis" and redis_url:
                    spec["url"] = redis_url
                if name == "disk" and env.get("MLCACHE_DISK_PATH"):
                    spec["path"] = env["MLCACHE_DISK_PATH"]
                levels.append(spec)
            data["levels"] = levels
        elif env.get("MLCACHE_DISK_PATH"):
            data["levels"] = [{"type": "disk", "path": env["MLCACHE_DISK_PATH"]}]
        if env.get("MLCACHE_NAMESPACE"):
            data["namespace"] = env["MLCACHE_NAMESPACE"]
        if env.get("MLCACHE_SIGNING_KEY"):
            data["signing_key"] = env["MLCACHE_SIGNING_KEY"].encode()
        raw = env.get("MLCACHE_ALLOW_PICKLE")
        if raw:
            flag = raw.strip().lower()
            if flag in ("1", "true", "yes", "on"):
                data["allow_pickle"] = True
            elif flag in ("0", "false", "no", "off"):
                data["allow_pickle"] = False
            else:
                raise ConfigError("MLCACHE_ALLOW_PICKLE",
                                  f"not a boolean: {raw!r} (use 1/true/yes/on or 0/false/no/off)")
        data.update(overrides)
        return cls.from_dict(data)

    @property
    def last_level(self) -> LevelConfig | None:
        return self.levels[-1] if self.levels else None


def _build(cls: type, data: Any, where: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}.{key}", f"unknown setting; known: {sorted(known)}")
    return cls(**data)


def _plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
