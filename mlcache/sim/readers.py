"""Trace readers: ARC, LIRS, one key per line, and CSV ``key[,ts][,weight]``; gzip-aware.

A trace is read whole into a :class:`Trace` (lists of keys and, when the format has them,
timestamps and weights): the player and Bélády both need random access, and the published
traces are at most a few million requests. Files are recognised as gzip by their magic bytes,
not their name.

Formats (``FORMAT:PATH`` on the command line):

* ``arc`` — ARC traces (Megiddo & Modha): ``start count ignored ignored`` per line, meaning the
  ``count`` requests ``start``, ``start+1``, ... ``start+count-1``. A count above
  ``ARC_MAX_COUNT`` (2**20) is a bad line: the count is a request's length in 512-byte blocks, a
  few thousand at most in the published traces, and a corrupt field would otherwise expand into
  an allocation that exhausts memory.
* ``lirs`` — LIRS traces (Jiang & Zhang): one integer key per line; lines of ``*`` are markers
  and are ignored, as are blank lines.
* ``keys`` — one key per line, taken verbatim as a string (a key of ASCII digits becomes an int,
  so a ``keys`` file and a ``lirs`` file of integers give the same trace).
* ``csv`` — ``key[,ts][,weight]`` per line; an optional header line whose second field is not a
  number is skipped; ``ts`` is a finite float (event time), ``weight`` a positive integer.

A malformed line raises :class:`TraceFormatError` naming the file and the line number, unless
``skip_bad_lines=True``, in which case it is counted in ``Trace.skipped``.
"""
from __future__ import annotations

import gzip
import io
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import IO, Callable, Hashable, Iterator

from mlcache.errors import CacheError

__all__ = ["ARC_MAX_COUNT", "FORMATS", "Trace", "TraceFormatError", "read_trace"]

# Requests one ARC line may expand into (see the module docstring): 2**20 requests cost about
# 40 MB of list and ints, a count of 10**11 asked for terabytes.
ARC_MAX_COUNT = 1 << 20


class TraceFormatError(CacheError, ValueError):
    """A trace line could not be parsed; ``path`` and ``line`` say where."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


@dataclass
class Trace:
    """A sequence of requests: keys, and optional event times and weights of the same length."""

    name: str
    keys: list[Hashable]
    ts: list[float] | None = None
    weights: list[int] | None = None
    skipped: int = 0
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys)

    def unique_keys(self) -> int:
        return len(set(self.keys))


# utf-8-sig: a byte-order mark is not part of the first key; surrogateescape: bytes that are not
# UTF-8 keep keys apart ("replace" made every such key the same U+FFFD string).
_ENCODING, _ERRORS = "utf-8-sig", "surrogateescape"


def _open_text(path: str) -> IO[str]:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding=_ENCODING, errors=_ERRORS)
    return open(path, encoding=_ENCODING, errors=_ERRORS)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _plain(text: str) -> bool:
    """No digit separators and nothing but ASCII: int() and float() read "1_000" as 1000 and
    "٣" as 3, which merged distinct tokens of a trace into one key (or one time). (Inlined in
    the ARC and LIRS loops.)"""
    return "_" not in text and text.isascii()


def _int_key(text: str) -> Hashable:
    if text.isdigit() and text.isascii():
        try:
            return int(text)
        except ValueError:
            pass    # digits int() does not read, e.g. "²": a string key like any other
    return text


class _Lines:
    """Iterates ``(lineno, stripped_line)`` and turns parse errors into errors or skips."""

    def __init__(self, path: str, skip_bad_lines: bool) -> None:
        self.path = path
        self.skip = skip_bad_lines
        self.skipped = 0

    def bad(self, lineno: int, line: str, why: str) -> None:
        if not self.skip:
            raise TraceFormatError(self.path, lineno, f"{why}: {line[:80]!r}")
        self.skipped += 1


# A truncated or corrupt gzip stream (or an I/O error) surfaces while the lines are iterated.
_UNREADABLE = (EOFError, OSError, zlib.error)


def _unreadable(path: str, exc: BaseException) -> TraceFormatError:
    """The error for a file that cannot be read to its end, at the first line it lacks."""
    good = 0
    try:
        with _open_text(path) as fh:
            for good, _ in enumerate(fh, 1):
                pass
    except _UNREADABLE:
        pass
    return TraceFormatError(path, good + 1, f"cannot read the file past line {good} "
                                            f"({type(exc).__name__}: {exc})")


def _read_arc(path: str, lines: _Lines, out: list) -> None:
    append = out.append
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                start, count = int(parts[0]), int(parts[1])
                if count < 0 or len(parts) > 4 or "_" in line or not line.isascii():
                    raise ValueError
            except (ValueError, IndexError):
                lines.bad(lineno, line.strip(), "expected 'start count [x x]' integers")
                continue
            if count > ARC_MAX_COUNT:
                lines.bad(lineno, line.strip(), f"count {count} is more than {ARC_MAX_COUNT} "
                                                f"requests on one line")
                continue
            if count == 1:
                append(start)
            else:
                out.extend(range(start, start + count))


def _read_lirs(path: str, lines: _Lines, out: list) -> None:
    append = out.append
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            text = line.strip()
            if not text or text == "*":
                continue
            try:
                if "_" in text or not text.isascii():    # (see _plain)
                    raise ValueError
                append(int(text))
            except ValueError:
                lines.bad(lineno, text, "expected one integer key per line")


def _read_keys(path: str, lines: _Lines, out: list) -> None:
    append = out.append
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            if "\x00" in text:
                lines.bad(lineno, text, "NUL byte in key")
                continue
            append(_int_key(text.strip()))


def _read_csv(path: str, lines: _Lines, keys: list, ts: list, weights: list) -> None:
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            text = line.strip()
            if not text:
                continue
            parts = [p.strip() for p in text.split(",")]
            if len(parts) > 3 or not parts[0]:
                lines.bad(lineno, text, "expected key[,ts][,weight]")
                continue
            try:
                t = float(parts[1]) if len(parts) > 1 and parts[1] else None
                w = int(parts[2]) if len(parts) > 2 and parts[2] else None
                if (w is not None and w <= 0) or (t is not None and not math.isfinite(t)) \
                        or not _plain(",".join(parts[1:])):
                    raise ValueError    # (NaN and inf times were taken as event times)
            except ValueError:
                if lineno == 1 and not keys and len(parts) > 1 and not _is_number(parts[1]):
                    continue  # a header line: its second field is a name, not a time
                lines.bad(lineno, text, "ts must be a finite number and weight a positive integer")
                continue
            keys.append(_int_key(parts[0]))
            ts.append(float(len(keys)) if t is None else t)
            weights.append(1 if w is None else w)


FORMATS: dict[str, Callable] = {"arc": _read_arc, "lirs": _read_lirs, "keys": _read_keys,
                                "csv": _read_csv}


def read_trace(spec: str, *, skip_bad_lines: bool = False, fmt: str | None = None) -> Trace:
    """Read ``FORMAT:PATH`` (or ``PATH`` with ``fmt=``) into a :class:`Trace`."""
    from mlcache.errors import ConfigError

    if fmt is None:
        fmt, sep, path = spec.partition(":")
        if not sep:
            raise ConfigError("trace", f"expected FORMAT:PATH with FORMAT in {sorted(FORMATS)}, "
                              f"got {spec!r}")
    else:
        path = spec
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise ConfigError("trace", f"unknown trace format {fmt!r}; known: {sorted(FORMATS)}")
    if not os.path.isfile(path):
        raise ConfigError("trace", f"no such trace file: {path}")
    lines = _Lines(path, skip_bad_lines)
    keys: list = []
    trace = Trace(name=os.path.basename(path).split(".")[0], keys=keys)
    try:
        if fmt == "csv":
            ts: list = []
            weights: list = []
            _read_csv(path, lines, keys, ts, weights)
            trace.ts = ts
            trace.weights = weights if any(w != 1 for w in weights) else None
        else:
            FORMATS[fmt](path, lines, keys)
    except _UNREADABLE as exc:
        # (a truncated .gz died with a bare EOFError naming neither the file nor the line)
        raise _unreadable(path, exc) from exc
    trace.skipped = lines.skipped
    trace.meta["format"] = fmt
    trace.meta["path"] = path
    return trace
