"""PaddleFormers' Unified Checkpoint through its Trainer (paddleformers-uc). The first tests need no framework:
what the adapter can hold, and that strategies draw only that. The rest run real UC saves and resumes on 1 and 2
CPU ranks (gloo) and need the ``paddleformers`` environment (README: "PaddleFormers"); elsewhere they skip.

Known UC bugs (tests/regressions/paddleformers-uc-*.json, FINDINGS.md) carry signatures: the property tests pass
cases those explain, and fail on anything else, so they keep looking for new bugs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.fixes import resolve
from harness.sut import REGISTRY, framework_available
from harness.sut.paddleformers_uc import (
    PARAM_DTYPES,
    UC_FLAGS,
    PaddleFormersUcSut,
    UcStateError,
    param_specs,
    uc_config,
)
from properties.model.case import Case, Op, TensorCase, read_case_file
from properties.registry import drawable_properties, property_cases
from properties.triage.known import read_known
from reference.dtypes import dtype
from reference.layout import Mesh, replicated
from reference.tensor import Tensor

SUT = "paddleformers-uc"
CAPS = PaddleFormersUcSut.capabilities  # the module imports no framework
# A job's life on UC costs minutes per case (every save is a Trainer checkpoint, every restart a relaunch): the
# nightly profile carries P-LIFECYCLE here, and `fuzz --property P-LIFECYCLE` any time.
PROPS = [pytest.param(p, marks=pytest.mark.nightly) if p == "P-LIFECYCLE" else p for p in drawable_properties(CAPS)]
REGRESSIONS = Path(__file__).parent / "regressions"
needs_uc = pytest.mark.skipif(not framework_available(REGISTRY[SUT]),
                              reason="needs paddleformers==1.2.0 in its own environment (README: PaddleFormers)")


def test_capabilities_are_declared_honestly() -> None:
    assert {"flat", "moe", "same_dir", "save_replicas"}.isdisjoint(CAPS)  # DP only: no TP/ZeRO layouts on CPU
    assert {"trainer_state", "replicated", "reshard", "async", "latest", "rotate", "kill_writer", "keep_last",
            "flag:pdc"} <= CAPS
    assert {d.split(":")[1] for d in CAPS if d.startswith("dtype:")} == {"F32", "BF16", "F16"}
    assert not {"P-FLAT", "P-MOE", "P-EMA", "P-RESUME"} & set(drawable_properties(CAPS))


def test_the_unified_checkpoint_config_flags_a_case_turns_on_reach_the_job() -> None:
    """Every flag is drawn (each a capability, so swarm can leave it out) and goes into
    TrainingArguments.unified_checkpoint_config with async_save, as a user writes them."""
    assert {f"flag:{f}" for f in UC_FLAGS} <= CAPS
    assert {"skip_save_model_weight", "remove_master_weight", "master_weight_compatible",
            "ignore_merge_optimizer"} == set(UC_FLAGS)
    assert uc_config({}) == "async_save"
    assert uc_config({"ignore_merge_optimizer": True, "pdc": True}) == "async_save ignore_merge_optimizer"
    assert uc_config(dict.fromkeys(UC_FLAGS, True)).split() == ["async_save", *UC_FLAGS]


@pytest.mark.parametrize("other", ["ignore_merge_optimizer", "remove_master_weight"])
def test_a_pair_of_flags_the_job_cannot_run_is_refused(other: str) -> None:
    """TrainingArguments refuses skip_save_model_weight with ignore_merge_optimizer; with remove_master_weight
    neither a weight nor its master would be saved."""
    tensors = (TensorCase("model/w", "BF16", (2,), 1), TensorCase("master/w", "F32", (2,), 2))
    whole = {t.name: replicated(Mesh((2,), ("d0",))).to_json() for t in tensors}
    ops = (Op("save", "step-1", 0), Op("load", "step-1", 0))
    case = Case("P-RESHARD", SUT, tensors, whole, whole, ops, {"skip_save_model_weight": True, other: True}, 0)
    assert PaddleFormersUcSut.refuses(case) == f"unified_checkpoint_config skip_save_model_weight with {other}"
    alone = dataclasses.replace(case, options={"skip_save_model_weight": True})
    assert PaddleFormersUcSut.refuses(alone) is None


def _t(name: str, dt: str, shape: tuple[int, ...] = (2,)) -> Tensor:
    return Tensor.empty(dtype(dt), shape)


@pytest.mark.parametrize("state, message", [
    ({"ema/w": _t("ema/w", "F32")}, "no place for 'ema/w'"),
    ({"optimizer/w.m1": _t("m", "F32")}, "model/w is not in the state"),
    ({"model/w": _t("w", "F32"), "master/w": _t("m", "F32")}, "no master weight for the F32 parameter"),
    ({"model/w": _t("w", "I64")}, "AdamW parameters are F32/BF16/F16"),
    ({"model/w": _t("w", "BF16"), "optimizer/w.m1": _t("m", "BF16")}, "must be F32"),
    ({"model/w": _t("w", "BF16"), "optimizer/w.m3": _t("m", "F32")}, "no place for"),
])
def test_states_uc_cannot_hold_are_named(state: dict, message: str) -> None:
    with pytest.raises(UcStateError, match=message):
        param_specs(state)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_strategies_draw_whole_trainer_states(data: st.DataObject) -> None:
    prop = data.draw(st.sampled_from(drawable_properties(CAPS, faults=True)))
    case: Case = data.draw(property_cases(prop, SUT, 2, CAPS))
    state = case.state(0)
    specs = {s.name: s for s in param_specs(state)}  # raises for anything UC cannot hold
    for t in case.tensors:
        family, _, param = t.name.partition("/")
        assert t.dtype in PARAM_DTYPES if family == "model" else t.dtype == "F32"
        if family == "master":
            assert specs[param].dtype != "F32"
    for layouts in (case.save_layout, case.load_layout):
        assert all(lay["placements"] == ["R"] * len(lay["mesh"]["shape"]) for lay in layouts.values())
    assert case.options.get("keep_last") in (None, 1, 2) and case.options.get("pdc") in (None, True)
    assert PaddleFormersUcSut.refuses(case) is None  # what strategies draw, the adapter runs


def test_a_state_uc_cannot_hold_is_refused_before_any_launch() -> None:
    for path in sorted(REGRESSIONS.glob("paddleformers-uc-*.json")):
        assert PaddleFormersUcSut.refuses(read_case_file(path)[0]) is None, path.name
    case = read_case_file(REGRESSIONS / "paddleformers-uc-bf16-nan-payload-sync-save.json")[0]
    extra = dataclasses.replace(case.tensors[0], name="ema/w")
    assert "no place for 'ema/w'" in PaddleFormersUcSut.refuses(dataclasses.replace(
        case, tensors=(*case.tensors, extra), save_layout={**case.save_layout, "ema/w": case.save_layout[
            case.tensors[0].name]}, load_layout={**case.load_layout, "ema/w": case.load_layout[case.tensors[0].name]}))


# --- real UC saves and resumes -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uc_judge():
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    # As a campaign knows its bugs: by signature, else by the fixes that make the case pass (a known bug met in a
    # new combination, e.g. a one-rank failure that leaves the next collective waiting, reads as known)
    judge = Judge(Runners(SUT, mode="pool"), exploring=True, known=read_known(REGRESSIONS),
                  prove=resolve("all", REGISTRY[SUT].framework))
    yield judge
    judge.close()


@needs_uc
@pytest.mark.multirank
@pytest.mark.parametrize("prop", PROPS)
def test_property_holds_apart_from_known_findings(prop: str, uc_judge) -> None:
    @settings(max_examples=max(4, settings.default.max_examples // 12), deadline=None)
    @given(property_cases(prop, SUT, 2, CAPS))
    def check(case: Case) -> None:
        judgement, _ = uc_judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()


def _case(ops: tuple[Op, ...], options: dict | None = None, world: int = 2, prop: str = "P-LIVENESS") -> Case:
    tensors = (TensorCase("model/w", "BF16", (3, 2), 1), TensorCase("optimizer/w.m1", "F32", (3, 2), 2),
               TensorCase("optimizer/w.m2", "F32", (3, 2), 3), TensorCase("master/w", "F32", (3, 2), 4))
    layout = {t.name: replicated(Mesh((world,))).to_json() for t in tensors}
    return Case(prop, SUT, tensors, layout, layout, ops, options or {})


@needs_uc
@pytest.mark.multirank
def test_async_save_with_rotation_resumes_the_newest(uc_judge) -> None:
    """save_total_limit=1 and async saves, waited for: the Trainer's own selector resumes the newest."""
    ops = (Op("save", "step-0", 0, use_async=True), Op("save", "step-1", 1, use_async=True), Op("load", None, 1),
           Op("load", "step-1", 1))
    judgement, _ = uc_judge(_case(ops, {"keep_last": 1}, prop="P-NOLOSS"))
    assert judgement.ok, judgement.details


@needs_uc
@pytest.mark.multirank
def test_the_crashed_save_fix_marks_a_one_rank_save_finished() -> None:
    """UC saves a one-rank job synchronously whatever async_save says, so the crashed-save fix's selector must find
    such a save marked finished: "latest" is the newest save, not an older marked one."""
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    ops = (Op("save", "step-0", 0), Op("save", "step-1", 1, use_async=True), Op("wait"), Op("load", None, 1))
    judge = Judge(Runners(SUT, mode="pool", fixes=("paddleformers-uc-crashed-save-not-latest",)))
    try:
        judgement, _ = judge(_case(ops, world=1, prop="P-NOLOSS"))
    finally:
        judge.close()
    assert judgement.ok, judgement.details


@needs_uc
@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_fuzz_with_faults_runs_real_uc_saves(tmp_path: Path) -> None:
    """The done-when of issue 7, at CI size: `fuzz --sut paddleformers-uc --faults` saves, corrupts and resumes. One
    case, not a time: one fault case of real Trainer saves takes about a minute on a busy runner. Stock code, no
    repro: the campaign's saves and faults are what this checks (test_fixes proves the Trainer fixes; the killed
    saves are replayed by the regression cases)."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "fuzz", "--sut", SUT, "--ranks", "2", "--faults", "--cases", "1",
         "--time", "300", "--fixes", "none", "--no-repro",
         "--seed", "7", "--property", "P-CORRUPT", "--out", str(tmp_path / "out"),
         "--skip-known", str(REGRESSIONS)],
        capture_output=True, text=True, timeout=900)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["cases_run"] == {"P-CORRUPT": 1}, proc.stdout + proc.stderr
    assert summary["devices"] == ["cpu (gloo)"]
    assert proc.returncode in (0, 1), proc.stderr  # 1: findings, each written under out/findings
    assert proc.returncode == 0 or any((tmp_path / "out" / "findings").glob("*.json"))
