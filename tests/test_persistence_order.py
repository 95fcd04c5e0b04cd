"""Persistence-order analysis (faults/persistence.py, harness/judging/persistence_order.py): a save's recorded IO
judged against the durability contract — records vouch only for durable data, an acknowledged save is durable —
on constructed traces of the usual commit protocols, and on a real recorded save of the reference (which keeps
the contract) through the judge."""

from __future__ import annotations

import dataclasses

import pytest

from faults import strace
from faults.errors import FaultSpecError
from faults.fsmodel import FsOp
from faults.persistence import NOT_DURABLE, RECORD_BEFORE_DATA, order_violations
from faults.spec import PowerFault, RecordFault
from harness.campaign.explore import shape_case
from harness.judging.judge import Judge
from harness.judging.persistence_order import found_under, order_judgement
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.model.outcome import Outcome

needs_strace = pytest.mark.skipif(not strace.available(), reason="needs strace with ptrace permitted")


class _Ops:
    """A trace under construction: each call appended with its index as the handle later calls use."""

    def __init__(self) -> None:
        self.ops: list[FsOp] = []

    def add(self, kind: str, path: str = "", **kw) -> int:
        self.ops.append(FsOp(kind, path, call=kind, seq=len(self.ops), **kw))
        return len(self.ops) - 1

    def file(self, path: str, data: bytes, fsync: bool = True) -> None:
        fd = self.add("open", path, create=True, trunc=True)
        self.add("write", path, handle=fd, data=data)
        if fsync:
            self.add("fsync", path, handle=fd)

    def dir_fsync(self, path: str) -> None:
        fd = self.add("open", path, is_dir=True)
        self.add("fsync", path, handle=fd)


def _rules(ops: list[FsOp]) -> set[tuple[str, str, str]]:
    return {(v.kind, v.record, v.path) for v in order_violations(ops)}


def test_a_staged_commit_that_fsyncs_everything_keeps_the_contract() -> None:
    """Data files and the index written in a staging directory, fsynced, the directory fsynced, renamed into place,
    its parent fsynced; then ``latest`` through a temporary and a rename: nothing to report."""
    t = _Ops()
    t.add("mkdir", ".staging")
    t.file(".staging/rank-0.safetensors", b"\x01" * 64)
    t.file(".staging/rank-1.safetensors", b"\x02" * 64)
    t.file(".staging/index.json", b'{"files": ["rank-0.safetensors", "rank-1.safetensors"]}')
    t.dir_fsync(".staging")
    t.add("rename", ".staging", new_path="step-1")
    t.dir_fsync("")
    t.file(".latest.tmp", b"step-1")
    t.add("rename", ".latest.tmp", new_path="latest")
    t.dir_fsync("")
    assert _rules(t.ops) == set()


def test_a_record_written_before_its_data_is_reported_with_the_calls() -> None:
    """Paddle's shape: the coordinator writes the metadata naming every rank's data file before the ranks write
    them, and nothing is fsynced."""
    t = _Ops()
    t.add("mkdir", "step-0")
    t.file("step-0/0.metadata", b"...0_0.distcp...1_0.distcp...", fsync=False)
    t.file("step-0/0_0.distcp", b"\x01" * 32, fsync=False)
    t.file("step-0/1_0.distcp", b"\x02" * 32, fsync=False)
    found = order_violations(t.ops)
    before = [v for v in found if v.kind == RECORD_BEFORE_DATA]
    assert {v.path for v in before} == {"step-0/0_0.distcp", "step-0/1_0.distcp"}
    assert all(v.record == "step-0/0.metadata" and "named before it is written" in v.why for v in before)
    assert "write step-0/0.metadata" in before[0].calls[0] and "write step-0/0_0.distcp" in before[0].calls[1]
    assert {v.path for v in found if v.kind == NOT_DURABLE} == {"step-0", "step-0/0.metadata", "step-0/0_0.distcp",
                                                                "step-0/1_0.distcp"}


def test_a_pointer_renamed_into_place_before_its_checkpoint_is_durable() -> None:
    """``latest`` moved to a checkpoint whose data was written but never fsynced: the rename vouches too early,
    whatever the checkpoint's own directory holds; an unlinked temporary is not required to be durable."""
    t = _Ops()
    t.add("mkdir", "step-2")
    t.file("step-2/data.bin", b"\x03" * 16, fsync=False)
    t.dir_fsync("step-2")
    t.dir_fsync("")
    t.file("scratch.tmp", b"x", fsync=False)
    t.add("unlink", "scratch.tmp")
    t.file(".latest.tmp", b"step-2")
    t.add("rename", ".latest.tmp", new_path="latest")
    t.dir_fsync("")
    found = _rules(t.ops)
    assert (RECORD_BEFORE_DATA, "latest", "step-2") in found
    assert (NOT_DURABLE, "", "step-2/data.bin") in found
    assert not any("scratch" in path for _, _, path in found)


def test_a_scratch_record_the_op_removes_vouches_for_nothing() -> None:
    """A rank prepares its part in a private directory (a manifest naming its data file, the directory never
    fsynced) and removes it before the save returns: nothing reads that manifest, so it breaks no rule; the same
    manifest kept is a record that vouches too early."""
    def prepared(removed: bool) -> list[FsOp]:
        t = _Ops()
        t.add("mkdir", ".private")
        t.file(".private/rank-1.safetensors", b"\x05" * 16)
        t.file(".private/rank-1.manifest.json", b'{"file": "rank-1.safetensors"}')
        if removed:
            t.add("unlink", ".private/rank-1.manifest.json")
            t.add("unlink", ".private/rank-1.safetensors")
            t.add("rmdir", ".private")
        t.add("sync")
        return t.ops

    assert _rules(prepared(removed=True)) == set()
    assert (RECORD_BEFORE_DATA, ".private/rank-1.manifest.json", ".private/rank-1.safetensors") in _rules(
        prepared(removed=False))


def test_a_record_renamed_twice_vouches_at_its_last_rename() -> None:
    """A writer that saves durably through a temporary (``x.tmp.part`` -> ``x.tmp``), called by code that renames
    ``x.tmp`` -> ``x`` in turn: the record is published by the last rename, so only what is not durable then
    counts, and the violation names the record's final name."""
    def saved(durable_before_final: bool) -> list[FsOp]:
        t = _Ops()
        t.add("mkdir", "step-1")
        t.dir_fsync("")
        t.file("step-1/0_0.distcp", b"\x06" * 16)
        t.file("step-1/0.metadata.tmp.part", b"...0_0.distcp...")
        t.add("rename", "step-1/0.metadata.tmp.part", new_path="step-1/0.metadata.tmp")
        if durable_before_final:
            t.dir_fsync("step-1")
        t.add("rename", "step-1/0.metadata.tmp", new_path="step-1/0.metadata")
        t.dir_fsync("step-1")
        return t.ops

    assert _rules(saved(durable_before_final=True)) == set()
    assert _rules(saved(durable_before_final=False)) == {(RECORD_BEFORE_DATA, "step-1/0.metadata",
                                                          "step-1/0_0.distcp")}


def test_a_record_naming_data_not_yet_written_is_reported_under_its_final_name() -> None:
    """A record that names a file written only later (an async writer's) is reported at its publication, under the
    name it is published by: the same finding whether the writer underneath goes through one temporary or two."""
    def saved(temporaries: list[str]) -> list[FsOp]:
        t = _Ops()
        t.add("mkdir", "step-1")
        t.dir_fsync("")
        t.file(f"step-1/{temporaries[0]}", b"...0_0.distcp...")
        for old, new in zip(temporaries, [*temporaries[1:], "0.metadata"], strict=True):
            t.add("rename", f"step-1/{old}", new_path=f"step-1/{new}")
        t.dir_fsync("step-1")
        t.file("step-1/0_0.distcp", b"\x06" * 16)
        t.dir_fsync("step-1")
        return t.ops

    one = _rules(saved(["0.metadata.tmp"]))
    assert one == {(RECORD_BEFORE_DATA, "step-1/0.metadata", "step-1/0_0.distcp")}
    assert _rules(saved(["0.metadata.tmp.tmp", "0.metadata.tmp"])) == one


def test_a_bare_name_names_a_file_beside_the_record_not_one_in_a_sibling_directory() -> None:
    """One save of split families: each family directory gets its own data file and metadata, one after the other.
    The model's metadata names ``0_0.distcp``, its own file, not the EMA family's file of the same name written
    after it; a metadata that names a sibling's file by its path from its directory still vouches for it."""
    def saved(model_names: bytes) -> list[FsOp]:
        t = _Ops()
        for family in ("model", "ema"):
            t.add("mkdir", f"step-1/{family}")
            t.dir_fsync("step-1")
        for family, names in (("model", model_names), ("ema", b"...0_0.distcp...")):
            t.file(f"step-1/{family}/0_0.distcp", b"\x06" * 16)
            t.dir_fsync(f"step-1/{family}")
            t.file(f"step-1/{family}/0.metadata", names)
            t.dir_fsync(f"step-1/{family}")
        return t.ops

    assert _rules(saved(b"...0_0.distcp...")) == set()
    assert _rules(saved(b"...0_0.distcp ../ema/0_0.distcp...")) == {
        (RECORD_BEFORE_DATA, "step-1/model/0.metadata", "step-1/ema/0_0.distcp")}


@pytest.mark.parametrize(("args", "vouches"), [
    (b"\x8c\x15fuse_optimizer_states\x94\x89", False),  # an option whose name holds the directory's
    (b"\x8c\x0foptimizer_state\x94", True), (b'"dir": "optimizer_state/"', True),
    (b"Xoptimizer_state\x94", True),  # a pickled string's length byte may read as a letter
])
def test_a_name_inside_a_longer_word_names_nothing(args: bytes, vouches: bool) -> None:
    """A record of options (a pickled TrainingArguments) written while the ``optimizer_state`` directory's entry
    is not yet durable vouches for it only if it names it, not where a longer word holds the name."""
    t = _Ops()
    t.add("mkdir", "ckpt/optimizer_state")
    t.file("ckpt/optimizer_state/0_0.distcp", b"\x07" * 16)
    t.dir_fsync("ckpt/optimizer_state")
    t.file("ckpt/training_args.bin.tmp", args)
    t.add("rename", "ckpt/training_args.bin.tmp", new_path="ckpt/training_args.bin")
    t.dir_fsync("ckpt")
    found = (RECORD_BEFORE_DATA, "ckpt/training_args.bin", "ckpt/optimizer_state") in _rules(t.ops)
    assert found == vouches


def test_an_entry_never_made_durable_is_reported_at_return() -> None:
    t = _Ops()
    t.file("model.pdparams", b"\x04" * 8)  # data fsynced, but the directory never is
    assert _rules(t.ops) == {(NOT_DURABLE, "", "model.pdparams")}
    t.add("sync")
    assert _rules(t.ops) == set()


@needs_strace
def test_a_recorded_reference_save_keeps_the_contract_through_the_judge() -> None:
    """A case whose fault is ``record`` with the bytes captured is a persistence-order case: the reference's save
    passes; the same case file replays through ``ckpt-harness replay`` like any finding."""
    case = shape_case("reference", adapter_class("reference").capabilities, 2, "SR")
    judge = Judge(Runners("reference", "pool"))
    try:
        for op in (0, 1):
            judgement, outcome = judge(dataclasses.replace(case, fault=RecordFault(op=op, capture=True)))
            assert judgement.ok, judgement.details
            assert outcome.trace is not None
    finally:
        judge.close()


@needs_strace
@pytest.mark.parametrize("sut,broken", [("reference", False), ("tests.suts.buggy:IndexFirstSut", True)])
def test_a_drawn_fault_case_judges_its_recorded_save_apart_from_its_verdict(sut: str, broken: bool) -> None:
    """A drawn power-loss case records its fault op anyway: that recording is judged against the contract too, and
    what it breaks comes back beside the verdict (``Outcome.order``: the persistence-order case and its
    judgement), for the campaign to make a finding of its own; the drawn state is judged as before."""
    case = dataclasses.replace(shape_case(sut, adapter_class(sut).capabilities, 2, "S"),
                               fault=PowerFault(op=0, index=0))
    judge = Judge(Runners(sut, "in-process"))
    try:
        judgement, outcome = judge(case)
    finally:
        judge.close()
    assert judgement.ok, judgement.details  # the first state: nothing of the save is durable yet
    if not broken:
        assert outcome.order is None
        return
    record, order = outcome.order
    assert record.fault == RecordFault(op=0, capture=True, schedule=record.fault.schedule) and record.ops == case.ops
    assert set(record.fault.schedule) <= {-2, 0, 1}  # the interleaving it was found under, by rank
    assert order.verdict.value == "data-loss" and "a power loss may lose it" in order.details[0], order.details


# Rank 1's worker writes its shard while rank 0's writes the metadata that names it; nothing orders the two.
RACE = """\
10 openat(AT_FDCWD</r>, "/r/ck/1_0.distcp", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/ck/1_0.distcp>
10 write(3</r/ck/1_0.distcp>, "\\x01\\x02", 2) = 2
10 fsync(3</r/ck/1_0.distcp>) = 0
10 openat(AT_FDCWD</r>, "/r/ck", O_RDONLY|O_DIRECTORY) = 4</r/ck>
10 fsync(4</r/ck>) = 0
20 openat(AT_FDCWD</r>, "/r/ck/0.metadata.tmp", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/ck/0.metadata.tmp>
20 write(3</r/ck/0.metadata.tmp>, "1_0.distcp", 10) = 10
20 fsync(3</r/ck/0.metadata.tmp>) = 0
20 rename("/r/ck/0.metadata.tmp", "/r/ck/0.metadata") = 0
20 openat(AT_FDCWD</r>, "/r/ck", O_RDONLY|O_DIRECTORY) = 4</r/ck>
20 fsync(4</r/ck>) = 0
"""


def test_a_recorded_save_is_judged_in_the_interleaving_its_case_keeps() -> None:
    """Ranks' writers race: a run where the shard happened to come first keeps the contract, the interleaving the
    finding was made under does not. The case keeps that interleaving and a replay judges any run in it; a run
    whose IO per rank differs (a fix) is judged as it ran."""
    case = dataclasses.replace(shape_case("reference", adapter_class("reference").capabilities, 2, "S"),
                               fault=RecordFault(op=0, capture=True))
    outcome = Outcome("reference")
    recording = strace.Recording([], 0, [], strace.parse_trace(RACE)[0], "", "", False, 0.0)
    outcome.trace = ("/r", recording, {10: 1, 20: 0})
    assert order_judgement(case, outcome) is None
    found_on = found_under(case, outcome)
    ones = found_on.schedule.count(1)
    assert found_on.schedule == [1] * ones + [0] * (len(found_on.schedule) - ones) and 0 < ones < len(found_on.schedule)
    reversed_ = sorted(found_on.schedule)  # rank 0's metadata first
    metadata_first = dataclasses.replace(case, fault=dataclasses.replace(found_on, schedule=reversed_))
    broken = order_judgement(metadata_first, outcome)
    assert broken is not None and "ck/N.metadata vouches for ck/N_N.distcp" in broken.details[0], broken.details
    assert found_under(metadata_first, outcome) is metadata_first.fault
    other_io = dataclasses.replace(case, fault=dataclasses.replace(found_on, schedule=reversed_[1:]))
    assert order_judgement(other_io, outcome) is None
    with pytest.raises(FaultSpecError, match="schedule"):
        RecordFault(op=0, capture=True, schedule=[0, "1"])
