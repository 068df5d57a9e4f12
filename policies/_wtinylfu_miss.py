"""W-TinyLFU's steady miss, the one path that runs on most misses of a full cache.

In a full cache of unit weights whose window is at its target, every miss is the same few
steps: the new key enters the window, the window's LRU entry (the *candidate*) meets the
probation victim, and one of the two leaves; no size or counter changes. In CPython the
bytecode count of those steps is the cost of a miss, so they are written out here (the victim
and its estimate cached, the candidate's rows read one at a time with early exits) apart from
the general bookkeeping in :mod:`mlcache.policies.wtinylfu`. ``TinyLFUCache.__setitem__`` has
the same statements written out once more (no call per miss); a test plays one trace through
both and compares them.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

__all__ = ["SteadyMiss"]

# Shared with mlcache.policies.wtinylfu (which imports them from here):
_WARM = 6  # a candidate at least this frequent may win by chance (HashDoS defence)
_LOST_WINDOW, _LOST_MAIN, _TIE = 1, 2, 4  # a ghost's record: who lost, and on a tie
_LOST_TIE = _LOST_WINDOW | _TIE  # a candidate refused on a tie
# Ghosts remember one loss in _SAMPLE (a ghost hit then moves _SAMPLE steps): the same
# expected gradient for a quarter of the bookkeeping on the miss path.
_SAMPLE = 4
# A packed sketch byte's two counters, looked up: ``_LO[x] == x & 15``, ``_HI[x] == x >> 4``.
# CPython 3.11 specialises indexing a tuple by an int, but not ``&`` or ``>>`` (only ``+``,
# ``-`` and ``*`` of ints), which take the generic number protocol.
_LO = tuple(x & 15 for x in range(256))
_HI = tuple(x >> 4 for x in range(256))


class _NoKey:
    """The marker of "no cached victim" (None is a valid key), compared by identity: it
    pickles as a reference to this module's one instance, so a pickled or deep-copied policy
    still recognises it (a copy of a plain object() was taken for a key: KeyError)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "_NOKEY"

    def __repr__(self) -> str:
        return "_NOKEY"


_NOKEY = _NoKey()


class SteadyMiss:
    """The steady miss of :class:`~mlcache.policies.wtinylfu.WTinyLFUPolicy` (a mixin: it
    works on that class's attributes and falls back to its general ``_add``)."""

    # The policy's state and methods it uses, set by WTinyLFUPolicy (declared for type checkers).
    _window: Any
    _probation: Any
    _pending: dict[Hashable, int]
    _table: Any
    _wghost: Any
    _mghost: Any
    _seed: int
    _mask: int
    _width: int
    _ghost_limit: int
    _window_max: float
    _adaptive: bool
    _steady: bool
    _cold: Any
    _tie_ok: bool
    _bar: int
    _countdown: int
    _single: bool
    _ticks: int
    _victim: Any
    _victim_freq: int
    _adapt: Callable[[Hashable], None]
    _add: Callable[..., list]
    _decide: Callable[[int, int], bool]
    _shape_window: Callable[[], None]
    _tick: Callable[[], None]

    # -- the steady miss ------------------------------------------------------------------------

    def _miss(self, key: Hashable) -> Any:
        """Insert an absent unit-weight ``key``: the one key that left, or a list of victims.

        (Keys are hashable, so a list result is never a key.) The steady state — full, unit
        weights, window at its target — is handled here inline: the window's LRU entry (never
        ``key``) meets the probation victim, counts and sizes do not change. Every line here
        runs on most misses and in CPython the bytecode count is the cost, so: the victim and
        the bar ``min(its estimate, _WARM)`` are cached (``_victim`` is ``_NOKEY`` whenever
        the policy is not steady), and the candidate's sketch rows are read inline one at a
        time: a count-min estimate is the minimum of the rows, so the first row whose counter
        plus the candidate's exact buffered count is below the bar proves that the candidate
        can neither win, tie nor be warm. Most candidates are cold and stop after one or two
        rows. A candidate whose minimum lands exactly on the bar ties with the victim: when the
        victim is cold (estimate 1-5) and ties go to incumbents (``_tie_ok``) it is refused
        here as :meth:`_decide` would (on Zipf that is ~20% of misses, the most common case
        after row refusals); the rest are settled by :meth:`_settle`.
        ``TinyLFUCache.__setitem__`` has these
        statements written out (no call per miss): change both; a test plays one trace through
        the cache and through this policy and compares them.
        """
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1
        if key in self._wghost or key in self._mghost:
            self._adapt(key)
        n = self._countdown - 1
        self._countdown = n
        if not n:
            self._tick()
        victim = self._victim
        if victim is _NOKEY:
            victim = self._cache_victim()
            if victim is _NOKEY:
                return self._add(key, 1, False)
        window = self._window
        if self._single:  # a one-entry window: it is its LRU end, and popitem() takes it
            cand = window.popitem()[0]  # (LIFO: a dict then never grows nor resizes)
            window[key] = 1
        else:
            window[key] = 1
            for cand in window:  # the LRU end: popitem(False) cost more (see _shape_window)
                break
            del window[cand]
        m = hash((cand, self._seed))
        mask = self._mask
        i = m & mask  # from here on small ints: 64-bit ones are multi-digit PyLongs, slower
        t = self._table  # the sketch's layout: row 0 | row 1 << 4, then row 2 | row 3 << 4
        bar = self._bar - pending.get(cand, 0)  # what the candidate's sketch rows must reach
        f = _LO[t[i]]
        if f < bar:  # row 0 refuses the candidate: most misses end here
            # (the ghost bookkeeping at the end, written out again: no ghost code to set and
            # no branch to fall through on the commonest path, ~45 instructions a request)
            ticks = self._ticks - 1  # the ghosts remember one loss in _SAMPLE
            if ticks:
                self._ticks = ticks
                return cand
            self._ticks = _SAMPLE
            if self._adaptive:
                ghosts = self._wghost
                ghosts[cand] = _LOST_WINDOW
                if len(ghosts) > self._ghost_limit:
                    ghosts.popitem(False)
            return cand
        code = _LOST_WINDOW  # the ghost's record if the candidate leaves
        if f:
            b = ((m >> 32) | 1) & mask  # rows 1-3: Kirsch-Mitzenmacher steps, mod the width
            i = (i + b) & mask
            c = _HI[t[i]]
            if c >= bar:
                if c:
                    if c < f:
                        f = c
                    w = self._width
                    i = (i + b) & mask
                    c = _LO[t[i + w]]
                    if c >= bar:
                        if c:
                            if c < f:
                                f = c
                            i = (i + b) & mask
                            c = _HI[t[i + w]]
                            if c >= bar:
                                if c < f:
                                    f = c
                                if f != bar or not self._tie_ok:
                                    return self._settle(cand, victim, f)
                                self._tie = True  # a tie the incumbent keeps
                                code = _LOST_TIE
                        elif bar or not self._tie_ok:  # a zero row: the estimate is 0
                            return self._settle(cand, victim, 0)
                        else:
                            self._tie = True
                            code = _LOST_TIE
                elif bar or not self._tie_ok:
                    return self._settle(cand, victim, 0)
                else:
                    self._tie = True
                    code = _LOST_TIE
        elif bar or not self._tie_ok:
            return self._settle(cand, victim, 0)
        else:
            self._tie = True
            code = _LOST_TIE
        ticks = self._ticks - 1
        if ticks:
            self._ticks = ticks
            return cand
        self._ticks = _SAMPLE
        if self._adaptive:
            ghosts = self._wghost
            ghosts[cand] = code
            if len(ghosts) > self._ghost_limit:
                ghosts.popitem(False)
        return cand

    def _settle(self, cand: Hashable, victim: Hashable, f: int) -> Hashable:
        """The steady miss whose candidate (sketch estimate ``f``) was not refused by its rows:
        admission proper."""
        vf = self._victim_freq
        pc = self._pending.get(cand, 0)
        tie = False
        if not vf or pc > vf:  # the candidate has at least its own access / its count wins
            admitted = True
        else:
            admitted = self._decide(f + pc, vf)
            tie = self._tie
        if admitted:
            probation = self._probation
            del probation[victim]
            probation[cand] = 1
            self._victim = _NOKEY
            lost, ghosts, code = victim, self._mghost, _LOST_MAIN
        else:
            lost, ghosts, code = cand, self._wghost, _LOST_WINDOW
        ticks = self._ticks - 1
        if ticks:
            self._ticks = ticks
        else:
            self._ticks = _SAMPLE
            if self._adaptive:
                ghosts[lost] = code | _TIE if tie else code
                if len(ghosts) > self._ghost_limit:
                    ghosts.popitem(False)
        return lost

    def _cache_victim(self) -> Hashable:
        """Cache probation's head, its estimate and the first-row bar; ``_NOKEY`` if not steady."""
        if not self._steady or not self._probation:
            return _NOKEY
        if type(self._window) is not dict:
            self._shape_window()  # steady: a small window may become a dict again
        victim = self._victim = next(iter(self._probation))
        # _freq(victim), inlined (the victim changes on about one miss in 14 on Zipf)
        m = hash((victim, self._seed))
        t, w, mask = self._table, self._width, self._mask
        i = m & mask
        b = ((m >> 32) | 1) & mask
        vf = _LO[t[i]]
        i = (i + b) & mask
        c = _HI[t[i]]
        if c < vf:
            vf = c
        i = (i + b) & mask
        c = _LO[t[i + w]]
        if c < vf:
            vf = c
        i = (i + b) & mask
        c = _HI[t[i + w]]
        if c < vf:
            vf = c
        vf += self._pending.get(victim, 0)
        if vf > 15:
            vf = 15
        self._victim_freq = vf
        self._bar = vf if vf < _WARM else _WARM
        # A candidate whose rows' minimum lands exactly on the bar ties with this victim; the
        # steady miss refuses it inline when that is _decide's answer (no chance draw, ties
        # to incumbents), else _settle decides. (_tie_score moves only in _adapt, which
        # drops the cached victim.)
        self._tie_ok = 0 < vf < _WARM and self._cold.tie_score <= 0
        self._single = self._window_max < 2.0  # steady: the window holds one entry
        return victim
