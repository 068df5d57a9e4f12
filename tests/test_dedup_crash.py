"""A process killed with SIGKILL between flushes loses no acknowledged flush."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from mlcache import CacheConfig, CacheManager, DedupConfig, DiskConfig

CHILD = textwrap.dedent("""
    import json, os, sys
    from mlcache import CacheConfig, CacheManager, DedupConfig, DiskConfig

    path, log_path = sys.argv[1], sys.argv[2]
    m = CacheManager(CacheConfig(levels=(DiskConfig(path=path),), namespace="crash",
                                 dedup=DedupConfig(max_bytes_buffering=3000)))
    log = open(log_path, "a")

    def listener(batch):
        for key, new, old in batch:
            log.write(json.dumps([key, new, old]) + "\\n")
        log.flush()
        os.fsync(log.fileno())

    m.on_flush(listener)
    counts = {}
    i = 0
    while True:                      # per-key running counts; the parent kills us
        for _ in range(400):
            key = (i * 7919) % 97 if i % 3 else i % 5
            counts[key] = m.get(key, 0) + 1
            m.put(key, counts[key])
            i += 1
        m.flush()
        print("ACK " + json.dumps(counts), flush=True)
""")


def test_sigkill_after_flush_loses_nothing_acknowledged(tmp_path):
    path, log_path = str(tmp_path / "disk"), str(tmp_path / "forwarded.jsonl")
    env = dict(os.environ, MLCACHE_HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path, log_path], env=env,
                            stdout=subprocess.PIPE, text=True)
    acked = None
    try:
        for _ in range(3):
            line = proc.stdout.readline()
            assert line.startswith("ACK "), line
            acked = {int(k): v for k, v in json.loads(line[4:]).items()}
        proc.send_signal(signal.SIGKILL)   # while it is writing the next interval
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    forwarded: dict = {}
    with open(log_path) as fh:
        lines = fh.read().split("\n")
        for line in lines[:-1]:          # the last one may be cut short by the kill
            key, new, old = json.loads(line)
            assert old == forwarded.get(key)      # each version forwarded once, in order
            forwarded[key] = new
    m = CacheManager(CacheConfig(levels=(DiskConfig(path=path),), namespace="crash",
                                 dedup=DedupConfig()))
    try:
        for key, count in acked.items():
            stored = m.get(key)
            # the acknowledged value is durable; later eviction-pressure writes may be newer
            assert stored is not None and stored >= count, (key, stored, count)
            assert forwarded[key] >= count
    finally:
        m.close()
