"""One contract suite over every byte level (DESIGN §3), plus a model test against a dict.

The parameter list is built at import time from the level modules that import, so a new level
(the arena) joins the suite as soon as it exists. Redis is the real server from conftest.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from mlcache.config import DiskConfig, RedisConfig
from mlcache.errors import CapacityError
from mlcache.levels import Level
from mlcache.levels.disk import DiskLevel
from mlcache.levels.redis import RedisLevel

MiB = 1 << 20


@dataclass
class Kind:
    id: str
    build: Callable[["Env", str, dict[str, Any]], Any]
    durable: bool          # data survives close() and a new level object on the same config
    exact_bytes: bool      # used_bytes() is exactly the sum of the value lengths
    needs_redis: bool = False
    fixed_cost: int = 0    # bytes a bounded level charges before holding anything
    entry_cost: int = 1    # how many times its value bytes an entry may cost (blocks, index)

    def bound(self, value_bytes: int) -> int:
        """A max_bytes that holds about ``value_bytes`` of values in this kind of level."""
        return self.fixed_cost + self.entry_cost * value_bytes


def _disk(shards: int) -> Callable[["Env", str, dict[str, Any]], Any]:
    def build(env: "Env", name: str, opts: dict[str, Any]) -> Any:
        return DiskLevel(DiskConfig(path=os.path.join(env.tmp, name), shards=shards, **opts))
    return build


def _redis(env: "Env", name: str, opts: dict[str, Any]) -> Any:
    return RedisLevel(RedisConfig(url=env.redis_url, prefix=f"{env.token}-{name}", **opts))


KINDS = [
    Kind("disk", _disk(1), durable=True, exact_bytes=True),
    Kind("disk-sharded", _disk(3), durable=True, exact_bytes=True),
    Kind("redis", _redis, durable=True, exact_bytes=True, needs_redis=True),
]

try:
    from mlcache.config import ArenaConfig
    from mlcache.levels.arena import ArenaLevel
except ModuleNotFoundError as exc:  # the arena is another module; it joins once it exists
    if exc.name != "mlcache.levels.arena":
        raise
else:
    def _arena(env: "Env", name: str, opts: dict[str, Any]) -> Any:
        opts = dict(opts)
        opts["max_bytes"] = opts.get("max_bytes") or 8 * MiB
        return ArenaLevel(ArenaConfig(block_size=256, buffer_size=4096, **opts))

    from mlcache.levels.arena import LEVEL_OVERHEAD

    KINDS.append(Kind("arena", _arena, durable=False, exact_bytes=False,
                      fixed_cost=LEVEL_OVERHEAD, entry_cost=3))


class Env:
    def __init__(self, kind: Kind, tmp: str, redis_url: str | None) -> None:
        self.kind = kind
        self.tmp = tmp
        self.redis_url = redis_url
        self.token = uuid.uuid4().hex[:10]
        self.opened: list[Any] = []

    def make(self, name: str = "main", **opts: Any) -> Any:
        level = self.kind.build(self, name, opts)
        self.opened.append(level)
        return level

    def close(self) -> None:
        for level in self.opened:
            level.close()


@pytest.fixture(params=KINDS, ids=[k.id for k in KINDS])
def env(request, tmp_path):
    kind: Kind = request.param
    url = request.getfixturevalue("redis_url") if kind.needs_redis else None
    e = Env(kind, str(tmp_path), url)
    yield e
    e.close()


def contents(level: Any, keys: list[bytes]) -> dict[bytes, bytes]:
    return {k: v for k, v in zip(keys, level.get_many(keys)) if v is not None}


# -- the basics -------------------------------------------------------------------------------

def test_is_a_level(env):
    level = env.make()
    assert isinstance(level, Level)
    assert isinstance(level.name, str) and level.name
    assert level.may_evict is True and level.lossy is False


def test_batches_roundtrip_and_missing_keys_are_none(env):
    level = env.make()
    items = [(b"k%d" % i, b"v%d" % i * (i + 1)) for i in range(50)]
    assert level.put_many(items) == []
    keys = [b"missing-1"] + [k for k, _ in items] + [b"missing-2"]
    got = level.get_many(keys)
    assert got[0] is None and got[-1] is None
    assert got[1:-1] == [v for _, v in items]
    assert level.get_many([]) == []
    assert level.put_many([]) == []
    level.delete_many([])


def test_overwrite_and_duplicate_keys_in_a_batch(env):
    level = env.make()
    level.put_many([(b"a", b"old"), (b"b", b"bee")])
    level.put_many([(b"a", b"first"), (b"a", b"newer and longer")])
    assert level.get_many([b"a", b"b"]) == [b"newer and longer", b"bee"]
    if env.kind.exact_bytes:
        assert level.used_bytes() == len(b"newer and longer") + 3


def test_delete_many(env):
    level = env.make()
    level.put_many([(b"x%d" % i, b"v") for i in range(10)])
    level.delete_many([b"x1", b"x3", b"x3", b"never-there"])
    got = level.get_many([b"x%d" % i for i in range(10)])
    assert [g is None for g in got] == [i in (1, 3) for i in range(10)]
    assert b"x1" not in set(level.scan(b""))
    level.delete_many([b"x%d" % i for i in range(10)])
    assert list(level.scan(b"")) == []
    if env.kind.exact_bytes:
        assert level.used_bytes() == 0


def test_scan_by_prefix_is_exact(env):
    level = env.make()
    keys = [b"a", b"ab", b"abc", b"b", b"a\x00", b"a\xff", b"a\xff\xff", b"a*", b"a?", b"[a]",
            b"a\\", b"ba", b"\xff"]
    level.put_many([(k, b"v") for k in keys])
    assert sorted(level.scan(b"")) == sorted(keys)
    assert sorted(level.scan(b"a")) == sorted(k for k in keys if k.startswith(b"a"))
    assert sorted(level.scan(b"ab")) == [b"ab", b"abc"]
    assert sorted(level.scan(b"a*")) == [b"a*"]          # glob characters are literal
    assert sorted(level.scan(b"a?")) == [b"a?"]
    assert sorted(level.scan(b"[a")) == [b"[a]"]
    assert sorted(level.scan(b"a\\")) == [b"a\\"]
    assert sorted(level.scan(b"a\xff")) == [b"a\xff", b"a\xff\xff"]
    assert sorted(level.scan(b"\xff")) == [b"\xff"]
    assert list(level.scan(b"zzz")) == []


def test_scan_many_keys(env):
    level = env.make()
    keys = [b"p%05d" % i for i in range(1200)]
    level.put_many([(k, b"") for k in keys])
    level.put_many([(b"q%d" % i, b"") for i in range(10)])
    assert sorted(level.scan(b"p")) == keys


def test_binary_safe_keys_and_values(env):
    level = env.make()
    every_byte = bytes(range(256))
    items = [(bytes([i]), bytes([i]) * 3) for i in range(256)]
    items += [(every_byte, every_byte), (b"empty", b""), (b"nul\x00key", b"\x00\x00")]
    level.put_many(items)
    keys = [k for k, _ in items]
    assert level.get_many(keys) == [v for _, v in items]
    assert sorted(level.scan(b"")) == sorted(keys)
    assert level.get_many([b"empty"]) == [b""]           # an empty value is not a miss


def test_large_values(env):
    level = env.make()
    big = os.urandom(MiB)
    level.put_many([(b"big", big), (b"small", b"s")])
    assert level.get_many([b"big", b"small"]) == [big, b"s"]
    level.put_many([(b"big", big[::-1])])
    assert level.get_many([b"big"]) == [big[::-1]]


# -- bounds -----------------------------------------------------------------------------------

def test_bounded_level_returns_victims_and_stays_under_its_bound(env):
    bound = env.kind.bound(20_000)
    level = env.make(max_bytes=bound)
    written: dict[bytes, bytes] = {}
    below: dict[bytes, bytes] = {}
    for batch in range(10 * env.kind.entry_cost):
        items = [(b"e%03d" % (batch * 10 + i), os.urandom(1000)) for i in range(10)]
        victims = level.put_many(items)
        written.update(items)
        for key, value in victims:
            assert value == written[key]
            below[key] = value
        assert level.used_bytes() <= bound
    assert below, "the level overflowed"
    here = contents(level, list(written))
    assert here, "a bounded level keeps what fits"
    assert not set(here) & set(below), "a victim is not left behind in the level"
    assert {**here, **below} == written, "every entry is in the level or was handed back"


def test_value_bigger_than_the_level_is_handed_back_or_refused(env):
    bound = env.kind.bound(5_000)
    level = env.make(max_bytes=bound)
    level.put_many([(b"small", b"s" * 100), (b"huge", b"old")])
    huge = os.urandom(bound + 1)
    try:
        victims = level.put_many([(b"huge", huge)])
    except CapacityError as exc:      # refused: nothing changed
        assert exc.level == level.name
        assert level.get_many([b"huge"]) == [b"old"]
    else:                             # passed straight through, the stale copy gone
        assert victims == [(b"huge", huge)]
        assert level.get_many([b"huge"]) == [None]
    assert level.get_many([b"small"]) == [b"s" * 100]
    assert level.used_bytes() <= bound


def fill_store_of_record(level: Any) -> dict[bytes, bytes]:
    """Write 1000-byte entries to a store of record until it refuses one; return what it holds."""
    held: dict[bytes, bytes] = {}
    for i in range(10_000):
        key, value = b"s%04d" % i, os.urandom(1000)
        try:
            assert level.put_many([(key, value)]) == []
        except CapacityError:
            return held
        held[key] = value
    raise AssertionError("a bounded store of record never filled up")


def test_store_of_record_raises_capacity_error_and_loses_nothing(env):
    bound = env.kind.bound(10_000)
    level = env.make(max_bytes=bound)
    level.may_evict = False
    held = fill_store_of_record(level)
    assert len(held) >= 3
    used = level.used_bytes()
    first = next(iter(held))
    overflow = [(first, os.urandom(2000))] + [(b"n%02d" % i, os.urandom(1000)) for i in range(6)]
    with pytest.raises(CapacityError) as info:
        level.put_many(overflow)
    assert info.value.level == level.name
    assert contents(level, list(held) + [k for k, _ in overflow]) == held
    assert level.used_bytes() == used
    with pytest.raises(CapacityError):
        level.put_many([(b"too-big", os.urandom(bound + 1))])
    assert contents(level, list(held)) == held
    level.delete_many([first])           # room again: writes succeed
    assert level.put_many([(b"again", b"x" * 500)]) == []


def test_capacity_error_names_level_and_sizes(tmp_path, redis_url):
    for level in (DiskLevel(DiskConfig(path=str(tmp_path / "d"), max_bytes=1000)),
                  RedisLevel(RedisConfig(url=redis_url, prefix="cap", max_bytes=1000))):
        level.may_evict = False
        level.put_many([(b"a", b"x" * 600)])
        expected = r"'%s' is full: 600 bytes used \+ 500" % level.name
        with pytest.raises(CapacityError, match=expected):
            level.put_many([(b"b", b"y" * 500)])
        level.close()


def test_lossy_store_of_record_drops_instead_of_raising(env):
    bound = env.kind.bound(5_000)
    level = env.make(max_bytes=bound, lossy=True)
    level.may_evict = False
    for i in range(40):
        assert level.put_many([(b"l%02d" % i, os.urandom(1000))]) == []
        assert level.used_bytes() <= bound
    assert 0 < len(contents(level, [b"l%02d" % i for i in range(40)])) < 40


# -- durability and isolation -----------------------------------------------------------------

def test_close_and_reopen_keeps_data(env):
    if not env.kind.durable:
        level = env.make()
        level.put_many([(b"k", b"v")])
        level.close()
        return
    level = env.make("durable")
    items = [(b"d%d" % i, os.urandom(100 + i)) for i in range(100)] + [(b"big", os.urandom(MiB))]
    level.put_many(items)
    level.delete_many([b"d7"])
    level.sync()
    level.close()
    level.close()          # idempotent
    again = env.make("durable")
    expected = {k: v for k, v in items if k != b"d7"}
    assert contents(again, [k for k, _ in items]) == expected
    assert sorted(again.scan(b"")) == sorted(expected)


def test_two_prefixes_on_one_redis_are_isolated(redis_url):
    a = RedisLevel(RedisConfig(url=redis_url, prefix="a"))
    ab = RedisLevel(RedisConfig(url=redis_url, prefix="ab", max_bytes=10_000))
    try:
        a.put_many([(b"k", b"from-a"), (b"b:k", b"tricky")])
        ab.put_many([(b"k", b"from-ab")])
        assert a.get_many([b"k"]) == [b"from-a"]
        assert ab.get_many([b"k", b"b:k"]) == [b"from-ab", None]
        assert sorted(a.scan(b"")) == [b"b:k", b"k"]
        assert list(ab.scan(b"")) == [b"k"]
        assert ab.used_bytes() == len(b"from-ab")
        assert a.used_bytes() == len(b"from-a") + len(b"tricky")
        ab.delete_many([b"k"])
        assert a.get_many([b"k"]) == [b"from-a"]
    finally:
        a.close()
        ab.close()


def test_two_disk_directories_are_isolated(tmp_path):
    one = DiskLevel(DiskConfig(path=str(tmp_path / "one")))
    two = DiskLevel(DiskConfig(path=str(tmp_path / "two")))
    try:
        one.put_many([(b"k", b"1")])
        assert two.get_many([b"k"]) == [None]
        assert oct(os.stat(one.path).st_mode & 0o777) == oct(0o700)
    finally:
        one.close()
        two.close()


def test_redis_down_is_level_unavailable_and_retryable(redis_server):
    from mlcache.errors import LevelUnavailableError

    level = RedisLevel(RedisConfig(url="redis://:pw@127.0.0.1:1/0", retries=1))
    with pytest.raises(LevelUnavailableError) as info:
        level.put_many([(b"k", b"v")])
    assert info.value.level == "redis" and info.value.retryable
    assert "pw" not in str(info.value)
    level.close()


# -- model-based: every level against a dict --------------------------------------------------

KEYS = st.binary(min_size=1, max_size=3).map(lambda b: b"m" + b)
VALUES = st.binary(max_size=400)


class LevelModel(RuleBasedStateMachine):
    """Random batches against a dict. Bounded variants hand victims 'below'; no key is lost."""

    factory: Callable[[], Any]
    bound: int | None = None      # the level's max_bytes, if bounded

    def __init__(self) -> None:
        super().__init__()
        self.level = type(self).factory()
        self.model: dict[bytes, bytes] = {}
        self.below: dict[bytes, bytes] = {}

    @rule(items=st.lists(st.tuples(KEYS, VALUES), max_size=12))
    def put_many(self, items):
        victims = self.level.put_many(items)
        for key, value in items:
            self.model[key] = value
            self.below.pop(key, None)
        if self.bound is None:
            assert victims == []
        for key, value in victims:
            assert self.model[key] == value
            self.below[key] = value

    @rule(keys=st.lists(KEYS, max_size=12))
    def delete_many(self, keys):
        self.level.delete_many(keys)
        for key in keys:
            self.model.pop(key, None)
            self.below.pop(key, None)

    @rule(keys=st.lists(KEYS, max_size=12))
    def get_many(self, keys):
        for key, got in zip(keys, self.level.get_many(keys)):
            if got is not None:
                assert got == self.model[key]
            else:
                assert key not in self.model or key in self.below

    @rule(prefix=st.binary(max_size=2).map(lambda b: b"m" + b))
    def scan(self, prefix):
        here = set(self.level.scan(prefix))
        expected = {k for k in self.model if k.startswith(prefix) and k not in self.below}
        assert here == expected

    @invariant()
    def nothing_lost_and_bound_kept(self):
        keys = list(self.model)
        for key, got in zip(keys, self.level.get_many(keys)):
            assert (got if got is not None else self.below.get(key)) == self.model[key]
        if self.bound is not None:
            assert self.level.used_bytes() <= self.bound

    def teardown(self) -> None:
        self.level.close()


@pytest.mark.parametrize("bound", [None, 2_000], ids=["unbounded", "bounded"])
def test_level_matches_dict_model(env, bound):
    counter = iter(range(10**6))

    def factory() -> Any:
        opts = {} if bound is None else {"max_bytes": env.kind.bound(bound)}
        return env.kind.build(env, f"model{next(counter)}", opts)

    limit = None if bound is None else env.kind.bound(bound)
    machine = type("Machine", (LevelModel,), {"factory": staticmethod(factory), "bound": limit})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=15, stateful_step_count=25, deadline=None))


# -- concurrency, processes, failures ---------------------------------------------------------

def test_threads_share_a_bounded_level_and_the_count_stays_exact(env):
    import threading

    bound = env.kind.bound(30_000)
    level = env.make(max_bytes=bound)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                items = [(b"t%d-%d-%d" % (t, i, j), os.urandom(100 + 37 * j)) for j in range(5)]
                level.put_many(items)
                level.get_many([k for k, _ in items] + [b"t0-0-0"])
                if i % 7 == 0:
                    level.delete_many([items[0][0]])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert level.used_bytes() <= bound
    if env.kind.exact_bytes:
        stored = list(level.scan(b""))
        assert level.used_bytes() == sum(len(v) for v in level.get_many(stored))


def _child_uses_level(level: Any, queue: Any) -> None:
    try:
        level.put_many([(b"from-child", b"%d" % os.getpid())])
        queue.put(level.get_many([b"from-parent"])[0])
    except BaseException as exc:
        queue.put(repr(exc))


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_level_created_before_fork_works_in_both_processes(kind, tmp_path, request):
    import multiprocessing

    if kind == "redis":
        level = RedisLevel(RedisConfig(url=request.getfixturevalue("redis_url"), prefix="fork"))
    else:
        level = DiskLevel(DiskConfig(path=str(tmp_path / "fork")))
    try:
        level.put_many([(b"from-parent", b"hello")])   # the parent's connection exists now
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_uses_level, args=(level, queue))
        child.start()
        reply = queue.get(timeout=60)
        child.join(60)
        assert reply == b"hello"
        assert child.exitcode == 0
        got = level.get_many([b"from-child", b"from-parent"])   # the parent still works
        assert got[0] == b"%d" % child.pid and got[1] == b"hello"
    finally:
        level.close()


def test_disk_path_that_is_a_file_is_level_unavailable(tmp_path):
    from mlcache.errors import LevelUnavailableError

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(LevelUnavailableError) as info:
        DiskLevel(DiskConfig(path=str(blocker / "disk")))
    assert info.value.level == "disk"


def test_embedded_redis_starts_and_stops_with_the_level():
    level = RedisLevel(RedisConfig(url="embedded", prefix="emb"))
    level.put_many([(b"k", b"v")])
    assert level.get_many([b"k"]) == [b"v"]
    server = level._server
    assert server is not None and server.proc.poll() is None
    proc = server.proc
    level.close()
    assert proc.poll() is not None


@pytest.mark.parametrize("shards", [1, 3])
def test_disk_leaves_no_orphan_value_files(tmp_path, shards):
    level = DiskLevel(DiskConfig(path=str(tmp_path / "files"), shards=shards))
    big = os.urandom(100_000)                       # above diskcache's file threshold
    level.put_many([(b"a", big), (b"b", big), (b"c", big), (b"d", big)])
    level.put_many([(b"a", b"small now")])          # file -> inside SQLite
    level.delete_many([b"b"])                       # file removed
    level.put_many([(b"c", big[::-1])])             # file -> new file
    level.may_evict = True
    assert level.get_many([b"a", b"b", b"c", b"d"]) == [b"small now", None, big[::-1], big]
    assert [str(w.message) for w in level.cache.check()] == []
    files = [f for _, _, names in os.walk(level.path) for f in names if f.endswith(".val")]
    assert len(files) == 2
    assert level.used_bytes() == len(b"small now") + 2 * len(big)
    level.close()


def test_redis_outage_raises_then_the_level_recovers():
    from mlcache._redis_server import RedisServer
    from mlcache.errors import LevelUnavailableError

    server = RedisServer().start()
    level = RedisLevel(RedisConfig(url=server.url, prefix="outage", retries=1,
                                   socket_timeout=2.0, max_bytes=10_000))
    try:
        level.put_many([(b"k", b"before")])
        server.kill()
        for call in (lambda: level.get_many([b"k"]), lambda: level.put_many([(b"k", b"x")]),
                     lambda: level.delete_many([b"k"])):
            with pytest.raises(LevelUnavailableError) as info:
                call()
            assert info.value.retryable and info.value.level == "redis"
        server.start()                     # same port, empty (no persistence configured)
        assert level.get_many([b"k"]) == [None]
        assert level.put_many([(b"k", b"after")]) == []
        assert level.get_many([b"k"]) == [b"after"]
        assert level.used_bytes() == len(b"after")
    finally:
        level.close()
        server.cleanup()


def test_rediss_url_builds_a_tls_pool_with_the_configured_files(tmp_path):
    import redis

    level = RedisLevel(RedisConfig(url="rediss://user:secret@localhost:6380/2", max_connections=3,
                                   ssl_ca_certs=str(tmp_path / "ca.pem"),
                                   ssl_certfile=str(tmp_path / "client.pem"),
                                   ssl_keyfile=str(tmp_path / "client.key")))
    pool = level._connect().connection_pool    # lazy: builds the pool, connects to nothing
    assert pool.connection_class is redis.SSLConnection
    kw = pool.connection_kwargs
    assert kw["ssl_ca_certs"].endswith("ca.pem") and kw["ssl_keyfile"].endswith("client.key")
    assert kw["username"] == "user" and kw["password"] == "secret" and kw["db"] == 2
    assert pool.max_connections == 3
    assert "secret" not in repr(level)
    level.close()


def _fill_from_process(config: Any, tag: int, queue: Any) -> None:
    try:
        level = config.build()
        handed_back = []
        for i in range(60):
            victims = level.put_many([(b"p%d-%02d" % (tag, i), os.urandom(500 + 10 * i))])
            handed_back += [k for k, _ in victims]
        level.close()
        queue.put(handed_back)
    except BaseException as exc:
        queue.put(repr(exc))


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_processes_sharing_a_bounded_level_respect_one_bound(kind, tmp_path, request):
    import multiprocessing

    bound = 20_000
    if kind == "redis":
        config: Any = RedisConfig(url=request.getfixturevalue("redis_url"), prefix="procs",
                                  max_bytes=bound)
    else:
        config = DiskConfig(path=str(tmp_path / "procs"), max_bytes=bound, shards=2)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fill_from_process, args=(config, t, queue)) for t in range(3)]
    for p in procs:
        p.start()
    replies = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert all(isinstance(r, list) for r in replies), replies
    level = config.build()
    try:
        stored = list(level.scan(b""))
        assert level.used_bytes() <= bound
        assert level.used_bytes() == sum(len(v) for v in level.get_many(stored))
        handed_back = [k for r in replies for k in r]
        assert len(set(handed_back)) == len(handed_back)
        assert sorted(stored + handed_back) == sorted(b"p%d-%02d" % (t, i)
                                                      for t in range(3) for i in range(60))
    finally:
        level.close()


def _write_then_wait(path: str, ready: Any) -> None:
    level = DiskLevel(DiskConfig(path=path))
    level.put_many([(b"k%d" % i, b"v%d" % i) for i in range(100)])
    level.put_many([(b"big", b"b" * 100_000)])
    ready.set()
    import time as _time

    _time.sleep(60)


def test_disk_writes_survive_the_writer_being_killed(tmp_path):
    import multiprocessing
    import signal

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    path = str(tmp_path / "killed")
    child = ctx.Process(target=_write_then_wait, args=(path, ready))
    child.start()
    assert ready.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    level = DiskLevel(DiskConfig(path=path))
    try:
        assert level.get_many([b"k7", b"k99", b"big"]) == [b"v7", b"v99", b"b" * 100_000]
        assert level.used_bytes() == sum(len(b"v%d" % i) for i in range(100)) + 100_000
    finally:
        level.close()


def test_disk_refuses_a_directory_written_with_another_shard_count(tmp_path):
    from mlcache.errors import ConfigError

    for written, opened in ((1, 3), (3, 1), (3, 2)):
        path = str(tmp_path / f"s{written}{opened}")
        level = DiskLevel(DiskConfig(path=path, shards=written))
        level.put_many([(b"k", b"v")])
        level.close()
        with pytest.raises(ConfigError) as info:
            DiskLevel(DiskConfig(path=path, shards=opened))
        assert info.value.field == "disk.shards"
        if written > 1 and opened > 1:
            assert f"shards={written}" in str(info.value)
        again = DiskLevel(DiskConfig(path=path, shards=written))
        assert again.get_many([b"k"]) == [b"v"]
        again.close()
