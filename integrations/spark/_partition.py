"""Partition helpers: the executor side of a stateful PySpark job.

One partition run, whatever the API (``mapPartitions``, ``mapInPandas``, an iterator pandas
UDF), goes through the same steps:

1. take this process's manager (:func:`~._executor.worker_context`, one per process);
2. take ownership of partition ``p`` in the epoch store and drop local copies of ``p``'s
   namespaces if another process owned it since (coherence);
3. open ``p``'s scope — versioned when a micro-batch id is known (exactly-once) — and the
   state dict the function asked for;
4. read ahead over the records and hint their keys (keyed prefetching), so the state is in the
   heap when the function reaches the record;
5. in a ``finally``, when the partition ends for any reason: forward the (key, new, old) changes
   to the flush listeners if the function completed, then flush (checkpoint, in a micro-batch)
   so that the state is in the shared level before Spark sees the task finish. This is the
   task's commit point; nothing relies on the worker living any longer.

The batch id reaches the task in the pickled function (captured while :func:`foreach_batch`
runs the user's batch function on the driver) or, as a fallback, as the Spark local property
``mlcache.batch_id``.
"""
from __future__ import annotations

import copy
import inspect
import json
import sys
import threading
import typing
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

from mlcache.errors import CacheError

from ._executor import WorkerContext, worker_context
from ._scope import PartitionScope
from ._versioned import forward_changes

__all__ = ["PartitionSpec", "PartitionFunction", "PandasFunction", "KeyFunctionError",
           "BATCH_PROPERTY", "batch_context", "current_batch"]

BATCH_PROPERTY = "mlcache.batch_id"
_REPR_LIMIT = 300


class KeyFunctionError(CacheError, ValueError):
    """A ``key=`` function (or a pandas batch's ``ts=``) failed on a record, or gave a batch
    other than one value per row; the message names the record and partition."""

    def __init__(self, message: str, *, record: Any = None, partition: int | None = None) -> None:
        super().__init__(message)
        self.record = record
        self.partition = partition


# The batch id (and flush sinks) of the foreach_batch call running in this driver thread:
# a partition function pickled while it runs carries them to the executors.
_driver = threading.local()
# The foreach_batch calls running in any driver thread, each with its cache's (name, config):
# a function of that cache pickled in another thread (a pool the batch function hands its jobs
# to, where neither the thread-local context nor Spark's local property reaches) belongs to it.
_running: list["batch_context"] = []
_running_lock = threading.Lock()


class batch_context:
    """``with batch_context(batch_id, sinks, owner):`` — what :func:`foreach_batch` sets around
    a batch. ``owner`` is the ``(name, config)`` of the cache whose ``foreach_batch`` it is:
    its sinks get the changes of that cache's state only (``None``: of every function)."""

    def __init__(self, batch_id: int, sinks: tuple = (), owner: tuple | None = None) -> None:
        self.batch_id = int(batch_id)
        self.sinks = tuple(sinks)
        self.owner = owner

    def sinks_for(self, spec: "PartitionSpec") -> tuple:
        """The sinks a function of ``spec`` forwards its changes to in this batch."""
        if self.owner is None or self.owner == (spec.scope, spec.config):
            return self.sinks
        return ()

    def __enter__(self) -> "batch_context":
        self._saved = getattr(_driver, "ctx", None)
        _driver.ctx = self
        if self.owner is not None:
            with _running_lock:
                _running.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _driver.ctx = self._saved
        if self.owner is not None:
            with _running_lock:
                _running.remove(self)


def current_batch(spec: "PartitionSpec | None" = None) -> batch_context | None:
    """The batch a function pickled now runs in: the foreach_batch call of this driver thread,
    else (given the function's ``spec``) the one its own cache runs in another thread."""
    ctx = getattr(_driver, "ctx", None)
    if ctx is not None or spec is None:
        return ctx
    with _running_lock:
        mine = [c for c in _running if c.owner == (spec.scope, spec.config)]
    return mine[-1] if mine else None


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "...>"


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


@dataclass(frozen=True)
class PartitionSpec:
    """Everything a partition run needs; pickled to the executors with the function."""

    config: Any
    scope: str = "state"
    state: str = "state"
    key: Any = None                      # record -> key, a field/column name, or None
    ts: Any = None                       # record -> event time, a field/column name, or None
    depth: int | str = "auto"
    prefetch: bool = True
    batch_id: int | None = None
    listeners: tuple = ()
    collect_stats: bool = False
    # batch_id came from the foreach_batch call the function was pickled in, not for_batch():
    # the running batch's local property, when the task has it, comes first (see _Run)
    batch_from_context: bool = False


def _listener_calls(listeners: Iterable[Any]) -> list[Callable[[Any, Any, Any], Any]]:
    calls = []
    for obj in listeners:
        fn = getattr(obj, "on_flush", obj)
        if not callable(fn):
            raise TypeError(f"a flush listener must be callable(key, new, old) or have "
                            f"on_flush(key, new, old), got {type(obj).__name__}")
        calls.append(fn)
    return calls


class _Run:
    """One execution of one partition task (see the module docstring)."""

    def __init__(self, spec: PartitionSpec) -> None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        self.partition = tc.partitionId() if tc is not None else 0
        batch = spec.batch_id
        if tc is not None and (batch is None or spec.batch_from_context):
            # A function pickled once and run in later batches carries the batch it was
            # pickled in: a pandas UDF caches its pickled command on first use, so one defined
            # outside the foreachBatch function ran every later batch as a replay of that one,
            # and each batch's effects replaced the previous batch's.
            raw = tc.getLocalProperty(BATCH_PROPERTY)
            if raw not in (None, ""):
                batch = int(raw)
        self.spec = spec
        self.ctx: WorkerContext = worker_context(spec.config)
        self.ctx.take_partition(spec.scope, self.partition)
        stage = f"{tc.stageId()}.{tc.attemptNumber()}" if tc is not None else "0.0"
        attempt = f"{self.ctx.owner}:{stage}:{uuid.uuid4().hex[:6]}"
        self.scope = PartitionScope(
            self.ctx.manager, spec.scope, self.partition, batch, attempt,
            on_namespace=lambda ns: self.ctx.note_namespace(spec.scope, self.partition, ns))
        self.state = self.scope.dict(spec.state)
        self.target = self.scope.namespace(f"dict:{spec.state}")

    def key_function(self) -> Callable[[Any], Any] | None:
        key = self.spec.key
        if key is None:
            return None
        if not callable(key):
            field_name = key

            def key(record: Any, _f: Any = field_name) -> Any:
                return record[_f]
            label = f"record[{field_name!r}]"
        else:
            label = _fn_name(key)
        partition = self.partition

        def safe_key(record: Any) -> Any:
            try:
                return key(record)
            except Exception as exc:
                raise KeyFunctionError(
                    f"key function {label} failed on row {_short(record)} in partition "
                    f"{partition}: {type(exc).__name__}: {exc}",
                    record=record, partition=partition) from exc
        return safe_key

    def finish(self, completed: bool) -> None:
        """The commit point: make the state durable below the heap, then forward the changes.

        A run whose consumer stopped reading early (its iterator closed) counts as completed.
        A failed run flushes too: its writes (tagged with its attempt, in a micro-batch) must
        reach the shared level now, while this process still owns the partition, and never
        later from an eviction after another process took over. Changes are forwarded only
        once they are durable; a replay forwards them again (at least once downstream, exactly
        once in the state).
        """
        manager = self.ctx.manager
        if completed and self.scope.batch_id is not None:
            manager.checkpoint(checkpoint_id=self.scope.batch_id)
        elif self.ctx.flush_stays_local:
            # a flush would stop in this process's arena: copy down to the shared level
            manager.checkpoint(checkpoint_id=manager.last_checkpoint_id)
        else:
            manager.flush()
        if completed and self.spec.listeners:
            forward_changes(self.target, _listener_calls(self.spec.listeners))
        if self.spec.collect_stats:
            stats = self.ctx.manager.stats()
            stats["spark"] = {"partitions_taken": self.ctx.takes,
                              "ownership_changes": self.ctx.drops}
            self.ctx.store.record_stats(self.ctx.worker, json.dumps(stats, default=str))


def _rows(fn: Callable[..., Iterable[Any]], spec: PartitionSpec, records: Iterable[Any], /
          ) -> Iterator[Any]:
    run = _Run(spec)
    completed = False
    try:
        keyfn = run.key_function()
        if keyfn is not None and spec.prefetch:
            records = _timed(run, records, keyfn)
        yield from _output(fn, fn(records, run.state))
        completed = True
    except GeneratorExit:
        # The consumer stopped reading (take, first, isEmpty: PySpark closes the iterator).
        # The function did not fail and what it changed is the state once flushed, so the run
        # commits and forwards its changes as a completed one; treated as failed, they stayed
        # in the state but never reached the sinks, promised every durable change. Unless the
        # task has already ended: a later stage of it failed (see _task_over).
        completed = not _task_over()
        raise
    finally:
        run.finish(completed)


def _task_over() -> bool:
    """Whether the generator is being closed after its Spark task ended, not by the task.

    A stage after the partition function that raises (``.map(f)`` on its output) fails the
    task with the generator suspended at a ``yield``: PySpark's worker reports the failure and
    the generator is closed only when the error's frames are let go, in the daemon, after
    ``pyspark.worker.main`` returned. That ``GeneratorExit`` looks like a ``take()``'s, which
    PySpark's worker sends from inside its task loop (closing the output iterator). Counted
    as an early stop, the failed run committed and forwarded its partial changes: the sink
    got a value the state never holds once the batch commits (``a 3 None`` where the replay
    makes ``a`` 10). So: in a Spark worker (a task context is set), a close with no frame of
    PySpark's worker module (``pyspark/worker.py``, or a module under ``pyspark/**/worker*``)
    on the stack comes after the task. Outside Spark (a partition function called directly)
    a close is the caller's early stop, as before. (With ``spark.python.use.daemon=false``
    the worker module is the process's main script and its frame stays on the stack: there
    such a failure is still forwarded.)"""
    try:
        from pyspark import TaskContext
    except ImportError:   # pragma: no cover (the integration needs pyspark)
        return False
    if TaskContext.get() is None:
        return False
    frame: Any = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if "/pyspark/" in path and "worker" in path.rsplit("/pyspark/", 1)[1]:
            return False
        frame = frame.f_back
    return True


def _output(fn: Any, out: Any) -> Iterable[Any]:
    """What ``fn`` returned, checked to be iterable: ``yield from None`` raised "'NoneType'
    object is not iterable" from this module, naming neither the function nor the fix."""
    try:
        return iter(out)
    except TypeError:
        raise TypeError(f"partition function {_fn_name(fn)} returned {type(out).__name__}, "
                        "not an iterable of output rows: yield them, or return a list (an "
                        "empty one for no output)") from None


def _timed(run: _Run, records: Iterable[Any], keyfn: Callable[[Any], Any]) -> Iterator[Any]:
    """The records behind the lookahead operator, each hinted with its event time.

    The time is ``ts=`` or the worker's clock: one clock for every partition and batch the
    worker's manager serves (the pandas path draws from it too), so a new partition's hints are
    never older than state already used. The operator advances the policy's clock to each
    record's time as it hands the record over, so the state accesses made while the function
    handles it are stamped with that time without passing it.
    """
    from mlcache.prefetch import prefetching

    spec_ts = run.spec.ts
    if spec_ts is None:
        spec_ts = run.ctx.tick
    elif not callable(spec_ts):
        spec_ts = _field_getter(spec_ts)

    def ts(record: Any) -> float:
        return float(spec_ts(record))

    from mlcache.prefetch import RecordKeyError

    try:
        yield from prefetching(records, keyfn, ts=ts, cache=run.target, depth=run.spec.depth)
    except RecordKeyError as exc:
        # The operator names the record by its index only; a failing key function's error
        # (its cause) already names the row and the partition, the others do now.
        cause = exc.__cause__
        if isinstance(cause, KeyFunctionError):
            raise cause from cause.__cause__
        raise KeyFunctionError(
            f"row {_short(exc.record)} in partition {run.partition}: {exc}",
            record=exc.record, partition=run.partition) from exc


def _field_getter(name: Any) -> Callable[[Any], Any]:
    def get(record: Any) -> Any:
        return record[name]
    return get


def _frame_len(frame: Any) -> int:
    """The number of rows of a pandas batch (DataFrame, Series or tuple of Series)."""
    return len(frame[0] if isinstance(frame, tuple) else frame)


def _per_row(run: _Run, frame: Any, what: str, spec: Any, compute: Callable[[], Any]) -> list:
    """One value per row of ``frame`` from ``compute()`` (the ``key=``/``ts=`` of the spec),
    or :class:`KeyFunctionError` naming the batch and partition. A result of another length
    is refused: the rows are handed to the function as far as they have keys, so a key
    function giving fewer (``frame["k"].unique()``, a scalar) dropped the others silently."""
    label = f"{what}= {_fn_name(spec) if callable(spec) else repr(spec)}"
    try:
        values = compute()
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"returned a {type(values).__name__}, not one value per row")
        out = values.tolist() if hasattr(values, "tolist") else list(values)
        if len(out) != _frame_len(frame):
            raise ValueError(f"returned {len(out)} values, not one per row")
    except Exception as exc:
        first = _first_row(frame)
        raise KeyFunctionError(
            f"{label} failed on a batch of {_frame_len(frame)} rows in partition "
            f"{run.partition} (first row: {_short(first)}): {type(exc).__name__}: {exc}",
            record=first, partition=run.partition) from exc
    return out


def _frame_times(run: _Run, frame: Any, n: int) -> list[float]:
    """Event times of one pandas batch for the hints: the ``ts`` column (or function) if
    given, else the worker's clock (:meth:`WorkerContext.tick`)."""
    ts = run.spec.ts
    if ts is None:
        start = run.ctx.next_positions(n)
        return [float(start + i) for i in range(n)]

    def compute() -> list[float]:
        values = ts(frame) if callable(ts) else frame[ts]
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            return values   # refused by _per_row, naming what it is
        return [float(t) for t in (values.tolist() if hasattr(values, "tolist") else values)]
    return _per_row(run, frame, "ts", ts, compute)


def _frame_keys(run: _Run, frame: Any) -> list[Any]:
    """The state keys of one pandas batch (DataFrame, Series or tuple of Series)."""
    key = run.spec.key

    def compute() -> Any:
        if key is None:
            series = frame[0] if isinstance(frame, tuple) else frame
            if hasattr(series, "columns"):
                raise TypeError("a DataFrame batch needs key= (a column name or a function)")
            return series
        return key(frame) if callable(key) else frame[key]
    return _per_row(run, frame, "key", key, compute)


def _first_row(frame: Any) -> Any:
    try:
        if isinstance(frame, tuple):
            return tuple(s.iloc[0] for s in frame)
        if hasattr(frame, "columns"):
            return frame.iloc[0].to_dict()
        return frame.iloc[0]
    except Exception:
        return None


def _row_of(frame: Any, i: int) -> Any:
    try:
        if isinstance(frame, tuple):
            return tuple(s.iloc[i] for s in frame)
        if hasattr(frame, "columns"):
            return frame.iloc[i].to_dict()
        return frame.iloc[i]
    except Exception:
        return None


FRAME_CHUNK = 256


def _frame_rows(run: _Run, frames: Iterable[Any]) -> Iterator[tuple[Any, int, Any, float]]:
    """(batch, row index, key, event time) for every row, keys checked (naming the row)."""
    from mlcache.keys import check_key

    for frame in frames:
        keys = _frame_keys(run, frame)
        times = _frame_times(run, frame, len(keys))
        for i, k in enumerate(keys):
            try:
                if type(k) is not int and type(k) is not str:
                    check_key(k)
            except TypeError as exc:
                row = _row_of(frame, i)
                raise KeyFunctionError(
                    f"key {k!r} of row {_short(row)} (row {i} of its batch) in partition "
                    f"{run.partition} is not a valid mlcache key: {exc}",
                    record=row, partition=run.partition) from exc
            yield frame, i, k, times[i]


def _slice(frame: Any, lo: int, hi: int) -> Any:
    if lo == 0 and hi == len(frame[0] if isinstance(frame, tuple) else frame):
        return frame
    if isinstance(frame, tuple):
        return tuple(s.iloc[lo:hi].reset_index(drop=True) for s in frame)
    return frame.iloc[lo:hi].reset_index(drop=True)


def _hinted_frames(run: _Run, frames: Iterable[Any]) -> Iterator[Any]:
    """The pandas batches, re-cut into chunks of at most FRAME_CHUNK rows, behind the
    lookahead operator run over their rows.

    The operator reads ``depth`` rows ahead (adaptive, across batch boundaries), hints each
    row's key with its event time and accounts each use, exactly as for a row iterator. A row
    counts as used when its chunk is handed to the function, at most a chunk early; that is
    why chunks are small. Hinting whole Arrow batches at once was the rejected alternative:
    with a heap smaller than a batch's keys the prefetches evicted each other before use.
    """
    from mlcache.prefetch import RecordKeyError

    rows: Iterable[tuple[Any, int, Any, float]] = _frame_rows(run, frames)
    if run.spec.prefetch:
        from mlcache.prefetch import prefetching

        rows = prefetching(rows, _row_key, ts=_row_ts, cache=run.target, depth=run.spec.depth)
    # Accesses made while the function handles a chunk are stamped with the time of the last
    # row the operator handed over (the chunk's last): the rows' entries were hinted no later.
    current: Any = None
    lo = n = 0
    try:
        for frame, i, _k, _t in rows:
            if frame is not current:
                if current is not None and n:
                    yield _slice(current, lo, lo + n)
                current, lo, n = frame, i, 0
            n += 1
            if n >= FRAME_CHUNK:
                yield _slice(current, lo, lo + n)
                lo, n = lo + n, 0
    except RecordKeyError as exc:
        # (a NaN ts=): the operator numbers the rows across the batches and names no row
        frame, i = exc.record[0], exc.record[1]
        row = _row_of(frame, i)
        raise KeyFunctionError(
            f"row {_short(row)} (row {i} of its batch) in partition {run.partition}: "
            f"{str(exc).split(': ', 1)[-1]}", record=row, partition=run.partition) from exc
    if current is not None and n:
        yield _slice(current, lo, lo + n)


def _row_key(row: tuple[Any, int, Any, float]) -> Any:
    return row[2]


def _row_ts(row: tuple[Any, int, Any, float]) -> float:
    return row[3]


def _frames(fn: Callable[..., Iterable[Any]], spec: PartitionSpec, frames: Iterable[Any], /
            ) -> Iterator[Any]:
    run = _Run(spec)
    completed = False
    try:
        yield from _output(fn, fn(_hinted_frames(run, frames), run.state))
        completed = True
    except GeneratorExit:
        # The consumer stopped reading (take, first, isEmpty: PySpark closes the iterator).
        # The function did not fail and what it changed is the state once flushed, so the run
        # commits and forwards its changes as a completed one; treated as failed, they stayed
        # in the state but never reached the sinks, promised every durable change. Unless the
        # task has already ended: a later stage of it failed (see _task_over).
        completed = not _task_over()
        raise
    finally:
        run.finish(completed)


class PartitionFunction:
    """``fn(records, state)`` made into a function of one iterator, for ``rdd.mapPartitions``.

    Pickled to the executors with its :class:`PartitionSpec`; when pickled inside
    :func:`foreach_batch` it carries that batch's id and flush sinks.
    """

    _runner = staticmethod(_rows)

    def __init__(self, fn: Callable[..., Iterable[Any]], spec: PartitionSpec) -> None:
        self.fn = fn
        self.spec = spec
        self.__name__ = getattr(fn, "__name__", type(self).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, records: Iterable[Any]) -> Iterator[Any]:
        return type(self)._runner(self.fn, self.spec, records)

    def for_batch(self, batch_id: int, *, listeners: Iterable[Any] = ()) -> "PartitionFunction":
        """A copy bound to a micro-batch explicitly (exactly-once state effects)."""
        out = copy.copy(self)
        out.spec = replace(self.spec, batch_id=int(batch_id),
                           listeners=self.spec.listeners + tuple(listeners))
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.__dict__.get("_pickled_once"):
            # A pandas UDF: Spark pickles it once, on first use, so a batch found in another
            # thread would stay with it; there only the local property tells the batch, and it
            # does not reach a thread the batch function started: its runs would not be
            # versioned (a replayed batch counted twice), so it is refused, by name.
            ctx = current_batch()
            if ctx is None and self.spec.batch_id is None and current_batch(self.spec):
                raise CacheError(
                    f"pandas UDF {self.__name__} of SparkCache {self.spec.scope!r} is used in "
                    "another thread than its foreach_batch function's, where the micro-batch "
                    "does not reach it (Spark pickles a pandas UDF once): call it in the "
                    "batch function's own thread, or use mapInPandas (cache.pandas)")
        else:
            ctx = current_batch(self.spec)
        if ctx is not None and self.spec.batch_id is None:
            state["spec"] = replace(self.spec, batch_id=ctx.batch_id,
                                    listeners=self.spec.listeners + ctx.sinks_for(self.spec),
                                    batch_from_context=True)
        return state

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.__name__} state={self.spec.scope}/{self.spec.state}>"


class PandasFunction(PartitionFunction):
    """``fn(batches, state)`` made into a function of one iterator of pandas batches, for
    ``df.mapInPandas`` and iterator pandas UDFs."""

    _runner = staticmethod(_frames)


def as_pandas_udf(pf: PandasFunction, user_fn: Callable[..., Any], return_type: Any) -> Any:
    """A real ``pandas_udf`` whose one parameter and return carry the user's type hints
    (Spark infers the UDF kind from them; the injected ``state`` parameter is not Spark's)."""
    from pyspark.sql.functions import pandas_udf

    hints = typing.get_type_hints(user_fn)
    params = list(inspect.signature(user_fn).parameters)
    if not params or params[0] not in hints or "return" not in hints:
        raise TypeError(f"{_fn_name(user_fn)} needs type hints on its first parameter and its "
                        "return, e.g. (batches: Iterator[pd.Series], state) -> Iterator[pd.Series]")

    pf._pickled_once = True     # type: ignore[attr-defined]  # see PartitionFunction.__getstate__

    def batches_udf(batches):  # type: ignore[no-untyped-def]
        return pf(batches)

    batches_udf.__annotations__ = {"batches": hints[params[0]], "return": hints["return"]}
    batches_udf.__name__ = getattr(user_fn, "__name__", "batches_udf")
    return pandas_udf(batches_udf, return_type)  # type: ignore[call-overload]  # hints set above
