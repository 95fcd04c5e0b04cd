"""A failure that is only ranks dying or hanging runs once more while fuzzing (harness.judging.judge): one the same ops
do not repeat is a pass excused as flaky and listed in the campaign's report; one that repeats, any failure about
data, a fault case and a replay stand as they are."""

from __future__ import annotations

import dataclasses
import json

import pytest

from faults.spec import KillFault
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from properties.check.anomalies import (
    At,
    OpsMissing,
    OutcomeDiffers,
    RankDied,
    RankHung,
    SutError,
    TensorDiffers,
    judged,
)
from properties.model.case import Case, Op, TensorCase
from properties.model.outcome import Outcome
from properties.model.verdicts import Excuse, Judgement, Verdict, worst
from reference.layout import Mesh, replicated
from reference.tensor import Missing

AT = At(0, "save", "step-1")
DIED = judged([RankDied("P-DIFF", AT, SutError(None, "rank 0 died during op 0", "crash"))])
HUNG = judged([RankHung("P-DIFF", AT, SutError(None, "rank 1 did not answer", "hang"))])
DIFFERED = worst([judged([OutcomeDiffers("P-DIFF", AT, SutError(None, "rank 0 died", "crash"), None)]),
                  judged([OpsMissing("P-DIFF", 1, 2)])])
WRONG = judged([TensorDiffers("P-DIFF", At(1, "load", "step-1"), 0, Missing("w"), against="reference")])
PASSED = Judgement("P-DIFF", Verdict.PASS)


def _case() -> Case:
    t = TensorCase("w", "F32", (2,), 1)
    layout = {"w": replicated(Mesh((1,))).to_json()}
    return Case("P-DIFF", "reference", (t,), layout, layout, (Op("save", "step-1"), Op("load", "step-1")))


class Scripted(Judge):
    """Answers each run of a case with the next judgement of a script (the runs themselves are not the point)."""

    def __init__(self, script: list[Judgement], exploring: bool = True) -> None:
        super().__init__(Runners("reference", "in-process"), exploring=exploring)
        self.script = list(script)
        self.runs = 0

    def _judge(self, case: Case) -> tuple[Judgement, Outcome]:
        self.runs += 1
        return self.script.pop(0), Outcome(case.sut)


@pytest.mark.parametrize("first", [DIED, HUNG, DIFFERED], ids=["died", "hung", "outcome-differs"])
def test_ranks_stopping_once_is_flaky(first: Judgement) -> None:
    judge = Scripted([first, PASSED])
    judgement, _ = judge(_case())
    assert judgement.ok and judgement.excuse is Excuse.FLAKY and judge.runs == 2
    assert judgement.details[0].startswith("flaky: ") and judgement.anomalies == first.anomalies
    assert judge.flaky == [f"P-DIFF: {first.details[0]}"]


def test_ranks_stopping_again_stands() -> None:
    judge = Scripted([DIED, DIED])
    judgement, _ = judge(_case())
    assert judgement == DIED and judge.runs == 2 and not judge.flaky


@pytest.mark.parametrize("exploring,fault,first", [
    (False, None, DIED),  # a replay reports what happened
    (True, KillFault(op=0, syscall="openat", k=1), DIED),  # a fault case's deaths are the fault's business
    (True, None, WRONG),  # data the SUT got wrong is never put down to chance
], ids=["replay", "fault-case", "data"])
def test_other_failures_are_not_run_again(exploring: bool, fault, first: Judgement) -> None:
    judge = Scripted([first, PASSED], exploring=exploring)
    judgement, _ = judge(dataclasses.replace(_case(), fault=fault))
    assert judgement == first and judge.runs == 1 and not judge.flaky


def test_a_campaign_reports_its_flaky_failures_and_goes_on(tmp_path) -> None:
    from harness.campaign.fuzz import fuzz
    from harness.campaign.results import Campaign
    from harness.report.summary import write_results
    from harness.sut import adapter_class

    class FirstRunDies(Judge):
        runs = 0

        def _judge(self, case: Case) -> tuple[Judgement, Outcome]:
            FirstRunDies.runs += 1
            return (DIED, Outcome(case.sut)) if FirstRunDies.runs == 1 else super()._judge(case)

    judge = FirstRunDies(Runners("reference", "in-process"), exploring=True)
    try:
        campaign = fuzz(judge, Campaign("reference", 1, ["P-ROUNDTRIP"], 60.0, 0, mode="in-process",
                                        cases_per_property=3),
                        frozenset(adapter_class("reference").capabilities))
    finally:
        judge.close()
    write_results(campaign, tmp_path)
    assert not campaign.findings and campaign.cases_run["P-ROUNDTRIP"] > 1
    assert json.loads((tmp_path / "summary.json").read_text())["flaky_failures"] == [f"P-ROUNDTRIP: {DIED.details[0]}"]
    assert "passed when run again (flaky, not shrunk): P-ROUNDTRIP: op 0" in (tmp_path / "report.md").read_text()
