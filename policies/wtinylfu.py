"""W-TinyLFU: a window LRU, a segmented main LRU and TinyLFU admission, with an adaptive window.

The algorithm (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache Admission
Policy", ACM ToS 2017; the segmentation and window as in Caffeine):

* A new entry enters the **window**, a small LRU (1% of the capacity to start). The window gives
  a burst of recent keys time to prove themselves, which pure frequency admission would deny.
* An entry pushed out of the window is a **candidate** for the **main** area, an SLRU of
  *probation* (new and demoted entries) and *protected* (80% of main: entries hit while on
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

Weights: ``capacity`` bounds the total weight (entries or bytes); the window and protected
bounds are weights too; a candidate heavier than a victim is compared with as many victims as
it takes to fit (each must lose). An entry heavier than the whole capacity is refused.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any, Hashable, Iterator

from mlcache.sketch import FrequencySketch

from .base import BasePolicy, _check_capacity, _config_error, register_policy

__all__ = ["WTinyLFUPolicy"]

_WARM = 6  # a candidate at least this frequent may win by chance (HashDoS defence)


@register_policy("wtinylfu")
class WTinyLFUPolicy(BasePolicy):
    name = "wtinylfu"

    def __init__(self, capacity: int, *, window: float = 0.01, protected: float = 0.8,
                 adaptive: bool = True, ghost: float = 0.1, step: float = 0.01,
                 expected_entries: int | None = None, seed: int | None = None,
                 **options: Any) -> None:
        super().__init__(capacity, **options)
        if not 0.0 < window < 1.0:
            raise _config_error("policy.wtinylfu.window", f"must be in (0, 1), got {window!r}")
        if not 0.0 < protected <= 1.0:
            raise _config_error("policy.wtinylfu.protected", f"must be in (0, 1], got {protected!r}")
        self._rng = random.Random(seed)
        self._window: OrderedDict[Hashable, int] = OrderedDict()
        self._probation: OrderedDict[Hashable, int] = OrderedDict()
        self._protected: OrderedDict[Hashable, int] = OrderedDict()
        self._wsize = 0  # weight in the window
        self._psize = 0  # weight on probation
        self._qsize = 0  # weight protected
        self._protected_frac = protected
        self._window_max = max(1.0, capacity * window)
        self._adaptive = adaptive
        self._ghost_frac = ghost
        self._step_frac = step
        # ghost key -> True when it lost a tie (equal frequencies): feeds the tie rule below
        self._wghost: OrderedDict[Hashable, bool] = OrderedDict()
        self._mghost: OrderedDict[Hashable, bool] = OrderedDict()
        self._tie_score = 0
        self._tie = False
        entries = expected_entries or min(capacity, 1 << 16)
        self.sketch = FrequencySketch(max(16, entries), seed=seed)
        self._pending: dict[Hashable, int] = {}
        self._drain_limit = min(4096, max(64, entries // 4))
        self._victim: Hashable = None
        self._victim_freq = 0

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

    def frequency(self, key: Hashable) -> int:
        """The sketch's estimate of ``key``'s recent use, including buffered increments."""
        f = self.sketch.frequency_of_hash(hash(key)) + self._pending.get(key, 0)
        return f if f < 15 else 15

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
        if key in self:
            return self._update(key, weight)
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1
        if self._adaptive:
            self._adapt(key)
        if weight > self.capacity:
            return [key]
        self._window[key] = weight
        self._wsize += weight
        self.total_weight += weight
        if len(pending) > self._drain_limit:
            self._drain()
        if self.total_weight > self.capacity or self._wsize > self._window_max:
            return self._evict()
        return []

    def remove(self, key: Hashable) -> None:
        for seg in (self._window, self._probation, self._protected):
            w = seg.pop(key, None)
            if w is not None:
                self._account(seg, -w)
                self.total_weight -= w
                return

    def resize(self, capacity: int) -> list:
        _check_capacity(capacity)
        self._window_max = max(1.0, self._window_max * capacity / self.capacity)
        self.capacity = capacity
        return self._evict()

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
                seg[key] = weight
                self._account(seg, weight - old)
                self.total_weight += weight - old
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
        if len(self) > 2 * self.sketch.capacity:  # weighted: many more entries than expected
            self.sketch.ensure_capacity(2 * len(self))
            self._drain_limit = min(4096, max(64, self.sketch.capacity // 4))

    def _freq(self, key: Hashable) -> int:
        f = self.sketch.frequency_of_hash(hash(key)) + self._pending.get(key, 0)
        return f if f < 15 else 15

    def _admit(self, candidate: Hashable, victim: Hashable) -> bool:
        if victim is self._victim:
            vf = self._victim_freq
        else:
            vf = self._freq(victim)
            self._victim, self._victim_freq = victim, vf
        self._tie = False
        if vf == 0:
            return True  # the candidate has at least its own access
        cf = self._freq(candidate)
        if cf > vf:
            return True
        if cf == vf:
            self._tie = True
            if self._tie_score > 0:
                return True
        return cf >= _WARM and self._rng.getrandbits(7) == 0

    def _adapt(self, key: Hashable) -> None:
        if key in self._wghost:
            if self._wghost.pop(key) and self._tie_score < 8:
                self._tie_score += 1  # a tie we refused came back: ties should go to newcomers
            grow = True
        elif key in self._mghost:
            if self._mghost.pop(key) and self._tie_score > -8:
                self._tie_score -= 1  # a victim a newcomer beat on a tie came back
            grow = False
        else:
            return
        step = max(1.0, self.capacity * self._step_frac)
        if grow:
            self._window_max = min(float(self.capacity), self._window_max + step)
        else:
            self._window_max = max(1.0, self._window_max - step)

    def _ghost(self, ghost: OrderedDict, key: Hashable, tie: bool = False) -> None:
        ghost[key] = tie
        if len(ghost) > max(8, int(len(self) * self._ghost_frac)):
            ghost.popitem(last=False)

    def _evict(self) -> list:
        victims: list = []
        window, prob, prot = self._window, self._probation, self._protected
        capacity = self.capacity
        while self._wsize > self._window_max and window:
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
                    if self._adaptive:
                        self._ghost(self._mghost, victim, self._tie)
                if self.total_weight > capacity:  # lost: the candidate leaves
                    self.total_weight -= cw
                    victims.append(cand)
                    if self._adaptive:
                        self._ghost(self._wghost, cand, self._tie)
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
            if self._adaptive and seg is not window:
                self._ghost(self._mghost, key)
        return victims
