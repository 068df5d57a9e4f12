"""A TCP proxy that holds every transfer back by a fixed delay, each way: a remote server's
round trip in front of a local one (``mlcache bench prefetch --redis-delay-ms``).

It runs in a process of its own (``python -m mlcache.bench._proxy TARGET_PORT DELAY_MS``, which
prints the port it listens on), so that its work shares neither the benchmark's GIL nor its
CPU accounting. Each direction of each connection is a reader that stamps what it receives with
the time it is due and a writer that sends it then, in order: transfers in flight overlap (a
pipelined request is not delayed twice), as on a network link with that latency.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

__all__ = ["DelayProxy"]


class DelayProxy:
    """Start with :meth:`start`, connect to :attr:`port` (or :attr:`url` for Redis), stop with
    :meth:`stop`."""

    def __init__(self, target_port: int, delay_ms: float, host: str = "127.0.0.1") -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        self.target_port = target_port
        self.delay_ms = delay_ms
        self.host = host
        self.port: int | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> "DelayProxy":
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mlcache.bench._proxy", str(self.target_port),
             str(self.delay_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the delay proxy did not start (it printed {line!r})")
        self.port = int(line)
        return self

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        writer.close()


async def _serve(target_port: int, delay: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_forward(client_r, server_w, delay),
                             _forward(server_r, client_w, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    # the parent holds our stdin: when it ends (the parent stopped us, or died), so do we
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.fileno()
    loop.add_reader(stdin, lambda: os.read(stdin, 1 << 12) or os._exit(0))
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    target_port, delay_ms = int(argv[0]), float(argv[1])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        asyncio.run(_serve(target_port, delay_ms / 1000.0))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
