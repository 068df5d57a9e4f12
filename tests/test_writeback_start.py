"""Writer threads start once per process, however many threads make the first call."""
from __future__ import annotations

import os
import threading
import types

from mlcache import CacheConfig, CacheManager
from mlcache import writeback
from mlcache.config import DiskConfig, HeapConfig


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mlcache-writer-")]


def test_concurrent_first_calls_start_one_set_of_writers(tmp_path, monkeypatch):
    config = CacheConfig(heap=HeapConfig(max_entries=8),
                         levels=(DiskConfig(path=str(tmp_path / "d")),))
    before = len(_writers())
    with CacheManager(config) as cache:
        wb = cache._wb
        wb._pid = 0   # as after a fork: the next call starts the writers
        # Both callers read the pid before either records it: the interleaving that used to
        # start two sets of writer threads (the first set never joined by stop()).
        gate = threading.Barrier(2, timeout=10)
        calls = {"n": 0}

        def getpid() -> int:
            calls["n"] += 1
            if calls["n"] <= 2:
                gate.wait()
            return os.getpid()

        monkeypatch.setattr(writeback, "os", types.SimpleNamespace(getpid=getpid))
        callers = [threading.Thread(target=wb.ensure_writers) for _ in range(2)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(10)
        monkeypatch.undo()
        started = len(_writers()) - before
        assert started == wb.writer_threads, (started, wb.writer_threads)
        cache.put("k", 1)
        cache.checkpoint()
        assert cache.get("k") == 1
