"""reference/aoa.py: what a checkpoint stores for each AoA transformation, piece by piece, is the inverse of what its
statement does to it, so a load through the statements gives the model's tensors back."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from reference import aoa
from reference.layout import Box, FlatRange


def _boxes(shape: tuple[int, ...], cuts: dict[int, int]) -> list[Box]:
    """The boxes of ``shape`` cut into ``cuts[axis]`` runs along some axes (the last run takes the rest)."""
    runs = []
    for axis, n in enumerate(shape):
        k = cuts.get(axis, 1)
        bounds = [n * i // k for i in range(k)] + [n]
        runs.append([(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)])
    return [Box(tuple(o for o, _ in combo), tuple(s for _, s in combo)) for combo in itertools.product(*runs)]


def _assembled(pieces: list[aoa.StoredPiece]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for p in pieces:
        key = p.owner + p.suffix
        whole = out.setdefault(key, np.full(p.global_shape, 0xEE, p.bits.dtype))
        assert isinstance(p.region, Box)
        whole[tuple(slice(o, o + n) for o, n in zip(p.region.offsets, p.region.shape))] = p.bits
    return out


def _pieces(name: str, dtype: str, array: np.ndarray, cuts: dict[int, int]) -> list[dict[str, aoa.Piece]]:
    """One dict per rank: rank r holds box r of the cut."""
    return [{name: aoa.Piece(dtype, array.shape, box, array[tuple(slice(o, o + n) for o, n in
                                                                  zip(box.offsets, box.shape))].copy())}
            for box in _boxes(array.shape, cuts)]


RNG = np.random.default_rng(7)
A = RNG.integers(0, 2**16, (4, 6, 2), dtype=np.uint16)


@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 0, 1], [0, 2, 1]])
@pytest.mark.parametrize("cuts", [{}, {0: 2}, {1: 3, 2: 2}])
def test_a_permuted_checkpoint_transposes_back_to_the_model(perm, cuts) -> None:
    t = {"op": "permute", "name": "model/w", "perm": perm}
    stored = [p for rank in _pieces("model/w", "BF16", A, cuts) for p in aoa.stored([t], rank)]
    whole = _assembled(stored)["model/w.aoa_t"]
    assert np.array_equal(np.transpose(whole, perm), A)
    assert aoa.statements([t], lambda n: n.replace("/", "."), {"model/w": "BF16"}) == \
        [f"model.w.aoa_t -> model.w, permute='{perm}'"]


@pytest.mark.parametrize("axis,parts", [(0, 2), (1, 3), (1, 2), (2, 2)])
@pytest.mark.parametrize("cuts", [{}, {0: 3}, {1: 4}])
def test_concatenated_parts_rebuild_the_model_tensor(axis, parts, cuts) -> None:
    t = {"op": "concat", "name": "model/w", "axis": axis, "parts": parts}
    stored = _assembled([p for rank in _pieces("model/w", "BF16", A, cuts) for p in aoa.stored([t], rank)])
    assert np.array_equal(np.concatenate([stored[f"model/w.aoa_part_{i}"] for i in range(parts)], axis=axis), A)


def test_a_fused_checkpoint_splits_into_both_model_tensors() -> None:
    b = RNG.integers(0, 2**16, A.shape, dtype=np.uint16)
    t = {"op": "split", "names": ["model/w", "model/b"], "axis": 1}
    ranks = [{**x, **y} for x, y in zip(_pieces("model/w", "F16", A, {0: 2}), _pieces("model/b", "F16", b, {0: 2}))]
    stored = _assembled([p for rank in ranks for p in aoa.stored([t], rank)])
    assert list(stored) == ["model/w.aoa_fused"]
    first, second = np.split(stored["model/w.aoa_fused"], 2, axis=1)
    assert np.array_equal(first, A) and np.array_equal(second, b)
    cut_on_axis = [{**x, **y} for x, y in zip(_pieces("model/w", "F16", A, {1: 2}),
                                              _pieces("model/b", "F16", b, {1: 2}))]
    with pytest.raises(aoa.AoaError, match="whole along axis 1"):
        aoa.stored([t], cut_on_axis[0])


def test_a_cast_stores_f16_widened_exactly_nans_included() -> None:
    bits = np.array([0x7E01, 0x7C01, 0xFC10, 0x0001, 0x8001, 0x7C00, 0x3C00], np.uint16)
    wide = aoa.widened("F16", bits)
    assert wide.dtype == np.uint32 and np.array_equal(wide.view(np.float32).astype(np.float16).view(np.uint16), bits)
    piece = aoa.Piece("F16", (7,), FlatRange(0, 7), bits)  # a flattened piece goes through a cast as it is
    (out,) = aoa.stored([{"op": "cast", "name": "w"}], {"w": piece})
    assert (out.suffix, out.dtype, out.region) == (".aoa_f32", "F32", FlatRange(0, 7))


@pytest.mark.parametrize("transforms,said", [
    ([{"op": "mirror", "name": "w"}], "unknown op"),
    ([{"op": "rename", "name": "nope"}], "does not hold"),
    ([{"op": "rename", "name": "w"}, {"op": "cast", "name": "w"}], "named by two"),
    ([{"op": "permute", "name": "w", "perm": [0, 0]}], "no permutation"),
    ([{"op": "cast", "name": "b"}], "needs F16"),
    ([{"op": "concat", "name": "w", "axis": 0, "parts": 3}], "does not divide"),
    ([{"op": "split", "names": ["w", "b"], "axis": 0}], "one dtype and shape"),
    ([{"op": "permute", "name": "w", "perm": [0, 1], "spelling": "T"}], "reverses the axes"),
    ([{"op": "rename", "name": "w", "spelling": "id"}], "needs a number"),
    ([{"op": "cast", "name": "w", "spelling": "star"}], "no spelling"),
])
def test_transformations_that_do_not_fit_the_tensors_are_a_typed_error(transforms, said) -> None:
    with pytest.raises(aoa.AoaError, match=said):
        aoa.check(transforms, {"w": ("F16", (4, 2)), "b": ("BF16", (4, 2))})


def test_each_spelling_means_the_plain_statement() -> None:
    """The macros write the same statements: ^T a reversing permute, * and [a:b] the parts' names, an id
    placeholder one rename for every numbered name it fits (once, however many transformations it covers)."""
    key = lambda n: n.replace("/", ".")  # noqa: E731
    spelled = [{"op": "permute", "name": "m/w", "perm": [1, 0], "spelling": "T"},
               {"op": "concat", "name": "m/b", "axis": 0, "parts": 2, "spelling": "star"},
               {"op": "concat", "name": "m/e", "axis": 1, "parts": 3, "spelling": "array"},
               {"op": "rename", "name": "m/experts.0.w1", "spelling": "id"},
               {"op": "rename", "name": "m/experts.3.w1"},
               {"op": "rename", "name": "m/layers.2.up", "spelling": "id"},
               {"op": "rename", "name": "m/layers.4.up", "spelling": "id"}]
    assert aoa.statements(spelled, key, {}) == [
        "m.w.aoa_t^T -> m.w", "m.b.aoa_part_* -> m.b, axis=0", "m.e.aoa_part[0:3] -> m.e, axis=1",
        "m.experts.$EXPERT_ID.w1.aoa_renamed -> m.experts.$EXPERT_ID.w1",
        "m.layers.$LAYER_ID.up.aoa_renamed -> m.layers.$LAYER_ID.up"]
    plain = [{k: v for k, v in t.items() if k != "spelling"} for t in spelled]
    assert aoa.statements(plain, key, {})[:3] == [
        "m.w.aoa_t -> m.w, permute='[1, 0]'", "m.b.aoa_part_0, m.b.aoa_part_1 -> m.b, axis=0",
        "m.e.aoa_part_0, m.e.aoa_part_1, m.e.aoa_part_2 -> m.e, axis=1"]
    assert not aoa.NUMBERED.search("model/w1") and aoa.NUMBERED.search("model/layers/0/w")


def test_p_aoa_draws_every_spelling() -> None:
    from hypothesis import find, settings

    from harness.sut.paddle_dcp import PaddleDcpSut
    from properties.registry import property_cases

    for op, spellings in aoa.SPELLINGS.items():
        for spelling in spellings[1:]:
            find(property_cases("P-AOA", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                 lambda c, o=op, sp=spelling: any(t["op"] == o and t.get("spelling") == sp for t in c.options["aoa"]),
                 settings=settings(max_examples=800, database=None))


@pytest.mark.multirank
def test_paddle_loads_through_every_spelling() -> None:
    """One real load through each macro: an expert family renamed by ``$EXPERT_ID``, parts found by ``*`` and
    ``[0:n]``, a transpose by ``^T``."""
    pytest.importorskip("paddle")
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from properties.model.case import Case

    def layout(placement: str) -> dict:
        return {"kind": "sharded", "mesh": {"dim_names": ["d0"], "shape": [2]}, "owner": [], "placements": [placement]}

    tensors = {"model/moe.experts.0.w1": ("F32", [2, 3], "R", "S1"),
               "model/moe.experts.1.w1": ("F32", [2, 3], "S0", "R"),
               "model/w": ("F32", [4, 2], "S1", "S0"), "model/b": ("BF16", [2, 3], "S0", "S1"),
               "model/emb": ("F32", [6], "S0", "R")}
    case = Case.from_json({
        "property": "P-AOA", "sut": "paddle-dcp", "seed": 0, "version": 1,
        "tensors": [{"name": n, "dtype": d, "shape": s, "seed": i + 1}
                    for i, (n, (d, s, _, _)) in enumerate(tensors.items())],
        "save_layout": {n: layout(p) for n, (_, _, p, _) in tensors.items()},
        "load_layout": {n: layout(p) for n, (_, _, _, p) in tensors.items()},
        "ops": [{"kind": "save", "name": "step-0", "version": 0}, {"kind": "load", "name": "step-0", "version": 0}],
        "options": {"tensor_kind": "sharded_weight", "aoa": [
            {"op": "rename", "name": "model/moe.experts.0.w1", "spelling": "id"},
            {"op": "rename", "name": "model/moe.experts.1.w1"},
            {"op": "concat", "name": "model/w", "axis": 0, "parts": 2, "spelling": "star"},
            {"op": "permute", "name": "model/b", "perm": [1, 0], "spelling": "T"},
            {"op": "concat", "name": "model/emb", "axis": 0, "parts": 3, "spelling": "array"}]},
    })
    judge = Judge(Runners("paddle-dcp", mode="pool"), exploring=False)
    try:
        judgement, _ = judge(case)
    finally:
        judge.close()
    assert judgement.ok, "\n".join(judgement.details)
