"""Driver-side config: ``spark.mlcache.*`` conf, embedded Redis, picklability.

A config reaches executors pickled inside the partition function, so two things are settled on
the driver before any task runs: the config must pickle (else :class:`ConfigError` naming the
setting, instead of a PicklingError from deep inside Spark), and ``RedisConfig(url="embedded")``
must become one real server shared by all workers (an embedded server per worker process would
give every process its own private state).

Spark conf: ``spark.mlcache.<setting>`` with dotted paths, e.g.::

    spark.mlcache.heap.max_bytes      67108864
    spark.mlcache.heap.policy         tac
    spark.mlcache.levels              redis,disk
    spark.mlcache.redis.url           redis://cache:6379/0
    spark.mlcache.disk.path           /mnt/local/mlcache
    spark.mlcache.namespace           fraud
    spark.mlcache.prefetch.enabled    true

They may be given at launch (``--conf``) or set on the session (``spark.conf.set``) before the
:class:`SparkCache` is made. A config passed explicitly wins over the conf; the conf wins over
``MLCACHE_*`` variables.
"""
from __future__ import annotations

import atexit
import dataclasses
import threading
from typing import Any, Mapping

import cloudpickle

from mlcache.config import LEVEL_KINDS, CacheConfig, RedisConfig
from mlcache.errors import ConfigError

__all__ = ["config_from_spark_conf", "prepare_for_executors", "check_picklable", "CONF_PREFIX"]

CONF_PREFIX = "spark.mlcache."
_SECTIONS = ("heap", "prefetch")
# Settings whose value is text whatever it looks like: a Redis prefix or a path may be all
# digits ("2024"), and reading it as a number made a config that fails on the executors.
_TEXT = frozenset({"namespace", "signing_key", "heap.policy", "prefetch.fetch_mode",
                   "redis.url", "redis.prefix", "redis.ssl_ca_certs", "redis.ssl_certfile",
                   "redis.ssl_keyfile", "disk.path", "arena.policy"})


def _value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return raw


def config_from_spark_conf(conf: Any) -> CacheConfig | None:
    """A CacheConfig from the ``spark.mlcache.*`` entries of a SparkConf, SparkSession or
    mapping; ``None`` when there are none."""
    if hasattr(conf, "sparkContext"):   # a SparkSession: its SparkConf, then its SQL conf
        items = list(conf.sparkContext.getConf().getAll())
        runtime = getattr(conf.conf, "getAll", None)
        if runtime is not None:
            items += list((runtime() if callable(runtime) else runtime).items())
    elif hasattr(conf, "getAll"):
        items = list(conf.getAll())
    else:
        items = list(dict(conf).items())
    entries = {k[len(CONF_PREFIX):]: v for k, v in items if k.startswith(CONF_PREFIX)}
    if not entries:
        return None
    data: dict[str, Any] = {}
    level_specs: dict[str, dict[str, Any]] = {}
    order: list[str] | None = None
    for name, raw in sorted(entries.items()):
        head, _, rest = name.partition(".")
        if name == "levels":
            order = [n.strip() for n in raw.split(",") if n.strip()]
            for n in order:
                if n not in LEVEL_KINDS:
                    raise ConfigError(CONF_PREFIX + "levels",
                                      f"unknown level {n!r}; known: {sorted(LEVEL_KINDS)}")
            # each kind has one set of settings here, so a repeat would be the same level twice
            # (levels=disk,disk: two levels on one path)
            for n in set(order):
                if order.count(n) > 1:
                    raise ConfigError(CONF_PREFIX + "levels",
                                      f"level {n!r} is listed {order.count(n)} times in "
                                      f"{raw!r}; each kind may appear once")
        elif head in LEVEL_KINDS and rest:
            level_specs.setdefault(head, {"type": head})[rest] = (
                raw if name in _TEXT else _value(raw))
        elif head in _SECTIONS and rest:
            data.setdefault(head, {})[rest] = raw if name in _TEXT else _value(raw)
        elif not rest:
            data[name] = raw if name in _TEXT else _value(raw)
        else:
            raise ConfigError(CONF_PREFIX + name, "unknown setting")
    if order is None:
        order = [k for k in ("arena", "redis", "disk") if k in level_specs] or None
    else:
        # a level's settings with a levels list that leaves it out were dropped silently (a
        # redis.url beside levels=disk made a disk-only config, coherent on one host only)
        for kind in sorted(set(level_specs) - set(order)):
            first = sorted(k for k in level_specs[kind] if k != "type")[0]
            raise ConfigError(f"{CONF_PREFIX}{kind}.{first}",
                              f"is set but {CONF_PREFIX}levels ({entries['levels']!r}) does not "
                              f"list {kind!r}")
    if order is not None:
        data["levels"] = [level_specs.get(n, {"type": n}) for n in order]
    try:
        return CacheConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(CONF_PREFIX + exc.field, str(exc).split(": ", 1)[-1]) from exc


def check_picklable(config: CacheConfig) -> bytes:
    """``cloudpickle.dumps(config)``, or ConfigError naming the first setting that fails."""
    try:
        return cloudpickle.dumps(config)
    except Exception as exc:
        field = _unpicklable_field(config, "") or "config"
        raise ConfigError(field, f"cannot be pickled to the Spark executors "
                          f"({type(exc).__name__}: {exc})") from exc


def _unpicklable_field(obj: Any, path: str) -> str | None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            found = _unpicklable_field(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            if isinstance(item, RedisConfig) or dataclasses.is_dataclass(item):
                found = _unpicklable_field(item, f"{path}[{i}]")
                if found:
                    return found
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            found = _unpicklable_field(v, f"{path}.{k}")
            if found:
                return found
    try:
        cloudpickle.dumps(obj)
    except Exception:
        return path
    return None


_servers: dict[str, Any] = {}
_servers_lock = threading.Lock()

def _embedded_url(cfg: RedisConfig) -> str:
    """One embedded redis-server per driver process, started on first use, stopped at exit,
    or by a watchdog process when the driver ends without running its exit hooks."""
    from mlcache._redis_server import RedisServer

    with _servers_lock:
        server = _servers.get(cfg.prefix)
        if server is None:
            server = RedisServer().start(watchdog=True)
            _servers[cfg.prefix] = server
            atexit.register(server.cleanup)
        return server.url


def prepare_for_executors(config: CacheConfig) -> CacheConfig:
    """Resolve ``"embedded"`` Redis URLs on the driver and check the config pickles."""
    if any(isinstance(lv, RedisConfig) and lv.url == "embedded" for lv in config.levels):
        levels = tuple(dataclasses.replace(lv, url=_embedded_url(lv))
                       if isinstance(lv, RedisConfig) and lv.url == "embedded" else lv
                       for lv in config.levels)
        config = dataclasses.replace(config, levels=levels)
    check_picklable(config)
    return config
