"""Values that left the heap while someone still held them.

``v = m.get(k)`` hands out the heap's own object, and mutation tracking writes a change made to
it in place (``v.append(x)``) when the entry is flushed or evicted. But the heap may evict the
entry while ``v`` is still held -- another ``get`` making room, another thread's put, a flush
reweighing -- and a change made after that went nowhere: the next read decoded the older copy
below. A Python dict has no such window (``d[k]`` is the object you changed), so neither
should the cache.

So a mutable victim that something outside the manager still references (its reference count
says so: the manager's own references at that point are known and counted once at import) is
*lent*: kept beside the heap with the digest of what was written for it. Until the key is put
or deleted again:

* a read of the key takes the lent object back into the heap (the same object, as a dict
  would give; its digest comes along, so a change made meanwhile is written like any other);
* each flush (and a growing number of loans) compares every lent object with its digest,
  writes the changed ones, and forgets those nobody references any more.

A victim nobody holds is not lent (the usual case: one reference count read per mutable
victim). A value read from below that the heap did not admit (heavier than the heap, or
declined by the policy) is lent at once: it is being returned, so it is held by definition,
and the next check forgets it when the caller dropped it.

The memory is the caller's objects, alive anyway while held. Once dropped, an object waits for
the next look, which a flush runs, and so does the loans' growth by a quarter of what is held
(or by a slack: 1/64 of a bytes-bounded heap's budget in encoded bytes, at least 64 loans): a look reads each
loan's reference count, and encodes (to write it if it changed while held) only the ones it
forgets. A structure holding its pages through an operation (the quadtree) makes many loans that
end with the operation; they are forgotten soon after, not kept to double the heap.
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["Loans", "VICTIM_REFS", "LOAN_REFS"]

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


VICTIM_REFS = _victim_refs()
LOAN_REFS = _loan_refs()


class Loans(dict):
    """``kb -> (object, digest of its last written encoding, its length)``; the manager's lock
    held for every use. A loan leaves by :meth:`pop` (or :meth:`clear`), which keep
    ``nbytes``, the encoded size of what is lent, up to date.

    When to look for loans nobody holds any more: once the count or the bytes lent grew by a
    quarter of what was held at the last look (at least ``_MIN_CHECK`` loans, or ``slack``
    bytes: the manager sets it from the heap's budget). So what waits to be forgotten stays
    within a quarter of what callers hold, plus that slack."""

    __slots__ = ("check_at", "nbytes", "bytes_at", "slack", "lent_since")

    def __init__(self, slack: int = 1 << 20) -> None:
        super().__init__()
        self.nbytes = 0
        self.slack = slack
        self.check_at = _MIN_CHECK
        self.bytes_at = slack
        self.lent_since = 0   # loans made since the last look

    def lend(self, kb: bytes, loan: tuple[Any, int, int]) -> bool:
        """Add (or replace) a loan; whether it is time to look for forgotten ones."""
        old = super().get(kb)
        if old is not None:
            self.nbytes -= old[2]
        self[kb] = loan
        self.nbytes += loan[2]
        self.lent_since += 1
        return len(self) >= self.check_at or self.nbytes >= self.bytes_at

    def pop(self, kb: bytes, default: Any = None) -> Any:  # type: ignore[override]
        loan = super().pop(kb, None)
        if loan is None:
            return default
        self.nbytes -= loan[2]
        return loan

    def clear(self) -> None:
        super().clear()
        self.nbytes = 0

    def looked(self) -> None:
        """A look just ended: the next one when what is lent grew by a quarter."""
        self.lent_since = 0
        self.check_at = len(self) + max(_MIN_CHECK, len(self) >> 2)
        self.bytes_at = self.nbytes + max(self.slack, self.nbytes >> 2)
