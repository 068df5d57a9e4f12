"""``mlcache inspect CONFIG``: entries and bytes per level and namespace, read from real levels."""
from __future__ import annotations

import json

import redis

from mlcache import CacheConfig, CacheManager
from mlcache.cli import main
from mlcache.codec import Codec
from mlcache.inspect import inspect_config
from mlcache.keys import encode_key, namespace_prefix


def _fill(config: CacheConfig) -> dict[str, dict]:
    """Write two namespaces through a manager; return what was written per namespace."""
    written: dict[str, dict] = {"jobs": {}, "jobs/orders": {}}
    with CacheManager(config) as m:
        for i in range(120):
            m.put(i, "x" * i)
            written["jobs"][i] = "x" * i
        orders = m.namespace("orders")
        for i in range(35):
            orders.put(("o", i), {"amount": i})
            written["jobs/orders"][("o", i)] = {"amount": i}
        orders.delete(("o", 0))
        del written["jobs/orders"][("o", 0)]
    return written


def _expected_bytes(config: CacheConfig, ns: str, items: dict) -> int:
    codec = Codec(signing_key=config.signing_key, allow_pickle=config.allow_pickle)
    prefix = namespace_prefix(ns)
    return sum(len(prefix + encode_key(k)) + len(codec.encode(v)) for k, v in items.items())


def test_inspect_redis_and_disk(tmp_path, redis_url, unique_ns, capsys):
    spec = {"heap": {"max_entries": 16, "max_bytes": None}, "namespace": "jobs",
            "levels": [{"type": "redis", "url": redis_url, "prefix": unique_ns},
                       {"type": "disk", "path": str(tmp_path / "disk")}]}
    config = CacheConfig.from_dict(spec)
    written = _fill(config)

    usages = inspect_config(config)
    assert [u.level for u in usages] == ["heap", "redis", "disk"]
    assert usages[0].status.startswith("in-process only")
    disk = usages[2]
    assert disk.status == "ok"
    by_ns = {n.namespace: n for n in disk.namespaces}
    # checkpoint() on close made every entry durable on the store of record
    assert by_ns["jobs"].entries == 120 and by_ns["jobs/orders"].entries == 34
    assert by_ns["jobs"].bytes == _expected_bytes(config, "jobs", written["jobs"])
    assert by_ns["jobs/orders"].bytes == _expected_bytes(config, "jobs/orders",
                                                         written["jobs/orders"])
    redis_ns = {n.namespace: n.entries for n in usages[1].namespaces}
    client = redis.Redis.from_url(redis_url)
    stored = sum(1 for _ in client.scan_iter(match=unique_ns.encode() + b"*"))
    client.close()
    assert sum(redis_ns.values()) <= stored and set(redis_ns) <= {"jobs", "jobs/orders"}

    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "disk" in out and "jobs/orders" in out and "34" in out and "120" in out
    assert redis_url not in out or "@" not in redis_url     # passwords are never printed

    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[2]["entries"] == disk.entries and data[2]["bytes"] == disk.bytes

    assert main(["inspect", str(path), "--keys-only"]) == 0
    assert "bytes" not in capsys.readouterr().out.split("disk", 1)[1]


def test_inspect_reports_missing_and_private_levels(tmp_path, capsys):
    spec = {"levels": [{"type": "arena", "max_bytes": 1 << 20},
                       {"type": "redis", "url": "embedded"},
                       {"type": "disk", "path": str(tmp_path / "never-written")}]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(spec))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("in-process only") == 3 and "missing" in out
    assert not (tmp_path / "never-written").exists()     # inspecting creates nothing


def test_inspect_bad_config(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"heap": {"max_bytes": -1}}))
    assert main(["inspect", str(path)]) == 2
    assert "heap.max_bytes" in capsys.readouterr().err
