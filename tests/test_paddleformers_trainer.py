"""PaddleFormers' Trainer as a training job under test (paddleformers-trainer): its own loop, its EMA and its
checkpoints. The first tests need no framework: what the adapter claims, and that strategies draw only that. The
shim tests need Paddle (each runs in a subprocess: the shims are process-wide). The rest run real ``Trainer.train``
jobs on 2 CPU ranks and need the ``paddleformers`` environment (README: "PaddleFormers"); elsewhere they skip.

Known Trainer bugs (tests/regressions/paddleformers-trainer-*.json, FINDINGS.md) carry signatures: the property tests
pass cases those explain and fail on anything else."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness.fixes import resolve
from harness.sut import REGISTRY, framework_available
from harness.sut.paddleformers_trainer import FORMATS, LOGGING_STEPS, PaddleFormersTrainerSut
from properties.model.case import Case, Op, TensorCase
from properties.registry import drawable_properties, property_cases
from properties.triage.known import read_known
from reference.layout import Mesh, replicated
from reference.namespaces import STEP_KEY
from reference.training import RNG_KEY, family_keys

SUT = "paddleformers-trainer"
CAPS = PaddleFormersTrainerSut.capabilities  # the module imports no framework
REGRESSIONS = Path(__file__).parent / "regressions"
REPO = Path(__file__).parent.parent
needs_pf = pytest.mark.skipif(not framework_available(REGISTRY[SUT]),
                              reason="needs paddleformers==1.2.0 in its own environment (README: PaddleFormers)")


def test_a_training_job_is_given_training_cases_only() -> None:
    assert drawable_properties(CAPS) == ["P-EMA", "P-RESUME"]
    assert drawable_properties(CAPS, faults=True) == ["P-EMA", "P-RESUME"]
    assert {"moe", "flat"}.isdisjoint(CAPS)  # not claimed until they run
    assert {"reshard", "min_world:2"} <= CAPS  # resumes on other worlds of 2 ranks or more run on CPU ranks
    assert {"async", "kill_writer", "flag:use_async_save"} <= CAPS  # the Trainer's AsyncSaver
    assert "latest" in CAPS  # get_last_checkpoint, as resume_from_checkpoint=True uses it


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(property_cases("P-RESUME", SUT, 2, CAPS))
def test_cases_carry_the_trainer_s_loop_semantics_and_its_options(case: Case) -> None:
    assert case.training["ema_start"] == "first" and case.training["master_init"] == "param"
    assert case.options["logging_steps"] in LOGGING_STEPS and case.options["format"] in FORMATS
    for layout in case.layouts("save").values():
        assert layout is not None and all(type(p).__name__ == "Replicate" for p in layout.placements)  # whole
    assert PaddleFormersTrainerSut.refuses(case) is None  # what strategies draw, the adapter runs


def _finding(stem: str) -> Case:
    return Case.from_json(json.loads((REGRESSIONS / f"{stem}.json").read_text())["case"])


@pytest.mark.parametrize(("change", "said"), [
    (lambda c: dataclasses.replace(c, training=None), "training cases only"),
    (lambda c: dataclasses.replace(c, options={**c.options, "format": "unified_checkpoint"}), "format"),
    (lambda c: dataclasses.replace(c, options={**c.options, "logging_steps": 0}), "logging_steps 0"),
    (lambda c: dataclasses.replace(c, tensors=tuple(dataclasses.replace(t, dtype="F16") for t in c.tensors)),
     "is F16"),
    (lambda c: dataclasses.replace(c, ops=(Op("train", version=2), Op("save", "step-1"))), "is at step 2"),
    (lambda c: dataclasses.replace(c, ops=(Op("train", version=1), Op("restart"), Op("save", "step-1"))),
     "has not trained since it started"),
    (lambda c: dataclasses.replace(c, ops=(Op("train", version=2), Op("train", version=1))), "behind the step 2"),
    (lambda c: dataclasses.replace(c, ops=(Op("train", version=1), Op("save", "last"))), "does not end with"),
])
def test_a_case_no_trainer_job_is_refused_before_any_launch(change, said: str) -> None:
    """Bad input to the harness (a hand-written case outside what the adapter models) is said before any rank
    starts, not judged as the Trainer's failure."""
    case = _finding("paddleformers-trainer-ema-threshold-reads-summed-loss")
    assert PaddleFormersTrainerSut.refuses(case) is None
    assert said in (PaddleFormersTrainerSut.refuses(change(case)) or "")


def test_every_recorded_trainer_case_is_one_the_adapter_runs() -> None:
    ops = (Op("train", version=1), Op("save", "step-1"), Op("train", version=2), Op("save", "step-2"), Op("load"),
           Op("train", version=3), Op("save", "step-3"))  # "latest" resumes the newest save
    case = _finding("paddleformers-trainer-ema-threshold-reads-summed-loss")
    assert PaddleFormersTrainerSut.refuses(dataclasses.replace(case, ops=ops)) is None
    for path in sorted(REGRESSIONS.glob("paddleformers-trainer-*.json")):
        assert PaddleFormersTrainerSut.refuses(_finding(path.stem)) is None, path.name


def test_a_refused_case_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    import harness.cli as cli

    monkeypatch.setattr(cli, "adapter_class", lambda sut: PaddleFormersTrainerSut)  # no framework needed to refuse
    data = json.loads((REGRESSIONS / "paddleformers-trainer-ema-threshold-reads-summed-loss.json").read_text())
    data["case"]["options"]["format"] = "safetensors"
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    assert cli.main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert "paddleformers-trainer cannot run this case: format 'safetensors'" in err and err.count("\n") == 1


def test_a_job_that_died_in_training_is_judged_there_not_for_the_rest_of_its_script() -> None:
    """A SUT that trains itself can fail a train op; its later saves and trains (until a load or a restart starts
    a job again) are the script of a dead job: only the failed train is judged."""
    from properties.check.oracle import follows_failed_train
    from properties.model.outcome import OpRecord

    kinds = [("train", False), ("save", False), ("train", False), ("load", True), ("train", True), ("save", True)]
    records = [OpRecord(i, k, None, ok) for i, (k, ok) in enumerate(kinds)]
    assert [follows_failed_train(records, i) for i in range(len(records))] == [False, True, True, False, False, False]
    records[0].restarted = True  # the harness replaced the ranks after the failed train: a fresh job
    assert not follows_failed_train(records, 1)


_SHIM_CHECK = r"""
import json, sys
import numpy as np
import paddle
from harness.sut import paddleformers_trainer as pt
from reference.training import Param, TrainingSpec, adam_update, cast_bits, gradient, rng_output

paddle.set_device("cpu")
pt._install_trainer_shims()
out = {}

# BF16 add: FP32 sum rounded to nearest even, ties included (a GPU's BF16 add)
rng = np.random.default_rng(0)
a = rng.integers(0, 1 << 16, 4096).astype(np.uint16)
b = rng.integers(0, 1 << 16, 4096).astype(np.uint16)
finite = lambda x: np.isfinite((x.astype(np.uint32) << 16).view(np.float32))
keep = finite(a) & finite(b)
a, b = a[keep], b[keep]
as_f32 = lambda x: (x.astype(np.uint32) << 16).view(np.float32)
with np.errstate(over="ignore"):
    want = cast_bits(as_f32(a) + as_f32(b), "BF16")
pa = paddle.to_tensor(a.view(np.int16)).view(paddle.bfloat16)
pb = paddle.to_tensor(b.view(np.int16)).view(paddle.bfloat16)
got = (pa + pb).view(paddle.int16).numpy().view(np.uint16)
out["add_equal"] = bool(np.array_equal(got, want))

# AdamW: the reference step lands in the optimizer's own moments, master weight, beta powers and parameter
spec = TrainingSpec(lr=0.1, beta1=0.9, beta2=0.95, weight_decay=0.01, seed=3)
p = Param("w", "BF16", (5,), 1)
param = paddle.create_parameter([5], dtype="bfloat16", default_initializer=paddle.nn.initializer.Constant(0.0))
param.set_value(paddle.to_tensor(np.linspace(-1, 1, 5, dtype=np.float32)).astype("bfloat16"))
opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=[param], multi_precision=True)
param.grad = None
(param.astype("float32").sum() * 0.0).backward()


class State:
    global_step = 0


class Run:
    state = State()
    _ckpt_harness = {"spec": spec, "params": {"w": p}, "by_static": {param.name: "w"}}


pt._run = Run()
master0 = param.astype("float32").numpy()
opt.step()
master, m1, m2 = master0.copy(), np.zeros(5, np.float32), np.zeros(5, np.float32)
adam_update(spec, 1, gradient(p, rng_output(spec, 1)), master, m1, m2)
mw = opt._master_weights[param.name]
out["master_equal"] = bool(np.array_equal(mw.numpy(), master))
out["moments_equal"] = bool(np.array_equal(opt._accumulators["moment1"][mw.name].numpy(), m1)
                            and np.array_equal(opt._accumulators["moment2"][mw.name].numpy(), m2))
out["param_equal"] = bool(np.array_equal(param.view(paddle.int16).numpy().view(np.uint16), cast_bits(master, "BF16")))
pows = opt._accumulators["beta1_pow_acc"][mw.name].numpy().tolist()
out["beta1_pow"] = pows
print(json.dumps(out))
"""


@pytest.mark.skipif(not framework_available(REGISTRY["paddle-dcp"]), reason="needs paddle")
def test_the_cpu_shims_compute_what_the_trainer_would_read() -> None:
    """The BF16 add rounds an FP32 sum to nearest even on every finite pair; the AdamW shim writes the reference
    step into the optimizer's own master weight, moments, beta powers and BF16 parameter (what checkpoints and the
    EMA read)."""
    proc = subprocess.run([sys.executable, "-c", _SHIM_CHECK], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["add_equal"] and out["master_equal"] and out["moments_equal"] and out["param_equal"], out
    assert out["beta1_pow"] == pytest.approx([0.9 * 0.9], rel=1e-6)  # created at beta1, advanced once


_HELD_SLOT_CHECK = r"""
import json
import paddle
from harness.sut.paddleformers_trainer import optimizer_slot

paddle.set_device("cpu")
w = paddle.create_parameter([], "float32", default_initializer=paddle.nn.initializer.Constant(0.5))
opt = paddle.optimizer.AdamW(0.01, parameters=[w], weight_decay=0.0)
(w * w).sum().backward()
opt.step()
saved = {k: v.numpy().tolist() for k, v in opt.state_dict().items() if hasattr(v, "numpy")}
resumed = paddle.optimizer.AdamW(0.01, parameters=[w], weight_decay=0.0)
resumed.set_state_dict(opt.state_dict())
held = {slot: optimizer_slot(resumed, w.name, slot).numpy().tolist() for slot in ("moment1", "moment2")}
print(json.dumps({"made": resumed._accumulators.get("moment1", {}).get(w.name) is not None, "held": held,
                  "saved": [saved[f"{w.name}_{slot}_0"] for slot in ("moment1", "moment2")]}))
"""


@pytest.mark.skipif(not framework_available(REGISTRY["paddle-dcp"]), reason="needs paddle")
def test_moments_a_resume_keeps_aside_are_observed_as_the_job_holds_them() -> None:
    """A job resumed at its last step makes no step, so its optimizer has not made the loaded moments yet (Paddle
    keeps them aside for the first step, and a save writes them from there). Reading only the made ones saw the
    fresh job's zeros: a sharding-IO resume at max steps read as both moments lost."""
    proc = subprocess.run([sys.executable, "-c", _HELD_SLOT_CHECK], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["made"]
    assert [out["held"]["moment1"], out["held"]["moment2"]] == out["saved"] and out["saved"][0] != 0.0


def _case(ops: tuple[Op, ...], prop: str, training: dict | None = None, options: dict | None = None) -> Case:
    params = (TensorCase("w", "BF16", (3, 2), 1), TensorCase("b", "BF16", (2,), 2))
    mesh = Mesh((2,))
    layout = {k: replicated(mesh).to_json() for p in params for k in family_keys(p.name).values()}
    layout[RNG_KEY] = layout[STEP_KEY] = replicated(mesh).to_json()
    spec = {"seed": 7, "ema_decay": 0.9, "ema_start": "first", "master_init": "param", **(training or {})}
    return Case(prop, SUT, params, layout, layout, ops, {"format": "flex_checkpoint", "logging_steps": 1,
                                                         **(options or {})}, 7, training=spec)


@pytest.fixture(scope="module")
def trainer_judge():
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners

    # As a campaign knows its bugs: by signature, else by the fixes that make the case pass (a known bug met in a
    # new combination, e.g. a one-rank failure that leaves the next collective waiting, reads as known)
    judge = Judge(Runners(SUT, mode="pool"), exploring=True, known=read_known(REGRESSIONS),
                  prove=resolve("all", REGISTRY[SUT].framework))
    yield judge
    judge.close()


@needs_pf
@pytest.mark.multirank
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resumed_trainer_job_equals_the_uninterrupted_one_bit_for_bit(fmt: str, trainer_judge) -> None:
    """Train 2 steps, save, train to 3 and save, restart, resume the latest (the Trainer's get_last_checkpoint), train
    to 4: parameters, master weights, moments, EMA, RNG and step equal the reference loop's uninterrupted run at
    every train and load, in both formats the EMA saves in."""
    ops = (Op("train", None, 2), Op("save", "step-2", 2), Op("train", None, 3), Op("save", "step-3", 3),
           Op("restart"), Op("load", None, 3), Op("train", None, 4))
    judgement, _ = trainer_judge(_case(ops, "P-RESUME", options={"format": fmt}))
    assert judgement.ok, judgement.details


@needs_pf
@pytest.mark.multirank
def test_an_async_save_held_while_the_job_trains_on_resumes_bit_for_bit(trainer_judge) -> None:
    """``use_async_save``: the optimizer is written by the Trainer's AsyncSaver pool, held (stall) while the job
    trains a step on; then wait, restart, resume and train on equal the uninterrupted run."""
    ops = (Op("train", None, 2), Op("save", "step-2", 2, use_async=True, detach=True, stall=True),
           Op("train", None, 3), Op("wait"), Op("restart"), Op("load", "step-2", 2), Op("train", None, 4))
    judgement, _ = trainer_judge(_case(ops, "P-RESUME", options={"format": "sharding_io", "use_async_save": True}))
    assert judgement.ok, judgement.details


@needs_pf
@pytest.mark.multirank
@pytest.mark.parametrize("prop", ["P-EMA", "P-RESUME"])
def test_property_holds_apart_from_known_findings(prop: str, trainer_judge) -> None:
    @settings(max_examples=max(3, settings.default.max_examples // 25), deadline=None)
    @given(property_cases(prop, SUT, 2, CAPS))
    def check(case: Case) -> None:
        judgement, _ = trainer_judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()
