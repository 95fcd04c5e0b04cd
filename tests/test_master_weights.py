"""What a resume restores of a state saved with a weight or its master in place of the other
(reference/master_weights.py), and where the case model applies it: loads of a multi-rank save made under the flags."""

from __future__ import annotations

import dataclasses

import numpy as np

from properties.model.case import Case, Op, TensorCase
from reference import master_weights
from reference.dtypes import dtype
from reference.layout import Mesh, replicated
from reference.tensor import Tensor


def _f32(*values: float) -> Tensor:
    return Tensor(dtype("F32"), np.array(values, np.float32).view(np.uint32))


def _bf16(*bits: int) -> Tensor:
    return Tensor(dtype("BF16"), np.array(bits, np.uint16))


def test_skip_save_model_weight_gives_each_16_bit_weight_its_master_rounded_to_nearest_even() -> None:
    """1 + 2^-8 lies halfway between BF16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): to even, 0x3F80; 1 + 3 * 2^-8 lies
    halfway between 0x3F81 and 0x3F82: to even, 0x3F82; 1 + 2^-8 + 2^-20 is past halfway: 0x3F81."""
    state = {"model/w": _bf16(0, 0, 0), "master/w": _f32(1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20),
             "model/b": _f32(7.0), "optimizer/w.m1": _f32(1.0, 2.0, 3.0)}
    out = master_weights.restored(state, [master_weights.SKIP_MODEL_WEIGHT])
    assert out["model/w"].bits.tolist() == [0x3F80, 0x3F82, 0x3F81]
    assert {k: v for k, v in out.items() if k != "model/w"} == {k: v for k, v in state.items() if k != "model/w"}


def test_remove_master_weight_gives_each_master_its_weight_widened() -> None:
    state = {"model/w": _bf16(0x3F81, 0xFF80), "master/w": _f32(5.0, 6.0), "model/b": _f32(7.0)}
    out = master_weights.restored(state, [master_weights.REMOVE_MASTER_WEIGHT])
    assert out["master/w"].bits.view(np.float32).tolist() == [1 + 2**-7, -np.inf]
    assert out["model/w"] == state["model/w"] and out["model/b"] == state["model/b"]


def test_a_weight_that_is_its_master_rounded_is_restored_unchanged() -> None:
    master = _f32(0.1, -3.5, 1e30)
    weight = _bf16(*(int(b) >> 16 if (int(b) & 0xFFFF) < 0x8000 else (int(b) >> 16) + 1 for b in master.bits))
    state = {"model/w": weight, "master/w": master}
    for flag in master_weights.FLAGS:
        assert master_weights.restored(state, [flag])["model/w"] == weight


def _case(flag: str, save_world: int) -> Case:
    tensors = (TensorCase("model/w", "BF16", (2,), 1), TensorCase("master/w", "F32", (2,), 2))
    save = {t.name: replicated(Mesh((save_world,), ("d0",))).to_json() for t in tensors}
    load = {t.name: replicated(Mesh((1,), ("d0",))).to_json() for t in tensors}
    return Case("P-RESHARD", "reference", tensors, save, load,
                (Op("save", "step-1", 0), Op("load", "step-1", 0)), {flag: True}, 0)


def test_a_load_of_a_multi_rank_save_made_under_a_flag_is_restored_and_a_one_rank_save_is_not() -> None:
    """A one-rank job saves both the weights and their masters whatever the flags (UC's single-card save)."""
    two, one = _case(master_weights.SKIP_MODEL_WEIGHT, 2), _case(master_weights.SKIP_MODEL_WEIGHT, 1)
    assert two.restored(0, "load") == master_weights.restored(two.expected(0, "load"),
                                                               [master_weights.SKIP_MODEL_WEIGHT])
    assert two.restored(0, "load") != two.expected(0, "load")
    assert one.restored(0, "load") == one.expected(0, "load")


def test_p_diff_holds_the_reference_engines_load_to_what_a_resume_restores() -> None:
    """The reference engine saves the weights and their masters whatever the flags: P-DIFF compares a SUT's load
    with the reference's as a resume restores it, so a SUT restoring by the flag passes and one giving back the
    state as saved does not."""
    from properties.check.oracle import check_diff
    from properties.model.outcome import OpRecord, Outcome

    case = dataclasses.replace(_case(master_weights.REMOVE_MASTER_WEIGHT, 2), property="P-DIFF")
    saved, restored = case.expected(0, "load"), case.restored(0, "load")
    assert saved != restored

    def outcome(state: dict) -> Outcome:
        return Outcome(case.sut, [OpRecord(0, "save", "step-1"), OpRecord(1, "load", "step-1", loaded={0: state})])

    assert check_diff(case, outcome(restored), outcome(saved)).ok
    assert not check_diff(case, outcome(saved), outcome(saved)).ok
