"""Values that left the heap while someone still held them.

``v = m.get(k)`` hands out the heap's own object, and mutation tracking writes a change made to
it in place (``v.append(x)``) when the entry is flushed or evicted. But the heap may evict the
entry while ``v`` is still held -- another ``get`` making room, another thread's put, a flush
reweighing -- and a change made after that went nowhere: the next read decoded the older copy
below. A Python dict has no such window (``d[k]`` is the object you changed), so neither
should the cache.

So a mutable victim that something outside the manager still references (its reference count
says so: the manager's own references at that point are known and counted once at import) is
*lent*: kept beside the heap with what was written for it (see :func:`same_encoding`). Until
the key is put or deleted again:

* a read of the key takes the lent object back into the heap (the same object, as a dict
  would give; what was written comes along as its digest, so a change made meanwhile is
  written like any other);
* each flush compares every lent object with what was written, writes the changed ones, and
  forgets those nobody references any more.

A victim nobody holds is not lent (the usual case: one reference count read per mutable
victim). A value that a ``put_many`` evicted within the same call is always lent: the batch and
the caller's mapping reference it, so no count tells whether the caller keeps it, and the next
look forgets it if not (a structure's own batch of nodes or chunks is not lent: it puts them
again after every change). Nor is one object shared by every key holding it (:func:`shared_object`: the empty tuple, an enum member, a
class, a function), whose reference count no caller explains. A value read from
below that the heap did not admit (heavier than the heap, or declined by the policy) is lent
at once: it is being returned, so it is held by definition.

The memory is the caller's objects, alive anyway while held. Once dropped, an object waits for
the next look: every flush looks, and so does the loans' growth by a quarter of what was held
at the last look (or by a slack: 1/64 of a bytes-bounded heap's budget in encoded bytes, or 64
loans). That look reads each loan's reference count, and encodes only the ones it forgets (to
write those changed while held). A structure that lets go of many at once looks right then
(``CacheManager._release_loans``): the quadtree, after a batch read of pages larger than the
heap and after an operation that held its pages.
"""
from __future__ import annotations

import sys
import types
from enum import Enum
from typing import Any

from .codec import Encoded

__all__ = ["LOAN_REFS", "VICTIM_REFS", "Loans", "same_encoding", "shared_object"]

_BY_REFERENCE = frozenset((types.FunctionType, types.BuiltinFunctionType, type(Ellipsis),
                           type(NotImplemented)))


def shared_object(value: Any) -> bool:
    """Whether ``value`` is one object shared by every key that holds it, and decoded to that
    same object: the empty tuple, an enum member, a class or a function (pickled by
    reference). Its reference count is high for good (its class, the interpreter, every entry
    holding it), so it would look held, each key's loan kept until the key is written again:
    one per key ever read. And lending it keeps nothing: it cannot change in a way its
    encoding shows, and a read gives back the very same object."""
    t = type(value)
    return ((t is tuple and not value) or t in _BY_REFERENCE
            or isinstance(value, (type, Enum)))

_MIN_CHECK = 64


def _victim_refs() -> int:
    """The references a victim nobody else holds has inside ``_queue_victims``' loop: its
    ``(kb, value, dirty)`` tuple in the victims list, the loop variable, the call's argument
    (measured the same way, so an interpreter that counts differently is measured too)."""
    victims: list[tuple[bytes, list[int], bool]] = [(b"k", [], False)]
    for _kb, value, _dirty in victims:
        return sys.getrefcount(value)
    raise AssertionError   # pragma: no cover


def _loan_refs() -> int:
    """The references a lent object nobody else holds has inside ``Loans``' check loop."""
    loans: dict[bytes, Any] = {b"k": ([], 0, 0)}
    for kb in list(loans):
        loan = loans[kb]
        obj = loan[0]
        return sys.getrefcount(obj)
    raise AssertionError   # pragma: no cover


def same_encoding(stored: Any, raw: Any) -> bool:
    """Whether ``raw`` (an object's encoding now, from ``encode_parts``) is what ``stored``
    remembers of it: the encoding written (bytes, or an ``Encoded`` whose large pieces are the
    object's own bytes objects, compared by identity first: a lent 1 MB value unchanged costs
    no pass over its bytes) or its digest. A different split of the same bytes counts as a
    change (one write too many, never one too few)."""
    if type(stored) is int:
        return hash(raw) == stored
    if type(stored) is Encoded and type(raw) is Encoded:
        a, b = stored.parts, raw.parts
        return (len(a) == len(b) and stored.nbytes == raw.nbytes
                and all(x is y or x == y for x, y in zip(a, b)))
    return bool(stored == raw)


VICTIM_REFS = _victim_refs()
LOAN_REFS = _loan_refs()


class Loans(dict):
    """``kb -> (object, its last written encoding or that encoding's digest, its length)``
    (see :func:`same_encoding`); the manager's lock
    held for every use. A loan leaves by :meth:`pop` (or :meth:`clear`), which keep
    ``nbytes``, the encoded size of what is lent, up to date, and ``lent``: how many loans
    lend each object (by ``id``; one object put under two keys is lent under both, and each
    loan's own reference is then no caller's), with ``shared`` the objects lent more than once
    (a look reads ``lent`` only when there is one).

    When to look for loans nobody holds any more: once the count or the bytes lent grew by a
    quarter of what was held at the last look (at least ``_MIN_CHECK`` loans, or ``slack``
    bytes: the manager sets it from the heap's budget). So what waits to be forgotten stays
    within a quarter of what callers hold, plus that slack."""

    __slots__ = ("bytes_at", "check_at", "lent", "lent_since", "nbytes", "shared", "slack")

    def __init__(self, slack: int = 1 << 20) -> None:
        super().__init__()
        self.nbytes = 0
        self.slack = slack
        self.check_at = _MIN_CHECK
        self.bytes_at = slack
        self.lent_since = 0   # loans made since the last look
        self.lent: dict[int, int] = {}   # id(object) -> the loans that lend it
        self.shared = 0                  # objects lent by more than one loan

    def lend(self, kb: bytes, loan: tuple[Any, Any, int]) -> bool:
        """Add (or replace) a loan; whether it is time to look for forgotten ones."""
        old = super().get(kb)
        if old is not None:
            self.nbytes -= old[2]
            if old[0] is not loan[0]:
                self._unlent(old[0])
                old = None
        if old is None:   # (inlined: a lend per held victim)
            lent, i = self.lent, id(loan[0])
            n = lent[i] = lent.get(i, 0) + 1
            if n == 2:
                self.shared += 1
        self[kb] = loan
        self.nbytes += loan[2]
        self.lent_since += 1
        return len(self) >= self.check_at or self.nbytes >= self.bytes_at

    def _unlent(self, obj: Any) -> None:
        lent, i = self.lent, id(obj)
        n = lent[i] - 1
        if n:
            lent[i] = n
            if n == 1:
                self.shared -= 1
        else:
            del lent[i]

    def pop(self, kb: bytes, default: Any = None) -> Any:  # type: ignore[override]
        loan = super().pop(kb, None)
        if loan is None:
            return default
        self.nbytes -= loan[2]
        self._unlent(loan[0])
        return loan

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0
        self.lent.clear()
        self.shared = 0

    def looked(self) -> None:
        """A look just ended: the next one when what is lent grew by a quarter."""
        self.lent_since = 0
        self.check_at = len(self) + max(_MIN_CHECK, len(self) >> 2)
        self.bytes_at = self.nbytes + max(self.slack, self.nbytes >> 2)
