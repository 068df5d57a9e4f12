"""Shared pieces of the structure tests: tiny-heap configs and a model-checking base machine.

The heap holds 4 entries (LRU), so nearly every operation evicts and reloads; flush,
checkpoint and close+reopen are rules of every machine.
"""
from __future__ import annotations

import shutil
import tempfile
import uuid
from typing import Any, Callable

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, rule

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig

LEVELS = ["disk", "redis-disk"]
MACHINE_SETTINGS = settings(max_examples=20, stateful_step_count=30, deadline=None)


def tiny_config(kind: str, path: str, redis_url: str | None) -> CacheConfig:
    heap = HeapConfig(max_entries=4, max_bytes=None, policy="lru")
    if kind == "disk":
        levels: tuple = (DiskConfig(path=path),)
    else:
        assert redis_url
        levels = (RedisConfig(url=redis_url), DiskConfig(path=path))
    return CacheConfig(heap=heap, levels=levels, namespace="t" + uuid.uuid4().hex[:10])


@pytest.fixture(params=LEVELS)
def manager(request):
    """A manager over a 4-entry heap on each of LEVELS (a test module imports this fixture);
    ``test_config`` is the config it was made with, to reopen it."""
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis-disk" else None
    path = tempfile.mkdtemp(prefix="mlcache-structures-")
    config = tiny_config(request.param, path, redis_url)
    m = CacheManager(config)
    m.test_config = config  # type: ignore[attr-defined]
    yield m
    m.close()
    shutil.rmtree(path, ignore_errors=True)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """The result of ``fn()`` or its exception's type and message, for comparing with a model."""
    try:
        return ("ok", fn())
    except Exception as exc:  # compared, never swallowed: both sides must agree
        return (type(exc).__name__, str(exc))


class ManagerMachine(RuleBasedStateMachine):
    """Owns a manager over a fresh directory; subclasses implement ``open_structure``."""

    level_kind = "disk"
    redis_url: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="mlcache-struct-")
        self.config = self.make_config()
        self.m = CacheManager(self.config)
        self.s = self.open_structure(self.m)

    def make_config(self) -> CacheConfig:
        """The manager's config, over ``self.dir`` (a subclass may choose other layouts)."""
        return tiny_config(self.level_kind, self.dir, self.redis_url)

    def open_structure(self, m: CacheManager) -> Any:
        raise AssertionError("subclasses open their structure")

    @rule()
    def flush(self) -> None:
        self.m.flush()

    @rule()
    def checkpoint(self) -> None:
        self.m.checkpoint()

    @rule()
    def close_and_reopen(self) -> None:
        self.m.close()
        self.m = CacheManager(self.config)
        self.s = self.open_structure(self.m)

    def teardown(self) -> None:
        self.m.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def machine_for(cls: type, level_kind: str, redis_url: str | None) -> type:
    return type(cls.__name__ + "_" + level_kind.replace("-", "_"), (cls,),
                {"level_kind": level_kind, "redis_url": redis_url})
