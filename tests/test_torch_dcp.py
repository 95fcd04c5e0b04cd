"""torch.distributed.checkpoint as a system under test, on CPU (gloo) ranks launched with torchrun: the property
suite within its declared capabilities, both async executors, a rank or writer killed mid-async-save, and a clear
load error that torch raises as a BaseException."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from harness.judging.judge import Judge
from harness.ranks.runners import Runners
from harness.sut import adapter_class
from properties.generate.fault_cases import fault_cases
from properties.model.case import Case, Op, TensorCase
from properties.registry import drawable_properties, property_cases
from properties.triage.known import read_known
from reference.layout import Mesh, Shard, Sharded, replicated
from tests.regressions_known import survivable

pytest.importorskip("torch")

SUT = "torch-dcp"
REGRESSIONS = Path(__file__).parent / "regressions"
CAPS = frozenset(adapter_class(SUT).capabilities)
PROPS = drawable_properties(CAPS)


@pytest.fixture(scope="module")
def torch_judge():
    # Recorded findings are excused (tests/regressions/, each asserted there): a draw that meets one is not new.
    judge = Judge(Runners(SUT, mode="pool"), exploring=True, known=read_known(REGRESSIONS))
    yield judge
    judge.close()


def test_capabilities_are_declared_honestly() -> None:
    assert {"flat", "latest", "same_dir", "rotate", "kill_writer"}.isdisjoint(CAPS)
    assert {"reshard", "async", "moe", "async_executor:thread", "async_executor:process", "dtype:BF16"} <= CAPS
    assert "P-FLAT" not in PROPS


@pytest.mark.multirank
@pytest.mark.parametrize("prop", PROPS)
def test_property_holds_on_cpu_ranks(prop: str, torch_judge: Judge) -> None:
    @settings(max_examples=max(1, settings.default.max_examples // 40))  # torchrun ranks: the nightly fuzzes
    @given(property_cases(prop, SUT, 2, CAPS))
    def check(case: Case) -> None:
        judgement, _ = torch_judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()


def _case(ops: tuple[Op, ...], options: dict, fault: dict | None = None, prop: str = "P-ASYNC-ISOLATION") -> Case:
    mesh = Mesh((2,))
    tensors = (TensorCase("model/w", "BF16", (5, 3), 1), TensorCase("model/b", "F32", (3,), 2))
    layout = {"model/w": Sharded(mesh, (Shard(0),)).to_json(), "model/b": replicated(mesh).to_json()}
    return Case(prop, SUT, tensors, layout, layout, ops, options, fault=fault)


@pytest.mark.multirank
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_async_executors_snapshot_before_returning(executor: str, torch_judge: Judge) -> None:
    """Both of DCP's async executors, with the caller's tensors scribbled over as soon as async_save returns."""
    ops = (Op("save", "a", 0, use_async=True, mutate_after=True), Op("load", "a", 0))
    judgement, outcome = torch_judge(_case(ops, {"async_executor": executor}))
    assert judgement.ok, judgement.details
    assert [r.ok for r in outcome.records] == [True, True]


@pytest.mark.multirank
def test_loads_and_saves_run_while_two_thread_executor_saves_are_pending(torch_judge: Judge) -> None:
    """Each thread-executor save gets a process group of its own: on the default one its background collectives
    interleaved with the next load's (found by P-LIFECYCLE: the load timed out in gloo after 30 s), and a settled
    save's group is reused, so many saves make few groups."""
    ops = (Op("save", "a", 0), Op("save", "b", 1, use_async=True, detach=True),
           Op("save", "c", 2, use_async=True, detach=True), Op("load", "a", 0), Op("save", "d", 3),
           Op("wait"), Op("save", "e", 4, use_async=True), Op("load", "b", 1), Op("load", "c", 2),
           Op("load", "d", 3), Op("load", "e", 4))
    judgement, outcome = torch_judge(_case(ops, {"async_executor": "thread"}, prop="P-LIFECYCLE"))
    assert judgement.ok, judgement.details
    assert all(r.ok for r in outcome.records) and max(r.seconds for r in outcome.records) < 20


@pytest.mark.multirank
def test_a_load_of_an_unfinished_checkpoint_is_an_error_not_a_dead_rank(torch_judge: Judge) -> None:
    """DCP raises CheckpointException, which derives from BaseException: the ranks must record it and live on."""
    ops = (Op("save", "a", 0), Op("load", "missing", 0))
    judgement, outcome = torch_judge(_case(ops, {}, prop="P-ROUNDTRIP"))
    load = outcome.records[1]
    assert not load.ok and load.failure is None and load.error_type == "CheckpointException"
    assert not judgement.ok and judgement.verdict.value == "loud-failure"


@pytest.mark.multirank
def test_a_rank_killed_mid_async_save_leaves_the_previous_checkpoint(torch_judge: Judge) -> None:
    """P-ATOMIC with the psutil fallback (no strace needed, as on the GPU machines): kill a rank's whole tree, or
    only its async writer process, while the second save is in flight; restart; the history must hold."""

    @settings(max_examples=max(1, settings.default.max_examples // 40))
    @given(fault_cases("P-ATOMIC", SUT, 2, CAPS, ptrace=False).filter(survivable))
    def check(case: Case) -> None:
        judgement, _ = torch_judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()


@pytest.mark.multirank
def test_asking_for_gpus_where_there_are_none_is_one_clear_line(tmp_path, capsys) -> None:
    import json

    import torch

    from harness.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    case = tmp_path / "case.json"
    case.write_text(json.dumps(_case((Op("save", "a", 0), Op("load", "a", 0)), {}, prop="P-ROUNDTRIP").to_json()))
    assert main(["replay", str(case), "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-harness: error: could not start ranks") and "device gpu asked for" in err
    assert main(["replay", str(case), "--nnodes", "0"]) == 2
