"""A real level behind a configurable delay: emulates remote storage on a local one.

``DelayedLevelConfig(inner=DiskConfig(...), delay=Delay(0.002))`` builds the inner level and
wraps it so every ``get_many`` first sleeps ``delay.seconds`` (one round trip per batch, as a
remote store costs) and every ``put_many`` ``delay.put_seconds``. ``Delay`` is a mutable holder,
so a benchmark or a test can slow the backend down or speed it up while a manager runs. The
wrapper also records which keys are being read right now, so a caller can check that no key is
ever read twice concurrently, and can be told to fail reads (``Delay.fail``) to exercise error
paths against the real level.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Sequence

from ..config import LevelConfig
from ..errors import LevelUnavailableError

__all__ = ["Delay", "DelayedLevelConfig", "DelayedLevel"]


class Delay:
    """Mutable knobs shared by a config and the level it built."""

    def __init__(self, seconds: float = 0.0, put_seconds: float = 0.0) -> None:
        self.seconds = seconds            # before every get_many
        self.put_seconds = put_seconds    # before every put_many (slow write-back)
        # fail(keys) -> True makes that get_many raise LevelUnavailableError
        self.fail: Callable[[Sequence[bytes]], bool] | None = None
        self.reads = 0                 # get_many calls
        self.keys_read = 0
        self.concurrent_duplicates = 0  # a key requested while another read of it was running
        self._active: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Delay({self.seconds!r})"


@dataclass(frozen=True)
class DelayedLevelConfig(LevelConfig):
    kind: ClassVar[str] = "delayed"
    inner: LevelConfig | None = None
    delay: Delay = field(default_factory=Delay, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.inner, LevelConfig):
            from ..errors import ConfigError

            raise ConfigError("delayed.inner", "must be a level config")
        object.__setattr__(self, "max_bytes", self.inner.max_bytes)
        object.__setattr__(self, "lossy", self.inner.lossy)
        super().__post_init__()

    def build(self) -> "DelayedLevel":
        assert self.inner is not None
        return DelayedLevel(self.inner.build(), self.delay)


class DelayedLevel:
    """Forwards everything to ``inner``; ``get_many`` sleeps first and tracks active keys."""

    def __init__(self, inner: Any, delay: Delay) -> None:
        self.inner = inner
        self.delay = delay
        self.name = inner.name
        self.shared = inner.shared

    # its delay is in get_many: a split read (straight to the socket) would skip it
    splits_reads = False

    @property
    def lossy(self) -> bool:
        return self.inner.lossy

    @property
    def may_evict(self) -> bool:
        return self.inner.may_evict

    @may_evict.setter
    def may_evict(self, value: bool) -> None:
        self.inner.may_evict = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        d = self.delay
        with d._lock:
            d.reads += 1
            d.keys_read += len(keys)
            for k in keys:
                n = d._active.get(k, 0)
                if n:
                    d.concurrent_duplicates += 1
                d._active[k] = n + 1
        try:
            if d.seconds > 0:
                time.sleep(d.seconds)
            if d.fail is not None and d.fail(keys):
                raise LevelUnavailableError(f"{self.name}: injected read failure", level=self.name)
            return self.inner.get_many(keys)
        finally:
            with d._lock:
                for k in keys:
                    n = d._active.pop(k, 1) - 1
                    if n > 0:
                        d._active[k] = n

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> Any:
        if self.delay.put_seconds > 0:
            time.sleep(self.delay.put_seconds)
        return self.inner.put_many(items)

    def delete_many(self, keys: Sequence[bytes]) -> None:
        self.inner.delete_many(keys)

    def scan(self, prefix: bytes) -> Iterator[bytes]:
        return self.inner.scan(prefix)

    def used_bytes(self) -> int:
        return int(self.inner.used_bytes())

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()
