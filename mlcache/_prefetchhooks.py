"""The manager's side of keyed prefetching (:mod:`mlcache.prefetch`): hints, the prefetcher,
the event-time clock.

Kept apart from the manager because none of it is on the get/put path. A hint for a resident
key goes to the heap's policy (TAC renews the entry), one for an absent key to the prefetcher,
which is created on first use (a hint or a lookahead operator) and again in a forked child
(imported lazily: a build without :mod:`mlcache.prefetch` falls back to policy hints). The
lookahead operator advances an event-time policy's clock as it hands records over. While
prefetched keys wait for their first use, the hits replayed to the policy are reported to the
prefetcher, so a heap hit itself pays nothing for the accounting.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from ._readpath import event_time

__all__ = ["PrefetchHooks"]


class PrefetchHooks:
    """Mixin for CacheManager: hints, the per-process prefetcher, the event-time clock and
    first-use reports. Uses the manager's lock, heap, read buffers and configuration."""

    config: Any
    _lock: Any
    _heap: Any
    _data: dict[bytes, Any]
    _reads: list[bytes]
    _closed: bool
    _check_open: Callable[[], None]
    _advance: Callable[[float], Any] | None
    _prefetcher: Any
    _prefetcher_pid: int
    _prefetch_absent: bool
    _prefetch_reserve: int
    _pf_landed: dict[bytes, float] | None
    _apply_reads: Callable[[], None]
    _recharge: Callable[[], None]

    def _hint_kb(self, kb: bytes, ts: float) -> None:
        try:
            ts = event_time(ts)
        except OverflowError:
            # an int past the largest float: refused here like NaN, naming ts (the bare
            # "int too large to convert to float" named nothing)
            raise ValueError(f"ts must fit a float (an event time), got a "
                             f"{type(ts).__name__} too large in magnitude") from None
        heap = self._heap
        if heap is not None:
            with self._lock:
                if kb in self._data:
                    self._apply_reads()
                    _tell(heap.policy, kb, ts)
                    return
        prefetcher = self._get_prefetcher()
        if prefetcher is not None:
            prefetcher.submit(kb, ts)
            return
        if self._closed:
            # refused like put/delete (a hint after close() was taken silently). Checked only
            # here, off the resident key's path: close() empties the heap, and a closed
            # manager has no prefetcher
            self._check_open()
        if heap is not None:
            with self._lock:
                self._apply_reads()
                _tell(heap.policy, kb, ts)

    def _get_prefetcher(self) -> Any:
        """This process's prefetcher (made on first use), or ``None`` when prefetching is
        disabled, the manager is closed or :mod:`mlcache.prefetch` is not installed."""
        if not self.config.prefetch.enabled or self._prefetch_absent or self._closed:
            return None
        pid = os.getpid()
        if self._prefetcher is not None and self._prefetcher_pid == pid:
            return self._prefetcher
        with self._lock:
            if self._prefetcher is None or self._prefetcher_pid != pid:
                try:
                    module = importlib.import_module("mlcache.prefetch")
                except ModuleNotFoundError as exc:
                    if exc.name != "mlcache.prefetch":
                        raise
                    self._prefetch_absent = True
                    return None
                self._prefetcher = module.Prefetcher(self)
                # its staged reads (raw bytes waiting to be installed) are bounded in bytes
                self._prefetch_reserve = int(getattr(self._prefetcher, "staged_max_bytes", 0))
                self._recharge()
                self._prefetcher_pid = pid
            return self._prefetcher

    def _advance_clock(self, ts: float) -> None:
        """A record at event time ``ts`` is being handed to the caller (lookahead operator):
        an event-time policy stamps the accesses and inserts without ``ts`` that follow with
        it. Hits buffered before are replayed first, at the time they happened."""
        advance = self._advance
        if advance is not None:
            if self._reads:
                with self._lock:
                    self._apply_reads()
            advance(ts)

    def _policy_hint(self, key_bytes: bytes, ts: float) -> None:
        if self._heap is not None:
            with self._lock:
                self._apply_reads()  # keep hits and hints in the order they happened
                _tell(self._heap.policy, key_bytes, ts)

    def _note_landed(self, items: list[bytes], timed: list[tuple[bytes, float]]) -> None:
        """Lock held: tell the prefetcher of the first use of keys it prefetched (hits replayed
        here, so the get path pays nothing; a key the lookahead operator reported is no longer
        among them). Runs only while unused prefetches exist."""
        landed, pf = self._pf_landed, self._prefetcher
        if landed is None or pf is None:
            return
        note = pf.note_get
        for kb in items:
            if kb in landed:
                note(kb, None)
        for kb, ts in timed:
            if kb in landed:
                note(kb, ts)


def _tell(policy: Any, kb: bytes, ts: float) -> None:
    # ``hint`` is optional in the Policy protocol: a registered policy without one (it cannot
    # use a hint) is simply not told, as the prefetcher does not tell it either
    hint = getattr(policy, "hint", None)
    if hint is not None:
        hint(kb, ts)
