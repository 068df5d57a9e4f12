"""The block store under the arena level: buffers, blocks, chains (after Pravega 0.7).

Memory is a set of equal *buffers* (anonymous ``mmap``), each cut into equal *blocks*. Block 0
of every buffer holds the metadata of all its blocks, 8 bytes each, as three packed arrays read
through ``memoryview.cast``::

    prev  u32  address of the previous block of the same entry, 0 = first block
    len   u16  bytes used in the block; 0xFFFF marks a free block
    next  u16  next free block of this buffer (free blocks only), 0 = end of the list

An *address* is ``buffer << shift | block``; address 0 is buffer 0's metadata block, so it
doubles as "none". An entry is a backward-linked chain known by the address of its last block;
every block but the last is full. Each buffer has an intrusive free list threaded through
``next`` and a queue holds the buffers that have a free block, so taking or returning a block is
O(1). This module only stores; :mod:`mlcache.levels.arena` owns the index, the bound and the
policy.
"""
from __future__ import annotations

import mmap
from array import array
from collections import deque
from typing import Any

__all__ = ["BlockStore", "BUFFER_OVERHEAD"]

BUFFER_OVERHEAD = 1024   # per buffer: the mmap object, memoryviews, list slots (+ 4 B/block)

_FREE = 0xFFFF
_ADDR = 0xFFFFFFFF
_CONTIG = 1 << 32
_PAGE = mmap.PAGESIZE
# Fault a new buffer's pages in with one call rather than one fault per page on first write
# (about twice as fast here): the buffer is preallocated memory, as in Pravega.
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)


class BlockStore:
    """Buffers of blocks and the chains in them; mixed into :class:`ArenaLevel`."""

    block_size: int
    buffer_size: int
    blocks_per_buffer: int
    _allocated: int
    _index_room: int

    def _init_blocks(self, block_size: int, buffer_size: int, buffer_overhead: int) -> None:
        bs = self.block_size = block_size
        size = self.buffer_size = buffer_size
        bpb = self.blocks_per_buffer = size // bs
        self._shift = (bpb - 1).bit_length()
        self._mask = (1 << self._shift) - 1
        # + 4 bytes per block: the buffer's table of block addresses (bulk metadata writes)
        self._buffer_cost = -(-size // _PAGE) * _PAGE + buffer_overhead + 4 * bpb
        self._maps: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        self._prev: list[memoryview] = []
        self._len: list[memoryview] = []
        self._next: list[memoryview] = []
        self._free_head: list[int] = []
        self._free_count: list[int] = []
        self._nonfull: deque[int] = deque()
        self._free_blocks = 0
        self._fresh_next = array("H", [0, *range(2, bpb), 0])
        self._fresh_len = array("H", [_FREE]) * bpb
        self._free_lens = memoryview(self._fresh_len)
        self._full_lens = memoryview(array("H", [bs]) * bpb)
        self._zeros = memoryview(array("I", [0]) * bpb)
        self._succ = memoryview(array("H", range(1, bpb + 1)))
        self._addrs: list[memoryview] = []         # per buffer: the address of each block

    def _new_buffer(self) -> None:
        bpb = self.blocks_per_buffer
        m = mmap.mmap(-1, self.buffer_size, flags=_MAP_FLAGS)
        view = memoryview(m)
        prev = view[0:4 * bpb].cast("I")
        lens = view[4 * bpb:6 * bpb].cast("H")
        nxt = view[6 * bpb:8 * bpb].cast("H")
        lens[:] = self._fresh_len
        nxt[:] = self._fresh_next
        self._nonfull.append(len(self._maps))
        self._maps.append(m)
        self._views.append(view)
        self._prev.append(prev)
        self._len.append(lens)
        self._next.append(nxt)
        base = len(self._addrs) << self._shift
        self._addrs.append(memoryview(array("I", range(base, base + bpb))))
        self._free_head.append(1)
        self._free_count.append(bpb - 1)
        self._free_blocks += bpb - 1
        self._allocated += self._buffer_cost
        self._index_room -= self._buffer_cost

    def _chain(self, data: Any, pos: int, end: int, prev: int) -> int:
        """Write ``data[pos:end]`` into new blocks chained after ``prev`` (0: a new entry).

        Returns the last address, with ``_CONTIG`` set if every new block directly follows its
        predecessor. Takes at least one block (an empty entry still needs an address); the
        caller has made room. Free blocks that follow each other are taken as one run: one
        copy for the data and slice assignments for their metadata, not a loop per block.
        """
        bs = self.block_size
        shift = self._shift
        nonfull = self._nonfull
        full = self._full_lens
        contig = _CONTIG
        taken = 0
        while True:
            if not nonfull:
                self._new_buffer()
            b = nonfull[0]
            head = self._free_head[b]
            count = self._free_count[b]
            nxt = self._next[b]
            lens = self._len[b]
            prevs = self._prev[b]
            view = self._views[b]
            base = b << shift
            done = False
            while count:
                want = (end - pos + bs - 1) // bs or 1
                if want > count:
                    want = count
                i = j = head                   # the run is i..j
                while j - i + 1 < want and nxt[j] == j + 1:
                    j += 1
                k = j - i + 1
                head = nxt[j]
                count -= k
                taken += k
                nbytes = end - pos
                if nbytes > k * bs:
                    nbytes = k * bs
                off = i * bs
                view[off:off + nbytes] = data[pos:pos + nbytes]
                if k > 1:
                    lens[i:j] = full[:k - 1]
                    prevs[i + 1:j + 1] = self._addrs[b][i:j]
                lens[j] = nbytes - (k - 1) * bs
                prevs[i] = prev
                if prev and base + i != prev + 1:
                    contig = 0
                prev = base + j
                pos += nbytes
                if pos >= end:
                    done = True
                    break
            self._free_head[b] = head
            self._free_count[b] = count
            if not count:
                nonfull.popleft()
            if done:
                self._free_blocks -= taken
                return prev | contig

    def _release(self, packed: int) -> None:
        """Return every block of the entry ``packed`` to its buffer's free list.

        The free list is rebuilt so that it hands the blocks out again in their original order
        (head = first block), so a same-sized rewrite stays contiguous. A contiguous entry is
        freed with slice assignments; a scattered one block by block, walking back.
        """
        shift = self._shift
        mask = self._mask
        addr = packed & _ADDR
        if packed & _CONTIG:
            b = addr >> shift
            j = addr & mask
            k = ((packed >> 33) + self.block_size - 1) // self.block_size or 1
            i = j - k + 1
            nxt = self._next[b]
            self._len[b][i:j + 1] = self._free_lens[:k]
            self._prev[b][i:j + 1] = self._zeros[:k]
            if k > 1:
                nxt[i:j] = self._succ[i:j]
            nxt[j] = self._free_head[b]
            self._free_head[b] = i
            count = self._free_count[b]
            if not count:
                self._nonfull.append(b)
            self._free_count[b] = count + k
            self._free_blocks += k
            return
        freed = 0
        while addr:
            b = addr >> shift
            i = addr & mask
            prevs = self._prev[b]
            addr = prevs[i]
            self._len[b][i] = _FREE
            prevs[i] = 0
            self._next[b][i] = self._free_head[b]
            self._free_head[b] = i
            count = self._free_count[b]
            if not count:
                self._nonfull.append(b)
            self._free_count[b] = count + 1
            freed += 1
        self._free_blocks += freed

    def _segments(self, packed: int) -> list[memoryview]:
        bs = self.block_size
        shift = self._shift
        mask = self._mask
        views = self._views
        prevs = self._prev
        addr = packed & _ADDR
        b = addr >> shift
        i = addr & mask
        off = i * bs
        parts = [views[b][off:off + self._len[b][i]]]
        addr = prevs[b][i]
        while addr:
            b = addr >> shift
            i = addr & mask
            off = i * bs
            parts.append(views[b][off:off + bs])
            addr = prevs[b][i]
        parts.reverse()
        return parts

    def _read(self, packed: int) -> bytes:
        if packed & _CONTIG:
            size = packed >> 33
            addr = packed & _ADDR
            off = ((addr & self._mask) - (size - 1) // self.block_size) * self.block_size
            return self._maps[addr >> self._shift][off:off + size]
        return b"".join(self._segments(packed))

    def _unmap(self) -> None:
        """Release every buffer (``close``); a caller's view keeps its mapping alive."""
        self._addrs.clear()
        for group in (self._prev, self._len, self._next, self._views):
            for view in group:
                view.release()
            group.clear()
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass    # a caller still holds a view(); the mapping goes with that view
        self._maps.clear()
        self._nonfull.clear()
        self._free_head.clear()
        self._free_count.clear()
        self._free_blocks = 0
