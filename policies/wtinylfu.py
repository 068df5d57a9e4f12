"""W-TinyLFU: a window LRU, a segmented main LRU and TinyLFU admission, with an adaptive window.

The algorithm (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache Admission
Policy", ACM ToS 2017; the segmentation and window as in Caffeine):

* A new entry enters the **window**, a small LRU (1% of the capacity to start). The window gives
  a burst of recent keys time to prove themselves, which pure frequency admission would deny.
* An entry pushed out of the window is a **candidate** for the **main** area, an SLRU of
  *probation* (new and demoted entries) and *protected* (90% of main: entries hit while on
  probation). The candidate is admitted only if its estimated frequency is higher than that of
  the *victim* (the LRU end of probation); otherwise the candidate itself leaves. Frequencies
  come from :class:`mlcache.sketch.FrequencySketch` (4-bit count-min, aged by halving), which
  records every access, hits and misses, so it also remembers keys no longer resident.
* HashDoS safety: an attacker who floods the sketch can make a victim look hot forever. A
  candidate that is itself warm (estimate >= 6) is admitted with probability 1/128 when it loses,
  so no victim is pinned (Caffeine's rule).
* **Adaptive window** (our design). Caffeine sizes the window by hill climbing on the sampled hit
  rate; it follows noise on short traces and, on recency-biased workloads (ARC's OLTP at large
  sizes, corda), never grows the window far enough, falling below LRU. We instead compare the
  *marginal value* of the two areas directly, as Cliffhanger (Cidon et al., NSDI 2016) does with
  shadow queues: two small ghost lists (keys only) remember the last candidates the window lost
  to admission and the last victims main evicted. A miss that hits the window ghost is a hit a
  larger window would have had; one that hits the main ghost, a hit a larger main would have
  had. Each such miss moves a small step of capacity toward the area that would have had it, so
  the split follows the gradient of the hit-ratio curve, fast (no sampling period), between a
  1-entry window (pure TinyLFU, best on loops and scans) and a window of the whole cache (pure
  LRU, best on recency-biased traces).

Costs: a hit is a few dict operations (move to the MRU end of its segment, one pending count);
a miss adds one sketch estimate (plain Python) and ghost bookkeeping. Sketch increments are
buffered as exact per-key pending counts and applied in numpy batches (thousands of keys per
drain); an estimate adds the pending count, so buffering never blurs an admission decision.
O(1) amortised per operation. In pure Python the per-access bytecode count *is* the cost, so
the steady state of a full unit-weight cache (one candidate meets one victim, no counter
changes) has its own inlined path (``_miss``, in :mod:`._wtinylfu_miss`): the probation
victim and its estimate are cached until probation's head or the sketch changes, and the
candidate's estimate is inlined, stopping after the first row when that row already proves it
cannot win (most candidates are cold). The sketch and the random admission are seeded with a
fixed default, so results are reproducible (keys' hashes themselves stay process-local).

Ties (equal estimates) go to the incumbent, as in Caffeine — unless the ghosts show that the
newcomers refused on ties keep coming back sooner than the incumbents they would have
replaced; a small score learnt from the ghost hits then sends ties to newcomers.

Weights: ``capacity`` bounds the total weight (entries or bytes); the window and protected
bounds are weights too; a candidate heavier than a victim is compared with as many victims as
it takes to fit (each must lose). An entry heavier than the whole capacity is refused.
"""
from __future__ import annotations

import random
from collections import OrderedDict, deque
from itertools import islice
from typing import Any, Hashable, Iterator

from mlcache.sketch import FrequencySketch

from ._wtinylfu_miss import _LOST_MAIN, _LOST_WINDOW, _NOKEY, _SAMPLE, _TIE, _WARM, SteadyMiss
from .base import (BasePolicy, _check_capacity, _check_heavy, _check_number, _config_error,
                   register_policy)

__all__ = ["WTinyLFUPolicy"]

# The default seed of the sketch and of the random admission: results are reproducible run to
# run (keys' own hashes stay process-local: Python randomises str/bytes hashing per process).
_SEED = 0x2545F4914F6CDD1D
# The window is a plain dict while its target is at most this many entries, else an
# OrderedDict (see ``_shape_window``).
_SMALL_WINDOW = 64
# The hit log (see ``access``) is folded into the pending counts every _TICK misses; it keeps at
# most _LOG_MAX hits (128 KiB of references at worst; a deque holds only what it is given), so
# it only drops (the oldest) hits on protected keys when more than _LOG_MAX of them come within
# _TICK misses: above a 98.5% hit ratio, on keys that are hot anyway (Caffeine's read buffer is
# lossy the same way). The longest run seen in the published traces is ~4,400 (sprite@1000).
# (It is also folded whenever a key leaves protected; 256 instead of 64 misses per fold gave the
# same hits on every published trace and size, for a quarter of the ticks.)
_TICK = 256
_LOG_MAX = 16384

try:
    from collections import _count_elements  # type: ignore[attr-defined]  # C: x -> get(x, 0) + 1
except ImportError:  # pragma: no cover - other interpreters
    def _count_elements(mapping: dict, iterable: Any) -> None:
        for x in iterable:
            mapping[x] = mapping.get(x, 0) + 1


class _Cold:
    """The policy's state that the steady miss and the protected hit never touch.

    Kept apart so that a policy object has few attributes: CPython 3.11 keeps an object's
    attributes in a compact array read at a fixed offset only while its class's instances have
    fewer than about 30 attribute names; past that every attribute lives in a dict, and each
    read on the hot paths (~20 a miss) becomes a hashed lookup (measured: 38 attributes cost
    ~170 instructions a request on the Zipf bench, 8,509 -> 8,342 with these moved here).
    ``tests/test_cachetools_compat.py`` keeps the count down."""

    __slots__ = ("rng", "protected_frac", "ghost_frac", "step_frac", "tie_score", "log",
                 "drain_left", "tick_len", "unit", "wsize", "psize", "qsize")

    rng: random.Random
    protected_frac: float
    ghost_frac: float
    step_frac: float
    tie_score: int  # see _adapt
    log: deque  # the hit log (see __init__)
    drain_left: int  # misses to the next drain
    tick_len: int  # misses from one _tick to the next
    unit: bool  # every weight so far is 1
    wsize: float  # weight in the window
    psize: float  # weight on probation
    qsize: float  # weight protected


@register_policy("wtinylfu")
class WTinyLFUPolicy(SteadyMiss, BasePolicy):
    name = "wtinylfu"

    def __init__(self, capacity: int, *, window: float = 0.01, protected: float = 0.9,
                 adaptive: bool = True, ghost: float = 0.05, step: float = 0.005,
                 expected_entries: int | None = None, seed: int | None = None,
                 **options: Any) -> None:
        super().__init__(capacity, **options)
        if not 0.0 < window < 1.0:
            raise _config_error("policy.wtinylfu.window", f"must be in (0, 1), got {window!r}")
        if not 0.0 < protected <= 1.0:
            raise _config_error("policy.wtinylfu.protected", f"must be in (0, 1], got {protected!r}")
        if not 0.0 < ghost <= 1.0 or not 0.0 < step < 1.0:
            raise _config_error("policy.wtinylfu", f"ghost must be in (0, 1] and step in (0, 1), "
                                f"got ghost={ghost!r} step={step!r}")
        # (named here: the sketch named its own capacity for expected_entries=100.5, and a
        # str of either was a bare TypeError or int() ValueError from inside the sketch)
        if expected_entries is not None and (isinstance(expected_entries, bool)
                                             or not isinstance(expected_entries, int)
                                             or expected_entries < 0):
            raise _config_error("policy.wtinylfu.expected_entries",
                                f"must be a positive integer, got {expected_entries!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _config_error("policy.wtinylfu.seed", f"must be an integer, got {seed!r}")
        if seed is None:
            seed = _SEED
        self._cold = _Cold()
        self._cold.rng = random.Random(seed)
        self._window_max = max(1.0, capacity * window)
        # key -> weight, LRU first: a dict or an OrderedDict (see _shape_window)
        self._window: dict[Hashable, int] = ({} if self._window_max <= _SMALL_WINDOW
                                             else OrderedDict())
        self._probation: OrderedDict[Hashable, int] = OrderedDict()
        self._protected: OrderedDict[Hashable, int] = OrderedDict()  # never rebound
        self._cold.wsize = 0  # weight in the window
        self._cold.psize = 0  # weight on probation
        self._cold.qsize = 0  # weight protected
        self._cold.protected_frac = protected
        self._adaptive = adaptive
        self._cold.ghost_frac = ghost
        self._cold.step_frac = step
        # Two ghosts of equal length (cache-space extensions of equal size, as Cliffhanger's
        # shadow queues): candidates the window lost, victims main lost. key -> code.
        self._wghost: OrderedDict[Hashable, int] = OrderedDict()
        self._mghost: OrderedDict[Hashable, int] = OrderedDict()
        entries = expected_entries or min(capacity, 1 << 16)  # capacity may be in bytes
        self._ghost_limit = max(4, int(entries * ghost) // _SAMPLE)  # in keys; see _drain
        self._ticks = _SAMPLE  # countdown of losses; every _SAMPLE-th is remembered in a ghost
        self._cold.tie_score = 0
        self._tie = False
        self.sketch = FrequencySketch(max(16, entries), seed=seed)
        self._bind_sketch()
        # Increments not yet applied to the sketch (exact, added to estimates).
        self._pending: dict[Hashable, int] = {}
        # Hits on protected entries, in order, not yet counted in _pending: a hit appends (one
        # C call) instead of a dict read-modify-write. Folded into _pending every _TICK misses
        # and before any key leaves protected, so the keys it holds are all protected: never
        # a candidate or a victim, whose counts stay exact. Never rebound (TinyLFUCache appends
        # to it directly).
        self._cold.log = deque(maxlen=_LOG_MAX)
        self._logged = self._cold.log.append
        # Misses between drains (pending then holds at most that many keys plus the resident
        # ones that were hit): large batches amortise numpy's fixed costs (in a full run a
        # drain of 1000 keys cost ~3x more per key than one of 4096), but at most a third of
        # a sample period: aging is applied at drains, and coarser aging costs hit ratio on
        # loops (loop@500: 49.2 with batches of a tenth, 46.5 a third, 45.9 a half).
        self._cold.drain_left = self._drain_size()  # misses to the next drain
        self._countdown = self._cold.tick_len = min(_TICK, self._cold.drain_left)  # misses to _tick
        self._victim: Hashable = _NOKEY  # probation's head while cached, and its estimate
        self._victim_freq = 0
        self._bar = 0  # min(_victim_freq, _WARM): a candidate below it loses (see _miss)
        self._tie_ok = False  # a candidate at the bar loses a tie, no chance draw (see _miss)
        self._single = False  # steady with a one-entry window (see _miss)
        self._cold.unit = True  # every weight so far is 1
        self._steady = False  # full, unit weights, window at its target: see _add

    # -- copies --------------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        # ``_logged`` is the hit log's bound ``append``, a builtin method: copy.deepcopy keeps
        # it as it is, so a deep copy logged its protected hits into the original's log (its
        # own never counted them, and the original counted hits it never had). Rebound on the
        # copy's own log instead (pickle got it right; this does both the same way).
        state = self.__dict__.copy()
        del state["_logged"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._logged = self._cold.log.append

    # -- introspection -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._window) + len(self._probation) + len(self._protected)

    def __contains__(self, key: object) -> bool:
        return key in self._protected or key in self._probation or key in self._window

    def keys(self) -> Iterator[Hashable]:
        yield from list(self._window)
        yield from list(self._probation)
        yield from list(self._protected)

    @property
    def window_capacity(self) -> float:
        """The current target weight of the window (moves when ``adaptive``)."""
        return self._window_max

    def weight(self, key: Hashable) -> int | None:
        for seg in (self._protected, self._probation, self._window):
            w = seg.get(key)
            if w is not None:
                return w
        return None

    def next_victim(self) -> Hashable:
        """The key an eviction would remove now (KeyError if empty)."""
        for seg in (self._probation, self._protected, self._window):
            if seg:
                return next(iter(seg))
        raise KeyError("empty policy")

    def frequency(self, key: Hashable) -> int:
        """The sketch's estimate of ``key``'s recent use, including buffered increments."""
        self._fold()
        return self._freq(key)

    # -- the Policy protocol -------------------------------------------------------------------

    def access(self, key: Hashable, ts: float | None = None) -> None:
        try:  # most hits are on protected entries: two C calls for them
            self._protected.move_to_end(key)
        except KeyError:
            if key in self._probation:
                self._promote(key)
            elif key in self._window:
                window = self._window
                if type(window) is dict:  # to the MRU end (see _shape_window)
                    window[key] = window.pop(key)
                else:
                    window.move_to_end(key)  # type: ignore[attr-defined]  # an OrderedDict
            else:
                return
            pending = self._pending
            pending[key] = pending.get(key, 0) + 1
            return
        self._logged(key)

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        if key in self._window or key in self._protected or key in self._probation:
            return self._update(key, weight)
        if weight == 1 and self._cold.unit:
            lost = self._miss(key)
            return lost if type(lost) is list else [lost]
        try:
            if weight > self.capacity or not weight >= 0:
                _check_heavy(weight, self.capacity)   # (or negative/NaN: a ValueError)
                pending = self._pending
                pending[key] = pending.get(key, 0) + 1
                countdown = self._countdown - 1  # a refused insert is a miss: counts to a drain
                self._countdown = countdown
                if not countdown:
                    self._tick()
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        if weight != 1:
            self._cold.unit = self._steady = False
            self._victim = _NOKEY
        return self._add(key, weight)

    def insert_many(self, keys: list, ts: float | None = None, *, fresh: bool = False) -> list:
        """``insert(key, 1, ts)`` for each of ``keys`` in order; the keys that left (each once).

        A batch read from a lower level. While the batch fits without an eviction -- unit
        weights, none of its keys resident or in a ghost, ``capacity`` not reached -- a miss
        only counts the key, enters the window and pushes the window's LRU entry to probation,
        so the batch does that with C-level calls over runs of keys, stopping at each
        ``_tick`` exactly where a key-by-key insert would. Else key by key. ``fresh``: the
        caller knows the keys are distinct and none is resident (the heap's batched miss),
        so that is not checked again.
        """
        n = len(keys)
        window, prob = self._window, self._probation
        wghost, mghost = self._wghost, self._mghost
        if (not self._cold.unit or self._steady or self.total_weight + n > self.capacity
                or (wghost and not wghost.keys().isdisjoint(keys))
                or (mghost and not mghost.keys().isdisjoint(keys))
                or (not fresh and (not window.keys().isdisjoint(keys)
                                   or not prob.keys().isdisjoint(keys)
                                   or not self._protected.keys().isdisjoint(keys)
                                   or len(set(keys)) != n))):
            return self._insert_each(keys, ts, fresh)
        pending = self._pending
        i = 0
        while i < n:
            countdown = self._countdown
            j = i + countdown
            if j > n:
                chunk = keys[i:]
                _count_elements(pending, chunk)
                self._countdown = countdown - len(chunk)
                self._enter(chunk)
                break
            # the countdown ends at keys[j - 1]: ticks after its count, before it enters
            _count_elements(pending, keys[i:j])
            if j - 1 > i:
                self._enter(keys[i:j - 1])
            self._countdown = 0
            self._tick()
            self._enter(keys[j - 1:j])
            i = j
        self._steady = (self.total_weight == self.capacity
                        and self._cold.wsize <= self._window_max < self._cold.wsize + 1)
        self._victim = _NOKEY
        return []

    def _enter(self, keys: list) -> None:
        """:meth:`_add` (counted already) of absent unit-weight keys that fit: each enters the
        window and the window's LRU entries beyond its target go to probation."""
        window, prob = self._window, self._probation
        k = len(keys)
        self.total_weight += k
        wsize = self._cold.wsize + k
        keep = int(self._window_max)   # the window's target (>= 1) in unit entries
        move = wsize - keep
        if move <= 0:
            window.update(dict.fromkeys(keys, 1))
            self._cold.wsize = wsize
            return
        self._fold()   # as _evict does before moving anything
        old = len(window)
        if move >= old:
            # the whole window and the batch's first keys go to probation, in order
            prob.update(window)
            window.clear()
            prob.update(dict.fromkeys(keys[:move - old], 1))
            window.update(dict.fromkeys(keys[move - old:], 1))
        else:
            window.update(dict.fromkeys(keys, 1))
            for key in list(islice(window, move)):  # the LRU end (one pass over a dict)
                prob[key] = window.pop(key)
        self._cold.wsize = wsize - move
        self._cold.psize += move

    def remove(self, key: Hashable) -> None:
        self._fold()
        for seg in (self._window, self._probation, self._protected):
            w = seg.pop(key, None)
            if w is not None:
                self._account(seg, -w)
                self.total_weight -= w
                self._steady = False
                self._victim = _NOKEY
                return

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self._window_max = max(1.0, self._window_max * capacity / self.capacity)
        self.capacity = capacity
        self._steady = False
        self._victim = _NOKEY
        self._shape_window()
        return self._evict()

    def _add(self, key: Hashable, weight: int = 1, count: bool = True) -> list:
        """Insert an absent ``key`` (the general path); return the victims."""
        if count:
            pending = self._pending
            pending[key] = pending.get(key, 0) + 1
            if key in self._wghost or key in self._mghost:
                self._adapt(key)
            countdown = self._countdown - 1
            self._countdown = countdown
            if not countdown:
                self._tick()
        self._window[key] = weight
        self._cold.wsize += weight
        self.total_weight += weight
        if self.total_weight > self.capacity or self._cold.wsize > self._window_max:
            victims = self._evict()
        else:
            victims = []
        self._steady = (self._cold.unit and self.total_weight == self.capacity
                        and self._cold.wsize <= self._window_max < self._cold.wsize + 1)
        self._victim = _NOKEY  # re-cached by the next steady miss (see _cache_victim)
        return victims

    def _beats(self, candidate: Hashable, vf: int) -> bool:
        """Does ``candidate`` beat a victim of estimate ``vf`` (> 0)? Sets ``_tie``.

        The candidate's estimate is computed row by row with an early exit: once the running
        minimum cannot beat the victim nor reach the warm threshold, the answer is no.
        """
        self._tie = False
        limit = vf - self._pending.get(candidate, 0)  # the sketch part must exceed this
        if limit < 0:
            return True
        m = hash((candidate, self._seed))
        t, mask, w = self._table, self._mask, self._width
        i = m & mask
        f = t[i] & 15
        if f < limit and f + vf - limit < _WARM:
            return False
        b = ((m >> 32) | 1) & mask
        for base, shift in ((0, 4), (w, 0), (w, 4)):  # rows 1-3 (the sketch's nibble layout)
            i = (i + b) & mask
            c = (t[i + base] >> shift) & 15
            if c < f:
                f = c
                if f < limit and f + vf - limit < _WARM:
                    return False
        return self._decide(f + vf - limit, vf)

    def _decide(self, cf: int, vf: int) -> bool:
        """Admission for a candidate of estimate ``cf`` against a victim of ``vf``; sets ``_tie``.

        Higher wins. A tie goes to the incumbent unless the tie score (learnt from ghost hits)
        says newcomers refused on ties come back first. A warm candidate that loses still gets
        a 1/128 chance, so a victim made to look hot by hash flooding cannot be pinned.
        """
        if cf > 15:
            cf = 15
        if cf > vf:
            self._tie = False
            return True
        if cf == vf:
            self._tie = True
            if self._cold.tie_score > 0:
                return True
        else:
            self._tie = False
        return cf >= _WARM and self._cold.rng.getrandbits(7) == 0

    def _admit(self, candidate: Hashable, victim: Hashable) -> bool:
        """TinyLFU: does ``candidate`` beat ``victim``? Sets ``_tie`` when they are equal."""
        vf = self._victim_freq if victim is self._victim else self._freq(victim)
        if vf == 0:
            self._tie = False
            return True  # the candidate has at least its own access
        return self._beats(candidate, vf)

    def _evict(self) -> list:
        """The general eviction: any weights, any window overflow, a shrinking main."""
        self._fold()  # victims may come from protected
        victims: list = []
        window, prob, prot = self._window, self._probation, self._protected
        capacity = self.capacity
        while self._cold.wsize > self._window_max and len(window) > 1:  # the newest stays
            cand = next(iter(window))
            cw = window.pop(cand)
            self._cold.wsize -= cw
            if self.total_weight > capacity:
                while self.total_weight > capacity:
                    seg: dict[Hashable, int] = prob if prob else prot
                    if not seg:
                        break
                    victim = next(iter(seg))
                    if not self._admit(cand, victim):
                        break
                    vw = seg.pop(victim)
                    self._account(seg, -vw)
                    self.total_weight -= vw
                    victims.append(victim)
                    self._ghost(victim, _LOST_MAIN)
                if self.total_weight > capacity:  # lost: the candidate leaves
                    self.total_weight -= cw
                    victims.append(cand)
                    self._ghost(cand, _LOST_WINDOW)
                    continue
            prob[cand] = cw
            self._cold.psize += cw
        while self.total_weight > capacity:  # main (or the window) is over its share
            seg = prob if prob else (prot if prot else window)
            if not seg:
                break
            key = next(iter(seg))
            kw = seg.pop(key)
            self._account(seg, -kw)
            self.total_weight -= kw
            victims.append(key)
            if seg is not window:
                self._tie = False
                self._ghost(key, _LOST_MAIN)
        self._victim = _NOKEY
        return victims

    # -- internals -----------------------------------------------------------------------------

    def _account(self, seg: dict, delta: int) -> None:
        if seg is self._window:
            self._cold.wsize += delta
        elif seg is self._probation:
            self._cold.psize += delta
        else:
            self._cold.qsize += delta

    def _update(self, key: Hashable, weight: int) -> list:
        try:
            if weight > self.capacity or not weight >= 0:
                # Checked before the entry's weight changes: a negative or NaN weight is an
                # error, and one heavier than the capacity leaves without being counted (an
                # infinite weight counted then taken off left NaN sizes that never exceed a
                # bound again).
                _check_heavy(weight, self.capacity)
                self.access(key)
                self.remove(key)
                return [key]
        except TypeError:
            _check_number(weight)   # a weight that is not a number is named
            raise
        for seg in (self._protected, self._probation, self._window):
            old = seg.get(key)
            if old is not None:
                if old != weight:
                    seg[key] = weight
                    self._account(seg, weight - old)
                    self.total_weight += weight - old
                    self._cold.unit = self._steady = False
                    self._victim = _NOKEY
                break
        self.access(key)
        if self.total_weight > self.capacity or self._cold.wsize > self._window_max:
            return self._evict()
        return []

    def _promote(self, key: Hashable) -> None:
        self._fold()  # protected's LRU may be demoted: its logged hits must be counted
        w = self._probation.pop(key)
        if key == self._victim:
            self._victim = _NOKEY
        self._cold.psize -= w
        self._protected[key] = w
        self._cold.qsize += w
        limit = self._cold.protected_frac * (self.capacity - self._window_max)
        prot, prob = self._protected, self._probation
        while self._cold.qsize > limit and len(prot) > 1:
            k, kw = prot.popitem(last=False)
            self._cold.qsize -= kw
            prob[k] = kw
            self._cold.psize += kw

    def _fold(self) -> None:
        """Count the logged protected hits into ``_pending``."""
        log = self._cold.log
        if log:
            _count_elements(self._pending, log)
            log.clear()

    def _tick(self) -> None:
        """Every ``_TICK`` misses: fold the hit log; drain when ``_drain_size`` misses are due."""
        self._fold()
        left = self._cold.drain_left - self._cold.tick_len
        if left <= 0:
            self._drain()
            left = self._drain_size()
        self._cold.drain_left = left
        self._countdown = self._cold.tick_len = min(_TICK, left)

    def _drain(self) -> None:
        self._fold()
        pending = self._pending
        if pending:
            self.sketch.increment_counts(pending)
            pending.clear()
        self._victim = _NOKEY
        n = len(self)
        self._ghost_limit = max(4, int(n * self._cold.ghost_frac) // _SAMPLE)
        if n > 2 * self.sketch.capacity:  # weighted: many more entries than expected
            self.sketch.ensure_capacity(2 * n)
            self._bind_sketch()

    def _drain_size(self) -> int:
        return min(4096, max(256, self.sketch.sample_size // 3))

    def _bind_sketch(self) -> None:
        """Local copies of what an estimate reads (the policy mixes keys, not their hashes)."""
        sk = self.sketch
        self._seed, self._table, self._mask, self._width = sk._seed, sk.table, sk.mask, sk.width

    def _freq(self, key: Hashable) -> int:
        f = self.sketch.frequency_of_mixed(hash((key, self._seed))) + self._pending.get(key, 0)
        return f if f < 15 else 15

    def _shape_window(self) -> None:
        """An OrderedDict for a window whose target grew past ``_SMALL_WINDOW`` entries.

        The steady miss inserts into the window and pops its LRU end. On a plain dict that is
        cheaper than an OrderedDict's ``popitem(False)`` (~460 fewer instructions a miss up
        to ~40 entries, callgrind), but finding a dict's first entry skips the deleted slots
        before it, up to about its length, so a large dict window would cost O(entries) a
        miss. The window therefore becomes an OrderedDict as soon as its target passes
        ``_SMALL_WINDOW``, and a dict again only once steady at a small target
        (``_cache_victim``), when it holds at most that many entries (never while a shrunken
        target still has a large window to empty). Both are used only through what they share
        (first key by iteration, ``pop``, a re-insert to move to the MRU end).
        """
        if type(self._window) is dict:
            if self._window_max > _SMALL_WINDOW:
                self._window = OrderedDict(self._window)
        elif self._window_max <= _SMALL_WINDOW and self._steady:
            self._window = dict(self._window)

    def _adapt(self, key: Hashable) -> None:
        code = self._wghost.pop(key, 0) or self._mghost.pop(key)
        if code & _TIE:
            # A tie we refused came back (+1): ties should go to newcomers; a victim that lost
            # a tie came back (-1): they should not.
            score = self._cold.tie_score + (1 if code & _LOST_WINDOW else -1)
            self._cold.tie_score = max(-8, min(8, score))
        if not self._adaptive:
            return
        step = max(1.0, self.capacity * self._cold.step_frac) * _SAMPLE
        if code & _LOST_WINDOW:
            self._window_max = min(float(self.capacity), self._window_max + step)
            self._shape_window()
        else:
            self._window_max = max(1.0, self._window_max - step)
        self._steady = False
        self._victim = _NOKEY

    def _ghost(self, key: Hashable, code: int) -> None:
        ticks = self._ticks - 1
        if ticks:
            self._ticks = ticks
            return
        self._ticks = _SAMPLE
        if self._adaptive:
            ghosts = self._wghost if code == _LOST_WINDOW else self._mghost
            ghosts[key] = code | _TIE if self._tie else code
            if len(ghosts) > self._ghost_limit:
                ghosts.popitem(False)
