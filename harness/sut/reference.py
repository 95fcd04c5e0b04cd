"""The reference engine as a system under test: must pass everything (it is the oracle, run as a SUT)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reference import AsyncSaver, load_rank, save
from reference.layout import TensorLayout
from reference.tensor import Tensor


class ReferenceSut:
    name = "reference"
    capabilities = frozenset(
        {"reshard", "async", "zero_size", "flat", "moe", "repeat", "in_process_world"}
        | {
            f"dtype:{d}"
            for d in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL")
        }
    )

    def __init__(self) -> None:
        self._saver = AsyncSaver()

    def save_world(
        self,
        root: Path,
        name: str,
        state: Mapping[str, Tensor],
        layouts: Mapping[str, TensorLayout],
        *,
        use_async: bool,
    ):
        """Save as every rank of ``layouts`` would (in one process); returns a handle with ``wait()`` if async."""
        if use_async:
            return self._saver.save(root, state, layouts, name=name)
        return save(root, state, layouts, name=name)

    def load_rank(self, root: Path, name: str | None, specs, layouts: Mapping[str, TensorLayout], rank: int):
        return load_rank(root, specs, layouts, rank, name=name)

    def close(self) -> None:
        self._saver.close()
