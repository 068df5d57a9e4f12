"""PlainQuadtree: the quadtree algorithms over a plain ``dict`` of nodes (the baseline)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._quadtree_geometry import _quadtree_meta
from .quadtree import CacheableQuadtree, _QuadtreeOps

__all__ = ["PlainQuadtree"]


class _DictNodes(dict):
    """The node store of :class:`PlainQuadtree`: the namespace calls over a plain dict."""

    def get_many(self, keys: Iterable[int]) -> dict[int, list]:
        return {k: self[k] for k in keys if k in self}

    def put(self, key: int, value: list) -> None:
        self[key] = value

    def put_many(self, items: Iterable[tuple[int, list]]) -> None:
        self.update(items)

    def delete_many(self, keys: Iterable[int]) -> None:
        for k in keys:
            self.pop(k, None)


class PlainQuadtree(_QuadtreeOps):
    """The same quadtree with its nodes in a plain ``dict``: all state in the heap as live
    Python objects, no cache. The baseline the cacheable tree is measured against; with
    ``packed=True`` each node is kept as the same msgpack blob the cacheable tree stores."""

    def __init__(self, bounds: Any, capacity: int = 32, max_depth: int = 16, *,
                 packed: bool = False) -> None:
        self._packed = packed
        self._meta = _quadtree_meta(bounds, capacity, max_depth)
        self._ns = _DictNodes()

    def _save_meta(self) -> None:
        pass

    def _store(self, value: Any) -> Any:
        return value

    def _load(self, value: Any) -> Any:
        return value

    def _nodes(self, ids: Iterable[int]) -> dict[int, list]:
        if self._packed:
            return CacheableQuadtree._nodes(self, ids)  # type: ignore[arg-type]
        return self._ns.get_many(ids)

    def _node(self, nid: int) -> list | None:
        if self._packed:
            return CacheableQuadtree._node(self, nid)  # type: ignore[arg-type]
        return self._ns.get(nid)

    def _keep(self, items: Iterable[tuple[int, list]]) -> None:
        if self._packed:
            CacheableQuadtree._keep(self, items)  # type: ignore[arg-type]
        else:
            self._ns.put_many(items)

    @staticmethod
    def _check_data(values: list) -> None:
        pass

    def drop(self) -> None:
        self._ns.clear()
        self._meta.update(len=0, nodes=1, next=1)
