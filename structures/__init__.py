"""mlcache.structures — cacheable types built on the manager API only.

Importing this package registers each kind with the manager, so ``manager.dict(name)``,
``manager.list(name)``, ``manager.set(name)``, ``manager.quadtree(name, bounds)`` and
``manager.structure(kind, name)`` create or reopen a structure by name.
"""
from __future__ import annotations

from typing import Any

from mlcache.manager import register_structure

from .base import Cacheable, StructureRef, list_structures, open_structure
from .dict import CacheableDict
from .list import CacheableList
from ._quadtree_plain import PlainQuadtree
from .quadtree import CacheableQuadtree, Point
from .set import CacheableSet
from .window import Aggregate, SharedWindows, SlidingWindow

__all__ = [
    "Cacheable",
    "StructureRef",
    "open_structure",
    "list_structures",
    "CacheableDict",
    "CacheableList",
    "CacheableSet",
    "CacheableQuadtree",
    "PlainQuadtree",
    "Point",
    "SlidingWindow",
    "SharedWindows",
    "Aggregate",
]


def _factory(cls: type[Cacheable]) -> Any:
    def factory(manager: Any, name: str, **options: Any) -> Cacheable:
        if name is None:
            raise ValueError(f"manager.{cls.kind}() needs a name; "
                             f"{cls.__name__}.open(manager) makes an anonymous one")
        return cls.open(manager, name, **options)

    factory.__name__ = f"open_{cls.kind}"
    return factory


for _cls in (CacheableDict, CacheableList, CacheableSet, CacheableQuadtree):
    register_structure(_cls.kind, _factory(_cls))
