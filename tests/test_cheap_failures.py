"""A fuzzing judge does not wait out ranks stuck behind one that raised (Runners.fast_failures): the case stops
there, the first of its bucket is run again waiting every wait out (as ``replay`` does), later ones are not."""

from __future__ import annotations

import time

from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from properties.model.case import Case, Op, TensorCase
from properties.model.verdicts import Excuse
from properties.triage.known import Known, Signature
from reference.layout import Mesh, replicated

SUT = "tests.suts.buggy:RaisesWhilePeerTimesOutSut"


def _case(seed: int) -> Case:
    layout = {"w": replicated(Mesh((2,))).to_json()}
    return Case("P-ROUNDTRIP", SUT, (TensorCase("w", "F32", (2 + seed,), seed),), layout, layout,
                (Op("save", "step-0"), Op("load", "step-0"), Op("load", "step-0")), {}, seed)


def _timed(judge: Judge, case: Case):
    start = time.monotonic()
    judgement, outcome = judge(case)
    return judgement, outcome, time.monotonic() - start


def test_the_first_stuck_failure_of_a_bucket_is_waited_out_and_later_ones_are_not() -> None:
    judge = Judge(Runners(SUT, "pool"), exploring=True)
    try:
        first, first_outcome, waited = _timed(judge, _case(1))
        assert not first.ok and not first_outcome.cut_short and waited >= 4.0  # the settling run waited
        # It ran every op: the second load met the peer's timeout too (what the job would see).
        assert len(first_outcome.records) == 3
        again, outcome, fast = _timed(judge, _case(2))
        assert not again.ok and outcome.cut_short and fast < 4.0
        assert len(outcome.records) == 2 and outcome.records[1].silent == (1,)
        assert "cannot read its shard" in outcome.records[1].error  # the raiser is cited, not the stuck rank
        assert judge.bucket(_case(2), again, outcome) == judge.bucket(_case(1), first, first_outcome)
        assert judge.runners.recovery()["failure_wait_seconds"] > 0
    finally:
        judge.close()


def test_a_stuck_failure_a_known_finding_explains_is_known_without_waiting() -> None:
    known = Known("peer-times-out", SUT, "loud-failure", Signature.parse(
        {"anomaly": "op-failed", "error_type": "ValueError", "message": {"regex": "cannot read its shard"}}))
    judge = Judge(Runners(SUT, "pool"), exploring=True, known=[known])
    try:
        first, _, _ = _timed(judge, _case(1))
        assert first.excuse is Excuse.KNOWN
        again, outcome, fast = _timed(judge, _case(2))
        assert again.excuse is Excuse.KNOWN and outcome.cut_short and fast < 4.0
        assert judge.known_hits["peer-times-out"] == 2
    finally:
        judge.close()


def test_replay_waits_every_wait() -> None:
    judge = Judge(Runners(SUT, "pool"))
    try:
        judgement, outcome, waited = _timed(judge, _case(1))
        assert not judgement.ok and not outcome.cut_short and waited >= 4.0 and len(outcome.records) == 3
    finally:
        judge.close()


def test_a_cases_own_restart_is_a_fresh_launch_not_a_recovery() -> None:
    """A restart op asks for fresh processes: its launches are counted apart from those that replaced ranks lost to
    a failure, so the campaign's recovery share says what failures cost."""
    layout = {"w": replicated(Mesh((2,))).to_json()}
    case = Case("P-RESUME", "reference", (TensorCase("w", "F32", (3,), 0),), layout, layout,
                (Op("save", "step-0"), Op("restart"), Op("load", "step-0")), {}, 0)
    judge = Judge(Runners("reference", "pool"), exploring=True)
    try:
        judgement, _ = judge(case)
        judge(case)
        assert judgement.ok, judgement
        recovery = judge.runners.recovery()
    finally:
        judge.close()
    assert (recovery["restart_losses"], recovery["failure_losses"]) == (2, 0)
    assert recovery["replacement_launch_seconds"] == 0 and recovery["restart_launch_seconds"] > 0, recovery
