"""mlcache — multi-level caching for stateful data jobs whose state outgrows memory.

The public API. Heavy modules are imported on first use, so ``import mlcache`` stays cheap
and never imports Spark.
"""
from __future__ import annotations

import importlib
from typing import Any

from .config import (ArenaConfig, CacheConfig, DedupConfig, DiskConfig, HeapConfig,
                     PrefetchConfig, RedisConfig)
from .errors import (
    CacheError,
    CapacityError,
    ConfigError,
    IntegrityError,
    LevelUnavailableError,
    SerializationError,
)

__version__ = "0.1.0"

_LAZY = {
    "CacheManager": "mlcache.manager",
    "Namespace": "mlcache.manager",
    "Codec": "mlcache.codec",
    "prefetching": "mlcache.prefetch",
    "ForwardingSink": "mlcache.sink",
    "CacheableDict": "mlcache.structures",
    "CacheableList": "mlcache.structures",
    "CacheableSet": "mlcache.structures",
    "CacheableQuadtree": "mlcache.structures",
    "SlidingWindow": "mlcache.structures",
    "SharedWindows": "mlcache.structures",
    "register_policy": "mlcache.policies",
    "get_policy": "mlcache.policies",
    "TinyLFUCache": "mlcache.policies.cachetools_compat",
    "TACache": "mlcache.policies.cachetools_compat",
}

__all__ = [
    "CacheConfig",
    "HeapConfig",
    "DiskConfig",
    "RedisConfig",
    "ArenaConfig",
    "PrefetchConfig",
    "DedupConfig",
    "CacheError",
    "ConfigError",
    "SerializationError",
    "LevelUnavailableError",
    "CapacityError",
    "IntegrityError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mlcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
