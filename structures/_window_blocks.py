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

import os
import time
from typing import Any

import msgpack
import numpy as np

from mlcache.policies.slidem import SlideMPolicy

__all__ = ["Block", "NumericCodec", "GeneralCodec", "BlockRepository"]

_F8 = np.dtype("<f8")


class Block:
    """One block: ``n`` tuples starting at global tuple index ``start``.

    ``ts`` is a float64 array; ``data`` a 2-D float64 array (numeric) or a list of records.
    ``data is None`` when the block is only on disk. ``applied`` counts the tuples already added to
    the aggregates (only the recent block can have ``applied < n``).
    """

    __slots__ = ("seq", "start", "n", "applied", "ts", "data", "slot", "dirty", "nbytes",
                 "first_ts", "last_ts")

    def __init__(self, seq: int, start: int) -> None:
        self.seq = seq
        self.start = start
        self.n = 0
        self.applied = 0
        self.ts: Any = None
        self.data: Any = None
        self.slot = -1
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

    def reopen(self, blk: Block) -> None:
        """Turn a decoded partial block back into a writable recent block."""
        ts = np.empty(self.capacity, _F8)
        data = np.empty((self.capacity, self.ncols), _F8)
        ts[: blk.n] = blk.ts
        data[: blk.n] = blk.data
        blk.ts, blk.data = ts, data


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
        try:
            size = len(self.packer.pack(record)) + 9  # + the float64 timestamp
        except (TypeError, ValueError, OverflowError) as exc:
            from mlcache.errors import SerializationError

            raise SerializationError(f"a window record must be msgpack-encodable: {exc}",
                                     value_type=type(record), level="window") from None
        if size > self.limit:
            raise ValueError(f"record of {size} bytes (encoded) exceeds the block size limit of "
                             f"{self.limit} bytes (block_size={self.block_size})")
        return size

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

    def reopen(self, blk: Block) -> None:
        blk.ts = [float(t) for t in blk.ts]
        blk.data = list(blk.data)


class BlockRepository:
    """Sealed blocks of one stream: buffer pool, data file with free-slot reuse, I/O accounting.

    ``buffer_blocks`` counts every frame, the recent block's included, so the pool policy holds
    ``buffer_blocks - 1`` sealed blocks.
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
        self.blocks: dict[int, Block] = {}  # every live sealed block, resident or not
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
        self.blocks[blk.seq] = blk
        self.resident[blk.seq] = blk
        self.newest = blk.seq
        if len(self.blocks) > self.peak_live:
            self.peak_live = len(self.blocks)
        for victim in self.policy.insert(blk.seq):
            self._evict(victim)

    def get(self, seq: int) -> tuple[Any, Any]:
        """``(ts, data)`` of sealed block ``seq``, read from the data file if not resident.

        The arrays are returned rather than the block because the policy may evict the block
        it has just read (if it is the farthest one) before the caller has used it.
        """
        blk = self.resident.get(seq)
        if blk is not None:
            return blk.ts, blk.data
        return self._read(self.blocks[seq])

    # -- Procedure 2: a block every window has expired gives its slot back --------------------
    def release(self, seq: int) -> None:
        blk = self.blocks.pop(seq)
        self.resident.pop(seq, None)
        self.policy.remove(seq)
        if blk.slot >= 0:
            self.free_slots.append(blk.slot)
        blk.data = blk.ts = None

    def prefetch(self) -> None:
        for seq in self.policy.prefetch_candidates(self.newest):
            if seq in self.blocks:
                self._read(self.blocks[seq])
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
        blk = self.resident.pop(seq)
        if blk.dirty:
            self._write(blk)
        blk.data = blk.ts = None

    def _write(self, blk: Block) -> None:
        if blk.slot < 0:
            if self.free_slots:
                blk.slot = self.free_slots.pop()
            else:
                blk.slot = self.file_slots
                self.file_slots += 1
        buf = self.codec.encode(blk)
        t0 = time.perf_counter()
        os.pwrite(self._fd, buf, blk.slot * self.block_size)
        self.io_seconds += time.perf_counter() - t0
        blk.nbytes = len(buf)
        blk.dirty = False
        self.writes += 1
        self.bytes_written += len(buf)

    def _read(self, blk: Block) -> tuple[Any, Any]:
        t0 = time.perf_counter()
        buf = os.pread(self._fd, blk.nbytes, blk.slot * self.block_size)
        self.io_seconds += time.perf_counter() - t0
        if len(buf) != blk.nbytes:
            from mlcache.errors import IntegrityError

            raise IntegrityError(f"block {blk.seq}: read {len(buf)} of {blk.nbytes} bytes from "
                                 f"{self.path}", level="window")
        self.codec.decode(blk, buf)
        self.reads += 1
        self.bytes_read += len(buf)
        self.resident[blk.seq] = blk
        arrays = blk.ts, blk.data
        for victim in self.policy.insert(blk.seq):
            self._evict(victim)
        return arrays

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
            "live_blocks": len(self.blocks) + (self.recent_n > 0),
            "peak_live_blocks": self.peak_live,
            "file_slots": self.file_slots,
            "free_slots": len(self.free_slots),
        }

    def state(self) -> dict[str, Any]:
        return {
            "blocks": [[b.seq, b.start, b.n, b.slot, b.nbytes] for b in self.blocks.values()],
            "free_slots": self.free_slots,
            "file_slots": self.file_slots,
            "newest": self.newest,
            "io": [self.reads, self.writes, self.bytes_read, self.bytes_written],
        }

    def restore(self, state: dict[str, Any]) -> None:
        for seq, start, n, slot, nbytes in state["blocks"]:
            blk = Block(seq, start)
            blk.n, blk.applied, blk.slot, blk.nbytes = n, n, slot, nbytes
            self.blocks[seq] = blk
        self.free_slots = list(state["free_slots"])
        self.file_slots = state["file_slots"]
        self.newest = state["newest"]
        self.reads, self.writes, self.bytes_read, self.bytes_written = state["io"]
