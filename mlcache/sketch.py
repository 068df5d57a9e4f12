"""FrequencySketch: a count-min sketch of 4-bit saturating counters with periodic halving.

TinyLFU (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache Admission Policy",
ACM ToS 2017) asks one question on every admission: "has the candidate been used more often,
recently, than the entry it would replace?" A count-min sketch answers it approximately in a
few bytes per entry:

* ``depth`` = 4 rows of ``width`` counters; a key increments one counter per row (chosen by 4
  multiplicative hashes of one mixed 64-bit hash) and its estimate is the minimum of the 4.
* Counters are 4 bits and saturate at 15: TinyLFU only needs to tell "hot" from "cold", and
  4 bits let ``width = 4 × capacity`` counters per row fit in about one 64-bit word of counters
  per cache entry (``capacity`` words in total), as in Caffeine's ``FrequencySketch``.
* Aging ("reset"): after ``10 × capacity`` increments every counter is halved, so the sketch
  follows a popularity that changes over time instead of remembering all of history.
* Hashing is process-local: a key is mixed with a per-sketch seed by CPython's tuple hash,
  ``hash((key, seed))`` (Python's ``hash`` of the key, which is randomised per process for
  str/bytes, then two xxHash-style rounds in C), and the four rows are double-hashing steps of
  that one value. It is never used for anything that crosses a process boundary.

Cost model (why the API is split in two). Increments are *buffered* by the caller and applied
in batches by :meth:`increment_mixed` / :meth:`increment_hashes`, vectorised with numpy over a
view of the same ``bytearray`` (a dense pass over a small table, touched nibbles only over a
large one). Estimates stay plain Python indexing into the ``bytearray``
(:meth:`frequency_of_mixed`: small-int adds and masks, no 64-bit multiplies), because
admission needs one or two per miss and a numpy call per miss would cost more than it saves.
Callers add the exact count of the increments still in their buffer to an estimate, so
buffering does not blur admission. Numpy's fixed cost per call dominates small batches:
callers should drain thousands of keys at a time, not hundreds. A caller that must never
pause (applying thousands of increments takes ~0.5 ms) counts each use at once with
:meth:`add_hash`, in plain Python, ~2 us a use.

References: Cormode & Muthukrishnan, "An improved data stream summary: the count-min sketch"
(2005); Caffeine's ``FrequencySketch`` (Ben Manes).
"""
from __future__ import annotations

import collections
import marshal
import random
import struct
from itertools import repeat
from typing import Hashable, Iterable

import numpy as np

__all__ = ["FrequencySketch"]


# CPython's tuple hash (an xxHash variant, Objects/tupleobject.c) of a 2-tuple, on numpy uint64
# (which wraps as C's Py_uhash_t does): the drain mixes a batch of keys' own hashes with the
# seed in a few vectorised operations instead of building and hashing one tuple per key.
_XXP1, _XXP2, _XXP5 = (np.uint64(11400714785074694791), np.uint64(14029467366897019727),
                       np.uint64(2870177450012600261))
_LEN2 = np.uint64(2 ^ (2870177450012600261 ^ 3527539))


def _xxround(acc: np.ndarray, lane_p2: np.ndarray | np.uint64) -> np.ndarray:
    """One round: ``acc += lane * P2; rotate left 31; acc *= P1`` (``lane_p2`` is lane * P2)."""
    acc += lane_p2
    acc = (acc << np.uint64(31)) | (acc >> np.uint64(33))
    acc *= _XXP1
    return acc


def _tuple_hash2(h: np.ndarray, seed: int) -> np.ndarray:
    """``hash((x, seed))`` for every ``x`` whose ``hash(x)`` is in ``h`` (int64)."""
    acc = _xxround(h.view(np.uint64) * _XXP2, _XXP5)  # (P5 + lane * P2, without a filled array)
    acc = _xxround(acc, np.uint64((hash(seed) * int(_XXP2)) & 0xFFFFFFFFFFFFFFFF))
    acc += _LEN2
    out = acc.view(np.int64)
    if (out == -1).any():  # (a boolean assignment costs more than this test, even when empty)
        out[out == -1] = 1546275796  # -1 is never a hash
    return out


def _tuple_hash_matches() -> bool:
    """Does :func:`_tuple_hash2` reproduce this interpreter's tuple hash? (It is CPython's
    algorithm since 3.8; elsewhere, or if it ever changes, the drain builds tuples.)"""
    import sys

    if sys.hash_info.width != 64:
        return False
    xs = [0, 1, -1, -2, 2**61, -(2**63), "key", b"k", ("t", 1), 3.5, None]
    for seed in (0, 1, 0x2545F4914F6CDD1D, -12345):
        h = np.array([hash(x) for x in xs], dtype=np.int64)
        if _tuple_hash2(h, seed).tolist() != [hash((x, seed)) for x in xs]:
            return False
    return True


_NP_TUPLE_HASH = _tuple_hash_matches()


# A drain's keys are usually ints, and reading them one by one (``hash`` per key through ``map``,
# then numpy's per-item conversion) was most of its cost. ``marshal.dumps(d, 2)`` walks the dict
# in C and writes each int of 32 bits as b"i" and 4 little-endian bytes (format version 2 has no
# back-references), a fixed stride numpy reads back in one pass. Anything else is written another
# way or refused: a bool, a larger int, a float, a str, and an int subclass (whose hash may not
# be its value's). So when the 2n type bytes are all b"i", every key and count is a
# plain int, and a plain int of 32 bits is its own hash, except hash(-1) == -2.
def _int_items(counts: dict, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The keys' hashes and the counts (int64) of a dict whose keys and values are all plain
    ``int`` of 32 bits, read from its marshal bytes; None for any other dict."""
    try:
        data = marshal.dumps(counts, 2)
    except ValueError:  # an unmarshallable key (or a dict subclass)
        return None
    # b"{", a key and its count per item, b"0": with every type byte b"i" each object is 5 bytes,
    # so the 2n type bytes are every fifth byte from the second (checked in that order, each
    # b"i" proves where the next object starts) and the length is exact.
    if len(data) != 10 * n + 2 or data[1:-1:5] != b"i" * (2 * n):
        return None
    pairs = np.ndarray((n, 2), dtype="<i4", buffer=data, offset=2, strides=(10, 5))
    hashes = pairs[:, 0].astype(np.int64)
    if (hashes == -1).any():
        hashes[hashes == -1] = -2
    return hashes, pairs[:, 1].astype(np.int64)


def _int_items_match() -> bool:
    """Does :func:`_int_items` read this interpreter's marshal bytes right, and refuse what it
    must? (If marshal's format ever changes, drains take the ``hash``-per-key path.)"""

    class Int(int):
        pass

    try:
        d = {0: 1, -1: 15, 2**31 - 1: 300, -(2**31): 2**31 - 1, 77: 65536, -2: 2}
        items = _int_items(d, len(d))
        if items is None or items[0].tolist() != [hash(k) for k in d]:
            return False
        if items[1].tolist() != list(d.values()):
            return False
        refused: list[dict] = [{True: 1}, {2**31: 1}, {1: 2**31}, {-(2**31) - 1: 1},
                               {Int(3): 1}, {1: 1.0}, {1: 1, "a": 1}, {(1, 2): 1},
                               collections.Counter([1])]
        return all(_int_items(x, len(x)) is None for x in refused)
    except Exception:  # anything unforeseen: the slow path
        return False


_MARSHAL_INTS = _NP_TUPLE_HASH and _int_items_match()


def _negative_count(c: np.ndarray) -> ValueError:
    # (a negative count wraps round to a saturated counter: {7: -2} read back as 14)
    return ValueError(f"counts must not be negative, got {int(c.min())}")


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class FrequencySketch:
    """Approximate access counts (0..15) of keys for a cache of about ``capacity`` entries.

    Indexing: a key ``x`` (or, in the ``*_hashes`` API, a key's ``hash``) is mixed with the
    sketch's seed into ``m = hash((x, seed))`` (CPython's tuple hash: two xxHash-style
    multiply-rotate rounds, in C). Row ``r`` uses counter ``(m + r * b) mod width`` with
    ``b = (m >> 32) | 1`` (Kirsch-Mitzenmacher double hashing: one mixed hash, four
    near-independent indices). In Python every step is a small-int add or mask, and numpy
    computes the same indices on ``int64`` (its wrap-around keeps the low bits Python's
    unbounded ints have).
    """

    depth = 4

    def __init__(self, capacity: int, *, sample_factor: int = 10, seed: int | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            from .errors import ConfigError

            raise ConfigError("sketch.capacity", f"must be a positive integer, got {capacity!r}")
        if (isinstance(sample_factor, bool) or not isinstance(sample_factor, int)
                or sample_factor <= 0):
            # (0 or less halved every counter at every increment; a float made the sample a
            # float)
            from .errors import ConfigError

            raise ConfigError("sketch.sample_factor",
                              f"must be a positive integer, got {sample_factor!r}")
        self._seed = random.getrandbits(62) if seed is None else int(seed)
        self._sample_factor = sample_factor
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.width = _pow2_at_least(max(16, 4 * capacity))  # counters per row
        self.mask = self.width - 1
        # 4 rows x width nibbles in 2 x width bytes. Counter i of row r is nibble r & 1 (low,
        # high) of byte (r >> 1) * width + i: rows 0 and 1 share the first half, rows 2 and 3
        # the second, so reading one counter in Python is an index and one mask or shift (with
        # a row per byte range it took five more operations, and estimates are most of a miss).
        self.table = bytearray(self.depth * self.width // 2)
        self._np = np.frombuffer(self.table, dtype=np.uint8)
        self._acc = np.zeros(self.depth * self.width, dtype=np.int16)  # reused, kept all-zero
        self.sample_size = self._sample_factor * capacity
        self.additions = 0
        self.resets = 0
        # Flat nibble index (2 x byte + nibble) of counter i of row r: 2 i + _offsets[r].
        w = self.width
        self._offsets = np.array([0, 1, 2 * w, 2 * w + 1], dtype=np.int64).reshape(self.depth, 1)
        # The dense drain's split index instead: the low nibbles of all bytes, then the high
        # ones (counter i of row r: i + _split[r]), so its passes are contiguous, not strided.
        self._split = [0, 2 * w, w, 3 * w]
        self._steps = np.arange(self.depth, dtype=np.int64).reshape(self.depth, 1)

    def __getstate__(self) -> dict:
        # ``_np`` is a view of ``table``: pickled or deep-copied, it became an array of its own,
        # so the copy's increments and halvings went to it while estimates read the table (a
        # copied sketch, and the W-TinyLFU policy or TinyLFUCache holding it, never counted
        # again). The view is rebuilt over the copy's table instead.
        state = self.__dict__.copy()
        del state["_np"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._np = np.frombuffer(self.table, dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        """Memory the sketch keeps: the counter table and the drain's scratch counters (a
        bytes-bounded heap takes it off its capacity)."""
        return len(self.table) + self._acc.nbytes

    def ensure_capacity(self, capacity: int) -> None:
        """Grow (and clear) the sketch when the cache holds more entries than it was sized for."""
        if capacity > self.capacity:
            self._allocate(_pow2_at_least(capacity))

    # -- mixing ---------------------------------------------------------------------------------

    def mix(self, x: Hashable) -> int:
        """The mixed hash of a key (or of a key's hash) that indexes the rows."""
        return hash((x, self._seed))

    def mix_many(self, xs: Iterable[Hashable]) -> list[int]:
        return list(map(hash, zip(xs, repeat(self._seed))))

    # -- estimates (plain Python, exact same arithmetic as the numpy path) --------------------

    def frequency(self, key: Hashable) -> int:
        """The estimate of ``key``, as counted by :meth:`increment`, :meth:`increment_many`
        and :meth:`increment_counts` (a key mixed as itself: ``frequency_of_mixed(mix(key))``).
        Counts made by hash (:meth:`increment_hashes`) are read with :meth:`frequency_of_hash`."""
        return self.frequency_of_mixed(hash((key, self._seed)))

    def frequency_of_hash(self, h: int) -> int:
        return self.frequency_of_mixed(hash((h, self._seed)))

    def frequency_of_mixed(self, m: int) -> int:
        t, w, mask = self.table, self.width, self.mask
        i = m & mask  # from here on small ints (a 64-bit int is a multi-digit PyLong)
        b = ((m >> 32) | 1) & mask
        f = t[i] & 15  # row 0: low nibbles of the first half
        i = (i + b) & mask
        c = t[i] >> 4  # row 1: high nibbles of the first half
        if c < f:
            f = c
        i = (i + b) & mask
        c = t[i + w] & 15  # row 2: low nibbles of the second half
        if c < f:
            f = c
        i = (i + b) & mask
        c = t[i + w] >> 4  # row 3: high nibbles of the second half
        return c if c < f else f

    def add_hash(self, h: int) -> int:
        """Count one more use of the key whose ``hash`` is ``h`` now, in plain Python, and
        return its estimate after it (as :meth:`frequency_of_hash` would read it).

        For a caller that must not pause: a numpy batch has a fixed cost of ~100 us here, and
        a caller that buffers thousands of increments pays ~0.5 ms in whichever call applies
        them (the prefetcher's hot-key filter did, on the record being read ahead: that record
        was in the keyed path's p999). This costs ~2 us every time instead. Same counters as
        the batched path: a saturated counter stays at 15, and a use counts towards aging only
        if one of its counters was below 15.
        """
        m = hash((h, self._seed))
        t, w, mask = self.table, self.width, self.mask
        i = m & mask
        b = ((m >> 32) | 1) & mask
        x = t[i]                  # row 0: low nibble of the first half
        c = x & 15
        live = c < 15
        if live:
            t[i] = x + 1
            c += 1
        f = c
        i = (i + b) & mask
        x = t[i]                  # row 1: high nibble of the first half
        c = x >> 4
        if c < 15:
            t[i] = x + 16
            c += 1
            live = True
        if c < f:
            f = c
        i = (i + b) & mask
        j = i + w
        x = t[j]                  # row 2: low nibble of the second half
        c = x & 15
        if c < 15:
            t[j] = x + 1
            c += 1
            live = True
        if c < f:
            f = c
        i = (i + b) & mask
        j = i + w
        x = t[j]                  # row 3: high nibble of the second half
        c = x >> 4
        if c < 15:
            t[j] = x + 16
            c += 1
            live = True
        if c < f:
            f = c
        if live:
            self.additions += 1
            if self.additions >= self.sample_size:
                self.reset()
                return self.frequency_of_mixed(m)
        return f

    # -- increments (batched, numpy) ------------------------------------------------------------

    def increment(self, key: Hashable) -> None:
        self.increment_mixed([hash((key, self._seed))])

    def increment_many(self, keys: Iterable[Hashable]) -> None:
        self.increment_mixed(self.mix_many(keys))

    def increment_hashes(self, hashes: list[int], counts: list[int] | None = None) -> None:
        """Count ``counts[i]`` (default 1) more uses of the key whose ``hash`` is ``hashes[i]``.

        With ``counts``, the hashes must be distinct (callers aggregate, e.g. in a dict). A hash
        is mixed as a key in its own right, which is not how the key itself is mixed (for most
        str keys ``hash(hash(x)) != hash(x)``): read these counts with
        :meth:`frequency_of_hash`, never :meth:`frequency`.
        """
        self.increment_mixed(self.mix_many(hashes), counts)

    def increment_counts(self, counts: dict[Hashable, int]) -> None:
        """Count ``counts[x]`` more uses of each key ``x``, saturating at 15.

        The buffered form callers use (a dict of exact pending counts). Int keys and counts are
        read from the dict's ``marshal`` bytes (see :func:`_int_items`); other keys' hashes go
        through ``np.fromiter`` and their counts through ``struct``: no intermediate lists
        (building numpy arrays from Python lists was most of a drain's cost). Either way the
        hashes are mixed with the seed in numpy.

        Read these keys' estimates with :meth:`frequency` (or ``frequency_of_mixed(mix(x))``,
        as W-TinyLFU does), like those of :meth:`increment` and :meth:`increment_many`.
        """
        n = len(counts)
        if not n:
            return
        # (The first key's type spares a dict of, say, str keys a marshal pass only to refuse it.)
        if _MARSHAL_INTS and type(next(iter(counts))) is int:
            items = _int_items(counts, n)
            if items is not None:
                if items[1].min() < 0:
                    raise _negative_count(items[1])
                self._apply(_tuple_hash2(items[0], self._seed), items[1])
                return
        if _NP_TUPLE_HASH:  # the same mixed hashes, vectorised (2x faster than tuples)
            mixed = _tuple_hash2(np.fromiter(map(hash, counts), np.int64, n), self._seed)
        else:
            mixed = np.fromiter(map(hash, zip(counts, repeat(self._seed))), np.int64, n)
        # The counts (small ints, shared objects) through struct: ~80 fewer machine
        # instructions a key than np.fromiter's per-item conversion. (Not the hashes: each is
        # a new int, and a tuple of thousands of them costs more in cache misses than it saves.)
        counts_arr = np.frombuffer(bytearray(struct.pack("%dq" % n, *counts.values())), np.int64)
        if counts_arr.min() < 0:
            raise _negative_count(counts_arr)
        self._apply(mixed, counts_arr)

    def increment_mixed(self, mixed: list[int], counts: list[int] | None = None) -> None:
        """:meth:`increment_hashes` for mixed hashes (:meth:`mix`), saturating at 15."""
        if not mixed:
            return
        m = np.fromiter(mixed, np.int64, len(mixed))
        if counts is None:  # repeated keys: one update of their summed count
            m, c = np.unique(m, return_counts=True)
        else:
            # Checked before anything is counted: a single count broadcast over every key and
            # the table was written before the length mismatch raised (IndexError), and a
            # negative count wraps round to a saturated counter, and over a large table also
            # sets the other counter of its byte to 15.
            c = np.fromiter(counts, np.int64, len(counts))
            if len(c) != len(m):
                raise ValueError(f"counts: {len(c)} counts for {len(m)} keys (one each)")
            if c.min() < 0:
                raise ValueError(f"counts must not be negative, got {int(c.min())}")
        self._apply(m, c)

    def _apply(self, m: np.ndarray, c: np.ndarray) -> None:
        """Add ``c[i]`` to the counters of mixed hash ``m[i]`` (distinct), then age if due."""
        np.minimum(c, 15, out=c)
        n = len(m)
        mask = self.mask
        # Row r's counter is (m + r*b) mod width: running sums of b from row 0 (no (4, n)
        # temporaries of 64-bit products; |b| < 2**31, so no sum wraps), masked in one pass at
        # the end, then made an index into the nibbles (see _allocate).
        idx: np.ndarray = np.empty((self.depth, n), dtype=np.intp)
        np.bitwise_and(m, mask, out=idx[0])
        b = (m >> 32) | 1
        for r in range(1, self.depth):
            np.add(idx[r - 1], b, out=idx[r])
        rows = idx[1:]
        np.bitwise_and(rows, mask, out=rows)
        table = self._np
        size = 2 * len(table)
        if size <= 16 * self.depth * n:
            # Small table (the common case: a batch touches a good part of it): one dense pass.
            # add.at sums the increments of keys sharing a counter (3x faster than the
            # float-weighted bincount it replaces); nibbles are unpacked, added, saturated and
            # packed back with whole-array operations, on the split layout (all low nibbles,
            # then all high ones: contiguous passes, where interleaved nibbles made them
            # strided).
            # (A row at a time: numpy's broadcast add of a (4, 1) column took 4x as many
            # instructions.)
            for r in range(1, self.depth):
                idx[r] += self._split[r]
            idx = idx.ravel()
            half = len(table)
            # Counters are unpacked into a wider scratch array and add.at adds straight into
            # it, then one clamp: no separate zeroed int32 accumulator to clamp, cast and add
            # (the array holds at most 15 + 15 x the keys sharing a counter, so uint16 cannot
            # wrap for batches under 4,368 keys; larger ones take int32). With np.take below:
            # ~4.45M -> ~4.21M instructions a drain of ~3,700 keys (callgrind), same table.
            wide = np.uint16 if n < 4368 else np.int32
            nib = np.empty(size, dtype=wide)
            np.bitwise_and(table, 15, out=nib[:half])
            np.right_shift(table, 4, out=nib[half:])
            if nib.max() < 15:
                # No counter is saturated, as after a halving (on the Zipf bench every drain
                # of W-TinyLFU's follows one): every key counts, and the gather below (~190,000
                # instructions for ~3,700 keys) is not needed.
                live = None
            else:
                # (np.take, not nib[idx]: fancy indexing goes through numpy's generic MapIter.)
                live = nib.take(idx).reshape(self.depth, n).min(axis=0) < 15  # saturated: no add
            inc = np.empty((self.depth, n), dtype=wide)  # c, once per row
            # (broadcast: np.tile is Python code, a few us per call; c narrowed first, as a
            # broadcast that also casts takes 4x the instructions)
            inc[:] = c.astype(wide)
            np.add.at(nib, idx, inc.ravel())
            # Against an array of 15s: numpy's minimum with a scalar is a plain loop (~8
            # instructions a counter), with two arrays a SIMD one (~1). Made per drain: kept,
            # it would take 4x the table's memory.
            fifteen = np.empty(size, dtype=wide)
            fifteen.fill(15)
            np.minimum(nib, fifteen, out=nib)
            hi = np.left_shift(nib[half:], 4, out=nib[half:])
            np.bitwise_or(nib[:half], hi, out=table, casting="unsafe")  # <= 0xFF: fits
            total = int(c.sum() if live is None else c[live].sum())
        else:
            idx <<= 1  # the flat nibble index (see _allocate)
            idx += self._offsets
            total = self._increment_sparse(idx.ravel(), c, n)
        self.additions += total
        if self.additions >= self.sample_size:
            self.reset()

    def _increment_sparse(self, idx: np.ndarray, c: np.ndarray, n: int) -> int:
        """Update only the touched nibbles (a large table); returns the additions counted."""
        idx = idx.astype(np.intp)
        # Sum the increments per counter in a scratch array (add.at handles two keys sharing a
        # counter without sorting), then write each touched nibble's saturated value. Even and
        # odd nibbles are written in separate passes so no byte is rewritten within a pass;
        # duplicates of one nibble write the same value.
        acc = self._acc
        inc = np.empty((self.depth, n), dtype=np.int16)
        inc[:] = c
        np.add.at(acc, idx, inc.ravel())
        table = self._np
        byte = idx >> 1
        odd = (idx & 1).astype(bool)
        cur = np.where(odd, table[byte] >> 4, table[byte] & 15).astype(np.int16)
        live = cur.reshape(self.depth, n).min(axis=0) < 15  # Caffeine: saturated != addition
        new = np.minimum(cur + acc[idx], 15).astype(np.uint8)
        acc[idx] = 0
        even = ~odd
        be = byte[even]
        table[be] = (table[be] & 0xF0) | new[even]
        bo = byte[odd]
        table[bo] = (table[bo] & 0x0F) | (new[odd] << 4)
        return int(c[live].sum())

    def reset(self) -> None:
        """Halve every counter (the aging step)."""
        table = self._np
        np.right_shift(table, 1, out=table)
        np.bitwise_and(table, 0x77, out=table)
        self.additions //= 2
        self.resets += 1

    def clear(self) -> None:
        self._np[:] = 0
        self.additions = 0
