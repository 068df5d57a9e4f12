"""The Level protocol: what every byte level below the heap implements.

Batch calls are the contract (one pipeline, one transaction per call); one-key calls are
conveniences built on them. Keys are canonical bytes (see :mod:`mlcache.keys`), values are
bytes produced by :mod:`mlcache.codec`.

Overflow: a level bounded in bytes (``max_bytes``) makes room by evicting its own victims and
*returns* them from ``put_many`` so the manager can write them to the level below before they
are gone for good. The manager sets ``may_evict = False`` on the last level (the store of
record): there a full level raises :class:`~mlcache.errors.CapacityError` and changes nothing,
unless the level is ``lossy`` (a pure cache), where victims are simply dropped.
"""
from __future__ import annotations

from typing import Iterator, Protocol, Sequence, runtime_checkable

__all__ = ["Level", "Victims"]

Victims = list[tuple[bytes, bytes]]


@runtime_checkable
class Level(Protocol):
    name: str
    shared: bool      # visible to other processes (Redis, a host-shared disk) or not
    lossy: bool       # a pure cache that may drop entries
    may_evict: bool   # set by the manager: False for the store of record

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> Victims: ...

    def delete_many(self, keys: Sequence[bytes]) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[bytes]: ...

    def used_bytes(self) -> int: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...
