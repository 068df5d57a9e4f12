"""PlainQuadtree: the quadtree algorithms over a plain ``dict`` of nodes (the baseline)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._quadtree_geometry import NODE_CODEC, _quadtree_meta
from .quadtree import _QuadtreeOps

__all__ = ["PlainQuadtree"]


class PlainQuadtree(_QuadtreeOps):
    """The same quadtree with its nodes in a plain ``dict``: all state in the heap as live
    Python objects, no cache. The baseline the cacheable tree is measured against; with
    ``packed=True`` each node is kept as a msgpack blob instead (packed on every change,
    unpacked on every read), to show what that layout costs."""

    def __init__(self, bounds: Any, capacity: int = 32, max_depth: int = 16, *,
                 packed: bool = False) -> None:
        self._packed = packed
        self._meta = _quadtree_meta(bounds, capacity, max_depth)
        self._nodes_by_id: dict[int, Any] = {}

    def _save_meta(self) -> None:
        pass

    def _store(self, value: Any) -> Any:
        return value

    def _load(self, value: Any) -> Any:
        return value

    def _nodes(self, ids: Iterable[int]) -> dict[int, list]:
        store = self._nodes_by_id
        if self._packed:
            decode = NODE_CODEC.decode
            return {k: decode(store[k]) for k in ids if k in store}
        return {k: store[k] for k in ids if k in store}

    def _node(self, nid: int) -> list | None:
        node = self._nodes_by_id.get(nid)
        return NODE_CODEC.decode(node) if self._packed and node is not None else node

    def _keep(self, items: list[tuple[int, list]]) -> None:
        if self._packed:
            encode = NODE_CODEC.encode
            self._nodes_by_id.update((k, encode(node)) for k, node in items)
        else:
            self._nodes_by_id.update(items)

    def _forget(self, ids: list[int]) -> None:
        for k in ids:
            self._nodes_by_id.pop(k, None)

    def drop(self) -> None:
        self._nodes_by_id.clear()
        self._meta.update(len=0, nodes=1, next=1)
