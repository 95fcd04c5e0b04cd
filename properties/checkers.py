"""Pure checkers: judge what a save/load returned against what the oracle says it must be.

They never touch processes or files; they take recorded states (bitwise tensors) and return a Judgement.
"""

from __future__ import annotations

from collections.abc import Mapping

from reference.errors import CheckpointError
from reference.layout import Region
from reference.regions import check_exact_cover
from reference.tensor import Tensor, diff_states

from .verdicts import Judgement, Verdict


def judge_states(prop: str, expected: Mapping[str, Tensor], actual: Mapping[str, Tensor] | BaseException) -> Judgement:
    """Bitwise equality of two states; an exception where data was expected is a loud failure."""
    if isinstance(actual, BaseException):
        return Judgement(prop, Verdict.LOUD_FAILURE, (f"{type(actual).__name__}: {actual}",))
    problems = diff_states(dict(expected), dict(actual))
    if problems:
        return Judgement(prop, Verdict.SILENT_CORRUPTION, tuple(problems))
    return Judgement(prop, Verdict.PASS)


def judge_cover(prop: str, tensors: Mapping[str, tuple[tuple[int, ...], list[Region]]]) -> Judgement:
    """Saved slices of every tensor must cover it exactly once (lost slices lose data; duplicates waste it and
    hide disagreements between replicas)."""
    problems = []
    for name, (shape, regions) in tensors.items():
        try:
            check_exact_cover(name, shape, regions)
        except CheckpointError as exc:
            problems.append(str(exc))
    if problems:
        return Judgement(prop, Verdict.SILENT_CORRUPTION, tuple(problems))
    return Judgement(prop, Verdict.PASS)
