"""Hypothesis strategies for the layout model: meshes, placements, shapes, bit-exact tensors, state layouts.

Everything shrinks toward small cases: few tensors, small shapes, world size 1, plain bit patterns. Special values
are drawn as integers and viewed as bits, so NaN payloads, -0.0, subnormals and infinities survive exactly.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from properties.model.case import SPECIAL_BITS, seeded_tensor
from reference.dtypes import DTYPES, DType
from reference.layout import Mesh, Replicate, Shard, Sharded, TensorLayout, flat_group
from reference.moe import keyed_layouts, stacked_layout
from reference.tensor import Tensor

DTYPE_NAMES = ("F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL")


def dtypes() -> st.SearchStrategy[DType]:
    return st.sampled_from(DTYPE_NAMES).map(DTYPES.__getitem__)


def bits_element(dt: DType) -> st.SearchStrategy[int]:
    if dt.name == "BOOL":
        return st.sampled_from((0, 1))
    top = (1 << (8 * dt.itemsize)) - 1
    return st.one_of(st.integers(0, min(top, 255)), st.sampled_from(SPECIAL_BITS[dt.name]), st.integers(0, top))


@st.composite
def tensors(draw, dt: DType, shape: tuple[int, ...]) -> Tensor:
    """A tensor whose every element is drawn as raw bits; small shapes only, so elementwise drawing is fine."""
    bits = draw(hnp.arrays(dt.bits_dtype, shape, elements=bits_element(dt), fill=st.nothing()))
    return Tensor(dt, bits.astype(dt.bits_dtype))


SIDES = (6, 6, 6, 5, 4)  # the longest side per number of dims: a 4-d tensor stays at most 256 elements


@st.composite
def shapes(draw, max_dims: int = 4, max_side: int = 6) -> tuple[int, ...]:
    """Global shapes from 0-d to ``max_dims``-d as real models have them (stacked experts are 3-d, convolution
    weights 4-d), including zero-size dims and dims smaller than the mesh, so splits are often uneven or empty."""
    ndim = draw(st.integers(0, max_dims))
    side = min(max_side, SIDES[min(ndim, len(SIDES) - 1)])
    return tuple(draw(st.lists(st.integers(0, side), min_size=ndim, max_size=ndim)))


def factorizations(n: int, max_dims: int = 3) -> list[tuple[int, ...]]:
    """Every ordered factorisation of ``n`` into 1..max_dims factors (1s allowed once each, to keep it finite)."""
    out: set[tuple[int, ...]] = {(n,)}
    if max_dims >= 2:
        for a in range(1, n + 1):
            if n % a == 0:
                out.add((a, n // a))
                if max_dims >= 3:
                    for b in range(1, n // a + 1):
                        if (n // a) % b == 0:
                            out.add((a, b, n // a // b))
    return sorted(out, key=lambda t: (len(t), t))


#: World sizes a drawn world favours: odd sizes, primes and their neighbours, powers of two (each below a bound).
NOTABLE_WORLDS = (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 16, 17, 24, 31, 32, 37, 48, 61, 63, 64, 96, 127, 128, 191, 251,
                  256)


def world_sizes(most: int) -> st.SearchStrategy[int]:
    """A world size in 1..``most``: the largest, a notable one, or any; shrinks toward 1."""
    if most < 1:
        raise ValueError(f"a world has at least one rank, not {most}")
    notable = sorted({w for w in NOTABLE_WORLDS if w <= most} | {most})
    return st.one_of(st.sampled_from(notable), st.integers(1, most), st.just(most))


@st.composite
def meshes(draw, world_size: int | None = None, max_world: int = 8) -> Mesh:
    n = world_size if world_size is not None else draw(st.integers(1, max_world))
    shape = draw(st.sampled_from(factorizations(n)))
    return Mesh(shape, tuple(("dp", "pp", "tp")[: len(shape)]) if len(shape) <= 3 else ())


@st.composite
def sharded_layouts(draw, mesh: Mesh, ndim: int) -> Sharded:
    choices = [Replicate()] + [Shard(d) for d in range(ndim)]
    return Sharded(mesh, tuple(draw(st.sampled_from(choices)) for _ in mesh.shape))


@st.composite
def states(draw, max_tensors: int = 4, max_side: int = 6, allow_empty: bool = True) -> dict[str, Tensor]:
    """A state dict of bit-exact tensors under namespaced keys; may be empty."""
    names = draw(
        st.lists(
            st.sampled_from(
                [
                    "model/w",
                    "model/b",
                    "model/emb",
                    "optimizer/w.m1",
                    "optimizer/w.m2",
                    "master/w",
                    "ema/w",
                    "rng/state",
                    "meta/step",
                    "model/layers.0.attn.qkv",
                ]
            ),
            min_size=0 if allow_empty else 1,
            max_size=max_tensors,
            unique=True,
        )
    )
    out = {}
    for name in names:
        dt = draw(dtypes())
        shape = draw(shapes(max_side=max_side))
        out[name] = draw(tensors(dt, shape))
    return out


@st.composite
def state_layouts(draw, state: dict[str, Tensor], mesh: Mesh) -> dict[str, TensorLayout]:
    """A layout for every tensor: DTensor placements, or membership of one flattened (stage-1 v2) buffer."""
    layouts: dict[str, TensorLayout] = {}
    flat_members = []
    for name in sorted(state):
        kind = draw(st.sampled_from(("sharded", "sharded", "flat")))
        if kind == "flat":
            flat_members.append(name)
        else:
            layouts[name] = draw(sharded_layouts(mesh, len(state[name].shape)))
    if flat_members:
        mesh_dim = draw(st.integers(0, len(mesh.shape) - 1))
        align = draw(st.sampled_from((1, 2, 4)))
        layouts.update(flat_group(mesh, mesh_dim, [(n, state[n].shape) for n in flat_members], align=align))
    return layouts


@st.composite
def moe_cases(draw) -> tuple[dict[str, Tensor], dict[str, TensorLayout], Mesh, int, str]:
    """An MoE state (stacked or keyed experts) on a (dp, ep) mesh: returns state, layouts, mesh, E, encoding."""
    ep = draw(st.sampled_from((1, 2, 4)))
    dp = draw(st.sampled_from((1, 2)))
    per = draw(st.integers(1, 2))
    num_experts = ep * per * draw(st.sampled_from((1, 2)))
    mesh = Mesh((dp, ep), ("dp", "ep"))
    encoding = draw(st.sampled_from(("stacked", "keyed")))
    dt = draw(dtypes())
    inner = draw(st.lists(st.integers(0, 4), min_size=0, max_size=2).map(tuple))
    if encoding == "stacked":
        state = {"model/moe.w1": draw(tensors(dt, (num_experts, *inner)))}
        layouts: dict[str, TensorLayout] = {"model/moe.w1": stacked_layout(mesh, "ep", num_experts)}
    else:
        layouts = dict(keyed_layouts(mesh, "ep", num_experts, "model/moe", "w1"))
        state = {key: draw(tensors(dt, inner)) for key in layouts}
    return state, layouts, mesh, num_experts, encoding


__all__ = [
    "DTYPE_NAMES",
    "SPECIAL_BITS",
    "dtypes",
    "factorizations",
    "meshes",
    "moe_cases",
    "seeded_tensor",
    "shapes",
    "sharded_layouts",
    "state_layouts",
    "states",
    "tensors",
]
