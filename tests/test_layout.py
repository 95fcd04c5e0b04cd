"""Split arithmetic and layout model: chunks never negative, never overlapping, always covering."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties.generate.layouts import factorizations, meshes, shapes, sharded_layouts
from reference import Box, FlatRange, LayoutError, Mesh, Replicate, Shard, Sharded, check_exact_cover, split_range
from reference.layout import Flat, flat_group
from reference.moe import global_expert_id, keyed_layouts, local_expert_ids, stacked_layout


@pytest.mark.parametrize(
    ("n", "parts", "expected"),
    [
        (5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)]),  # docs/design.md §2: 5 over 4 -> 2,2,1,0
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
        (0, 3, [(0, 0), (0, 0), (0, 0)]),
        (1, 3, [(0, 1), (1, 1), (1, 1)]),
        (7, 3, [(0, 3), (3, 6), (6, 7)]),
        (2, 5, [(0, 1), (1, 2), (2, 2), (2, 2), (2, 2)]),
    ],
)
def test_split_range_known_values(n: int, parts: int, expected: list[tuple[int, int]]) -> None:
    assert [split_range(n, parts, i) for i in range(parts)] == expected


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_split_range_partitions_exactly(n: int, parts: int) -> None:
    chunks = [split_range(n, parts, i) for i in range(parts)]
    assert chunks[0][0] == 0 and chunks[-1][1] == n
    for (a, b), (c, _) in itertools.pairwise(chunks):
        assert 0 <= a <= b == c  # no negative, no gap, no overlap
    chunk = -(-n // parts)
    assert all(b - a <= chunk for a, b in chunks)
    sizes = [b - a for a, b in chunks]
    assert sizes == sorted(sizes, reverse=True)  # only trailing chunks are short or empty


@pytest.mark.parametrize(("n", "parts", "index"), [(-1, 2, 0), (4, 0, 0), (4, 2, 2), (4, 2, -1)])
def test_split_range_rejects_nonsense(n: int, parts: int, index: int) -> None:
    with pytest.raises(LayoutError):
        split_range(n, parts, index)


def test_mesh_coordinates_are_row_major() -> None:
    mesh = Mesh((2, 3))
    assert [mesh.coord(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    with pytest.raises(LayoutError):
        mesh.coord(6)
    with pytest.raises(LayoutError):
        Mesh((2, 2, 2, 2))


def test_nested_shard_splits_chunk_of_chunk() -> None:
    # dim 0 of size 5 sharded over mesh dims of 2 then 2: [0,3) -> [0,2),[2,3); [3,5) -> [3,4),[4,5)
    layout = Sharded(Mesh((2, 2)), (Shard(0), Shard(0)))
    boxes = [layout.local((5,), r).region for r in range(4)]
    assert [(b.offsets[0], b.shape[0]) for b in boxes] == [(0, 2), (2, 1), (3, 1), (4, 1)]


def test_replicas_are_saved_once() -> None:
    layout = Sharded(Mesh((2, 2)), (Replicate(), Shard(1)))
    savers = [r for r in range(4) if layout.local((3, 3), r).saves]
    assert savers == [0, 1]


@given(st.data(), meshes(), shapes())
def test_sharded_savers_cover_exactly(data, mesh: Mesh, shape: tuple[int, ...]) -> None:
    layout = data.draw(sharded_layouts(mesh, len(shape)))
    locals_ = [layout.local(shape, r) for r in range(mesh.world_size)]
    assert all(sl.region.numel >= 0 and all(s >= 0 for s in sl.region.shape) for sl in locals_)
    check_exact_cover("t", shape, [sl.region for sl in locals_ if sl.saves])
    # every rank's box lies inside the tensor
    for sl in locals_:
        assert all(o + s <= g for o, s, g in zip(sl.region.offsets, sl.region.shape, shape))


@given(
    st.lists(shapes(max_side=5), min_size=1, max_size=5),
    st.sampled_from([(1,), (2,), (3,), (2, 2), (4, 1)]),
    st.sampled_from([1, 2, 4]),
)
def test_flat_group_covers_every_param_once(param_shapes, mesh_shape, align) -> None:
    mesh = Mesh(mesh_shape)
    params = [(f"p{i}", s) for i, s in enumerate(param_shapes)]
    layouts = flat_group(mesh, len(mesh_shape) - 1, params, align=align)
    total = next(iter(layouts.values())).total
    assert total % (align * mesh_shape[-1]) == 0
    for name, shape in params:
        slices = [layouts[name].local(shape, r) for r in range(mesh.world_size)]
        assert all(isinstance(s.region, FlatRange) and s.region.start <= s.region.stop for s in slices)
        check_exact_cover(name, shape, [s.region for s in slices if s.saves])


def test_flat_range_may_be_empty_and_span_ranks() -> None:
    mesh = Mesh((4,))
    layouts = flat_group(mesh, 0, [("a", (3,)), ("b", (5,)), ("c", (1,))])  # total 9 -> padded 12, chunk 3
    assert layouts["b"].local((5,), 0).region.numel == 0
    assert [layouts["b"].local((5,), r).region for r in (1, 2)] == [FlatRange(0, 3), FlatRange(3, 5)]
    assert layouts["c"].local((1,), 3).region.numel == 0  # padding only on the last rank
    assert isinstance(layouts["a"], Flat)


def test_exact_cover_errors_name_the_problem() -> None:
    from reference import MissingSlices, OverlappingSlices

    with pytest.raises(MissingSlices, match="'t'"):
        check_exact_cover("t", (4, 2), [Box((0, 0), (2, 2))])
    with pytest.raises(OverlappingSlices, match="overlap"):
        check_exact_cover("t", (4, 2), [Box((0, 0), (3, 2)), Box((2, 0), (2, 2))])
    with pytest.raises(OverlappingSlices):
        check_exact_cover("t", (4, 2), [FlatRange(0, 5), Box((2, 0), (2, 2))])
    with pytest.raises(MissingSlices):
        check_exact_cover("t", (4, 2), [FlatRange(0, 3), Box((2, 0), (2, 2))])
    check_exact_cover("t", (4, 2), [FlatRange(0, 4), Box((2, 0), (2, 2))])
    check_exact_cover("z", (0, 3), [])
    check_exact_cover("s", (), [Box((), ())])


def test_factorizations_multiply_back() -> None:
    for n in range(1, 13):
        fs = factorizations(n)
        assert all(math.prod(f) == n and 1 <= len(f) <= 3 for f in fs)
        assert (n,) in fs


def test_moe_global_ids() -> None:
    mesh = Mesh((2, 4), ("dp", "ep"))
    assert global_expert_id(3, 1, 8, 4) == 7
    assert local_expert_ids(mesh, "ep", 8, rank=6) == [4, 5]  # coord (1, 2)
    with pytest.raises(LayoutError):
        global_expert_id(0, 0, 6, 4)
    keyed = keyed_layouts(mesh, "ep", 8, "model/moe", "w1")
    savers = {
        key: [r for r in range(8) if (s := lay.local((3,), r)) is not None and s.saves] for key, lay in keyed.items()
    }
    # each expert saved once, from dp 0 of its EP rank
    assert savers["model/moe.experts.5.w1"] == [2]
    stacked = stacked_layout(mesh, "ep", 8)
    assert [stacked.local((8, 2), r).region.offsets[0] for r in range(4)] == [0, 2, 4, 6]


@pytest.mark.parametrize(
    "region",
    [
        Box((4, 0), (-1, 3)),  # balanced_split(5, 4)'s last extent: -1
        Box((-1, 0), (2, 3)),
        Box((4, 0), (2, 3)),  # past the end of a 5-row tensor
        Box((0,), (5,)),  # wrong rank
        FlatRange(10, 16),
        FlatRange(3, 2),
    ],
)
def test_a_slice_out_of_range_is_never_read_as_an_empty_one(region) -> None:
    """A negative extent multiplies to a negative or even positive element count; the cover check must name it
    before any arithmetic treats it as empty (Paddle's uneven splits have recorded exactly such boxes)."""
    from reference.errors import SliceOutOfRange

    whole = [Box((0, 0), (5, 3))]
    with pytest.raises(SliceOutOfRange, match="out of range"):
        check_exact_cover("t", (5, 3), [*whole, region])
