"""The Policy protocol and the registry of policies by name.

A policy decides which key leaves a bounded level. It sees keys, weights and timestamps, never
values, and does no I/O — so the very same object runs inside the heap level and inside the
trace simulator (``mlcache.sim``). Storage owns the values and the byte accounting; the policy
only answers "who leaves".

Contract (checked for every registered policy by ``tests/test_policy_contract.py``):

* ``insert(key, weight, ts)`` adds ``key`` (or, if already present, updates its weight and
  counts as an access) and returns the keys that must leave so the total weight fits
  ``capacity``. The list may hold ``key`` itself when the policy declines to admit it, or when
  its weight alone exceeds the capacity. Returned keys are no longer tracked. A weight is a
  non-negative number (0 is allowed); a negative or NaN weight is a ``ValueError`` and a
  non-number a ``TypeError``, raised before anything changes (a NaN total never exceeds the
  capacity again, a negative one lets the policy hold more than it).
* ``access(key, ts)`` records a hit; ``remove(key)`` forgets a key (the storage deleted it);
  both are no-ops for unknown keys.
* ``hint(key, ts)`` says the key is expected at event time ``ts`` (TAC uses it); default no-op.
* ``resize(capacity)`` changes the bound and returns the victims needed to fit it.
* ``len(policy)``, ``key in policy`` and ``policy.total_weight`` describe what is tracked.

Third-party policies register with :func:`register_policy` or through the ``mlcache.policies``
entry-point group (``name = "package.module:Class"``).
"""
from __future__ import annotations

import threading
from typing import Any, ClassVar, Hashable, Iterator, Protocol, runtime_checkable

__all__ = ["Policy", "BasePolicy", "register_policy", "get_policy", "available_policies"]


@runtime_checkable
class Policy(Protocol):
    name: ClassVar[str]
    capacity: int

    def insert(self, key: Hashable, weight: int = 1, ts: float | None = None) -> list: ...

    def access(self, key: Hashable, ts: float | None = None) -> None: ...

    def remove(self, key: Hashable) -> None: ...

    def hint(self, key: Hashable, ts: float) -> None: ...

    def resize(self, capacity: int) -> list: ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


class BasePolicy:
    """Convenience base: capacity validation, weight bookkeeping, no-op hint."""

    name: ClassVar[str] = ""

    def __init__(self, capacity: int, **options: Any) -> None:
        _check_capacity(capacity)
        if options:
            raise _config_error(f"policy.{self.name}", f"unknown options {sorted(options)}")
        self.capacity = int(capacity)
        self.total_weight = 0

    def hint(self, key: Hashable, ts: float) -> None:
        return None

    def __copy__(self) -> "BasePolicy":
        # A shallow copy shares the tracking dicts but not the counters: an insert into either
        # copy changed both key sets and one total_weight, and the other then disagreed with
        # what it held. Deep copies and pickles are whole, as for the cachetools drop-ins.
        raise TypeError(f"{type(self).__name__} cannot be shallow-copied (copy.deepcopy or "
                        f"pickle it)")

    def keys(self) -> Iterator[Hashable]:  # pragma: no cover - overridden
        return iter(())

    def _insert_each(self, keys: list, ts: float | None, fresh: bool) -> list:
        """``insert(key, 1, ts)`` for each of ``keys``: the keys that left, each once (what an
        ``insert_many`` does where its batched path does not apply)."""
        lost: list = []
        insert = self.insert  # type: ignore[attr-defined]  # (every policy has one)
        for key in keys:
            out = insert(key, 1, ts)
            if out:
                lost.extend(out)
        if lost and not fresh:
            # A key resident before the batch may leave, come back as a key of the batch and
            # leave again, or stay: one result per key that is gone, none for a key still
            # resident (distinct absent keys, as ``fresh`` promises, never do that).
            lost = [k for k in dict.fromkeys(lost) if k not in self]  # type: ignore[operator]
        return lost


def _config_error(field: str, message: str) -> Exception:
    from mlcache.errors import ConfigError

    return ConfigError(field, message)


def _check_heavy(weight: Any, capacity: Any) -> None:
    """For a weight that compares as a number but is not ``0 <= weight <= capacity``: return if
    it is merely heavier than the capacity (the policy refuses the entry), else (negative, NaN)
    raise a ValueError naming it."""
    if not weight > capacity:
        raise ValueError(f"weight must be a non-negative number, got {weight!r}")


def _check_number(weight: Any) -> None:
    """In a policy's ``except TypeError`` around its weight test: a weight that does not compare
    with numbers is named; else the TypeError was not the weight's (the caller re-raises it)."""
    try:
        weight >= 0  # noqa: B015 - the comparison is the test
    except TypeError:
        raise TypeError(f"weight must be a number, got {type(weight).__name__} {weight!r}"
                        ) from None


def _check_capacity(capacity: Any) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise _config_error("capacity", f"must be a positive integer, got {capacity!r}")


_REGISTRY: dict[str, type] = {}
# hint is optional (a policy without it gets none); everything else the levels and the player call
_REQUIRED_METHODS = ("insert", "access", "remove", "resize", "__len__", "__contains__")
_LOCK = threading.Lock()
_ENTRY_POINTS_LOADED = False  # loading has started (in some thread)
_ENTRY_POINTS_DONE = False  # loading has finished
_ENTRY_POINTS_LOCK = threading.RLock()
_ENTRY_POINT_FAILURES: list[str] = []
_BUILTIN_MODULES = ("lru", "clock", "wtinylfu", "tac", "belady", "dedup", "slidem", "sieve")


def register_policy(name: str, cls: type | None = None) -> Any:
    """Register ``cls`` under ``name``; usable as ``@register_policy("name")``."""

    def _do(c: type) -> type:
        if not name or not isinstance(name, str):
            raise _config_error("policy", f"invalid policy name {name!r}")
        # Refused here, where the mistake is, rather than when a level first builds or feeds it
        # (a name taken by something that is not a policy class, possibly a built-in's name).
        if not isinstance(c, type):
            raise _config_error("policy", f"policy {name!r} must be a class, got {c!r}")
        missing = [m for m in _REQUIRED_METHODS if not callable(getattr(c, m, None))]
        # the protocol's name (the manager reads it: a class without one was accepted here,
        # then CacheManager(...) failed with AttributeError 'name')
        if not isinstance(getattr(c, "name", None), str):
            missing.append("name (a str class attribute)")
        if missing:
            raise _config_error("policy", f"policy {name!r} ({c.__qualname__}) does not implement "
                                          f"the Policy protocol: no {', '.join(missing)}")
        with _LOCK:
            _REGISTRY[name] = c
        return c

    return _do(cls) if cls is not None else _do


def _load_builtins() -> None:
    import importlib

    for mod in _BUILTIN_MODULES:
        try:
            importlib.import_module(f"mlcache.policies.{mod}")
        except ModuleNotFoundError as exc:  # a policy module not shipped in this build
            if exc.name != f"mlcache.policies.{mod}":
                raise


def _load_entry_points() -> None:
    if _ENTRY_POINTS_DONE:
        return
    # Another thread waits here until the loading thread is done: the flag alone let it through
    # while plugins were still importing, and it got "unknown policy" for one of them. The
    # lock is reentrant and the flag set first, so a plugin that looks a policy up while being
    # loaded returns at once (as before).
    with _ENTRY_POINTS_LOCK:
        _load_entry_points_locked()


def _load_entry_points_locked() -> None:
    global _ENTRY_POINTS_LOADED, _ENTRY_POINTS_DONE
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    _load_builtins()
    from importlib.metadata import entry_points

    # One entry point that fails to load (a broken or non-policy plugin) neither stops the
    # others nor is forgotten: it raised out of the first lookup only, every later lookup then
    # said "unknown policy" without it, and the entry points after it were never registered.
    failures = []
    for ep in entry_points(group="mlcache.policies"):
        if ep.name not in _REGISTRY:
            try:
                register_policy(ep.name, ep.load())
            except Exception as exc:
                failures.append(f"{ep.name} = {ep.value!r} ({type(exc).__name__}: {exc})")
    _ENTRY_POINT_FAILURES[:] = failures
    _ENTRY_POINTS_DONE = True


def available_policies() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def get_policy(name: str) -> type:
    """Return the policy class registered as ``name`` or raise ``ConfigError`` listing names."""
    if name not in _REGISTRY:
        _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        failed = (f"; entry points that failed to load: {'; '.join(_ENTRY_POINT_FAILURES)}"
                  if _ENTRY_POINT_FAILURES else "")
        raise _config_error("policy", f"unknown policy {name!r}; registered: "
                                      f"{available_policies()}{failed}") from None
