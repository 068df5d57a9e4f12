"""User keys -> canonical byte keys under a namespace prefix, memoised for the hit path."""
from __future__ import annotations

from itertools import chain
from typing import Any, Hashable, cast

import msgpack

from .keys import _TUPLE, check_key, decode_key, encode_key

__all__ = ["KeyView"]

_SIMPLE_KEYS = frozenset((str, int, bytes))
_MEMO_MAX = 1 << 16
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1   # what msgpack packs as a plain int
_packb = msgpack.packb
_chain = chain.from_iterable


def _flat(key: tuple) -> bool:
    """A tuple of exact str/bytes/int parts in msgpack's int range: the common composite key."""
    for part in key:
        tp = type(part)
        if tp is not str and tp is not bytes and (
                tp is not int or part < _INT_MIN or part > _INT_MAX):
            return False
    return True


# msgpack ext headers for type _TUPLE by payload length: fixext 1/2/4/8/16, else ext 8/16/32
_FIXEXT = {n: bytes((code, _TUPLE)) for n, code in ((1, 0xD4), (2, 0xD5), (4, 0xD6), (8, 0xD7),
                                                     (16, 0xD8))}
# ... and every header up to 255 bytes of payload (ext 8 beyond the fixext sizes), by length
_EXT_HEADS = {n: _FIXEXT.get(n) or bytes((0xC7, n, _TUPLE)) for n in range(1, 0x100)}
_TUPLE_KIND = {tuple}


def _encode(key: Any, flat: bool) -> bytes:
    """``keys.encode_key`` of a checked key; a flat tuple in one packb call and the ext header
    written here, byte for byte the same (tests/test_keyview.py), instead of a packb with a
    ``default`` hook per part (or a second packb of an ``ExtType``: half a cold miss's key cost)."""
    if flat:
        try:
            body = _packb(key, use_bin_type=True)   # a tuple packs as an array
        except UnicodeEncodeError:   # a str UTF-8 cannot encode: keys.py's ext type
            return encode_key(key)
        n = len(body)
        head = _FIXEXT.get(n)
        if head is None:
            if n < 0x100:
                head = bytes((0xC7, n, _TUPLE))
            elif n < 0x10000:
                head = b"\xc8" + n.to_bytes(2, "big") + bytes((_TUPLE,))
            else:
                head = b"\xc9" + n.to_bytes(4, "big") + bytes((_TUPLE,))
        return head + body
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


class _Heads(dict):
    """``prefix + _EXT_HEADS[n]`` by payload length ``n``, made on first use (KeyError from
    256 bytes on, like ``_EXT_HEADS``): a tuple key is then one concatenation."""

    def __init__(self, prefix: bytes) -> None:
        super().__init__()
        self.prefix = prefix

    def __missing__(self, n: int) -> bytes:
        head = self[n] = self.prefix + _EXT_HEADS[n]
        return head


class KeyView:
    """Turns user keys into canonical byte keys under one namespace prefix, memoised."""

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._memo: dict[Any, bytes] = {}
        self._memo_max = _MEMO_MAX
        self._heads: _Heads | None = None   # prefix + ext header, by length (tuple batches)

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

    def _kbs(self, keys: list[Any]) -> list[bytes]:
        """``[self._kb(key) for key in keys]``, for a batch (a batched miss encodes every key
        of it). A batch of one kind of key -- all plain str/int/bytes, or all flat tuples of
        them -- is checked, looked up in the memo and encoded with a few C-level calls over
        the whole batch (``_kbs_flat``: ~0.3 us a cold key instead of ~1 us); others key by key.
        """
        if len(keys) > 1:
            kbs = self._kbs_flat(keys)
            if kbs is not None:
                return kbs
        memo = self._memo
        get = memo.get
        kb_of = self._kb
        prefix = self._prefix
        out: list[bytes] = []
        append = out.append
        for key in keys:
            t = type(key)
            if t is tuple and _flat(key):
                kb = get(key)
                if kb is None:
                    kb = prefix + _encode(key, True)
                    if len(memo) >= self._memo_max:
                        memo.clear()
                    memo[key] = kb
            elif t is str or t is int or t is bytes:
                kb = get(key)
                if kb is None:
                    kb = kb_of(key)
            else:
                kb = kb_of(key)
            append(kb)
        return out

    def _kbs_flat(self, keys: list[Any]) -> list[bytes] | None:
        """The byte keys of a batch whose keys are all exact str/int/bytes, or all tuples of
        exact str/int/bytes, or None (then key by key). The types are checked over the whole
        batch before the memo is read (an equal key of another type, ``(1.0,)`` for ``(1,)``,
        must still be refused); ints outside msgpack's 64-bit range make the packer raise
        OverflowError and send the batch the slow way (``keys.encode_key`` writes them as an
        ext type)."""
        kinds = set(map(type, keys))
        if kinds <= _SIMPLE_KEYS:
            tuples = False
        elif kinds == _TUPLE_KIND and set(map(type, _chain(keys))) <= _SIMPLE_KEYS:
            tuples = True
        else:
            return None
        memo = self._memo
        kbs = list(map(memo.get, keys))
        n = kbs.count(None)
        if not n:
            return cast("list[bytes]", kbs)
        cold = keys if n == len(keys) else [k for k, kb in zip(keys, kbs) if kb is None]
        # a packer per batch (its buffer is not shared between threads); tuples pack as
        # msgpack arrays, as ``_encode`` packs them
        pack = msgpack.Packer(use_bin_type=True).pack
        prefix = self._prefix
        try:
            if tuples:
                heads = self._heads
                if heads is None:
                    heads = self._heads = _Heads(prefix)
                new = [heads[len(body)] + body for body in map(pack, cold)]
            else:
                new = list(map(prefix.__add__, map(pack, cold)))
        except (OverflowError, KeyError, UnicodeEncodeError):
            # a big int; a tuple encoding of 256+ bytes; a str UTF-8 cannot encode
            return None
        if n <= self._memo_max:
            if len(memo) + n > self._memo_max:
                memo.clear()
            memo.update(zip(cold, new))
        if n == len(keys):
            return new
        it = iter(new)
        return [kb if kb is not None else next(it) for kb in kbs]

    def _encode_key(self, key: Hashable) -> bytes:
        return self._kb(key)

    def _user_key(self, kb: bytes) -> Any:
        return decode_key(kb[len(self._prefix):])
