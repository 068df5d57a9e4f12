"""CacheableDict: a ``MutableMapping`` whose items are manager entries, one per key.

``len`` is O(1): the count lives in the metadata and changes only when a key is really added
or removed, which costs one ``contains`` (or one batched ``get_many`` in ``update``) per write
of a key this object has not seen.

Order. As in a dict, iteration, the views, ``reversed``, ``repr`` and ``copy()`` follow
insertion order, and ``popitem`` removes the last inserted item. The order is an append-only
*log* of keys, in chunks of ``_LOG_CHUNK`` keys, one entry each, in a namespace of its own
(``dict.order:<name>``), so it moves between levels and survives a reopen like the items.
A new key appends to the tail chunk (one more ``get``/``put`` of an entry every insert
touches, so it stays in the heap); overwriting a key leaves its place. A deletion writes
nothing to the log: its slot is *dead*, and ``len`` tells how many there are (log length -
``len``), except that deleting the key of the log's first slot moves the log's start past it
(a dict used as a FIFO, ``del d[next(iter(d))]``, then leaves no dead slot). With no dead slot the log is the order; otherwise the last slot of each present key
counts, and the pass that worked that out (a listing of the namespace's keys) rewrites the
log without them (a loop does that first, then reads the log a batch of chunks at a time).
``popitem`` walks back from the tail, trimming dead slots. An insert
compacts the log once dead slots outnumber live ones by a chunk, so the log stays under
``2 * len + _LOG_CHUNK`` slots at O(1) amortised cost. The rejected alternative, each value
stored as ``(position, value)``, would find a key's slot on deletion but change the entries
other code reads (the Spark integration's snapshot and change listeners).

Keys are what the manager accepts: ``str``, ``int``, ``bytes`` and tuples of them; as a dict
treats ``1 == 1.0 == True`` as one key, an integral float, a ``numpy`` integer or any other
number equal to an int (``Fraction(4, 2)``, ``Decimal(3)``, ``numpy.float32(2.0)``, an
``IntEnum``) is stored as the ``int`` it equals, and a ``str`` or ``bytes`` subclass (a str
enum) as its base value: a loop gives those back, equal to the keys given. An unhashable key raises ``TypeError`` exactly as a dict does;
another hashable but unsupported key (``1.5``) raises the manager's ``TypeError`` on write
and is simply absent on read.
"""
from __future__ import annotations

import numbers
import operator
from itertools import islice
import reprlib
import sys
from collections.abc import (
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    MutableMapping,
    ValuesView,
)
from types import MappingProxyType
from typing import Any

from mlcache.errors import LevelUnavailableError
from mlcache.keys import check_key
from mlcache.levels.heap import estimate_size

from .base import _MISSING, Cacheable, int_weight, locked

__all__ = ["CacheableDict"]

_LOG_CHUNK = 256     # keys per entry of the insertion-order log
_TAIL_MAX = 8        # newest log slots kept in the metadata (weighed on every put of it)
_LOG_BATCH = 32      # log entries per batched read
_ITEM_BATCH = 1024   # values per batched read when iterating items
# the metadata without its tail's list, as the heap weighs it
# (and ``start``, 0 for most dicts, added when it is not: see _save_meta)
_META_WEIGHT = (estimate_size({"len": 10 ** 6, "kind": "dict", "order": 10 ** 6, "tail": [],
                               "start": 0})
                - sys.getsizeof([]))


_BAD: Any = object()


def _key(key: Any) -> Any:
    """The manager key standing for ``key``, or ``_BAD`` if no stored key can equal it.

    ``hash(key)`` comes first, so an unhashable key raises dict's ``TypeError``. Then, as a dict
    treats ``1 == 1.0 == True`` as one key, an integral float and any other integer type
    (``numpy.int64``, an ``IntEnum``) are folded into ``int`` (``bool`` stays), a subclass of
    ``str`` or ``bytes`` (a str enum) into its base value, as the levels key them; a tuple is
    folded element-wise. (The insertion-order log keeps the folded key: it kept the key
    object, which msgpack cannot carry, so with ``allow_pickle=False`` the log failed to
    encode on a later, unrelated insert, after that insert had stored its item.)"""
    t = type(key)
    if t is str or t is int or t is bytes or t is bool:
        return key
    hash(key)
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bytes):
        return bytes(key)
    if isinstance(key, int):
        return int(key)
    if isinstance(key, float):
        return int(key) if key.is_integer() else _BAD
    if isinstance(key, tuple):
        parts = tuple(_key(k) for k in key)
        if any(p is _BAD for p in parts):
            return _BAD
        return key if all(p is k for p, k in zip(parts, key)) else parts
    if hasattr(t, "__index__"):
        return operator.index(key)
    return _integral(key)


def _integral(key: Any) -> Any:
    """The ``int`` that a number equal to one stands for (``Fraction(4, 2)``, ``Decimal(3)``,
    ``numpy.float32(2.0)``, ``3+0j``, ``numpy.True_``), as a dict finds such a key under that
    int (same hash, equal); ``_BAD`` for any other key."""
    part: Any
    if isinstance(key, numbers.Number):
        part = getattr(key, "real", key)
    elif hasattr(type(key), "__int__"):
        part = key
    else:
        return _BAD
    try:
        i = int(part)
    except (TypeError, ValueError, OverflowError):
        return _BAD
    return i if key == i and hash(key) == hash(i) else _BAD


def _write_key(key: Any) -> Any:
    """``_key`` for a write; a key no stored key can stand for raises the manager's
    ``TypeError`` naming the type here, before the write (so ``update`` keeps the items before
    it, as a dict does: handed on, it failed the batch's lookup and no item was stored)."""
    k = _key(key)
    if k is _BAD:
        check_key(key)
        return key
    return k


def _readable(key: Any) -> bool:
    """Could ``key`` be stored? (``hash(key)`` first, so unhashable keys raise dict's TypeError.)"""
    return _key(key) is not _BAD


class CacheableDict(Cacheable, MutableMapping):
    """A dict whose entries live in the cache levels. Open with ``manager.dict(name)``."""

    kind = "dict"
    # ``_log_gen`` counts the rewrites and cuts of the log made through this object (or a
    # reload of the metadata): a loop reading the log a batch at a time knows its positions
    # still mean what they meant when it started while the count has not moved.
    # ``_front_key``: (``_log_gen``, ``start``, the key of slot ``start``), so a delete finds
    # the log's first key without reading its chunk each time (a slot's key changes only when
    # the log is rewritten, cut or reloaded, which moves ``_log_gen``).
    __slots__ = ("_ons", "_log_gen", "_front_key")
    _ons: Any
    _log_gen: int
    _front_key: tuple[int, int, Any] | None

    def _attach(self) -> None:
        self._ons = self._manager.namespace(f"{self.kind}.order:{self._name}")
        self._log_gen = 0
        self._front_key = None

    def _forget_written(self) -> None:
        self._log_gen += 1

    def _new_meta(self, **options: Any) -> dict[str, Any]:
        meta = super()._new_meta(**options)
        meta["order"], meta["tail"], meta["start"] = 0, [], 0
        return meta

    def _empty_meta(self) -> dict[str, Any]:
        return {**self._meta, "len": 0, "order": 0, "tail": [], "start": 0}

    # -- the insertion-order log ---------------------------------------------------------------
    # meta["order"] = the number of slots. The last few (< _TAIL_MAX) are meta["tail"], written
    # with the metadata every insert writes anyway; the others, slots [0, spilled), are in
    # chunks of _LOG_CHUNK keys in _ons (the last chunk may be short). meta["start"]: the slots
    # before it are gone (the log's first keys deleted in order, as a queue or a FIFO bound
    # deletes them: ``del d[next(iter(d))]``), so such a deletion leaves no dead slot, which
    # the next loop would have to drop by listing the namespace and rewriting the whole log.

    def _start(self) -> int:
        return int(self._meta.get("start", 0))

    def _order(self) -> int:
        """The log's length. A dict written before the log existed gets one, in the order its
        keys are listed (once)."""
        hi = self._meta.get("order")
        if hi is None:
            keys = list(self._ns.keys())
            self._meta["order"], self._meta["tail"] = 0, []
            self._append(keys)
            self._save_meta()
            hi = self._meta["order"]
        return int(hi)

    def _spilled(self) -> int:
        return self._order() - len(self._meta["tail"])

    def _chunk_ids(self) -> range:
        """Ids of the log's chunk entries."""
        return range(self._start() // _LOG_CHUNK,
                     (self._spilled() + _LOG_CHUNK - 1) // _LOG_CHUNK)

    def _dead(self) -> int:
        """How many slots of the log are dead."""
        return self._order() - self._start() - int(self._meta["len"])

    def _front(self) -> Any:
        """The key in the log's first slot (``_MISSING`` if the log is empty); lock held."""
        start = self._meta.get("start", 0)
        memo = self._front_key   # (a slot holds the same key in the tail or spilled)
        if memo is not None and memo[1] == start and memo[0] == self._log_gen:
            return memo[2]
        hi = self._order()
        if start >= hi:
            return _MISSING
        spilled = hi - len(self._meta["tail"])
        if start >= spilled:
            return self._meta["tail"][start - spilled]
        chunk = self._ons.get(start // _LOG_CHUNK) or ()
        off = start % _LOG_CHUNK
        key = chunk[off] if off < len(chunk) else _MISSING
        self._front_key = (self._log_gen, start, key)
        return key

    def _trim_front(self) -> None:
        """Forget the log's first slot (its key was just deleted; the caller saves the
        metadata), and its chunk once every slot of it is gone."""
        start = self._start() + 1
        self._meta["start"] = start
        if start % _LOG_CHUNK == 0 and start - _LOG_CHUNK < self._spilled():
            # (a chunk the tail spills into later is not written if all its slots are gone)
            self._ons.delete(start // _LOG_CHUNK - 1)

    def _spill_read(self, count: int) -> Any:
        """The partly full log chunk that appending ``count`` keys spills the tail into, read
        (``None`` if there is none). An insert reads it before its first write: a read can fail
        (a level down) where a write, which goes to the heap, does not, and an insert that
        failed here after storing its item left it uncounted and out of the order."""
        hi = self._order()
        tail = self._meta["tail"]
        if len(tail) + count < _TAIL_MAX:
            return None
        cid, off = divmod(hi - len(tail), _LOG_CHUNK)
        if not off:
            return None
        if (cid + 1) * _LOG_CHUNK <= self._start():   # gone (see _trim_front)
            return []
        return list(self._ons.get(cid) or ())

    def _append(self, keys: list[Any], first: Any = _MISSING) -> None:
        """Append keys to the log (the caller saves the metadata); ``first``: what
        :meth:`_spill_read` gave before the caller's writes."""
        if not keys:
            return
        if first is _MISSING:
            first = self._spill_read(len(keys))
        hi = self._order()
        tail = self._meta["tail"]
        tail.extend(keys)
        self._meta["order"] = hi + len(keys)
        if len(tail) < _TAIL_MAX:
            return
        # Spill the tail into the chunks: the first one touched may be partly full.
        s0 = hi + len(keys) - len(tail)
        cid, off = divmod(s0, _LOG_CHUNK)
        # (a chunk not found keeps its slots' places: they are gone or lost)
        chunk = (first or [None] * off) if off else []
        writes = []
        for key in tail:
            chunk.append(key)
            if len(chunk) == _LOG_CHUNK:
                writes.append((cid, chunk))
                cid, chunk = cid + 1, []
        if chunk:
            writes.append((cid, chunk))
        start = self._start()
        if start >= _LOG_CHUNK:   # chunks whose slots are all gone are not written
            writes = [(c, ch) for c, ch in writes if (c + 1) * _LOG_CHUNK > start]
        if writes:
            self._put_chunks(writes)
        self._meta["tail"] = []

    def _save_meta(self) -> None:
        """Write the metadata through, weighed from its shape (a few ints and the short
        tail) rather than by the heap's walk: with the tail in it, the walk was the larger
        part of an insert's cost (8-14 us of about 40)."""
        put_items = getattr(self._manager, "_put_items", None)
        kb = getattr(self._metans, "_kb", None)
        if put_items is None or kb is None:
            super()._save_meta()
            return
        meta, key = self._meta, (self.kind, self._name)
        tail = meta.get("tail") or ()
        weight = _META_WEIGHT + sys.getsizeof(tail) + len(tail) * (
            estimate_size(tail[-1]) if tail else 0)
        start = meta.get("start", 0)
        if start > 256:
            weight += int_weight(start)
        put_items([(key, kb(key), meta)], None, [weight])

    def _put_chunks(self, writes: list[tuple[int, list[Any]]]) -> None:
        """Write log chunks. Over a manager's own namespace each goes with a weight worked
        out from its length and one key, as the quadtree does with its nodes: the heap's
        sampling walk over a 256-key list cost more than the rest of an insert (about 40 us
        a chunk)."""
        put_items = getattr(self._manager, "_put_items", None)
        kb = getattr(self._ons, "_kb", None)
        if put_items is None or kb is None:
            self._ons.put_many(writes)
            return
        put_items([(cid, kb(cid), chunk) for cid, chunk in writes], None,
                  [sys.getsizeof(chunk) + len(chunk) * estimate_size(chunk[-1])
                   for _, chunk in writes])

    def _log(self) -> list[Any]:
        """Every slot of the log from ``start``, dead ones included."""
        out: list[Any] = []
        lo, hi = self._start(), self._order()
        step = _LOG_BATCH * _LOG_CHUNK
        while lo < hi:
            out.extend(self._log_slots(lo, min(hi, lo + step)))
            lo += step
        return out

    @locked
    def _scan_start(self) -> tuple[int, int, int]:
        """Begin a loop over the keys: the log is made the order (dead slots dropped, once) and
        its length and generation are returned, for :meth:`_scan_log`."""
        if self._dead():
            self._ordered_keys()
        return self._start(), self._meta["order"], self._log_gen

    def _scan_log(self, pos: int, stop: int, gen: int) -> Iterator[Any]:
        """The log's slots ``[0, stop)`` (a log with no dead slot is the key order), read a
        batch of chunks at a time, one chunk first, so that ``next(iter(d))`` reads one entry
        and a loop holds a batch rather than every key: reading the whole log first cost O(len)
        for the first key and held all the keys (20 MiB for 10**5 items over a 1 MiB heap).
        Slots appended after the start are not read (a loop started before an insert does
        not see it, as before). A log rewritten meanwhile with the size kept (a key swapped
        for another, then a copy) goes on after the last key read that is still there, in
        the new order; if none of the last few is, it raises as a dict whose keys changed
        during iteration does."""
        chunks = 1
        batch: list[Any] = []
        while pos < stop:
            with self._lock:
                if self._log_gen != gen:   # (checked once the last batch was all read)
                    yield from self._scan_rest(batch)
                    return
                batch = self._log_slots(pos, min(stop, pos + chunks * _LOG_CHUNK))
            if not batch:
                return
            pos += len(batch)
            chunks = min(2 * chunks, _LOG_BATCH)
            yield from batch

    def _scan_rest(self, recent: list[Any]) -> list[Any]:
        """The keys after the newest of ``recent`` (the keys read last) still in the dict, in
        the order now (lock held; a rewrite keeps the order of the live keys)."""
        keys = self._ordered_keys()
        if not recent:
            return keys
        where = {k: i for i, k in enumerate(keys)}
        for key in reversed(recent):
            i = where.get(key)
            if i is not None:
                return keys[i + 1:]
        raise RuntimeError("dictionary keys changed during iteration")

    def _log_slots(self, lo: int, hi: int) -> list[Any]:
        """Slots ``[lo, hi)`` of the log as it is now (lock held; fewer if it is shorter)."""
        tail = self._meta["tail"]
        spilled = self._order() - len(tail)
        out: list[Any] = []
        if lo < spilled:
            ids = list(range(lo // _LOG_CHUNK, (min(hi, spilled) - 1) // _LOG_CHUNK + 1))
            found = self._ons.get_many(ids)
            for cid in ids:
                chunk = found.get(cid, ())
                base = cid * _LOG_CHUNK
                out.extend(chunk[max(lo, base) - base:min(hi, spilled) - base])
        if hi > spilled:
            out.extend(tail[max(lo, spilled) - spilled:hi - spilled])
        return out

    @locked
    def _ordered_keys(self) -> list[Any]:
        """The keys in insertion order. A slot is dead when its key was deleted (and perhaps
        inserted again, at a later slot): with no dead slot the log *is* the order; else the
        last slot of each present key counts, and the log is rewritten without the dead."""
        n = self._meta["len"]
        if not self._dead():
            return self._log() if n else []
        present = set(self._ns.keys())
        last = {k: None for k in reversed(self._log()) if k in present}
        keys = list(reversed(last))
        if len(keys) != n:  # keys not in the log (written by another writer): at the end
            keys.extend(k for k in present if k not in last)
        self._rewrite(keys)
        return keys

    def _rewrite(self, keys: list[Any]) -> None:
        """Replace the log by ``keys`` (all live)."""
        self._log_gen += 1
        old = self._chunk_ids()
        new = [(c, keys[c * _LOG_CHUNK:(c + 1) * _LOG_CHUNK])
               for c in range((len(keys) + _LOG_CHUNK - 1) // _LOG_CHUNK)]
        dead = [c for c in old if c >= len(new)]
        if dead:
            self._ons.delete_many(dead)
        if new:
            self._ons.put_many(new)
        self._meta["tail"] = []
        self._meta["order"] = len(keys)
        self._meta["start"] = 0
        self._meta["len"] = len(keys)
        self._save_meta()

    def _added(self, keys: list[Any], first: Any = _MISSING) -> None:
        """``keys`` were just stored and are new: count them and log them (``first``: see
        :meth:`_append`)."""
        self._ver += 1
        self._append(keys, first)
        n = self._meta["len"] = self._meta["len"] + len(keys)
        self._save_meta()
        if self._dead() > n + _LOG_CHUNK:
            # more dead slots than live ones: compact (amortised O(1)). The insert is done;
            # a level down now only puts the compaction off to a later insert.
            try:
                self._ordered_keys()
            except LevelUnavailableError:
                pass

    def _removed(self, count: int = 1, front: bool = False) -> None:
        """``count`` keys were deleted; ``front``: the one deleted is the key of the log's first
        slot, which goes with it. (That slot may be dead, the key inserted again later: its
        later slot then dies instead, and the count of dead slots is the same either way.)"""
        self._ver += 1
        self._meta["len"] -= count
        if self._meta["len"] == 0:
            self._drop_log()
        elif front:
            self._trim_front()
        self._save_meta()

    def _drop_log(self) -> None:
        self._log_gen += 1
        ids = list(self._chunk_ids())
        if ids:
            self._ons.delete_many(ids)
        self._meta["order"], self._meta["tail"], self._meta["start"] = 0, [], 0

    def _iter_keys(self, keys: Iterable[Any]) -> Iterator[Any]:
        # dict's iterators raise at their next step once the dict changed size. A change that
        # kept the size (a key deleted, another added: the log grew) makes the loop skip the
        # keys deleted meanwhile, which a dict's loop never yields either.
        n, logged = self._meta["len"], self._meta.get("order")
        for key in keys:
            if self._meta["len"] != n:
                raise RuntimeError("dictionary changed size during iteration")
            if self._meta.get("order") != logged and key not in self:
                continue
            yield key
        if self._meta["len"] != n:
            raise RuntimeError("dictionary changed size during iteration")

    def _prefetch_target(self) -> tuple[Any, Any]:
        """``prefetching(cache=this dict)``: the manager, and a key's encoding as this dict
        stores it -- a key the dict takes for another (``2.0``, ``numpy.int64(2)`` for ``2``)
        is read ahead under that key; one no stored key can stand for raises the manager's
        ``TypeError`` naming its type, as a write of it would."""
        encode = self._ns._encode_key

        def encode_key(key: Any) -> bytes:
            return encode(_write_key(key))
        return self._manager, encode_key

    # -- the five abstract methods -----------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        k = _key(key)
        if k is _BAD:
            raise KeyError(key)
        value = self._ns.get(k, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return self._load(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _write_key(key)
        stored = self._store(value)
        with self._lock:
            is_new = not self._ns.contains(key)
            first = self._spill_read(1) if is_new else None
            self._ns.put(key, stored)
            if is_new:
                self._added([key], first)
            else:
                self._ver += 1

    @locked
    def __delitem__(self, key: Any) -> None:
        k = _key(key)
        if k is _BAD or not self._ns.contains(k):
            raise KeyError(key)
        front = self._front()   # (read before any write)
        self._ns.delete(k)
        self._removed(front=front == k)

    def __iter__(self) -> Iterator[Any]:
        return self._iter_keys(self._scan_log(*self._scan_start()))

    def __reversed__(self) -> Iterator[Any]:
        return self._iter_keys(self._ordered_keys()[::-1])

    def __len__(self) -> int:
        return int(self._meta["len"])

    # -- faster or dict-exact versions of the mixin methods ----------------------------------

    def __contains__(self, key: object) -> bool:
        k = _key(key)
        return k is not _BAD and bool(self._ns.contains(k))

    def get(self, key: Any, default: Any = None) -> Any:
        k = _key(key)
        if k is _BAD:
            return default
        value = self._ns.get(k, _MISSING)
        return default if value is _MISSING else self._load(value)

    @locked
    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        k = _key(key)
        value = self._ns.get(k, _MISSING) if k is not _BAD else _MISSING
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        front = self._front()   # (read before any write)
        self._ns.delete(k)
        self._removed(front=front == k)
        return self._load(value)

    @locked
    def popitem(self) -> tuple[Any, Any]:
        """Remove and return the last inserted item (LIFO), as dict does."""
        if not self._meta["len"]:
            raise KeyError("popitem(): dictionary is empty")
        # Walk back from the last slot to the first present key (every slot after it is dead),
        # reading only; the log is cut and the item deleted once all is read, so a read that
        # fails (a level down) leaves the dict as it was. (Cutting slot by slot as it walked,
        # a failed read lost the slots already cut: the keys behind them were then out of the
        # order, and a later popitem took the dict for empty and zeroed its count.)
        hi = self._order()
        tail = self._meta["tail"]
        spilled = hi - len(tail)
        chunks: dict[int, list[Any]] = {}
        pos, start = hi, self._start()
        while pos > start:
            pos -= 1
            if pos >= spilled:
                key = tail[pos - spilled]
            else:
                cid, off = divmod(pos, _LOG_CHUNK)
                chunk = chunks.get(cid)
                if chunk is None:
                    chunk = chunks[cid] = list(self._ons.get(cid) or ())
                if off >= len(chunk):
                    continue
                key = chunk[off]
            value = self._ns.get(key, _MISSING)
            if value is not _MISSING:
                break
        else:   # the levels lost keys the count has: believe the levels
            self._rewrite([])
            raise KeyError("popitem(): dictionary is empty")
        self._cut_log(pos, chunks)
        self._ns.delete(key)
        self._removed()
        return key, self._load(value)

    def _cut_log(self, pos: int, chunks: dict[int, list[Any]]) -> None:
        """Cut the log to its first ``pos`` slots; ``chunks`` holds the chunk of slot ``pos``
        if it is spilled (read by the caller). The last few slots of a cut chunk go to the
        tail, so that the next popitems cut the tail rather than write the chunk each time."""
        self._log_gen += 1
        tail = self._meta["tail"]
        spilled = self._meta["order"] - len(tail)
        if pos >= spilled:
            del tail[pos - spilled:]
        else:
            cid, off = divmod(pos, _LOG_CHUNK)
            keep = chunks[cid][:off] if off else []
            k = min(len(keep), _TAIL_MAX - 1)
            self._meta["tail"] = keep[len(keep) - k:]
            keep = keep[:len(keep) - k]
            last = (spilled + _LOG_CHUNK - 1) // _LOG_CHUNK
            if keep:
                self._ons.put(cid, keep)
            dead = list(range(cid + 1 if keep else cid, last))
            if dead:
                self._ons.delete_many(dead)
        self._meta["order"] = pos

    @locked
    def setdefault(self, key: Any, default: Any = None) -> Any:
        key = _write_key(key)
        value = self._ns.get(key, _MISSING)
        if value is not _MISSING:
            return self._load(value)
        first = self._spill_read(1)
        self._ns.put(key, self._store(default))
        self._added([key], first)
        return default

    def update(self, /, *args: Any, **kwargs: Any) -> None:
        """dict.update: a mapping (anything with ``keys()``) or an iterable of pairs, then
        the keyword arguments; the items before a bad one are kept, as dict keeps them."""
        if len(args) > 1:
            raise TypeError(f"update expected at most 1 argument, got {len(args)}")
        items: dict[Any, Any] = {}
        try:
            if args:
                other = args[0]
                if isinstance(other, CacheableDict):
                    for k, v in other.items():
                        items[_write_key(k)] = v
                elif hasattr(other, "keys"):
                    for k in other.keys():  # noqa: SIM118 - dict.update calls keys()
                        items[_write_key(k)] = other[k]
                else:
                    for i, pair in enumerate(other):
                        try:
                            pair = tuple(pair)
                        except TypeError:
                            raise TypeError("cannot convert dictionary update sequence element "
                                            f"#{i} to a sequence") from None
                        if len(pair) != 2:
                            raise ValueError(f"dictionary update sequence element #{i} has "
                                             f"length {len(pair)}; 2 is required")
                        items[_write_key(pair[0])] = pair[1]
            for k, v in kwargs.items():
                items[k] = v
        finally:
            self._put_items(items)

    @locked
    def _put_items(self, items: dict[Any, Any]) -> None:
        if not items:
            return
        keys = list(items)
        present = self._ns.get_many(keys)
        new = [k for k in keys if k not in present]
        first = self._spill_read(len(new)) if new else None
        self._ns.put_many([(k, self._store(v)) for k, v in items.items()])
        if new:
            self._added(new, first)
        else:
            self._ver += 1

    @locked
    def clear(self) -> None:
        keys = list(self._ns.keys())
        if keys:
            self._ns.delete_many(keys)
        if self._meta["len"]:
            self._removed(self._meta["len"])

    @locked
    def drop(self) -> None:
        self._drop_log()
        super().drop()

    @locked
    def copy(self) -> dict[Any, Any]:
        """A plain ``dict`` with the current items in insertion order (nested structures stay
        structures)."""
        keys = self._ordered_keys()
        out: dict[Any, Any] = {}
        for b0 in range(0, len(keys), _ITEM_BATCH):
            batch = keys[b0:b0 + _ITEM_BATCH]
            found = self._ns.get_many(batch)
            for k in batch:
                if k in found:
                    out[k] = self._load(found[k])
        return out

    def keys(self) -> "_Keys":  # type: ignore[override]
        return _Keys(self)

    def items(self) -> "_Items":  # type: ignore[override]
        return _Items(self)

    def values(self) -> "_Values":  # type: ignore[override]
        return _Values(self)

    def _iter_items(self, reverse: bool = False) -> Iterator[tuple[Any, Any]]:
        """(key, value) in order, keys and values read a batch at a time."""
        keys = (iter(self._ordered_keys()[::-1]) if reverse
                else self._scan_log(*self._scan_start()))
        n = self._meta["len"]
        batch: list[Any] = []
        while True:
            # A batch of values is read at once; a write through this object (``_ver``) makes
            # the loop read again from where it is, so it sees the values a dict's loop sees.
            if len(batch) < _ITEM_BATCH:
                batch.extend(islice(keys, _ITEM_BATCH - len(batch)))
            if not batch:
                break
            ver = self._ver
            found = self._ns.get_many(batch)
            i = 0
            for k in batch:
                if self._meta["len"] != n:
                    raise RuntimeError("dictionary changed size during iteration")
                if self._ver != ver:
                    break
                i += 1
                if k in found:
                    yield k, self._load(found[k])
            del batch[:i]
        if self._meta["len"] != n:
            raise RuntimeError("dictionary changed size during iteration")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(self) != len(other):
            return False
        mine = self.copy()
        return mine == (other.copy() if isinstance(other, CacheableDict) else dict(other.items()))

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    # ``|`` takes mappings (a dict with another mapping type gets there through that type's
    # reflected operator: UserDict, mappingproxy); ``|=`` takes anything ``update`` takes.
    def __or__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = self.copy()
        out.update(other.copy() if isinstance(other, CacheableDict) else other)
        return out

    def __ror__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = dict(other)
        out.update(self.copy())
        return out

    def __ior__(self, other: Any) -> "CacheableDict":
        self.update(other)
        return self

    @reprlib.recursive_repr("{...}")
    def __repr__(self) -> str:
        # A dict's repr: the items (``name`` and ``len`` say which structure it is).
        return repr(self.copy())

    @classmethod
    def fromkeys(cls, iterable: Iterable[Any], value: Any = None) -> dict[Any, Any]:
        """A plain ``dict`` (a cacheable one needs a manager and a name: open it and
        ``update`` it with this), as ``|`` and ``copy()`` return plain dicts."""
        return dict.fromkeys(iterable, value)


class _Keys(KeysView):
    """``d.keys()``: a set-like view in insertion order, reversible, like ``dict_keys``."""

    __slots__ = ()
    _mapping: Any

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._mapping)

    @property
    def mapping(self) -> Any:
        return MappingProxyType(self._mapping)

    def __repr__(self) -> str:
        return f"dict_keys({list(self)!r})"


class _Items(ItemsView):
    """``d.items()``: values read a batch of keys at a time; reversible, like ``dict_items``."""

    __slots__ = ()
    _mapping: Any

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping._iter_items()

    def __reversed__(self) -> Iterator[tuple[Any, Any]]:
        return self._mapping._iter_items(reverse=True)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        key, value = item
        v = self._mapping.get(key, _MISSING)
        return v is not _MISSING and (v is value or v == value)

    @property
    def mapping(self) -> Any:
        return MappingProxyType(self._mapping)

    def __repr__(self) -> str:
        return f"dict_items({list(self)!r})"


class _Values(ValuesView):
    """``d.values()``: values read a batch of keys at a time; reversible, like ``dict_values``."""

    __slots__ = ()
    _mapping: Any

    def __iter__(self) -> Iterator[Any]:
        return (v for _, v in self._mapping._iter_items())

    def __reversed__(self) -> Iterator[Any]:
        return (v for _, v in self._mapping._iter_items(reverse=True))

    @property
    def mapping(self) -> Any:
        return MappingProxyType(self._mapping)

    def __repr__(self) -> str:
        return f"dict_values({list(self)!r})"
