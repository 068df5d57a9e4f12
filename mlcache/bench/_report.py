"""The common shape of every benchmark's output (DESIGN §9).

Each benchmark builds a :class:`BenchReport`, adds result rows and goals, prints a table and,
with ``--json PATH``, writes ``{"benchmark", "machine", "date", "quick", "results", "goals"}``.
A goal stores its measured value, comparison and target; the reader recomputes met/not met.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

from .._files import replace_atomically

__all__ = ["BenchReport", "machine_description", "Timer"]

_OPS = {
    "<=": lambda v, t: v <= t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    ">": lambda v, t: v > t,
    "==": lambda v, t: v == t,
}


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
        self.goals.append({"name": name, "value": round(value, 6), "op": op, "target": target})
        return _OPS[op](value, target)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "machine": machine_description(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": self.quick,
            "results": self.results,
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
                met = _OPS[g["op"]](g["value"], g["target"])
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
