"""The common shape of every benchmark's output (DESIGN §9).

Each benchmark builds a :class:`BenchReport`, adds result rows and goals, prints a table and,
with ``--json PATH``, writes ``{"benchmark", "machine", "date", "quick", "results", "goals"}``.
A goal stores its measured value, comparison and target; the reader recomputes met/not met.
A goal that could not be measured (a dependency or an input missing) is still listed, with
``"value": null`` and ``"unmeasured"`` saying why: it counts as not met (:func:`goal_met`).

The ``*_arg`` helpers are argparse types for the benchmarks' own options, so a bad value is
refused with argparse's one-line error before anything runs.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

from .._files import replace_atomically

__all__ = ["BenchReport", "machine_description", "Timer", "goal_met", "int_arg",
           "nonnegative_float_arg", "redis_url_arg"]

_OPS = {
    "<=": lambda v, t: v <= t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    ">": lambda v, t: v > t,
    "==": lambda v, t: v == t,
}


def goal_met(goal: dict[str, Any]) -> bool:
    """Whether a stored goal is met; one that was not measured (``value`` None) is not."""
    value = goal.get("value")
    if value is None:
        return False
    return bool(_OPS[goal["op"]](float(value), float(goal["target"])))


def int_arg(minimum: int) -> Any:
    """An argparse type: an integer of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
        return n
    return parse


def nonnegative_float_arg(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return x


def redis_url_arg(text: str) -> str:
    """An argparse type: a redis://, rediss:// or unix:// URL, or ``embedded`` (a private
    server), checked before the run (a bad one failed with a traceback midway)."""
    from urllib.parse import urlsplit

    if text != "embedded" and urlsplit(text).scheme not in ("redis", "rediss", "unix"):
        raise argparse.ArgumentTypeError(
            f"not a Redis URL (redis://, rediss:// or unix://) or 'embedded': {text!r}")
    return text


def machine_description() -> str:
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except Exception:  # psutil is optional
        mem = "? GiB"
    cpu = platform.processor() or platform.machine()
    return (f"{os.cpu_count()} cores {cpu}, {mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``."""

    def __enter__(self) -> "Timer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


@dataclass
class BenchReport:
    benchmark: str
    quick: bool = False
    results: list[dict[str, Any]] = field(default_factory=list)
    goals: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def result(self, variant: str, **figures: Any) -> dict[str, Any]:
        row = {"variant": variant, **figures}
        self.results.append(row)
        return row

    def goal(self, name: str, value: float, op: str, target: float) -> bool:
        if op not in _OPS:
            raise ValueError(f"unknown comparison {op!r}")
        value = float(value)
        if not math.isfinite(value):
            # a NaN or infinite ratio is a failed measurement (0/0, a zero time), and JSON has
            # no such numbers (json.dump would write NaN, which strict readers refuse)
            return self.unmeasured(name, op, target, f"the measurement gave {value}")
        self.goals.append({"name": name, "value": round(value, 6), "op": op, "target": target})
        return _OPS[op](value, target)

    def unmeasured(self, name: str, op: str, target: float, why: str) -> bool:
        """A goal that could not be measured in this run: listed with ``value`` None and the
        reason, and not met (never left out, so a report cannot look complete without it)."""
        if op not in _OPS:
            raise ValueError(f"unknown comparison {op!r}")
        self.goals.append({"name": name, "value": None, "op": op, "target": target,
                           "unmeasured": why})
        return False

    def note(self, text: str) -> None:
        self.notes.append(text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "machine": machine_description(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": self.quick,
            "results": [{k: _json_number(v) for k, v in row.items()} for row in self.results],
            "goals": self.goals,
            "notes": self.notes,
        }

    def format(self) -> str:
        lines = [f"== mlcache bench {self.benchmark}{' (quick)' if self.quick else ''} =="]
        if self.results:
            cols: list[str] = []
            for row in self.results:
                for k in row:
                    if k not in cols:
                        cols.append(k)
            cells = [[_fmt(row.get(c, "")) for c in cols] for row in self.results]
            widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
            lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
            lines.append("  ".join("-" * w for w in widths))
            lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
        if self.goals:
            lines.append("")
            lines.append("goals:")
            for g in self.goals:
                if g.get("value") is None:
                    lines.append(f"  [NOT MEASURED] {g['name']} ({g['op']} {g['target']}): "
                                 f"{g.get('unmeasured', 'no value')}")
                    continue
                met = goal_met(g)
                lines.append(f"  [{'met' if met else 'NOT MET'}] {g['name']}: "
                             f"{_fmt(g['value'])} {g['op']} {g['target']}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)

    def emit(self, json_path: str | None = None) -> None:
        print(self.format(), flush=True)
        if json_path:
            write_json_atomic(json_path, self.to_dict())


def write_json_atomic(path: str | os.PathLike[str], data: object) -> None:
    """``data`` as JSON at ``path``, written atomically (see :func:`replace_atomically`)."""
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2)
    replace_atomically(path, write)


def _json_number(v: Any) -> Any:
    """A NaN or infinite float as None (JSON null): JSON has no such numbers."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4g}"
    return str(v)
