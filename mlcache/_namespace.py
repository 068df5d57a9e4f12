"""Namespace: a view of a manager with its own key space (same API, shared heap and levels)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from ._keyview import KeyView
from ._readpath import MISSING, event_time, found_by_key
from ._writepath import batch_items
from .config import CacheConfig
from .keys import namespace_prefix

if TYPE_CHECKING:
    from .manager import CacheManager

__all__ = ["Namespace"]


class Namespace(KeyView):
    """A view of a manager with its own key space; same API, shared levels and heap."""

    def __init__(self, manager: "CacheManager", name: str) -> None:
        super().__init__(namespace_prefix(f"{manager.config.namespace}/{name}"))
        self._memo_max = manager._memo_max
        self.manager = manager
        self.name = name

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    @property
    def config(self) -> CacheConfig:
        return self.manager.config

    def get(self, key: Any, default: Any = None, *, ts: float | None = None) -> Any:
        return self.manager._get_kb(self._kb(key), default, ts)

    def contains(self, key: Any) -> bool:
        return self.get(key, MISSING) is not MISSING

    def get_many(self, keys: Iterable[Any], *, ts: float | None = None) -> dict:
        if ts is not None:
            ts = event_time(ts)
        keys = list(keys)
        kbs = self._kbs(keys)
        return found_by_key(keys, kbs, self.manager._load_into_heap(kbs, ts))

    def put(self, key: Any, value: Any, *, ts: float | None = None) -> None:
        self.manager._put_items([(key, self._kb(key), value)], ts)

    def put_many(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        self.manager._put_items(batch_items(items, self._kb), None, lend_own=True)

    def delete(self, key: Any) -> None:
        self.manager._delete_kbs([self._kb(key)])

    def delete_many(self, keys: Iterable[Any]) -> None:
        self.manager._delete_kbs([self._kb(key) for key in keys])

    def keys(self) -> Iterator[Any]:
        return iter(self.manager._keys_with_prefix(self._prefix))

    def hint(self, key: Any, ts: float) -> None:
        self.manager._hint_kb(self._kb(key), ts)

    def flush(self) -> None:
        self.manager.flush()

    def checkpoint(self, checkpoint_id: Any = None) -> None:
        self.manager.checkpoint(checkpoint_id)

    def stats(self) -> dict[str, Any]:
        return self.manager.stats()

    def on_flush(self, callback: Callable[[list], Any]) -> Callable[[list], Any]:
        """Call ``callback(batch)`` with this namespace's flushed ``(key, new, old)`` batches."""
        return self.manager._record_cache().add_listener(self._prefix, callback)

    def remove_flush_listener(self, callback: Callable[[list], Any]) -> None:
        self.manager._record_cache().remove_listener(self._prefix, callback)

    # hooks for mlcache.prefetch, so a Namespace can stand in for its manager
    def _load_into_heap(self, keys_bytes: Iterable[bytes], ts: float | None = None, *,
                        prefetch: bool = False) -> dict[bytes, Any]:
        return self.manager._load_into_heap(keys_bytes, ts, prefetch=prefetch)

    def _resident(self, key_bytes: bytes) -> bool:
        return self.manager._resident(key_bytes)

    def _policy_hint(self, key_bytes: bytes, ts: float) -> None:
        self.manager._policy_hint(key_bytes, ts)
