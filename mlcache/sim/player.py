"""The player: runs any registered policy over a trace and counts hits, misses and evictions.

The policy object is the very one the heap level uses (DESIGN §4), so a figure from the
simulator is a figure about production code. Per request: a resident key is a hit and is
``access``-ed; otherwise it is a miss and is ``insert``-ed, and the keys the policy returns
(other than a refused newcomer) are evictions. Event times are the trace's ``ts`` when it has
them, else the request index, so TAC sees a clock either way.

Policies that need the future (``needs_future = True``, e.g. Bélády) are built with the trace.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

from mlcache.policies import get_policy

from .readers import Trace

__all__ = ["SimResult", "make_policy", "play"]


@dataclass
class SimResult:
    policy: str
    capacity: int
    requests: int
    hits: int
    evictions: int
    rejections: int
    seconds: float

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    @property
    def hit_ratio(self) -> float:
        """Hits per request, in percent."""
        return 100.0 * self.hits / self.requests if self.requests else 0.0

    def as_row(self) -> dict[str, Any]:
        return {"policy": self.policy, "capacity": self.capacity, "requests": self.requests,
                "hit %": round(self.hit_ratio, 2), "evictions": self.evictions,
                "rejections": self.rejections, "seconds": round(self.seconds, 3)}


def make_policy(name: str, capacity: int, trace: Sequence[Hashable] | Trace | None = None,
                **options: Any) -> Any:
    """Build the registered policy ``name``; give it the future if it needs it."""
    cls = get_policy(name)
    if getattr(cls, "needs_future", False):
        keys = trace.keys if isinstance(trace, Trace) else trace
        if keys is None:
            from mlcache.errors import ConfigError

            raise ConfigError("policy", f"policy {name!r} needs the whole trace (the future)")
        return cls(capacity, trace=keys, **options)
    return cls(capacity, **options)


def play(policy: Any, trace: Trace | Sequence[Hashable], capacity: int | None = None, *,
         progress: Callable[[int], None] | None = None, chunk: int = 65536,
         **options: Any) -> SimResult:
    """Replay ``trace`` through ``policy`` (a registered name or a policy object)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        # a negative chunk replayed nothing and reported every request as a miss
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    # The keys are read once, before the policy is built: a policy that needs the future got
    # an iterator first and consumed it, and the replay then saw no requests at all.
    keys = trace.keys if isinstance(trace, Trace) else list(trace)
    if isinstance(policy, str):
        if capacity is None:
            from mlcache.errors import ConfigError

            raise ConfigError("capacity", "a capacity is needed to build a policy by name")
        policy = make_policy(policy, capacity, keys, **options)
    ts_list = trace.ts if isinstance(trace, Trace) else None
    weights = trace.weights if isinstance(trace, Trace) else None
    for what, column in (("ts", ts_list), ("weights", weights)):
        # a shorter column was an IndexError mid-replay, a longer one was silently cut
        if column is not None and len(column) != len(keys):
            raise ValueError(f"trace {getattr(trace, 'name', '')!r} has {len(keys)} keys but "
                             f"{len(column)} {what}")
    contains = policy.__contains__
    access, insert = policy.access, policy.insert
    hits = evictions = rejections = 0
    start = time.perf_counter()
    n = len(keys)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        if ts_list is None and weights is None:
            for i in range(lo, hi):
                key = keys[i]
                if contains(key):
                    hits += 1
                    access(key, i)
                else:
                    victims = insert(key, 1, i)
                    if victims:
                        evictions += len(victims)
                        if key in victims:
                            evictions -= 1
                            rejections += 1
        else:
            for i in range(lo, hi):
                key = keys[i]
                t = ts_list[i] if ts_list is not None else i
                if contains(key):
                    hits += 1
                    access(key, t)
                else:
                    victims = insert(key, weights[i] if weights is not None else 1, t)
                    if victims:
                        evictions += len(victims)
                        if key in victims:
                            evictions -= 1
                            rejections += 1
        if progress is not None:
            progress(hi - lo)
    seconds = time.perf_counter() - start
    return SimResult(policy=getattr(policy, "name", type(policy).__name__),
                     capacity=int(getattr(policy, "capacity", capacity or 0)), requests=n,
                     hits=hits, evictions=evictions, rejections=rejections, seconds=seconds)
