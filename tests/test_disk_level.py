"""Regression tests of the disk level from the session-7 review: each names the defect it pins."""
from __future__ import annotations

import os

import pytest

import mlcache.levels.disk as disk_mod
from mlcache.config import DiskConfig
from mlcache.levels.disk import DiskLevel

BIG = 40_000    # above diskcache's min_file_size (32 KiB): the value goes to a file of its own


def _recording_fsync(monkeypatch) -> list[str]:
    synced: list[str] = []
    real = disk_mod._fsync

    def recording(path: str) -> bool:
        synced.append(os.path.normpath(path))
        return real(path)

    monkeypatch.setattr(disk_mod, "_fsync", recording)
    return synced


def _value_files(path: str) -> set[str]:
    return {os.path.normpath(os.path.join(d, f))
            for d, _, names in os.walk(path) for f in names if f.endswith(".val")}


@pytest.mark.parametrize("shards", [1, 3])
def test_value_files_waiting_for_sync_stay_bounded_and_durable(tmp_path, monkeypatch, shards):
    # regression: every value file written was remembered for sync() (~160 bytes a path) and
    # only sync() let go of them: a process that never checkpointed grew without bound, even
    # when it rewrote one key (the replaced files stayed in the set)
    monkeypatch.setattr(disk_mod, "_UNSYNCED_LIMIT", 8)
    synced = _recording_fsync(monkeypatch)
    level = DiskLevel(DiskConfig(path=str(tmp_path / "d"), shards=shards))
    try:
        for i in range(60):
            level.put_many([(b"k%d" % i, os.urandom(BIG))])
            level.put_many([(b"same", os.urandom(BIG))])
            assert all(len(s.disk.unsynced) <= 8 for s in level._shards)
        early = set(synced)
        assert early, "nothing was synced before sync()"
        # every file synced early had its directory entries synced up to the shard's root
        roots = {os.path.normpath(s.disk._directory) for s in level._shards}
        for path in early & _value_files(level.path):
            chain = os.path.dirname(path)
            while True:
                assert chain in early, chain
                if chain in roots:
                    break
                chain = os.path.dirname(chain)
        level.sync()                       # the promise of sync(): every file on disk is synced
        assert _value_files(level.path) <= set(synced)
        assert all(not s.disk.unsynced for s in level._shards)
        assert level.get_many([b"k0", b"k59"]) != [None, None]
    finally:
        level.close()


def test_a_failed_sync_keeps_the_files_it_had_not_made_durable(tmp_path, monkeypatch):
    # regression: sync() popped each path before its fsync; after a failure the paths it had
    # taken were forgotten, and the next sync() returned without making them durable
    level = DiskLevel(DiskConfig(path=str(tmp_path / "d")))
    try:
        level.put_many([(b"a", os.urandom(BIG)), (b"b", os.urandom(BIG))])
        real = disk_mod._fsync

        def failing(path: str) -> bool:
            raise OSError(5, "Input/output error", path)

        monkeypatch.setattr(disk_mod, "_fsync", failing)
        with pytest.raises(Exception, match="Input/output error"):
            level.sync()
        synced: list[str] = []
        monkeypatch.setattr(disk_mod, "_fsync", lambda p: synced.append(p) or real(p))
        level.sync()
        assert {os.path.normpath(p) for p in synced} >= _value_files(level.path)
    finally:
        level.close()
