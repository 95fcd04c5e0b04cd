"""One strict JSON reader for every metadata file of a checkpoint (index, manifests, safetensors headers).

Metadata comes from disk, so it is hostile until proven otherwise. ``json.loads`` alone recurses once per
nesting level (RecursionError), keeps the last of duplicate keys, takes ``true`` for 1, builds integers of
thousands of digits and objects without bound. Here a linear pre-scan in C-speed primitives (regex, bytes
methods, numpy) bounds nesting depth, digit runs, value and container counts *before* ``json.loads`` runs, the
decoder's hooks reject duplicate keys and non-finite numbers, and ``Record`` reads fields with exact types.
Every failure is a ``MalformedMetadata`` naming the file and the field.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path

import numpy as np

from ..errors import MalformedMetadata

MAX_DEPTH = 32  # deepest legitimate nesting: index → slices → slice → region → box → offsets (6) plus free meta
MAX_DIGITS = 20  # a uint64 has 20 digits; longer digit runs are never a size, offset, checksum or step
MAX_VALUES = 1 << 20  # JSON values per file; bounds decoded memory (~100 B a value) and hook calls
MAX_CONTAINERS = 1 << 16  # objects and arrays per file: ~10,000 slices of an index, parsed well within 1 s
MAX_INT = (1 << 63) - 1  # sizes, offsets and counts must fit numpy's intp

_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # one JSON escape: a backslash and the byte it escapes
_STRING = re.compile(rb'"[^"]*"')  # a string once escapes are gone (linear: no backtracking)
_LONG_DIGITS = re.compile(rb"[0-9]{%d,}" % (MAX_DIGITS + 1))
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 1 << 20

_SEAL_HEAD = b'{"crc32":"'
_SEAL_MID = b'","body":'
_SEAL_TAIL = b"}\n"
_HEX = re.compile(rb"[0-9a-f]{8}")


def seal(body: object) -> bytes:
    """``body`` as JSON inside an envelope carrying the crc32 of its exact bytes, so a reader verifies every byte
    before parsing any (the file stays plain JSON)."""
    raw = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return b"%s%08x%s%s%s" % (_SEAL_HEAD, zlib.crc32(raw), _SEAL_MID, raw, _SEAL_TAIL)


def unseal(raw: bytes, path: Path | str, what: str) -> bytes:
    """The body bytes of a sealed file, checked byte for byte against its crc32 (a flipped bit anywhere, the
    envelope included, fails here)."""
    head = len(_SEAL_HEAD) + 8 + len(_SEAL_MID)
    crc = raw[len(_SEAL_HEAD) : len(_SEAL_HEAD) + 8]
    framed = (
        len(raw) >= head + len(_SEAL_TAIL)
        and raw.startswith(_SEAL_HEAD)
        and raw[len(_SEAL_HEAD) + 8 : head] == _SEAL_MID
        and raw.endswith(_SEAL_TAIL)
        and _HEX.fullmatch(crc) is not None
    )
    if not framed:
        raise MalformedMetadata(f"{what} is not a checksummed envelope", path)
    body = raw[head : -len(_SEAL_TAIL)]
    if b"%08x" % zlib.crc32(body) != crc:
        raise MalformedMetadata(f"{what} fails its checksum (crc32 {crc.decode()} recorded)", path)
    return body


def loads(raw: bytes, path: Path | str, what: str) -> object:
    """Parse untrusted JSON bytes within the module's bounds; any violation is a MalformedMetadata."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMetadata(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})", path) from None
    _prescan(raw, path, what)
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float)
    except _Reject as exc:
        raise MalformedMetadata(f"{what}: {exc}", path) from None
    except json.JSONDecodeError as exc:
        raise MalformedMetadata(f"{what} is not valid JSON ({exc})", path) from None
    except (ValueError, RecursionError) as exc:  # defence in depth: the pre-scan should make these impossible
        raise MalformedMetadata(f"{what} is not acceptable JSON ({type(exc).__name__})", path) from None


def _prescan(raw: bytes, path: Path | str, what: str) -> None:
    """Bound depth, digits and counts in linear time. Exact on every prefix of valid JSON (escapes and strings are
    removed the way a JSON scanner reads them), so whatever ``json.loads`` gets to parse has been bounded."""
    bare = _STRING.sub(b'""', _ESCAPE.sub(b"", raw))
    if _LONG_DIGITS.search(bare):
        raise MalformedMetadata(f"{what} holds a number of more than {MAX_DIGITS} digits", path)
    brackets = bare.translate(None, _NOT_BRACKETS)
    if len(brackets) > 2 * MAX_CONTAINERS:
        raise MalformedMetadata(f"{what} holds more than {MAX_CONTAINERS} objects and arrays", path)
    if bare.count(b",") + len(brackets) > MAX_VALUES:
        raise MalformedMetadata(f"{what} holds more than {MAX_VALUES} values", path)
    steps = np.frombuffer(brackets, np.uint8)
    level = 0
    for i in range(0, len(steps), _DEPTH_CHUNK):
        chunk = steps[i : i + _DEPTH_CHUNK]
        depth = np.cumsum(np.where((chunk == ord("[")) | (chunk == ord("{")), 1, -1), dtype=np.int64) + level
        if depth.max(initial=level) > MAX_DEPTH:
            raise MalformedMetadata(f"{what} nests deeper than {MAX_DEPTH} levels", path)
        level = int(depth[-1])


class _Reject(Exception):
    """Raised inside the decoder's hooks; turned into MalformedMetadata (with the file) by ``loads``."""


def _object(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Reject(f"duplicate key {dup!r}")
    return out


def _constant(name: str) -> object:
    raise _Reject(f"non-finite number {name}")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Reject(f"number {text[:32]} overflows")
    return value


def kind(value: object) -> str:
    """The JSON kind of a decoded value, for messages."""
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


class Record:
    """A decoded JSON object read field by field with exact types (``bool`` is not ``int``, a float is not an
    integer, a list is not an object); ``keys`` makes the field set exact. Errors name the file and field."""

    def __init__(self, data: object, path: Path | str, where: str, keys: frozenset[str] | None = None) -> None:
        self.path, self.where = path, where
        if type(data) is not dict:
            raise MalformedMetadata(f"{where} is {kind(data)}, expected an object", path)
        self.data: dict = data
        if keys is not None and data.keys() != keys:
            missing, extra = sorted(keys - data.keys()), sorted(data.keys() - keys)
            raise MalformedMetadata(f"{where}: missing fields {missing}, unknown fields {extra}", path)

    def field(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str) -> object:
        if key not in self.data:
            raise MalformedMetadata(f"{self.field(key)} is missing", self.path)
        return self.data[key]

    def integer(self, key: str, lo: int = 0, hi: int = MAX_INT) -> int:
        return as_int(self.get(key), self.path, self.field(key), lo, hi)

    def string(self, key: str) -> str:
        value = self.get(key)
        if type(value) is not str:
            raise MalformedMetadata(f"{self.field(key)} is {kind(value)}, expected a string", self.path)
        return value

    def array(self, key: str) -> list:
        value = self.get(key)
        if type(value) is not list:
            raise MalformedMetadata(f"{self.field(key)} is {kind(value)}, expected a list", self.path)
        return value

    def mapping(self, key: str) -> dict:
        value = self.get(key)
        if type(value) is not dict:
            raise MalformedMetadata(f"{self.field(key)} is {kind(value)}, expected an object", self.path)
        return value

    def integers(self, key: str, hi: int = MAX_INT) -> tuple[int, ...]:
        return tuple(as_int(v, self.path, f"{self.field(key)}[{i}]", 0, hi) for i, v in enumerate(self.array(key)))


def as_int(value: object, path: Path | str, field: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if type(value) is not int:
        raise MalformedMetadata(f"{field} is {kind(value)}, expected an integer", path)
    if not lo <= value <= hi:
        raise MalformedMetadata(f"{field} = {value} is outside [{lo}, {hi}]", path)
    return value
