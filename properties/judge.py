"""Judge one case's outcome against the oracle: every load must equal the reference's slice of the expected
version bitwise, every save must succeed, and what was written must cover each tensor exactly once."""

from __future__ import annotations

from reference.engine import local_tensors

from .case import Case
from .checkers import judge_cover, judge_states
from .outcome import Outcome
from .verdicts import Judgement, Verdict, worst


def judge(case: Case, outcome: Outcome) -> Judgement:
    prop = case.property
    layouts = case.layouts("load")
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
        if rec.kind == "load":
            expected_state = case.state(op_case.version)
            for rank, got in sorted(rec.loaded.items()):
                expected = {n: lt.tensor for n, lt in local_tensors(expected_state, layouts, rank).items()}
                j = judge_states(prop, expected, got)
                if not j.ok:
                    results.append(Judgement(prop, j.verdict, tuple(f"{where}, rank {rank}: {d}" for d in j.details)))
    if len(outcome.records) < len(case.ops) and not results:
        results.append(Judgement(prop, Verdict.CRASH, (f"only {len(outcome.records)} of {len(case.ops)} ops ran",)))
    return worst(results) or Judgement(prop, Verdict.PASS)


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
