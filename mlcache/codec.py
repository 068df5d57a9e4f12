"""Values <-> bytes: a msgpack fast path, a cloudpickle fallback, an optional HMAC signature.

Layout of an encoded value::

    [format byte] [32-byte HMAC-SHA256 of everything after it, only if signed] [payload]

The format byte says which decoder reads the payload (``MSGPACK`` or ``PICKLE``) and whether a
signature follows (``SIGNED`` bit). msgpack is used for plain data because it is safe to decode
from a shared store and portable across languages; its ext types keep Python's exact types
(tuple, set, frozenset, big ints, dicts with non-str keys) so a round trip gives back an equal
value of the same types. Anything msgpack cannot take exactly (``strict_types``: subclasses,
dataclasses, numpy arrays, ...) falls back to cloudpickle, unless ``allow_pickle=False``.

Unpickling runs code, so with a ``signing_key`` every decode first checks the signature with
``hmac.compare_digest`` and refuses unsigned or tampered bytes. ``allow_pickle=False`` never
unpickles at all. Corrupt or truncated bytes raise :class:`~mlcache.errors.IntegrityError`, never
a stray ``ValueError`` from a decoder. This is the whole boundary, kept as small as diskcache's
``Disk``: subclass and override ``dumps``/``loads`` for another format.
"""
from __future__ import annotations

import hashlib
import hmac
import pickle
import struct
from operator import itemgetter
from typing import Any, Sequence

import cloudpickle
import msgpack
from msgpack import ExtType, packb, unpackb

from ._malloc import note_size
from .errors import IntegrityError, SerializationError

__all__ = ["Codec", "Encoded", "MSGPACK", "PICKLE", "SIGNED"]

MSGPACK = 0x01
PICKLE = 0x02
SIGNED = 0x80
_SIG_LEN = 32
_LARGE = 256 * 1024   # encodings from this size on tell the allocator (mlcache._malloc)
_MSGPACK_HEAD = bytes((MSGPACK,))
_MSGPACK_ONLY = {MSGPACK}
_first = itemgetter(0)
# encode_parts: a ``bytes`` this long inside the value is referenced, not copied; only values
# with at most _SCATTER_ITEMS items at the top are looked into (the look is a Python loop)
_SCATTER_MIN = 64 * 1024
_SCATTER_ITEMS = 64
_BIN32 = struct.Struct(">BI")   # msgpack's bin 32 header: 0xc6, then the length

# msgpack ext type codes (_SURROGATE: a str UTF-8 cannot encode, as its surrogatepass bytes)
_TUPLE, _SET, _FROZENSET, _BIGINT, _SURROGATE = 1, 2, 3, 4, 5


class _Unsupported(Exception):
    """Raised inside msgpack's ``default`` hook: this value needs the pickle fallback."""


# Tuples, sets and frozensets are ext types, each packed and unpacked by a nested msgpack
# call whose unpacker keeps ~40 KB on the C stack: 200 levels of tuples were encoded, then
# killed the process with a segfault when read (8 MB stack). Past this many levels the value is
# pickled instead (Python's pickle bounds its own recursion), and decoding refuses deeper bytes.
MAX_EXT_DEPTH = 100


class _TooDeep(_Unsupported):
    """An ext type nested more than MAX_EXT_DEPTH deep: not for msgpack."""


def _default_at(depth: int) -> Any:
    # the ``default`` hook for the ext types found ``depth`` levels down (1: in the value)
    def default(obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            if depth > MAX_EXT_DEPTH:
                raise _TooDeep(t)
            return ExtType(_TUPLE, packb(list(obj), default=_DEFAULTS[depth],
                                         use_bin_type=True, strict_types=True))
        if t is set or t is frozenset:
            if depth > MAX_EXT_DEPTH:
                raise _TooDeep(t)
            return ExtType(_SET if t is set else _FROZENSET,
                           packb(list(obj), default=_DEFAULTS[depth], use_bin_type=True,
                                 strict_types=True))
        if t is int:  # outside msgpack's 64-bit range
            return ExtType(_BIGINT, str(obj).encode("ascii"))
        raise _Unsupported(t)
    return default


def _hook_at(depth: int) -> Any:
    # the ``ext_hook`` for the ext types found ``depth`` levels down (1: in the value)
    def hook(code: int, data: bytes) -> Any:
        if code == _TUPLE:
            if depth > MAX_EXT_DEPTH:
                raise _too_deep()
            return tuple(unpackb(data, ext_hook=_HOOKS[depth], raw=False,
                                 strict_map_key=False, use_list=True))
        if code == _SET or code == _FROZENSET:
            if depth > MAX_EXT_DEPTH:
                raise _too_deep()
            items = unpackb(data, ext_hook=_HOOKS[depth], raw=False, strict_map_key=False,
                            use_list=True)
            return set(items) if code == _SET else frozenset(items)
        if code == _BIGINT:
            return int(data.decode("ascii"))
        if code == _SURROGATE:
            return bytes(data).decode("utf-8", "surrogatepass")
        raise IntegrityError(f"unknown msgpack ext type {code}")
    return hook


def _escape_strs(value: Any) -> Any:
    """``value`` with each str that UTF-8 cannot encode (lone surrogates, as ``os.fsdecode``
    gives for a file name that is not UTF-8) as a ``_SURROGATE`` ext type, through lists,
    tuples, dicts, sets and frozensets: msgpack's str is UTF-8, so such a value went to pickle,
    and with ``allow_pickle=False`` a plain str was refused. Only called once msgpack failed
    on one (never on the hot path)."""
    t = type(value)
    if t is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return ExtType(_SURROGATE, value.encode("utf-8", "surrogatepass"))
        return value
    if t is list:
        return [_escape_strs(v) for v in value]
    if t is tuple or t is set or t is frozenset:
        return t(_escape_strs(v) for v in value)
    if t is dict:
        return {_escape_strs(k): _escape_strs(v) for k, v in value.items()}
    return value


def _too_deep() -> IntegrityError:
    return IntegrityError(f"corrupt value bytes: tuples or sets nested more than "
                          f"{MAX_EXT_DEPTH} deep")


# index d: the hook for what is found inside an ext type at depth d (0: the value itself)
_DEFAULTS = [_default_at(d + 1) for d in range(MAX_EXT_DEPTH + 1)]
_HOOKS = [_hook_at(d + 1) for d in range(MAX_EXT_DEPTH + 1)]
_default = _DEFAULTS[0]
_ext_hook = _HOOKS[0]


def _unpack_inner(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False,
                           use_list=True)


class Encoded:
    """An encoding held as its pieces, in order: ``bytes(e)`` is the encoding, ``len(e)`` its
    length. The large ``bytes`` objects of the value are pieces themselves, referenced rather
    than copied (bytes are immutable, so the pieces stay what was encoded), and a byte level
    that can write a value in pieces (the Redis level: ``send_packed_command`` takes a list of
    buffers and sends each as it is) moves a megabyte from the object to the socket without a
    copy in user space. Anything else reads it with ``bytes(e)``, one join.
    """

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self.parts = tuple(parts)
        self.nbytes = sum(map(len, self.parts))

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Encoded):
            other = bytes(other)
        if isinstance(other, (bytes, bytearray, memoryview)):
            return len(other) == self.nbytes and bytes(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(bytes(self))   # as the joined bytes would hash (mutation-tracking digests)

    def __repr__(self) -> str:
        return f"Encoded({len(self.parts)} parts, {self.nbytes} bytes)"


def _bin_large(obj: Any) -> bool:
    return type(obj) is bytes and _SCATTER_MIN <= len(obj) < 1 << 32


def _scatter(value: Any) -> list[bytes] | None:
    """The msgpack encoding of ``value`` (exactly ``Codec.dumps``'s) as pieces, with every
    large ``bytes`` at the top of the value (the value itself, or an item of a small dict or
    list) as its own piece, uncopied; None when there is none or anything is unusual (the
    caller then encodes the usual way, which also decides the errors and the fallback)."""
    t = type(value)
    if t is bytes:
        return [_BIN32.pack(0xC6, len(value)), value] if _bin_large(value) else None
    if t is dict:
        if len(value) > _SCATTER_ITEMS or not any(map(_bin_large, value.values())):
            return None
    elif t is list:
        if len(value) > _SCATTER_ITEMS or not any(map(_bin_large, value)):
            return None
    else:
        return None
    try:
        # the same packer settings as dumps, so every piece it packs is packed the same way
        packer = msgpack.Packer(default=_default, use_bin_type=True, strict_types=True,
                                autoreset=False)
        parts: list[bytes] = []

        def item(obj: Any) -> None:
            if _bin_large(obj):
                parts.append(bytes(packer.getbuffer()) + _BIN32.pack(0xC6, len(obj)))
                packer.reset()
                parts.append(obj)
            else:
                packer.pack(obj)

        if t is dict:
            packer.pack_map_header(len(value))
            for k, v in value.items():
                packer.pack(k)
                item(v)
        else:
            packer.pack_array_header(len(value))
            for v in value:
                item(v)
        parts.append(bytes(packer.getbuffer()))
    except Exception:
        return None
    return parts


class Codec:
    """Encode values to bytes and back; see the module docstring for the format."""

    def __init__(self, signing_key: bytes | None = None, allow_pickle: bool = True) -> None:
        if isinstance(signing_key, str):
            signing_key = signing_key.encode()
        self.signing_key = signing_key
        self.allow_pickle = allow_pickle

    # -- the two hooks a subclass may override -----------------------------------------------

    def dumps(self, value: Any) -> tuple[int, bytes | memoryview]:
        """Return ``(format, payload)``; raise ``SerializationError`` if no format takes it.

        The payload may be a view (the msgpack packer's own buffer): :meth:`encode` copies it
        once, behind the format byte, instead of once out of the packer and once more there.
        """
        msgpack_error: BaseException
        try:
            packer = msgpack.Packer(default=_default, use_bin_type=True, strict_types=True,
                                    autoreset=False)
            packer.pack(value)
            return MSGPACK, packer.getbuffer()
        except UnicodeEncodeError as exc:
            msgpack_error = exc
            try:   # a str UTF-8 cannot encode, carried as an ext type
                packer = msgpack.Packer(default=_default, use_bin_type=True,
                                        strict_types=True, autoreset=False)
                packer.pack(_escape_strs(value))
                return MSGPACK, packer.getbuffer()
            except (_Unsupported, TypeError, ValueError, OverflowError, RecursionError) as exc2:
                msgpack_error = exc2
        except (_Unsupported, TypeError, ValueError, OverflowError) as exc:
            # dict keys msgpack cannot take hashed (e.g. a tuple key inside a set) and cycles
            # (ValueError: recursion) also end here.
            msgpack_error = exc
        if not self.allow_pickle:
            raise SerializationError(
                f"cannot encode a value of type {type(value).__name__} with msgpack and "
                f"allow_pickle=False ({_describe(msgpack_error)})",
                value_type=type(value))
        try:
            return PICKLE, cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(
                f"cannot encode a value of type {type(value).__name__}: {exc}",
                value_type=type(value)) from exc

    def loads(self, fmt: int, payload: bytes | memoryview) -> Any:
        if fmt == MSGPACK:
            return _unpack_inner(payload)
        if fmt == PICKLE:
            if not self.allow_pickle:
                raise IntegrityError("refusing to unpickle: allow_pickle=False")
            return pickle.loads(payload)
        raise IntegrityError(f"unknown format byte 0x{fmt:02x}")

    # -- public API --------------------------------------------------------------------------

    def encode(self, value: Any) -> bytes:
        fmt, payload = self.dumps(value)
        if len(payload) >= _LARGE:
            note_size(len(payload))
        if self.signing_key is None:
            return bytes((fmt,)) + payload
        head = bytes((fmt | SIGNED,))
        mac = hmac.new(self.signing_key, head, hashlib.sha256)
        mac.update(payload)
        return b"".join((head, mac.digest(), payload))

    def encode_parts(self, value: Any) -> bytes | Encoded:
        """:meth:`encode`, as an :class:`Encoded` whose large pieces are the value's own
        ``bytes`` when the value is large bytes or a small dict or list holding some (the same
        bytes once joined, signed the same way); otherwise exactly ``encode(value)``.

        For the write-back of a large value: ``encode`` copies each payload twice (into the
        packer, then behind the format byte), about 60 us per MB here, and a write-back of the
        raw bytes copies nothing. A subclass that overrides ``dumps`` or ``encode`` gets its
        own ``encode``."""
        cls = type(self)
        if cls.dumps is not Codec.dumps or cls.encode is not Codec.encode:
            return self.encode(value)
        parts = _scatter(value)
        if parts is None:
            return self.encode(value)
        payload_len = sum(map(len, parts))
        if payload_len < _LARGE:
            return self.encode(value)   # a copy of under 256 KiB costs less than the pieces
        note_size(payload_len)
        if self.signing_key is None:
            parts[0] = _MSGPACK_HEAD + parts[0]
            return Encoded(parts)
        head = bytes((MSGPACK | SIGNED,))
        mac = hmac.new(self.signing_key, head, hashlib.sha256)
        for part in parts:
            mac.update(part)
        parts[0] = head + mac.digest() + parts[0]
        return Encoded(parts)

    def decode_many(self, items: Sequence[bytes]) -> list[Any]:
        """``[decode(b) for b in items]``, the same values and errors, with the common case --
        a small unsigned msgpack encoding and this class's own decoder -- one msgpack call."""
        decode = self.decode
        if self.signing_key is not None or type(self).decode is not Codec.decode or \
                type(self).loads is not Codec.loads:
            return [decode(data) for data in items]
        unpackb = msgpack.unpackb
        if items:
            # The usual batch -- every encoding small, unsigned msgpack -- checked with two
            # C-level passes, then decoded without a branch per item.
            try:
                if max(map(len, items)) < _LARGE and set(map(_first, items)) == _MSGPACK_ONLY:
                    return [unpackb(data[1:], ext_hook=_ext_hook, raw=False,
                                    strict_map_key=False) for data in items]
            except Exception:
                pass   # an empty or corrupt encoding: decoded one by one below, for its error
        out: list[Any] = []
        append = out.append
        for data in items:
            # (an Encoded -- a write-back's pieces -- is not sliceable: decode() joins it)
            if len(data) < _LARGE and type(data) is not Encoded and data[:1] == _MSGPACK_HEAD:
                try:
                    append(unpackb(data[1:], ext_hook=_ext_hook, raw=False,
                                   strict_map_key=False))
                    continue
                except Exception:
                    pass   # decode() below raises the error it would have raised
            append(decode(data))
        return out

    def decode(self, data: bytes) -> Any:
        if type(data) is Encoded:   # a write-back still in the eviction buffer, in pieces
            data = bytes(data)
        if not data:
            raise IntegrityError("empty value bytes")
        head = data[0]
        if len(data) >= _LARGE:
            note_size(len(data))
        # A view, not a slice: a slice of a 1 MB value is a 1 MB copy the decoder copies again.
        view = memoryview(data)
        if head & SIGNED:
            if len(data) < 1 + _SIG_LEN:
                raise IntegrityError("truncated value: signature incomplete")
            payload: bytes | memoryview = view[1 + _SIG_LEN:]
            if self.signing_key is not None:
                mac = hmac.new(self.signing_key, data[:1], hashlib.sha256)
                mac.update(payload)
                if not hmac.compare_digest(mac.digest(), bytes(view[1:1 + _SIG_LEN])):
                    raise IntegrityError("signature mismatch: value tampered or signed with "
                                         "another key")
        else:
            if self.signing_key is not None:
                raise IntegrityError("unsigned value but a signing key is configured")
            payload = view[1:]
        if type(self).loads is not Codec.loads:
            payload = bytes(payload)   # a subclass's decoder may want bytes
        try:
            return self.loads(head & ~SIGNED, payload)
        except IntegrityError:
            raise
        except Exception as exc:
            raise IntegrityError(f"corrupt value bytes: {type(exc).__name__}: {exc}") from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _TooDeep):
        return f"{exc.args[0].__name__}s nested more than {MAX_EXT_DEPTH} deep"
    if isinstance(exc, _Unsupported):
        return f"unsupported type {exc.args[0].__name__}"
    return f"{type(exc).__name__}: {exc}"
