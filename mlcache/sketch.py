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
* Hashing is process-local (Python's ``hash`` mixed with a per-sketch random seed): cheap, and
  a different seed per sketch means an attacker cannot precompute colliding keys. It is never
  used for anything that crosses a process boundary.

Cost model (why the API is split in two). A Python-level count-min increment costs ~1 µs (four
index computations and nibble updates). Increments are therefore *buffered* by the caller and
applied in batches by :meth:`increment_hashes`, vectorised with numpy over a view of the same
``bytearray`` (~0.1 µs per key amortised). Estimates stay plain Python indexing into the
``bytearray`` (:meth:`frequency_of_hash`, ~0.5 µs), because admission needs exactly two per miss
and a numpy call per miss would cost more than it saves. Callers add the exact count of the
increments still in their buffer to an estimate, so buffering does not blur admission.

References: Cormode & Muthukrishnan, "An improved data stream summary: the count-min sketch"
(2005); Caffeine's ``FrequencySketch`` (Ben Manes).
"""
from __future__ import annotations

import random
from typing import Hashable, Iterable

import numpy as np

__all__ = ["FrequencySketch"]

_M64 = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # golden-ratio multiplier: spreads small integers over 64 bits
# One odd multiplier per row: four multiplicative ("Fibonacci") hashes of the mixed hash.
_ROWS = (0xC3A5C85C97CB3127, 0xB492B66FBE98F273, 0x9AE16A3B2F90404F, 0xCBF29CE484222325)
_ROWS_NP = np.array(_ROWS, dtype=np.uint64).reshape(4, 1)
# One odd multiplier per row: four "independent" multiplicative hashes of the mixed hash.


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class FrequencySketch:
    """Approximate access counts (0..15) of keys for a cache of about ``capacity`` entries."""

    depth = 4

    def __init__(self, capacity: int, *, sample_factor: int = 10, seed: int | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            from .errors import ConfigError

            raise ConfigError("sketch.capacity", f"must be a positive integer, got {capacity!r}")
        self._seed = (random.getrandbits(64) if seed is None else seed) & _M64
        self._sample_factor = sample_factor
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.width = _pow2_at_least(max(16, 4 * capacity))  # counters per row
        self._shift = 64 - (self.width.bit_length() - 1)
        # 4 rows x width nibbles = 2 x width bytes per row; row r starts at nibble r * width.
        self.table = bytearray(self.depth * self.width // 2)
        self._np = np.frombuffer(self.table, dtype=np.uint8)
        self._acc = np.zeros(self.depth * self.width, dtype=np.int16)  # reused, kept all-zero
        self.sample_size = self._sample_factor * capacity
        self.additions = 0
        self.resets = 0
        self._offsets = np.arange(self.depth, dtype=np.uint64).reshape(4, 1) * np.uint64(self.width)
        self._seed_np = np.uint64(self._seed)
        self._offsets = np.arange(self.depth, dtype=np.uint64).reshape(4, 1) * np.uint64(self.width)

    def ensure_capacity(self, capacity: int) -> None:
        """Grow (and clear) the sketch when the cache holds more entries than it was sized for."""
        if capacity > self.capacity:
            self._allocate(_pow2_at_least(capacity))

    # -- estimates (plain Python, exact same arithmetic as the numpy path) --------------------

    def frequency(self, key: Hashable) -> int:
        return self.frequency_of_hash(hash(key))

    def frequency_of_hash(self, h: int) -> int:
        h = (((h ^ self._seed) & _M64) * _MIX) & _M64
        h ^= h >> 32
        s, w, t = self._shift, self.width, self.table
        r0, r1, r2, r3 = _ROWS
        i = ((h * r0) & _M64) >> s
        f = (t[i >> 1] >> ((i & 1) << 2)) & 15
        i = (((h * r1) & _M64) >> s) + w
        c = (t[i >> 1] >> ((i & 1) << 2)) & 15
        if c < f:
            f = c
        i = (((h * r2) & _M64) >> s) + 2 * w
        c = (t[i >> 1] >> ((i & 1) << 2)) & 15
        if c < f:
            f = c
        i = (((h * r3) & _M64) >> s) + 3 * w
        c = (t[i >> 1] >> ((i & 1) << 2)) & 15
        return c if c < f else f

    # -- increments (batched, numpy) ------------------------------------------------------------

    def increment(self, key: Hashable) -> None:
        self.increment_hashes([hash(key)])

    def increment_many(self, keys: Iterable[Hashable]) -> None:
        self.increment_hashes(list(map(hash, keys)))

    def increment_hashes(self, hashes: list[int], counts: list[int] | None = None) -> None:
        """Count ``counts[i]`` (default 1) more uses of ``hashes[i]``, saturating at 15.

        With ``counts``, the hashes must be distinct (callers aggregate, e.g. in a dict).
        """
        if not hashes:
            return
        h = np.array(hashes, dtype=np.int64).view(np.uint64)
        if counts is None:  # repeated keys: one update of their summed count
            h, c = np.unique(h, return_counts=True)
            c = c.astype(np.int16)
        else:
            c = np.minimum(np.array(counts, dtype=np.int64), 15).astype(np.int16)
        n = len(h)
        h = (h ^ self._seed_np) * np.uint64(_MIX)
        h ^= h >> np.uint64(32)
        idx = ((h.reshape(1, n) * _ROWS_NP) >> np.uint64(self._shift)) + self._offsets
        idx = idx.ravel().astype(np.intp)
        # Sum the increments per counter in a scratch array (add.at handles two keys sharing a
        # counter without sorting), then write each touched nibble's saturated value. Even and
        # odd nibbles are written in separate passes so no byte is rewritten within a pass;
        # duplicates of one nibble write the same value.
        acc = self._acc
        np.add.at(acc, idx, np.tile(c, self.depth))
        table = self._np
        byte = idx >> 1
        odd = (idx & 1).astype(bool)
        cur = np.where(odd, table[byte] >> 4, table[byte] & 15).astype(np.int16)
        live = cur.reshape(self.depth, n).min(axis=0) < 15  # Caffeine: saturated != addition
        total = int(c[live].sum())
        new = np.minimum(cur + acc[idx], 15).astype(np.uint8)
        acc[idx] = 0
        even = ~odd
        be = byte[even]
        table[be] = (table[be] & 0xF0) | new[even]
        bo = byte[odd]
        table[bo] = (table[bo] & 0x0F) | (new[odd] << 4)
        self.additions += total
        if self.additions >= self.sample_size:
            self.reset()

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
