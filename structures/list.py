"""CacheableList: a ``MutableSequence`` stored as fixed-size chunks, one entry per chunk.

Layout. Element ``i`` sits at the *physical* position ``p = head + i``, in chunk ``p // C`` at
offset ``p % C`` (``C`` = ``chunk_size``, fixed when the list is created). ``head`` moves: a
``pop(0)`` advances it and deletes a chunk only when it empties, an ``insert(0, x)`` moves it
back (chunk ids may go negative), so the list is also a cheap deque for queues, rather than
shifting every chunk by one as a plain list does. A chunk entry is a Python list; slots before
``head`` in the first chunk hold ``None``, the last chunk is only as long as it needs to be.
``append``/``extend`` write the tail chunk in place (get, mutate, put back).

Everything else that moves elements (insert or delete in the middle, slice assignment, sort,
reverse) reads the affected part, changes it as a plain list would, and writes it back with
one batched ``get_many``/``put_many``; an insert, delete or slice assignment in the front half
shifts the front part instead of the tail, and a slice assignment of as many elements as it
replaces moves none. Errors are exactly list's (``IndexError('list index out of range')``
and friends).
"""
from __future__ import annotations

import operator
import reprlib
import sys
from collections.abc import Iterable, Iterator, MutableSequence
from typing import Any, SupportsIndex

from mlcache.levels.heap import _SAMPLE, estimate_size

from mlcache.errors import IntegrityError, SerializationError

from .base import Cacheable, list_shell, locked

__all__ = ["CacheableList", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 256
_BATCH_CHUNKS = 32
_MAXSIZE = sys.maxsize
_SSIZE_MIN = -sys.maxsize - 1


def _too_big(kind: type[Exception]) -> Exception:
    """list's error for an index past a C ssize_t: an IndexError where it indexes (``l[i]``,
    ``del l[i]``), an OverflowError where it is an argument (``pop``, ``insert``)."""
    if kind is IndexError:
        return IndexError("cannot fit 'int' into an index-sized integer")
    return OverflowError("Python int too large to convert to C ssize_t")


def _check_chunk_size(chunk_size: Any) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def _slice_index(i: Any) -> int:
    """An index argument of ``list.index``: an int or ``__index__`` (not None), as list says."""
    if isinstance(i, int):
        return i
    if hasattr(type(i), "__index__"):
        return operator.index(i)
    raise TypeError("slice indices must be integers or have an __index__ method")


class CacheableList(Cacheable, MutableSequence):
    """A list whose chunks live in the cache levels. Open with ``manager.list(name)``."""

    kind = "list"
    _meta_counts = ("len", "head")
    # The last chunk this object wrote with a weight of its own: (chunk id, the chunk's ``id()``,
    # ``_ver`` after the write, how many leading slots were weighed, their estimates' sum). While no
    # other change came through this object, an append or extend onto that chunk leaves those
    # slots as they were, so the chunk's weight is its shell plus that sum scaled, as the
    # heap's sampling walk (the first ``_SAMPLE`` slots) would give, without walking them.
    # The chunk itself is not held: one chunk per list kept alive past its eviction held 52 MB
    # outside a 4 MB heap budget with 200 lists of 255 1-kB elements. A copy read back after an
    # eviction may get the freed chunk's ``id()``; its slots then hold what this object wrote,
    # whose estimates are the sum kept, so the weight is still the heap's.
    # ``_good``: the manager's set of value types seen to encode (None over anything else).
    __slots__ = ("_chunk_w", "_good")
    _chunk_w: tuple[int, int, int, int, int] | None
    _good: set[type] | None

    def _attach(self) -> None:
        self._chunk_w = None
        self._good = getattr(getattr(self._manager, "_cold", None), "good_types", None)

    def _forget_written(self) -> None:
        self._chunk_w = None

    def _new_meta(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, Any]:  # type: ignore[override]
        _check_chunk_size(chunk_size)
        return {"len": 0, "head": 0, "chunk": chunk_size}

    def _check_meta(self, meta: dict[str, Any], chunk_size: int | None = None) -> None:  # type: ignore[override]
        # The chunk size is fixed when the list is made; one given again must be it, as a
        # quadtree's bounds must (a different or invalid one was silently ignored).
        super()._check_meta(meta)
        if chunk_size is not None:
            _check_chunk_size(chunk_size)
            if chunk_size != meta["chunk"]:
                raise ValueError(f"list {self._name!r} exists with chunk_size "
                                 f"{meta['chunk']}, not {chunk_size}")

    def _empty_meta(self) -> dict[str, Any]:
        return {**self._meta, "len": 0, "head": 0}

    @property
    def chunk_size(self) -> int:
        return int(self._meta["chunk"])

    # -- values ------------------------------------------------------------------------------

    def _stored(self, value: Any) -> Any:
        """The form of ``value`` kept in a chunk (:meth:`_store`), refused here with
        ``SerializationError`` if the codec cannot encode it, as the manager's ``put`` refuses
        such a value: checked once per type, as the manager checks. An element travels inside
        its chunk, a ``list`` the manager has seen encode, so the put of the chunk took it and
        it failed only when the chunk left the heap: pinned there, every flush and close
        raising for 'key 0, a list', and the chunk (its good elements too) in no level for the
        next process."""
        if isinstance(value, Cacheable):
            return self._store(value)
        good = self._good
        if good is None or type(value) in good:
            return value
        return self._check_encodes(value)

    def _check_encodes(self, value: Any) -> Any:
        try:
            self._manager._codec.encode(value)
        except SerializationError as exc:
            raise SerializationError(
                f"cannot store a value of type {type(value).__name__} in list "
                f"{self._name!r}: {exc}", value_type=type(value)) from exc
        assert self._good is not None
        self._good.add(type(value))
        return value

    # -- chunk plumbing ----------------------------------------------------------------------

    def _span(self) -> range:
        """Ids of the chunks that exist now."""
        n, head, c = self._meta["len"], self._meta["head"], self._meta["chunk"]
        if n == 0:
            return range(0)
        return range(head // c, (head + n - 1) // c + 1)

    def _put_tail(self, cid: int, old: Any, chunk: list[Any], same: int, ver: int,
                  others: list[tuple[int, list[Any]]] | None = None) -> None:
        """Write chunk ``cid``, now ``chunk``, whose first ``same`` slots are those of ``old``
        (the object read, ``ver`` the ``_ver`` before this change), and the chunks ``others``
        before it, with weights: ``chunk``'s from the last weighed chunk when it is ``old``,
        the others' weighed here as the heap would. Without the manager's weighed path (an
        entry-bounded heap, a Spark partition scope), a plain ``put``/``put_many``."""
        put_items = self._put_weighed
        if put_items is None:
            self._chunk_w = None
            if others:
                self._ns.put_many([*others, (cid, chunk)])
            else:
                self._ns.put(cid, chunk)
            return
        n = len(chunk)
        k = n if n < _SAMPLE else _SAMPLE
        w = self._chunk_w
        if (w is not None and w[1] == id(old) and w[0] == cid and w[2] == ver
                and same >= w[3]):
            done, total = w[3], w[4]
        else:
            done, total = 0, 0
        for v in chunk[done:k]:
            total += estimate_size(v, 1)
        self._chunk_w = (cid, id(chunk), self._ver, k, total)
        weight = list_shell(chunk) + total * n // k
        kb = self._ns._kb
        if others:
            put_items([(c, kb(c), v) for c, v in others] + [(cid, kb(cid), chunk)], None,
                      [estimate_size(v) for _, v in others] + [weight])
        else:
            put_items([(cid, kb(cid), chunk)], None, [weight])

    def _chunk(self, cid: int) -> list[Any]:
        """Chunk ``cid``, which the metadata says holds elements."""
        chunk = self._ns.get(cid)
        if chunk is None:
            raise self._lost(cid)
        return chunk  # type: ignore[no-any-return]

    def _lost(self, cid: int) -> IntegrityError:
        """The error for chunk ``cid`` found in no level though the metadata counts its
        elements: a level configured ``lossy=True`` may drop entries (or the levels were
        cleared behind the manager's back). It was a bare ``TypeError``/``KeyError``."""
        n, head, c = self._meta["len"], self._meta["head"], self._meta["chunk"]
        lo, hi = max(0, cid * c - head), min(n, cid * c + c - head) - 1
        return IntegrityError(
            f"list {self._name!r} (len {n}): the chunk holding elements {lo}..{hi} is in no "
            "level (a lossy level may drop entries); they are lost, clear() or drop() the "
            "list to reuse it", key=cid)

    def _read(self, start: int, stop: int) -> list[Any]:
        """Elements ``start <= i < stop`` (already normalised, start <= stop)."""
        if start >= stop:
            return []
        head, c = self._meta["head"], self._meta["chunk"]
        p0, p1 = head + start, head + stop          # physical [p0, p1)
        out: list[Any] = []
        first, last = p0 // c, (p1 - 1) // c
        for batch0 in range(first, last + 1, _BATCH_CHUNKS):
            ids = list(range(batch0, min(batch0 + _BATCH_CHUNKS, last + 1)))
            found = self._ns.get_many(ids)
            for cid in ids:
                chunk = found.get(cid)
                if chunk is None:
                    raise self._lost(cid)
                lo = max(p0, cid * c) - cid * c
                hi = min(p1, cid * c + c) - cid * c
                out.extend(chunk[lo:hi])
        return out

    def _write(self, p0: int, items: list[Any], cut: bool = False) -> None:
        """Write ``items`` at physical positions ``p0, p0+1, ...`` (no length change here);
        ``cut``: the list is to end with them, so the last chunk written ends there too.

        Each change to the list reads everything it needs before its first write: a read
        can fail (a level down) where a write, which goes to the heap, does not, and a change
        that failed between its writes left the list half changed."""
        if not items:
            return
        self._ver += 1
        c = self._meta["chunk"]
        p1 = p0 + len(items)
        first, last = p0 // c, (p1 - 1) // c
        existing = self._span()
        need = [cid for cid in {first, last} if cid in existing]
        found = self._ns.get_many(need) if need else {}
        out = []
        for cid in range(first, last + 1):
            base = cid * c
            lo, hi = max(p0, base) - base, min(p1, base + c) - base
            part = items[max(p0, base) - p0:min(p1, base + c) - p0]
            if lo == 0 and cid not in found:
                chunk = part
            else:
                chunk = list(found.get(cid, ()))
                if len(chunk) < lo:
                    chunk.extend([None] * (lo - len(chunk)))
                chunk[lo:hi] = part
                if cut and cid == last:
                    del chunk[hi:]
            out.append((cid, chunk))
        # the last chunk unchanged before ``p0`` (the tail an extend grows, weighed from the
        # last write of it); ``ver`` is ``_ver`` before this write
        cid, chunk = out.pop()
        same = p0 - cid * c if first == last else 0
        self._put_tail(cid, found.get(cid), chunk, max(0, same), self._ver - 1, out)

    def _truncate(self, n: int, cut: bool = False) -> None:
        """Keep the first ``n`` elements; drop the rest and the chunks they leave empty.
        ``cut``: the chunk of element ``n - 1`` already ends with it (written so)."""
        self._ver += 1
        old = self._span()
        head, c = self._meta["head"], self._meta["chunk"]
        if n == 0:
            if len(old):
                self._ns.delete_many(list(old))
            self._meta["head"] = 0
        else:
            last = (head + n - 1) // c
            chunk = None if cut else self._chunk(last)   # (read before any write)
            dead = range(last + 1, old.stop)   # (not a walk of every chunk id)
            if dead:
                self._ns.delete_many(dead)
            keep = head + n - last * c
            if chunk is not None and len(chunk) > keep:
                del chunk[keep:]
                self._ns.put(last, chunk)
        self._meta["len"] = n
        self._save_meta()

    def _replace_from(self, start: int, items: list[Any]) -> None:
        """The list becomes ``self[:start] + items``."""
        n = self._meta["len"]
        new_len = start + len(items)
        shorter = new_len < n
        self._write(self._meta["head"] + start, items, cut=shorter)
        if shorter:
            self._truncate(new_len, cut=bool(items))
        else:
            self._meta["len"] = new_len
            self._save_meta()

    def _popleft(self) -> Any:
        self._ver += 1
        head, c = self._meta["head"], self._meta["chunk"]
        cid, off = divmod(head, c)
        chunk = self._chunk(cid)
        value = chunk[off]
        self._meta["len"] -= 1
        if self._meta["len"] == 0:
            self._ns.delete(cid)
            self._meta["head"] = 0
        else:
            self._meta["head"] = head + 1
            if off == c - 1:
                self._ns.delete(cid)
            else:
                chunk[off] = None
                self._ns.put(cid, chunk)
        self._save_meta()
        return value

    def _advance_head(self, k: int) -> None:
        """Forget the first ``k`` elements (``0 < k < len``) by moving ``head``."""
        self._ver += 1
        head, c = self._meta["head"], self._meta["chunk"]
        new_head = head + k
        cid, off = divmod(new_head, c)
        chunk = self._chunk(cid) if off else None   # (read before any write)
        dead = list(range(head // c, new_head // c))
        if dead:
            self._ns.delete_many(dead)
        if chunk is not None:
            lo = max(head, cid * c) - cid * c
            chunk[lo:off] = [None] * (off - lo)
            self._ns.put(cid, chunk)
        self._meta["head"] = new_head
        self._meta["len"] -= k
        self._save_meta()

    def _index(self, i: Any, message: str) -> int:
        n = self._meta["len"]
        i = operator.index(i) if not isinstance(i, int) else i
        if not _SSIZE_MIN <= i <= _MAXSIZE:
            raise _too_big(IndexError)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(message)
        return i

    # -- MutableSequence ---------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._meta["len"])

    def __getitem__(self, i: Any) -> Any:
        with self._lock:
            return self._get(i)

    def _get(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._meta["len"])
            if step == 1:
                return [self._load(v) for v in self._read(start, max(start, stop))]
            idx = range(start, stop, step)
            if not idx:
                return []
            lo, hi = min(idx), max(idx)
            span = self._read(lo, hi + 1)
            return [self._load(span[j - lo]) for j in idx]
        if not hasattr(i, "__index__"):
            raise TypeError(f"list indices must be integers or slices, not {type(i).__name__}")
        i = self._index(i, "list index out of range")
        cid, off = divmod(self._meta["head"] + i, self._meta["chunk"])
        return self._load(self._chunk(cid)[off])

    @locked
    def __setitem__(self, i: Any, value: Any) -> None:
        if isinstance(i, slice):
            self._set_slice(i, value)
            return
        if not hasattr(i, "__index__"):
            raise TypeError(f"list indices must be integers or slices, not {type(i).__name__}")
        i = self._index(i, "list assignment index out of range")
        cid, off = divmod(self._meta["head"] + i, self._meta["chunk"])
        stored = self._stored(value)
        chunk = self._chunk(cid)
        chunk[off] = stored
        self._ver += 1
        self._ns.put(cid, chunk)

    def _set_slice(self, s: slice, values: Any) -> None:
        n = self._meta["len"]
        if not isinstance(values, Iterable):
            raise TypeError("can only assign an iterable" if s.step in (None, 1)
                            else "must assign iterable to extended slice")
        new = [self._stored(v) for v in values]
        start, stop, step = s.indices(n)
        if step == 1:
            stop = max(start, stop)
            shift = stop - start - len(new)   # how far the elements around the slice move
            if shift == 0:
                # as many as it replaces: nothing moves (it rewrote the whole tail)
                self._write(self._meta["head"] + start, new)
            elif start < n - stop:
                # the front is the shorter side: it moves, as insert and delete do
                head = self._meta["head"] + shift
                self._write(head, self._read(0, start) + new)
                if shift > 0:
                    self._advance_head(shift)
                else:
                    self._meta["head"] = head
                    self._meta["len"] -= shift
                    self._save_meta()
            else:
                self._replace_from(start, new + self._read(stop, n))
            return
        idx = range(start, stop, step)
        if len(new) != len(idx):
            raise ValueError(f"attempt to assign sequence of size {len(new)} "
                             f"to extended slice of size {len(idx)}")
        if not idx:
            return
        lo, hi = min(idx), max(idx)
        span = self._read(lo, hi + 1)
        for j, v in zip(idx, new):
            span[j - lo] = v
        self._write(self._meta["head"] + lo, span)

    @locked
    def __delitem__(self, i: Any) -> None:
        n = self._meta["len"]
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            idx = range(start, stop, step)
            if not idx:
                return
            if step == 1 or step == -1:
                lo, hi = min(idx), max(idx) + 1
                self._delete_run(lo, hi)
                return
            lo = min(idx)
            gone = set(idx)
            kept = [v for j, v in enumerate(self._read(lo, n), lo) if j not in gone]
            self._replace_from(lo, kept)
            return
        if not hasattr(i, "__index__"):
            raise TypeError(f"list indices must be integers or slices, not {type(i).__name__}")
        i = self._index(i, "list assignment index out of range")
        self._delete_run(i, i + 1)

    def _delete_run(self, lo: int, hi: int) -> None:
        """Delete elements ``lo <= i < hi``, shifting whichever side is shorter."""
        n = self._meta["len"]
        k = hi - lo
        if hi == n:
            self._truncate(lo)
        elif lo < n - hi:
            self._write(self._meta["head"] + k, self._read(0, lo))
            self._advance_head(k)
        else:
            self._replace_from(lo, self._read(hi, n))

    @locked
    def insert(self, index: SupportsIndex, value: Any) -> None:
        n = self._meta["len"]
        i = operator.index(index)
        if not _SSIZE_MIN <= i <= _MAXSIZE:   # (a list's insert raises; it appended)
            raise _too_big(OverflowError)
        if i < 0:
            i = max(0, i + n)
        i = min(i, n)
        stored = self._stored(value)
        if i == n:
            self._write(self._meta["head"] + n, [stored])
            self._add_len(1)
        elif i < n - i:
            front = self._read(0, i)
            # the metadata changes once the write is done: a write that fails (a level down)
            # leaves the list as it was (the new head's chunk, if new, is none of the span's)
            head = self._meta["head"] - 1
            self._write(head, front + [stored])
            self._meta["head"] = head
            self._meta["len"] += 1
            self._save_meta()
        else:
            self._replace_from(i, [stored] + self._read(i, n))

    def append(self, value: Any) -> None:
        with self._lock:
            self._append(value)

    def _append(self, value: Any) -> None:
        stored = self._stored(value)   # (before the chunk, the heap's own object, changes)
        head, n, c = self._meta["head"], self._meta["len"], self._meta["chunk"]
        cid, off = divmod(head + n, c)
        # (a list with no element has head 0: a chunk that elements continue is theirs)
        chunk = self._chunk(cid) if off else []
        chunk.append(stored)
        self._ver += 1
        # grown in place: the slots before the new one are those of the chunk as read
        self._put_tail(cid, chunk, chunk, len(chunk) - 1, self._ver - 1)
        self._add_len(1)

    def extend(self, values: Iterable[Any]) -> None:
        items: list[Any] = []
        append = items.append
        good = self._good
        if good is None:
            good = set()
        stored = self._stored
        try:
            for v in values:
                # (a structure is stored as its reference, whatever the types seen to encode)
                append(v if type(v) in good and not isinstance(v, Cacheable) else stored(v))
        finally:
            # list.extend keeps the elements taken before an error in the iterable (and
            # before a value the codec cannot encode, raised by ``_stored``)
            if items:
                with self._lock:
                    self._write(self._meta["head"] + self._meta["len"], items)
                    self._add_len(len(items))

    def appendleft(self, value: Any) -> None:
        """``insert(0, value)``: O(1), moves ``head`` back."""
        self.insert(0, value)

    @locked
    def pop(self, i: SupportsIndex = -1) -> Any:
        n = self._meta["len"]
        k = operator.index(i)   # (the argument is converted first, as list's pop does)
        if not _SSIZE_MIN <= k <= _MAXSIZE:
            raise _too_big(OverflowError)
        if n == 0:
            raise IndexError("pop from empty list")
        j = self._index(k, "pop index out of range")
        if j == 0:
            return self._load(self._popleft())
        value = self[j]
        self._delete_run(j, j + 1)
        return value

    @locked
    def popleft(self) -> Any:
        """``pop(0)`` without shifting: advances ``head``; O(1)."""
        if self._meta["len"] == 0:
            raise IndexError("pop from empty list")
        return self._load(self._popleft())

    @locked
    def clear(self) -> None:
        self._truncate(0)

    def __iter__(self) -> Iterator[Any]:
        # Like list's iterator, a position into the live list: elements appended, removed or
        # replaced during the loop are seen as a list's loop sees them. Elements are read a
        # batch of chunks at a time; a change through this object (``_ver``) rereads from the
        # current position.
        step = self._meta["chunk"] * _BATCH_CHUNKS
        i = 0
        while True:
            with self._lock:
                n = self._meta["len"]
                if i >= n:
                    return
                ver = self._ver
                batch = self._read(i, min(n, i + step))
            for v in batch:
                i += 1
                yield self._load(v)
                if self._ver != ver:
                    break

    def __reversed__(self) -> Iterator[Any]:
        # list's reverse iterator: a position counting down, ending early if the list shrank
        # below it.
        step = self._meta["chunk"] * _BATCH_CHUNKS
        i = self._meta["len"] - 1
        while True:
            with self._lock:
                if not 0 <= i < self._meta["len"]:
                    return
                ver = self._ver
                batch = self._read(max(0, i + 1 - step), i + 1)
            for v in reversed(batch):
                i -= 1
                yield self._load(v)
                if self._ver != ver:
                    break

    def __contains__(self, value: object) -> bool:
        return any(v is value or v == value for v in self)

    @locked
    def index(self, value: Any, start: SupportsIndex = 0, stop: SupportsIndex = _MAXSIZE) -> int:
        n = self._meta["len"]
        lo, hi, _ = slice(_slice_index(start), _slice_index(stop)).indices(n)
        # a batch of chunks at a time, as a loop reads: a copy of the whole range held memory
        # in proportion to the list (43 MiB at 10**6 ints over a 1 MiB heap)
        step = self._meta["chunk"] * _BATCH_CHUNKS
        j = lo
        while j < min(hi, self._meta["len"]):
            for v in self._read(j, min(hi, self._meta["len"], j + step)):
                v = self._load(v)
                if v is value or v == value:
                    return j
                j += 1
        raise ValueError(f"{value!r} is not in list")

    def count(self, value: Any) -> int:
        return sum(1 for v in self if v is value or v == value)

    @locked
    def remove(self, value: Any) -> None:
        for j, v in enumerate(self):
            if v is value or v == value:
                del self[j]
                return
        raise ValueError("list.remove(x): x not in list")

    @locked
    def reverse(self) -> None:
        items = self._read(0, self._meta["len"])
        items.reverse()
        self._write(self._meta["head"], items)

    @locked
    def sort(self, *args: Any, key: Any = None, reverse: bool = False) -> None:
        if args:
            raise TypeError("sort() takes no positional arguments")
        ver = self._ver
        items = self.copy()
        items.sort(key=key, reverse=reverse)
        if self._ver != ver:
            # list.sort: a key function that changed the list loses its changes to the sorted
            # contents, and the sort raises.
            self._replace_from(0, [self._store(v) for v in items])
            raise ValueError("list modified during sort")
        self._write(self._meta["head"], [self._store(v) for v in items])

    @locked
    def copy(self) -> list[Any]:
        """A plain ``list`` with the current elements."""
        return [self._load(v) for v in self._read(0, self._meta["len"])]

    # -- list-like comparisons and operators -------------------------------------------------

    def _other(self, other: object) -> list[Any] | None:
        if isinstance(other, CacheableList):
            return other.copy()
        if isinstance(other, list):
            return other
        return None

    def __eq__(self, other: object) -> bool:
        o = self._other(other)
        if o is None:
            return NotImplemented
        return len(self) == len(o) and self.copy() == o

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self.copy() < o

    def __le__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self.copy() <= o

    def __gt__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self.copy() > o

    def __ge__(self, other: object) -> bool:
        o = self._other(other)
        return NotImplemented if o is None else self.copy() >= o

    def __add__(self, other: Any) -> list[Any]:
        o = self._other(other)
        if o is None:
            raise TypeError(f'can only concatenate list (not "{type(other).__name__}") to list')
        return self.copy() + o

    def __radd__(self, other: Any) -> list[Any]:
        o = self._other(other)
        if o is None:
            return NotImplemented
        return o + self.copy()

    def __iadd__(self, values: Iterable[Any]) -> "CacheableList":  # type: ignore[misc]
        # (``+`` gives a plain list, ``+=`` extends in place: the signatures differ on purpose)
        self.extend(values)
        return self

    def __mul__(self, k: SupportsIndex) -> list[Any]:
        return self.copy() * k

    __rmul__ = __mul__

    @locked
    def __imul__(self, k: SupportsIndex) -> "CacheableList":
        if not hasattr(type(k), "__index__"):
            raise TypeError(f"can't multiply sequence by non-int of type '{type(k).__name__}'")
        k = operator.index(k)
        if k <= 0:
            self.clear()
        elif k > 1:
            self.extend(self.copy() * (k - 1))
        return self

    @reprlib.recursive_repr("[...]")
    def __repr__(self) -> str:
        # A list's repr: the contents (``name`` and ``len`` say which structure it is).
        return repr(self.copy())
