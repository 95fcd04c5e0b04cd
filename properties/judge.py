"""Judge one case's outcome against the oracle: every load must equal the reference's slice of the expected
version bitwise, every save must succeed, and what was written must cover each tensor exactly once."""

from __future__ import annotations

from reference.engine import local_tensors
from reference.tensor import diff_states

from .case import Case
from .checkers import judge_cover, judge_states
from .outcome import OpRecord, Outcome
from .verdicts import Judgement, Verdict, worst


def judge(case: Case, outcome: Outcome) -> Judgement:
    prop = case.property
    results: list[Judgement] = []
    for op_case, rec in zip(case.ops, outcome.records):
        where = f"op {rec.index} ({rec.kind} {rec.name or 'latest'})"
        if not rec.ok:
            verdict = {"hang": Verdict.HANG, "crash": Verdict.CRASH}.get(rec.failure or "", Verdict.LOUD_FAILURE)
            results.append(Judgement(prop, verdict, (f"{where}: {rec.error_type}: {rec.error}",)))
            continue
        if rec.kind == "save" and rec.written:
            cover = judge_cover(prop, rec.written)
            if not cover.ok:
                results.append(Judgement(prop, cover.verdict, tuple(f"{where}: {d}" for d in cover.details)))
        if rec.kind in ("load", "train"):  # a train record holds the live state it reached
            problems = mismatch(case, op_case.version, rec)
            if problems:
                results.append(Judgement(prop, Verdict.SILENT_CORRUPTION, tuple(f"{where}, {d}" for d in problems)))
    if len(outcome.records) < len(case.ops) and not results:
        results.append(Judgement(prop, Verdict.CRASH, (f"only {len(outcome.records)} of {len(case.ops)} ops ran",)))
    return worst(results) or Judgement(prop, Verdict.PASS)


def mismatch(case: Case, version: int, rec: OpRecord) -> list[str]:
    """Differences between what each rank of ``rec`` holds (loaded, or trained to) and its slice of ``version``
    under the layouts the op ran with (empty: bitwise equal)."""
    which = case.op_layouts(rec.index)
    layouts = case.layouts(which)
    state = case.expected(version, which)
    out: list[str] = []
    for rank, got in sorted(rec.loaded.items()):
        expected = {n: lt.tensor for n, lt in local_tensors(state, layouts, rank).items()}
        out += [f"rank {rank}: {d}" for d in diff_states(expected, dict(got))]
    return out


def judge_diff(case: Case, sut: Outcome, ref: Outcome) -> Judgement:
    """P-DIFF: every load must give what the reference engine's own run of the same case gave."""
    results: list[Judgement] = []
    for rec, ref_rec in zip(sut.records, ref.records):
        where = f"op {rec.index} ({rec.kind} {rec.name or 'latest'})"
        if rec.ok != ref_rec.ok:
            said = f"{rec.error_type}: {rec.error}" if not rec.ok else "succeeded"
            theirs = f"{ref_rec.error_type}: {ref_rec.error}" if not ref_rec.ok else "succeeded"
            verdict = Verdict.LOUD_FAILURE if not rec.ok else Verdict.SILENT_CORRUPTION
            results.append(Judgement(case.property, verdict, (f"{where}: SUT {said}; reference {theirs}",)))
            continue
        for rank, got in sorted(rec.loaded.items()):
            j = judge_states(case.property, ref_rec.loaded.get(rank, {}), got)
            if not j.ok:
                results.append(
                    Judgement(
                        case.property, j.verdict, tuple(f"{where}, rank {rank} vs reference: {d}" for d in j.details)
                    )
                )
    return worst(results) or judge(case, sut)
