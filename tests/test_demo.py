"""The demo job runs end to end and loses no state, over disk and over Redis -> disk."""
from __future__ import annotations

import redis

from mlcache.cli import main
from mlcache.demo import report, run_local, transactions


def test_transactions_are_reproducible_and_zipf_skewed():
    a = transactions(5_000, 1_000, seed=3)
    b = transactions(5_000, 1_000, seed=3)
    assert (a["card"] == b["card"]).all() and (a["amount"] == b["amount"]).all()
    counts = sorted(((a["card"] == c).sum() for c in set(a["card"].tolist())), reverse=True)
    assert counts[0] > 20 * counts[len(counts) // 2]          # a few cards are hot
    assert (a["ts"][1:] > a["ts"][:-1]).all()


def test_run_local_over_disk_loses_nothing(tmp_path):
    result = run_local(events=20_000, cards=5_000, disk_path=str(tmp_path / "d"), progress=False)
    assert result.mismatches == 0
    assert result.state_bytes >= 9 * result.heap_budget
    heap = result.stats["levels"]["heap"]
    assert heap["misses"] > 0 and result.stats["levels"]["disk"]["keys_written"] > 0
    text = report(result)
    assert "0 cards differ" in text and "disk" in text


def test_run_local_over_redis_cleans_up_after_itself(tmp_path, redis_url):
    result = run_local(events=4_000, cards=1_500, redis=redis_url,
                       disk_path=str(tmp_path / "d"), progress=False)
    assert result.mismatches == 0
    assert result.stats["levels"]["redis"]["keys_written"] > 0
    client = redis.Redis.from_url(redis_url)
    assert [k for k in client.scan_iter(match=b"mlcache-demo-*:*")] == []
    client.close()


def test_cli_demo_quick_local(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MLCACHE_HOME", str(tmp_path))
    assert main(["demo", "--quick", "--local"]) == 0
    out = capsys.readouterr().out
    assert "tx/s" in out and "0 cards differ" in out
