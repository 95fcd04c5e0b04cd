"""Dtypes as raw bit containers.

numpy has no bfloat16 or float8, and float arithmetic may canonicalise NaN payloads, so every tensor is held as
unsigned integers of the dtype's width ("bits") and only decoded for display. Names are safetensors' codes, which
is also what lands on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import LayoutError

_BITS = {n: np.dtype(f"<u{n}") for n in (1, 2, 4, 8)}  # bit-pattern dtypes by width, made once


@dataclass(frozen=True)
class DType:
    name: str  # safetensors dtype code, e.g. "BF16"
    itemsize: int
    kind: str  # "float", "int", "uint", "bool"
    value_dtype: str | None  # numpy dtype holding values, when numpy has one

    @property
    def bits_dtype(self) -> np.dtype:
        return _BITS[self.itemsize]

    def decode(self, bits: int) -> str:
        """Human-readable value of one element's bit pattern (for diffs)."""
        if self.name == "BF16":
            return repr(float(np.array([bits << 16], "<u4").view("<f4")[0]))
        if self.name in ("F8_E4M3", "F8_E5M2"):
            return repr(_decode_f8(bits, self.name))
        if self.value_dtype is None:
            return hex(bits)
        value = np.array([bits], self.bits_dtype).view(self.value_dtype)[0]
        return repr(value.item())


def _decode_f8(bits: int, name: str) -> float:
    exp_bits, bias = (4, 7) if name == "F8_E4M3" else (5, 15)
    man_bits = 7 - exp_bits
    sign = -1.0 if bits & 0x80 else 1.0
    exp = (bits >> man_bits) & ((1 << exp_bits) - 1)
    man = bits & ((1 << man_bits) - 1)
    if name == "F8_E4M3" and exp == 0xF and man == 0x7:
        return float("nan")  # e4m3fn: no infinities, one NaN pattern per sign
    if name == "F8_E5M2" and exp == 0x1F:
        return sign * float("inf") if man == 0 else float("nan")
    if exp == 0:
        return sign * man * 2.0 ** (1 - bias - man_bits)
    return sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)


_ALL = [
    DType("F64", 8, "float", "<f8"),
    DType("F32", 4, "float", "<f4"),
    DType("F16", 2, "float", "<f2"),
    DType("BF16", 2, "float", None),
    DType("F8_E4M3", 1, "float", None),
    DType("F8_E5M2", 1, "float", None),
    DType("I64", 8, "int", "<i8"),
    DType("I32", 4, "int", "<i4"),
    DType("I16", 2, "int", "<i2"),
    DType("I8", 1, "int", "<i1"),
    DType("U64", 8, "uint", "<u8"),
    DType("U32", 4, "uint", "<u4"),
    DType("U16", 2, "uint", "<u2"),
    DType("U8", 1, "uint", "<u1"),
    DType("BOOL", 1, "bool", "|b1"),
]
DTYPES: dict[str, DType] = {d.name: d for d in _ALL}

# Common aliases (framework spellings) → safetensors codes.
_ALIASES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}


def dtype(name: str | DType) -> DType:
    """Look up a dtype by safetensors code or common framework alias."""
    if isinstance(name, DType):
        return name
    code = _ALIASES.get(name, name)
    try:
        return DTYPES[code]
    except KeyError:
        raise LayoutError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None
