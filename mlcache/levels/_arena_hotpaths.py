"""The arena's hot paths: ``get``, ``get_many`` of one key, ``put`` and ``delete`` as closures.

Every arena operation is Python code, so its cost is counted in calls and attribute lookups
(docs/implementation/arena.md, *Where the time goes*). With ``lru`` the level binds these
closures on the instance in place of the class methods: they read the level's constants and
containers from cells, are called without a bound method, and write out the common case -- a
new or same-size key that fits a free run without eviction, a contiguous entry -- that
:mod:`.arena`'s general methods, :mod:`._arena_bound` and :mod:`._blocks` take several calls
for. Anything else goes to those methods, which take the same decisions. Kept apart because
they repeat, inlined, what the other modules say once; read those first.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import LevelUnavailableError
from ._arena_bound import _SMALL_KEY, ENTRY_OVERHEAD
from ._blocks import _ADDR, _CONTIG, _FREE
from .base import Victims

if TYPE_CHECKING:
    from .arena import ArenaLevel

__all__ = ["bind_hot_paths"]


def bind_hot_paths(arena: ArenaLevel) -> None:
    """Shadow ``get``, ``get_many``, ``put`` and ``delete`` with closures for the common
    case (with ``lru``; another policy keeps the class methods).

    Closures read the level's constants and containers from cells instead of attributes,
    and are called without a bound method. They take the same decisions as the class
    methods and hand anything unusual to them: a miss after close, a non-contiguous
    entry, a value that needs checking, a write that needs eviction or a run split.

    Reads are optimistic, without the lock (the arena's module doc): look the key up, copy the
    entry's bytes with one slice of the mmap, and keep the copy only if the index still
    holds the same ``packed`` object, so nothing changed the entry meanwhile; otherwise
    read again under the lock.

    The closures hold the level only weakly (they are its attributes; a strong reference
    would make a cycle, and an arena dropped without ``close`` would keep its buffers
    mapped until a full collection): the read path never needs it, and the write paths
    take it once per call.
    """
    if arena._policy is not None:
        return
    cls = type(arena)
    ref = weakref.ref(arena)
    locked_get = cls.get
    general_get_many = cls.get_many
    general_put_many = cls.put_many
    lock = arena._lock
    acquire = lock.acquire
    release = lock.release
    index = arena._index
    lookup = index.get
    pop = index.pop
    touch = index.move_to_end                    # type: ignore[attr-defined]
    maps = arena._maps
    views = arena._views
    lens_of = arena._len
    prev_of = arena._prev
    words_of = arena._words
    next_of = arena._next
    heads = arena._heads
    full = arena._full_lens
    free_lens = arena._free_lens
    drop = cls._drop
    unlink = cls._unlink
    push = cls._push
    take = cls._take
    store = cls._store
    release_chain = cls._release

    def level() -> ArenaLevel:
        me = ref()
        if me is None:      # only a closure kept by a caller outlives its level
            raise LevelUnavailableError("arena level is gone (dropped)",
                                        level="arena")
        return me
    bs = arena.block_size
    shift = arena._shift
    mask = arena._mask
    big = arena._big
    wpb = arena._wpb
    bpb = arena.blocks_per_buffer
    small = arena._small
    small_charge = ENTRY_OVERHEAD + _SMALL_KEY
    contig = _CONTIG
    addr_mask = _ADDR
    free = _FREE

    def get(key: bytes) -> bytes | None:
        packed = lookup(key)
        if packed is None:
            me = level()
            if me._closed:
                me._check_open()
            return None
        if packed & contig:
            size = packed >> 33
            addr = packed & addr_mask
            off = ((addr & mask) - (size - 1) // bs) * bs
            try:
                data = maps[addr >> shift][off:off + size]
            except (IndexError, ValueError):   # closed meanwhile: the locked read says so
                return locked_get(level(), key)
            if lookup(key) is packed:          # the entry did not change while copied
                try:
                    touch(key)
                except KeyError:               # deleted since: the read came first
                    pass
                return data
        return locked_get(level(), key)

    def get_many(keys: Sequence[bytes]) -> list[bytes | None]:
        if type(keys) is list and len(keys) == 1:
            key = keys[0]                      # get() written out: the manager's read
            packed = lookup(key)
            if packed is None:
                me = level()
                if me._closed:
                    me._check_open()
                return [None]
            if packed & contig:
                size = packed >> 33
                addr = packed & addr_mask
                off = ((addr & mask) - (size - 1) // bs) * bs
                try:
                    data = maps[addr >> shift][off:off + size]
                except (IndexError, ValueError):
                    return [locked_get(level(), key)]
                if lookup(key) is packed:
                    try:
                        touch(key)
                    except KeyError:
                        pass
                    return [data]
            return [locked_get(level(), key)]
        return general_get_many(level(), keys)

    def put(key: bytes, value: Any) -> Victims:
        me = level()
        kind = type(value)
        if type(key) is not bytes or (kind is not bytes and (
                kind is not memoryview or value.format != "B" or value.ndim != 1)) \
                or not me.may_evict:
            return general_put_many(me, ((key, value),))
        size = len(value)
        charge = ENTRY_OVERHEAD + len(key)
        if size > small or charge > small_charge:   # may not fit at all: checked first
            return general_put_many(me, ((key, value),))
        blocks = (size + bs - 1) // bs or 1
        acquire()
        try:
            if me._closed:
                me._check_open()
            old = lookup(key)
            if old is not None:
                if old & contig and (((old >> 33) + bs - 1) // bs or 1) == blocks:
                    # Same number of blocks, in one run: overwrite in place.
                    last = old & addr_mask
                    b = last >> shift
                    j = last & mask
                    off = (j - blocks + 1) * bs
                    index[key] = last    # not contiguous: lock-free readers wait
                    views[b][off:off + size] = value
                    lens_of[b][j] = size - (blocks - 1) * bs
                    index[key] = size << 33 | contig | last
                    me._data_bytes += size - (old >> 33)
                    touch(key)
                    return []
                drop(me, key, old)
            m = me._avail >> blocks
            if not m or blocks >= big or blocks > me._free_blocks \
                    or me._index_bytes + charge > me._index_room:
                victims: Victims = []
                store(me, key, value, victims)
                return victims
            # The shortest free run that holds the entry (the lowest list at or above it).
            c = blocks + (m & -m).bit_length() - 1
            start = heads[c]
            if c == big:
                tags = next_of[start >> shift]
                i = start & mask
                rest = tags[i] - blocks
                if rest >= big:        # a long run: cut from its tail, it stays linked
                    tags[i] = rest
                    tags[i + rest - 1] = rest
                    start += rest
                else:
                    start = take(me, blocks)[0]
            else:                      # pop the head of an exact-length list
                words = words_of[start >> shift]
                fwd = words[(start & mask) * wpb]
                heads[c] = fwd
                if fwd:
                    words_of[fwd >> shift][(fwd & mask) * wpb + 1] = 0
                else:
                    me._avail &= ~(1 << c)
                if c > blocks:
                    push(me, start + blocks, c - blocks)
            me._free_blocks -= blocks
            b = start >> shift
            i = start & mask
            off = i * bs
            views[b][off:off + size] = value       # the one copy
            lens = lens_of[b]
            j = i + blocks - 1
            if blocks > 1:             # every block but the last is full
                if blocks < 5:
                    lens[i] = bs
                    if blocks > 2:
                        lens[i + 1] = bs
                        if blocks > 3:
                            lens[i + 2] = bs
                else:
                    lens[i:j] = full[:blocks - 1]
            lens[j] = size - (blocks - 1) * bs
            prev_of[b][i] = 0          # first block; the links inside the run are in place
            index[key] = size << 33 | contig | (start + blocks - 1)
            me._index_bytes += charge
            me._used_blocks += blocks
            me._data_bytes += size
            return []
        finally:
            release()

    def delete(key: bytes) -> None:
        me = level()
        acquire()
        try:
            if me._closed:
                me._check_open()
            packed = pop(key, None)
            if packed is None:
                return
            size = packed >> 33
            blocks = (size + bs - 1) // bs or 1
            me._data_bytes -= size
            me._used_blocks -= blocks
            me._index_bytes -= ENTRY_OVERHEAD + len(key)
            if not packed & contig:
                release_chain(me, packed)
                return
            last = packed & addr_mask
            b = last >> shift
            j = last & mask
            i = j - blocks + 1
            lens = lens_of[b]
            if blocks < 5:
                lens[j] = free
                if blocks > 1:
                    lens[i] = free
                    if blocks > 2:
                        lens[i + 1] = free
                        if blocks > 3:
                            lens[i + 2] = free
            else:
                lens[i:j + 1] = free_lens[:blocks]
            prev_of[b][i] = last - blocks      # back to the precomputed link
            me._free_blocks += blocks
            # _merge written out: join the free runs on either side, link the result
            nxt = next_of[b]
            base = b << shift
            stays = False
            if i > 1 and lens[i - 1] == free:
                n = nxt[i - 1]
                i -= n
                if n >= big:          # a long run on the left keeps its place
                    stays = True
                else:
                    unlink(me, base | i, n)
            if j + 1 < bpb and lens[j + 1] == free:
                n = nxt[j + 1]
                unlink(me, base | j + 1, n)
                j += n
            n = j - i + 1
            nxt[i] = n
            nxt[j] = n
            if stays:
                return
            c = n if n < big else big          # _push written out
            head = heads[c]
            words = words_of[b]
            w = i * wpb
            words[w] = head
            words[w + 1] = 0
            if head:
                words_of[head >> shift][(head & mask) * wpb + 1] = base | i
            else:
                me._avail |= 1 << c
            heads[c] = base | i
        finally:
            release()

    arena.get = get                      # type: ignore[method-assign]
    arena.get_many = get_many            # type: ignore[method-assign]
    arena.put = put                      # type: ignore[method-assign]
    arena.delete = delete                # type: ignore[method-assign]
