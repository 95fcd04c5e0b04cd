"""The history rules a training job would sign: resume never lost, never without a complete checkpoint, looks
complete => is complete (properties.check.history). Each is proven by a broken SUT of tests/suts/buggy.py that only its
rule catches — every other rule, old and new, passes it, so the checker before these rules passed it too — while
the reference passes the same ops. The ops need no ptrace: an async save left unfinished by a ``restart``."""

from __future__ import annotations

import dataclasses

import pytest

from harness.judging.fault_runs import standard_case
from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.check.facts import history
from properties.check.history import anomalies
from properties.model.case import Case, Op
from properties.model.outcome import OpRecord, Outcome

BUGGY = "tests.suts.buggy:"


def _ops(*ops: Op) -> Case:
    return dataclasses.replace(standard_case(), ops=ops, fault=None)


def save(version: int, detach: bool = False) -> Op:
    return Op("save", f"step-{version}", version, use_async=detach, detach=detach)


def load(version: int, by_name: bool = True) -> Op:
    return Op("load", f"step-{version}" if by_name else None, version)


# The previous save is acknowledged, the next one is started and never finishes (the job restarts before its wait).
UNFINISHED = (save(0), save(1, detach=True), Op("restart"))
RULES = [  # (anomaly, property, broken SUT, ops)
    pytest.param("resume-lost", "P-NOLOSS", "MovesLatestFirstSut",
                 _ops(*UNFINISHED, load(0, by_name=False), load(0), load(1)), id="resume-never-lost"),
    pytest.param("listed-incomplete", "P-ATOMIC", "IndexFirstSut",
                 _ops(*UNFINISHED, load(1), load(0, by_name=False), load(0)), id="looks-complete-is-complete"),
    pytest.param("no-complete-checkpoint", "P-NOLOSS", "RotationCountsUnfinishedSut",
                 _ops(save(0), save(1, detach=True), Op("rotate", keep=1), Op("restart"), load(0), load(1), save(2),
                      load(2)), id="never-without-complete"),  # the later save 2 must not excuse the gap
]


def _run(sut: str, case: Case) -> Outcome:
    judge = Judge(Runners(sut, "in-process"))
    try:
        return judge(dataclasses.replace(case, sut=sut))[1]
    finally:
        judge.close()


def _kinds(sut: str, case: Case, outcome: Outcome) -> list[str]:
    return [a.kind for a in anomalies(history(case, outcome), adapter_class(sut).clear_errors)]


@pytest.mark.parametrize("kind, prop, sut, case", RULES)
def test_only_its_rule_catches_the_broken_sut(kind: str, prop: str, sut: str, case: Case) -> None:
    outcome = _run(BUGGY + sut, case)
    found = anomalies(history(case, outcome), adapter_class(BUGGY + sut).clear_errors)
    assert [a.kind for a in found] == [kind], [a.render() for a in found]
    assert (found[0].property, found[0].verdict.value) == (prop, "data-loss")


@pytest.mark.parametrize("kind, prop, sut, case", RULES)
def test_the_reference_passes_the_same_ops(kind: str, prop: str, sut: str, case: Case) -> None:
    outcome = _run("reference", case)
    assert _kinds("reference", case, outcome) == []
    assert all(rec.complete for rec in outcome.records), [rec.complete for rec in outcome.records]


@pytest.mark.parametrize("kind, evidence", [("resume-lost", "a load by name"),
                                            ("no-complete-checkpoint", "failed loads after the rotation"),
                                            ("listed-incomplete", None)])
def test_without_the_listing_the_loads_show_what_they_can(kind: str, evidence: str | None) -> None:
    """A SUT that cannot tell what is complete (``complete`` gives None) is judged from its loads alone: the intact
    checkpoint latest skipped was loaded by name, and every checkpoint the rotation left failed by name. That a
    checkpoint looked complete, only the listing can say."""
    _, _, sut, case = next(p.values for p in RULES if p.values[0] == kind)
    outcome = _run(BUGGY + sut, case)
    for rec in outcome.records:
        rec.complete = None
    assert _kinds(BUGGY + sut, case, outcome) == ([kind] if evidence else [])


@pytest.mark.parametrize("kind, still", [("resume-lost", False), ("listed-incomplete", False),
                                         ("no-complete-checkpoint", True)])
def test_a_corruption_excuses_what_follows_it_only(kind: str, still: bool) -> None:
    """A ``corrupt`` op right after the restart may explain any failure after it, so latest failing and a listed
    checkpoint failing are not judged; a gap the job had before the corruption still is."""
    _, _, sut, case = next(p.values for p in RULES if p.values[0] == kind)
    restart = next(i for i, op in enumerate(case.ops) if op.kind == "restart")
    corrupted = dataclasses.replace(case, ops=(*case.ops[:restart + 1], Op("corrupt", seed=1),
                                               *case.ops[restart + 1:]))
    assert (kind in _kinds(BUGGY + sut, corrupted, _run(BUGGY + sut, corrupted))) is still


def test_ranks_replaced_after_a_failed_op_lose_what_they_had_in_flight() -> None:
    """After a fault the harness replaces the ranks of any op that failed (a wedged group must not be charged to
    the next op): a detached save in flight dies with them, so a later ``wait`` acknowledges nothing and an older
    latest is no data loss — found by P-LIFECYCLE, where a failed load after a power loss hid the restart."""
    from properties.check.history import check_history
    from properties.model.outcome import OpRecord
    from reference.engine import local_tensors

    case = dataclasses.replace(standard_case(), property="P-LIFECYCLE", ops=(
        save(0), save(1), save(2, detach=True), load(2), Op("wait"), load(1, by_name=False)),
        fault={"kind": "kill", "op": 1, "syscall": "openat", "k": 1, "path": "x"})
    layouts = case.layouts("load")
    older = {r: {n: lt.tensor for n, lt in local_tensors(case.state(1), layouts, r).items()} for r in (0, 1)}
    records = [OpRecord(0, "save", "step-0"), OpRecord(1, "save", "step-1"), OpRecord(2, "save", "step-2"),
               OpRecord(3, "load", "step-2", ok=False, error_type="CheckpointNotFound", error="rank 0: no step-2"),
               OpRecord(4, "wait", None), OpRecord(5, "load", None, loaded=older)]
    assert not check_history(case, Outcome("reference", records), None).ok  # the wait seemed to acknowledge it
    records[3].restarted = True
    assert check_history(case, Outcome("reference", records), None).ok


@pytest.mark.parametrize("settle, lost", [(None, False), ("wait", True), ("kill", True)])
def test_a_name_may_fail_clearly_only_while_its_re_save_is_in_flight(settle: str | None, lost: bool) -> None:
    """Saved and acknowledged, then saved again under the same name by a detached save: while that one is in flight
    a load of the name may find it half rewritten (paddle.save writes in place) and fail clearly. Once it is
    waited for, or killed, the name must load: a kill that tears down the acknowledged checkpoint is data loss."""
    resave = Op("save", "step-1", 1, use_async=True, detach=True)
    ops = (save(1), resave, *([Op(settle)] if settle else []), load(1))
    case = _ops(*ops)
    records = [OpRecord(i, op.kind, op.name) for i, op in enumerate(ops)]
    records[-1] = dataclasses.replace(records[-1], ok=False, error_type="SafetensorError",
                                      error="rank 0: Error while deserializing header: header too small")
    assert ("acknowledged-lost" in _kinds("reference", case, Outcome("reference", records))) is lost


@pytest.mark.parametrize("gave, before", [(0, True), (1, False)])
def test_a_load_of_a_name_never_saved_says_whether_an_earlier_load_gave_its_data(gave: int, before: bool) -> None:
    """A name nothing was saved under loads nothing; where it gives data, the anomaly says whether that data is a
    version an earlier load of the same job gave (a cache that ignores the name: Paddle's, met at 24 virtual ranks
    and on 2 real ones), and the known finding of that cache explains only that way."""
    from pathlib import Path

    from properties.check.history import check_history
    from properties.triage.known import explained_by, read_known
    from reference.engine import local_tensors

    case = dataclasses.replace(_ops(save(0), save(1), load(0), Op("load", "step-999", 0)), property="P-LIFECYCLE",
                               options={"same_dir": True})
    layouts = case.layouts("load")

    def state(version: int) -> dict:
        return {r: {n: lt.tensor for n, lt in local_tensors(case.state(version), layouts, r).items()} for r in (0, 1)}

    records = [OpRecord(0, "save", "step-0"), OpRecord(1, "save", "step-1"),
               OpRecord(2, "load", "step-0", loaded=state(0)), OpRecord(3, "load", "step-999", loaded=state(gave))]
    found = anomalies(history(case, Outcome("paddle-dcp", records)), adapter_class("paddle-dcp").clear_errors)
    unsaved = [a for a in found if a.kind == "loaded-unsaved"]
    assert len(unsaved) == 1 and unsaved[0].loaded_before is before
    known = read_known(Path(__file__).parent / "regressions")
    judgement = check_history(case, Outcome("paddle-dcp", records), None)
    assert explained_by(known, "paddle-dcp", judgement) == ("paddle-dcp-version-cache.json" if before else None)


@pytest.mark.parametrize("first, resaved", [("step-0", "other-layout"), ("step-7", None)])
def test_a_lost_acknowledged_save_says_whether_an_earlier_attempt_wrote_its_name(first: str,
                                                                                 resaved: str | None) -> None:
    """What an earlier attempt left under a name (a crashed async save's metadata, written before its data) can
    break the save that re-writes the name; the anomaly says whether there was one, and the known finding of
    Paddle's re-save keeping that metadata explains only that way."""
    ops = (Op("save", first, 0, use_async=True, detach=True, stall=True), Op("restart"),
           dataclasses.replace(save(0), layout="load"), load(0))  # re-saved by the restarted job on 1 rank
    one_rank = {"kind": "sharded", "mesh": {"shape": [1], "dim_names": ["d0"]}, "placements": ["R"], "owner": []}
    case = dataclasses.replace(_ops(*ops), property="P-LIFECYCLE",
                               load_layout={name: one_rank for name in standard_case().load_layout})
    records = [OpRecord(i, op.kind, op.name) for i, op in enumerate(ops)]
    lost, known = _last_load_lost(case, records, "global_data_files_set:{'0_0.distcp'}, "
                                                 "necessary_data_files_set:{'1_0.distcp', '0_0.distcp'}")
    assert lost.resaved == resaved
    assert known == ("paddle-dcp-resave-after-crashed-async-keeps-its-metadata.json" if resaved else None)


def _last_load_lost(case: Case, records: list[OpRecord], files: str) -> tuple:
    """The acknowledged-lost anomaly of the case's last op, a load failing with Paddle's "files are not complete"
    naming ``files``, and the known finding that explains the whole failure."""
    from pathlib import Path

    from properties.check.history import check_history
    from properties.triage.known import explained_by, read_known

    error = f"rank 0: The checkpoint files are not complete. Please check the checkpoint directory. {files}"
    records[-1] = dataclasses.replace(records[-1], ok=False, error_type="AssertionError", error=error)
    outcome = Outcome("paddle-dcp", records)
    lost = [a for a in anomalies(history(case, outcome), adapter_class("paddle-dcp").clear_errors)
            if a.kind == "acknowledged-lost"]
    assert len(lost) == 1
    known = read_known(Path(__file__).parent / "regressions")
    return lost[0], explained_by(known, "paddle-dcp", check_history(case, outcome, None))


@pytest.mark.parametrize("between, after", [((), True), ((Op("restart"),), False)])
def test_a_lost_acknowledged_save_says_whether_a_load_of_the_same_processes_failed_before(between: tuple,
                                                                                           after: bool) -> None:
    """A failed load may leave a module-global cache filled (Paddle's ``_metadata_manager``), and the next load of
    the same processes then fails with whatever that makes of its checkpoint; the anomaly says whether a load of the
    same processes failed before it, a restart between clears it, and the known finding explains only that way."""
    ops = (save(0), Op("load", "step-9", 0), *between, load(0))
    case = dataclasses.replace(_ops(*ops), property="P-LIFECYCLE", options={"format": "safetensors"})
    records = [OpRecord(i, op.kind, op.name) for i, op in enumerate(ops)]
    never = "rank 0: [Errno 2] No such file or directory: 'ckpt/step-9'"
    records[1] = dataclasses.replace(records[1], ok=False, error_type="FileNotFoundError", error=never)
    lost, known = _last_load_lost(case, records, "global_data_files_set:{'0_0.safetensors'}, "
                                                 "necessary_data_files_set:{'1_0.safetensors'}")
    assert lost.after_failed_load is after and not lost.resaved
    assert known == ("paddle-dcp-failed-load-poisons-next.json" if after else None)
