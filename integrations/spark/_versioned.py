"""Exactly-once state effects for micro-batches: versioned entries tagged with batch ids.

Spark may run a micro-batch twice (same batch id, same input) after a failure, and some of the
first attempt's partitions may have finished and flushed their state. A replay must read the
state as of the end of the previous batch and leave what one run leaves. We keep the previous
version beside the current one: every entry written during batch ``b`` is stored as

    [MARK, b, attempt, present, value, previous]

where ``attempt`` identifies one execution of one partition task and ``previous`` is the
entry's state before batch ``b`` (encoded with the manager's codec, so ``allow_pickle`` and the
signing key cover it as they cover the entry; ``b""`` when it did not exist). A reader in batch
``b`` and attempt ``a`` sees:

- an entry of an earlier batch: its value (that *is* the state before ``b``);
- an entry of batch ``b`` written by attempt ``a``: its value (our own write);
- an entry of batch ``b`` written by another attempt (a failed or replayed run): ``previous``;
- an entry of a later batch: an error, since batch ids only move forward.

A replay therefore recomputes from the pre-batch state whatever the first attempt flushed, and
no publish step or undo log is needed: the cost is one tuple per entry and one encoding of the
pre-batch value per key and batch (taken when the key is first read, so an in-place mutation of
the returned object cannot destroy it). The rejected alternative, staging per (batch, partition)
and publishing on commit, costs a second write of every changed entry and a lookup in two
namespaces on every read.

Replays are only exact for deterministic partition functions over replayable sources, which is
Spark's own condition for exactly-once output.

Both views have ``get_many``/``put_many``/``delete_many`` (what a structure's batched operations
call: a dict's ``update``, ``copy``, ``==``, ``clear``), each one batched read or write of the
namespace with exactly the effects of the single-key calls made in order: the same pre-batch
snapshots, the same records, the same written keys, and on a ``ReplayError`` the keys before
the failing one written as the loop of ``put`` calls would have written them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Hashable, Iterable, Iterator

from mlcache.errors import CacheError

__all__ = ["MARK", "BatchView", "PlainView", "PlainMetaView", "unwrap", "ReplayError"]

MARK = "\x00mlcache.v1"
_ABSENT = b""
_MISSING = object()


class ReplayError(CacheError):
    """State carries a newer batch id than the batch being run (batch ids went backwards)."""


def _snapshot(codec: Any, present: bool, value: Any) -> bytes:
    # The manager's codec, not pickle: these bytes are read back from the shared level, and a
    # bare pickle.loads ran whatever a forged entry held, whatever allow_pickle and the
    # signing key said.
    return codec.encode(value) if present else _ABSENT


def _restore(codec: Any, data: bytes) -> tuple[bool, Any]:
    if not data:
        return False, None
    return True, codec.decode(data)


def _is_record(rec: Any) -> bool:
    # (``rec[0] == MARK`` of a user's numpy array is an array: its truth value raised)
    return isinstance(rec, (list, tuple)) and len(rec) == 6 and type(rec[0]) is str \
        and rec[0] == MARK


def unwrap(rec: Any) -> tuple[bool, Any]:
    """The latest (present, value) of a stored entry, versioned or not (driver-side reads)."""
    if rec is _MISSING or rec is None:
        return False, None
    if _is_record(rec):
        return bool(rec[3]), rec[4]
    return True, rec


class PlainView:
    """A namespace used directly: plain partition jobs with no batch id."""

    versioned = False
    # set by the scope: how a lookahead operator over this view reaches the prefetcher
    _prefetch_target: Callable[..., Any] | None = None

    def __init__(self, ns: Any) -> None:
        self.ns = ns
        self._written: dict[Hashable, None] = {}

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self.ns.get(key, default)

    def put(self, key: Hashable, value: Any) -> None:
        self.ns.put(key, value)
        self._written[key] = None

    def delete(self, key: Hashable) -> None:
        self.ns.delete(key)
        self._written[key] = None

    def get_many(self, keys: Iterable[Hashable]) -> dict[Hashable, Any]:
        return self.ns.get_many(list(keys))

    def put_many(self, items: Mapping[Hashable, Any] | Iterable[tuple[Hashable, Any]]) -> None:
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        self.ns.put_many(pairs)
        for key, _ in pairs:
            self._written[key] = None

    def delete_many(self, keys: Iterable[Hashable]) -> None:
        keys = list(keys)
        self.ns.delete_many(keys)
        for key in keys:
            self._written[key] = None

    def contains(self, key: Hashable) -> bool:
        return self.ns.contains(key)

    def keys(self) -> Iterator[Hashable]:
        return iter(self.ns.keys())

    def written(self) -> list[Hashable]:
        return list(self._written)

    def changes(self) -> Iterator[tuple[Hashable, Any, Any]]:
        # Without a batch there is no "before" to report: old is None.
        for key in self._written:
            yield key, self.ns.get(key), None


class PlainMetaView(PlainView):
    """A plain run's view of the structures' metadata, where a state written inside
    ``foreach_batch`` shows: its records, which a run without a batch id cannot read (a dict
    opened over them failed with "dictionary update sequence element #0 has length 11")."""

    def _check(self, key: Hashable, value: Any) -> Any:
        if _is_record(value):
            raise ReplayError(
                f"state {key!r} is written by foreach_batch (batch {value[1]}); a run without a "
                "batch id cannot read it: run the function inside the foreach_batch function, "
                "or bind it to a batch with .for_batch(batch_id)", key=key)
        return value

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self._check(key, self.ns.get(key, default))

    def get_many(self, keys: Iterable[Hashable]) -> dict[Hashable, Any]:
        found = self.ns.get_many(list(keys))
        for key, value in found.items():
            self._check(key, value)
        return found


class BatchView:
    """A namespace seen from one attempt of one micro-batch (see the module docstring)."""

    versioned = True
    _prefetch_target: Callable[..., Any] | None = None   # as PlainView's

    def __init__(self, ns: Any, batch_id: int, attempt: str) -> None:
        self.ns = ns
        self.batch = int(batch_id)
        self.attempt = attempt
        self._before: dict[Hashable, bytes] = {}   # key -> pre-batch snapshot, first touch
        self._written: dict[Hashable, None] = {}
        self._codec = ns.manager._codec

    def _read(self, key: Hashable) -> tuple[bool, Any]:
        return self._seen(key, self.ns.get(key, _MISSING))

    def _seen(self, key: Hashable, rec: Any) -> tuple[bool, Any]:
        """What this attempt sees of ``key`` stored as ``rec`` (``_MISSING`` when absent),
        noting its pre-batch snapshot on the first touch."""
        if rec is _MISSING or rec is None:
            present, value = False, None
            if key not in self._before:
                self._before[key] = _ABSENT
            return present, value
        if not _is_record(rec):
            raise ReplayError(f"entry {key!r} was written without a batch id; a state used with "
                              "foreach_batch must always be written through it", key=key)
        batch, attempt = rec[1], rec[2]
        if batch == self.batch and attempt == self.attempt:
            return bool(rec[3]), rec[4]
        if batch == self.batch:          # another attempt of this batch: start from before it
            if key not in self._before:
                self._before[key] = rec[5]
            return _restore(self._codec, rec[5])
        if batch > self.batch:
            raise ReplayError(f"entry {key!r} was written by batch {batch}, after batch "
                              f"{self.batch}; batch ids must not go backwards", key=key)
        present, value = bool(rec[3]), rec[4]
        if key not in self._before:
            self._before[key] = _snapshot(self._codec, present, value)
        return present, value

    def get(self, key: Hashable, default: Any = None) -> Any:
        present, value = self._read(key)
        return value if present else default

    def contains(self, key: Hashable) -> bool:
        return self._read(key)[0]

    def _write(self, key: Hashable, present: bool, value: Any) -> None:
        if key not in self._before:
            self._read(key)
        self.ns.put(key, [MARK, self.batch, self.attempt, int(present), value, self._before[key]])
        self._written[key] = None

    def put(self, key: Hashable, value: Any) -> None:
        self._write(key, True, value)

    def delete(self, key: Hashable) -> None:
        self._write(key, False, None)

    def get_many(self, keys: Iterable[Hashable]) -> dict[Hashable, Any]:
        """``{key: get(key)}`` for the keys present, as ``get`` per key in order would see and
        note them, with one batched read of the namespace."""
        keys = list(keys)
        recs = self.ns.get_many(keys) if keys else {}
        out = {}
        for key in keys:
            present, value = self._seen(key, recs.get(key, _MISSING))
            if present:
                out[key] = value
        return out

    def put_many(self, items: Mapping[Hashable, Any] | Iterable[tuple[Hashable, Any]]) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._write_many([(key, True, value) for key, value in pairs])

    def delete_many(self, keys: Iterable[Hashable]) -> None:
        self._write_many([(key, False, None) for key in keys])

    def _write_many(self, changes: list[tuple[Hashable, bool, Any]]) -> None:
        """``_write`` per change in order, with one batched read of the keys not touched yet
        in this attempt (each is read before its first write, as ``_write`` reads it) and one
        batched write. A ``ReplayError`` on a key leaves the changes before it written."""
        fresh = list(dict.fromkeys(key for key, _, _ in changes if key not in self._before))
        recs = self.ns.get_many(fresh) if fresh else {}
        out = []
        try:
            for key, present, value in changes:
                if key not in self._before:
                    self._seen(key, recs.get(key, _MISSING))
                out.append((key, [MARK, self.batch, self.attempt, int(present), value,
                                  self._before[key]]))
        finally:
            if out:
                self.ns.put_many(out)
                for key, _ in out:
                    self._written[key] = None

    def keys(self) -> Iterator[Hashable]:
        for key in list(self.ns.keys()):
            if self._read(key)[0]:
                yield key

    def written(self) -> list[Hashable]:
        return list(self._written)

    def changes(self) -> Iterator[tuple[Hashable, Any, Any]]:
        """(key, new, old) once per key written in this attempt; ``None`` stands for absent."""
        for key in self._written:
            present, new = self._read(key)
            had, old = _restore(self._codec, self._before.get(key, _ABSENT))
            yield key, (new if present else None), (old if had else None)


def forward_changes(view: Any, listeners: Iterable[Callable[[Any, Any, Any], Any]]) -> int:
    """Call every listener with each (key, new, old) of the view; returns the number of changes."""
    listeners = list(listeners)
    if not listeners:
        return 0
    n = 0
    for key, new, old in view.changes():
        n += 1
        for fn in listeners:
            fn(key, new, old)
    return n
