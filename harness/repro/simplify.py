"""Simplify before writing: try the simpler form of each choice of a case, one at a time, and keep a change only
if the harness still sees the finding's failure (the same verdict and words). A reader should meet the bug in the
plainest setting it appears in: sync rather than async, pickle rather than safetensors, ShardedWeight rather than
dist tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from properties.model.case import Case
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement

Variant = tuple[str, Callable[[Case], Case | None]]


def _options(key: str, simpler: str) -> Callable[[Case], Case | None]:
    """Set option ``key`` to its simpler value (also the SUT's default when the option is absent)."""
    def apply(case: Case) -> Case | None:
        if case.options.get(key, simpler) == simpler:
            return None
        return dataclasses.replace(case, options={**case.options, key: simpler})
    return apply


def _sync(case: Case) -> Case | None:
    """Every async save made sync (a scribble after return and a detached wait then mean nothing)."""
    if not any(op.use_async for op in case.ops) or any(op.stall for op in case.ops):
        return None
    ops = tuple(dataclasses.replace(op, use_async=False, mutate_after=False, detach=False)
                if op.kind == "save" else op for op in case.ops if op.kind not in ("wait", "kill", "resume"))
    return dataclasses.replace(case, ops=ops)


VARIANTS: tuple[Variant, ...] = (
    ("sync saves instead of async", _sync),
    ("pickle instead of safetensors", _options("format", "pickle")),
    ("ShardedWeight instead of dist tensors", _options("tensor_kind", "sharded_weight")),
)


def judged(case: Case, launch: str = "fresh", fixes: tuple[str, ...] = ()) -> tuple[Judgement, Outcome]:
    """The harness's judgement of ``case`` in fresh processes, with ``fixes`` applied, and what each op did."""
    return _judged(case, launch, fixes)[:2]


def _judged(case: Case, launch: str, fixes: tuple[str, ...] = ()) -> tuple[Judgement, Outcome, str | None]:
    """... and, for a failure, its root-cause bucket core (None when it passes)."""
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    judge = Judge(Runners(case.sut, mode=launch, fixes=fixes))
    try:
        judgement, outcome = judge(case)
        return judgement, outcome, None if judgement.ok else judge.bucket(case, judgement, outcome).core
    finally:
        judge.close()


def fails_alike(case: Case, finding: dict, launch: str = "fresh", core: str | None = None,
                fixes: tuple[str, ...] = ()) -> bool:
    """The case, judged on ``launch`` ranks, fails one of the ways the finding lists (verdict and words) and, given
    ``core``, in that bucket: the same bug, not another one with the same verdict."""
    judgement, _, found = _judged(case, launch, fixes)
    text = "\n".join(judgement.details)
    return (core is None or found == core) and any(
        judgement.verdict.value == way["verdict"] and way.get("expect", "") in text
        for way in (finding, *finding.get("or", [])))


def simplify(case: Case, finding: dict, launch: str = "fresh",
             still_fails: Callable[[Case, dict, str], bool] | None = None, fixes: tuple[str, ...] = (),
             ) -> tuple[Case, list[str], list[str]]:
    """(the simplest case that still fails alike on ``launch`` ranks, the simplifications kept, every one tried).
    By default a simplification is kept only while the case fails in the bucket the case itself fails in, judged
    the same way: a simpler case showing the finding's verdict through another known bug is not its repro."""
    if still_fails is None:
        core = _judged(case, launch, fixes)[2]

        def still_fails(simpler: Case, finding: dict, launch: str) -> bool:
            return fails_alike(simpler, finding, launch, core, fixes)

    kept: list[str] = []
    tried: list[str] = []
    for label, variant in VARIANTS:
        candidate = variant(case)
        if candidate is None or candidate == case:
            continue
        tried.append(label)
        if still_fails(candidate, finding, launch):
            case = candidate
            kept.append(label)
    return case, kept, tried
