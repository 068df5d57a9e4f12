"""mlcache.policies — which entry leaves a bounded level.

Policies see keys, weights and timestamps, never values, and do no I/O.
"""
from .base import BasePolicy, Policy, available_policies, get_policy, register_policy
from .clock import ClockPolicy
from .lru import LRUPolicy

__all__ = [
    "Policy",
    "BasePolicy",
    "register_policy",
    "get_policy",
    "available_policies",
    "LRUPolicy",
    "ClockPolicy",
]
