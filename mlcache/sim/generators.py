"""Synthetic traces: the workload shapes the policy literature tests against.

Every generator is deterministic for a given ``seed`` and returns a :class:`Trace` of integer
keys (numpy does the sampling; keys are converted to Python ints once, at the end).

* :func:`zipf` — key ``i`` (0-based rank) requested with probability ∝ 1/(i+1)^alpha over a
  finite key space: the classic skewed web/KV workload. The hottest keys are the small ints.
* :func:`scrambled_zipf` — the same popularity, with ranks mapped to keys by a random
  permutation (YCSB's "scrambled Zipfian"), so popularity is not correlated with key order.
* :func:`hotspot` — a fraction of the keys receives a fraction of the requests, uniformly.
* :func:`loop` — ``0, 1, ..., length-1`` repeated: LRU's worst case when length > capacity.
* :func:`scan` — every key once: no policy can hit; measures pollution when mixed in.
* :func:`shifting_hot_set` — a hot set that moves to new keys every ``phase`` requests,
  probing how fast a policy forgets.
* :func:`phase_change` — ``a, b, a`` (Caffeine's corda → loop → corda): a recency phase, a
  frequency phase, and the first again, which punishes a policy that cannot switch back.
"""
from __future__ import annotations

import numpy as np

from .readers import Trace

__all__ = ["zipf", "scrambled_zipf", "hotspot", "loop", "scan", "shifting_hot_set",
           "phase_change", "concat"]


def _count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")


def _zipf_ranks(n_keys: int, n_requests: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    # A bad parameter is named here, not left to numpy: n_keys 0 was an IndexError, a NaN alpha
    # silently gave key 0 for every request, a negative one made the largest keys the hottest.
    _count("n_requests", n_requests, 0)
    _count("n_keys", n_keys, 1)
    if not 0.0 <= alpha < float("inf"):
        raise ValueError(f"alpha must be a finite number >= 0 (0 is uniform), got {alpha!r}")
    weights = 1.0 / np.arange(1, n_keys + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n_requests), side="right")


def zipf(n_requests: int = 1_000_000, n_keys: int = 100_000, alpha: float = 0.9,
         seed: int = 1) -> Trace:
    ranks = _zipf_ranks(n_keys, n_requests, alpha, np.random.default_rng(seed))
    return Trace(name=f"zipf{alpha:g}", keys=ranks.tolist(),
                 meta={"n_keys": n_keys, "alpha": alpha, "seed": seed})


def scrambled_zipf(n_requests: int = 1_000_000, n_keys: int = 100_000, alpha: float = 0.9,
                   seed: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_keys)
    ranks = _zipf_ranks(n_keys, n_requests, alpha, rng)
    return Trace(name=f"scrambled-zipf{alpha:g}", keys=perm[ranks].tolist(),
                 meta={"n_keys": n_keys, "alpha": alpha, "seed": seed})


def hotspot(n_requests: int = 1_000_000, n_keys: int = 100_000, hot_fraction: float = 0.1,
            hot_probability: float = 0.9, seed: int = 1) -> Trace:
    _count("n_requests", n_requests, 0)
    _count("n_keys", n_keys, 1)
    _fraction("hot_fraction", hot_fraction)
    _fraction("hot_probability", hot_probability)
    rng = np.random.default_rng(seed)
    n_hot = max(1, int(n_keys * hot_fraction))
    is_hot = rng.random(n_requests) < hot_probability
    keys = np.where(is_hot, rng.integers(0, n_hot, n_requests),
                    # every key hot (hot_fraction 1, or one key): the cold draw is from the
                    # same keys; it drew key n_keys, outside the key space, for 1 - p of them
                    rng.integers(n_hot if n_hot < n_keys else 0, n_keys, n_requests))
    return Trace(name="hotspot", keys=keys.tolist(),
                 meta={"n_keys": n_keys, "hot_fraction": hot_fraction,
                       "hot_probability": hot_probability})


def loop(length: int = 1000, n_requests: int = 100_000) -> Trace:
    _count("length", length, 1)  # 0 divided by zero (a warning and keys of 0), < 0 gave negatives
    _count("n_requests", n_requests, 0)
    keys = (np.arange(n_requests) % length).tolist()
    return Trace(name=f"loop{length}", keys=list(keys), meta={"length": length})


def scan(n_requests: int = 100_000, start: int = 0) -> Trace:
    _count("n_requests", n_requests, 0)
    return Trace(name="scan", keys=list(range(start, start + n_requests)))


def shifting_hot_set(n_requests: int = 1_000_000, n_keys: int = 100_000, hot_size: int = 1000,
                     phase: int = 100_000, hot_probability: float = 0.9, seed: int = 1) -> Trace:
    _count("n_requests", n_requests, 0)
    _count("n_keys", n_keys, 1)
    _count("hot_size", hot_size, 1)
    _count("phase", phase, 1)
    _fraction("hot_probability", hot_probability)
    rng = np.random.default_rng(seed)
    idx = np.arange(n_requests)
    base = (idx // phase) * hot_size  # each phase's hot set is a fresh block of keys
    hot = (base + rng.integers(0, hot_size, n_requests)) % n_keys
    cold = rng.integers(0, n_keys, n_requests)
    keys = np.where(rng.random(n_requests) < hot_probability, hot, cold)
    return Trace(name="shifting-hot-set", keys=keys.tolist(),
                 meta={"hot_size": hot_size, "phase": phase})


def concat(*traces: Trace, name: str | None = None) -> Trace:
    keys: list = []
    for t in traces:
        keys.extend(t.keys)
    return Trace(name=name or "+".join(t.name for t in traces), keys=keys)


def phase_change(first: Trace, second: Trace) -> Trace:
    """``first, second, first``: e.g. corda → loop → corda."""
    return concat(first, second, first, name=f"{first.name}-{second.name}-{first.name}")
