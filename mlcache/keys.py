"""Canonical byte keys for the byte levels.

A byte-level key is ``namespace + b"\\x1f" + msgpack(key)``. It must be identical in every
process (so never ``hash()``, which is salted per process) and reversible (structures list
their keys by scanning a prefix). Supported user keys are ``str``, ``int``, ``bytes`` and
tuples of them (nested at most ``MAX_KEY_DEPTH`` deep); ``bool`` is folded into ``int``
exactly as a ``dict`` treats ``True == 1``. A ``str`` that UTF-8 cannot encode (lone surrogates,
as ``os.fsdecode`` gives for a file name that is not UTF-8) is an ext type holding its
``surrogatepass`` bytes: msgpack's str is UTF-8, and such a key raised UnicodeEncodeError from
every call, reads and ``in`` included, where a dict takes it.
"""
from __future__ import annotations

from typing import Any, Hashable

import msgpack

from mlcache.errors import IntegrityError

__all__ = ["SEP", "check_key", "encode_key", "decode_key", "namespace_prefix", "split_key"]

SEP = b"\x1f"
_TUPLE = 1
_BIGINT = 2  # ints outside msgpack's 64-bit range, as decimal text
_SURROGATE = 3  # a str UTF-8 cannot encode, as its surrogatepass bytes (only such strs)
MAX_KEY_DEPTH = 100  # tuples within tuples: deeper keys are refused (see _check_tuple)


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, msgpack.packb([_norm(x) for x in obj], default=_default,
                                                     use_bin_type=True, strict_types=True))
    if type(obj) is msgpack.ExtType:   # (a str escaped by _escape)
        return obj
    if type(obj) is int:
        try:
            text = str(obj)
        except ValueError:
            # past the interpreter's limit on int <-> decimal text (4300 digits by default):
            # a key error like any other unsupported key, not a stray ValueError
            raise TypeError("unsupported key: an int too large to write as decimal text "
                            "(sys.get_int_max_str_digits())") from None
        return msgpack.ExtType(_BIGINT, text.encode("ascii"))
    raise TypeError(f"unsupported key type: {type(obj).__name__}")


def _norm(x: Any) -> Any:
    if x is True or x is False:
        return int(x)
    return x


class _TooDeep(Exception):
    pass


def _hook_at(depth: int) -> Any:
    # The hook that decodes a tuple found ``depth`` levels down. Each level is one nested
    # msgpack call with a large C frame, so the depth is bounded here, before the C stack is:
    # 938 bytes of tuples nested 200 deep (written before keys were bounded, or by anyone
    # with access to the store) killed the process with a segfault in keys().
    def hook(code: int, data: bytes) -> Any:
        if code == _TUPLE:
            if depth > MAX_KEY_DEPTH:
                raise _TooDeep
            return tuple(msgpack.unpackb(data, ext_hook=_HOOKS[depth], raw=False,
                                         use_list=False, strict_map_key=False))
        if code == _BIGINT:
            return int(data.decode("ascii"))
        if code == _SURROGATE:
            return data.decode("utf-8", "surrogatepass")
        return msgpack.ExtType(code, data)
    return hook


# _HOOKS[d] decodes the tuples found inside a tuple at depth d (0: the key itself)
_HOOKS = [_hook_at(d + 1) for d in range(MAX_KEY_DEPTH + 1)]
_ext_hook = _HOOKS[0]


def check_key(key: Any) -> None:
    """Raise ``TypeError`` naming the type if ``key`` is not a supported key."""
    if isinstance(key, (str, bytes, int)):
        return
    if isinstance(key, tuple):
        _check_tuple(key, 1)
        return
    _unsupported(key)


def _check_tuple(key: tuple, depth: int) -> None:
    # Nesting is bounded: each level of a tuple is one nested msgpack call when the key is
    # encoded and decoded. Past the interpreter's recursion limit this check itself raised a
    # bare RecursionError, and decoding (keys()) a stored key a couple of hundred levels deep
    # overflowed the C stack and killed the process.
    if depth > MAX_KEY_DEPTH:
        raise TypeError(f"unsupported key: tuples nested more than {MAX_KEY_DEPTH} deep")
    for part in key:
        if isinstance(part, (str, bytes, int)):
            continue
        if isinstance(part, tuple):
            _check_tuple(part, depth + 1)
            continue
        _unsupported(part)


def _unsupported(key: Any) -> None:
    raise TypeError(
        f"mlcache keys must be str, int, bytes or tuples of them, not {type(key).__name__}"
    )


def encode_key(key: Hashable) -> bytes:
    """Encode a user key to its canonical, process-independent bytes (without namespace)."""
    check_key(key)
    try:
        if type(key) is str:  # the common case, kept short
            return msgpack.packb(key, use_bin_type=True)
        return msgpack.packb(_norm(key), default=_default, use_bin_type=True, strict_types=True)
    except UnicodeEncodeError:
        return msgpack.packb(_escape(_norm(key)), default=_default, use_bin_type=True,
                             strict_types=True)


def _escape(key: Any) -> Any:
    """``key`` with each str that UTF-8 cannot encode as its ``_SURROGATE`` ext type."""
    if type(key) is str:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return msgpack.ExtType(_SURROGATE, key.encode("utf-8", "surrogatepass"))
        return key
    if type(key) is tuple:
        return tuple(_escape(k) for k in key)
    return key


def decode_key(data: bytes) -> Any:
    """The user key of ``encode_key``'s bytes; ``IntegrityError`` if they are not such bytes."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, use_list=False,
                               strict_map_key=False)
    except _TooDeep:
        why = f"tuples nested more than {MAX_KEY_DEPTH} deep"
    except (ValueError, TypeError, UnicodeDecodeError, msgpack.UnpackException) as exc:
        why = f"{type(exc).__name__}: {exc}"
    raise IntegrityError(f"stored key bytes {bytes(data[:40])!r}{'...' if len(data) > 40 else ''} "
                         f"are not a valid mlcache key ({why})") from None


def namespace_prefix(namespace: str) -> bytes:
    if not namespace or "\x1f" in namespace:
        raise ValueError(f"invalid namespace {namespace!r}")
    return namespace.encode() + SEP


def split_key(full: bytes) -> tuple[str, Any]:
    """Split a full byte key into (namespace, user key)."""
    ns, _, rest = full.partition(SEP)
    return ns.decode(), decode_key(rest)
