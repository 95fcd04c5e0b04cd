"""The miniature training loop (reference.training) and the training properties P-EMA, P-RESUME and DP-MoE
P-COVER: the loop is what the text says it is, a slice trained alone is that slice of the whole run to the bit,
training cases are validated, the reference passes, and broken SUTs are caught, shrunk and replayed."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.judging.judge import Judge
from harness.judging.run import run_ops
from harness.ranks.runners import Runners
from harness.sut.reference import ReferenceSut
from properties.generate.cases import Caps
from properties.generate.training_cases import _layouts, specs, training_cases
from properties.model.case import Case, CaseError, Op, TensorCase
from properties.model.outcome import Outcome
from reference.disk.index import read_index
from reference.engine import local_tensors, rank_file
from reference.layout import Mesh, Shard, Sharded, replicated
from reference.moe import keyed_layouts
from reference.namespaces import STEP_KEY
from reference.training import (
    RNG_KEY,
    Param,
    TrainingSpec,
    cast_bits,
    family_keys,
    gradient,
    initial_pieces,
    initial_state,
    state_keys,
    train,
    trained_state,
)

REFERENCE_CAPS = ReferenceSut.capabilities


def _bits(state) -> dict[str, bytes]:
    return {k: t.dtype.name + str(t.shape) + t.bits.tobytes().hex() for k, t in state.items()}


# --- the loop ------------------------------------------------------------------------------------------------


def test_adam_step_matches_the_textbook_in_float64() -> None:
    """One step of one element against Adam written out in float64: equal to float32 rounding."""
    spec = TrainingSpec(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    p = Param("w", "F32", (5,), 3)
    w0 = initial_state(spec, [p])["master/w"].values().astype(np.float64)
    s1 = trained_state(spec, [p], 1)
    (rng_out,) = _rng_outputs(spec, 1)
    g = gradient(p, rng_out).astype(np.float64)
    m = (1 - 0.9) * g
    v = (1 - 0.999) * g * g
    update = (m / (1 - 0.9)) / (np.sqrt(v / (1 - 0.999)) + 1e-8)
    expected = w0 - 0.1 * (update + 0.01 * w0)
    np.testing.assert_allclose(s1["master/w"].values(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s1["optimizer/w.m1"].values(), m, rtol=1e-6)
    np.testing.assert_allclose(s1["optimizer/w.m2"].values(), v, rtol=1e-4)  # float32(1 - 0.999)
    assert np.array_equal(s1["model/w"].bits, s1["master/w"].bits)  # an F32 parameter is its master weight
    assert int(s1[STEP_KEY].bits) == 1


@pytest.mark.parametrize("start", ["zero", "first"])
@pytest.mark.parametrize("every", [1, 2, 3])
def test_ema_follows_paddleformers(every: int, start: str) -> None:
    """Every ``every`` steps while the step's FP32 loss < threshold, the EMA becomes c·ema + (1−c)·master with both
    coefficients the FP32 roundings of the doubles c and 1−c (0.9: f32(1 − 0.9) differs from 1 − f32(0.9)). It starts
    at zero (Zero-Cost Checkpointing), or the first update copies master (the Trainer's EMA without ZCC)."""
    p = Param("w", "F32", (4,), 1)
    free = TrainingSpec(ema_every=every, ema_decay=0.9, ema_start=start)
    gated = dataclasses.replace(free, loss_threshold=1.0)
    losses = [float(np.float32((o >> 11) * 2.0**-52)) for o in _rng_outputs(free, 8)]
    ema = {True: np.zeros(4, np.float32), False: np.zeros(4, np.float32)}
    updated = {True: False, False: False}
    c, one_minus_c = np.float32(0.9), np.float32(1.0 - 0.9)
    assert one_minus_c != np.float32(1) - c
    for t in range(1, 9):
        master = trained_state(free, [p], t)["master/w"].values()
        for gate in (False, True):
            if t % every == 0 and (not gate or losses[t - 1] < 1.0):
                first = start == "first" and not updated[gate]
                ema[gate] = master.copy() if first else c * ema[gate] + one_minus_c * master
                updated[gate] = True
        assert np.array_equal(trained_state(free, [p], t)["ema/w"].values(), ema[False])
        assert np.array_equal(trained_state(gated, [p], t)["ema/w"].values(), ema[True])
    assert 0 < sum(loss < 1.0 for loss in losses) < 8  # the gate both skipped and passed updates


def test_a_fresh_job_may_start_its_master_weights_from_the_cast_parameter() -> None:
    """AMP O2 creates master weights from the low-precision parameter: ``master_init`` "param" starts them there."""
    p = Param("w", "BF16", (16,), 3)
    exact, cast = (initial_state(TrainingSpec(master_init=m), [p]) for m in ("exact", "param"))
    assert np.array_equal(exact["model/w"].bits, cast["model/w"].bits)
    assert not np.array_equal(exact["master/w"].bits, cast["master/w"].bits)  # 13-bit seeds do not fit BF16
    back = (cast["model/w"].bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(cast["master/w"].values(), back)


def _rng_outputs(spec: TrainingSpec, steps: int) -> list[int]:
    """The RNG's outputs for the first ``steps`` steps (they drive gradients and the loss)."""
    from reference.training import _advance_rng

    words = initial_state(spec, [])[RNG_KEY].bits.copy()
    return [_advance_rng(words) for _ in range(steps)]


def test_bf16_cast_rounds_to_nearest_even_and_keeps_nans_quiet() -> None:
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0x7F800001, 0xFF800000, 0x80000000], np.uint32)
    got = cast_bits(bits.view(np.float32), "BF16")
    assert [hex(b) for b in got] == ["0x3f80", "0x3f80", "0x3f82", "0x3f81", "0x7fc0", "0xff80", "0x8000"]
    assert cast_bits(np.array([65520.0], np.float32), "F16").view(np.float16)[0] == np.inf


def test_every_family_and_the_rng_change_the_run() -> None:
    """Each piece of state matters: perturb one and the run to step n differs (so a resume that loses it fails)."""
    spec = TrainingSpec(loss_threshold=1.0)
    params = (Param("w", "BF16", (3,), 1),)
    layouts = {}
    pieces = initial_pieces(spec, params, layouts, 0)
    train(spec, params, pieces, 3)
    reference = trained_state(spec, params, 6)
    for key in state_keys(params):
        if key in ("model/w",):  # the model parameter is re-derived from the master weights every step
            continue
        probe = {k: dataclasses.replace(lt, tensor=lt.tensor.copy()) for k, lt in pieces.items()}
        flat = probe[key].tensor.bits.reshape(-1)
        flat[-1] ^= np.array(1 << 3 if key != STEP_KEY else 1, flat.dtype)
        train(spec, params, probe, 6)
        assert _bits({k: lt.tensor for k, lt in probe.items()}) != _bits(reference), key


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_slice_trained_alone_is_the_slice_of_the_whole_run(data) -> None:
    """The invariant everything rests on: under any layout (sharded, flattened, experts on a (dp, ep) mesh), every
    rank training its own pieces from the seeds — and from a resharded checkpoint — gets the oracle's bits."""
    caps = Caps(REFERENCE_CAPS)
    ranks = data.draw(st.integers(1, 4))
    tensors, save, load, _ = data.draw(_layouts(caps, ranks, data.draw(st.booleans()), {}))
    spec = TrainingSpec.from_json(data.draw(specs()))
    params = tuple(Param(t.name, t.dtype, t.shape, t.seed) for t in tensors)
    s, n = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4))
    case = Case("P-RESUME", "reference", tensors, save, load, (), training=spec.to_json())
    for which, start, stop in (("save", 0, s), ("load", s, s + n)):
        lay = case.layouts(which)
        world = next(iter(lay.values())).mesh.world_size
        for rank in range(world):
            pieces = local_tensors(trained_state(spec, params, start), lay, rank)
            train(spec, params, pieces, stop)
            expected = local_tensors(trained_state(spec, params, stop), lay, rank)
            assert _bits({k: v.tensor for k, v in pieces.items()}) == _bits({k: v.tensor for k, v in expected.items()})


def _worlds(case: Case) -> tuple[int, int]:
    return case.world_size("save"), case.world_size("load")


def test_a_job_that_reshards_grows_and_shrinks_within_its_smallest_world() -> None:
    """A training SUT claiming "reshard" saves on fewer ranks than the campaign's too, so a resume may grow as well as
    shrink; "min_world:N" keeps every world of the change at N ranks or more; without "reshard" both stay whole."""
    caps = sorted({*REFERENCE_CAPS, "min_world:2"})
    drawn = training_cases("P-RESUME", "reference", 4, caps)
    assert find(drawn, lambda c: _worlds(c)[0] < _worlds(c)[1]) is not None  # grows
    assert find(drawn, lambda c: _worlds(c)[0] > _worlds(c)[1]) is not None  # shrinks

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(drawn)
    def smallest(case: Case) -> None:
        assert min(_worlds(case)) >= 2, case.dumps()

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(training_cases("P-RESUME", "reference", 3, sorted(set(REFERENCE_CAPS) - {"reshard"})))
    def whole(case: Case) -> None:
        assert _worlds(case) == (3, 3), case.dumps()

    smallest()
    whole()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(training_cases("P-RESUME", "reference", 4, REFERENCE_CAPS, with_faults=True, ptrace=False).filter(
    lambda c: c.fault is not None))
def test_a_resume_fault_strikes_a_rank_of_the_saving_job(case: Case) -> None:
    """A fault in a save kills a rank that saves: the save may run on fewer ranks than the campaign has."""
    assert case.fault.rank < case.world_size("save"), case.dumps()


# --- case files ----------------------------------------------------------------------------------------------


def _case(**changes) -> dict:
    params = (Param("w", "BF16", (2,), 1),)
    lay = replicated(Mesh((1,))).to_json()
    data = Case(
        "P-RESUME", "reference", (), {k: lay for k in state_keys(params)}, {k: lay for k in state_keys(params)},
        (Op("train", None, 2), Op("save", "a", 2), Op("load", "a", 2), Op("train", None, 3)),
        training=TrainingSpec().to_json(),
    ).to_json()
    data["tensors"] = [{"name": "w", "dtype": "BF16", "shape": [2], "seed": 1}]
    data.update(changes)
    return data


def test_a_training_case_round_trips_through_json() -> None:
    case = Case.from_json(_case())
    assert Case.from_json(json.loads(case.dumps())) == case
    assert case.params() == (Param("w", "BF16", (2,), 1),)
    assert case.expected(2, "load").keys() == set(state_keys(case.params()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"training": {"lr": "fast"}}, "lr must be a finite number"),
        ({"training": {"ema_decay": 1.0}}, "ema_decay must be in [0, 1)"),
        ({"training": {"ema_every": 0}}, "ema_every must be a positive integer"),
        ({"training": {"momentum": 0.9}}, "unknown fields ['momentum']"),
        ({"training": [1]}, "training must be a JSON object"),
        ({"tensors": [{"name": "w", "dtype": "I32", "shape": [2]}]}, "dtype I32 is not one of"),
        ({"save_layout": {}}, "save layouts must name exactly the training keys"),
        ({"load_layout": {"ema/zzz": replicated(Mesh((1,))).to_json()}}, "load layouts name unknown keys"),
        ({"ops": [{"kind": "save", "name": "a", "version": 3}]}, "save of step 3, but the live state is at step 0"),
        ({"ops": [{"kind": "train", "version": 3}, {"kind": "train", "version": 2}]}, "train to step 2"),
        ({"ops": [{"kind": "train", "version": 1}, {"kind": "save", "name": "a", "version": 1},
                  {"kind": "load", "version": 1}, {"kind": "save", "name": "b", "version": 1}]},
         "live state is at step unknown"),
        ({"training": None}, "a 'train' op needs a training case"),
    ],
)
def test_malformed_training_cases_are_named(change: dict, message: str) -> None:
    with pytest.raises(CaseError) as err:
        Case.from_json(_case(**change), "t.json")
    assert message in str(err.value) and str(err.value).startswith("t.json: malformed case")


def test_after_a_partial_load_nothing_trains() -> None:
    lay = replicated(Mesh((1,))).to_json()
    with pytest.raises(CaseError, match="hold part of the state"):
        Case.from_json(_case(load_layout={"ema/w": lay}))


# --- properties on the reference -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def in_process() -> Judge:
    judge = Judge(Runners("reference", mode="in-process"))
    yield judge
    judge.close()


@pytest.mark.parametrize("prop", ["P-EMA", "P-RESUME", "P-COVER"])
def test_reference_keeps_training_state(prop: str, in_process: Judge) -> None:
    """Every world size up to 4 in-process (the reference plays all ranks); launched ranks: test_sut_properties."""

    @settings(max_examples=max(10, settings.default.max_examples // 2))
    @given(training_cases(prop, "reference", 4, REFERENCE_CAPS))
    def check(case: Case) -> None:
        judgement, _ = in_process(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    check()


@pytest.mark.multirank
def test_reference_resumes_after_crashes_in_a_later_save() -> None:
    """P-RESUME with a rank or an async writer killed in the second save (crash points, power-loss states, psutil
    triggers) on launched ranks: whatever loads, the resumed run must equal the uninterrupted one."""
    judge = Judge(Runners("reference", mode="pool"), exploring=True)

    @settings(max_examples=max(2, settings.default.max_examples // 16))
    @given(training_cases("P-RESUME", "reference", 2, REFERENCE_CAPS, with_faults=True).filter(
        lambda c: c.fault is not None))
    def check(case: Case) -> None:
        judgement, _ = judge(case)
        assert judgement.ok, "\n".join(judgement.details) + "\n" + case.dumps()

    try:
        check()
    finally:
        judge.close()


# --- broken SUTs are caught ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sut", "prop"),
    [
        ("tests.suts.buggy:FloatsOnlySut", "P-RESUME"),
        ("tests.suts.buggy:EmaFromMasterSut", "P-EMA"),
        ("tests.suts.buggy:NoSnapshotAsyncSut", "P-RESUME"),
    ],
)
def test_broken_training_sut_is_caught_shrunk_and_replayed(tmp_path: Path, capsys, sut: str, prop: str) -> None:
    out = tmp_path / "out"
    # Bounded by cases, not seconds: how far a time-bounded campaign shrinks depends on the machine's load.
    code = main(["fuzz", "--sut", sut, "--ranks", "2", "--time", "600", "--cases", "30", "--out", str(out),
                 "--property", prop, "--seed", "1", "--launch", "in-process"])
    assert code == 1
    finding_file = next((out / "findings").glob("*.json"))
    finding = json.loads(finding_file.read_text())
    assert finding["property"] == prop and finding["verdict"] in ("silent-corruption", "loud-failure")
    case = finding["case"]
    assert "training" in case and len(case["tensors"]) <= 2  # shrunk: a parameter (or an expert pair)
    assert all(math.prod(t["shape"]) <= 4 for t in case["tensors"])
    capsys.readouterr()
    assert main(["replay", str(finding_file), "--launch", "in-process"]) == 1
    case["sut"] = "reference"
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(case))
    assert main(["replay", str(fixed), "--launch", "in-process"]) == 0


def test_ema_only_loads_compare_only_the_ema() -> None:
    """A P-EMA load of the EMA alone: the expected state is the EMA family, resharded by the oracle."""
    case = Case.from_json(_case(load_layout={k: v for k, v in _case()["load_layout"].items() if k.startswith("ema/")},
                                ops=[{"kind": "train", "version": 2}, {"kind": "save", "name": "a", "version": 2},
                                     {"kind": "load", "name": "a", "version": 2}]))
    assert set(case.expected(2, "load")) == {family_keys("w")["ema"]}


def _dp_moe_case(sut: str) -> Case:
    """Experts keyed by global id over ep = 2 with data parallelism dp = 2 (4 ranks), plus one dense parameter."""
    mesh = Mesh((2, 2), ("dp", "ep"))
    experts = keyed_layouts(mesh, "ep", 4, "moe", "w1")
    layouts = {"w": replicated(mesh), **experts}
    tensors = (TensorCase("w", "BF16", (3,), 1),
               *(TensorCase(name, "BF16", (2,), 2 + i) for i, name in enumerate(sorted(experts))))
    save = {key: layouts[name].to_json() for name in layouts for key in family_keys(name).values()}
    save[RNG_KEY] = save[STEP_KEY] = replicated(mesh).to_json()
    ops = (Op("train", None, 2), Op("save", "step-2", 2), Op("load", "step-2", 2))
    return Case("P-COVER", sut, tensors, save, save, ops, training=TrainingSpec().to_json())


def test_dp_moe_ranks_beyond_the_first_save_only_their_experts(tmp_path: Path) -> None:
    """On the reference: the coordinator writes the dense families, RNG and step; rank (dp 0, ep 1) writes only
    its experts; dp 1 ranks write nothing; every tensor is covered exactly once (P-COVER passes)."""
    case = _dp_moe_case("reference")
    runners = Runners("reference", mode="in-process")
    try:
        judgement, _ = Judge(runners)(case)
        assert judgement.ok, judgement.details
        root = tmp_path / "ckpt"
        root.mkdir()
        outcome = Outcome("reference")
        run_ops(case, runners, root, range(2), outcome)
    finally:
        runners.close()
    index = read_index(root / "step-2")
    writers: dict[str, set[str]] = {}
    for name in index.tensors:
        for piece in index.slices_of(name):
            writers.setdefault(piece.file, set()).add(name)
    assert set(writers) == {rank_file(0), rank_file(1)}
    assert all(".experts." in key for key in writers[rank_file(1)])
    assert {k for k in writers[rank_file(0)] if ".experts." not in k} == set(state_keys(case.params())) - {
        k for k in state_keys(case.params()) if ".experts." in k}


def test_duplicated_replicas_break_p_cover() -> None:
    judge = Judge(Runners("tests.suts.buggy:SavesEveryReplicaSut", mode="in-process"))
    try:
        judgement, _ = judge(_dp_moe_case("tests.suts.buggy:SavesEveryReplicaSut"))
    finally:
        judge.close()
    assert not judgement.ok and "Overlapping" in " ".join(judgement.details)


@pytest.mark.multirank
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_paddle_resumes_from_one_checkpoint_per_family(tmp_path: Path, use_async: bool) -> None:
    """paddle-dcp with split_families: six save_state_dict calls (dist tensors for some families, ShardedWeight
    for others) into six subdirectories; a restart resumes from them bitwise, and P-COVER reads every family's
    metadata."""
    pytest.importorskip("paddle")
    mesh = Mesh((2,), ("dp",))
    tensors = (TensorCase("w", "BF16", (4, 3), 1), TensorCase("b", "F32", (3,), 2))
    layout = {"w": Sharded(mesh, (Shard(0),)), "b": replicated(mesh)}
    save = {k: layout[name].to_json() for name in layout for k in family_keys(name).values()}
    save[RNG_KEY] = save[STEP_KEY] = replicated(mesh).to_json()
    kinds = {"model": "dist_from_local", "optimizer": "sharded_weight", "master": "sharded_weight",
             "ema": "dist_from_local", "rng": "sharded_weight", "meta": "dist_from_local"}
    ops = (Op("train", None, 3), Op("save", "step-3", 3, use_async), Op("restart"), Op("load", "step-3", 3),
           Op("train", None, 5))
    case = Case("P-RESUME", "paddle-dcp", tensors, save, save, ops, {"split_families": True, "tensor_kinds": kinds},
                training=TrainingSpec(loss_threshold=1.0).to_json())
    runners = Runners("paddle-dcp", mode="fresh")
    try:
        judgement, _ = Judge(runners)(Case.from_json(case.to_json()))
        assert judgement.ok, judgement.details
        if use_async:  # the layout below is the sync save's: an async one writes the same files, later
            return
        root = tmp_path / "ckpt"
        root.mkdir()
        run_ops(case, runners, root, range(2), Outcome("paddle-dcp"))
    finally:
        runners.close()
    assert sorted(p.name for p in (root / "step-3").iterdir()) == sorted(kinds)
    from harness.sut.paddle_dcp import PaddleDcpSut

    written = PaddleDcpSut.written(root, "step-3")
    assert set(written) == set(save)
