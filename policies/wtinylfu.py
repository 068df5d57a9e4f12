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
a miss adds one or two sketch estimates (plain Python) and ghost bookkeeping. Sketch increments
are buffered as exact per-key pending counts and applied in numpy batches; an estimate adds the
pending count, so buffering never blurs an admission decision. O(1) amortised per operation.
In pure Python the per-access bytecode count *is* the cost, so the steady state of a full
unit-weight cache (one candidate meets one victim, no counter changes) has its own inlined path
(``_add``), the victim's estimate is cached until the sketch changes, and the candidate's
estimate stops at the first row that already proves it cannot win (most candidates are cold).

Ties (equal estimates) go to the incumbent, as in Caffeine — unless the ghosts show that the
newcomers refused on ties keep coming back sooner than the incumbents they would have
replaced; a small score learnt from the ghost hits then sends ties to newcomers.

Weights: ``capacity`` bounds the total weight (entries or bytes); the window and protected
bounds are weights too; a candidate heavier than a victim is compared with as many victims as
it takes to fit (each must lose). An entry heavier than the whole capacity is refused.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any, Hashable, Iterator

from mlcache.sketch import _M64, _MIX, _ROWS, FrequencySketch

from .base import BasePolicy, _check_capacity, _config_error, register_policy

__all__ = ["WTinyLFUPolicy"]

_R0 = _ROWS[0]
_WARM = 6  # a candidate at least this frequent may win by chance (HashDoS defence)
_LOST_WINDOW, _LOST_MAIN, _TIE = 1, 2, 4
# Ghosts remember one loss in _SAMPLE (a ghost hit then moves _SAMPLE steps): the same
# expected gradient for a quarter of the bookkeeping on the miss path.
_SAMPLE = 4  # ghost codes: where the key lost, and if on a tie


@register_policy("wtinylfu")
class WTinyLFUPolicy(BasePolicy):
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
        self._rng = random.Random(seed)
        self._window: OrderedDict[Hashable, int] = OrderedDict()  # key -> weight, LRU first
        self._probation: OrderedDict[Hashable, int] = OrderedDict()
        self._protected: OrderedDict[Hashable, int] = OrderedDict()  # never rebound
        self._wsize = 0  # weight in the window
        self._psize = 0  # weight on probation
        self._qsize = 0  # weight protected
        self._protected_frac = protected
        self._window_max = max(1.0, capacity * window)
        self._adaptive = adaptive
        self._ghost_frac = ghost
        self._step_frac = step
        # Two ghosts of equal length (cache-space extensions of equal size, as Cliffhanger's
        # shadow queues): candidates the window lost, victims main lost. key -> code.
        self._wghost: OrderedDict[Hashable, int] = OrderedDict()
        self._mghost: OrderedDict[Hashable, int] = OrderedDict()
        entries = expected_entries or min(capacity, 1 << 16)  # capacity may be in bytes
        self._ghost_limit = max(4, int(entries * ghost) // _SAMPLE)  # in keys; see _drain
        self._ticks = 0  # losses seen; every _SAMPLE-th is remembered in a ghost
        self._tie_score = 0
        self._tie = False
        self.sketch = FrequencySketch(max(16, entries), seed=seed)
        self._rows = self._row_table()
        # Increments not yet applied to the sketch (exact, added to estimates). Never rebound:
        # TinyLFUCache updates it on protected hits.
        self._pending: dict[Hashable, int] = {}
        self._drain_limit = min(4096, max(256, entries))
        self._victim: Hashable = None  # cache of the probation victim's estimate
        self._victim_freq = 0
        self._unit = True  # every weight so far is 1
        self._steady = False  # full, unit weights, window at its target: see _add

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
        return self._freq(key)

    # -- the Policy protocol -------------------------------------------------------------------

    def access(self, key: Hashable, ts: float | None = None) -> None:
        prot = self._protected
        if key in prot:
            prot.move_to_end(key)
        elif key in self._probation:
            self._promote(key)
        elif key in self._window:
            self._window.move_to_end(key)
        else:
            return
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list:
        if key in self._window or key in self._protected or key in self._probation:
            return self._update(key, weight)
        if weight == 1 and self._unit:
            return self._add(key)
        if weight > self.capacity:
            pending = self._pending
            pending[key] = pending.get(key, 0) + 1
            return [key]
        if weight != 1:
            self._unit = self._steady = False
        return self._add(key, weight)

    def remove(self, key: Hashable) -> None:
        for seg in (self._window, self._probation, self._protected):
            w = seg.pop(key, None)
            if w is not None:
                self._account(seg, -w)
                self.total_weight -= w
                self._steady = False
                return

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self._window_max = max(1.0, self._window_max * capacity / self.capacity)
        self.capacity = capacity
        self._steady = False
        return self._evict()

    # -- the miss path -------------------------------------------------------------------------

    def _add(self, key: Hashable, weight: int = 1) -> list:
        """Insert an absent ``key``; return the victims."""
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1
        if key in self._wghost or key in self._mghost:
            self._adapt(key)
        window = self._window
        window[key] = weight
        if len(pending) > self._drain_limit:
            self._drain()
        if self._steady:
            # Full, unit weights, window at its target: the window's LRU entry (never ``key``)
            # meets the probation victim; counts and sizes do not change.
            probation = self._probation
            if probation:
                cand = window.popitem(last=False)[0]
                victim = next(iter(probation))
                if victim is self._victim:
                    vf = self._victim_freq
                else:
                    vf = self._freq(victim)
                    self._victim, self._victim_freq = victim, vf
                if not vf:
                    self._tie = False  # the candidate has at least its own access
                    admitted = True
                else:
                    admitted = self._beats(cand, vf)
                if admitted:
                    del probation[victim]
                    probation[cand] = 1
                    lost, code, ghosts = victim, _LOST_MAIN, self._mghost
                else:
                    lost, code, ghosts = cand, _LOST_WINDOW, self._wghost
                self._ticks += 1
                if not self._ticks % _SAMPLE and self._adaptive:
                    ghosts[lost] = code | _TIE if self._tie else code
                    if len(ghosts) > self._ghost_limit:
                        ghosts.popitem(last=False)
                return [lost]
        self._wsize += weight
        self.total_weight += weight
        if self.total_weight > self.capacity or self._wsize > self._window_max:
            victims = self._evict()
        else:
            victims = []
        self._steady = (self._unit and self.total_weight == self.capacity
                        and self._wsize <= self._window_max < self._wsize + 1)
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
        sk = self.sketch
        h = (((hash(candidate) ^ sk._seed) & _M64) * _MIX) & _M64
        h ^= h >> 32
        s, t = sk._shift, sk.table
        i = ((h * _R0) & _M64) >> s
        f = (t[i >> 1] >> ((i & 1) << 2)) & 15
        if f < limit and f + vf - limit < _WARM:
            return False
        for mult, base in self._rows:
            i = (((h * mult) & _M64) >> s) + base
            c = (t[i >> 1] >> ((i & 1) << 2)) & 15
            if c < f:
                f = c
                if f < limit and f + vf - limit < _WARM:
                    return False
        cf = f + vf - limit
        if cf > 15:
            cf = 15
        if cf > vf:
            return True
        if cf == vf:
            self._tie = True
            if self._tie_score > 0:
                return True
        return cf >= _WARM and self._rng.getrandbits(7) == 0

    def _admit(self, candidate: Hashable, victim: Hashable) -> bool:
        """TinyLFU: does ``candidate`` beat ``victim``? Sets ``_tie`` when they are equal."""
        if victim is self._victim:
            vf = self._victim_freq
        else:
            vf = self._freq(victim)
            self._victim, self._victim_freq = victim, vf
        if vf == 0:
            self._tie = False
            return True  # the candidate has at least its own access
        return self._beats(candidate, vf)

    def _evict(self) -> list:
        """The general eviction: any weights, any window overflow, a shrinking main."""
        victims: list = []
        window, prob, prot = self._window, self._probation, self._protected
        capacity = self.capacity
        while self._wsize > self._window_max and len(window) > 1:  # the newest stays
            cand, cw = window.popitem(last=False)
            self._wsize -= cw
            if self.total_weight > capacity:
                while self.total_weight > capacity:
                    seg = prob if prob else prot
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
            self._psize += cw
        while self.total_weight > capacity:  # main (or the window) is over its share
            seg = prob if prob else (prot if prot else window)
            if not seg:
                break
            key, kw = seg.popitem(last=False)
            self._account(seg, -kw)
            self.total_weight -= kw
            victims.append(key)
            if seg is not window:
                self._tie = False
                self._ghost(key, _LOST_MAIN)
        return victims

    # -- internals -----------------------------------------------------------------------------

    def _account(self, seg: OrderedDict, delta: int) -> None:
        if seg is self._window:
            self._wsize += delta
        elif seg is self._probation:
            self._psize += delta
        else:
            self._qsize += delta

    def _update(self, key: Hashable, weight: int) -> list:
        for seg in (self._protected, self._probation, self._window):
            old = seg.get(key)
            if old is not None:
                if old != weight:
                    seg[key] = weight
                    self._account(seg, weight - old)
                    self.total_weight += weight - old
                    self._unit = self._steady = False
                break
        self.access(key)
        if weight > self.capacity:
            self.remove(key)
            return [key]
        if self.total_weight > self.capacity or self._wsize > self._window_max:
            return self._evict()
        return []

    def _promote(self, key: Hashable) -> None:
        w = self._probation.pop(key)
        self._psize -= w
        self._protected[key] = w
        self._qsize += w
        limit = self._protected_frac * (self.capacity - self._window_max)
        prot, prob = self._protected, self._probation
        while self._qsize > limit and len(prot) > 1:
            k, kw = prot.popitem(last=False)
            self._qsize -= kw
            prob[k] = kw
            self._psize += kw

    def _drain(self) -> None:
        pending = self._pending
        if pending:
            self.sketch.increment_hashes(list(map(hash, pending)), list(pending.values()))
            pending.clear()
        self._victim = None
        n = len(self)
        self._ghost_limit = max(4, int(n * self._ghost_frac) // _SAMPLE)
        if n > 2 * self.sketch.capacity:  # weighted: many more entries than expected
            self.sketch.ensure_capacity(2 * n)
            self._rows = self._row_table()
            self._drain_limit = min(4096, max(256, self.sketch.capacity))

    def _row_table(self) -> tuple:
        w = self.sketch.width
        return tuple((_ROWS[r], r * w) for r in (1, 2, 3))

    def _freq(self, key: Hashable) -> int:
        f = self.sketch.frequency_of_hash(hash(key)) + self._pending.get(key, 0)
        return f if f < 15 else 15

    def _adapt(self, key: Hashable) -> None:
        code = self._wghost.pop(key, 0) or self._mghost.pop(key)
        if code & _TIE:
            # A tie we refused came back (+1): ties should go to newcomers; a victim that lost
            # a tie came back (-1): they should not.
            score = self._tie_score + (1 if code & _LOST_WINDOW else -1)
            self._tie_score = max(-8, min(8, score))
        if not self._adaptive:
            return
        step = max(1.0, self.capacity * self._step_frac) * _SAMPLE
        if code & _LOST_WINDOW:
            self._window_max = min(float(self.capacity), self._window_max + step)
        else:
            self._window_max = max(1.0, self._window_max - step)
        self._steady = False

    def _ghost(self, key: Hashable, code: int) -> None:
        self._ticks += 1
        if not self._ticks % _SAMPLE and self._adaptive:
            ghosts = self._wghost if code == _LOST_WINDOW else self._mghost
            ghosts[key] = code | _TIE if self._tie else code
            if len(ghosts) > self._ghost_limit:
                ghosts.popitem(last=False)
