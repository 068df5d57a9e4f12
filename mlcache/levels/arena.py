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

Eviction. The arena owns the accounting; the policy only chooses. With the default ``lru``
the index itself is the recency order (an ``OrderedDict``: a read is one C ``move_to_end``,
the oldest entries are at its front), so an operation costs no policy calls at all. Any other
policy is a policy object: each entry is given to it with weight ``blocks * block_size + index
charge`` under a capacity of ``max_bytes``, so it never evicts on its own; when a write does
not fit, the arena asks for victims by shrinking the policy's capacity to what must remain
(``resize``) and restoring it. Victims are read out and returned as ``(key, value)`` pairs
(the Level contract); on the store of record (``may_evict=False``) a batch that does not fit
raises :class:`CapacityError` and changes nothing, and so does an entry larger than the whole
arena anywhere. The charges, the fit and the eviction are :mod:`mlcache.levels._arena_bound`.

The hot paths (``put``, ``get``, ``get_many`` of one key, ``delete``) are closures written out
for the common case -- a new or same-size key that fits without eviction in a free run, a
contiguous entry -- and fall back to the general methods otherwise (the per-op cost is Python
work, so every call and attribute lookup shows; see docs/implementation/arena.md). They are
:mod:`mlcache.levels._arena_hotpaths`.

Threads. Writers (put, append, delete, eviction, close) take the level's lock. With ``lru``,
reads do not: they look the key up, copy the entry with one slice of the mmap, and keep the
copy only if the index still holds the *same* ``packed`` int object afterwards; otherwise they
read again under the lock. That is sound because (1) every change to an entry stores a new int
object in the index, and the reader's reference keeps the old one from being reused; (2) an
entry's bytes are only changed after it left the index (delete, eviction, replacement by new
blocks) or after it was marked non-contiguous (an in-place overwrite), and appends only write
past its current length; (3) a slice of the mmap and every index operation are single C calls
under the GIL. Readers move keys to the end of the index, so code under the lock never iterates
the index in Python: it copies what it needs in one C call (:meth:`_oldest`). Other policies
are not thread-safe objects, so with them reads take the lock too.

Reads copy exactly once, into the ``bytes`` the caller owns (``get_many``); :meth:`view` and
:meth:`segments` are the zero-copy reads (read-only memoryviews, valid until the entry changes).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..config import ArenaConfig
from ..errors import ConfigError, LevelUnavailableError
from ..policies import get_policy
from ._arena_bound import _SMALL_KEY, ENTRY_OVERHEAD, LEVEL_OVERHEAD, ArenaBound, _as_view
from ._arena_hotpaths import bind_hot_paths
from ._blocks import _ADDR, _CONTIG, _PAGE, BUFFER_OVERHEAD
from .base import Victims

__all__ = ["ArenaLevel", "ENTRY_OVERHEAD", "BUFFER_OVERHEAD", "LEVEL_OVERHEAD"]



class ArenaLevel(ArenaBound):
    """Serialized entries in preallocated blocks, bounded to the byte (see the module doc)."""

    shared = False

    def __init__(self, config: ArenaConfig | None = None, *, name: str = "arena") -> None:
        cfg = config if config is not None else ArenaConfig()
        self.config = cfg
        self.name = name
        self.lossy = bool(cfg.lossy)
        self.may_evict = True
        self.max_bytes = int(cfg.max_bytes)  # type: ignore[arg-type]  # never None: see ArenaConfig
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
        # ``lru``: the index is the recency order and there is no policy object (module doc)
        lru = cfg.policy == "lru"
        self._index: dict[bytes, int] = OrderedDict() if lru else {}
        self._index_bytes = 0
        self._data_bytes = 0
        self._allocated = 0                                  # charged for mapped buffers
        # the fixed charge grows with the block tables (4 bytes per block of a buffer) and the
        # run-list heads (4 bytes per list)
        self._fixed = LEVEL_OVERHEAD + 4 * bpb + 4 * (self._big + 1)
        self._index_room = self.max_bytes - self._fixed   # what the index may use today
        try:
            policy_cls = get_policy(cfg.policy)
        except ConfigError as exc:
            raise ConfigError("arena.policy", str(exc).split(": ", 1)[-1]) from None
        self._policy = None if lru else policy_cls(self.max_bytes)
        self._lookup: Callable[[bytes], int | None] = self._index.get   # bound once: the hot
        # paths skip two lookups
        self._access = (self._index.move_to_end if lru  # type: ignore[attr-defined]
                        else self._policy.access)
        # Values up to this size always fit an empty arena with any key up to _SMALL_KEY bytes;
        # a longer key or value is checked before anything changes (_check_batch).
        self._small = self._max_blocks(ENTRY_OVERHEAD + _SMALL_KEY) * bs
        self.evictions = 0
        bind_hot_paths(self)

    # -- accounting (what counts against the bound: ``used_bytes``, ``memory_bytes``, in
    # :mod:`._arena_bound`) ---------------------------------------------------------------------

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

    def _closed_lookup(self, key: bytes) -> None:
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise LevelUnavailableError(f"arena {self.name!r} is closed", level=self.name)

    # -- the Level protocol -------------------------------------------------------------------
    #
    # The class methods below are the general, locked code. ``bind_hot_paths`` shadows
    # ``get``, ``get_many``, ``put`` and ``delete`` on the instance with closures written out
    # for the common case (see :mod:`._arena_hotpaths`); they fall back to these methods.

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if type(keys) is list and len(keys) == 1:
            return [self.get(keys[0])]      # the manager's common case: one key per read
        with self._lock:
            if self._closed:
                self._check_open()
            index = self._index
            access = self._access
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
        """One key: ``get_many([key])[0]`` without the lists."""
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
        value: Any
        if type(items) is list and len(items) == 1 and self.may_evict:
            key, value = items[0]      # the manager's write-back of one entry: the hot path
            return self.put(key, value)
        with self._lock:
            if self._closed:
                self._check_open()
            if not isinstance(items, (list, tuple)):
                items = list(items)
            small = self._small
            # An entry larger than the whole arena above another level goes straight to that
            # level, as a victim: refused with CapacityError, it came back to every flush and
            # kept close() from ever succeeding (with the rest of its write-back batch)
            passed: Victims = []
            for key, value in items:
                kind = type(value)
                if type(key) is not bytes or (kind is not bytes and (
                        kind is not memoryview or value.format != "B" or value.ndim != 1)) \
                        or len(value) > small or len(key) > _SMALL_KEY \
                        or not (self.may_evict or self.lossy):
                    items = self._check_batch(items, passed if self.may_evict else None)
                    break
            if not (self.may_evict or self.lossy):
                # The whole batch fits (checked); dropping the old values first makes every
                # intermediate state a subset of the final one, so no step can overflow.
                self._drop_keys(items)
            victims: Victims = []
            sink = victims if self.may_evict else None
            if passed:
                # the older copy here goes too: it would hide the value written below
                self._drop_keys(passed)
            store = self._store
            for key, value in items:
                store(key, value, sink)
            if victims and len(items) > 1:
                # A key evicted and then written again by this batch: only its newest value
                # may go below, and none while the newer one is still here.
                last_values = dict(victims)
                victims = [(k, v) for k, v in last_values.items() if k not in self._index]
            return victims + passed if passed else victims

    def _drop_keys(self, items: Iterable[tuple[bytes, Any]]) -> None:
        """Lock held: drop the stored value of each key of ``items`` (if any), policy too."""
        policy = self._policy
        for key, _ in items:
            old = self._index.get(key)
            if old is not None:
                if policy is not None:
                    policy.remove(key)
                self._drop(key, old)

    def put(self, key: bytes, value: bytes) -> Victims:
        """One entry: ``put_many([(key, value)])`` without the batch handling."""
        kind = type(value)
        if type(key) is not bytes or (kind is not bytes and (
                kind is not memoryview or value.format != "B" or value.ndim != 1)) \
                or len(value) > self._small or len(key) > _SMALL_KEY or not self.may_evict:
            return self.put_many(((key, value),))     # a tuple: the general path
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
            if policy is not None:
                policy.remove(key)
            if old & _CONTIG and (((old >> 33) + bs - 1) // bs or 1) == blocks:
                # Same number of blocks, in one run: overwrite in place, nothing to allocate.
                last = old & _ADDR
                j = last & mask
                off = (j - blocks + 1) * bs
                index[key] = last    # not contiguous: lock-free readers wait for the lock
                self._views[last >> shift][off:off + size] = value
                self._len[last >> shift][j] = size - (blocks - 1) * bs
                index[key] = size << 33 | (old & (_ADDR | _CONTIG))
                self._data_bytes += size - (old >> 33)
                if policy is None:
                    index.move_to_end(key)      # type: ignore[attr-defined]
                    return
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
            if blocks > 1:
                lens[i:j] = self._full_lens[:blocks - 1]
            lens[j] = size - (blocks - 1) * bs
            self._prev[b][i] = 0
            last = start + blocks - 1 | _CONTIG
        else:
            data = value if type(value) is not bytes else memoryview(value)
            last = self._chain(data, 0, size, 0)
        index[key] = size << 33 | last
        self._used_blocks += blocks
        self._data_bytes += size
        if policy is not None:
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
                self._access(key)
                return []
            blocks = (length + bs - 1) // bs or 1
            extra = (size - room + bs - 1) // bs
            charge = ENTRY_OVERHEAD + len(key)
            error = self._too_big(key, length + size)
            if error is not None:
                raise error
            victims: Victims = []
            sink = victims if self.may_evict else None
            if not self._fits(extra, self._index_bytes):
                if policy is None:   # the key keeps its index charge; only the blocks need room
                    self._make_room(extra, 0, key, sink)
                else:
                    policy.remove(key)
                    try:
                        self._make_room(extra, 0, key, sink)
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
            if policy is None:
                self._access(key)
                return victims
            rejected = policy.insert(key, blocks * bs + charge)
            if rejected:
                self._evict(rejected, sink)
            return victims

    def delete_many(self, keys: Sequence[bytes]) -> None:
        if type(keys) is list and len(keys) == 1:
            self.delete(keys[0])
            return
        with self._lock:
            if self._closed:
                self._check_open()
            index = self._index
            policy = self._policy
            for key in keys:
                packed = index.get(key)
                if packed is not None:
                    if policy is not None:
                        policy.remove(key)
                    self._drop(key, packed)

    def delete(self, key: bytes) -> None:
        with self._lock:
            if self._closed:
                self._check_open()
            packed = self._index.get(key)
            if packed is not None:
                if self._policy is not None:
                    self._policy.remove(key)
                self._drop(key, packed)

    def scan(self, prefix: bytes) -> Iterator[bytes]:
        with self._lock:
            self._check_open()
            found = [k for k, _ in self._oldest(len(self._index)) if k.startswith(prefix)]
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
            self._access(key)
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
            self._access(key)
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
