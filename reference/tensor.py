"""Bitwise tensors: dtype + shape + raw bits, compared and diffed on bits only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import DType, dtype


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor held as its raw bit patterns (``bits`` is an unsigned array of the dtype's width)."""

    dtype: DType
    bits: np.ndarray

    def __post_init__(self) -> None:
        if self.bits.dtype != self.dtype.bits_dtype:
            raise TypeError(f"bits must be {self.dtype.bits_dtype}, got {self.bits.dtype}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    @classmethod
    def from_array(cls, array: np.ndarray, dtype_name: str | DType | None = None) -> Tensor:
        """Wrap a numpy array; bits are reinterpreted, never converted (bf16/f8 come as uint16/uint8)."""
        array = np.asarray(array)
        dt = dtype(dtype_name) if dtype_name is not None else _infer(array)
        if array.dtype.itemsize != dt.itemsize:
            raise TypeError(f"array of {array.dtype} cannot hold {dt.name} bits")
        return cls(dt, np.array(array, order="C", copy=True).view(dt.bits_dtype))

    @classmethod
    def empty(cls, dtype_name: str | DType, shape: tuple[int, ...]) -> Tensor:
        dt = dtype(dtype_name)
        return cls(dt, np.zeros(shape, dt.bits_dtype))

    def values(self) -> np.ndarray:
        """The tensor as numpy values where numpy has the dtype, else the raw bits."""
        return self.bits.view(self.dtype.value_dtype) if self.dtype.value_dtype else self.bits

    def copy(self) -> Tensor:
        return Tensor(self.dtype, self.bits.copy())

    def bitwise_equal(self, other: Tensor) -> bool:
        return self.dtype == other.dtype and self.shape == other.shape and bool(np.array_equal(self.bits, other.bits))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and self.bitwise_equal(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Tensor({self.dtype.name}, shape={self.shape})"


def _infer(array: np.ndarray) -> DType:
    for name in ("F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"):
        dt = dtype(name)
        if dt.value_dtype and np.dtype(dt.value_dtype) == array.dtype.newbyteorder("<"):
            return dt
    raise TypeError(f"cannot infer a checkpoint dtype from numpy {array.dtype}; pass dtype_name")


@dataclass(frozen=True)
class Difference:
    """One way a tensor of a state differs from what was expected; ``render`` is its line in a diff."""

    tensor: str

    what = ""  # stable name of the kind of difference

    def render(self) -> str:
        raise NotImplementedError

    def fields(self) -> dict:
        """Plain JSON values, for matching (the bits as hex strings of the dtype's width, as rendered)."""
        return {"difference": self.what, **{k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}}


@dataclass(frozen=True)
class Missing(Difference):
    what = "missing"

    def render(self) -> str:
        return f"{self.tensor}: missing"


@dataclass(frozen=True)
class Unexpected(Difference):
    what = "unexpected"

    def render(self) -> str:
        return f"{self.tensor}: unexpected"


@dataclass(frozen=True)
class DtypeDiffers(Difference):
    expected: str
    got: str
    what = "dtype"

    def render(self) -> str:
        return f"{self.tensor}: dtype {self.got} != expected {self.expected}"


@dataclass(frozen=True)
class ShapeDiffers(Difference):
    expected: tuple[int, ...]
    got: tuple[int, ...]
    what = "shape"

    def render(self) -> str:
        return f"{self.tensor}: shape {self.got} != expected {self.expected}"


@dataclass(frozen=True)
class BitsDiffer(Difference):
    """Same dtype and shape, ``count`` of ``size`` elements differ; the first at ``index`` (bits as hex)."""

    count: int
    size: int
    index: tuple[int, ...]
    expected_bits: str
    got_bits: str
    expected_value: str
    got_value: str
    what = "bits"

    def render(self) -> str:
        return (f"{self.tensor}: {self.count} of {self.size} elements differ; first at index {list(self.index)}: "
                f"expected {self.expected_bits} ({self.expected_value}), got {self.got_bits} ({self.got_value})")


def difference(name: str, expected: Tensor, actual: Tensor) -> Difference | None:
    """None when bitwise equal, else how ``actual`` differs: dtype, shape, or the first differing element."""
    if expected.dtype != actual.dtype:
        return DtypeDiffers(name, expected.dtype.name, actual.dtype.name)
    if expected.shape != actual.shape:
        return ShapeDiffers(name, expected.shape, actual.shape)
    mismatch = expected.bits != actual.bits
    count = int(np.count_nonzero(mismatch))
    if count == 0:
        return None
    flat = int(np.argmax(mismatch.reshape(-1)))
    index = tuple(int(i) for i in np.unravel_index(flat, expected.shape)) if expected.shape else ()
    width = expected.dtype.itemsize * 2
    e_bits = int(expected.bits.reshape(-1)[flat])
    a_bits = int(actual.bits.reshape(-1)[flat])
    return BitsDiffer(name, count, int(expected.bits.size), index, f"0x{e_bits:0{width}x}", f"0x{a_bits:0{width}x}",
                      str(expected.dtype.decode(e_bits)), str(actual.dtype.decode(a_bits)))


def diff(name: str, expected: Tensor, actual: Tensor) -> str | None:
    """None when bitwise equal, else one line naming the tensor, the first differing index and both bits."""
    found = difference(name, expected, actual)
    return found.render() if found is not None else None


def differences(expected: dict[str, Tensor], actual: dict[str, Tensor]) -> list[Difference]:
    """All differences between two state dicts, missing and extra keys first."""
    out: list[Difference] = [Missing(k) for k in sorted(expected.keys() - actual.keys())]
    out += [Unexpected(k) for k in sorted(actual.keys() - expected.keys())]
    for key in sorted(expected.keys() & actual.keys()):
        found = difference(key, expected[key], actual[key])
        if found is not None:
            out.append(found)
    return out


def diff_states(expected: dict[str, Tensor], actual: dict[str, Tensor]) -> list[str]:
    """All differences between two state dicts, missing and extra keys included, one line each."""
    return [d.render() for d in differences(expected, actual)]
