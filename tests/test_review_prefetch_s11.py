"""Differential review of keyed prefetching (session 11): the same stateful steps run over a
plain dict and over a manager whose heap is a few entries, with the lookahead operator reading
ahead. Prefetching must be invisible to the results: a staged or prefetched value never
stands in for a write made after it was read, whatever the fetch mode, level or policy.

Each step reads-modifies-writes its record's key and also writes (or deletes) the key of a
record a few places ahead, which the operator has usually hinted, and often already read,
by then: the case where a stale read-ahead would show.
"""
from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlcache import (CacheConfig, CacheManager, DiskConfig, HeapConfig, PrefetchConfig,
                     RedisConfig, prefetching)

_counter = itertools.count()

# A stream: record i is (key, other key, action on the other key).
_streams = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.sampled_from(["set", "del", "none"])),
    min_size=1, max_size=300)


def _config(kind, tmp_path, redis_url, policy, mode, entries):
    n = next(_counter)
    levels: tuple
    if kind == "disk":
        levels = (DiskConfig(path=str(tmp_path / f"disk{n}")),)
    elif kind == "redis":
        levels = (RedisConfig(url=redis_url, prefix=f"pf11:{n}:"),)
    else:
        levels = (RedisConfig(url=redis_url, prefix=f"pf11:{n}:"),
                  DiskConfig(path=str(tmp_path / f"disk{n}")))
    return CacheConfig(heap=HeapConfig(policy=policy, max_entries=entries, max_bytes=None),
                       levels=levels, namespace="s",
                       prefetch=PrefetchConfig(fetch_mode=mode, batch_size=4, hot_threshold=16))


def _reference(stream, initial):
    state = dict(initial)
    seen = []
    for i, (k, other, action) in enumerate(stream):
        v = state.get(k, 0)
        seen.append(v)
        state[k] = v + 1
        if action == "set":
            state[other] = 1000 + i
        elif action == "del":
            state.pop(other, None)
    return state, seen


def _run(m, stream, depth):
    seen = []
    records = list(enumerate(stream))
    for i, (k, other, action) in prefetching(records, key=lambda r: r[1][0],
                                             ts=lambda r: float(r[0]), cache=m, depth=depth):
        v = m.get(k, 0, ts=float(i))
        seen.append(v)
        m.put(k, v + 1, ts=float(i))
        if action == "set":
            m.put(other, 1000 + i, ts=float(i))
        elif action == "del":
            m.delete(other)
    return seen


@pytest.mark.parametrize("kind", ["disk", "redis", "redis+disk"])
@pytest.mark.parametrize("mode", ["inline", "threads"])
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_streams, depth=st.sampled_from([2, 8, 32, "auto"]),
       policy=st.sampled_from(["tac", "lru", "wtinylfu"]), entries=st.integers(2, 8))
def test_prefetching_is_invisible_to_read_modify_write_steps(
        tmp_path, redis_url, kind, mode, stream, depth, policy, entries):
    initial = {k: 100 * k for k in range(0, 41, 3)}
    config = _config(kind, tmp_path, redis_url, policy, mode, entries)
    with CacheManager(config) as m:
        m.put_many(initial.items())
        m.checkpoint()               # below the heap: the reads ahead have something to read
        m.invalidate_local()
        seen = _run(m, stream, depth)
        expected_state, expected_seen = _reference(stream, initial)
        assert seen == expected_seen
        got = {k: m.get(k) for k in range(41)}
        assert {k: v for k, v in got.items() if v is not None} == expected_state
        m.checkpoint()
    with CacheManager(config) as again:         # and what reached the levels is the same
        got = {k: again.get(k) for k in range(41)}
        assert {k: v for k, v in got.items() if v is not None} == expected_state


@pytest.mark.parametrize("mode", ["inline", "threads"])
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_streams, entries=st.integers(2, 6))
def test_two_operators_over_one_manager_see_each_others_writes(
        tmp_path, redis_url, mode, stream, entries):
    # Two lookahead operators interleaved on one thread (two inputs of one step, as a join
    # reads them): each one's reads ahead must not hide the other's writes.
    config = _config("redis+disk", tmp_path, redis_url, "tac", mode, entries)
    state: dict = {}
    with CacheManager(config) as m:
        half = len(stream) // 2
        a = prefetching(list(enumerate(stream[:half])), key=lambda r: r[1][0], cache=m, depth=8)
        b = prefetching(list(enumerate(stream[half:])), key=lambda r: r[1][0], cache=m, depth=8)
        for ra, rb in itertools.zip_longest(a, b):
            for r in (ra, rb):
                if r is None:
                    continue
                k = r[1][0]
                v = m.get(k, 0)
                assert v == state.get(k, 0)
                m.put(k, v + 1)
                state[k] = v + 1
        assert {k: m.get(k) for k in state} == state


@pytest.mark.parametrize("kind", ["disk", "redis+disk"])
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["hint", "put", "del", "get", "flush"]),
                              st.integers(0, 12)), min_size=1, max_size=120),
       entries=st.integers(2, 6))
def test_bare_hints_never_bring_back_an_older_value(tmp_path, redis_url, kind, ops, entries):
    # hint() without an operator: the fetch threads read; a put or delete that follows must win.
    config = _config(kind, tmp_path, redis_url, "tac", "auto", entries)
    state = {k: f"v{k}" for k in range(13)}
    with CacheManager(config) as m:
        m.put_many(state.items())
        m.checkpoint()
        m.invalidate_local()
        for i, (op, k) in enumerate(ops):
            if op == "hint":
                m.hint(k, float(i))
            elif op == "put":
                m.put(k, f"w{i}")
                state[k] = f"w{i}"
            elif op == "del":
                m.delete(k)
                state.pop(k, None)
            elif op == "get":
                assert m.get(k) == state.get(k)
            else:
                m.flush()
        assert {k: m.get(k) for k in range(13)} == {k: state.get(k) for k in range(13)}


@pytest.mark.parametrize("mode", ["inline", "threads"])
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=_streams, depth=st.sampled_from([4, 16, "auto"]),
       read_ms=st.sampled_from([0.0, 1.0, 3.0]), write_ms=st.sampled_from([0.0, 2.0]),
       entries=st.integers(2, 6))
def test_slow_reads_and_a_slow_write_back_race_without_a_stale_value(
        tmp_path, redis_url, mode, stream, depth, read_ms, write_ms, entries):
    # Reads that wait (a remote store): the fetch threads' reads overlap the steps' writes and
    # the write-back's flushes of the same keys, which is where a staged copy could be older
    # than the heap's.
    from mlcache.bench._delayed import Delay, DelayedLevelConfig

    n = next(_counter)
    delay = Delay(read_ms / 1000, write_ms / 1000)
    config = CacheConfig(
        heap=HeapConfig(policy="tac", max_entries=entries, max_bytes=None),
        levels=(DelayedLevelConfig(inner=RedisConfig(url=redis_url, prefix=f"pf11:{n}:"),
                                   delay=delay),),
        namespace="s", prefetch=PrefetchConfig(fetch_mode=mode, batch_size=4, hot_threshold=16))
    initial = {k: 100 * k for k in range(0, 41, 2)}
    with CacheManager(config) as m:
        m.put_many(initial.items())
        m.flush()
        m.invalidate_local()
        seen = _run(m, stream, depth)
        expected_state, expected_seen = _reference(stream, initial)
        assert seen == expected_seen
        got = {k: m.get(k) for k in range(41)}
        assert {k: v for k, v in got.items() if v is not None} == expected_state
        assert delay.concurrent_duplicates == 0
