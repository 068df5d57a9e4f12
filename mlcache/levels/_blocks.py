"""The block store under the arena level: buffers, blocks, chains (after Pravega 0.7).

Memory is a set of equal *buffers* (anonymous ``mmap``), each cut into equal *blocks*. Block 0
of every buffer holds the metadata of all its blocks, 8 bytes each, as three packed arrays read
through ``memoryview.cast``::

    prev  u32  address of the previous block of the same entry, 0 = first block
    len   u16  bytes used in the block; 0xFFFF marks a free block
    next  u16  on the first and last block of a free run: the run's length in blocks

An *address* is ``buffer << shift | block``; address 0 is buffer 0's metadata block, so it
doubles as "none". An entry is a backward-linked chain known by the address of its last block;
every block but the last is full.

``prev`` is kept precomputed: every block that does not start a stretch of an entry (free
blocks included) holds its own address minus one, written once when the buffer is mapped. So
a stretch of k adjacent blocks is linked by writing one ``prev`` (its first block's) and
freeing it restores that one word; the k - 1 links inside it are already in place.

Free space is kept as *runs*: maximal stretches of free blocks of one buffer, their length
written at both ends (boundary tags, so freeing merges with free neighbours in O(1)). Each run
is in the free list of its length (runs of 64 blocks or more share one list, and are cut from
their tail), a doubly-linked list threaded through the first 8 bytes of each run's first block
(free memory, as Pravega threads its free lists through the buffer), with one head per list
and a bitmap of the lists that have runs; linking and unlinking a run is O(1). Allocating k blocks takes the shortest run of at least k (lowest set
bit of ``bitmap >> k``), so an entry is one contiguous run whenever one exists: written with one
copy, read with one slice, freed with one merge. Only when no run is long enough are the
longest runs chained (still one copy each), and only when no block is free is a buffer mapped,
so the bound logic is Pravega's: free blocks first, then new buffers. This module only stores;
:mod:`mlcache.levels.arena` owns the index, :mod:`._arena_bound` the bound and the policy.
"""
from __future__ import annotations

import mmap
from array import array
from typing import Any

__all__ = ["BlockStore", "BUFFER_OVERHEAD"]

BUFFER_OVERHEAD = 1024   # per buffer: the mmap object, memoryviews, list slots

_FREE = 0xFFFF
_ADDR = 0xFFFFFFFF
_CONTIG = 1 << 32
_PAGE = mmap.PAGESIZE
# Fault a new buffer's pages in with one call rather than one fault per page on first write
# (about twice as fast here): the buffer is preallocated memory, as in Pravega.
_BIG = 64                # runs of at least this many blocks share one list
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
        self._buffer_cost = -(-size // _PAGE) * _PAGE + buffer_overhead
        self._wpb = bs // 4                        # u32 words per block
        self._maps: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        self._prev: list[memoryview] = []
        self._len: list[memoryview] = []
        self._next: list[memoryview] = []
        self._words: list[memoryview] = []      # per buffer: the whole buffer as u32 words
        # Runs of up to _BIG - 1 blocks are listed by exact length (best fit); longer ones
        # share the last list and are cut from their tail, so a cut leaves them where they are.
        big = self._big = min(_BIG, bpb)
        self._heads = array("I", [0]) * (big + 1)     # first run of each list (0: none)
        self._avail = 0                    # bit n set: some run of n blocks is free
        self._free_blocks = 0
        self._free_lens = memoryview(array("H", [_FREE]) * bpb)
        self._full_lens = memoryview(array("H", [bs]) * bpb)

    def _new_buffer(self) -> None:
        bpb = self.blocks_per_buffer
        m = mmap.mmap(-1, self.buffer_size, flags=_MAP_FLAGS)
        view = memoryview(m)
        prev = view[0:4 * bpb].cast("I")
        lens = view[4 * bpb:6 * bpb].cast("H")
        nxt = view[6 * bpb:8 * bpb].cast("H")
        lens[:] = self._free_lens
        base = len(self._maps) << self._shift
        # the precomputed links: block i's prev is its own address minus one (module doc)
        prev[1:] = memoryview(array("I", range(base, base + bpb - 1)))
        self._maps.append(m)
        self._views.append(view)
        self._words.append(view.cast("I"))
        self._prev.append(prev)
        self._len.append(lens)
        self._next.append(nxt)
        self._push(base | 1, bpb - 1)
        self._free_blocks += bpb - 1
        self._allocated += self._buffer_cost
        self._index_room -= self._buffer_cost

    # -- runs ---------------------------------------------------------------------------------

    def _push(self, addr: int, n: int) -> None:
        """Link the free run of ``n`` blocks starting at ``addr`` (its blocks already free)."""
        shift = self._shift
        b = addr >> shift
        i = addr & self._mask
        nxt = self._next[b]
        nxt[i] = n
        nxt[i + n - 1] = n
        if n > self._big:
            n = self._big
        heads = self._heads
        head = heads[n]
        w = i * self._wpb
        words = self._words[b]
        words[w] = head
        words[w + 1] = 0
        if head:
            self._words[head >> shift][(head & self._mask) * self._wpb + 1] = addr
        else:
            self._avail |= 1 << n
        heads[n] = addr

    def _unlink(self, addr: int, n: int) -> None:
        """Take the run of ``n`` blocks starting at ``addr`` out of its list."""
        shift = self._shift
        mask = self._mask
        wpb = self._wpb
        words = self._words
        w = (addr & mask) * wpb
        fwd = words[addr >> shift][w]
        back = words[addr >> shift][w + 1]
        if back:
            words[back >> shift][(back & mask) * wpb] = fwd
        else:
            if n > self._big:
                n = self._big
            self._heads[n] = fwd
            if not fwd:
                self._avail &= ~(1 << n)
        if fwd:
            words[fwd >> shift][(fwd & mask) * wpb + 1] = back

    def _take(self, want: int) -> tuple[int, int]:
        """``k`` blocks of the shortest run of at least ``want`` (else of the longest run):
        ``(address, k)``. The rest of the run stays free."""
        avail = self._avail
        if not avail:
            self._new_buffer()
            avail = self._avail
        big = self._big
        m = avail >> want if want < big else 0
        c = (want + (m & -m).bit_length() - 1) if m else avail.bit_length() - 1
        heads = self._heads
        start = heads[c]
        shift = self._shift
        mask = self._mask
        if c == big:
            # The long runs' list: first fit (only a request of `big` blocks or more can miss),
            # cut from the tail so that a run still long stays linked as it is.
            nxt = self._next
            n = nxt[start >> shift][start & mask]
            if n < want:
                words = self._words
                wpb = self._wpb
                h = start
                while n < want:
                    h = words[h >> shift][(h & mask) * wpb]
                    if not h:
                        break
                    hn = nxt[h >> shift][h & mask]
                    if hn > n:
                        start, n = h, hn
            k = want if want < n else n
            rest = n - k
            if rest >= big:
                tags = nxt[start >> shift]
                i = start & mask
                tags[i] = rest
                tags[i + rest - 1] = rest
                return start + rest, k
            self._unlink(start, n)
            if rest:
                self._push(start, rest)
            return start + rest, k
        words = self._words
        wpb = self._wpb
        fwd = words[start >> shift][(start & mask) * wpb]
        heads[c] = fwd
        if fwd:
            words[fwd >> shift][(fwd & mask) * wpb + 1] = 0
        else:
            self._avail = avail & ~(1 << c)
        if c > want:
            self._push(start + want, c - want)
            return start, want
        return start, c

    def _chain(self, data: Any, pos: int, end: int, prev: int) -> int:
        """Write ``data[pos:end]`` into new blocks chained after ``prev`` (0: a new entry).

        Returns the last address, with ``_CONTIG`` set if every new block directly follows its
        predecessor. Takes at least one block (an empty entry still needs an address); the
        caller has made room. An append first extends into the free run right after ``prev``
        (the entry stays one run); then the shortest run that holds the rest is taken, or the
        longest runs one after another. Each run is one copy and slice-assigned metadata.
        """
        bs = self.block_size
        shift = self._shift
        mask = self._mask
        full = self._full_lens
        contig = _CONTIG
        taken = 0
        want = (end - pos + bs - 1) // bs or 1
        start = 0
        if prev and (prev & mask) + 1 < self.blocks_per_buffer \
                and self._len[prev >> shift][(prev & mask) + 1] == _FREE:
            start = prev + 1                       # a run head: its left neighbour is used
            n = self._next[prev >> shift][(prev & mask) + 1]
            self._unlink(start, n)
            k = want if want < n else n
            if n > k:
                self._push(start + k, n - k)
        while pos < end or not taken:
            if not start:
                start, k = self._take(want)
            b = start >> shift
            i = start & mask
            j = i + k - 1
            nbytes = end - pos
            if nbytes > k * bs:
                nbytes = k * bs
            off = i * bs
            self._views[b][off:off + nbytes] = data[pos:pos + nbytes]
            lens = self._len[b]
            prevs = self._prev[b]
            if k > 1:
                lens[i:j] = full[:k - 1]
            lens[j] = nbytes - (k - 1) * bs
            prevs[i] = prev                        # the links inside the stretch are in place
            if prev and start != prev + 1:
                contig = 0
            prev = start + k - 1
            pos += nbytes
            taken += k
            want -= k
            start = 0
        self._free_blocks -= taken
        return prev | contig

    def _free_run(self, b: int, i: int, j: int) -> None:
        """Return blocks ``i..j`` of buffer ``b`` (a used stretch) as one run, merged with
        the free runs on either side."""
        k = j - i + 1
        self._len[b][i:j + 1] = self._free_lens[:k]
        self._prev[b][i] = (b << self._shift | i) - 1      # back to the precomputed link
        self._free_blocks += k
        self._merge(b, i, j)

    def _merge(self, b: int, i: int, j: int) -> None:
        """Link blocks ``i..j`` of buffer ``b``, just marked free, as one run merged with the
        free runs on either side. A long run on the left keeps its place in its list (its
        first block does not move): only its length tags change."""
        lens = self._len[b]
        nxt = self._next[b]
        base = b << self._shift
        stays = False
        if i > 1 and lens[i - 1] == _FREE:
            n = nxt[i - 1]
            i -= n
            if n >= self._big:
                stays = True
            else:
                self._unlink(base | i, n)
        if j + 1 < self.blocks_per_buffer and lens[j + 1] == _FREE:
            n = nxt[j + 1]
            self._unlink(base | j + 1, n)
            j += n
        if stays:
            nxt[i] = nxt[j] = j - i + 1
        else:
            self._push(base | i, j - i + 1)

    def _release(self, packed: int) -> None:
        """Return every block of the entry ``packed``: a contiguous entry as one run, a
        scattered one stretch by stretch, walking back."""
        shift = self._shift
        mask = self._mask
        addr = packed & _ADDR
        if packed & _CONTIG:
            j = addr & mask
            k = ((packed >> 33) + self.block_size - 1) // self.block_size or 1
            self._free_run(addr >> shift, j - k + 1, j)
            return
        while addr:
            b = addr >> shift
            prevs = self._prev[b]
            j = i = addr & mask
            p = prevs[i]
            while p and p == addr - 1:             # same buffer: block 0 is never chained
                addr = p
                i -= 1
                p = prevs[i]
            self._free_run(b, i, j)
            addr = p

    def _segments(self, packed: int) -> list[memoryview]:
        """The entry's bytes as views, one per stretch of adjacent blocks, in order."""
        bs = self.block_size
        shift = self._shift
        mask = self._mask
        views = self._views
        addr = packed & _ADDR
        b = addr >> shift
        end = (addr & mask) * bs + self._len[b][addr & mask]
        parts = []
        while addr:
            b = addr >> shift
            prevs = self._prev[b]
            i = addr & mask
            p = prevs[i]
            while p and p == addr - 1:
                addr = p
                i -= 1
                p = prevs[i]
            parts.append(views[b][i * bs:end])
            addr = p
            end = ((p & mask) + 1) * bs
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
        for group in (self._prev, self._len, self._next, self._words, self._views):
            for view in group:
                view.release()
            group.clear()
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass    # a caller still holds a view(); the mapping goes with that view
        self._maps.clear()
        self._words.clear()
        self._heads = array("I", [0]) * (self._big + 1)
        self._avail = 0
        self._free_blocks = 0
