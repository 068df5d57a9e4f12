"""User keys -> canonical byte keys under a namespace prefix, memoised for the hit path."""
from __future__ import annotations

from typing import Any, Hashable

import msgpack

from .keys import _TUPLE, check_key, decode_key, encode_key

__all__ = ["KeyView"]

_SIMPLE_KEYS = frozenset((str, int, bytes))
_MEMO_MAX = 1 << 16
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1   # what msgpack packs as a plain int
_packb = msgpack.packb
_Ext = msgpack.ExtType


def _flat(key: tuple) -> bool:
    """A tuple of exact str/bytes/int parts in msgpack's int range: the common composite key."""
    for part in key:
        tp = type(part)
        if tp is not str and tp is not bytes and (
                tp is not int or part < _INT_MIN or part > _INT_MAX):
            return False
    return True


def _encode(key: Any, flat: bool) -> bytes:
    """``keys.encode_key`` of a checked key; a flat tuple in two packb calls, byte for byte the
    same (tests/test_keyview.py), instead of a packb with a ``default`` hook per part."""
    if flat:
        return _packb(_Ext(_TUPLE, _packb(list(key), use_bin_type=True)), use_bin_type=True)
    return encode_key(_plain_key(key))


def _plain_key(key: Any) -> Any:
    """Subclasses of str/int/bytes (str enums, IntEnum, ...) key like their base value, as in
    a dict; bool stays (keys.py folds it into int)."""
    t = type(key)
    if t is str or t is int or t is bytes or t is bool:
        return key
    if t is tuple:
        return tuple(_plain_key(k) for k in key)
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, bytes):
        return bytes(key)
    if isinstance(key, int):
        return int(key)
    if isinstance(key, tuple):
        return tuple(_plain_key(k) for k in key)
    return key


class KeyView:
    """Turns user keys into canonical byte keys under one namespace prefix, memoised."""

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._memo: dict[Any, bytes] = {}
        self._memo_max = _MEMO_MAX

    def _kb(self, key: Any) -> bytes:
        if type(key) in _SIMPLE_KEYS:
            kb = self._memo.get(key)
            if kb is not None:
                return kb
            kb = self._prefix + encode_key(key)
        else:
            # checked before the memo: (1.0,) == (1,) must still be refused
            flat = type(key) is tuple and _flat(key)
            if not flat:
                check_key(key)
            kb = self._memo.get(key)
            if kb is not None:
                return kb
            kb = self._prefix + _encode(key, flat)
        memo = self._memo
        if len(memo) >= self._memo_max:
            memo.clear()
        memo[key] = kb
        return kb

    def _encode_key(self, key: Hashable) -> bytes:
        return self._kb(key)

    def _user_key(self, kb: bytes) -> Any:
        return decode_key(kb[len(self._prefix):])
