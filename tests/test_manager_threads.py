"""Eight threads against a model: private key ranges checked exactly, shared keys by the order
of their writes (each shared write and its model update happen under one test lock, so the
last writer is known)."""
from __future__ import annotations

import random
import threading
import uuid

import pytest

from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig

THREADS = 8
OPS = 300
PRIVATE = 12
SHARED = [("shared", i) for i in range(6)]


def _configs(tmp_path, redis_url):
    ns = "th" + uuid.uuid4().hex[:8]
    yield "heap-disk", CacheConfig(
        heap=HeapConfig(policy="lru", max_entries=16, max_bytes=None),
        levels=(DiskConfig(path=str(tmp_path / "a")),), namespace=ns, write_batch_size=8)
    yield "heap-redis-disk", CacheConfig(
        heap=HeapConfig(policy="wtinylfu", max_entries=12, max_bytes=4096),
        levels=(RedisConfig(url=redis_url, prefix=ns, max_bytes=600),
                DiskConfig(path=str(tmp_path / "b"))),
        namespace=ns, writer_threads=2, write_batch_size=5)


def _worker(m, tid, shared_lock, shared_model, failures, barrier):
    rng = random.Random(tid)
    model: dict = {}
    keys = [(tid, i) for i in range(PRIVATE)]
    barrier.wait()
    try:
        for step in range(OPS):
            op = rng.random()
            key = rng.choice(keys)
            if op < 0.30:
                value = [tid, step]
                m.put(key, value)
                model[key] = [tid, step]
            elif op < 0.55:
                got = m.get(key)
                assert got == model.get(key), (key, got, model.get(key))
            elif op < 0.62:
                m.delete(key)
                model.pop(key, None)
            elif op < 0.70:
                some = rng.sample(keys, 4)
                got = m.get_many(some)
                assert got == {k: model[k] for k in some if k in model}
            elif op < 0.76:
                value = m.get(key)
                if isinstance(value, list):
                    value.append(step)           # in place, never put back
                    model[key] = list(value)
            elif op < 0.90:
                skey = rng.choice(SHARED)
                with shared_lock:
                    if rng.random() < 0.5:
                        m.put(skey, {"by": tid, "step": step})
                        shared_model[skey] = {"by": tid, "step": step}
                    else:
                        assert m.get(skey) == shared_model.get(skey)
            elif op < 0.95:
                m.flush()
            elif op < 0.97:
                m.checkpoint()
            else:
                assert m.contains(key) == (key in model)
        for key in keys:
            assert m.get(key) == model.get(key), key
    except BaseException as exc:  # reported by the main thread
        failures.append((tid, exc))
    return model


@pytest.mark.parametrize("variant", ["heap-disk", "heap-redis-disk"])
def test_eight_threads_against_a_model(variant, tmp_path, redis_url):
    config = dict(_configs(tmp_path, redis_url))[variant]
    m = CacheManager(config)
    shared_lock = threading.Lock()
    shared_model: dict = {}
    failures: list = []
    models: dict = {}
    barrier = threading.Barrier(THREADS)

    def run(tid):
        models[tid] = _worker(m, tid, shared_lock, shared_model, failures, barrier)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures[:3]

    expected = dict(shared_model)
    for model in models.values():
        expected.update(model)
    assert m.get_many(list(expected)) == expected
    assert sorted(map(repr, m.keys())) == sorted(map(repr, expected))
    m.close()
    with CacheManager(config) as again:
        assert again.get_many(list(expected)) == expected
        assert sorted(map(repr, again.keys())) == sorted(map(repr, expected))


class _Gated:
    """A real level with a gate: calls to ``method`` pause until the test opens the gate."""

    def __init__(self, level, method, notify=None):
        self._level, self._method, self._notify = level, method, notify
        self.entered, self.gate, self.armed = threading.Event(), threading.Event(), False
        self.notified = threading.Event()

    def __getattr__(self, name):
        attr = getattr(self._level, name)
        if name == self._notify:
            def notifying(*args, **kw):
                try:
                    return attr(*args, **kw)
                finally:
                    self.notified.set()
            return notifying
        if name != self._method:
            return attr

        def gated(*args, **kw):
            if self.armed:
                self.armed = False
                self.entered.set()
                assert self.gate.wait(10)
            return attr(*args, **kw)
        return gated

    def __setattr__(self, name, value):
        if name.startswith("_") or name in ("entered", "gate", "armed", "notified"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._level, name, value)


def test_read_overlapping_an_entry_between_two_levels_is_retried(tmp_path):
    """A reader that reads level 0 after an entry left it and level 1 before it arrived there
    must not report a miss: it notices the overlapping write and reads again."""
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=1, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path / "l0"), max_bytes=40),
                              DiskConfig(path=str(tmp_path / "l1"))))
    m = CacheManager(cfg)
    m.put("k", "x" * 30)
    m.flush()                                  # "k" is on level 0 only
    m._data.clear()                            # forget the heap copy (clean) to force a read
    m._heap.policy.remove(m._encode_key("k"))
    l0 = _Gated(m._levels[0], "get_many")
    l1 = _Gated(m._levels[1], "put_many", notify="get_many")
    m._levels[0] = m._wb.levels[0] = l0
    m._levels[1] = m._wb.levels[1] = l1

    result = {}
    l0.armed = True
    reader = threading.Thread(target=lambda: result.setdefault("k", m.get("k")))
    reader.start()
    assert l0.entered.wait(10)                 # reader took its snapshot and waits at level 0
    l1.armed = True
    m._wb.buffer.add(0, m._encode_key("other"), b"\x01" + b"\xa1y" * 15)
    writer = threading.Thread(target=m._wb.drain_once)
    writer.start()                             # evicts "k" from level 0, waits before level 1
    assert l1.entered.wait(10)
    assert m._levels[0].get_many([m._encode_key("k")]) == [None]
    l0.gate.set()                              # reader: level 0 miss, level 1 miss ...
    assert l1.notified.wait(10)                # ... both read while "k" was in transit
    l1.gate.set()                              # the reader must notice and read again
    writer.join(10)
    reader.join(10)
    assert result["k"] == "x" * 30
    m.close()
