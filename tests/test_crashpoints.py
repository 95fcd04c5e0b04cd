"""The reference is the atomic design, so it must pass every fault: a SIGKILL at every syscall of a 2-rank,
4-tensor save (sync, and async with the writer process killed), every power-loss state of that save, and the
syscall errors, psutil kills, stalls and corruptions the fault strategies draw. Each crash is judged after a
restart: latest gives the acknowledged or the new checkpoint or a clear error (P-ATOMIC), the acknowledged one
survives bitwise (P-NOLOSS), and the next save recovers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from faults import strace
from faults.spec import ErrorFault, StateFault
from harness.judging.fault_runs import concrete_fault, crashpoints, crashstates, standard_case
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from properties.model.case import read_case_file

needs_strace = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")
FAULT_CASES = sorted((Path(__file__).parent / "fault_cases").glob("*.json"))


@pytest.fixture
def judge_case():
    judge = Judge(Runners("reference", "in-process"))
    yield judge
    judge.close()


@needs_strace
@pytest.mark.nightly
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_reference_is_atomic_at_every_crash_point(judge_case, use_async: bool) -> None:
    results = crashpoints(standard_case(use_async=use_async), judge_case)
    _check_points(results, use_async)


@needs_strace
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_ranks_and_writers_killed_at_sampled_crash_points(judge_case, use_async: bool) -> None:
    """CI's share: eight points spread over the save's IO, the rank's or its async writer's (the nightly run
    kills at every point)."""
    results = crashpoints(standard_case(use_async=use_async), judge_case, sample=8)
    assert len(results) == 8
    _check_points(results, use_async, exhaustive=False)


def _check_points(results: list, use_async: bool, exhaustive: bool = True) -> None:
    if exhaustive:
        assert len(results) >= 30  # files, manifests, index, renames, latest pointer: every one of them
    assert all(r.report.get("fired") for r in results), [r.fault for r in results if not r.report.get("fired")]
    failing = [(r.fault, r.judgement.details) for r in results if not r.judgement.ok]
    assert not failing, failing
    if exhaustive:
        assert {r.fault.syscall for r in results} >= {"write", "fsync", "rename", "openat"}
    targets = {r.report["target"] for r in results}
    if use_async:  # the writer process the rank spawns for the save does the IO, and is what dies
        assert any(t.endswith("(an async writer)") for t in targets), targets
    else:
        assert targets <= {"rank 0", "rank 1"}, targets


@needs_strace
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_reference_survives_every_power_loss_state(judge_case, use_async: bool) -> None:
    results, n_ops = crashstates(standard_case(use_async=use_async), judge_case.runners, confirm=judge_case)
    assert n_ops >= 30 and len(results) >= n_ops
    kinds = {r.fault.state["kind"] for r in results}
    assert {"prefix", "torn-half", "torn-zero", "lost-dirent"} <= kinds
    assert not [(r.description, r.judgement.details) for r in results if not r.judgement.ok]


@needs_strace
def test_a_drawn_state_resolves_and_replays_on_another_interleaving(judge_case) -> None:
    drawn = dataclasses.replace(standard_case(), fault={"kind": "power", "op": 1, "index": 40})
    concrete = concrete_fault(drawn, judge_case.runners)
    assert concrete is not None and isinstance(concrete.fault, StateFault)
    assert {0, 1} <= set(concrete.fault.schedule)  # both ranks' IO, in the recorded order
    for _ in range(3):  # ranks interleave differently each run; the schedule puts the IO back in recorded order
        judgement, outcome = judge_case(concrete)
        assert judgement.ok, judgement.details
        assert outcome.fault["fired"]


@needs_strace
def test_a_drawn_error_point_resolves_to_a_concrete_syscall_error(judge_case) -> None:
    drawn = dataclasses.replace(standard_case(), fault={"kind": "point", "op": 1, "index": 7, "action": "ENOSPC"})
    concrete = concrete_fault(drawn, judge_case.runners)
    assert isinstance(concrete.fault, ErrorFault) and concrete.fault.errno == "ENOSPC"
    judgement, outcome = judge_case(concrete)
    assert outcome.fault["fired"], outcome.fault
    assert not outcome.records[1].ok  # the save saw the error and said so
    assert judgement.ok, judgement.details


@pytest.mark.parametrize("fault", [
    {"kind": "kill-when", "op": 1, "rank": 1, "target": "tree", "bytes_written": 1},
    {"kind": "kill-when", "op": 1, "rank": 0, "target": "children", "delay": 0.0},
    {"kind": "stall", "op": 1, "rank": 1, "duration": 0.5, "delay": 0.0},
    {"kind": "fsize", "op": 1, "limit": 64},
    {"kind": "corrupt", "op": 1, "seed": 3, "corruption": "bitflip", "region": "any"},
], ids=lambda f: f["kind"])
def test_reference_passes_ptrace_free_faults(judge_case, fault: dict) -> None:
    case = dataclasses.replace(standard_case(use_async=True), fault=fault, options={"commit_timeout": 10})
    judgement, outcome = judge_case(case)
    assert judgement.ok, (judgement.details, outcome.fault)
    assert outcome.fault["mechanism"] in ("psutil", "file")
    if fault["kind"] == "corrupt":
        assert outcome.resolved_fault.plan["kind"] == "bitflip"  # the finding would carry the concrete plan


@needs_strace
@pytest.mark.parametrize("path", FAULT_CASES, ids=lambda p: p.stem)
def test_fault_cases_found_in_the_reference_stay_fixed(judge_case, path: Path) -> None:
    case, _ = read_case_file(path)
    judgement, _ = judge_case(case)
    assert judgement.ok, judgement.details


@needs_strace
def test_a_state_is_judged_by_what_the_sut_lists_on_the_state_itself(judge_case) -> None:
    """Without a "latest" load first, the load after the fault op is held to the listing after that op: it must
    be the listing of the power-loss state's root, not of the traced run's (where the save had finished)."""
    case = standard_case(latest=False)
    results, _ = crashstates(case, judge_case.runners, limit=12)
    assert results and all(r.judged for r in results)
    assert not [(r.description, r.judgement.details) for r in results if not r.judgement.ok]


@needs_strace
def test_a_sut_that_trains_itself_meets_each_crash_point_with_its_job_trained() -> None:
    """Its job lives in its rank processes, which a copy of the root does not carry: each crash point runs the ops
    before the fault op again, so the save the fault hits is a trained job's and the kill fires."""
    import dataclasses

    from harness.judging.fault_runs import as_fault_case
    from properties.model.case import Case, Op, read_case_file

    stem = "paddleformers-trainer-ema-threshold-reads-summed-loss"
    case: Case = read_case_file(Path(__file__).parent / "regressions" / f"{stem}.json")[0]
    case = dataclasses.replace(case, sut="tests.suts.buggy:TrainsItselfSut", property="P-RESUME", options={},
                               ops=(Op("train", None, 2), Op("save", "step-2", 2), Op("load", "step-2", 2)))
    judge = Judge(Runners(case.sut, "pool"))
    try:
        results = crashpoints(as_fault_case(case, latest=False, op=1), judge, sample=3)
    finally:
        judge.close()
    assert len(results) == 3 and all(r.report.get("fired") for r in results), [r.report for r in results]
    assert all(r.judged and r.judgement.ok for r in results), [r.judgement.details for r in results]


def test_a_job_life_keeps_its_own_ops_and_crashes_the_op_asked_for() -> None:
    """``crashpoints`` on a P-LIFECYCLE case (or any sequence) crashes one of its own ops, not the standard
    scenario's; ``--op`` names which (a rank op: never a restart or a corruption, which the harness does)."""
    import dataclasses

    from faults.spec import RecordFault
    from harness.judging.fault_runs import as_fault_case, fault_op_of, standard_case
    from properties.model.case import Op

    ops = (Op("save", "step-0", 0), Op("save", "step-1", 1), Op("restart"), Op("save", "step-1", 2),
           Op("load", None, 2))
    life = dataclasses.replace(standard_case(), property="P-LIFECYCLE", ops=ops)
    assert as_fault_case(life, latest=True) is life and fault_op_of(life) == 3
    picked = as_fault_case(life, latest=True, op=1)
    assert picked.ops == ops and picked.fault == RecordFault(op=1) and fault_op_of(picked) == 1
    for bad in (2, 5, -1):
        with pytest.raises(ValueError, match=f"--op {bad}"):
            as_fault_case(life, latest=True, op=bad)
    plain = dataclasses.replace(life, property="P-ROUNDTRIP", ops=ops[:2] + ops[4:])
    assert as_fault_case(plain, latest=True).ops != plain.ops  # not a job's life: the standard scenario
