"""Drop-in ``cachetools.Cache`` subclasses: ``TinyLFUCache`` (W-TinyLFU) and ``TACache`` (TAC).

``@cachetools.cached(TinyLFUCache(maxsize=1024))`` works unchanged, and so does every other use
of the cachetools mapping contract: ``maxsize``, ``currsize``, ``getsizeof`` (sizes count
against ``maxsize``), ``popitem()`` (removes the entry the policy would evict next),
``ValueError("value too large")`` for a value bigger than the whole cache, ``get``, ``pop``,
``setdefault``, ``clear`` and iteration.

How: the values live in a plain dict owned here; the eviction decision is the policy object
from :mod:`mlcache.policies` (the same class the heap level and the simulator use), told about
every hit and every insert. ``cachetools.Cache`` keeps its own private storage, which these
classes do not use; they override every method that touches it, and subclass it for
``isinstance`` checks and for ``cachetools``' decorators, which only use the mapping API.

Hit path cost: one dict lookup plus the policy's ``access`` (a few dict operations): the
per-access Python work is what a pure-Python cache pays, so it is kept to one call. The miss
path of ``TinyLFUCache`` writes W-TinyLFU's steady miss (``WTinyLFUPolicy._miss``) out in
``__setitem__``, on the policy's own attributes, instead of calling it (~500 fewer machine
instructions per request on the Zipf bench, cachegrind); anything but that steady case goes
back to the policy's methods.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator

import cachetools

from ._wtinylfu_miss import _HI, _LO, _LOST_TIE, _LOST_WINDOW, _NOKEY, _SAMPLE
from .tac import TACPolicy
from .wtinylfu import WTinyLFUPolicy

__all__ = ["TinyLFUCache", "TACache"]

_MISSING = object()


class _PolicyCache(cachetools.Cache):
    """A cachetools.Cache whose eviction order is an mlcache policy."""

    _policy_class: type = WTinyLFUPolicy

    def __init__(self, maxsize: int, getsizeof: Callable[[Any], int] | None = None,
                 **policy_options: Any) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            # the policies bound an integer capacity; said here in cachetools' words (the
            # policy's own error named "capacity", which the caller never passed)
            raise TypeError(f"{type(self).__name__}: maxsize must be an integer, got {maxsize!r}")
        cachetools.Cache.__init__(self, maxsize, getsizeof)
        self._data: dict[Hashable, Any] = {}
        self._sizes: dict[Hashable, float] | None = {} if getsizeof is not None else None
        self._size: float = 0
        self._maxsize = maxsize
        # cachetools allows maxsize=0 (every insert is "too large"); policies need >= 1.
        self._options = policy_options
        self._policy = self._policy_class(max(1, maxsize), **policy_options)
        self._bind()

    # -- the mapping ---------------------------------------------------------------------------

    def __getitem__(self, key: Hashable) -> Any:
        # A miss raises KeyError from the dict lookup itself, in C: what cachetools.Cache does
        # through __missing__, without a Python-level raise (a subclass that defines
        # __missing__ gets _getitem_missing instead, see __init_subclass__).
        value = self._data[key]
        # Bound methods are read into locals before the call: `self._x(key)` on an instance
        # attribute, or a method of an OrderedDict (which has an instance __dict__), compiles
        # to a LOAD_METHOD that CPython 3.11 cannot specialise, so it would take the generic
        # lookup (type, then instance dict) on every hit.
        move = self._move
        try:  # the common hit, inlined: W-TinyLFU's protected segment
            move(key)
        except KeyError:
            access = self._access
            access(key)
            return value
        logged = self._logged
        logged(key)
        return value

    def _getitem_missing(self, key: Hashable) -> Any:
        """``__getitem__`` for subclasses with their own ``__missing__`` (cachetools' hook)."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            return self.__missing__(key)
        self._access(key)
        return value

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__missing__ is not cachetools.Cache.__missing__ and "__getitem__" not in cls.__dict__:
            cls.__getitem__ = _PolicyCache._getitem_missing  # type: ignore[method-assign]

    def get(self, key: Hashable, default: Any = None) -> Any:
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            return default
        move = self._move
        try:
            move(key)
        except KeyError:
            access = self._access
            access(key)
            return value
        logged = self._logged
        logged(key)
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        p = self._steady
        if p is None:  # not W-TinyLFU's own unit-weight path: no more locals here (each costs)
            self._set(key, value)
            return
        data = self._data
        # unit weights, W-TinyLFU itself: its steady miss, written out below
        if key in data:
            data[key] = value
            access = self._access
            access(key)
            return
        data[key] = value
        # WTinyLFUPolicy._miss, written out here (the call was ~4% of a memoized miss on the
        # Zipf bench): the same statements on the policy's attributes, keep the two in step
        # (test_tinylfu_cache_decides_exactly_like_the_policy_it_wraps compares them; the
        # window ghost's record is written out too: a call there cost ~1%).
        pending = p._pending
        pending[key] = pending.get(key, 0) + 1
        if key in p._wghost or key in p._mghost:
            p._adapt(key)
        n = p._countdown - 1
        p._countdown = n
        if not n:
            p._tick()
        victim = p._victim
        if victim is _NOKEY:
            victim = p._cache_victim()
            if victim is _NOKEY:
                for victim in p._add(key, 1, False):
                    del data[victim]
                return
        window = p._window
        if p._single:
            cand = window.popitem()[0]
            window[key] = 1
        else:
            window[key] = 1
            for cand in window:
                break
            del window[cand]
        m = hash((cand, p._seed))
        mask = p._mask
        i = m & mask
        t = p._table
        bar = p._bar - pending.get(cand, 0)
        f = _LO[t[i]]
        if f < bar:  # row 0 refuses the candidate: most misses end here
            del data[cand]
            ticks = p._ticks - 1
            if ticks:
                p._ticks = ticks
                return
            p._ticks = _SAMPLE
            if p._adaptive:
                ghosts = p._wghost
                ghosts[cand] = _LOST_WINDOW
                if len(ghosts) > p._ghost_limit:
                    ghosts.popitem(False)
            return
        code = _LOST_WINDOW
        if f:
            b = ((m >> 32) | 1) & mask
            i = (i + b) & mask
            c = _HI[t[i]]
            if c >= bar:
                if c:
                    if c < f:
                        f = c
                    w = p._width
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
                                if f != bar or not p._tie_ok:
                                    settle = self._settle
                                    del data[settle(cand, victim, f)]
                                    return
                                p._tie = True
                                code = _LOST_TIE
                        elif bar or not p._tie_ok:
                            settle = self._settle
                            del data[settle(cand, victim, 0)]
                            return
                        else:
                            p._tie = True
                            code = _LOST_TIE
                elif bar or not p._tie_ok:
                    settle = self._settle
                    del data[settle(cand, victim, 0)]
                    return
                else:
                    p._tie = True
                    code = _LOST_TIE
        elif bar or not p._tie_ok:
            settle = self._settle
            del data[settle(cand, victim, 0)]
            return
        else:
            p._tie = True
            code = _LOST_TIE
        del data[cand]
        ticks = p._ticks - 1
        if ticks:
            p._ticks = ticks
            return
        p._ticks = _SAMPLE
        if p._adaptive:
            ghosts = p._wghost
            ghosts[cand] = code
            if len(ghosts) > p._ghost_limit:
                ghosts.popitem(False)
        return

    def _set(self, key: Hashable, value: Any) -> None:
        """``__setitem__`` of every cache but unit-weight W-TinyLFU (TACache, ``getsizeof``)."""
        data = self._data
        if self._unit:  # no getsizeof, maxsize >= 1, a policy's own miss path
            if key in data:
                data[key] = value
                self._access(key)
                return
            data[key] = value
            lost = self._miss(key)
            try:
                del data[lost]  # the steady path: one key left
            except TypeError:  # a list (unhashable): the policy's general path, any victims
                for victim in lost:
                    del data[victim]
            return
        if self._sizes is None:
            raise ValueError("value too large")  # maxsize 0
        sizes = self._sizes
        size = self.getsizeof(value)
        if size > self._maxsize:
            raise ValueError("value too large")
        if not size >= 0:  # negative, or NaN (which would make currsize NaN from then on)
            raise ValueError(f"value size must be non-negative, got {size!r}")
        old = sizes.get(key)
        data[key] = value
        sizes[key] = size
        self._size += size - (old or 0)
        victims = self._insert(key, size)
        for victim in victims:
            del data[victim]
            self._size -= sizes.pop(victim)

    def __delitem__(self, key: Hashable) -> None:
        del self._data[key]
        self._policy.remove(key)
        if self._sizes is not None:
            self._size -= self._sizes.pop(key)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self._data!r}, maxsize={self.maxsize!r}, "
                f"currsize={self.currsize!r})")

    def __copy__(self) -> "_PolicyCache":
        raise TypeError(f"{type(self).__name__} cannot be copied")

    @property
    def currsize(self) -> float:
        return len(self._data) if self._sizes is None else self._size

    def pop(self, key: Hashable, default: Any = _MISSING) -> Any:
        if key in self._data:
            value = self._data[key]
            del self[key]
            return value
        if default is _MISSING:
            raise KeyError(key)
        return default

    def setdefault(self, key: Hashable, default: Any = None) -> Any:
        if key in self._data:
            return self[key]
        self[key] = default
        return default

    def popitem(self) -> tuple[Hashable, Any]:
        """Remove and return the ``(key, value)`` pair the policy would evict next."""
        if not self._data:
            raise KeyError(f"{type(self).__name__} is empty")
        key = self._policy.next_victim()
        value = self._data[key]
        del self[key]
        return key, value

    def _bind(self) -> None:
        policy = self._policy
        self._access = policy.access
        self._insert = policy.insert
        # The unit-weight miss path: the key is known to be absent, skip the policy's checks.
        # (a bound method, not a lambda: the cache must stay picklable, as cachetools' are)
        self._miss: Callable[[Hashable], Any] = getattr(policy, "_miss", None) or self._insert_one
        # W-TinyLFU's steady miss is written out in __setitem__ (for the policy class itself,
        # not a subclass that may change it).
        own = getattr(type(policy), "_miss", None) is WTinyLFUPolicy._miss
        self._unit = self._sizes is None and self._maxsize >= 1
        self._steady = policy if own and self._unit else None
        # W-TinyLFU's hit on a protected entry is "move to the MRU end, count one use"; the
        # cache does it itself (one call less per hit). The dicts are never rebound, so their
        # bound methods are kept (see __getitem__ for why bound methods).
        hot = getattr(policy, "_protected", None)
        self._hot = OrderedDict() if hot is None else hot
        self._move = self._hot.move_to_end
        self._logged: Callable[[Any], None] = getattr(policy, "_logged", None) or [].append
        if own:
            self._settle = policy._settle

    def __setstate__(self, state: dict) -> None:
        # pickle and deepcopy: W-TinyLFU's "no victim cached" marker is a module sentinel
        # compared by identity, and a copy of it is a new object the policy took for a key
        # (KeyError on the next miss of an unpickled cache). Put the sentinel itself back; a
        # real key is never a bare object() copy of it, and _NOKEY only means "look it up".
        self.__dict__.update(state)
        policy = self._policy
        if type(getattr(policy, "_victim", None)) is object:
            policy._victim = _NOKEY
        # The bound methods kept on the cache (_move, _logged, _access, ...) were copied bound
        # to the copies of the policy's dicts made while copying the cache's own state, which
        # a deep copy may pair with another policy object than the copy's: bind them afresh.
        self._bind()

    def _insert_one(self, key: Hashable) -> list:
        return self._policy.insert(key, 1)

    def clear(self) -> None:
        self._data.clear()
        if self._sizes is not None:
            self._sizes.clear()
        self._size = 0
        self._policy = self._policy_class(max(1, self.maxsize), **self._options)
        self._bind()


class TinyLFUCache(_PolicyCache):
    """A ``cachetools.Cache`` with W-TinyLFU eviction and admission (``policy_options`` go to
    :class:`~mlcache.policies.wtinylfu.WTinyLFUPolicy`)."""

    _policy_class = WTinyLFUPolicy


class TACache(_PolicyCache):
    """A ``cachetools.Cache`` ordered by TAC event timestamps.

    Plain mapping use sees TAC as LRU (every access is "now"). Give event times with
    :meth:`touch` (an access at ``ts``) and :meth:`hint` (expected use at ``ts``).
    """

    _policy_class = TACPolicy

    def touch(self, key: Hashable, ts: float) -> None:
        if key in self._data:
            self._policy.access(key, ts)

    def hint(self, key: Hashable, ts: float) -> None:
        self._policy.hint(key, ts)
