"""One CacheManager per Python worker process and config: :func:`executor_manager`.

Spark reuses a Python worker across tasks, jobs and micro-batches, and a module-level object
survives that reuse (a global in ``__main__`` or in a closure does not: it is unpickled again per
task). So the registry lives here, keyed by the config's fingerprint. It is created lazily, on
the first task that asks, after any fork; a pid check (and an at-fork hook) makes a forked child
build its own manager instead of sharing the parent's sockets and threads. Nothing here relies on
``atexit``, ``__del__`` or daemon threads at exit: Spark kills idle workers without running them,
so the partition helpers flush at every partition end instead.

Each creation is counted in the shared epoch store under ``host:pid:fingerprint``, which is how a
job (or a test) checks that a worker built its manager once across many micro-batches.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import threading
import uuid
from typing import Any, Mapping

from mlcache.config import ArenaConfig, CacheConfig
from mlcache.errors import ConfigError

from ._epochs import open_epoch_store

__all__ = ["executor_manager", "config_fingerprint", "worker_context", "WorkerContext"]


def config_fingerprint(config: CacheConfig) -> str:
    """A process-independent digest of a config (never ``hash()``, which is salted per process)."""
    text = json.dumps(config.to_dict(), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class WorkerContext:
    """What one worker process keeps per config: the manager, the epoch store, held epochs."""

    def __init__(self, config: CacheConfig, fingerprint: str) -> None:
        from mlcache import CacheManager

        self.config = config
        self.fingerprint = fingerprint
        self.pid = os.getpid()
        self.worker = f"{socket.gethostname()}:{self.pid}:{fingerprint[:8]}"
        # A fresh token per creation: a restarted worker that got a recycled pid is still a
        # different owner (its heap is empty, but the epoch must move for the others).
        self.owner = f"{self.worker}:{uuid.uuid4().hex[:8]}"
        self.store = open_epoch_store(config)     # first: names redis.url / disk.path on failure
        self.manager = CacheManager(config)
        # A flush writes the heap's dirty entries to the first level only. When that level is
        # in this process's memory (an arena), it is not shared: the commit point must copy the
        # state down to the shared level (a checkpoint), or the next owner reads older state.
        self.flush_stays_local = bool(config.levels) and isinstance(config.levels[0],
                                                                    ArenaConfig)
        self.held: dict[tuple[str, int], int] = {}
        self.namespaces: dict[tuple[str, int], set[str]] = {}
        self.lock = threading.Lock()
        self.creation = self.store.record_creation(self.worker)
        self._clock = itertools.count()
        self.takes = 0      # partitions taken by this process
        self.drops = 0      # ... of which another process had owned since (local copies dropped)

    def next_positions(self, n: int) -> int:
        """Reserve ``n`` ticks of this worker's hint clock; returns the first.

        The default event time of a hint. One worker runs many partitions one after another,
        and each partition's own record index (or its event times) would restart below where
        the previous partition ended: a timestamp-ordered policy (TAC) would then take every
        new hint for the oldest entry. The clock only grows, across all of them.
        """
        with self.lock:
            start = next(self._clock)
            self._clock = itertools.count(start + n)
        return start

    def tick(self, _record: Any = None) -> float:
        # next() on itertools.count is atomic under the GIL: no lock on the per-record path.
        return float(next(self._clock))

    def take_partition(self, scope: str, partition: int) -> bool:
        """Own ``partition`` of ``scope``; drop local copies if someone else owned it since.

        Returns True when local copies were dropped. The namespaces dropped are the ones this
        process opened for the partition (:meth:`note_namespace`); the ones it never opened
        have no local copies.
        """
        epoch = self.store.acquire(scope, partition, self.owner)
        with self.lock:
            last = self.held.get((scope, partition))
            self.held[(scope, partition)] = epoch
            stale = sorted(self.namespaces.get((scope, partition), ())) if last != epoch else []
        for ns in stale:
            drop_local(self.manager, ns)
        if stale:
            self.drops += 1
        self.takes += 1
        return bool(stale)

    def note_namespace(self, scope: str, partition: int, namespace: str) -> None:
        with self.lock:
            self.namespaces.setdefault((scope, partition), set()).add(namespace)


def drop_local(manager: Any, namespace: str) -> None:
    """Forget this process's clean copies of ``namespace`` (``invalidate_local``: the heap's
    and an arena's above a shared level). Dirty ones are newer than the shared level and stay;
    at a partition start there are none, the previous run flushed (and copied down through an
    arena)."""
    manager.invalidate_local(namespace=namespace)


_lock = threading.Lock()
_pid = os.getpid()
_contexts: dict[str, WorkerContext] = {}


def _after_fork() -> None:
    # The parent's managers own its threads and sockets; the child must not touch them (not even
    # to close them), so it simply starts with an empty registry and a fresh lock.
    global _lock, _pid, _contexts
    _lock = threading.Lock()
    _pid = os.getpid()
    _contexts = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _as_config(config: CacheConfig | Mapping[str, Any] | None) -> CacheConfig:
    if config is None:
        return CacheConfig.from_env()
    if isinstance(config, CacheConfig):
        return config
    if isinstance(config, Mapping):
        return CacheConfig.from_dict(config)
    raise ConfigError("config", f"must be a CacheConfig, a mapping or None, got {type(config).__name__}")


def worker_context(config: CacheConfig | Mapping[str, Any] | None = None) -> WorkerContext:
    """This process's :class:`WorkerContext` for ``config``, created on first use."""
    config = _as_config(config)
    fp = config_fingerprint(config)
    if os.getpid() != _pid:  # forked without the at-fork hook (or before it was registered)
        _after_fork()
    ctx = _contexts.get(fp)
    if ctx is not None:
        return ctx
    with _lock:
        ctx = _contexts.get(fp)
        if ctx is None:
            ctx = WorkerContext(config, fp)
            _contexts[fp] = ctx
    return ctx


def executor_manager(config: CacheConfig | Mapping[str, Any] | None = None) -> Any:
    """This Python worker's CacheManager for ``config`` (one per config per process).

    Created on first use (after fork), reused by every later task, job and micro-batch the
    worker runs. ``None`` reads ``MLCACHE_*`` from the worker's environment.
    """
    return worker_context(config).manager
