"""mlcache.policies — which entry leaves a bounded level.

Policies see keys, weights and timestamps, never values, and do no I/O.
"""
from .base import BasePolicy, Policy, available_policies, get_policy, register_policy
from .belady import BeladyPolicy
from .clock import ClockPolicy
from .lru import LRUPolicy
from .tac import TACPolicy
from .wtinylfu import WTinyLFUPolicy

__all__ = [
    "Policy",
    "BasePolicy",
    "register_policy",
    "get_policy",
    "available_policies",
    "LRUPolicy",
    "ClockPolicy",
    "WTinyLFUPolicy",
    "TACPolicy",
    "BeladyPolicy",
    "TinyLFUCache",
    "TACache",
]


def __getattr__(name: str):
    # The cachetools drop-ins import cachetools: load them only when asked for.
    if name in ("TinyLFUCache", "TACache"):
        from . import cachetools_compat

        return getattr(cachetools_compat, name)
    raise AttributeError(f"module 'mlcache.policies' has no attribute {name!r}")
