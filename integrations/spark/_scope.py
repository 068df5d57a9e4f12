"""The manager a partition function sees: this partition's slice of the executor manager.

Keys are owned per Spark partition (DESIGN §8), so a partition's state lives in namespaces of its
own, ``"<state>.p<partition>/<name>"``. That makes "drop the local copies of p's keys" one
namespace invalidation, and it keeps structure metadata (a dict's length) per partition, so two
processes never write the same metadata entry. A :class:`PartitionScope` looks like a manager to
the structures (``namespace(name)``, ``flush()``), so ``CacheableDict.open(scope, "risk")``
works unchanged; in a micro-batch every namespace it hands out is a
:class:`~._versioned.BatchView`, which makes the structure's effects exactly-once.

The price of per-partition namespaces: the job must partition its input by the state key with a
fixed number of partitions (``df.repartition(n, "card")``), which stateful Spark jobs do anyway.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from ._versioned import BatchView, PlainMetaView, PlainView

__all__ = ["PartitionScope", "partition_prefix"]


def partition_prefix(state: str, partition: int) -> str:
    return f"{state}.p{int(partition)}/"


class PartitionScope:
    """One partition's view of the executor manager (see the module docstring)."""

    def __init__(self, manager: Any, state: str, partition: int, batch_id: int | None,
                 attempt: str, on_namespace: Callable[[str], None] | None = None) -> None:
        self.manager = manager
        self.state = state
        self.partition = partition
        self.batch_id = batch_id
        self.attempt = attempt
        self._prefix = partition_prefix(state, partition)
        self._views: dict[str, Any] = {}
        self._on_namespace = on_namespace

    @property
    def config(self) -> Any:
        return self.manager.config

    def namespace_name(self, name: str) -> str:
        return self._prefix + name

    def namespace(self, name: str) -> Any:
        view = self._views.get(name)
        if view is None:
            full = self.namespace_name(name)
            if self._on_namespace is not None:
                self._on_namespace(full)
            ns = self.manager.namespace(full)
            if self.batch_id is not None:
                view = BatchView(ns, self.batch_id, self.attempt)
            else:
                from mlcache.structures.base import META_NAMESPACE

                view = PlainMetaView(ns) if name == META_NAMESPACE else PlainView(ns)
            view._prefetch_target = _target(self.manager, ns)
            self._views[name] = view
        return view

    def dict(self, name: str) -> Any:
        from mlcache.structures import CacheableDict

        return CacheableDict.open(self, name)

    def structure(self, kind: str, name: str, **options: Any) -> Any:
        from mlcache.structures.base import open_structure

        return open_structure(self, kind, name, **options)

    def views(self) -> Iterator[Any]:
        return iter(list(self._views.values()))

    def flush(self) -> None:
        self.manager.flush()

    def checkpoint(self, checkpoint_id: Any = None) -> None:
        self.manager.checkpoint(checkpoint_id)

    def __repr__(self) -> str:
        return (f"<PartitionScope {self.state!r} partition={self.partition} "
                f"batch={self.batch_id}>")


def _target(manager: Any, ns: Any) -> Callable[[], tuple[Any, Callable[[Any], bytes]]]:
    """What ``prefetching(cache=view)`` resolves to: the real manager and the namespace's keys."""
    def resolve() -> tuple[Any, Callable[[Any], bytes]]:
        enc = getattr(ns, "_encode_key", None)
        if not callable(enc):
            raise TypeError("this CacheManager's namespaces cannot be prefetched into")
        return manager, enc
    return resolve
