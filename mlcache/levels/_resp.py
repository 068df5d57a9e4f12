"""Reading the reply to an ``MGET`` straight off a redis-py connection's socket.

The batched miss reads up to a thousand values with one ``MGET``. redis-py parses the reply
one element at a time through its socket buffer (a readline and a read per value, in Python:
~1 us a value on this machine, as much as everything else the manager does for a miss). The
reply to ``MGET`` has one shape -- an array of bulk strings and nulls, in RESP2 and RESP3
alike -- so :func:`read_values` parses it from whole socket reads with ``bytes.find`` and
slices (~0.5 us a value less).

It is used only where it cannot get out of step with redis-py: a plain (not TLS) socket, the
reply's first byte peeked before anything is consumed (an array or an error, else redis-py
reads: a RESP3 push sent first is redis-py's to handle), and the whole reply consumed exactly;
bytes beyond it (a push sent right after) or anything unexpected drop the connection, so the
level's retry takes a fresh one.
"""
from __future__ import annotations

import select
import socket
import time
from operator import itemgetter
from typing import Any

import redis

__all__ = ["PendingValues", "read_replies", "read_values", "request_values"]

_first = itemgetter(0)
_POLLIN = select.POLLIN
_tail = itemgetter(slice(1, None))
_DOLLAR = {36}   # b"$"[0]
_RECV = 1 << 16   # bytes asked per socket read; a value this large is read as it is
_REPARSE = 4 * _RECV   # a split read's reply parsed again after each read up to this size


def request_values(client: redis.Redis, command: bytes) -> Any:
    """Send ``command`` (an ``MGET`` in the Redis protocol) on a pooled connection and return
    its reply, a list of values (bytes) and None. An error reply raises ``ResponseError``
    with the connection kept (the reply was read whole); a failed read drops the connection
    and raises ``ConnectionError``/``TimeoutError``, as redis-py does."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([command])
        sock = getattr(conn, "_sock", None)
        if type(sock) is not socket.socket:
            return conn.read_response()      # TLS (or no socket): redis-py reads
        try:
            head = sock.recv(1, socket.MSG_PEEK)
            if head != b"*" and head != b"-":
                return conn.read_response()  # a push first (RESP3), or closed: redis-py's
            return read_values(sock)
        except socket.timeout:
            conn.disconnect()
            raise redis.TimeoutError("Timeout reading from socket") from None
        except (ValueError, IndexError, redis.InvalidResponse) as exc:
            conn.disconnect()
            raise redis.ConnectionError(f"unexpected reply to MGET: {exc}") from exc
        except OSError as exc:
            conn.disconnect()
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
    except redis.ResponseError:
        raise   # the whole error reply was read: the connection is in step
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _received(chunk: bytes) -> bytes:
    """``chunk`` as read from the socket; an empty read means the server closed it."""
    if not chunk:
        raise redis.ConnectionError("Connection closed by server.")
    return chunk


def read_values(sock: socket.socket) -> list[bytes | None]:
    """Read one reply to an ``MGET`` from ``sock``: an array of bulk strings and nulls (RESP2's
    ``$-1``, RESP3's ``_``). An error reply raises ``ResponseError`` once its line is read;
    a closed socket ``ConnectionError``; any other shape, or bytes beyond the reply,
    ``InvalidResponse`` (the caller drops the connection)."""
    recv = sock.recv
    data = _received(recv(_RECV))
    if data[:1] == b"*" and data[-2:] == b"\r\n":
        values: list[bytes | None] | None = _split(data)  # type: ignore[assignment]
        if values is not None:
            return values
    pos = 0
    out: list[bytes | None] = []
    append = out.append
    count = -1   # elements still to read; -1 before the array's header
    while count:
        end = data.find(b"\r\n", pos)
        if end < 0:
            data = data[pos:] + _received(recv(_RECV))
            pos = 0
            continue
        kind = data[pos]
        if kind == 36 and count > 0:       # $<length>\r\n<bytes>\r\n, or RESP2's null $-1
            n = int(data[pos + 1:end])
            if n < 0:
                append(None)
                pos = end + 2
                count -= 1
                continue
            stop = end + 2 + n
            if stop + 2 > len(data):
                if n < _RECV:   # a small value cut by the read: read on
                    data = data[pos:] + _received(recv(_RECV))
                    pos = 0
                    continue
                # a large value: received as it is (one copy into bytes, as redis-py's read)
                append(_recv_value(sock, data[end + 2:stop], n))
                count -= 1
                data, pos = _recv_crlf(sock, data[stop:stop + 2]), 2
                continue
            if data[stop:stop + 2] != b"\r\n":
                raise redis.InvalidResponse("a value not ended by CRLF")
            append(data[end + 2:stop])
            pos = stop + 2
            count -= 1
        elif kind == 95 and count > 0:     # _\r\n: RESP3's null
            append(None)
            pos = end + 2
            count -= 1
        elif kind == 42 and count < 0:     # *<count>: the array's header
            count = int(data[pos + 1:end])
            pos = end + 2
            if count < 0:
                raise redis.InvalidResponse("a null array")
        elif kind == 45 and count < 0:     # -<error>
            if end + 2 != len(data):
                raise redis.InvalidResponse("bytes after an error reply")
            raise redis.ResponseError(data[pos + 1:end].decode("utf-8", "replace"))
        else:
            raise redis.InvalidResponse(f"unexpected {data[pos:pos + 24]!r}")
    if pos != len(data):
        raise redis.InvalidResponse("bytes after the reply")
    return out


def _split(data: bytes) -> list[bytes] | None:
    """The values of a whole reply ``data`` without nulls or values holding CRLF, read with
    one ``split`` and C-level checks (~0.17 us a value against ~0.4 for the loop), or None.

    Exact: split at every CRLF, the parts after the header alternate ``$<length>`` and value
    only if no value holds a CRLF and none is null. Were either present, the first of them
    breaks the check at its own place: a null's ``$-1`` is no value's length, and a value
    holding a CRLF is split at it, so the part after its (true) ``$<length>`` is shorter than
    that length. So a passed check is a correct parse; a reply still arriving, or followed by
    more bytes, has another number of parts."""
    parts = data.split(b"\r\n")
    try:
        n = int(parts[0][1:])
    except ValueError:
        return None
    if n < 1 or len(parts) != 2 * n + 2:   # (the last part: empty, after the final CRLF)
        return None
    heads = parts[1:-1:2]
    values = parts[2:-1:2]
    try:
        if set(map(_first, heads)) == _DOLLAR and \
                list(map(len, values)) == list(map(int, map(_tail, heads))):
            return values
    except (ValueError, IndexError):   # an empty or malformed part where a head should be
        pass
    return None


def _recv_value(sock: socket.socket, head: bytes, n: int) -> bytes:
    """The ``n`` bytes of a value whose first bytes are ``head``: the rest received in reads
    of what is missing (up to 1 MiB each), joined once."""
    parts = [head] if head else []
    have = len(head)
    recv = sock.recv
    while have < n:
        chunk = _received(recv(min(n - have, 1 << 20)))
        parts.append(chunk)
        have += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _recv_crlf(sock: socket.socket, head: bytes) -> bytes:
    """The bytes read after a large value, starting with its CRLF (``head``: what of it was
    read already); checked, so a reply out of step is refused."""
    data = head
    while len(data) < 2:
        data += _received(sock.recv(_RECV))
    if data[:2] != b"\r\n":
        raise redis.InvalidResponse("a value not ended by CRLF")
    return data


def read_replies(sock: socket.socket, n: int,
                 parse_error: Any = redis.ResponseError) -> Exception | None:
    """Read ``n`` whole replies from ``sock`` and return the first error among them (an
    error nested in an ``EXEC``'s array included) as a ``ResponseError``, or None; their
    values are dropped. For pipelined writes, whose replies say only whether each command
    was applied (``parse_error``: the connection's parser's, which maps an error's code to
    redis-py's class, ``NoScriptError`` for ``NOSCRIPT``...). redis-py reads each with a
    readline per element in Python (~8 us a reply here), and a write's transaction (MULTI,
    its MSETs, the key index's ZADDs, EXEC) has several.

    Every reply's elements are counted: an array of k replaces itself by its k elements; a
    bulk string is skipped by its length. A closed socket raises ``ConnectionError``; any
    other shape, or bytes beyond the replies, ``InvalidResponse`` (the caller drops the
    connection)."""
    recv = sock.recv
    data = _received(recv(_RECV))
    pos = 0
    left = n
    error: Exception | None = None
    while left:
        end = data.find(b"\r\n", pos)
        if end < 0:
            data = data[pos:] + _received(recv(_RECV))
            pos = 0
            continue
        kind = data[pos]
        if kind == 43 or kind == 58 or kind == 95:    # +simple, :integer, _ (RESP3 null)
            left -= 1
            pos = end + 2
        elif kind == 42:                               # *<count>: its elements follow
            count = int(data[pos + 1:end])
            left += count - 1 if count > 0 else -1
            pos = end + 2
        elif kind == 36:                               # $<length>\r\n<bytes>\r\n
            size = int(data[pos + 1:end])
            stop = end + 2 + (size + 2 if size >= 0 else 0)
            while stop > len(data):
                data = data[pos:] + _received(recv(max(_RECV, stop - len(data))))
                stop -= pos
                end -= pos
                pos = 0
            left -= 1
            pos = stop
        elif kind == 45:                               # -error
            if error is None:
                error = parse_error(data[pos + 1:end].decode("utf-8", "replace"))
            left -= 1
            pos = end + 2
        else:
            raise redis.InvalidResponse(f"unexpected {data[pos:pos + 24]!r}")
    if pos != len(data):
        raise redis.InvalidResponse("bytes after the replies")
    return error


class _Incomplete(Exception):
    """The bytes received so far end inside the reply."""


class _Received:
    """The bytes of a reply received so far, read by :func:`read_values` as it reads a socket;
    reading past them raises :class:`_Incomplete`."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def recv(self, n: int, flags: int = 0) -> bytes:
        pos = self._pos
        if pos >= len(self._data):
            raise _Incomplete
        chunk = self._data[pos:pos + n]
        self._pos = pos + len(chunk)
        return chunk

    def rest(self) -> int:
        return len(self._data) - self._pos


class PendingValues:
    """An ``MGET`` sent on a connection of its own whose reply is not read yet: a read split
    in two, so that the caller's thread goes on while the server answers.

    :meth:`poll` takes what has arrived without blocking and returns the values once the whole
    reply is there (else None); :meth:`wait` blocks for it. ``timeout``: the seconds the server
    may send nothing, counted from the request and again from each read that brought bytes
    (redis-py's socket timeout bounds each wait for bytes the same way), so that a reply
    that came in time but is taken in several polls, far apart (slow records between them),
    is not failed as a timeout once the time since the request passes it.
    The reply is parsed by :func:`read_values` from the bytes received. A reply of a few dozen
    values arrives in one or two reads, and is parsed again after each; past ``_REPARSE``
    bytes (large values) :meth:`_whole` follows its element headers from where it stopped,
    so that it is parsed once more, when whole (parsed again after every read, a reply of 16
    values of 1 MiB took ~940 ms of CPU, and one of 16 x 4 MiB outlasted the socket timeout,
    so the read failed). Errors
    are raised as redis-py's, the connection dropped unless the reply was read whole (an error
    reply); after one, or :meth:`cancel`, the object is done.
    """

    __slots__ = ("_conn", "_sock", "_poller", "_buf", "_scan", "_left", "_timeout", "_deadline",
                 "done")

    def __init__(self, conn: Any, sock: socket.socket, timeout: float | None) -> None:
        self._conn = conn
        self._sock = sock
        # whether bytes came is asked with poll(2), not select(2): select cannot watch a
        # descriptor past FD_SETSIZE (1024), and in a process with more files open (a Spark
        # worker, a service with many connections) every split read failed ("filedescriptor
        # out of range in select()"), and its records read their keys again
        self._poller = select.poll()
        self._poller.register(sock, _POLLIN)
        self._buf: bytearray | None = None   # the bytes of a reply that took several reads
        self._scan = 0      # where _whole goes on: the next element's header in _buf
        self._left = -1     # elements after it (-1 before the array's header)
        self._timeout = timeout or None
        # when the server has sent nothing for the timeout (moved on by every read with bytes)
        self._deadline = None if not timeout else time.monotonic() + timeout
        self.done = False

    def _whole(self) -> bool:
        """Whether ``_buf`` holds the whole reply (or a malformed one, for :func:`read_values`
        to refuse), following its headers from where the last call stopped: the values'
        bytes are skipped by their lengths, never looked at."""
        buf, pos, left = self._buf, self._scan, self._left
        assert buf is not None
        size = len(buf)
        while left:
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            kind = buf[pos]
            if left < 0:
                if kind != 42:           # not an array: an error reply, or garbage
                    return True
                left = int(buf[pos + 1:end])
                if left < 0:
                    return True
                pos = end + 2
                continue
            if kind == 36:               # $<length>\r\n<bytes>\r\n, or $-1
                n = int(buf[pos + 1:end])
                stop = end + 2 if n < 0 else end + n + 4
                if stop > size:
                    break
                pos = stop
            elif kind == 95:             # _: RESP3's null
                pos = end + 2
            else:
                return True
            left -= 1
        self._scan, self._left = pos, left
        return not left

    def poll(self) -> list[bytes | None] | None:
        if self.done:
            raise redis.ConnectionError("the reply was read or given up already")
        try:
            # (a socket with a timeout waits for data before any recv, MSG_DONTWAIT or not:
            # ask first whether some has come)
            chunk = self._sock.recv(_RECV) if self._poller.poll(0) else None
            if chunk is not None:
                _received(chunk)
                if self._timeout is not None:
                    # bytes came: the server is answering (a reply of several reads taken a
                    # read per poll, polls far apart, failed at the time since the request)
                    self._deadline = time.monotonic() + self._timeout
                buf = self._buf
                data: bytes | None
                if buf is None:
                    data = chunk                 # the first read: whole, most of the time
                    if data[:1] != b"*" and data[:1] != b"-":
                        raise redis.InvalidResponse(f"unexpected {data[:24]!r}")  # a push...
                else:
                    buf += chunk
                    # a few reads in: parsed again from the start (cheaper than following
                    # the headers of a reply of small values); beyond, only once it is whole
                    data = bytes(buf) if len(buf) <= _REPARSE or self._whole() else None
                got = _Received(data) if data is not None else None
                try:
                    if got is None:
                        raise _Incomplete
                    values = read_values(got)  # type: ignore[arg-type]
                except _Incomplete:
                    if buf is None:              # more to come: gathered
                        self._buf = bytearray(chunk)
                else:
                    if got.rest():
                        raise redis.InvalidResponse("bytes after the reply")
                    self.done = True
                    return values
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise redis.TimeoutError("Timeout reading from socket")
            return None
        except redis.ResponseError:
            self.done = True   # the whole error reply was read: the connection is in step
            raise
        except (ValueError, IndexError, redis.InvalidResponse) as exc:
            self.cancel()
            raise redis.ConnectionError(f"unexpected reply to MGET: {exc}") from exc
        except OSError as exc:
            self.cancel()
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
        except BaseException:
            self.cancel()
            raise

    def wait(self) -> list[bytes | None]:
        """Block until the whole reply is read (or the server sends nothing for the timeout
        given at the start)."""
        while True:
            values = self.poll()
            if values is not None:
                return values
            left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            self._poller.poll(1000 if left is None else min(left, 1.0) * 1000)

    def cancel(self) -> None:
        """Give the reply up: the connection is dropped (what it would still receive is out of
        step with the next command)."""
        if not self.done:
            self.done = True
            self._conn.disconnect()
