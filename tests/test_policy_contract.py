"""One contract suite over every registered policy (STYLE 6; DESIGN §4).

Each test runs once per name in ``available_policies()``: capacity respected, victims are
resident keys, remove/access/hint of unknown keys are safe, weights honoured, resize, bad
capacities rejected — plus a hypothesis state machine checking, after every step, the policy
against a ``dict`` model of what must be resident. Policies that need the future
(``needs_future``, Bélády) are built with the very key sequence the test will play, through
:func:`mlcache.sim.make_policy`, the same door the simulator uses.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mlcache.errors import ConfigError
from mlcache.policies import available_policies, get_policy
from mlcache.sim import make_policy, play

POLICIES = available_policies()


def build(name, capacity, script=None):
    """A policy; Bélády-like ones get ``script`` (the keys the test will request) as the future."""
    return make_policy(name, capacity, list(script) if script is not None else [])


class Model:
    """What must be resident, by the contract: inserted keys minus returned victims."""

    def __init__(self, policy):
        self.policy = policy
        self.weights: dict = {}

    def insert(self, key, weight=1, ts=None):
        victims = self.policy.insert(key, weight, ts)
        assert isinstance(victims, list)
        self.weights[key] = weight
        self.take(victims)
        return victims

    def take(self, victims):
        assert len(victims) == len(set(victims)), f"duplicate victims {victims}"
        for v in victims:
            assert v in self.weights, f"victim {v!r} was not resident"
            del self.weights[v]
            assert v not in self.policy, f"victim {v!r} still tracked"

    def check(self):
        p = self.policy
        assert len(p) == len(self.weights)
        for k in self.weights:
            assert k in p
        assert p.total_weight == sum(self.weights.values())
        assert p.total_weight <= p.capacity


@pytest.mark.parametrize("name", POLICIES)
def test_capacity_respected_and_victims_resident(name):
    rng = random.Random(1)
    script = [rng.randrange(60) for _ in range(2000)]
    m = Model(build(name, 20, script))
    for i, key in enumerate(script):
        if key in m.policy:
            m.policy.access(key, float(i))
        else:
            m.insert(key, 1, float(i))
        assert len(m.policy) <= 20
        m.check()


@pytest.mark.parametrize("name", POLICIES)
def test_unknown_keys_are_safe(name):
    p = build(name, 5, ["a", "b", "c"])
    m = Model(p)
    for k in "abc":
        m.insert(k)
    p.access("zzz", 1.0)
    p.remove("zzz")
    p.hint("zzz", 5.0)
    assert "zzz" not in p
    m.check()
    p.remove("a")
    p.remove("a")  # twice: still safe
    del m.weights["a"]
    m.check()


@pytest.mark.parametrize("name", POLICIES)
def test_weights_honoured(name):
    rng = random.Random(2)
    script = [rng.randrange(40) for _ in range(600)]
    m = Model(build(name, 100, script))
    for key in script:
        weight = 1 + key % 17
        if key in m.policy:
            m.policy.access(key)
        else:
            m.insert(key, weight)
        m.check()
    # heavier than the whole capacity: refused, returned as its own victim
    victims = m.policy.insert("huge", 101)
    assert "huge" in victims and "huge" not in m.policy
    victims.remove("huge")
    m.take(victims)
    m.check()


@pytest.mark.parametrize("name", POLICIES)
def test_reinsert_updates_weight(name):
    m = Model(build(name, 50, ["k", "k", "j"]))
    m.insert("k", 10)
    m.insert("k", 30)  # an existing key: new weight, counts as an access
    m.check()
    assert m.policy.total_weight == 30


@pytest.mark.parametrize("name", POLICIES)
def test_resize(name):
    script = list(range(40))
    m = Model(build(name, 40, script))
    for k in script:
        m.insert(k)
    m.check()
    victims = m.policy.resize(10)
    m.take(victims)
    assert m.policy.capacity == 10 and m.policy.total_weight <= 10
    m.check()
    assert m.policy.resize(30) == []
    m.insert("x")
    m.check()
    with pytest.raises(ConfigError):
        m.policy.resize(0)


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("capacity", [0, -3, 1.5, True])
def test_bad_capacity_is_a_config_error(name, capacity):
    with pytest.raises(ConfigError):
        build(name, capacity, [1])


def test_unknown_policy_lists_the_registered_names():
    with pytest.raises(ConfigError) as err:
        get_policy("no-such-policy")
    for name in POLICIES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", POLICIES)
def test_runs_in_the_simulator(name):
    rng = random.Random(3)
    keys = [int(rng.paretovariate(1.2)) for _ in range(3000)]
    result = play(name, keys, 50)
    assert result.requests == 3000
    assert 0 < result.hits < 3000
    # every miss inserts; at most 50 stay resident: the rest were evicted or refused
    assert result.evictions + result.rejections >= result.misses - 50


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from(["insert", "access", "remove", "hint", "resize"]),
                              st.integers(0, 30), st.integers(1, 12)), max_size=120),
       capacity=st.integers(1, 40))
def test_capacity_never_exceeded(name, ops, capacity):
    script = [k for op, k, _ in ops if op in ("insert", "access")]
    m = Model(build(name, capacity, script))
    for i, (op, key, w) in enumerate(ops):
        if op == "insert":
            m.insert(key, w, float(i))  # a refused newcomer comes back as its own victim
        elif op == "access":
            m.policy.access(key, float(i))
        elif op == "remove":
            m.policy.remove(key)
            m.weights.pop(key, None)
        elif op == "hint":
            m.policy.hint(key, float(i + 5))
        else:
            m.take(m.policy.resize(max(1, w * 3)))
        m.check()


class PolicyMachine(RuleBasedStateMachine):
    """Stateful: interleaved operations on the default heap policy, model-checked each step."""

    def __init__(self):
        super().__init__()
        self.m = Model(build("wtinylfu", 25))

    @rule(key=st.integers(0, 60), weight=st.integers(1, 6))
    def insert(self, key, weight):
        if key in self.m.weights:
            self.m.weights[key] = weight
            self.m.take(self.m.policy.insert(key, weight))
        else:
            self.m.insert(key, weight)

    @rule(key=st.integers(0, 60))
    def access(self, key):
        self.m.policy.access(key)

    @rule(key=st.integers(0, 60))
    def remove(self, key):
        self.m.policy.remove(key)
        self.m.weights.pop(key, None)

    @rule(capacity=st.integers(5, 40))
    def resize(self, capacity):
        self.m.take(self.m.policy.resize(capacity))

    @invariant()
    def consistent(self):
        self.m.check()


TestWTinyLFUMachine = PolicyMachine.TestCase
TestWTinyLFUMachine.settings = settings(max_examples=30, stateful_step_count=60, deadline=None)


def test_wtinylfu_buffered_counts_stay_bounded():
    # Sketch increments are buffered per key and drained every few thousand misses: refused
    # (too heavy) inserts of ever new keys count as misses too, so the buffer stays bounded.
    from mlcache.policies.wtinylfu import WTinyLFUPolicy

    p = WTinyLFUPolicy(100)
    for i in range(20_000):
        assert p.insert(("big", i), 1000) == [("big", i)]
    assert len(p._pending) <= p._drain_size() + 1
    assert p.sketch.frequency_of_mixed(hash((("big", 19_999), p._seed))) >= 0


@pytest.mark.parametrize("name", ["lru", "clock"])
def test_baselines_never_make_the_newcomer_their_victim(name):
    """Regression: CLOCK with every resident entry referenced evicted the key it was inserting."""
    policy = get_policy(name)(3)
    for k in "abc":
        policy.insert(k)
        policy.access(k)
    victims = policy.insert("d")
    assert victims and "d" not in victims and "d" in policy
    assert policy.insert("huge", weight=4) == ["huge"] and len(policy) == 3


def test_wtinylfu_window_kind_does_not_change_decisions(monkeypatch):
    # The window is a plain dict while its target is small and an OrderedDict past
    # _SMALL_WINDOW (WTinyLFUPolicy._shape_window); the representation must never change a
    # decision. A trace whose window target crosses the threshold both ways plays the same
    # (hits and resident keys) with the threshold as shipped, with an OrderedDict window
    # always and with a dict window always.
    from mlcache.bench.policies import _memoize_pass
    from mlcache.policies import wtinylfu
    from mlcache.policies.cachetools_compat import TinyLFUCache
    from mlcache.sim import zipf

    keys = zipf(30_000, n_keys=20_000, alpha=0.9, seed=11).keys
    keys += list(range(50_000, 53_500)) * 2 + zipf(10_000, n_keys=20_000, alpha=0.9, seed=12).keys
    outcomes, kinds = [], set()
    for small in (wtinylfu._SMALL_WINDOW, 0, 10**9):
        monkeypatch.setattr(wtinylfu, "_SMALL_WINDOW", small)
        cache = TinyLFUCache(3000)
        hits = 0
        for i in range(0, len(keys), 500):
            hits += _memoize_pass(cache, keys[i:i + 500])[0]
            kinds.add((small, type(cache._policy._window).__name__))
        result = play(wtinylfu.WTinyLFUPolicy(3000), keys)
        assert result.hits == hits
        outcomes.append((hits, sorted(cache)))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert {k for s, k in kinds if s == 64} == {"dict", "OrderedDict"}  # both ways, as shipped
    assert {k for s, k in kinds if s != 64} == {"dict", "OrderedDict"}
