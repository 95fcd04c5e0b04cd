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
        key = p.key
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


def _rows(*names: str) -> dict[str, np.ndarray]:
    """Tensors of shape (rows, 2) whose row ``i`` is the number of its label, ``"q3"`` -> 3 + 100 * (which name)."""
    return {n: np.array([[100 * k + i] * 2 for i in range(rows)], np.uint16)
            for k, (n, rows) in enumerate((n.split(":")[0], int(n.split(":")[1])) for n in names)}


@pytest.mark.parametrize("t,degree,order", [
    # Q heads of a key-value group, then its K head and V head (num_heads=4, num_key_value_groups=2)
    ({"op": "qkv", "heads": 4, "groups": 2}, 1, ["q0", "q1", "k0", "v0", "q2", "q3", "k1", "v1"]),
    ({"op": "qkv", "heads": 4, "groups": 1}, 1, ["q0", "q1", "q2", "q3", "k0", "v0"]),
    # per tensor-parallel shard: its Q heads, its K heads, its V heads
    ({"op": "qkv_tp", "heads": 4, "groups": 2}, 1, ["q0", "q1", "q2", "q3", "k0", "k1", "v0", "v1"]),
    ({"op": "qkv_tp", "heads": 4, "groups": 2}, 2, ["q0", "q1", "k0", "v0", "q2", "q3", "k1", "v1"]),
    ({"op": "qkv_tp", "heads": 2, "groups": 2}, 2, ["q0", "k0", "v0", "q1", "k1", "v1"]),
    # per shard: its part of gate, then of up
    ({"op": "ffn"}, 2, ["q0", "q1", "k0", "k1", "q2", "q3", "k2", "k3"]),
    ({"op": "ffn"}, 4, ["q0", "k0", "q1", "k1", "q2", "k2", "q3", "k3"]),
])
@pytest.mark.parametrize("cuts", [{}, {1: 2}])
def test_a_fusion_stores_the_blocks_in_the_order_its_macro_reads(t, degree, order, cuts) -> None:
    """Written out by hand from the macros' documented layouts, one head a row: the fused tensor the checkpoint
    holds, whichever way the ranks cut the other axis."""
    fused_rows = len(order)
    if t["op"] == "ffn":
        tensors = _rows("q:4", "k:4")
    else:
        tensors = _rows(f"q:{t['heads']}", f"k:{t['groups']}", f"v:{t['groups']}")
    t = {**t, "names": list(tensors), "axis": 0}
    ranks = [dict(pair) for pair in zip(*([(n, p[n]) for p in _pieces(n, "BF16", a, cuts)]
                                          for n, a in tensors.items()))]
    stored = _assembled([p for rank in ranks for p in aoa.stored([t], rank, {"q": degree})])
    labels = {f"{n}{i}": 100 * k + i for k, n in enumerate(tensors) for i in range(len(tensors[n]))}
    assert stored["q.aoa_fused"].shape == (fused_rows, 2)
    assert list(stored["q.aoa_fused"][:, 0]) == [labels[o] for o in order]


@pytest.mark.parametrize("t", [{"op": "qkv", "heads": 6, "groups": 2}, {"op": "qkv_tp", "heads": 6, "groups": 2},
                               {"op": "ffn"}, {"op": "split"}])
@pytest.mark.parametrize("load_cuts", [{}, {0: 2}, {0: 3, 1: 2}, {0: 4}])
def test_every_load_piece_reads_back_what_the_fusion_stored(t, load_cuts) -> None:
    """Any load layout, cut along the fused axis or not: the regions ``reads`` names in the stored fused tensor,
    put together, are the model piece."""
    degree = 2
    if t["op"] in ("qkv", "qkv_tp"):
        shapes = {"m/q": (12, 3), "m/k": (4, 3), "m/v": (4, 3)}  # heads of two rows
    else:
        shapes = {"m/q": (8, 3), "m/k": (8, 3)}
    model = {n: RNG.integers(0, 2**16, s, dtype=np.uint16) for n, s in shapes.items()}
    t = {**t, "names": list(model), "axis": 0}
    ranks = [dict(pair) for pair in zip(*([(n, p[n]) for p in _pieces(n, "BF16", a, {1: degree})]
                                          for n, a in model.items()))]
    whole = _assembled([p for rank in ranks for p in aoa.stored([t], rank, {"m/q": degree})])
    for name, array in model.items():
        for box in _boxes(array.shape, load_cuts):
            got = [whole[r.key][tuple(slice(o, o + n) for o, n in zip(r.region.offsets, r.region.shape))]
                   for r in aoa.reads([t], name, "BF16", array.shape, box, {"m/q": degree})]
            want = array[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.shape))]
            assert np.array_equal(aoa.assemble([t], name, "BF16", box, got, np.zeros(want.shape, np.uint16)), want)


@pytest.mark.parametrize("save_cuts", [{}, {1: 3}])
@pytest.mark.parametrize("load_cuts", [{}, {0: 2}, {0: 3, 1: 2}, {0: 8}])
def test_a_fused_model_tensor_is_stored_as_its_parts_and_read_back(save_cuts, load_cuts) -> None:
    """qkv_parts: the model holds Q, K, V fused (4 query heads in 2 groups, a head a row); the checkpoint holds the
    parts apart, Q's heads in order, and any load piece of the fused tensor reads back from them."""
    t = {"op": "qkv_parts", "name": "m/f", "heads": 4, "groups": 2, "axis": 0}
    fused = np.array([[r * 10 + c for c in range(3)] for r in range(8)], np.uint16)
    aoa.check([t], {"m/f": ("BF16", fused.shape)})
    whole = _assembled([p for rank in _pieces("m/f", "BF16", fused, save_cuts) for p in aoa.stored([t], rank)])
    rows = {k: list(v[:, 0] // 10) for k, v in whole.items()}  # the fused rows each part holds
    assert rows == {"m/f.aoa_q": [0, 1, 4, 5], "m/f.aoa_k": [2, 6], "m/f.aoa_v": [3, 7]}
    for box in _boxes(fused.shape, load_cuts):
        got = [whole[r.key][tuple(slice(o, o + n) for o, n in zip(r.region.offsets, r.region.shape))]
               for r in aoa.reads([t], "m/f", "BF16", fused.shape, box)]
        want = fused[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.shape))]
        assert np.array_equal(aoa.assemble([t], "m/f", "BF16", box, got, np.zeros(want.shape, np.uint16)), want)
    assert aoa.statements([t], lambda n: n.replace("/", "."), {}) == [
        "m.f.aoa_q, m.f.aoa_k, m.f.aoa_v -> m.f, fused_qkv, num_heads=4, num_key_value_groups=2, axis=0"]
    with pytest.raises(aoa.AoaError, match="heads of one size"):
        aoa.check([{**t, "heads": 3, "groups": 3}], {"m/f": ("BF16", fused.shape)})


@pytest.mark.parametrize("t, rows, statement", [
    ({"op": "ffn_parts", "degree": 2}, {"m/f.aoa_gate": [0, 1, 4, 5], "m/f.aoa_up": [2, 3, 6, 7]},
     "m.f.aoa_gate, m.f.aoa_up -> m.f, fused_ffn, axis=0"),
    ({"op": "ffn_parts", "degree": 1}, {"m/f.aoa_gate": [0, 1, 2, 3], "m/f.aoa_up": [4, 5, 6, 7]},
     "m.f.aoa_gate, m.f.aoa_up -> m.f, fused_ffn, axis=0"),
    ({"op": "qkv_tp_parts", "heads": 4, "groups": 2, "degree": 2},
     {"m/f.aoa_q": [0, 1, 4, 5], "m/f.aoa_k": [2, 6], "m/f.aoa_v": [3, 7]},
     "m.f.aoa_q, m.f.aoa_k, m.f.aoa_v -> m.f, fused_qkv_old, num_heads=4, num_key_value_groups=2, axis=0"),
    ({"op": "qkv_tp_parts", "heads": 2, "groups": 2, "degree": 1},
     {"m/f.aoa_q": [0, 1], "m/f.aoa_k": [2, 3], "m/f.aoa_v": [4, 5]},
     "m.f.aoa_q, m.f.aoa_k, m.f.aoa_v -> m.f, fused_qkv_old, num_heads=2, num_key_value_groups=2, axis=0"),
])
@pytest.mark.parametrize("load_cuts", [{}, {0: 2}, {0: 3, 1: 2}])
def test_a_model_tensor_fused_at_its_own_degree_is_stored_as_its_parts(t, rows, statement, load_cuts) -> None:
    """ffn_parts and qkv_tp_parts: the model tensor is gate and up (or Q, K, V) fused as a tensor-parallel job of
    the model's degree holds them, shard by shard, a row a head (written out by hand from the macros' documented
    layouts); the checkpoint holds each member whole, in order, and any load piece reads back from them."""
    n = sum(len(r) for r in rows.values())
    t = {**t, "name": "m/f", "axis": 0}
    fused = np.array([[r * 10 + c for c in range(3)] for r in range(n)], np.uint16)
    aoa.check([t], {"m/f": ("BF16", fused.shape)})
    whole = _assembled([p for rank in _pieces("m/f", "BF16", fused, {1: 3}) for p in aoa.stored([t], rank)])
    assert {k: list(v[:, 0] // 10) for k, v in whole.items()} == rows
    for box in _boxes(fused.shape, load_cuts):
        got = [whole[r.key][tuple(slice(o, o + n) for o, n in zip(r.region.offsets, r.region.shape))]
               for r in aoa.reads([t], "m/f", "BF16", fused.shape, box)]
        want = fused[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.shape))]
        assert np.array_equal(aoa.assemble([t], "m/f", "BF16", box, got, np.zeros(want.shape, np.uint16)), want)
    assert aoa.statements([t], lambda k: k.replace("/", "."), {}) == [statement]
    with pytest.raises(aoa.AoaError, match="does not divide"):
        aoa.check([{**t, "degree": 3}], {"m/f": ("BF16", fused.shape)})


def test_a_fusion_statement_names_its_macro_and_heads() -> None:
    key = lambda n: n.replace("/", ".")  # noqa: E731
    transforms = [{"op": "qkv", "names": ["m/q", "m/k", "m/v"], "axis": 1, "heads": 4, "groups": 2},
                  {"op": "qkv_tp", "names": ["m/a", "m/b", "m/c"], "axis": 0, "heads": 2, "groups": 1},
                  {"op": "ffn", "names": ["m/g", "m/u"], "axis": 1}]
    assert aoa.statements(transforms, key, {}) == [
        "m.q.aoa_fused -> m.q, m.k, m.v, fused_qkv, num_heads=4, num_key_value_groups=2, axis=1",
        "m.a.aoa_fused -> m.a, m.b, m.c, fused_qkv_old, num_heads=2, num_key_value_groups=1, axis=0",
        "m.g.aoa_fused -> m.g, m.u, fused_ffn, axis=1"]
    piece = aoa.Piece("BF16", (2, 2), Box((0, 0), (2, 2)), np.zeros((2, 2), np.uint16))
    with pytest.raises(aoa.AoaError, match="needs the checkpoint's degree"):
        aoa.stored(transforms[2:], {"m/g": piece, "m/u": piece})
    with pytest.raises(aoa.AoaError, match="needs the checkpoint's degree"):
        aoa.reads(transforms[2:], "m/g", "BF16", (2, 2), Box((0, 0), (2, 2)))


def test_an_offset_rename_stores_its_family_one_layer_up() -> None:
    """``$LAYER_ID_OFFSET`` maps the checkpoint's layer n+1 to the model's n: every rename of the family is stored
    one number up, under one statement; a rename of that family spelled otherwise is refused."""
    key = lambda n: n.replace("/", ".")  # noqa: E731
    t = [{"op": "rename", "name": "m/layers.0.w", "spelling": "offset"},
         {"op": "rename", "name": "m/layers.3.w", "spelling": "offset"}]
    piece = aoa.Piece("F32", (2,), Box((0,), (2,)), np.arange(2, dtype=np.uint32))
    stored = aoa.stored(t, {"m/layers.0.w": piece, "m/layers.3.w": piece})
    assert [p.key for p in stored] == ["m/layers.1.w.aoa_renamed", "m/layers.4.w.aoa_renamed"]
    assert aoa.statements(t, key, {}) == ["m.layers.$LAYER_ID_OFFSET.w.aoa_renamed -> m.layers.$LAYER_ID_OFFSET.w"]
    assert [r.key for r in aoa.reads(t, "m/layers.3.w", "F32", (2,), Box((0,), (2,)))] == \
        ["m/layers.4.w.aoa_renamed"]
    tensors = {"m/layers.0.w": ("F32", (2,)), "m/layers.3.w": ("F32", (2,))}
    aoa.check(t, tensors)
    with pytest.raises(aoa.AoaError, match="family an offset renames"):
        aoa.check([t[0], {"op": "rename", "name": "m/layers.3.w", "spelling": "id"}], tensors)


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
    ([{"op": "split", "names": ["w", "b"], "axis": 0}], "one dtype and one shape"),
    ([{"op": "qkv", "names": ["w", "q", "b"], "axis": 0, "heads": 2, "groups": 2}], "one dtype and one shape"),
    ([{"op": "qkv", "names": ["w", "k", "v"], "axis": 0, "heads": 3, "groups": 2}], "a multiple of groups"),
    ([{"op": "qkv", "names": ["w", "k", "v"], "axis": 0, "heads": 4, "groups": 4}], "heads of one size"),
    ([{"op": "ffn", "names": ["k", "v"], "axis": 0}], "degree 3: the degree does not divide"),
    ([{"op": "qkv_tp", "names": ["w", "k", "v"], "axis": 0, "heads": 4, "groups": 2}], "does not divide"),
    ([{"op": "permute", "name": "w", "perm": [0, 1], "spelling": "T"}], "reverses the axes"),
    ([{"op": "rename", "name": "w", "spelling": "id"}], "needs a number"),
    ([{"op": "cast", "name": "w", "spelling": "star"}], "no spelling"),
])
def test_transformations_that_do_not_fit_the_tensors_are_a_typed_error(transforms, said) -> None:
    tensors = {"w": ("F16", (4, 2)), "b": ("BF16", (4, 2)), "q": ("F16", (4, 3)), "k": ("F16", (2, 2)),
               "v": ("F16", (2, 2))}
    with pytest.raises(aoa.AoaError, match=said):
        aoa.check(transforms, tensors, {"w": 4, "k": 3})


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


def test_drawn_fusions_leave_a_case_whose_layouts_place_every_tensor() -> None:
    """Fusion members are reshaped and moved to their lead's save layout: the case still passes the case format,
    its fusions' degrees divide their heads, and each layout places its tensor on every rank."""
    from hypothesis import HealthCheck, given, settings

    from harness.sut.paddle_dcp import PaddleDcpSut
    from properties.model.case import Case
    from properties.registry import property_cases

    @settings(max_examples=150, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(property_cases("P-AOA", "paddle-dcp", 4, PaddleDcpSut.capabilities))
    def drawn(case: Case) -> None:
        case = Case.from_json(case.to_json())
        shapes = {t.name: tuple(t.shape) for t in case.tensors}
        for which in ("save", "load"):
            for name, layout in case.layouts(which).items():
                for rank in range(layout.mesh.world_size):
                    layout.local(shapes[name], rank)

    drawn()


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_reference_loads_every_drawn_aoa_case_back(ranks: int) -> None:
    """The oracle's two halves agree: what ``stored`` writes for a drawn case (fusions at their save layout's
    degree), ``reads`` and ``assemble`` give back bit for bit, on the reference engine's own checkpoints."""
    from hypothesis import HealthCheck, given, settings

    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from harness.sut.reference import ReferenceSut
    from properties.model.case import Case
    from properties.registry import property_cases

    judge = Judge(Runners("reference", mode="in-process"), exploring=False)

    @settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(property_cases("P-AOA", "reference", ranks, ReferenceSut.capabilities))
    def judged(case: Case) -> None:
        judgement, _ = judge(case)
        assert judgement.ok, "\n".join(judgement.details)

    try:
        judged()
    finally:
        judge.close()


def test_a_degreed_fusion_over_an_empty_piece_is_refused() -> None:
    """A save layout that leaves a rank an empty piece of a fused tensor (a [2, 1] tensor cut in two along its
    last axis) makes the degree the checkpoint shows depend on whether the empty piece is recorded: the case format
    refuses it (the reference's own save and load counted it differently: a nightly's reference shard failed)."""
    from properties.model.case import Case, CaseError

    def case(op: str) -> dict:
        cut = {"kind": "sharded", "mesh": {"dim_names": ["d0"], "shape": [2]}, "owner": [], "placements": ["S1"]}
        return {"property": "P-AOA", "sut": "reference", "seed": 0, "version": 1,
                "tensors": [{"name": n, "dtype": "F32", "shape": [2, 1], "seed": 1} for n in ("m/g", "m/u")],
                "save_layout": {"m/g": cut, "m/u": cut}, "load_layout": {},
                "ops": [{"kind": "save", "name": "s", "version": 0}, {"kind": "load", "name": "s", "version": 0}],
                "options": {"aoa": [{"op": op, "names": ["m/g", "m/u"], "axis": 0}]}}

    with pytest.raises(CaseError, match="empty piece: its fusion's degree is ambiguous"):
        Case.from_json(case("ffn"))
    Case.from_json(case("split"))  # a plain split has no degree


def test_p_aoa_draws_every_spelling() -> None:
    """Every macro spelling, and every fusion, is drawn."""
    from hypothesis import find, settings

    from harness.sut.paddle_dcp import PaddleDcpSut
    from properties.registry import property_cases

    for op, spellings in [*aoa.SPELLINGS.items(), *((op, (None, None)) for op in (*aoa.FUSIONS, "qkv_parts"))]:
        for spelling in spellings[1:]:
            find(property_cases("P-AOA", "paddle-dcp", 2, PaddleDcpSut.capabilities),
                 lambda c, o=op, sp=spelling: any(t["op"] == o and t.get("spelling") == sp for t in c.options["aoa"]),
                 settings=settings(max_examples=800, database=None))


def _layout(placement: str) -> dict:
    return {"kind": "sharded", "mesh": {"dim_names": ["d0"], "shape": [2]}, "owner": [], "placements": [placement]}


def _paddle_judged(tensors: dict[str, tuple[str, list[int], str, str]], transforms: list[dict]) -> None:
    """A save of ``tensors`` (name -> dtype, shape, save and load placement on 2 ranks) stored through
    ``transforms`` and loaded by real Paddle ranks through their statements: equal to the model, bit for bit."""
    pytest.importorskip("paddle")
    from harness.judging.judge import Judge
    from harness.ranks.runners import Runners
    from properties.model.case import Case

    case = Case.from_json({
        "property": "P-AOA", "sut": "paddle-dcp", "seed": 0, "version": 1,
        "tensors": [{"name": n, "dtype": d, "shape": s, "seed": i + 1}
                    for i, (n, (d, s, _, _)) in enumerate(tensors.items())],
        "save_layout": {n: _layout(p) for n, (_, _, p, _) in tensors.items()},
        "load_layout": {n: _layout(p) for n, (_, _, _, p) in tensors.items()},
        "ops": [{"kind": "save", "name": "step-0", "version": 0}, {"kind": "load", "name": "step-0", "version": 0}],
        "options": {"tensor_kind": "sharded_weight", "aoa": transforms},
    })
    judge = Judge(Runners("paddle-dcp", mode="pool"), exploring=False)
    try:
        judgement, _ = judge(case)
    finally:
        judge.close()
    assert judgement.ok, "\n".join(judgement.details)


@pytest.mark.multirank
def test_paddle_loads_through_every_spelling() -> None:
    """One real load through each macro: an expert family renamed by ``$EXPERT_ID``, parts found by ``*`` and
    ``[0:n]``, a transpose by ``^T``, a layer family stored one number up by ``$LAYER_ID_OFFSET``."""
    _paddle_judged(
        {"model/moe.experts.0.w1": ("F32", [2, 3], "R", "S1"), "model/moe.experts.1.w1": ("F32", [2, 3], "S0", "R"),
         "model/w": ("F32", [4, 2], "S1", "S0"), "model/b": ("BF16", [2, 3], "S0", "S1"),
         "model/emb": ("F32", [6], "S0", "R"), "model/layers.0.u": ("F32", [4, 2], "S0", "R"),
         "model/layers.3.u": ("BF16", [3], "R", "S0")},
        [{"op": "rename", "name": "model/moe.experts.0.w1", "spelling": "id"},
         {"op": "rename", "name": "model/moe.experts.1.w1"},
         {"op": "concat", "name": "model/w", "axis": 0, "parts": 2, "spelling": "star"},
         {"op": "permute", "name": "model/b", "perm": [1, 0], "spelling": "T"},
         {"op": "concat", "name": "model/emb", "axis": 0, "parts": 3, "spelling": "array"},
         {"op": "rename", "name": "model/layers.0.u", "spelling": "offset"},
         {"op": "rename", "name": "model/layers.3.u", "spelling": "offset"}])


@pytest.mark.multirank
def test_paddle_loads_through_the_fused_macros() -> None:
    """fused_qkv (4 query heads in 2 key-value groups), fused_qkv_old and fused_ffn of a checkpoint saved by a
    tensor-parallel job of degree 2 (its pieces cut along the other axis), loaded under other layouts; and
    fused_qkv the other way, a fused model tensor whose checkpoint holds Q, K and V apart."""
    _paddle_judged(
        {"model/q": ("F32", [4, 4], "S1", "S0"), "model/k": ("F32", [2, 4], "S1", "R"),
         "model/v": ("F32", [2, 4], "S1", "S1"), "model/a": ("BF16", [8, 2], "S1", "S0"),
         "model/b": ("BF16", [4, 2], "S1", "R"), "model/c": ("BF16", [4, 2], "S1", "S0"),
         "model/g": ("F32", [4, 6], "S1", "S0"), "model/u": ("F32", [4, 6], "S1", "R"),
         "model/f": ("F32", [8, 2], "S1", "S0")},
        [{"op": "qkv", "names": ["model/q", "model/k", "model/v"], "axis": 0, "heads": 4, "groups": 2},
         {"op": "qkv_tp", "names": ["model/a", "model/b", "model/c"], "axis": 0, "heads": 4, "groups": 2},
         {"op": "ffn", "names": ["model/g", "model/u"], "axis": 0},
         {"op": "qkv_parts", "name": "model/f", "axis": 0, "heads": 4, "groups": 2}])


@pytest.mark.parametrize("t, stored_degree, rows, statement", [
    ({"op": "ffn_redegree", "degree": 2}, 1, [0, 1, 4, 5, 2, 3, 6, 7], "m.f.aoa_fused -> m.f, fused_ffn, axis=0"),
    ({"op": "ffn_redegree", "degree": 2}, 4, [0, 2, 1, 3, 4, 6, 5, 7], "m.f.aoa_fused -> m.f, fused_ffn, axis=0"),
    ({"op": "ffn_redegree", "degree": 1}, 2, [0, 1, 4, 5, 2, 3, 6, 7], "m.f.aoa_fused -> m.f, fused_ffn, axis=0"),
    ({"op": "qkv_tp_redegree", "heads": 4, "groups": 2, "degree": 2}, 1, [0, 1, 4, 5, 2, 6, 3, 7],
     "m.f.aoa_fused -> m.f, fused_qkv_old, num_heads=4, num_key_value_groups=2, axis=0"),
])
@pytest.mark.parametrize("load_cuts", [{}, {0: 2}, {0: 3, 1: 2}, {0: 8}])
def test_a_fused_model_tensor_is_stored_fused_at_the_checkpoints_degree(t, stored_degree, rows, statement,
                                                                         load_cuts) -> None:
    """ffn_redegree and qkv_tp_redegree: the model tensor is a fusion at the model's degree, the checkpoint holds
    the same fusion at its own (how many pieces the save cuts): written out by hand, a row a head, the fused model
    rows the stored tensor holds in order; any load piece reads back from it."""
    t = {**t, "name": "m/f", "axis": 0}
    fused = np.array([[r * 10 + c for c in range(3)] for r in range(8)], np.uint16)
    aoa.check([t], {"m/f": ("BF16", fused.shape)}, {"m/f": stored_degree})
    cuts = {1: 3}
    whole = _assembled([p for rank in _pieces("m/f", "BF16", fused, cuts)
                        for p in aoa.stored([t], rank, {"m/f": stored_degree})])
    assert list(whole["m/f.aoa_fused"][:, 0] // 10) == rows
    for box in _boxes(fused.shape, load_cuts):
        got = [whole[r.key][tuple(slice(o, o + n) for o, n in zip(r.region.offsets, r.region.shape))]
               for r in aoa.reads([t], "m/f", "BF16", fused.shape, box, {"m/f": stored_degree})]
        want = fused[tuple(slice(o, o + n) for o, n in zip(box.offsets, box.shape))]
        assert np.array_equal(aoa.assemble([t], "m/f", "BF16", box, got, np.zeros(want.shape, np.uint16)), want)
    assert aoa.statements([t], lambda k: k.replace("/", "."), {}) == [statement]
    with pytest.raises(aoa.AoaError, match="does not divide"):
        aoa.check([t], {"m/f": ("BF16", fused.shape)}, {"m/f": 3})
