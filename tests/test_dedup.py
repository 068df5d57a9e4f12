"""The record cache in a manager over real disk and Redis levels: what is forwarded, when, once."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlcache import CacheConfig, CacheManager, ConfigError, DedupConfig, DiskConfig, RedisConfig
from mlcache.sink import ForwardingSink


def make(tmp_path, *, redis_url=None, budget=1 << 20, **dedup):
    levels = (DiskConfig(path=str(tmp_path / "disk")),)
    if redis_url:
        levels = (RedisConfig(url=redis_url),) + levels
    return CacheManager(CacheConfig(levels=levels, namespace="t",
                                    dedup=DedupConfig(max_bytes_buffering=budget, **dedup)))


class Log:
    """A listener that records every (namespace, key, new, old)."""

    def __init__(self):
        self.records = []
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        self.records += [(batch.namespace, k, n, o) for k, n, o in batch]

    def per_key(self, ns=None):
        out: dict = {}
        for n, k, new, _ in self.records:
            if n == ns:
                out.setdefault(k, []).append(new)
        return out


def disk_writes(m):
    return m.stats()["levels"]["disk"]["keys_written"]


# ---------------------------------------------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "del", "tick"]),
                         st.integers(0, 6), st.integers(0, 1000)), min_size=1, max_size=120)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_forwarded_values_are_the_per_interval_final_values(tmp_path_factory, ops):
    """Event-time commit interval, no eviction pressure: forwarded == reference, old chains."""
    tmp = tmp_path_factory.mktemp("d")
    m = make(tmp, commit_interval=10, time="event")
    log = Log()
    m.on_flush(log)
    ts = 0.0
    intervals: list[dict] = [{}]
    current = None                 # the interval of the last put (delete() takes no ts)
    for op, k, v in ops:
        if op == "tick":
            ts += 7
            continue
        if op == "put" and current is not None and ts // 10 > current:
            intervals.append({})
        if op == "put":
            current = ts // 10
            m.put(k, v, ts=ts)
            intervals[-1][k] = v
        else:
            m.delete(k)
            intervals[-1][k] = None
    m.flush()
    expected: dict = {}
    for finals in intervals:
        for k, v in finals.items():
            expected.setdefault(k, []).append(v)
    assert log.per_key() == expected
    last: dict = {}
    for _, k, new, old in log.records:
        assert old == last.get(k)
        last[k] = new
    # at most one store write per forwarded put: a committed value still queued when the key
    # is updated again is superseded in the write-back buffer (deletes are tombstones)
    assert disk_writes(m) <= sum(1 for r in log.records if r[2] is not None)
    m.close()
    m2 = make(tmp)
    for k, v in last.items():
        assert m2.get(k) == v
    m2.close()


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 30), st.integers(0, 9)),
                    min_size=1, max_size=300))
def test_under_pressure_nothing_is_lost_or_forwarded_twice(tmp_path_factory, ops):
    tmp = tmp_path_factory.mktemp("p")
    m = make(tmp, budget=600)
    log = Log()
    m.on_flush(log)
    spaces = {n: m.namespace(n) for n in "abc"}
    puts: dict = {}
    for n, k, v in ops:
        value = f"{n}{k}-{v}-{len(puts.get((n, k), []))}"
        spaces[n].put(k, value)
        puts.setdefault((n, k), []).append(value)
        assert m.stats()["levels"]["heap"]["bytes"] <= 600
    m.flush()
    seen: dict = {}
    for n, k, new, old in log.records:
        got = seen.setdefault((n, k), [])
        assert old == (got[-1] if got else None)
        got.append(new)
    for nk, values in puts.items():
        fwd = seen[nk]
        assert fwd[-1] == values[-1]
        it = iter(values)
        assert all(v in it for v in fwd)      # a subsequence of the updates, in order, no repeats
    # one store write per forwarded version at most (a queued one may be superseded)
    assert disk_writes(m) <= len(log.records)
    for (n, k), values in puts.items():
        assert spaces[n].get(k) == values[-1]
    m.close()


def test_redis_then_disk_levels(tmp_path, redis_url):
    m = make(tmp_path, redis_url=redis_url, budget=1500)
    log = Log()
    m.on_flush(log)
    for i in range(300):
        m.put(i % 40, i)
    m.checkpoint()
    finals = {k: max(i for i in range(300) if i % 40 == k) for k in range(40)}
    assert {k: v[-1] for k, v in log.per_key().items()} == finals
    assert m.stats()["levels"]["redis"]["keys_written"] <= len(log.records) < 300
    m.close()
    m2 = make(tmp_path, redis_url=redis_url)
    assert {k: m2.get(k) for k in range(40)} == finals
    m2.close()


def test_record_budget_counts_record_bytes_not_heap_bookkeeping(tmp_path):
    """max_bytes_buffering is KIP-63's budget of record bytes: the byte-bounded heap's per-entry
    memory charge (hundreds of bytes) must not apply to it, or 40 small records overflow 1500
    bytes and every put is forwarded at once (no deduplication at all)."""
    m = make(tmp_path, budget=1500)
    log = Log()
    m.on_flush(log)
    for i in range(300):
        m.put(i % 40, i)
    assert log.records == []
    m.flush()
    assert sorted(r[1] for r in log.records) == list(range(40))
    m.close()


def test_deletes_are_forwarded_as_tombstones(tmp_path):
    m = make(tmp_path)
    log = Log()
    m.on_flush(log)
    m.put("a", 1)
    m.put("b", 2)
    m.flush()
    m.delete("a")
    m.put("b", 3)
    m.delete("never")
    m.flush()
    assert log.records[2:] == [(None, "a", None, 1), (None, "b", 3, 2),
                               (None, "never", None, None)]
    assert m.get("a") is None
    m.close()
    m2 = make(tmp_path)
    assert m2.get("a") is None and m2.get("b") == 3
    m2.close()


def test_old_value_of_a_key_written_without_being_resident(tmp_path):
    m = make(tmp_path)
    m.put("k", 10)
    m.close()
    m = make(tmp_path)
    log = Log()
    m.on_flush(log)
    m.put("k", 11)                            # not resident: its old value is read first
    m.flush()
    assert log.records == [(None, "k", 11, 10)]
    m.close()


def test_namespace_listeners_and_batches(tmp_path):
    m = make(tmp_path, batch_size=3)
    all_log, a_log = Log(), Log()
    m.on_flush(all_log)
    a = m.namespace("a")
    a.on_flush(a_log)
    for i in range(7):
        a.put(i, i)
    m.namespace("b").put("x", 1)
    m.put("root", 0)
    m.flush()
    assert a_log.calls == 3 and [r[1] for r in a_log.records] == list(range(7))
    assert {r[0] for r in all_log.records} == {"a", "b", None}
    a.remove_flush_listener(a_log)
    a.put(0, 9)
    m.flush()
    assert a_log.calls == 3
    m.close()


def test_listener_failure_keeps_the_rest_dirty_and_a_retry_forwards_each_once(tmp_path):
    m = make(tmp_path, batch_size=2)
    ok, flaky = Log(), Log()
    state = {"fail_at": 2}

    def failing(batch):
        state["fail_at"] -= 1
        if state["fail_at"] == 0:
            raise RuntimeError("sink down")
        flaky(batch)

    m.on_flush(ok)
    m.on_flush(failing)
    for i in range(6):
        m.put(i, i)
    with pytest.raises(RuntimeError, match="sink down"):
        m.flush()
    assert [r[1] for r in flaky.records] == [0, 1]
    assert [r[1] for r in ok.records] == [0, 1, 2, 3]   # ok took the failed batch
    assert m.stats()["dedup"]["dirty"] == 4
    assert m.stats()["dedup"]["written"] == 2            # only what every listener took
    m.put(5, 50)                                         # updated while pending
    m.flush()
    assert [r[1:] for r in flaky.records] == [(0, 0, None), (1, 1, None), (2, 2, None),
                                              (3, 3, None), (4, 4, None), (5, 50, None)]
    assert [r[1] for r in ok.records] == [0, 1, 2, 3, 4, 5]
    assert disk_writes(m) == 6
    m.close()


def test_listener_failure_under_pressure_raises_from_put_and_loses_nothing(tmp_path):
    m = make(tmp_path, budget=300)
    broken = {"on": False}
    log = Log()

    def listener(batch):
        if broken["on"]:
            raise ValueError("bad listener")
        log(batch)

    m.on_flush(listener)
    broken["on"] = True
    with pytest.raises(ValueError):
        for i in range(100):
            m.put(i, "x" * 10 + str(i))
    failed_at = i
    broken["on"] = False
    for j in range(failed_at + 1):
        assert m.get(j) == "x" * 10 + str(j)
    m.flush()
    assert sorted(r[1] for r in log.records) == list(range(failed_at + 1))
    m.close()


def test_listeners_may_write_to_the_cache(tmp_path):
    m = make(tmp_path)
    totals = m.namespace("totals")
    derived = Log()
    totals.on_flush(derived)

    def aggregate(batch):
        if batch.namespace is None:
            for key, new, old in batch:
                totals.put("sum", totals.get("sum", 0) + (new or 0) - (old or 0))

    m.on_flush(aggregate)
    m.put("a", 5)
    m.put("b", 7)
    m.flush()                               # the derived write is forwarded in the same flush
    assert derived.records == [("totals", "sum", 12, None)]
    m.put("a", 1)
    m.flush()
    assert derived.records[-1] == ("totals", "sum", 8, 12)
    m.close()


def test_budget_resize_evicts_fairly_across_namespaces(tmp_path):
    m = make(tmp_path, budget=30_000)
    log = Log()
    m.on_flush(log)
    spaces = [m.namespace(n) for n in ("a", "b", "c")]
    for i in range(100):
        for sp in spaces:
            sp.put(i, "v" * 50)
    m.flush()
    before = m.stats()["levels"]["heap"]["entries"]
    m.resize_buffering(6_000)
    st = m.stats()
    assert st["levels"]["heap"]["bytes"] <= 6_000
    assert st["dedup"]["max_bytes_buffering"] == 6000
    resident = {n: sum(1 for kb in m._heap.data if kb.startswith(f"t/{n}".encode()))
                for n in "abc"}
    assert max(resident.values()) - min(resident.values()) <= 1 and before > sum(resident.values())
    for sp in spaces:                       # everything still readable
        assert sp.get(99) == "v" * 50
    with pytest.raises(ConfigError) as info:
        m.resize_buffering(0)
    assert info.value.field == "dedup.max_bytes_buffering"
    m.close()


def test_wall_clock_commit_interval(tmp_path):
    m = make(tmp_path, commit_interval=0.01)
    log = Log()
    m.on_flush(log)
    m.put("a", 1)
    m.put("a", 2)
    time.sleep(0.02)
    m.put("b", 1)                           # the interval expired: a's dirty set goes first
    assert (None, "a", 2, None) in log.records and m.stats()["dedup"]["commits"] >= 1
    m.close()


def test_config_errors_name_the_field(tmp_path):
    for kwargs, field in (({"commit_interval": 0}, "dedup.commit_interval"),
                          ({"time": "cpu"}, "dedup.time"),
                          ({"batch_size": 0}, "dedup.batch_size"),
                          ({"max_bytes_buffering": -1}, "dedup.max_bytes_buffering")):
        with pytest.raises(ConfigError) as info:
            DedupConfig(**kwargs)
        assert info.value.field == field
    with pytest.raises(ConfigError) as info:
        CacheConfig(heap=None, dedup=DedupConfig())
    assert info.value.field == "dedup"
    plain = CacheManager(CacheConfig(levels=(DiskConfig(path=str(tmp_path / "p")),)))
    with pytest.raises(ConfigError) as info:
        plain.on_flush(print)
    assert info.value.field == "dedup"
    plain.close()
    cfg = CacheConfig.from_dict({"dedup": {"commit_interval": 5, "time": "event"},
                                 "levels": [{"type": "disk", "path": str(tmp_path / "q")}]})
    assert cfg.heap.policy == "dedup" and cfg.dedup.time == "event"


def test_forwarding_sink(tmp_path):
    m = make(tmp_path)
    got, frames = [], []
    sink = ForwardingSink(got.extend, deletes=False, skip_unchanged=True)
    m.on_flush(sink)
    m.on_flush(ForwardingSink(lambda df, bid: frames.append((bid, df)), format="pandas",
                              with_batch_id=True))
    m.put("a", 1)
    m.put("b", 2)
    m.flush()
    m.put("a", 1)                            # unchanged
    m.delete("b")
    m.flush()
    assert got == [("a", 1, None), ("b", 2, None)] and sink.skipped == 2
    assert list(frames[0][1].columns) == ["key", "new", "old", "namespace"] and frames[0][0] is None
    assert sink.forward([("z", 1, 0)], batch_id=3) == 1 and got[-1] == ("z", 1, 0)
    m.close()


def test_in_place_change_after_a_flush_is_still_written_back(tmp_path):
    m = make(tmp_path, budget=2000)
    m.put("list", [1, 2])
    m.flush()
    m.get("list").append(3)                  # mutated in place, never put again
    for i in range(100):                     # push it out of the heap
        m.put(i, "x" * 30)
    m.close()
    m2 = make(tmp_path)
    assert m2.get("list") == [1, 2, 3]
    m2.close()


def test_threads_and_a_listener_that_flushes(tmp_path):
    import threading

    m = make(tmp_path, budget=3000)
    log = Log()
    nested = {"n": 0}

    def listener(batch):
        log(batch)
        if nested["n"] < 3:
            nested["n"] += 1
            m.flush()                        # re-entrant flush: no deadlock, nothing repeated

    m.on_flush(listener)
    finals: dict = {}

    def worker(name):
        ns = m.namespace(name)
        for i in range(300):
            ns.put(i % 25, i)
        finals[name] = {k: max(i for i in range(300) if i % 25 == k) for k in range(25)}

    threads = [threading.Thread(target=worker, args=(f"w{t}",)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m.flush()
    chains: dict = {}
    for ns, k, new, old in log.records:
        chain = chains.setdefault((ns, k), [])
        assert old == (chain[-1] if chain else None)
        assert not chain or new > chain[-1]   # in update order, never twice
        chain.append(new)
    for name, values in finals.items():
        for k, v in values.items():
            assert chains[(name, k)][-1] == v
            assert m.namespace(name).get(k) == v
    m.close()


def test_a_value_heavier_than_the_budget_is_still_forwarded_once(tmp_path):
    m = make(tmp_path, budget=500)
    log = Log()
    m.on_flush(log)
    big = "x" * 2000
    m.put("big", big)
    assert m.get("big") == big
    m.flush()
    m.flush()
    assert log.records == [(None, "big", big, None)]
    m.close()
