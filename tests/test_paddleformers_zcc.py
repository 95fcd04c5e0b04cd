"""PaddleFormers' Zero-Cost Checkpointing as a training job under test (paddleformers-zcc): one live Trainer job per
case, the loop's saves handed to ZCC's worker processes, their EMA read from checkpoints. The first tests need no
framework: what the adapter claims, what strategies draw for it, how its EMA is judged. The rest run real jobs on 2
CPU ranks with ZCC's shims and need the ``paddleformers`` environment (README: "PaddleFormers"); elsewhere they skip.

The jobs run behind every known bug's fix, as a campaign does: what fails is new."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, find, given, settings

from harness.fixes import resolve
from harness.sut import REGISTRY, framework_available
from harness.sut.paddleformers_trainer import TrainerCaseError, expert_parallel
from harness.sut.paddleformers_zcc import PaddleFormersZccSut
from properties.check.oracle import tensor_differences
from properties.model.case import Case, Op, TensorCase
from properties.model.outcome import OpRecord
from properties.registry import drawable_properties, property_cases
from properties.triage.known import read_known
from reference.engine import local_tensors
from reference.layout import Mesh, replicated
from reference.moe import expert_layouts, expert_parallel_degree, keyed_expert_id, whole_on_its_ep_ranks
from reference.namespaces import STEP_KEY
from reference.training import RNG_KEY, family_keys

SUT = "paddleformers-zcc"
CAPS = PaddleFormersZccSut.capabilities
REGRESSIONS = Path(__file__).parent / "regressions"
needs_pf = pytest.mark.skipif(not framework_available(REGISTRY[SUT]),
                              reason="needs paddleformers==1.2.0 in its own environment (README: PaddleFormers)")


def _case(ops: tuple[Op, ...], prop: str = "P-RESUME", params: tuple[TensorCase, ...] | None = None,
          training: dict | None = None) -> Case:
    params = params or (TensorCase("w", "BF16", (3, 2), 1), TensorCase("b", "BF16", (2,), 2),
                        TensorCase("g", "F32", (3,), 3))
    layout = {k: replicated(Mesh((2,))).to_json() for p in params for k in family_keys(p.name).values()}
    layout[RNG_KEY] = layout[STEP_KEY] = replicated(Mesh((2,))).to_json()
    spec = {"seed": 7, "ema_decay": 0.5, "ema_every": 1, "master_init": "param", "ema_seen": "saved",
            **(training or {})}
    return Case(prop, SUT, params, layout, layout, ops, {"format": "flex_checkpoint", "logging_steps": 1}, 7,
                training=spec)


def test_a_zcc_job_is_given_training_cases_whose_ema_is_read_from_checkpoints() -> None:
    assert drawable_properties(CAPS) == ["P-EMA", "P-RESUME"]
    assert {"ema_seen:saved", "ema_every:1", "async", "kill_writer"} <= CAPS


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(property_cases("P-RESUME", SUT, 2, CAPS))
def test_strategies_draw_what_the_adapter_runs(case: Case) -> None:
    """ZCC's semantics are in every case, and a resume ends in a saved and loaded step: the only place its EMA
    shows."""
    assert case.training["ema_seen"] == "saved" and case.training["ema_every"] == 1
    assert case.training["ema_start"] == "zero"  # ZCC's worker starts its EMA at zero
    last = case.ops[-3:]
    assert [op.kind for op in last] == ["train", "save", "load"] and last[1].version == last[2].version
    assert PaddleFormersZccSut.refuses(case) is None


def test_a_train_record_of_a_job_whose_ema_lives_elsewhere_is_judged_without_it() -> None:
    """A train op's record of an ``ema_seen: saved`` case holds no EMA, and the judge does not miss it; the same
    record with the EMA missing in an ``ema_seen: live`` case is a difference."""
    case = _case((Op("train", None, 1),))
    state = case.expected(1, "save")
    shown = {k: t for k, t in state.items() if not k.startswith("ema/")}
    rec = OpRecord(0, "train", None, loaded={0: shown, 1: shown})
    assert tensor_differences(case, 1, rec) == []
    live = dataclasses.replace(case, training={**case.training, "ema_seen": "live"})
    missing = {d.difference.tensor for d in tensor_differences(live, 1, rec)}
    assert missing == {"ema/w", "ema/b", "ema/g"}


@pytest.mark.parametrize(("change", "said"), [
    (lambda c: dataclasses.replace(c, training={**c.training, "ema_seen": "live"}), "ema_seen"),
    (lambda c: dataclasses.replace(c, training={**c.training, "ema_every": 3}), "zcc_ema_interval"),
    (lambda c: dataclasses.replace(c, options={**c.options, "format": "sharding_io"}), "format"),
    (lambda c: dataclasses.replace(c, ops=(Op("train", None, 1), Op("save", "step-1", 1), Op("load", "step-1", 1),
                                           Op("save", "step-1", 1))), "before the job has trained a step"),
    (lambda c: dataclasses.replace(c, options={**c.options, "gradient_accumulation_steps": 3}), "micro-batches"),
    (lambda c: dataclasses.replace(c, options={**c.options, "gradient_accumulation_steps": True}), "micro-batches"),
])
def test_a_case_no_zcc_job_is_refused_before_any_launch(change, said: str) -> None:
    case = _case((Op("train", None, 2), Op("save", "step-2", 2), Op("load", "step-2", 2)), "P-EMA")
    assert PaddleFormersZccSut.refuses(case) is None
    assert said in (PaddleFormersZccSut.refuses(change(case)) or "")


def test_the_micro_batches_a_step_accumulates_are_drawn_and_reach_the_job() -> None:
    """One micro-batch per step is where ZCC's EMA offload is never sent (a finding): both counts are drawn, and the
    Trainer's arguments carry the case's."""
    from properties.generate.cases import Caps

    assert Caps(PaddleFormersZccSut.capabilities).choices["gradient_accumulation_steps"] == [1, 2]
    case = _case((Op("train", None, 2), Op("save", "step-2", 2), Op("load", "step-2", 2)), "P-EMA")
    for micro in (1, 2):
        args = PaddleFormersZccSut()._arguments(Path("r"), case.spec(), tuple(case.params()),
                                                {"gradient_accumulation_steps": micro}, 2, 10)
        assert args["gradient_accumulation_steps"] == micro


def test_every_recorded_zcc_case_is_one_the_adapter_runs() -> None:
    for path in sorted(REGRESSIONS.glob("paddleformers-zcc-*.json")):
        case = Case.from_json(json.loads(path.read_text())["case"])
        assert PaddleFormersZccSut.refuses(case) is None, path.name


@pytest.fixture(scope="module")
def zcc_judge():
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    # As a campaign runs: behind every known bug's fix (of PaddleFormers and of the Paddle beneath it), so a case
    # that meets one in a new combination is not judged for it, and what fails is new
    judge = Judge(Runners(SUT, mode="pool", fixes=resolve("all", REGISTRY[SUT].framework)), exploring=True,
                  known=read_known(REGRESSIONS))
    yield judge
    judge.close()


@needs_pf
@pytest.mark.multirank
def test_a_zcc_job_resumed_in_place_equals_the_uninterrupted_one_bit_for_bit(zcc_judge) -> None:
    """Train 2 steps, save (ZCC's worker writes it), resume in place, train on and save again: parameters, master
    weights and moments at every train, and the EMA of both checkpoints, equal the reference loop's uninterrupted run.
    BF16 and FP32 parameters: the EMA of master weights and of FP32 parameters are ZCC's two buffers."""
    ops = (Op("train", None, 2), Op("save", "step-2", 2), Op("load", "step-2", 2), Op("train", None, 3),
           Op("train", None, 4), Op("save", "step-4", 4), Op("load", "step-4", 4))
    judgement, _ = zcc_judge(_case(ops))
    assert judgement.ok, judgement.details


@needs_pf
@pytest.mark.multirank
def test_an_async_zcc_save_written_while_the_job_trains_on_loads_as_its_step(zcc_judge) -> None:
    """ZCC's pattern: the save returns, the job trains two more steps while the worker copies and dumps, the job
    dies; the restarted job resumes the save's step and matches the uninterrupted run (EMA included)."""
    ops = (Op("train", None, 2), Op("save", "step-2", 2, True, detach=True), Op("train", None, 4), Op("wait"),
           Op("restart"), Op("load", "step-2", 2), Op("train", None, 5), Op("save", "step-5", 5),
           Op("load", "step-5", 5))
    judgement, outcome = zcc_judge(_case(ops))
    assert judgement.ok, judgement.details
    assert all(rec.ok for rec in outcome.records)


def _moe_case(ops: tuple[Op, ...], save_ep: int, load_ep: int, experts: int = 2) -> Case:
    """A dense BF16 parameter replicated everywhere, and keyed BF16 and FP32 experts on their expert-parallel ranks
    of a (dp, ep) mesh of 2 ranks: EP ``save_ep`` until the first load, ``load_ep`` after it."""
    dense = TensorCase("w", "BF16", (3, 2), 1)
    layouts = []
    for ep in (save_ep, load_ep):
        mesh = Mesh((2 // ep, ep), ("dp", "ep"))
        keyed = {**expert_layouts(mesh, "ep", experts, "moe", "w1", stacked=False),
                 **expert_layouts(mesh, "ep", experts, "moe", "b1", stacked=False)}
        layout = {k: v.to_json() for name, v in keyed.items() for k in family_keys(name).values()}
        layout |= {k: replicated(mesh).to_json() for k in (*family_keys(dense.name).values(), RNG_KEY, STEP_KEY)}
        layouts.append(dict(sorted(layout.items())))
    names = sorted(f"moe.experts.{i}.{leaf}" for i in range(experts) for leaf in ("w1", "b1"))
    params = (dense, *(TensorCase(n, "F32", (2,), 10 + i) if n.endswith("b1") else TensorCase(n, "BF16", (2, 3), 10 + i)
                       for i, n in enumerate(names)))
    spec = {"seed": 7, "ema_decay": 0.5, "ema_every": 1, "master_init": "param", "ema_seen": "saved"}
    return Case("P-RESUME", SUT, params, layouts[0], layouts[1], ops,
                {"format": "flex_checkpoint", "logging_steps": 1}, 7, training=spec)


RESUME_ELSEWHERE = (Op("train", None, 2), Op("save", "step-2", 2), Op("restart"), Op("load", "step-2", 2),
                    Op("train", None, 3), Op("save", "step-3", 3), Op("load", "step-3", 3))


def test_a_moe_case_runs_each_expert_parallel_degree_on_processes_of_its_own() -> None:
    """``fleet.init`` makes a process's groups once: ops on another EP degree get other processes; dense ops and
    EP 1 any warm ones."""
    case = _moe_case(RESUME_ELSEWHERE, 2, 1)
    assert PaddleFormersZccSut.refuses(case) is None
    shapes = [PaddleFormersZccSut.process_shape(case, i) for i in range(len(case.ops))]
    assert shapes[:2] == ["ep=2", "ep=2"] and set(shapes[3:]) == {""}
    assert PaddleFormersZccSut.process_shape(_case(RESUME_ELSEWHERE), 0) == ""


def test_a_rank_holds_the_dense_parameters_and_its_own_experts() -> None:
    case = _moe_case(RESUME_ELSEWHERE, 2, 2, experts=4)
    params = tuple(case.params())
    for rank, ids in ((0, {0, 1}), (1, {2, 3})):
        held = set(local_tensors(case.state(0), case.layouts("save"), rank))
        ep, mine = expert_parallel(params, held)
        assert ep == 2 and {p.name for p in mine} == {"w"} | {f"moe.experts.{i}.{leaf}" for i in ids
                                                           for leaf in ("w1", "b1")}
    assert expert_parallel(params, set(local_tensors(case.state(0), case.layouts("load"), 1)))[0] == 2
    with pytest.raises(TrainerCaseError, match="holds 3 of 4 experts"):
        expert_parallel(params, {"model/w", *(f"model/moe.experts.{i}.w1" for i in range(3))})


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(property_cases("P-RESUME", SUT, 2, CAPS))
def test_moe_cases_are_drawn_keyed_and_may_change_the_expert_parallel_degree(case: Case) -> None:
    experts = [layout for name, layout in case.layouts("save").items() if keyed_expert_id(name) is not None]
    assert all(whole_on_its_ep_ranks(layout) for layout in experts)  # never stacked: one parameter per expert
    assert case.world_size("load") == 2
    assert PaddleFormersZccSut.refuses(case) is None


def test_strategies_reach_a_resume_on_another_expert_parallel_degree() -> None:
    changed = find(property_cases("P-RESUME", SUT, 2, CAPS),
                   lambda c: expert_parallel_degree(c.layouts("save")) != expert_parallel_degree(c.layouts("load")),
                   settings=settings(max_examples=500, database=None))
    assert {PaddleFormersZccSut.process_shape(changed, i) for i in range(len(changed.ops))} == {"", "ep=2"}


def test_a_stacked_expert_is_refused_before_any_launch() -> None:
    mesh = Mesh((1, 2), ("dp", "ep"))
    case = _moe_case(RESUME_ELSEWHERE, 2, 2)
    stacked = {k: expert_layouts(mesh, "ep", 2, "moe", "w1", stacked=True)["moe.w1"].to_json()
               for k in family_keys("moe.w1").values()}
    odd = dataclasses.replace(case, tensors=(*case.tensors, TensorCase("moe.w1", "F32", (2, 3), 5)),
                              save_layout={**case.save_layout, **stacked}, load_layout={**case.load_layout, **stacked})
    assert "is not replicated" in PaddleFormersZccSut.refuses(odd)


@needs_pf
@pytest.mark.multirank
@pytest.mark.parametrize(("save_ep", "load_ep"), [(2, 2), (2, 1), (1, 2)])
def test_a_moe_job_resumed_on_another_expert_parallel_degree_keeps_each_experts_ema(save_ep, load_ep,
                                                                                    zcc_judge) -> None:
    """Experts live on their expert-parallel ranks under their global ids (ZCC filters their no-sync optimizer
    state per rank). A job saved on one EP degree and resumed on another, where the Trainer reshards ZCC's EMA
    through flex checkpoint into shared memory for the worker, equals the uninterrupted run: each expert's
    parameters, master weights, moments and EMA."""
    judgement, outcome = zcc_judge(_moe_case(RESUME_ELSEWHERE, save_ep, load_ep))
    assert judgement.ok, judgement.details
    loaded = next(rec for rec in outcome.records if rec.kind == "load")
    assert any(k.startswith("ema/moe.experts.") for k in loaded.loaded[0])  # the EMA was read, not skipped


@needs_pf
@pytest.mark.multirank
@pytest.mark.parametrize("prop", ["P-EMA", "P-RESUME"])
def test_property_holds_apart_from_known_findings(prop: str, zcc_judge) -> None:
    @settings(max_examples=max(2, settings.default.max_examples // 50), deadline=None)
    @given(property_cases(prop, SUT, 2, CAPS))
    def check(case: Case) -> None:
        judgement, _ = zcc_judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()
