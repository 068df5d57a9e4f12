"""ForwardingSink: hand flushed ``(key, new, old)`` batches to a plain user function.

A :class:`ForwardingSink` is a flush listener (``manager.on_flush(sink)``) and a plain helper
that Spark's ``foreach_batch`` helpers call with the changes of a micro-batch
(``sink.forward(records, batch_id=...)``). It adds only what every sink needs: deletes kept or
dropped, unchanged records skipped, a pandas frame instead of tuples, and counters. It holds no
connection and no thread, so it pickles to Spark executors as long as ``fn`` does.

``fn(records)`` — or ``fn(records, batch_id)`` when built with ``with_batch_id=True``, so an
idempotent sink can tag what it writes with the micro-batch id. If ``fn`` raises, the error goes to
whoever called the sink; as a flush listener that leaves the records pending in the cache, and the
retry hands the same records again (never one ``fn`` already accepted).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["ForwardingSink"]


_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None), frozenset, range})


def _same(new: Any, old: Any) -> bool:
    """``new == old`` as a bool, also for values whose ``==`` is element-wise (numpy arrays,
    pandas objects), where ``bool(new == old)`` raises: then equal shapes and elements."""
    if new is old:
        # one object on both sides: equal only if it cannot have changed (a dict changed in
        # place and put again also arrives as ``old is new``, and was skipped as unchanged)
        return type(new) in _IMMUTABLE
    try:
        return bool(new == old)
    except (ValueError, TypeError):
        pass
    equals = getattr(new, "equals", None)         # pandas: labels, values and dtypes
    if callable(equals) and type(new) is type(old):
        return bool(equals(old))
    try:
        import numpy as np

        return bool(np.array_equal(new, old))
    except Exception:   # not comparable: not the same
        return False


class ForwardingSink:
    """Forward batches of ``(key, new, old)`` to ``fn`` (see the module docstring).

    ``deletes=False`` drops records whose ``new`` is None; ``skip_unchanged=True`` drops records
    with ``new == old`` (a mutable value changed in place and put again, which arrives as
    ``old is new``, is never taken for unchanged); ``format="pandas"`` passes a ``pandas.DataFrame`` with columns
    ``key, new, old`` (and ``namespace``) instead of a list of tuples.
    """

    def __init__(self, fn: Callable[..., Any], *, deletes: bool = True,
                 skip_unchanged: bool = False, format: str = "records",
                 with_batch_id: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"ForwardingSink needs a callable, got {type(fn).__name__}")
        if format not in ("records", "pandas"):
            raise ValueError(f"format must be 'records' or 'pandas', got {format!r}")
        self.fn = fn
        self.deletes = deletes
        self.skip_unchanged = skip_unchanged
        self.format = format
        self.with_batch_id = with_batch_id
        self.records = 0      # records handed to fn
        self.batches = 0      # calls of fn
        self.skipped = 0

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"ForwardingSink({name}, records={self.records}, batches={self.batches})"

    def __call__(self, batch: Iterable[tuple]) -> None:
        """The flush-listener entry point: ``manager.on_flush(sink)``."""
        self.forward(batch, namespace=getattr(batch, "namespace", None))

    def forward(self, records: Iterable[tuple], *, batch_id: int | None = None,
                namespace: str | None = None) -> int:
        """Filter ``records`` and call ``fn`` once with what is left; returns that count."""
        keep = []
        skipped = 0
        for i, rec in enumerate(records):
            if not isinstance(rec, (tuple, list)) or len(rec) != 3:
                raise TypeError(f"ForwardingSink.forward: record {i} is not a (key, new, old) "
                                f"tuple: {rec!r}")
            key, new, old = rec
            if (new is None and not self.deletes) or (self.skip_unchanged and _same(new, old)):
                skipped += 1
                continue
            keep.append((key, new, old))
        if not keep:
            self.skipped += skipped
            return 0
        payload: Any = keep
        if self.format == "pandas":
            import pandas as pd

            payload = pd.DataFrame(keep, columns=["key", "new", "old"])
            payload["namespace"] = namespace
        if self.with_batch_id:
            self.fn(payload, batch_id)
        else:
            self.fn(payload)
        self.records += len(keep)     # counted once fn took them: a retry counts them once
        self.batches += 1
        self.skipped += skipped
        return len(keep)
