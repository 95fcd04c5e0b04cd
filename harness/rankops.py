"""Rank-side execution of a case: rebuild this rank's pieces from the case, drive the adapter, record results.

The same code runs inside a launched rank (harness.worker) and in the controller for in-process runs, so a case
behaves the same under every launch mode.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np

from properties.case import Case
from reference.dtypes import dtype
from reference.engine import LocalTensor, local_tensors
from reference.tensor import Tensor

from .sut.base import RankTensor, SutAdapter


class RankExecutor:
    def __init__(self, adapter: SutAdapter, rank: int, world_size: int) -> None:
        self.adapter, self.rank, self.world_size = adapter, rank, world_size
        self.case: Case | None = None
        self.root: Path | None = None

    def begin(self, case_json: dict, root: str) -> None:
        self.case = Case.from_json(case_json)
        self.root = Path(root)

    def end(self) -> None:
        self.adapter.end_case()
        self.case = self.root = None

    def rank_tensors(self, which: str, version: int, zeros: bool) -> dict[str, RankTensor]:
        assert self.case is not None
        layouts = self.case.layouts(which)
        state = self.case.state(version)
        out = {}
        for name, lt in local_tensors(state, layouts, self.rank).items():
            if zeros:
                lt = LocalTensor(lt.global_shape, lt.region, Tensor.empty(lt.tensor.dtype, lt.tensor.shape), lt.saves)
            out[name] = RankTensor(name, layouts.get(name), lt)
        return out

    def op(self, index: int) -> dict:
        """Run op ``index`` on this rank; the record is plain data (it crosses a socket)."""
        assert self.case is not None and self.root is not None
        op = self.case.ops[index]
        record: dict = {"rank": self.rank, "index": index, "ok": True, "loaded": {}}
        start = time.perf_counter()
        try:
            if op.kind == "save":
                tensors = self.rank_tensors("save", op.version, zeros=False)
                handle = self.adapter.save(
                    self.root, op.name, tensors, use_async=op.use_async, options=self.case.options
                )
                if op.use_async:
                    if op.mutate_after:
                        self.adapter.mutate(handle)
                    self.adapter.wait(handle)
            else:
                targets = self.rank_tensors("load", op.version, zeros=True)
                got = self.adapter.load(self.root, op.name, targets, options=self.case.options)
                record["loaded"] = {name: _pack(t) for name, t in got.items()}
        except Exception as exc:  # an outcome to judge, not a harness failure
            record.update(
                ok=False, error_type=type(exc).__name__, error=_one_line(exc), traceback=traceback.format_exc(limit=8)
            )
        record["seconds"] = time.perf_counter() - start
        return record


def _pack(t: Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return (t.dtype.name, t.shape, np.ascontiguousarray(t.bits).tobytes())


def unpack(packed: tuple[str, tuple[int, ...], bytes]) -> Tensor:
    name, shape, raw = packed
    dt = dtype(name)
    return Tensor(dt, np.frombuffer(raw, dt.bits_dtype).reshape(shape).copy())


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + ("..." if len(text) > 500 else "")
