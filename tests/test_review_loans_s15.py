"""Review s15: held values (mlcache._loans) across the manager's API and the structures,
against a plain dict of expected values, with heaps of 1-8 entries (or a few hundred bytes) so
that every value is evicted and read back: values held across other calls, changed after their
eviction, dropped (gc.collect()), one object under two keys, keys deleted or overwritten while
their old value is held, flush/checkpoint/close and reopen. (Prefetching is
tests/test_review_prefetch_s15.py's.)"""
from __future__ import annotations

import enum
import gc
import pickle
import random
import uuid

import pytest

from mlcache import ArenaConfig, CacheConfig, CacheManager, DiskConfig, HeapConfig, RedisConfig


def _config(tmp_path, redis_url, layout, policy="lru", entries=4, nbytes=None):
    ns = "rl" + uuid.uuid4().hex[:8]
    heap = HeapConfig(policy=policy, max_entries=None if nbytes else entries, max_bytes=nbytes)
    path = tmp_path / uuid.uuid4().hex[:6]
    if layout == "disk":
        levels = (DiskConfig(path=str(path)),)
    elif layout == "redis":
        levels = (RedisConfig(url=redis_url, prefix=ns),)
    elif layout == "redis-disk":
        levels = (RedisConfig(url=redis_url, prefix=ns, max_bytes=3000),
                  DiskConfig(path=str(path)))
    else:
        levels = (ArenaConfig(max_bytes=24000, block_size=64, buffer_size=512),
                  DiskConfig(path=str(path)))
    return CacheConfig(heap=heap, levels=levels, namespace=ns)


def _copy(value):
    """A copy that shares no object with ``value`` (deepcopy returns a tuple of immutables
    itself, and the model holding it would count as the caller holding it)."""
    return pickle.loads(pickle.dumps(value))


def _lent(m):
    return m.stats()["levels"]["heap"]["lent"]


# -- one object under two keys, dropped --------------------------------------------------------

@pytest.mark.parametrize("layout", ["disk", "redis-disk"])
def test_an_object_lent_under_two_keys_is_let_go_once_the_caller_drops_it(
        tmp_path, redis_url, layout):
    """Copying a value to a second key (v = get(a); put(b, v)) left both keys' loans alive
    for good once the heap evicted them: each loan's reference counted as "the caller holds
    it" in the other's look, so no flush ever forgot them (1,996 lent objects after copying
    1,000 values and dropping every one; 3,996 for 1,000 objects put under two keys each)."""
    config = _config(tmp_path, redis_url, layout)
    with CacheManager(config) as m:
        m.put_many({("src", i): [i] for i in range(200)})
        m.flush()
        for i in range(200):
            v = m.get(("src", i))
            m.put(("dst", i), v)
        for i in range(200):
            w = [i, i]
            m.put(("a", i), w)
            m.put(("b", i), w)
        del v, w
        gc.collect()
        m.flush()
        assert _lent(m) <= 8     # at most what the heap's entries still share
        # still a dict's semantics while held: one object, both keys, a change to it is kept
        shared = m.get(("src", 7))
        m.put(("dst", 7), shared)
        for i in range(20):
            m.put(("other", i), [i])
        shared.append("x")
        gc.collect()
        m.flush()
        assert m.get(("src", 7)) == [7, "x"] and m.get(("dst", 7)) == [7, "x"]
        assert m.get(("src", 7)) is shared
        del shared
    with CacheManager(config) as again:
        assert again.get(("src", 7)) == [7, "x"] == again.get(("dst", 7))
        assert again.get(("a", 3)) == [3, 3] == again.get(("b", 3))


# -- a random program against a dict -----------------------------------------------------------

class _Program:
    """Random operations on a manager and on a plain dict of expected values; the values the
    program holds are changed in place at any time (after their eviction too), also through a
    key whose value was since overwritten or deleted (then no key sees it), and one object is
    put under a second key (then both see every change, as with a dict)."""

    KEYS = tuple(range(10))

    def __init__(self, seed, config, space=None):
        self.rnd = random.Random(seed)
        self.config = config
        self.space = space   # a namespace to run in (another one's writes evict its values)
        self.m = CacheManager(config)
        self.s = self.m if space is None else self.m.namespace(space)
        self.model = {}    # key -> expected value (a deep copy)
        self.held = {}     # key -> the object that is its value, held by the program
        self.stale = []    # objects held that were once a key's value
        self.kept = []     # objects the program let go of that are the value of two keys
        self.of = {}       # key -> id() of its value object, while the program holds that object
        self.log = []

    def fail(self, what):
        raise AssertionError(f"{what}\n  " + "\n  ".join(self.log[-25:]))

    def saw(self, k, v):
        if v != self.model.get(k):
            self.fail(f"key {k}: {v!r}, expected {self.model.get(k)!r}")
        if v is None or isinstance(v, int):
            return
        if k in self.held and self.held[k] is not v:
            self.fail(f"key {k}: not the object held")
        self.held[k] = v
        self.of[k] = id(v)

    def replaced(self, k):
        self.of.pop(k, None)
        if k in self.held:
            self.stale.append(self.held.pop(k))

    def changed(self, obj):
        for k, ident in self.of.items():
            if ident == id(obj):
                self.model[k] = _copy(obj)

    def let_go(self, objs):
        """Forget the ids of objects the program no longer holds (ids are reused). One that
        is the value of two keys is kept: a dict keeps the two one object for good, the cache
        only while the object is alive (in the heap, or lent), so either outcome would be
        right once it is dropped."""
        for obj in objs:
            if sum(ident == id(obj) for ident in self.of.values()) > 1:
                self.kept.append(obj)
            elif not any(o is obj for o in [*self.held.values(), *self.stale, *self.kept]):
                for k in [k for k, ident in self.of.items() if ident == id(obj)]:
                    del self.of[k]

    def step(self, i):
        rnd, m, keys = self.rnd, self.s, self.KEYS
        k = rnd.choice(keys)
        op = rnd.random()
        if op < 0.22:
            self.log.append(f"get {k}")
            self.saw(k, m.get(k))
        elif op < 0.30:
            ks = rnd.sample(keys, rnd.randint(1, 6))
            self.log.append(f"get_many {ks}")
            got = m.get_many(ks)
            for kk in ks:
                self.saw(kk, got.get(kk))
        elif op < 0.42:
            v = rnd.choice([[i], {"n": i}, i, [i, [i]], ("t", i)])
            self.log.append(f"put {k} {v!r}")
            m.put(k, v)
            self.model[k] = _copy(v)
            self.replaced(k)
        elif op < 0.47:
            ks = rnd.sample(keys, rnd.randint(1, 6))
            self.log.append(f"put_many {ks}")
            m.put_many({kk: [i, kk] for kk in ks})
            for kk in ks:
                self.model[kk] = [i, kk]
                self.replaced(kk)
        elif op < 0.53:
            ks = [k] if rnd.random() < 0.7 else rnd.sample(keys, 3)
            self.log.append(f"delete {ks}")
            m.delete(k) if len(ks) == 1 else m.delete_many(ks)
            for kk in ks:
                self.model.pop(kk, None)
                self.replaced(kk)
        elif op < 0.70:
            pool = list(self.held.values()) if rnd.random() < 0.8 else self.stale
            pool = [o for o in pool if isinstance(o, (list, dict))]
            if pool:
                obj = rnd.choice(pool)
                self.log.append(f"change {obj!r}")
                if isinstance(obj, list):
                    obj.append(i)
                else:
                    obj[f"k{i}"] = i
                self.changed(obj)
        elif op < 0.76:
            if self.held:
                kk = rnd.choice(sorted(self.held))
                j = rnd.choice(keys)
                if j != kk:
                    obj = self.held[kk]
                    self.log.append(f"put {j} the object of {kk}")
                    m.put(j, obj)
                    self.model[j] = _copy(obj)
                    self.replaced(j)
                    self.held[j] = obj
                    self.of[j] = id(obj)
        elif op < 0.84:
            dropped = []
            if self.held:
                kk = rnd.choice(sorted(self.held))
                self.log.append(f"drop {kk}")
                dropped.append(self.held.pop(kk))
            if rnd.random() < 0.3:
                self.log.append("drop stale")
                dropped += self.stale
                self.stale = []
            self.let_go(dropped)
            del dropped
            if rnd.random() < 0.5:
                gc.collect()
        elif op < 0.89:
            self.log.append("flush")
            m.flush()
        elif op < 0.92:
            self.log.append("checkpoint")
            m.checkpoint()
        elif op < 0.94 and self.space is not None:
            other = self.m.namespace(self.space + "b")   # its prefix extends ours
            self.log.append("another namespace")
            other.put(i % 3, [i])
            other.get((i + 1) % 3)
            if rnd.random() < 0.3:
                self.m.invalidate_local(self.space + "b")
        elif op < 0.96:
            self.log.append("keys")
            if sorted(m.keys()) != sorted(self.model):
                self.fail(f"keys {sorted(m.keys())}, expected {sorted(self.model)}")
        else:
            self.log.append("close, reopen")
            self.reopen()
        # a key is in the heap or lent, never both (a read would miss the newer one)
        loans = self.m._cold.loans
        both = loans.keys() & self.m._data.keys()
        if both:
            self.fail(f"lent and resident: {both}")
        # and the loans' count of each object's loans is exact (see Loans.lend)
        by_id: dict[int, int] = {}
        for loan in loans.values():
            by_id[id(loan[0])] = by_id.get(id(loan[0]), 0) + 1
        if by_id != loans.lent or loans.shared != sum(n > 1 for n in by_id.values()):
            self.fail(f"loans counted {loans.lent} ({loans.shared} shared), lent {by_id}")

    def reopen(self):
        self.m.close()
        self.held.clear()
        self.stale.clear()
        self.kept.clear()
        self.of.clear()
        self.m = CacheManager(self.config)
        self.s = self.m if self.space is None else self.m.namespace(self.space)

    def finish(self):
        self.held.clear()
        self.stale.clear()
        self.kept.clear()
        self.of.clear()
        gc.collect()
        self.m.flush()
        # what is still lent is kept by the heap's own entries (an object under two keys)
        resident = {id(v) for v in self.m._data.values()}
        kept = [kb for kb, loan in self.m._cold.loans.items() if id(loan[0]) not in resident]
        assert not kept, f"lent, held by nobody: {kept}"
        self.reopen()
        for k in self.KEYS:
            self.saw(k, self.s.get(k))
        self.m.close()


CASES = [  # (layout, policy, heap entries, heap bytes, namespace)
    ("disk", "lru", 1, None, None), ("disk", "clock", 3, None, "a"),
    ("disk", "wtinylfu", 5, None, None), ("disk", "tac", 8, None, "a"),
    ("disk", "lru", None, 300, None), ("redis", "lru", 2, None, "a"),
    ("redis", "wtinylfu", None, 500, None), ("redis-disk", "lru", 3, None, "a"),
    ("redis-disk", "clock", None, 250, None), ("arena-disk", "lru", 4, None, "a"),
    ("arena-disk", "tac", 2, None, None), ("disk", "clock", None, 800, "a"),
]


@pytest.mark.parametrize("layout,policy,entries,nbytes,space", CASES)
def test_a_random_program_holding_values_against_a_dict(tmp_path, redis_url, layout, policy,
                                                        entries, nbytes, space):
    case = (layout, policy, entries, nbytes, space)
    for seed in range(2):
        config = _config(tmp_path, redis_url, layout, policy, entries, nbytes)
        program = _Program(CASES.index(case) * 10 + seed, config, space)
        for i in range(250):
            program.step(i)
        program.finish()


# -- threads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["disk", "redis-disk"])
def test_threads_holding_their_own_keys_while_another_flushes(tmp_path, redis_url, layout):
    """Three threads hold, change, overwrite and delete their own keys (each against its own
    dict) in a heap of 3 entries, so each one's reads and writes evict the others' values while
    they are held; a fourth flushes and checkpoints meanwhile; then close and reopen."""
    import threading

    config = _config(tmp_path, redis_url, layout, "lru", 3)
    m = CacheManager(config)
    models: list[dict] = [{} for _ in range(3)]
    errors: list[BaseException] = []
    done = threading.Event()

    def worker(t):
        rnd, model, held = random.Random(t), models[t], {}
        try:
            for i in range(400):
                k = (t, rnd.randrange(6))
                op = rnd.random()
                if op < 0.35:
                    v = m.get(k)
                    assert v == model.get(k), (k, v, model.get(k))
                    if k in held:
                        assert v is held[k], k
                    elif v is not None:
                        held[k] = v
                elif op < 0.65:
                    if held:
                        kk = rnd.choice(sorted(held))
                        held[kk].append(i)
                        model[kk] = list(held[kk])
                elif op < 0.75:
                    m.put(k, [t, i])
                    model[k] = [t, i]
                    held.pop(k, None)
                elif op < 0.82:
                    m.delete(k)
                    model.pop(k, None)
                    held.pop(k, None)
                else:
                    held.pop(rnd.choice(sorted(held)), None) if held else None
                    if rnd.random() < 0.2:
                        gc.collect()
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    def flusher():
        n = 0
        while not done.is_set():
            m.checkpoint() if n % 3 == 0 else m.flush()
            n += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    f = threading.Thread(target=flusher)
    f.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done.set()
    f.join()
    assert not errors, errors
    m.close()
    with CacheManager(config) as again:
        for model in models:
            for k in {(t, j) for t in range(3) for j in range(6)}:
                if (k[0] == models.index(model)):
                    assert again.get(k) == model.get(k), k


# -- values every key shares (singletons) ----------------------------------------------------

class _Status(enum.Enum):
    ACTIVE = 1


@pytest.mark.parametrize("value", [(), _Status.ACTIVE, _Status, len, Ellipsis],
                         ids=["empty-tuple", "enum-member", "class", "builtin", "ellipsis"])
def test_values_decoded_to_one_shared_object_are_not_lent(tmp_path, redis_url, value):
    """A value that decodes to one shared object (the empty tuple; an enum member, a class, a
    function: pickled by reference) has a reference count no caller explains, so every key
    holding it was lent at its eviction and never let go: 496 of 500 keys read through a heap
    of 4 stayed lent with nothing held, one loan per key ever read, each encoded again by
    every flush. Nothing is lost by not lending it: it cannot change in a way its encoding
    shows, and a read gives back the very same object."""
    config = _config(tmp_path, redis_url, "disk")
    with CacheManager(config) as m:
        m.put_many({("k", i): value for i in range(300)})
        m.flush()
        for i in range(300):
            assert m.get(("k", i)) is value
        m.put(("new", 0), value)
        for i in range(20):
            m.put(("other", i), [i])
        gc.collect()
        m.flush()
        assert _lent(m) == 0
        assert m.get(("k", 5)) is value and m.get(("new", 0)) is value
