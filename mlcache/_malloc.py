"""Keep freed memory for reuse when values are large (glibc only).

Moving a value of a megabyte between the heap and a byte level allocates several buffers of
its size (the reply read from the socket, the decoded payload, the encoding of a victim). glibc
serves blocks above its mmap threshold with fresh ``mmap`` pages, and trims the top of its heap
as soon as more than twice that threshold is free there; it raises both only when a mapped block
is freed, to that block's size. With a cache's churn (new values loaded, old ones evicted) the
top of the heap is trimmed and grown again on nearly every transfer, and every page of every
new buffer is faulted in anew: measured here, ~300 page faults and ~0.7 ms per 1 MB miss, more
than the Redis read itself costs.

So when the codec sees a value of at least ``_LARGE`` bytes, this raises glibc's thresholds once
for that size: blocks up to 4x the size come from the heap (reused, not mapped per use) and up to
8x the size of free memory stays at the top of the heap instead of being returned and faulted
back. The memory kept is bounded by those 8 values' worth (capped at ``_TRIM_MAX``); small values
never change anything. ``MLCACHE_MALLOC_TUNING=0`` turns it off. Other C libraries: a no-op.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
from typing import Callable

__all__ = ["note_size", "tuned_for"]

_LARGE = 256 * 1024          # values below this are pymalloc's or glibc's small-block business
_MMAP_MAX = 32 << 20         # glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (64-bit)
_TRIM_MAX = 64 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_covered = 0                 # the largest value size the thresholds were raised for
_mallopt: Callable[[int, int], int] | None = None


def _load() -> Callable[[int, int], int] | None:
    if os.environ.get("MLCACHE_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_mallopt = _load()
if _mallopt is None:
    _covered = 1 << 62       # nothing to do: note_size returns at its first comparison


def note_size(n: int) -> None:
    """A value of ``n`` bytes is being encoded or decoded: make sure buffers of its size are
    reused. Cheap when nothing changes (one comparison); callers check ``n >= _LARGE``."""
    global _covered
    if n <= _covered:
        return
    with _lock:
        if n <= _covered or _mallopt is None:
            return
        size = max(n, _covered)
        _mallopt(_M_MMAP_THRESHOLD, min(_MMAP_MAX, 4 * size))
        _mallopt(_M_TRIM_THRESHOLD, min(_TRIM_MAX, 8 * size))
        _covered = size


def tuned_for() -> int:
    """The largest value size the allocator was tuned for (0: never; huge: tuning is off)."""
    return _covered
