"""Byte accounting for a bounded level: which entries must leave so a batch fits.

Disk and Redis keep their own byte counters in the store itself (so every process sharing the
level sees one bound); this module only does the arithmetic, the same for both, so the two
levels cannot disagree about what "full" means.

A batch is planned before anything is changed: the level first learns how many bytes the
batch adds (new sizes minus the sizes the keys already have), then either refuses
(store of record) or walks its eviction candidates, oldest access first, until the batch fits.
An incoming value larger than the whole bound is never stored: it is passed straight through as
a victim (and its older copy removed), which is what a policy does when it declines to admit a
key. If the old entries run out before the batch fits, incoming entries are passed through too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..errors import CapacityError

__all__ = ["FitPlan", "plan_fit", "batch_delta", "capacity_error"]


@dataclass
class FitPlan:
    evict: list[bytes] = field(default_factory=list)        # existing keys to remove and return
    passthrough: list[bytes] = field(default_factory=list)  # incoming keys not stored here
    used_after: int = 0


def capacity_error(level: str, used: int, adding: int, limit: int) -> CapacityError:
    return CapacityError(
        f"level {level!r} is full: {used} bytes used + {adding} bytes in this batch > "
        f"max_bytes {limit}; it is the store of record, so nothing was written "
        f"(raise max_bytes, add a level below, or mark it lossy)",
        level=level,
    )


def batch_delta(new: Mapping[bytes, int], old: Mapping[bytes, int]) -> int:
    return sum(size - old.get(key, 0) for key, size in new.items())


def plan_fit(used: int, limit: int, new: Mapping[bytes, int], old: Mapping[bytes, int],
             candidates: Iterable[tuple[bytes, int]]) -> FitPlan:
    """Plan how a batch of ``new`` sizes (``old``: current sizes of those keys) fits ``limit``.

    ``candidates`` yields ``(key, size)`` of stored entries, the first to leave first; it is
    consumed lazily and only as far as needed.
    """
    plan = FitPlan()
    total = used
    for key, size in new.items():
        if size > limit:
            plan.passthrough.append(key)
            total -= old.get(key, 0)
        else:
            total += size - old.get(key, 0)
    if total > limit:
        for key, size in candidates:
            if key in new:
                continue
            plan.evict.append(key)
            total -= size
            if total <= limit:
                break
    if total > limit:
        # The batch alone is bigger than the level: keep the smallest entries, pass the rest.
        staying = sorted((k for k in new if k not in plan.passthrough), key=lambda k: new[k],
                         reverse=True)
        for key in staying:
            if total <= limit:
                break
            plan.passthrough.append(key)
            total -= new[key]
    plan.used_after = total
    return plan
