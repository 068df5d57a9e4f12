"""Persisting a window at ``close()`` and continuing it when the directory is reopened.

The data file already holds every sealed block once ``close()`` has flushed the pool; this module
writes (and reads back) the rest: the block table, free slots, the recent block, every window's
cursor, sums, min/max deques and late tuples, the slide grid and a configuration fingerprint.
"""
from __future__ import annotations

import shutil
from typing import Any

import msgpack
import numpy as np

from mlcache.errors import ConfigError

from ._window_blocks import BlockRepository

__all__ = ["fingerprint", "dump_state", "load_state", "discard"]

_F8 = np.float64


def fingerprint(self: Any) -> list:
    """What must match for a directory's window to be continued."""
    return [self.kind, self.ranges, self.block_size, self._codec.kind, self.columns,
            [getattr(self, a, None) for a in ("_vi", "_wi", "_gi")], self._grouped,
            self.minmax, self.slide]


def dump_state(self: Any) -> dict[str, Any]:
    """Everything ``close()`` persists next to the data file, msgpack-ready."""
    cur = self._cur
    if self.columns is not None:
        cur_data: Any = np.ascontiguousarray(cur.data[: cur.n]).tobytes()
        cur_ts: Any = cur.ts[: cur.n].tobytes()
    else:
        cur_data, cur_ts = cur.data, list(cur.ts)
    return {
        "version": 1, "fingerprint": fingerprint(self), "repo": self._repo.state(),
        "cur": [cur.seq, cur.start, cur.n, cur_ts, cur_data],
        "wm": self._wm, "next_slide": self._next_slide, "oldest": self._oldest,
        "late": [self._cold.late_accepted, self._cold.late_dropped, self._cold.late_seq],
        "groups": self._groups.keys if self._groups is not None else None,
        "windows": [w.state() for w in self._wins],
    }


def load_state(self: Any, path: str) -> None:
    """Continue the window persisted in ``path`` (refused if its configuration differs)."""
    with open(path, "rb") as fh:
        meta = msgpack.unpackb(fh.read(), raw=False, use_list=False, strict_map_key=False)
    if list(map(_plain, meta["fingerprint"])) != list(map(_plain, fingerprint(self))):
        raise ConfigError("directory", f"{self.directory} holds a window with another "
                          f"configuration: {meta['fingerprint']!r}")
    self._repo.restore(meta["repo"])
    seq, start, n, cur_ts, cur_data = meta["cur"]
    cur = self._codec.new_block(seq, start)
    if self.columns is not None:
        cur.ts[:n] = np.frombuffer(cur_ts, _F8, n)
        cur.data[:n] = np.frombuffer(cur_data, _F8).reshape(n, len(self.columns))
    else:
        cur.ts, cur.data = [float(t) for t in cur_ts], list(cur_data)
        cur.nbytes += sum(self._codec.record_size(r) for r in cur.data)
    cur.n = cur.applied = n
    self._cur = cur
    self._wm, self._next_slide, self._oldest = meta["wm"], meta["next_slide"], meta["oldest"]
    cold = self._cold
    cold.late_accepted, cold.late_dropped, cold.late_seq = meta["late"]
    if self._groups is not None:
        for k in meta["groups"]:
            self._groups.code(k)
    decode = (lambda r: tuple(r)) if self.columns is not None else (lambda r: r)
    for w, st in zip(self._wins, meta["windows"]):
        w.restore(st, decode)


def discard(repo: BlockRepository, temp_dir: str | None) -> None:
    repo.close()
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _plain(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
