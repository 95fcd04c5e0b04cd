"""Pure checkers: judge what a save/load returned against what the oracle says it must be.

They never touch processes or files; they take recorded states (bitwise tensors) and return a Judgement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from properties.check.anomalies import CoverViolated, OpFailed, ReadPlanViolated, SutError, TensorDiffers, judged
from properties.model.case import Case
from properties.model.outcome import OpRecord
from properties.model.verdicts import Judgement, Verdict
from reference.engine import local_tensors
from reference.errors import CheckpointError
from reference.layout import Box, Flat, Region
from reference.regions import check_exact_cover
from reference.tensor import Tensor, differences


def compare_states(prop: str, expected: Mapping[str, Tensor],
                   actual: Mapping[str, Tensor] | BaseException) -> Judgement:
    """Bitwise equality of two states; an exception where data was expected is a loud failure."""
    if isinstance(actual, BaseException):
        return judged([OpFailed(prop, None, SutError(type(actual).__name__, str(actual)))])
    found = [TensorDiffers(prop, None, None, d) for d in differences(dict(expected), dict(actual))]
    return judged(found) if found else Judgement(prop, Verdict.PASS)


def cover_violations(prop: str, tensors: Mapping[str, tuple[tuple[int, ...], list[Region]]]) -> list[CoverViolated]:
    """Saved slices of every tensor must cover it exactly once (lost slices lose data; duplicates waste it and
    hide disagreements between replicas)."""
    found = []
    for name, (shape, regions) in tensors.items():
        try:
            check_exact_cover(name, shape, regions)
        except CheckpointError as exc:
            found.append(CoverViolated(prop, None, name, type(exc).__name__, str(exc)))
    return found


def plan_violations(prop: str, case: Case, rec: OpRecord, saved: OpRecord | None) -> list[ReadPlanViolated]:
    """The plan-level check of a load, independent of the bits: on each rank, the reads the SUT planned fill each of
    the rank's (unflattened, non-empty) target pieces exactly once, and each read lies inside a piece the save
    wrote. Flattened targets and sources are left out (the SUT plans those in its own unflattened coordinates)."""
    out: list[ReadPlanViolated] = []
    layouts = case.layouts(case.op_layouts(rec.index))
    state = case.expected(0, case.op_layouts(rec.index))
    written = saved.written if saved is not None else {}
    save_layouts = case.layouts("save")  # flattened sources: Paddle reads their bounding boxes, which overlap
    for rank, plan in sorted(rec.plans.items()):
        rows = [tuple(tuple(x) if isinstance(x, list) else x for x in row) for row in plan["reads"]]
        planned = set(plan["tensors"])
        for name, lt in sorted(local_tensors(state, layouts, rank).items()):
            piece = lt.region
            if (name not in planned or not isinstance(piece, Box) or piece.numel == 0
                    or isinstance(layouts.get(name), Flat) or isinstance(save_layouts.get(name), Flat)):
                continue
            reads = [Box(tuple(d - o for d, o in zip(dst, piece.offsets)), shape)
                     for tensor, dst, shape, _, _ in rows if tensor == name and math.prod(shape) != 0]
            try:
                check_exact_cover(name, piece.shape, reads)
            except CheckpointError as exc:
                out.append(ReadPlanViolated(prop, None, rank, name, type(exc).__name__,
                                            f"reads of {name!r} for the piece at {list(piece.offsets)}: {exc}"))
        out += _unsaved_sources(prop, rank, rows, written, case)
    return out


def _unsaved_sources(prop: str, rank: int, rows: list[tuple], written: Mapping, case: Case) -> list[ReadPlanViolated]:
    """Reads whose source lies outside every piece the save wrote (at the piece's own offsets)."""
    out = []
    save_layouts = case.layouts("save")
    for tensor, _, shape, src_piece, src_local in rows:
        if tensor not in written or isinstance(save_layouts.get(tensor), Flat) or math.prod(shape) == 0:
            continue
        pieces = [r for r in written[tensor][1] if isinstance(r, Box) and tuple(r.offsets) == tuple(src_piece)]
        inside = any(all(lo >= 0 and lo + n <= ps for lo, n, ps in zip(src_local, shape, p.shape)) for p in pieces)
        if not inside:
            out.append(ReadPlanViolated(prop, None, rank, tensor, "UnsavedSource",
                                        f"a read of {tensor!r} takes {list(shape)} at {list(src_local)} of the piece "
                                        f"at {list(src_piece)}, which no saved piece holds"))
    return out


def judge_cover(prop: str, tensors: Mapping[str, tuple[tuple[int, ...], list[Region]]]) -> Judgement:
    """The judgement of ``cover_violations``: silent corruption where any tensor is not covered exactly once."""
    found = cover_violations(prop, tensors)
    return judged(found) if found else Judgement(prop, Verdict.PASS)
