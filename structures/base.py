"""The common ground of every cacheable structure: identity, storage, metadata and nesting.

A structure is a thin Python object over manager entries. It owns a *namespace* of the manager
(``manager.namespace("<kind>:<name>")``) that holds its contents, one entry per dict key, per
set element, per list chunk or per quadtree node, and one *metadata* entry in the shared
``mlcache.structures`` namespace, keyed by ``(kind, name)``, that holds what a reopen needs:
the length, the chunk layout, the bounds. Opening a structure by a name that already has a
metadata entry reopens it, so after ``close()`` (or a restart over a durable last level) the
same call finds the same contents.

The metadata is kept in the object and written through on every change (``put`` of a
heap-resident entry is cheap); it is never recomputed by scanning. Because two Python objects
for the same structure would each hold their own copy, the objects are deduplicated per
manager: ``manager.dict("x") is manager.dict("x")`` while the first one is alive.

Nesting. A value that is itself a structure is stored as a small reference,
``("\\x00mlcache.structure", kind, name)``, a plain tuple so that it encodes with msgpack even
with ``allow_pickle=False``; reading the entry resolves it back to the live structure. A class
instance was the obvious alternative but would force the pickle fallback on every such entry.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from mlcache.levels.heap import _SAMPLE, _alloc, estimate_size
from mlcache.manager import CacheManager

__all__ = ["Cacheable", "StructureRef", "META_NAMESPACE", "open_structure", "list_structures"]

META_NAMESPACE = "mlcache.structures"
_REF_TAG = "\x00mlcache.structure"
_MISSING: Any = object()
_LIST_SPLIT = sys.getsizeof([])
_INT_WEIGHT = estimate_size(1 << 20)   # any int past the small ones and under 2 ** 30
_ONE_DIGIT = 1 << 30

S = TypeVar("S", bound="Cacheable")
F = TypeVar("F", bound=Callable[..., Any])

# manager -> {(kind, name): live structure}; weak on both sides so neither keeps the other.
_LIVE: "weakref.WeakKeyDictionary[Any, weakref.WeakValueDictionary]" = weakref.WeakKeyDictionary()
_LIVE_LOCK = threading.RLock()
# kind -> the class that opens it (the first class to claim the kind: a user's subclass of
# CacheableDict does not take "dict" over)
_KINDS: dict[str, type["Cacheable"]] = {}


def _after_fork() -> None:
    """In a forked child: a structure's lock (or the registry's) held by a thread of the
    parent stays held, as no such thread exists here; start with fresh ones, as the manager
    does with its own lock."""
    global _LIVE_LOCK
    _LIVE_LOCK = threading.RLock()
    for live in list(_LIVE.values()):
        for obj in list(live.values()):
            obj._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class StructureRef:
    """A reference to a structure found inside a plain container value (e.g. a list of
    structures pickled as one entry); ``ref.open(manager)`` returns the structure."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name

    def open(self, manager: Any) -> "Cacheable":
        return open_structure(manager, self.kind, self.name)

    def __reduce__(self) -> tuple:
        return (StructureRef, (self.kind, self.name))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StructureRef) and self.kind == other.kind
                and self.name == other.name)

    def __hash__(self) -> int:
        return hash((self.kind, self.name))

    def __repr__(self) -> str:
        return f"StructureRef({self.kind!r}, {self.name!r})"


def open_structure(manager: Any, kind: str, name: str, **options: Any) -> "Cacheable":
    """Return the structure ``kind``/``name`` of ``manager``: the live object if there is
    one, else the registered factory's (for kinds registered by other modules, e.g. windows).

    Over anything but a CacheManager (a Spark partition scope, whose ``structure`` is this
    function) a kind of this package opens through its class: through ``manager.structure``
    it recursed until RecursionError for every structure nested in a scope's state whose
    object was not alive (each task's scope is new)."""
    cls = _KINDS.get(kind)
    if cls is not None and not isinstance(manager, CacheManager):
        return cls.open(manager, name, **options)
    with _LIVE_LOCK:
        live = _LIVE.get(manager)
        if live is not None:
            obj = live.get((kind, name))
            if obj is not None:
                return obj
    return manager.structure(kind, name, **options)


def live_under(manager: Any, prefix: bytes) -> list["Cacheable"]:
    """The live structures of ``manager`` whose contents are keys starting with ``prefix``
    (what ``invalidate_local`` forgets for that prefix)."""
    with _LIVE_LOCK:
        live = _LIVE.get(manager)
        objs = list(live.values()) if live is not None else []
    return [o for o in objs if o._ns._prefix.startswith(prefix)]


def _check_name(name: Any) -> str:
    if name is None:
        return uuid.uuid4().hex
    if not isinstance(name, str) or not name or "\x1f" in name:
        raise ValueError(f"a structure name must be a non-empty string without \\x1f, got {name!r}")
    return name


def locked(method: F) -> F:
    """``method`` run holding the structure's lock (reentrant: a locked method may call another)."""
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return cast(F, run)


class Cacheable:
    """Base of the cacheable structures.

    Subclasses set ``kind``, implement ``_new_meta(**options)`` (the metadata of a new,
    empty structure) and may override ``_check_meta(meta, **options)`` to reject a reopen
    with incompatible options. Contents live in ``self._ns``; ``self._meta`` is a dict
    written back with :meth:`_save_meta` after every change.
    """

    kind: ClassVar[str] = ""
    # False for a structure that makes its contents' byte keys itself (the quadtree): its
    # namespace then keeps no key memo, which would only take a share of the heap budget.
    _memo_keys: ClassVar[bool] = True
    # The int fields of the metadata that change as the structure does (its length, a list's
    # head): with them named, the metadata goes to the heap with a weight worked out from them
    # and the rest, weighed once (the other fields are fixed for the structure's life), rather
    # than by the heap's walk over the whole dict on every write.
    _meta_counts: ClassVar[tuple[str, ...]] = ()
    # ``_ver`` counts changes made through this object (live objects are one per structure and
    # manager), so an iterator can tell that the structure changed under it, as list's and
    # dict's iterators do. ``_lock`` makes each operation of the dict, list and set one step, as
    # the GIL makes a builtin's: an operation reads the metadata, then entries, then writes both,
    # and two threads interleaving those steps lost appends and counted a key twice.
    __slots__ = ("_manager", "_name", "_ns", "_metans", "_meta", "_ver", "_put_weighed",
                 "_meta_w", "_lock", "__weakref__")
    # All its state is in the manager (the metadata is saved on every change): the manager
    # holds it weakly, and one not in use is opened again when needed.
    _held_weakly = True
    # the slots' types, for mypy (annotations only: the slots are the storage)
    _manager: Any
    _name: str
    _ns: Any
    _metans: Any
    _meta: dict[str, Any]
    _ver: int
    _lock: Any   # a threading.RLock
    # the manager's ``_put_items`` when entries go to a heap bounded in bytes with weights
    # worked out here, else None (see :func:`weighed_puts`)
    _put_weighed: Callable[..., None] | None
    _meta_w: tuple[dict[str, Any], int, int] | None   # (the metadata, its size, fixed part)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _KINDS.setdefault(cls.kind, cls)

    def __init__(self, manager: Any, name: str | None = None, **options: Any) -> None:
        raise TypeError(f"open a {type(self).__name__} with manager.{self.kind}(name) or "
                        f"{type(self).__name__}.open(manager, name)")

    # -- identity ----------------------------------------------------------------------------

    @classmethod
    def open(cls: type[S], manager: Any, name: str | None = None, **options: Any) -> S:
        """Create the structure ``name`` in ``manager``, or reopen it if it exists.

        ``name=None`` creates an anonymous structure with a fresh unique name (useful for
        values nested in another structure)."""
        name = _check_name(name)
        key = (cls.kind, name)
        with _LIVE_LOCK:
            live = _LIVE.get(manager)
            if live is None:
                live = weakref.WeakValueDictionary()
                _LIVE[manager] = live
            obj = live.get(key)
            if obj is not None:
                if not isinstance(obj, cls):
                    raise TypeError(f"{name!r} is open as a {type(obj).__name__}")
                obj._check_meta(obj._meta, **options)
                return obj
            metans = manager.namespace(META_NAMESPACE)
            meta = metans.get(key)
            obj = object.__new__(cls)
            obj._manager = manager
            obj._name = name
            obj._metans = metans
            obj._ver = 0
            obj._meta_w = None
            obj._lock = threading.RLock()
            obj._attach()
            ns_name = f"{cls.kind}:{name}"
            obj._ns = (manager.namespace(ns_name) if cls._memo_keys
                       else manager.namespace(ns_name, memo=False))
            obj._put_weighed = weighed_puts(manager, metans, obj._ns)
            if meta is None:
                meta = obj._new_meta(**options)
                meta["kind"] = cls.kind
                obj._meta = meta
                obj._save_meta()
            else:
                meta = dict(meta)
                obj._check_meta(meta, **options)
                obj._meta = meta
            live[key] = obj
            return obj

    @property
    def name(self) -> str:
        return self._name

    @property
    def uid(self) -> str:
        """Stable, unique within a manager's namespace, the same after a restart."""
        return f"{self.kind}:{self._name}"

    @property
    def manager(self) -> Any:
        return self._manager

    def _attach(self) -> None:
        """Called once when the object is made, after ``_ns`` and before the metadata is
        read: a subclass opens its other namespaces here."""

    # -- metadata ----------------------------------------------------------------------------

    def _new_meta(self, **options: Any) -> dict[str, Any]:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        return {"len": 0}

    def _check_meta(self, meta: dict[str, Any], **options: Any) -> None:
        if meta.get("kind", self.kind) != self.kind:
            raise TypeError(f"{self._name!r} is a {meta.get('kind')}, not a {self.kind}")
        if options:   # (a subclass with options takes them as parameters: none are left here)
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")

    def _save_meta(self) -> None:
        counts = self._meta_counts
        put_items = self._put_weighed
        meta = self._meta
        if not counts or put_items is None or len(meta) > _SAMPLE:
            # (the heap samples a dict bigger than _SAMPLE: its weight is no sum of parts)
            self._metans.put((self.kind, self._name), meta)
            return
        w = self._meta_w
        if w is None or w[0] is not meta or w[1] != len(meta):
            fixed = estimate_size(meta) - sum(int_weight(meta[k]) for k in counts)
            w = self._meta_w = (meta, len(meta), fixed)
        weight = w[2]
        for k in counts:
            weight += int_weight(meta[k])
        key = (self.kind, self._name)
        put_items([(key, self._metans._kb(key), meta)], None, [weight])

    def _add_len(self, delta: int) -> None:
        if delta:
            self._meta["len"] += delta
            self._save_meta()

    # -- nesting -----------------------------------------------------------------------------

    def _store(self, value: Any) -> Any:
        """The form of ``value`` kept in an entry: a reference for a structure."""
        if isinstance(value, Cacheable):
            if value._manager is not self._manager:
                raise ValueError(f"{value!r} belongs to another CacheManager; a structure can "
                                 "only hold structures of its own manager")
            return (_REF_TAG, value.kind, value._name)
        return value

    def _load(self, value: Any) -> Any:
        """Inverse of :meth:`_store`: resolve a stored reference to the live structure."""
        if type(value) is tuple and len(value) == 3 and value[0] == _REF_TAG:
            return open_structure(self._manager, value[1], value[2])
        return value

    # -- lifetime ----------------------------------------------------------------------------

    @locked
    def drop(self) -> None:
        """Delete the contents and the metadata, freeing the storage. The object stays usable
        as an empty structure with the same options; its metadata is written again on the
        next change. Structures nested in this one are not dropped (they may be referenced
        elsewhere)."""
        keys = list(self._ns.keys())
        if keys:
            self._ns.delete_many(keys)
        self._metans.delete((self.kind, self._name))
        self._meta = self._empty_meta()

    def _empty_meta(self) -> dict[str, Any]:
        """The in-memory metadata of this structure emptied (options kept)."""
        return {**self._meta, "len": 0}

    def _reload_meta(self) -> None:
        """Read the metadata again, as stored now (lock held): after ``invalidate_local``
        another process's changes replace this object's copy, which a write would otherwise
        have saved over them. Missing (the structure was dropped): empty, options kept."""
        meta = self._metans.get((self.kind, self._name))
        self._meta = dict(meta) if meta is not None else self._empty_meta()
        self._meta_w = None
        self._ver += 1
        self._forget_written()

    def _forget_written(self) -> None:
        """Drop what this object remembers of its own last writes (a subclass's caches)."""

    def flush(self) -> None:
        """Write this structure's dirty entries to the next level (the manager's flush)."""
        self._manager.flush()

    def __reduce__(self) -> tuple:
        # Inside a plain container value a structure travels as a reference, never by copy.
        return (StructureRef, (self.kind, self._name))

    def __copy__(self) -> Any:
        """``copy.copy``: what ``copy()`` gives (a plain dict, list or set), as ``copy.copy``
        of a built-in gives its ``copy()``; without this it fell back to ``__reduce__`` and
        returned a ``StructureRef``."""
        plain = getattr(self, "copy", None)
        if plain is None:   # a structure with no plain form: its reference, as before
            return StructureRef(self.kind, self._name)
        return plain()

    def __deepcopy__(self, memo: dict) -> Any:
        """``copy.deepcopy``: a deep copy of the plain copy, so nested structures become
        plain containers too (a snapshot of the whole state). The new container is in ``memo``
        before its contents are copied, so a structure that holds itself (``d["me"] = d``) gives
        a plain container that holds itself, as a dict's deep copy does."""
        import copy

        plain = self.__copy__()
        if isinstance(plain, StructureRef):
            return plain
        out = type(plain)()
        memo[id(self)] = out
        if isinstance(out, dict):
            for k, v in plain.items():
                out[copy.deepcopy(k, memo)] = copy.deepcopy(v, memo)
        elif isinstance(out, list):
            out.extend(copy.deepcopy(v, memo) for v in plain)
        else:
            out.update(copy.deepcopy(v, memo) for v in plain)
        return out

    __hash__ = None  # type: ignore[assignment]  # mutable, like list/dict/set

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} len={self._meta.get('len', 0)}>"


def int_weight(v: int) -> int:
    """The heap's estimate of an int (:func:`estimate_size`), short-cut for the common ones."""
    if -5 <= v <= 256:
        return 0
    if -_ONE_DIGIT < v < _ONE_DIGIT:
        return _INT_WEIGHT
    return estimate_size(v)


def list_shell(value: list[Any]) -> int:
    """The heap's estimate of a list without its items: its object and its item array, each
    rounded as the allocator rounds it (as :func:`estimate_size` counts them)."""
    size = sys.getsizeof(value)
    if size > _LIST_SPLIT:
        return _alloc(_LIST_SPLIT) + _alloc(size - _LIST_SPLIT)
    return _alloc(size)


def weighed_puts(manager: Any, *namespaces: Any) -> Callable[..., None] | None:
    """``manager._put_items``, which takes the entries' weights from the caller, when the
    heap is bounded in bytes and every one of ``namespaces`` has the manager's key maker;
    else None: a Spark partition scope has no such path, and a heap bounded by entry count
    (or no heap) weighs every entry without a walk anyway."""
    put_items = getattr(manager, "_put_items", None)
    heap = getattr(manager, "_heap", None)
    if put_items is None or heap is None or not getattr(heap, "by_bytes", False):
        return None
    if not all(callable(getattr(ns, "_kb", None)) for ns in namespaces):
        return None
    return put_items


def list_structures(manager: Any) -> list[tuple[str, str]]:
    """The ``(kind, name)`` of every structure that has metadata in ``manager``."""
    return sorted(manager.namespace(META_NAMESPACE).keys())
