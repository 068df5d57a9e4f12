"""The arena's bound: what counts against ``max_bytes``, what fits, who leaves, what is refused.

Pravega's Streaming Cache only stores and leaves eviction to its caller; an mlcache level owns
its bound, so this is the part of :class:`~mlcache.levels.arena.ArenaLevel` Pravega does not
have. It is kept apart from the Level protocol because it is one piece of accounting that every
write path shares (the general methods, ``append`` and the hot-path closures):

* the charges: the mapped buffers (from :mod:`._blocks`), ``ENTRY_OVERHEAD + len(key)`` per
  entry for the Python index and the policy, and ``LEVEL_OVERHEAD``;
* whether a write fits (free blocks first, then whole new buffers), and the most one entry
  can ever have;
* eviction: from the front of the ``OrderedDict`` index with ``lru``, else by shrinking the
  policy's capacity to what must remain and restoring it; victims go back as ``(key, value)``;
* the checks that run before a batch changes anything: keys and values, entries larger than
  the whole arena, and a batch that does not fit a store of record.

Mixed into :class:`ArenaLevel`: a method found through the class costs a call nothing more.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Any

from ..errors import CapacityError
from ._blocks import _ADDR, _CONTIG, BlockStore
from .base import Victims

__all__ = ["ENTRY_OVERHEAD", "LEVEL_OVERHEAD", "ArenaBound"]

ENTRY_OVERHEAD = 448     # per entry besides len(key): index dict slot, key object, int, policy
LEVEL_OVERHEAD = 16384   # the level object, its lists, lock and an empty policy
_SMALL_KEY = 4096        # keys up to this long skip the size check with small values


def _as_view(value: Any, key: Any) -> Any:
    """A 1-D unsigned-byte view of a bytes-like ``value`` (bytes pass through unchanged)."""
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        view = memoryview(value)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    raise TypeError(f"arena values must be bytes-like, got {type(value).__name__} for key {key!r}")


class ArenaBound(BlockStore):
    """The accounting against ``max_bytes`` and the eviction that keeps it (module doc)."""

    name: str
    max_bytes: int
    may_evict: bool
    lossy: bool
    evictions: int
    _index: dict[bytes, int]
    _policy: Any
    _fixed: int
    _index_bytes: int
    _used_blocks: int
    _data_bytes: int
    _small: int

    # -- accounting ---------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Bytes held by live entries: their blocks plus their index charge."""
        return self._used_blocks * self.block_size + self._index_bytes

    def memory_bytes(self) -> int:
        """Everything counted against ``max_bytes``: mapped buffers, index, fixed overhead."""
        return self._fixed + self._allocated + self._index_bytes

    def _fits(self, blocks: int, index_bytes: int) -> bool:
        """Would ``blocks`` more blocks fit with the index at ``index_bytes``?"""
        spare = self.max_bytes - self._fixed - self._allocated - index_bytes
        if spare < 0:
            return False
        new_buffers = spare // self._buffer_cost
        return blocks <= self._free_blocks + new_buffers * (self.blocks_per_buffer - 1)

    def _max_blocks(self, charge: int) -> int:
        """The most blocks one entry with this index charge could have in an empty arena."""
        spare = self.max_bytes - self._fixed - charge
        return max(0, spare // self._buffer_cost) * (self.blocks_per_buffer - 1)

    def _too_big(self, key: bytes, size: int) -> CapacityError | None:
        bs = self.block_size
        blocks = (size + bs - 1) // bs or 1
        most = self._max_blocks(ENTRY_OVERHEAD + len(key))
        if blocks <= most:
            return None
        return CapacityError(
            f"arena {self.name!r}: an entry of {size} bytes needs {blocks} blocks of {bs} bytes, "
            f"but max_bytes={self.max_bytes} holds at most {most} blocks ({most * bs} bytes) "
            f"after {self._fixed} bytes of fixed overhead, {self._buffer_cost - self.buffer_size}"
            f" per buffer and {ENTRY_OVERHEAD + len(key)} for this key's index entry",
            level=self.name, key=key)

    def _drop(self, key: bytes, packed: int) -> None:
        """Forget ``key`` (a policy object already has) and free its blocks."""
        del self._index[key]
        bs = self.block_size
        size = packed >> 33
        blocks = (size + bs - 1) // bs or 1
        self._data_bytes -= size
        self._used_blocks -= blocks
        self._index_bytes -= ENTRY_OVERHEAD + len(key)
        if packed & _CONTIG:      # one run: give it back whole, merged with its free neighbours
            j = packed & self._mask
            self._free_run((packed & _ADDR) >> self._shift, j - blocks + 1, j)
        else:
            self._release(packed)

    # -- eviction -----------------------------------------------------------------------------

    def _make_room(self, blocks: int, charge: int, keep: bytes, sink: Victims | None) -> None:
        """Evict through the policy until ``blocks`` blocks and ``charge`` index bytes fit.

        ``keep`` is never chosen; victims go to ``sink`` as (key, value), or are dropped when
        ``sink`` is None (a lossy store of record).
        """
        policy = self._policy
        index = self._index
        bs = self.block_size
        while not self._fits(blocks, self._index_bytes + charge):
            if not (self.may_evict or self.lossy) or len(index) <= (keep in index):
                raise CapacityError(
                    f"arena {self.name!r} is full: {blocks} more blocks "
                    f"({blocks * bs} bytes) + {charge} index bytes do not fit; "
                    f"{self.memory_bytes()} of max_bytes={self.max_bytes} in use"
                    + ("" if self.may_evict or self.lossy else
                       "; it is the store of record, so nothing was written"),
                    level=self.name, key=keep)
            short = max(0, blocks - self._free_blocks) * bs
            over = self._fixed + self._allocated + self._index_bytes + charge - self.max_bytes
            need = max(short, over, 1)
            if policy is None:
                # LRU: the least recently used entries are at the front of the index
                count = 32
                while True:
                    chosen = []
                    left = need
                    front = self._oldest(count)
                    for key, packed in front:
                        if key != keep:
                            chosen.append(key)
                            left -= ((((packed >> 33) + bs - 1) // bs or 1) * bs
                                     + ENTRY_OVERHEAD + len(key))
                            if left <= 0:
                                break
                    if left <= 0 or len(front) < count:
                        break
                    count *= 4
            else:
                chosen = policy.resize(max(1, self.used_bytes() - need))
                policy.resize(self.max_bytes)
                if not chosen:      # the policy tracks nothing it may give up: oldest other
                    chosen = [next(k for k, _ in self._oldest(2) if k != keep)]
                    policy.remove(chosen[0])
            self._evict(chosen, sink)

    def _oldest(self, count: int) -> list[tuple[bytes, int]]:
        """The first ``count`` index items, copied in one C call: lock-free readers move keys
        to the end of the index, so Python code must not iterate over it directly."""
        while True:
            try:
                return list(islice(self._index.items(), count))
            except RuntimeError:    # moved during the copy (only if a finalizer ran): again
                pass

    def _evict(self, keys: list, sink: Victims | None) -> None:
        for victim in keys:
            packed = self._index.get(victim)
            if packed is None:
                continue
            if sink is not None:
                sink.append((victim, self._read(packed)))
            self._drop(victim, packed)
            self.evictions += 1

    # -- checks before a batch changes anything -------------------------------------------------

    def _check_batch(self, items: Sequence[tuple[bytes, Any]],
                     passed: list[tuple[bytes, Any]] | None = None
                     ) -> Sequence[tuple[bytes, Any]]:
        """Validate a batch before anything changes; normalise non-bytes values to views.

        Raises TypeError for bad keys/values and CapacityError for an entry larger than the
        arena, or, on a store of record, for a batch that does not fit. With ``passed`` (a
        level below takes what this one cannot hold), an entry larger than the whole arena
        is moved there instead of raising, with the key's earlier values in the batch (only
        its last value counts); the batch left is returned.
        """
        if passed is not None and any(self._no_room(key, value) for key, value in items):
            last = dict(items)
            big = [key for key, value in last.items() if self._no_room(key, value)]
            passed.extend((key, last[key]) for key in big)
            items = [(key, value) for key, value in last.items() if key not in big]
        small = self._small
        fixed: list[tuple[bytes, Any]] | None = None
        for n, (key, value) in enumerate(items):
            if type(key) is not bytes:
                raise TypeError(f"arena keys must be bytes, got {type(key).__name__}")
            if type(value) is not bytes:
                if fixed is None:
                    fixed = list(items)
                value = _as_view(value, key)
                fixed[n] = (key, value)
            size = len(value)
            if size > small or len(key) > _SMALL_KEY:
                error = self._too_big(key, size)
                if error is not None:
                    raise error
        items = fixed if fixed is not None else items
        if not (self.may_evict or self.lossy):
            # Only the last value of a key counts: an earlier, larger one must not make an
            # intermediate state overflow what the whole batch fits in.
            items = list(dict(items).items())
            self._check_store_of_record(items)
        return items

    def _no_room(self, key: Any, value: Any) -> bool:
        """Whether no arena of this size could hold ``value`` under ``key`` (bad types are
        left to the checks)."""
        return (type(key) is bytes and isinstance(value, (bytes, bytearray, memoryview))
                and (len(value) > self._small or len(key) > _SMALL_KEY)
                and self._too_big(key, len(value)) is not None)

    def _check_store_of_record(self, items: Sequence[tuple[bytes, Any]]) -> None:
        bs = self.block_size
        final = {key: len(value) for key, value in items}
        blocks = charge = 0
        for key, size in final.items():
            blocks += (size + bs - 1) // bs or 1
            old = self._index.get(key)
            if old is None:
                charge += ENTRY_OVERHEAD + len(key)
            else:
                blocks -= ((old >> 33) + bs - 1) // bs or 1
        if not self._fits(max(0, blocks), self._index_bytes + charge):
            raise CapacityError(
                f"arena {self.name!r} is full: a batch of {len(final)} entries needs {blocks} "
                f"more blocks ({blocks * bs} bytes) + {charge} index bytes; "
                f"{self.memory_bytes()} of max_bytes={self.max_bytes} in use; it is the store "
                f"of record, so nothing was written", level=self.name)
