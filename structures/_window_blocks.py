"""The block repository behind sliding windows: fixed-size blocks, a buffer pool, a data file.

A window's tuples live in blocks of ``block_size`` bytes numbered by a sequence number in write
order. The block being filled (the recent, MRW block) is always in memory; sealed blocks are in
the buffer pool or in the data file, where the pool's :class:`~mlcache.policies.slidem.SlideMPolicy`
decides which leave. The data file is an array of block-sized slots: SlideM's Procedure 1 takes a
free slot (or grows the file) when a block is written, Procedure 2 returns the slot of a block
that every window has expired — so the file never grows beyond the largest window.

Two codecs encode tuples:

* :class:`NumericCodec` — records are tuples of ``len(columns)`` numbers, stored as float64
  columns in numpy arrays (timestamps in a column of their own). Appends are numpy row stores and
  aggregates are updated a block at a time with vectorised operations.
* :class:`GeneralCodec` — any msgpack-encodable record; the block fills when the encoded size of
  its records reaches the block size.
"""
from __future__ import annotations

import errno
import os
import time
from array import array
from typing import Any, Iterator

import msgpack
import numpy as np

from mlcache.policies.slidem import SlideMPolicy

__all__ = ["Block", "BlockTable", "NumericCodec", "GeneralCodec", "BlockRepository"]

_F8 = np.dtype("<f8")


class Block:
    """One block: ``n`` tuples starting at global tuple index ``start``.

    ``ts`` is a float64 array; ``data`` a 2-D float64 array (numeric) or a list of records.
    ``data is None`` when the block is only on disk. ``applied`` counts the tuples already added to
    the aggregates (only the recent block can have ``applied < n``).
    """

    __slots__ = ("seq", "start", "n", "applied", "ts", "data", "dirty", "nbytes",
                 "first_ts", "last_ts")

    def __init__(self, seq: int, start: int) -> None:
        self.seq = seq
        self.start = start
        self.n = 0
        self.applied = 0
        self.ts: Any = None
        self.data: Any = None
        self.dirty = False
        self.nbytes = 0
        self.first_ts = 0.0
        self.last_ts = 0.0


class NumericCodec:
    """Records are fixed-width tuples of numbers, packed as float64 columns."""

    kind = "numeric"

    def __init__(self, columns: tuple[str, ...], block_size: int) -> None:
        self.columns = columns
        self.ncols = len(columns)
        self.tuple_size = 8 * (self.ncols + 1)
        self.capacity = block_size // self.tuple_size
        if self.capacity < 1:
            raise ValueError(f"a record of {self.tuple_size} bytes exceeds the block size limit "
                             f"of {block_size} bytes")

    def new_block(self, seq: int, start: int) -> Block:
        blk = Block(seq, start)
        blk.ts = np.empty(self.capacity, _F8)
        blk.data = np.empty((self.capacity, self.ncols), _F8)
        return blk

    def encode(self, blk: Block) -> bytes:
        n = blk.n
        return blk.ts[:n].tobytes() + np.ascontiguousarray(blk.data[:n]).tobytes()

    def decode(self, blk: Block, buf: bytes) -> None:
        n = blk.n
        blk.ts = np.frombuffer(buf, _F8, n)
        blk.data = np.frombuffer(buf, _F8, n * self.ncols, 8 * n).reshape(n, self.ncols)

    def seal(self, blk: Block) -> None:
        if blk.n < self.capacity:  # give the spare rows back (a partial block at close or reopen)
            blk.ts = blk.ts[: blk.n].copy()
            blk.data = blk.data[: blk.n].copy()
        blk.nbytes = blk.n * self.tuple_size

    def full(self, blk: Block) -> bool:
        return blk.n >= self.capacity


class GeneralCodec:
    """Records are any msgpack-encodable objects; a block holds as many as fit its bytes."""

    kind = "general"
    _HEADER = 16  # two msgpack array headers, with room to spare

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.limit = block_size - self._HEADER
        self.packer = msgpack.Packer(use_bin_type=True)

    def new_block(self, seq: int, start: int) -> Block:
        blk = Block(seq, start)
        blk.ts = []
        blk.data = []
        blk.nbytes = self._HEADER
        return blk

    def record_size(self, record: Any) -> int:
        return len(self._pack(record)) + 9  # + the float64 timestamp

    def snapshot(self, record: Any) -> tuple[Any, int]:
        """``(copy, size)``: the record as the block will hold it, decoded from its encoding
        as if read back from the data file, and its size. The window keeps the copy, not the
        caller's object: a dict reused for the next record (``rec["v"] = x; append(rec)``)
        changed every tuple of the recent block before its aggregates were taken."""
        buf = self._pack(record)
        return (msgpack.unpackb(buf, raw=False, use_list=False, strict_map_key=False),
                len(buf) + 9)

    def _pack(self, record: Any) -> bytes:
        try:
            buf = self.packer.pack(record)
        except (TypeError, ValueError, OverflowError) as exc:
            from mlcache.errors import SerializationError

            raise SerializationError(f"a window record must be msgpack-encodable: {exc}",
                                     value_type=type(record), level="window") from None
        if len(buf) + 9 > self.limit:
            raise ValueError(f"record of {len(buf) + 9} bytes (encoded) exceeds the block size "
                             f"limit of {self.limit} bytes (block_size={self.block_size})")
        return buf

    def encode(self, blk: Block) -> bytes:
        return msgpack.packb([blk.ts.tolist(), blk.data], use_bin_type=True)

    def decode(self, blk: Block, buf: bytes) -> None:
        ts, data = msgpack.unpackb(buf, raw=False, use_list=False, strict_map_key=False)
        blk.ts = np.asarray(ts, _F8)
        blk.data = list(data)

    def seal(self, blk: Block) -> None:
        blk.ts = np.asarray(blk.ts, _F8)

    def full(self, blk: Block) -> bool:
        return False  # checked per record against nbytes


class BlockTable:
    """What is known of every live sealed block, in compact arrays (36 bytes a block).

    Live sealed blocks always form one run of sequence numbers: blocks are added at the newest
    end and released from the oldest end, so the table is a few arrays indexed by
    ``seq - base`` with a released prefix compacted from time to time. A window of 30 GB in
    64 KiB blocks costs 17 MB of table rather than the hundreds a Python object per block would.
    """

    def __init__(self) -> None:
        self.base = 0  # sequence number of index 0
        self.dead = 0  # released entries at the front
        self.start = array("q")
        self.first_ts = array("d")
        self.n = array("i")
        self.slot = array("i")
        self.nbytes = array("i")

    def __len__(self) -> int:
        return len(self.start) - self.dead

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and self.dead <= seq - self.base < len(self.start)

    def seqs(self) -> Iterator[int]:
        return iter(range(self.base + self.dead, self.base + len(self.start)))

    def append(self, seq: int, start: int, n: int, first_ts: float, slot: int, nbytes: int) -> None:
        if len(self) == 0:
            self.base, self.dead = seq, 0
            for arr in self._arrays():
                del arr[:]
        elif seq != self.base + len(self.start):
            raise ValueError(f"block {seq} does not follow block {self.base + len(self.start) - 1}")
        self.start.append(start)
        self.first_ts.append(first_ts)
        self.n.append(n)
        self.slot.append(slot)
        self.nbytes.append(nbytes)

    def pop_oldest(self, seq: int) -> int:
        """Forget the oldest block (it must be ``seq``); returns its slot."""
        i = seq - self.base
        if i != self.dead:
            raise ValueError(f"block {seq} is not the oldest live block")
        slot = self.slot[i]
        self.dead += 1
        if self.dead >= 64 and 2 * self.dead >= len(self.start):
            for arr in self._arrays():
                del arr[: self.dead]
            self.base += self.dead
            self.dead = 0
        return slot

    def index(self, seq: int) -> int:
        if seq not in self:
            raise KeyError(seq)
        return seq - self.base

    def nbytes_of_memory(self) -> int:
        return sum(a.itemsize * a.buffer_info()[1] for a in self._arrays())

    def _arrays(self) -> tuple[array, ...]:
        return self.start, self.first_ts, self.n, self.slot, self.nbytes


class BlockRepository:
    """Sealed blocks of one stream: buffer pool, data file with free-slot reuse, I/O accounting.

    ``buffer_blocks`` counts every frame, the recent block's included, so the pool policy holds
    ``buffer_blocks - 1`` sealed blocks. ``table`` describes every live sealed block;
    ``resident`` holds the :class:`Block` objects (with their data) of those in the pool.
    """

    def __init__(self, path: str, block_size: int, buffer_blocks: int, codec: Any) -> None:
        if buffer_blocks < 2:
            raise ValueError(f"buffer_blocks must be at least 2 (one recent, one ancient block), "
                             f"got {buffer_blocks}")
        self.path = path
        self.block_size = block_size
        self.buffer_blocks = buffer_blocks
        self.codec = codec
        self.policy = SlideMPolicy(buffer_blocks - 1)
        self.table = BlockTable()
        self.resident: dict[int, Block] = {}
        self.free_slots: list[int] = []
        self.file_slots = 0
        self.newest = -1  # sequence number of the newest sealed block
        self.reads = self.writes = self.bytes_read = self.bytes_written = 0
        self.prefetches = 0
        self.io_seconds = 0.0
        self.peak_live = 0
        self.recent_n = 0  # tuples in the recent block, kept up to date by the window
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._opened = time.perf_counter()

    # -- Procedure 1: a full recent block enters the pool; the policy may spill it ----------
    def add_sealed(self, blk: Block) -> None:
        self.codec.seal(blk)
        blk.dirty = True
        self.table.append(blk.seq, blk.start, blk.n, blk.first_ts, -1, blk.nbytes)
        self.resident[blk.seq] = blk
        self.newest = blk.seq
        if len(self.table) > self.peak_live:
            self.peak_live = len(self.table)
        for victim in self.policy.insert(blk.seq):
            self._evict(victim)

    def meta(self, seq: int) -> tuple[int, int, float]:
        """``(start, n, first_ts)`` of live sealed block ``seq``."""
        t = self.table
        i = t.index(seq)
        return t.start[i], t.n[i], t.first_ts[i]

    def get(self, seq: int) -> tuple[Any, Any]:
        """``(ts, data)`` of sealed block ``seq``, read from the data file if not resident.

        The arrays are returned rather than the block because the policy may evict the block
        it has just read (if it is the farthest one) before the caller has used it.
        """
        blk = self.resident.get(seq)
        if blk is not None:
            return blk.ts, blk.data
        return self._read(seq)

    # -- Procedure 2: a block every window has expired gives its slot back --------------------
    def release(self, seq: int) -> None:
        slot = self.table.pop_oldest(seq)
        self.resident.pop(seq, None)
        self.policy.remove(seq)
        if slot >= 0:
            self.free_slots.append(slot)

    def prefetch(self) -> None:
        for seq in self.policy.prefetch_candidates(self.newest):
            if seq in self.table:
                self._read(seq)
                self.prefetches += 1

    def flush(self) -> None:
        """Write every dirty resident block (at close, so the data file holds the window)."""
        for blk in list(self.resident.values()):
            if blk.dirty:
                self._write(blk)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- internals -----------------------------------------------------------------------------
    def _evict(self, seq: int) -> None:
        blk = self.resident[seq]
        if blk.dirty:
            self._write(blk)  # first: a block whose write failed stays in memory, dirty
        del self.resident[seq]

    def _write(self, blk: Block) -> None:
        t = self.table
        i = t.index(blk.seq)
        slot = t.slot[i]
        new = slot < 0
        reused = new and bool(self.free_slots)
        if new:  # a slot is taken only once the block is written (a failed write keeps none)
            slot = self.free_slots[-1] if reused else self.file_slots
        buf = self.codec.encode(blk)
        t0 = time.perf_counter()
        written = os.pwrite(self._fd, buf, slot * self.block_size)
        self.io_seconds += time.perf_counter() - t0
        if written != len(buf):
            raise OSError(errno.ENOSPC, f"block {blk.seq}: wrote {written} of {len(buf)} bytes "
                          f"to {self.path}")
        if reused:
            self.free_slots.pop()
        elif new:
            self.file_slots += 1
        t.slot[i] = slot
        t.nbytes[i] = len(buf)
        blk.dirty = False
        self.writes += 1
        self.bytes_written += len(buf)

    def peek(self, seq: int) -> tuple[Any, Any]:
        """``(ts, data)`` of sealed block ``seq`` for a pass over the window (an exact
        recomputation of its sums): read, when not resident, without entering the pool, so
        the SlideM policy's blocks stay where they are."""
        blk = self.resident.get(seq)
        if blk is not None:
            return blk.ts, blk.data
        blk = self._load(seq)
        return blk.ts, blk.data

    def _read(self, seq: int) -> tuple[Any, Any]:
        blk = self._load(seq)
        self.resident[seq] = blk
        arrays = blk.ts, blk.data
        for victim in self.policy.insert(seq):
            self._evict(victim)
        return arrays

    def _load(self, seq: int) -> Block:
        t = self.table
        i = t.index(seq)
        nbytes, slot = t.nbytes[i], t.slot[i]
        t0 = time.perf_counter()
        buf = os.pread(self._fd, nbytes, slot * self.block_size)
        self.io_seconds += time.perf_counter() - t0
        if len(buf) != nbytes:
            from mlcache.errors import IntegrityError

            raise IntegrityError(f"block {seq}: read {len(buf)} of {nbytes} bytes from "
                                 f"{self.path}", level="window")
        blk = Block(seq, t.start[i])
        blk.n = blk.applied = t.n[i]
        blk.first_ts = t.first_ts[i]
        self.codec.decode(blk, buf)
        self.reads += 1
        self.bytes_read += len(buf)
        return blk

    def stats(self) -> dict[str, Any]:
        elapsed = max(time.perf_counter() - self._opened, 1e-9)
        return {
            "reads": self.reads,
            "writes": self.writes,
            "prefetches": self.prefetches,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "reads_per_s": self.reads / elapsed,
            "writes_per_s": self.writes / elapsed,
            "bytes_per_s": (self.bytes_read + self.bytes_written) / elapsed,
            "io_seconds": self.io_seconds,
            "resident_blocks": len(self.resident) + 1,  # + the recent block's frame
            "pool_bytes": (len(self.resident) + 1) * self.block_size,
            "table_bytes": self.table.nbytes_of_memory(),
            "live_blocks": len(self.table) + (self.recent_n > 0),
            "peak_live_blocks": self.peak_live,
            "file_slots": self.file_slots,
            "free_slots": len(self.free_slots),
        }

    def state(self) -> dict[str, Any]:
        t = self.table
        rows = []
        for seq in t.seqs():
            i = seq - t.base
            rows.append([seq, t.start[i], t.n[i], t.first_ts[i], t.slot[i], t.nbytes[i]])
        return {
            "blocks": rows,
            "free_slots": self.free_slots,
            "file_slots": self.file_slots,
            "newest": self.newest,
            "io": [self.reads, self.writes, self.bytes_read, self.bytes_written],
        }

    def restore(self, state: dict[str, Any]) -> None:
        for seq, start, n, first_ts, slot, nbytes in state["blocks"]:
            self.table.append(seq, start, n, first_ts, slot, nbytes)
        self.free_slots = list(state["free_slots"])
        self.file_slots = state["file_slots"]
        self.newest = state["newest"]
        self.reads, self.writes, self.bytes_read, self.bytes_written = state["io"]
