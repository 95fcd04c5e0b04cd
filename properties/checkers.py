"""Pure checkers: judge what a save/load returned against what the oracle says it must be.

They never touch processes or files; they take recorded states (bitwise tensors) and return a Judgement.
"""

from __future__ import annotations

from collections.abc import Mapping

from reference.errors import CheckpointError
from reference.layout import Region
from reference.regions import check_exact_cover
from reference.tensor import Tensor, differences

from .anomalies import CoverViolated, OpFailed, SutError, TensorDiffers, judged
from .verdicts import Judgement, Verdict


def judge_states(prop: str, expected: Mapping[str, Tensor], actual: Mapping[str, Tensor] | BaseException) -> Judgement:
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


def judge_cover(prop: str, tensors: Mapping[str, tuple[tuple[int, ...], list[Region]]]) -> Judgement:
    """The judgement of ``cover_violations``: silent corruption where any tensor is not covered exactly once."""
    found = cover_violations(prop, tensors)
    return judged(found) if found else Judgement(prop, Verdict.PASS)
