"""Fault injection with real servers and real processes: nothing acknowledged is ever lost.

* Redis SIGKILLed mid-workload and restarted from its append-only file;
* the application SIGKILLed right after ``checkpoint()``;
* the store of record's file system full (a small tmpfs when we may mount one, else a file
  size limit in a child process), and a store of record full by ``max_bytes``;
* corrupt or truncated bytes written straight into Redis and the disk level.

Every test counts what it lost; the count must be 0. The stress variants run longer with more
kills (``make stress``).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis

from mlcache import CacheConfig, CacheManager
from mlcache._redis_server import RedisServer
from mlcache.config import ArenaConfig, DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import CacheError, CapacityError, IntegrityError, LevelUnavailableError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- Redis SIGKILLed mid-workload -------------------------------------------------------------

def _redis_kill_workload(tmp_path, *, threads: int, kills: int, outage: float,
                         run_between: float) -> dict:
    server = RedisServer(appendonly=True, directory=str(tmp_path / "redis")).start()
    cfg = CacheConfig(
        heap=HeapConfig(policy="lru", max_entries=150, max_bytes=None),
        levels=(RedisConfig(url=server.url, prefix="kill", retries=1, socket_timeout=2),),
        namespace="kill", retry_attempts=2, retry_backoff=0.01, eviction_buffer_max=300,
        write_batch_size=64)
    m = CacheManager(cfg)
    stop = threading.Event()
    models: list[dict[int, int]] = [{} for _ in range(threads)]
    acked: list[dict[int, int]] = [{} for _ in range(threads)]
    seen: dict[str, int] = {}
    unexpected: list[BaseException] = []
    wrong_reads: list[tuple] = []
    checkpoints = [0] * threads

    def note(exc: BaseException) -> None:
        if isinstance(exc, LevelUnavailableError) and exc.retryable and exc.level == "redis":
            seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1
        else:
            unexpected.append(exc)

    def retrying(op, *args):
        delay = 0.005
        while True:
            try:
                return op(*args)
            except CacheError as exc:
                note(exc)
                if unexpected:
                    raise
                time.sleep(delay)              # back off and retry, like a real writer
                delay = min(0.2, delay * 2)

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        model = models[tid]
        n = 0
        try:
            while not stop.is_set():
                key = tid * 100_000 + rng.randrange(600)
                op = rng.random()
                if op < 0.6:
                    version = model.get(key, 0) + 1
                    retrying(m.put, key, [tid, key, version])
                    model[key] = version
                elif op < 0.95:
                    got = retrying(m.get, key)
                    want = [tid, key, model[key]] if key in model else None
                    if got != want:
                        wrong_reads.append((key, got, want))
                else:
                    snapshot = dict(model)
                    retrying(m.checkpoint)
                    acked[tid] = snapshot
                    checkpoints[tid] += 1
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            unexpected.append(exc)

    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for t in workers:
        t.start()
    try:
        time.sleep(run_between)
        for _ in range(kills):
            server.kill()                       # SIGKILL: no shutdown, no final fsync
            time.sleep(outage)
            # everything acknowledged by a checkpoint must be in the AOF the restart replays
            snapshot = [dict(a) for a in acked]
            server.start()
            client = redis.Redis.from_url(server.url)
            lost = _lost(client, m, snapshot)
            client.close()
            assert not lost, f"acknowledged writes lost by the kill: {lost[:5]}"
            time.sleep(run_between)
    finally:
        stop.set()
        for t in workers:
            t.join(60)
    assert not unexpected, unexpected[:3]
    assert not wrong_reads, wrong_reads[:3]
    stats = m.stats()["writeback"]
    m.checkpoint()
    m.close()
    # A fresh process-state manager sees the last write of every key: dirty entries were
    # never dropped, acknowledged or not.
    with CacheManager(cfg) as again:
        lost_dirty = [(k, v) for model in models for k, v in model.items()
                      if again.get(k) != [k // 100_000, k, v]]
    server.cleanup()
    return {"errors_seen": seen, "lost_dirty": lost_dirty, "checkpoints": sum(checkpoints),
            "writes": sum(sum(model.values()) for model in models), "stats": stats}


def _lost(client, m: CacheManager, acked: list[dict[int, int]]) -> list:
    lost = []
    prefix = m._levels[0].prefix
    for model in acked:
        keys = list(model)
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            raws = client.mget([prefix + m._encode_key(k) for k in chunk])
            for k, raw in zip(chunk, raws):
                value = m._codec.decode(raw) if raw is not None else None
                if value is None or value[2] < model[k]:
                    lost.append((k, model[k], value))
    return lost


def test_redis_sigkill_mid_workload_loses_no_acknowledged_write(tmp_path):
    out = _redis_kill_workload(tmp_path, threads=4, kills=2, outage=0.6, run_between=1.5)
    print("\nredis SIGKILL x2:", {k: out[k] for k in ("errors_seen", "checkpoints", "writes")},
          {k: out["stats"].get(k) for k in ("writer_errors", "requeued", "retries")},
          "lost:", len(out["lost_dirty"]))
    assert out["lost_dirty"] == []
    assert out["checkpoints"] > 0
    assert out["errors_seen"].get("LevelUnavailableError", 0) > 0, out


@pytest.mark.stress
def test_redis_sigkill_stress(tmp_path):
    out = _redis_kill_workload(tmp_path, threads=8, kills=10, outage=1.0, run_between=3.0)
    print("\nredis SIGKILL x10:", {k: out[k] for k in ("errors_seen", "checkpoints", "writes")},
          {k: out["stats"].get(k) for k in ("writer_errors", "requeued", "retries")},
          "lost:", len(out["lost_dirty"]))
    assert out["lost_dirty"] == [] and out["checkpoints"] > 0


# -- the application SIGKILLed right after checkpoint() -------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys, time
    from mlcache import CacheConfig, CacheManager
    cfg = CacheConfig.from_dict(json.loads(sys.argv[1]))
    n = int(sys.argv[2])
    m = CacheManager(cfg)
    for i in range(n):
        m.put(i, {"i": i, "pad": "x" * (i % 97)})
    m.delete_many(range(0, n, 7))
    for i in range(0, n, 5):
        m.put(i, {"i": i, "v": 2})
    # the structures keep their contents in entries too
    d, lst, st = m.dict("profiles"), m.list("events"), m.set("tags")
    d.update({f"u{i}": [i, i * 2] for i in range(300)})
    lst.extend(range(2500))
    st.update(range(0, 900, 3))
    del d["u7"]
    m.checkpoint()
    print("CHECKPOINTED", flush=True)
    d["late"] = 1
    lst.append(-1)
    # writes after the checkpoint: they may or may not survive, but never as a wrong value
    i = n
    while True:
        m.put(i, {"i": i, "late": True})
        i += 1
        if i % 500 == 0:
            m.flush()
""")


def _expected(i: int):
    if i % 5 == 0:
        return {"i": i, "v": 2}
    if i % 7 == 0:
        return None
    return {"i": i, "pad": "x" * (i % 97)}


def _configs(tmp_path, url: str) -> dict[str, CacheConfig]:
    heap = HeapConfig(policy="lru", max_entries=300, max_bytes=None)
    disk = DiskConfig(path=str(tmp_path / "disk"))
    return {
        "disk": CacheConfig(heap=heap, levels=(disk,), namespace="crash"),
        "redis": CacheConfig(heap=heap, levels=(RedisConfig(url=url, prefix="crash"),),
                             namespace="crash"),
        "arena-redis-disk": CacheConfig(heap=heap, namespace="crash", levels=(
            ArenaConfig(max_bytes=64 * 1024, buffer_size=16 * 1024, block_size=4096),
            RedisConfig(url=url, prefix="crash2", max_bytes=40_000), disk)),
    }


@pytest.mark.parametrize("name", ["disk", "redis", "arena-redis-disk"])
def test_process_sigkilled_after_checkpoint_restores_every_checkpointed_entry(
        tmp_path, redis_url, name):
    cfg = _configs(tmp_path, redis_url)[name]
    n = 3000
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg.to_dict()), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "CHECKPOINTED", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)      # right after the acknowledgement
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    with CacheManager(cfg) as m:
        got = m.get_many(range(n))
        lost = [i for i in range(n) if got.get(i) != _expected(i)]
        assert lost == [], f"{len(lost)} checkpointed entries lost or wrong, e.g. {lost[:5]}"
        late = m.get_many(range(n, n + 5000))
        assert all(v == {"i": k, "late": True} for k, v in late.items())
        d = m.dict("profiles")
        want = {f"u{i}": [i, i * 2] for i in range(300) if i != 7}
        assert {k: d[k] for k in want} == want and "u7" not in d
        assert list(m.list("events"))[:2500] == list(range(2500))
        assert set(m.set("tags")) == set(range(0, 900, 3))


# -- the store of record runs out of space ---------------------------------------------------

_FULL_CHILD = textwrap.dedent("""
    import json, os, sys
    from mlcache import CacheConfig, CacheManager, CapacityError, DiskConfig, HeapConfig
    path, mode = sys.argv[1], sys.argv[2]
    bound = 1_000_000 if mode == "max_bytes" else None
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=200, max_bytes=None),
                      levels=(DiskConfig(path=path, timeout=5, max_bytes=bound),),
                      retry_attempts=1, eviction_buffer_max=400)
    m = CacheManager(cfg)
    value = lambda i: {"i": i, "blob": os.urandom(600).hex()}
    model, errors, i = {}, [], 0
    while len(errors) < 3 and i < 20000:
        v = value(i)
        try:
            model[i] = v          # a put that raises has still taken the value (heap)
            m.put(i, v)
            if i % 100 == 99:
                m.flush()
        except CapacityError as exc:
            errors.append(repr(exc))
        except Exception as exc:
            print(json.dumps({"unexpected": repr(exc)}), flush=True)
            raise
        i += 1
    # full: every value is still readable
    wrong_while_full = [k for k, v in model.items() if m.get(k) != v]
    print(json.dumps({"phase": "full", "puts": i, "errors": errors,
                      "wrong_while_full": wrong_while_full[:5]}), flush=True)
    assert sys.stdin.readline().strip() == "space freed"
    if mode == "max_bytes":
        # nothing to remount: make room by deleting a third of the keys
        gone = list(model)[: len(model) // 3]
        m.delete_many(gone)
        for k in gone:
            del model[k]
    m.checkpoint()
    m.close()
    with CacheManager(cfg) as again:
        lost = [k for k, v in model.items() if again.get(k) != v]
        deleted_back = [k for k in range(i) if k not in model and again.get(k) is not None]
    print(json.dumps({"phase": "done", "lost": lost[:5], "n_lost": len(lost),
                      "entries": len(model), "deleted_back": deleted_back[:5]}), flush=True)
""")


def _try_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True)
    return r.returncode == 0


def test_disk_full_raises_capacity_error_and_loses_nothing(tmp_path):
    mnt = str(tmp_path / "small")
    # a real full file system when we may mount a small tmpfs (root); else the store of record
    # bounded by max_bytes. MLCACHE_DISK_FULL_MODE=max_bytes forces the fallback.
    forced = os.environ.get("MLCACHE_DISK_FULL_MODE")
    os.makedirs(mnt, exist_ok=True)
    mode = forced or ("tmpfs" if _try_tmpfs(mnt, "2m") else "max_bytes")
    try:
        env = dict(os.environ, PYTHONPATH=ROOT)
        proc = subprocess.Popen([sys.executable, "-c", _FULL_CHILD, os.path.join(mnt, "disk"),
                                 mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True)
        first = json.loads(proc.stdout.readline() or "{}")
        assert first.get("phase") == "full", (first, proc.stderr.read() if not first else "")
        assert first["errors"], "the disk never filled"
        assert all(e.startswith("CapacityError") for e in first["errors"]), first["errors"]
        assert "disk" in first["errors"][0]
        assert first["wrong_while_full"] == []
        if mode == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
        proc.stdin.write("space freed\n")
        proc.stdin.flush()
        done = json.loads(proc.stdout.readline() or "{}")
        err = proc.stderr.read()
        proc.wait(60)
        assert done.get("phase") == "done", err
        assert done["n_lost"] == 0 and done["deleted_back"] == [], done
        if mode == "tmpfs":
            assert done["entries"] == first["puts"]
        print(f"disk full via {mode}: {first['puts']} puts, {len(first['errors'])} CapacityErrors, "
              f"{done['n_lost']} lost")
    finally:
        if mode == "tmpfs":
            subprocess.run(["umount", "-l", mnt], capture_output=True)


def test_store_of_record_full_by_max_bytes_then_deletes_make_room(tmp_path):
    """Deleting keys that are already on a full store of record frees room for the writes
    waiting behind them (tombstones are written before buffered puts)."""
    cfg = CacheConfig(heap=HeapConfig(policy="lru", max_entries=2, max_bytes=None),
                      levels=(DiskConfig(path=str(tmp_path), max_bytes=4000),),
                      retry_attempts=1, retry_backoff=0.0, eviction_buffer_max=50)
    m = CacheManager(cfg)
    model = {}
    with pytest.raises(CapacityError) as info:
        for i in range(100):
            model[i] = "v" * 100
            m.put(i, model[i])
            m.flush()
    assert info.value.level == "disk"
    assert all(m.get(k) == v for k, v in model.items())      # nothing lost
    on_disk = [k for k in model if m._levels[0].get(m._encode_key(k)) is not None]
    assert len(on_disk) >= 20
    m.delete_many(on_disk[:20])                               # make room below
    for k in on_disk[:20]:
        del model[k]
    m.checkpoint()
    m.close()
    with CacheManager(cfg) as again:
        assert {k: again.get(k) for k in model} == model
        assert all(again.get(k) is None for k in on_disk[:20])


# -- corrupt or truncated bytes in a level ---------------------------------------------------

def _corruptions(good: bytes) -> list[bytes]:
    return [good[:len(good) // 2], good[:1], b"", b"\xff" * 10, good[:-1],
            bytes([good[0]]) + b"\xc1" + good[2:], b"\x02garbage-not-a-pickle"]


@pytest.mark.parametrize("signed", [False, True])
def test_corrupt_bytes_in_redis_raise_integrity_error_naming_level_and_key(redis_url, signed):
    cfg = CacheConfig(heap=HeapConfig(max_entries=5), namespace="corrupt",
                      levels=(RedisConfig(url=redis_url, prefix="corrupt"),),
                      signing_key=b"k" * 32 if signed else None)
    client = redis.Redis.from_url(redis_url)
    with CacheManager(cfg) as m:
        m.put_many({("user", i): {"n": i, "s": "abc" * i} for i in range(20)})
        m.checkpoint()
        full = m._levels[0].prefix + m._encode_key(("user", 7))
        good = client.get(full)
        for bad in _corruptions(good):
            client.set(full, bad)
            m.invalidate_local()
            try:
                value = m.get(("user", 7))
            except IntegrityError as exc:
                assert exc.level == "redis" and exc.key == ("user", 7), exc
                assert "redis" in str(exc) and "user" in str(exc)
            else:
                # only possible unsigned, for bytes that happen to decode: never the old value
                # silently mixed up with another key's, and never a crash
                assert not signed, bad
                assert value != {"n": 7, "s": "abc" * 7}
            # the other keys are unaffected
            assert m.get(("user", 8)) == {"n": 8, "s": "abc" * 8}
        client.set(full, good)
        m.invalidate_local()
        assert m.get(("user", 7)) == {"n": 7, "s": "abc" * 7}
        # a corrupt entry can be overwritten or deleted
        client.set(full, b"\x01\xc1")
        m.delete(("user", 7))
        m.flush()
        assert m.get(("user", 7)) is None
    client.close()


def test_corrupt_bytes_in_disk_level_raise_integrity_error(tmp_path):
    cfg = CacheConfig(heap=HeapConfig(max_entries=5), namespace="corrupt",
                      levels=(DiskConfig(path=str(tmp_path / "d")),))
    with CacheManager(cfg) as m:
        m.put_many({i: ["value", i, "x" * (i * 10)] for i in range(20)})
        m.put("big", "y" * 100_000)              # large enough for a file of its own
        m.checkpoint()
        disk = m._levels[0]
        for key in (3, "big"):
            kb = m._encode_key(key)
            good = disk.get(kb)
            for bad in _corruptions(good):
                disk.put_many([(kb, bad)])
                m.invalidate_local()
                try:
                    m.get(key)
                except IntegrityError as exc:
                    assert exc.level == "disk" and exc.key == key
        # a value file truncated behind diskcache's back
        kb = m._encode_key("big")
        disk.put_many([(kb, m._codec.encode("y" * 100_000))])
        (fname,) = [f for f in disk.cache._sql(
            "SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()[0]]
        with open(os.path.join(disk.path, fname), "r+b") as f:
            f.truncate(1000)
        m.invalidate_local()
        with pytest.raises(IntegrityError) as info:
            m.get("big")
        assert info.value.level == "disk" and info.value.key == "big"
        assert m.get(4) == ["value", 4, "x" * 40]
