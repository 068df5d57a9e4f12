"""A block arena level after Pravega's Streaming Cache (release 0.7).

Memory is a set of equal *buffers* (anonymous ``mmap``, default 2 MiB), each cut into equal
*blocks* (default 4 KiB). Block 0 of every buffer holds the metadata of all its blocks, 8 bytes
each, as three packed arrays read through ``memoryview.cast``::

    prev  u32  address of the previous block of the same entry, 0 = first block
    len   u16  bytes used in the block; 0xFFFF marks a free block
    next  u16  on the first and last block of a free run: the run's length

An *address* is ``buffer << shift | block``; address 0 is buffer 0's metadata block, so it
doubles as "none". An entry is a backward-linked chain known by the address of its *last*
block: ``append`` writes into that block's free tail and chains new blocks after it without
touching the rest (Pravega's answer to read-modify-write). Every block of a chain but the last
is full, so the index keeps one int per key, ``length << 33 | contiguous << 32 | last``;
*contiguous* says the blocks follow each other in one buffer, and such an entry is written
with one copy, read with a single slice and freed as one run.

Allocation is O(1) per run (:mod:`mlcache.levels._blocks`): free blocks are kept as merged runs
in size-class lists threaded through the free blocks themselves, and an entry takes the
shortest run that holds it, so nearly every entry is contiguous even after long churn; only
when no run is long enough are the longest runs chained. Buffers are mapped (pages faulted in
at once) only when no block is free, up to the bound, and kept until ``close``.

The bound. ``max_bytes`` is hard and counts everything the level keeps alive: the mapped buffers
(data *and* metadata blocks, whole pages) plus ``BUFFER_OVERHEAD`` each for the Python objects
around them; per entry ``ENTRY_OVERHEAD + len(key)`` for the Python index (dict slot, key
object, address int) and the policy's bookkeeping; and ``LEVEL_OVERHEAD``. The per-entry figure
is the measured worst case (right after a dict resize) of a dict plus an LRU or CLOCK policy;
tests/test_arena.py checks all three against ``tracemalloc``. Keeping the index inside the
arena as an open-addressed table was rejected: every lookup would become a Python-level probe
loop, several times slower than a dict, and the policy would still hold Python keys.

Eviction. The arena owns the accounting; the policy only chooses. Each entry is given to the
policy with weight ``blocks * block_size + index charge`` under a capacity of ``max_bytes``, so
it never evicts on its own; when a write does not fit, the arena asks for victims by shrinking
the policy's capacity to what must remain (``resize``) and restoring it. Victims are read out
and returned as ``(key, value)`` pairs (the Level contract); on the store of record
(``may_evict=False``) a batch that does not fit raises :class:`CapacityError` and changes
nothing, and so does an entry larger than the whole arena anywhere.

Reads copy exactly once, into the ``bytes`` the caller owns (``get_many``); :meth:`view` and
:meth:`segments` are the zero-copy reads (read-only memoryviews, valid until the entry changes).
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

from ..config import ArenaConfig
from ..errors import CapacityError, LevelUnavailableError
from ..policies import get_policy
from ._blocks import _ADDR, _CONTIG, _PAGE, BUFFER_OVERHEAD, BlockStore
from .base import Victims

__all__ = ["ArenaLevel", "ENTRY_OVERHEAD", "BUFFER_OVERHEAD", "LEVEL_OVERHEAD"]

ENTRY_OVERHEAD = 448     # per entry besides len(key): index dict slot, key object, int, policy
LEVEL_OVERHEAD = 16384   # the level object, its lists, lock and an empty policy


def _as_view(value: Any, key: Any) -> Any:
    """A 1-D unsigned-byte view of a bytes-like ``value`` (bytes pass through unchanged)."""
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        view = memoryview(value)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    raise TypeError(f"arena values must be bytes-like, got {type(value).__name__} for key {key!r}")


class ArenaLevel(BlockStore):
    """Serialized entries in preallocated blocks, bounded to the byte (see the module doc)."""

    shared = False

    def __init__(self, config: ArenaConfig | None = None, *, name: str = "arena") -> None:
        cfg = config if config is not None else ArenaConfig()
        self.config = cfg
        self.name = name
        self.lossy = bool(cfg.lossy)
        self.may_evict = True
        self.max_bytes = int(cfg.max_bytes)
        bs = self.block_size = cfg.block_size
        # A small arena gets smaller buffers (never below a page), so that its bound is not
        # spent on one half-used buffer.
        floor = max(_PAGE // bs * bs, 2 * bs)
        size = min(cfg.buffer_size, max(floor, (self.max_bytes // 8) // bs * bs))
        self.buffer_size = size
        self._init_blocks(bs, size, BUFFER_OVERHEAD)
        bpb = self.blocks_per_buffer
        self._lock = threading.Lock()
        self._closed = False
        self._used_blocks = 0
        self._index: dict[bytes, int] = {}
        self._index_bytes = 0
        self._data_bytes = 0
        self._allocated = 0                                  # charged for mapped buffers
        # the fixed charge grows with the block tables (4 bytes per block of a buffer) and the
        # run-list heads (4 bytes per list)
        self._fixed = LEVEL_OVERHEAD + 4 * bpb + 4 * (self._big + 1)
        self._index_room = self.max_bytes - self._fixed   # what the index may use today
        self._policy = get_policy(cfg.policy)(self.max_bytes)
        self._lookup = self._index.get          # bound once: the hot paths skip two lookups
        self._access = self._policy.access
        # Values up to this size always fit an empty arena whatever the key (up to 4 KiB).
        self._small = self._max_blocks(ENTRY_OVERHEAD + 4096) * bs
        self.evictions = 0

    # -- accounting ---------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Bytes held by live entries: their blocks plus their index charge."""
        return self._used_blocks * self.block_size + self._index_bytes

    def memory_bytes(self) -> int:
        """Everything counted against ``max_bytes``: mapped buffers, index, fixed overhead."""
        return self._fixed + self._allocated + self._index_bytes

    @property
    def data_bytes(self) -> int:
        """Sum of the lengths of the live entries."""
        return self._data_bytes

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._index), "data_bytes": self._data_bytes,
            "used_bytes": self.used_bytes(), "memory_bytes": self.memory_bytes(),
            "max_bytes": self.max_bytes, "buffers": len(self._maps),
            "used_blocks": self._used_blocks, "free_blocks": self._free_blocks,
            "evictions": self.evictions,
        }

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

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

    # -- buffers and blocks -------------------------------------------------------------------

    def _drop(self, key: bytes, packed: int) -> None:
        """Forget ``key`` (the policy already has) and free its blocks."""
        del self._index[key]
        size = packed >> 33
        self._data_bytes -= size
        self._used_blocks -= (size + self.block_size - 1) // self.block_size or 1
        self._index_bytes -= ENTRY_OVERHEAD + len(key)
        if packed & _CONTIG:      # one run: give it back whole, merged with its free neighbours
            j = packed & self._mask
            self._free_run((packed & _ADDR) >> self._shift,
                           j - ((size + self.block_size - 1) // self.block_size or 1) + 1, j)
        else:
            self._release(packed)

    # -- eviction -----------------------------------------------------------------------------

    def _make_room(self, blocks: int, charge: int, keep: bytes, sink: Victims | None) -> None:
        """Evict through the policy until ``blocks`` blocks and ``charge`` index bytes fit.

        ``keep`` is never chosen; victims go to ``sink`` as (key, value), or are dropped when
        ``sink`` is None (a lossy store of record).
        """
        policy = self._policy
        while not self._fits(blocks, self._index_bytes + charge):
            if not (self.may_evict or self.lossy) or not any(k != keep for k in self._index):
                raise CapacityError(
                    f"arena {self.name!r} is full: {blocks} more blocks "
                    f"({blocks * self.block_size} bytes) + {charge} index bytes do not fit; "
                    f"{self.memory_bytes()} of max_bytes={self.max_bytes} in use"
                    + ("" if self.may_evict or self.lossy else
                       "; it is the store of record, so nothing was written"),
                    level=self.name, key=keep)
            short = max(0, blocks - self._free_blocks) * self.block_size
            over = self._fixed + self._allocated + self._index_bytes + charge - self.max_bytes
            chosen = policy.resize(max(1, self.used_bytes() - max(short, over, 1)))
            policy.resize(self.max_bytes)
            if not chosen:      # the policy tracks nothing it may give up: oldest other entry
                chosen = [next(k for k in self._index if k != keep)]
                policy.remove(chosen[0])
            self._evict(chosen, sink)

    def _evict(self, keys: list, sink: Victims | None) -> None:
        for victim in keys:
            packed = self._index.get(victim)
            if packed is None:
                continue
            if sink is not None:
                sink.append((victim, self._read(packed)))
            self._drop(victim, packed)
            self.evictions += 1

    def _check_batch(self, items: Sequence[tuple[bytes, Any]]) -> Sequence[tuple[bytes, Any]]:
        """Validate a batch before anything changes; normalise non-bytes values to views.

        Raises TypeError for bad keys/values and CapacityError for an entry larger than the
        arena, or, on a store of record, for a batch that does not fit.
        """
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
            if size > small or len(key) > 4096:
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

    def _closed_lookup(self, key: bytes) -> None:
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise LevelUnavailableError(f"arena {self.name!r} is closed", level=self.name)

    # -- the Level protocol -------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if type(keys) is list and len(keys) == 1:
            return [self.get(keys[0])]      # the manager's common case: one key per read
        with self._lock:
            if self._closed:
                self._check_open()
            index = self._index
            access = self._policy.access
            bs = self.block_size
            shift = self._shift
            mask = self._mask
            maps = self._maps
            out: list[bytes | None] = []
            for key in keys:
                packed = index.get(key)
                if packed is None:
                    out.append(None)
                    continue
                access(key)
                if packed & _CONTIG:
                    # One slice of the mmap: the single copy, into the caller's bytes.
                    size = packed >> 33
                    addr = packed & _ADDR
                    off = ((addr & mask) - (size - 1) // bs) * bs
                    out.append(maps[addr >> shift][off:off + size])
                else:
                    out.append(b"".join(self._segments(packed)))
            return out

    def get(self, key: bytes) -> bytes | None:
        """One key: ``get_many([key])[0]`` without the lists (the hot path)."""
        with self._lock:
            packed = self._lookup(key)
            if packed is None:
                return None
            self._access(key)
            if packed & _CONTIG:
                bs = self.block_size
                size = packed >> 33
                addr = packed & _ADDR
                off = ((addr & self._mask) - (size - 1) // bs) * bs
                return self._maps[addr >> self._shift][off:off + size]
            return b"".join(self._segments(packed))

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> Victims:
        with self._lock:
            if self._closed:
                self._check_open()
            if not isinstance(items, (list, tuple)):
                items = list(items)
            small = self._small
            for key, value in items:
                kind = type(value)
                if type(key) is not bytes or (kind is not bytes and (
                        kind is not memoryview or value.format != "B" or value.ndim != 1)) \
                        or len(value) > small or not (self.may_evict or self.lossy):
                    items = self._check_batch(items)
                    break
            if not (self.may_evict or self.lossy):
                # The whole batch fits (checked); dropping the old values first makes every
                # intermediate state a subset of the final one, so no step can overflow.
                for key, _ in items:
                    old = self._index.get(key)
                    if old is not None:
                        self._policy.remove(key)
                        self._drop(key, old)
            victims: Victims = []
            sink = victims if self.may_evict else None
            store = self._store
            for key, value in items:
                store(key, value, sink)
            if victims and len(items) > 1:
                # A key evicted and then written again by this batch: only its newest value
                # may go below, and none while the newer one is still here.
                last_values = dict(victims)
                victims = [(k, v) for k, v in last_values.items() if k not in self._index]
            return victims

    def put(self, key: bytes, value: bytes) -> Victims:
        """One entry: ``put_many([(key, value)])`` without the batch handling (the hot path)."""
        kind = type(value)
        if type(key) is not bytes or (kind is not bytes and (
                kind is not memoryview or value.format != "B" or value.ndim != 1)) \
                or len(value) > self._small or not self.may_evict:
            return self.put_many([(key, value)])
        with self._lock:
            if self._closed:
                self._check_open()
            victims: Victims = []
            self._store(key, value, victims)
            return victims

    def _store(self, key: bytes, value: Any, sink: Victims | None) -> None:
        """Write one checked entry, evicting into ``sink`` for room (the lock is held)."""
        bs = self.block_size
        shift = self._shift
        mask = self._mask
        index = self._index
        policy = self._policy
        size = len(value)
        blocks = (size + bs - 1) // bs or 1
        charge = ENTRY_OVERHEAD + len(key)
        old = index.get(key)
        if old is not None:
            policy.remove(key)
            if old & _CONTIG and (((old >> 33) + bs - 1) // bs or 1) == blocks:
                # Same number of blocks, in one run: overwrite in place, nothing to allocate.
                last = old & _ADDR
                j = last & mask
                off = (j - blocks + 1) * bs
                self._views[last >> shift][off:off + size] = value
                self._len[last >> shift][j] = size - (blocks - 1) * bs
                index[key] = size << 33 | (old & (_ADDR | _CONTIG))
                self._data_bytes += size - (old >> 33)
                rejected = policy.insert(key, blocks * bs + charge)
                if rejected:
                    self._evict(rejected, sink)
                return
            self._drop(key, old)
        if blocks > self._free_blocks or self._index_bytes + charge > self._index_room:
            if not self._fits(blocks, self._index_bytes + charge):
                self._make_room(blocks, charge, key, sink)
        self._index_bytes += charge
        if blocks < self._big and self._avail >> blocks:
            # The shortest free run that holds the entry: one copy, slice-assigned metadata.
            start = self._take(blocks)[0]
            self._free_blocks -= blocks
            b = start >> shift
            i = start & mask
            j = i + blocks - 1
            off = i * bs
            self._views[b][off:off + size] = value
            lens = self._len[b]
            prevs = self._prev[b]
            if blocks > 1:
                lens[i:j] = self._full_lens[:blocks - 1]
                prevs[i + 1:j + 1] = self._addrs[b][i:j]
            lens[j] = size - (blocks - 1) * bs
            prevs[i] = 0
            last = start + blocks - 1 | _CONTIG
        else:
            data = value if type(value) is not bytes else memoryview(value)
            last = self._chain(data, 0, size, 0)
        index[key] = size << 33 | last
        self._used_blocks += blocks
        self._data_bytes += size
        rejected = policy.insert(key, blocks * bs + charge)
        if rejected:      # an admission policy declined or pushed out entries
            self._evict(rejected, sink)

    def append(self, key: bytes, data: Any) -> Victims:
        """Append ``data`` to entry ``key`` in place; return the victims evicted for room.

        Fills the last block's free tail, then chains new blocks. ``KeyError`` if ``key`` is
        not in the arena; ``CapacityError`` (nothing changed) if the grown entry cannot fit.
        """
        with self._lock:
            if self._closed:
                self._check_open()
            packed = self._index.get(key)
            if packed is None:
                raise KeyError(key)
            data = _as_view(data, key)
            size = len(data)
            bs = self.block_size
            length = packed >> 33
            last = packed & _ADDR
            b = last >> self._shift
            i = last & self._mask
            lens = self._len[b]
            used = lens[i]
            room = bs - used
            policy = self._policy
            if size <= room:
                off = i * bs + used
                self._views[b][off:off + size] = data
                lens[i] = used + size
                self._data_bytes += size
                self._index[key] = packed + (size << 33)
                policy.access(key)
                return []
            blocks = (length + bs - 1) // bs or 1
            extra = (size - room + bs - 1) // bs
            charge = ENTRY_OVERHEAD + len(key)
            error = self._too_big(key, length + size)
            if error is not None:
                raise error
            victims: Victims = []
            if not self._fits(extra, self._index_bytes):
                policy.remove(key)
                try:   # the key keeps its index charge; only the blocks need room
                    self._make_room(extra, 0, key, victims if self.may_evict else None)
                finally:
                    policy.insert(key, blocks * bs + charge)
            view = data if type(data) is not bytes else memoryview(data)
            if room:
                off = i * bs + used
                self._views[b][off:off + room] = view[:room]
                lens[i] = bs
            last = self._chain(view, room, size, last) & (packed | ~_CONTIG)
            blocks += extra
            self._index[key] = (length + size) << 33 | last
            self._used_blocks += extra
            self._data_bytes += size
            rejected = policy.insert(key, blocks * bs + charge)
            if rejected:
                self._evict(rejected, victims if self.may_evict else None)
            return victims

    def delete_many(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            if self._closed:
                self._check_open()
            index = self._index
            remove = self._policy.remove
            for key in keys:
                packed = index.get(key)
                if packed is not None:
                    remove(key)
                    self._drop(key, packed)

    def delete(self, key: bytes) -> None:
        with self._lock:
            if self._closed:
                self._check_open()
            packed = self._index.get(key)
            if packed is not None:
                self._policy.remove(key)
                self._drop(key, packed)

    def scan(self, prefix: bytes) -> Iterator[bytes]:
        with self._lock:
            self._check_open()
            found = [k for k in self._index if k.startswith(prefix)]
        return iter(found)

    def sync(self) -> None:
        """Nothing to make durable: the arena is process memory."""
        self._check_open()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            self._lookup = self._closed_lookup
            self._unmap()
            self._used_blocks = self._allocated = 0
            self._index_bytes = self._data_bytes = 0
            self._index_room = self.max_bytes - self._fixed

    # -- zero-copy reads ----------------------------------------------------------------------

    def segments(self, key: bytes) -> list[memoryview] | None:
        """The entry as read-only memoryviews, one per stretch of adjacent blocks, in order,
        without copying (a contiguous entry is one view).

        Valid until the entry is deleted, replaced, appended to or evicted.
        """
        with self._lock:
            self._check_open()
            packed = self._index.get(key)
            if packed is None:
                return None
            self._policy.access(key)
            return [part.toreadonly() for part in self._segments(packed)]

    def view(self, key: bytes) -> memoryview | None:
        """The entry as one read-only memoryview; zero-copy when its blocks are contiguous.

        Contiguous: every one-block entry and every entry written into a fresh buffer or into
        the blocks one delete freed. Otherwise the blocks are joined into one copy.
        """
        with self._lock:
            self._check_open()
            packed = self._index.get(key)
            if packed is None:
                return None
            self._policy.access(key)
            if not packed & _CONTIG:
                return memoryview(b"".join(self._segments(packed)))
            bs = self.block_size
            size = packed >> 33
            addr = packed & _ADDR
            off = ((addr & self._mask) - (size - 1) // bs) * bs
            return self._views[addr >> self._shift][off:off + size].toreadonly()

    def __enter__(self) -> "ArenaLevel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ArenaLevel(name={self.name!r}, entries={len(self._index)}, "
                f"memory={self.memory_bytes()}/{self.max_bytes})")
