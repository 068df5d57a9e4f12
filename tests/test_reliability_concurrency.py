"""Concurrency stress checked against a model: per-key last-writer order.

Threads share one manager with a small heap (constant evictions), mixed put/get/delete/batch
operations, hints (prefetches), flushes and checkpoints. Each thread owns some keys (read-your-
writes must be exact) and all threads write a set of shared keys under a per-key lock that
records the order of writers (so the model knows the last writer), while reads of shared keys
go unlocked and must be monotonic: never older than a version this reader already saw, never
newer than the last one written. At the end a fresh manager must read exactly the model.

A second test runs several processes on one host-shared disk level, each writing its own keys
and reading the keys the others checkpointed.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest

from mlcache import CacheConfig, CacheManager
from mlcache.config import DiskConfig, HeapConfig, PrefetchConfig, RedisConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = 64


def _run(cfg: CacheConfig, threads: int, ops: int, keys_per_thread: int) -> dict:
    m = CacheManager(cfg)
    own: list[dict] = [{} for _ in range(threads)]          # key -> version or None (deleted)
    shared_version = [0] * SHARED
    shared_locks = [threading.Lock() for _ in range(SHARED)]
    failures: list[str] = []
    counts = {"put": 0, "get": 0, "delete": 0, "batch": 0, "hint": 0, "flush": 0,
              "checkpoint": 0}

    def check_own(tid: int, key, got) -> None:
        v = own[tid].get(key)
        want = None if v is None else ["own", key, v]
        if got != want:
            failures.append(f"thread {tid} key {key}: got {got}, model {want}")

    def worker(tid: int) -> None:
        rng = random.Random(tid * 7919)
        model = own[tid]
        seen = [0] * SHARED
        local = {c: 0 for c in counts}
        try:
            for step in range(ops):
                r = rng.random()
                if r < 0.30:
                    key = (tid, rng.randrange(keys_per_thread))
                    v = (model.get(key) or 0) + 1
                    m.put(key, ["own", key, v])
                    model[key] = v
                    local["put"] += 1
                elif r < 0.55:
                    key = (tid, rng.randrange(keys_per_thread))
                    check_own(tid, key, m.get(key))
                    local["get"] += 1
                elif r < 0.60:
                    key = (tid, rng.randrange(keys_per_thread))
                    m.delete(key)
                    model[key] = None
                    local["delete"] += 1
                elif r < 0.68:
                    ks = [(tid, rng.randrange(keys_per_thread)) for _ in range(8)]
                    if rng.random() < 0.5:
                        got = m.get_many(ks)
                        for k in ks:
                            check_own(tid, k, got.get(k))
                    else:
                        items = {}
                        for k in ks:
                            items[k] = ["own", k, (model.get(k) or 0) + 1]
                            model[k] = items[k][2]
                        m.put_many(items)
                    local["batch"] += 1
                elif r < 0.78:
                    i = rng.randrange(SHARED)
                    with shared_locks[i]:              # the model's order of writers
                        shared_version[i] += 1
                        m.put(("shared", i), ["shared", i, shared_version[i], tid])
                    local["put"] += 1
                elif r < 0.92:
                    i = rng.randrange(SHARED)
                    got = m.get(("shared", i))
                    latest = shared_version[i]
                    v = got[2] if got is not None else 0
                    if v < seen[i] or v > latest or (got is not None and got[:2] != ["shared", i]):
                        failures.append(f"shared {i}: read {got} after {seen[i]}, latest {latest}")
                    seen[i] = max(seen[i], v)
                    local["get"] += 1
                elif r < 0.99:
                    key = (tid, rng.randrange(keys_per_thread)) if rng.random() < 0.5 else \
                        ("shared", rng.randrange(SHARED))
                    m.hint(key, float(step))              # prefetch into the heap
                    local["hint"] += 1
                elif r < 0.998:
                    m.flush()
                    local["flush"] += 1
                else:
                    m.checkpoint()
                    local["checkpoint"] += 1
                if len(failures) > 20:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(f"thread {tid}: {type(exc).__name__}: {exc}")
        finally:
            with lock:
                for c, n in local.items():
                    counts[c] += n

    lock = threading.Lock()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stats = m.stats()
    m.close()
    assert not failures, failures[:10]
    # the store of record holds exactly the model (last writer of every key)
    with CacheManager(cfg) as again:
        wrong = []
        for tid, model in enumerate(own):
            got = again.get_many(list(model))
            for k, v in model.items():
                want = None if v is None else ["own", k, v]
                if got.get(k) != want:
                    wrong.append((k, got.get(k), want))
        for i in range(SHARED):
            got = again.get(("shared", i))
            if (got[2] if got else 0) != shared_version[i]:
                wrong.append((("shared", i), got, shared_version[i]))
    assert not wrong, wrong[:10]
    return {"counts": counts, "evictions": stats["levels"]["heap"]["evictions"],
            "prefetch": {k: stats["prefetch"].get(k) for k in ("hints", "keys_loaded", "useful")
                         if k in stats["prefetch"]}}


def _cfg(tmp_path, **kw) -> CacheConfig:
    levels = kw.pop("levels", None) or (DiskConfig(path=str(tmp_path / "disk")),)
    return CacheConfig(heap=HeapConfig(max_bytes=48 * 1024), levels=levels, namespace="conc",
                       prefetch=PrefetchConfig(fetch_threads=2, batch_size=16),
                       writer_threads=2, write_batch_size=64, **kw)


def test_eight_threads_mixed_ops_match_the_model(tmp_path):
    out = _run(_cfg(tmp_path), threads=8, ops=5_000, keys_per_thread=300)
    assert sum(out["counts"].values()) == 8 * 5_000
    assert sum(out["evictions"].values()) > 1000, out      # the heap really overflowed
    print(out)


@pytest.mark.stress
def test_eight_threads_100k_ops_each_redis_and_disk(tmp_path, redis_url):
    levels = (RedisConfig(url=redis_url, prefix="conc", max_bytes=2 << 20),
              DiskConfig(path=str(tmp_path / "disk")))
    out = _run(_cfg(tmp_path, levels=levels), threads=8, ops=100_000, keys_per_thread=3000)
    assert sum(out["counts"].values()) == 8 * 100_000
    print(out)


# -- several processes on one host-shared disk level -----------------------------------------

_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from mlcache import CacheConfig, CacheManager, DiskConfig, HeapConfig
    path, me, n_procs, n_keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=100, max_bytes=None),
                      levels=(DiskConfig(path=os.path.join(path, "disk")),), namespace="mp")
    m = CacheManager(cfg)
    wrong = []
    for rnd in range(2):
        for i in range(n_keys):
            m.put((me, i), [me, i, rnd])
        m.checkpoint()
        open(os.path.join(path, f"done-{rnd}-{me}"), "w").close()
        while not all(os.path.exists(os.path.join(path, f"done-{rnd}-{p}"))
                      for p in range(n_procs)):
            time.sleep(0.02)
        m.invalidate_local()       # others wrote since: drop clean heap copies
        for p in range(n_procs):
            got = m.get_many([(p, i) for i in range(n_keys)])
            wrong += [(p, i, got.get((p, i))) for i in range(n_keys)
                      if got.get((p, i)) != [p, i, rnd]]
        open(os.path.join(path, f"read-{rnd}-{me}"), "w").close()
        while not all(os.path.exists(os.path.join(path, f"read-{rnd}-{p}"))
                      for p in range(n_procs)):
            time.sleep(0.02)
    listed = sum(1 for _ in m.keys())
    m.close()
    print(json.dumps({"wrong": wrong[:5], "n_wrong": len(wrong), "listed": listed}))
""")


def test_processes_share_one_disk_level(tmp_path):
    n_procs, n_keys = 4, 400
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(p), str(n_procs),
                               str(n_keys)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for p in range(n_procs)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["n_wrong"] == 0, r
        assert r["listed"] == n_procs * n_keys
