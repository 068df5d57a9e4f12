"""The Level protocol: what every byte level below the heap implements.

Batch calls are the contract (one pipeline, one transaction per call); one-key calls are
conveniences built on them. Keys are canonical bytes (see :mod:`mlcache.keys`), values are
bytes produced by :mod:`mlcache.codec`.

Overflow: a level bounded in bytes (``max_bytes``) makes room by evicting its own victims and
*returns* them from ``put_many`` so the manager can write them to the level below before they
are gone for good. The manager sets ``may_evict = False`` on the last level (the store of
record): there a full level raises :class:`~mlcache.errors.CapacityError` and changes nothing,
unless the level is ``lossy`` (a pure cache), where victims are simply dropped.

Holding victims (optional, :class:`HoldsVictims`): a shared level evicting in a transaction
of its own would remove a victim before the level below holds it, and another process reading
the key in between would find the older copy below. The write-back therefore calls
``hold_victims()`` on every such level above the last: from then on its ``put_many`` leaves the
victims it reads stored and returns them as :class:`HeldVictims`; the caller writes them to
the level below, then calls ``release(victims)``, which removes each one only if the level
still holds the very bytes it returned (a newer value written meanwhile stays, above the
older copy below); ``release(victims, remove=False)`` when writing them below failed: they
stay. Until then the level is over its bound by at most the held victims' size, and no other
writer evicts a held victim (one process at a time hands a key down).
"""
from __future__ import annotations

from typing import Iterator, Protocol, Sequence, runtime_checkable

__all__ = ["HeldVictims", "HoldsVictims", "Level", "Victims"]

Victims = list[tuple[bytes, bytes]]


class HeldVictims(list[tuple[bytes, bytes]]):
    """Victims a level holding them returns: ``(key, value)`` to write below, as any victims.

    ``held``: the ``(key, stored value)`` pairs the level still stores, which ``release``
    removes if unchanged: the victims it evicts, and the older copy of a key whose new value
    it passed through (larger than the level: not stored, so the pair holds the older value).
    ``passed``: the victims the level did not store (passed through); if their older copies
    cannot be released they must be written to the level again (see ``WriteBack``)."""

    __slots__ = ("held", "passed")

    def __init__(self, victims: Victims, held: Victims, passed: Victims) -> None:
        super().__init__(victims)
        self.held = held
        self.passed = passed


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


@runtime_checkable
class HoldsVictims(Protocol):
    """A level that can keep its victims until the level below holds them (see above)."""

    def hold_victims(self) -> None: ...

    def release(self, victims: HeldVictims, remove: bool = True) -> None: ...
