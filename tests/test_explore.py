"""Bounded-exhaustive crash exploration (harness/campaign/explore.py): the shapes and their cases, the reference passing
every crash point and power-loss state of every shape (CI: every state of the shapes of up to 2 ops; nightly:
points too, and shapes of 3 ops), a broken SUT caught with the exact state named, and ``fuzz --faults`` judging
every crash point or state of a drawn fault where there are few."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import settings

from faults import strace
from faults.spec import KillFault, PointFault, PowerFault, StateFault
from harness.campaign.explore import explore, family, shape_case, shape_ops, shape_writes, shapes
from harness.campaign.results import Finding
from harness.cli import main
from harness.judging.fault_runs import standard_case
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.report.html import render
from harness.report.summary import finding_json
from harness.sut import adapter_class
from properties.model.case import Op, read_case_file
from reference.layout import layout_from_json

needs_strace = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")
NIGHTLY = settings.default.max_examples >= 1000  # the nightly profile: the long enumerations
REFERENCE = adapter_class("reference").capabilities
BROKEN = "tests.suts.buggy:IndexFirstSut"  # publishes a checkpoint's index before its data


def test_shapes_start_with_a_save_and_use_only_what_the_sut_claims() -> None:
    assert shapes(REFERENCE, 2) == ["S", "SS", "SR", "ST", "SA"]
    assert len(shapes(REFERENCE, 3)) == 21
    assert shapes(set(), 2) == ["S", "SS", "SR"]  # no rotation, no async save claimed
    assert len(shapes(set(), 3)) == 7
    assert shapes({"async"}, 2) == ["S", "SS", "SR", "SA"]
    assert shape_ops("SA", latest=False)[:2] == (Op("save", "step-0", 0), Op("save", "step-1", 1, use_async=True))


def test_a_shape_ends_with_the_recovery_tail() -> None:
    ops = shape_ops("SRT", latest=True)
    assert ops[:3] == (Op("save", "step-0", 0), Op("save", "step-0", 1), Op("rotate", keep=1))
    assert ops[3:] == (Op("load", None, 1), Op("load", "step-0", 1), Op("save", "step-3", 3),
                       Op("load", "step-3", 3))
    ops = shape_ops("SSR", latest=False)  # every name by the version its last save wrote, newest first
    assert [(o.kind, o.name, o.version) for o in ops[3:]] == [
        ("load", "step-1", 2), ("load", "step-0", 0), ("save", "step-3", 3), ("load", "step-3", 3)]


def test_a_training_shape_trains_to_each_step_it_saves_and_faults_only_the_saves() -> None:
    """A SUT running its own loop saves the step it is at: each new save trains to its step, a re-save resumes the
    job from the name's step and saves it again, the tail trains to a new step before saving it; the fault ops are
    the shape's saves, not the trains and resumes before them."""
    ops = shape_ops("SRA", latest=False, trains=True)
    assert [(o.kind, o.name, o.version, o.use_async) for o in ops] == [
        ("train", None, 1, False), ("save", "step-1", 1, False),
        ("load", "step-1", 1, False), ("save", "step-1", 1, False),
        ("train", None, 3, False), ("save", "step-3", 3, True),
        ("load", "step-3", 3, False), ("load", "step-1", 1, False),
        ("train", None, 4, False), ("save", "step-4", 4, False), ("load", "step-4", 4, False)]
    caps = {"trains", "async", "replicated", "dtype:F32", "dtype:BF16", "dtype:I64", "ema_start:first"}
    case = shape_case("paddleformers-trainer", caps, 2, "SRA")
    assert shape_writes(case, "SRA") == [1, 3, 5]
    assert case.training is not None and case.training["ema_start"] == "first"  # the SUT's loop, as it claims
    assert {t.name for t in case.tensors} == {"w", "b"}
    assert {"model/w", "master/w", "optimizer/b.m2", "ema/b", "rng/state", "meta/step"} <= set(case.save_layout)


def test_the_state_is_the_fixed_family_within_the_sut_claims() -> None:
    case = shape_case("reference", REFERENCE, 2, "SS")
    by_name = {t.name: t for t in case.tensors}
    assert by_name["model/emb"].shape == (0, 3) and by_name["ema/w"].dtype == "BF16"
    uneven = layout_from_json(case.save_layout["model/w"])
    assert [uneven.local((5, 2), rank).region.shape[0] for rank in (0, 1)] == [3, 2]
    assert case.save_layout["model/b"]["placements"] == ["R"]
    tensors, layout = family({"trainer_state", "replicated", "dtype:F32", "dtype:BF16"}, 2)
    names = {t.name for t in tensors}  # a trainer's state, no zero-size tensor where the SUT does not claim it
    assert {"model/w", "master/w", "optimizer/w.m1", "model/b"} <= names
    assert all(t.shape != (0,) for t in tensors)
    assert all(lay["placements"] == ["R"] for lay in layout.values())
    with pytest.raises(ValueError):
        shape_case("paddle-save", adapter_class("paddle-save").capabilities, 2, "ST")  # it claims no rotation


def _counts(reports) -> dict[str, tuple[int, int, int]]:
    return {r.shape: (r.judged, r.total, len(r.failing)) for r in reports}


@needs_strace
@pytest.mark.slow
def test_reference_passes_every_power_loss_state_of_one_and_two_saves() -> None:
    """CI's share: every power-loss state of every op of the shapes S and SS (the other shapes, their crash
    points, and shapes of 3 ops run nightly)."""
    judge = Judge(Runners("reference", "in-process"))
    try:
        reports = explore("reference", judge.runners, 2, 2, judge, points=False, only=("S", "SS"))
    finally:
        judge.close()
    counts = _counts(reports)
    print("reference, power-loss states, judged/total/failing per shape:", counts)
    assert set(counts) == {"S", "SS"}
    for r in reports:
        assert r.control.ok and not r.errors
        assert r.total >= 50 and r.judged == r.total, (r.shape, r.row())
        assert not r.failing, [(f.description, f.judgement.details) for f in r.failing]
    assert counts["SS"][1] > counts["S"][1]  # both saves of SS were explored


@needs_strace
@pytest.mark.nightly
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("max_len", [2, 3])
def test_reference_passes_every_crash_point_and_state_of_every_shape(max_len: int) -> None:
    judge = Judge(Runners("reference", "in-process"))
    try:
        reports = explore("reference", judge.runners, 2, max_len, judge)
    finally:
        judge.close()
    print(f"reference, shapes of up to {max_len} ops, judged/total/failing:", _counts(reports))
    assert len(reports) == len(shapes(REFERENCE, max_len))
    for r in reports:
        assert r.points and r.states and r.judged == r.total, r.row()
        assert not r.failing, [(f.description, f.judgement.details) for f in r.failing]


@needs_strace
@pytest.mark.slow
def test_a_broken_sut_is_caught_and_the_finding_names_its_exact_state(tmp_path: Path) -> None:
    code = main(["crashpoints", "--exhaustive", "--sut", BROKEN, "--shape", "S", "--only", "states",
                 "--launch", "in-process",
                 "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "explore.json").read_text())
    assert code == 1 and summary["failing"] > 0 and summary["judged"] == summary["total"], summary
    finding = Path(summary["findings"][0])
    case, data = read_case_file(finding)
    assert isinstance(case.fault, StateFault), case.fault  # the exact state, not an index
    assert data["verdict"] == "data-loss"
    judge = Judge(Runners(case.sut, "in-process"))
    try:
        judgement, _ = judge(case)  # the finding replays as it is
    finally:
        judge.close()
    assert not judgement.ok and judgement.verdict.value == "data-loss", judgement.details


@needs_strace
@pytest.mark.slow
def test_a_failure_without_any_fault_does_not_excuse_the_faults(tmp_path: Path) -> None:
    """The broken SUT also fails a plain load of its zero-size tensor: the shape's control fails, which would excuse
    every state. The exploration drops the tensor that makes the control fail, says so, and still catches the
    atomicity bug in the rest of the state."""
    code = main(["crashpoints", "--exhaustive", "--sut", "tests.suts.buggy:ZeroSizeIndexFirstSut", "--shape", "S",
                 "--only", "states", "--launch", "in-process", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "explore.json").read_text())
    (row,) = summary["shapes"]
    assert row["control"] == "pass (full state: data-loss; explored without model/emb)", row
    assert code == 1 and summary["failing"] > 0 and row["excused"] == 0, summary
    case, _ = read_case_file(Path(summary["findings"][0]))
    assert "model/emb" not in {t.name for t in case.tensors}  # the finding replays on the state explored


@needs_strace
@pytest.mark.slow
def test_every_crash_point_can_fail_with_an_errno_instead() -> None:
    """``--errno``: each call a save makes under the root fails with that errno instead of the kill, and the job
    goes on as the SUT lets it. The reference survives every one: a failed save raises (its peers give up at the
    commit timeout, short here) and leaves the older checkpoints whole."""
    judge = Judge(Runners("reference", "in-process"))
    try:
        (report,) = explore("reference", judge.runners, 2, 1, judge, options={"commit_timeout": 2}, states=False,
                            errno="ENOSPC")
    finally:
        judge.close()
    assert report.points and not report.states and report.judged == report.total, report.row()
    assert {r.fault.kind for r in report.points} == {"error"} and {r.fault.errno for r in report.points} == {"ENOSPC"}
    assert {r.fault.syscall for r in report.points} >= {"openat", "write", "rename"}
    assert not report.failing, [(f.description, f.judgement.details) for f in report.failing]


@needs_strace
def test_fuzz_judges_every_state_of_a_drawn_fault_below_the_bound() -> None:
    """State 0 (nothing of the save on disk) passes on its own; judged with every other state of the save, the
    broken SUT fails, and the judgement names the concrete state that did it."""
    case = shape_case(BROKEN, REFERENCE, 2, "S")
    drawn = dataclasses.replace(case, fault=PowerFault(op=0, index=0))
    judge = Judge(Runners(BROKEN, "in-process"), exploring=True)
    try:
        alone, _ = judge(drawn)  # bound 0: only the drawn state
        judge.exhaustive = 1000
        judgement, outcome = judge(drawn)
    finally:
        judge.close()
    assert alone.ok, alone.details
    assert not judgement.ok, judgement.details
    assert isinstance(outcome.resolved_fault, StateFault) and outcome.resolved_fault.state["prefix"] > 0
    # The finding carries the crash-point map of its op: every state judged, placed on the recorded IO by verdict.
    io_map = outcome.io_map
    assert io_map is not None and {e["kind"] for e in io_map["events"]} >= {"write", "rename"}
    verdicts = [m["verdict"] for m in io_map["marks"]]
    assert all(m["kind"] == "state" for m in io_map["marks"]) and "pass" in verdicts
    assert any(v not in ("pass", None) for v in verdicts), verdicts
    row = finding_json(Finding(dataclasses.replace(drawn, fault=outcome.resolved_fault), judgement,
                               io_map=io_map), "ckpt-harness replay f.json")
    assert row["io_map"] == io_map  # the finding's JSON carries it; the campaign's page draws one per finding
    page = render({"sut": BROKEN}, [row])
    assert f"Crash-point map: finding 0 ({case.property}, bucket None)" in page
    assert page.count("class='mark state'") == len(io_map["marks"])


@needs_strace
def test_fuzz_samples_above_the_bound_and_reports_how_many_it_judged_below() -> None:
    drawn = dataclasses.replace(standard_case(), fault=PointFault(op=1, index=3))
    judge = Judge(Runners("reference", "in-process"), exploring=True, exhaustive=2)
    try:
        sampled, outcome = judge(drawn)  # more than 2 points: just the drawn one, as before
        assert sampled.ok and isinstance(outcome.resolved_fault, KillFault)
        judge.exhaustive = 1000
        drawn = dataclasses.replace(drawn, fault=PointFault(op=1, index=3, syscalls=["rename", "renameat"]))
        every, _ = judge(drawn)
    finally:
        judge.close()
    assert every.ok and every.details[0].startswith("every one of "), every.details
    assert "none failing" in every.details[0]
