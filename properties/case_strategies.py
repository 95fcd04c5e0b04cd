"""Strategies that draw whole Cases, one family per property. Seeds, not bytes, so cases stay small."""

from __future__ import annotations

from hypothesis import strategies as st

from reference.layout import Mesh, TensorLayout, flat_group
from reference.moe import keyed_layouts, stacked_layout

from .case import SPECIAL_BITS, Case, Op, TensorCase
from .strategies import DTYPE_NAMES, factorizations, moe_cases, shapes, sharded_layouts, state_layouts

NAMES = ("model/w", "model/b", "model/emb", "optimizer/w.m1", "optimizer/w.m2", "master/w", "ema/w", "rng/state")

IN_PROCESS_PROPERTIES = (
    "P-ROUNDTRIP",
    "P-RESHARD",
    "P-EDGE",
    "P-COVER",
    "P-MOE",
    "P-FLAT",
    "P-REPEAT",
    "P-ASYNC-ISOLATION",
)


@st.composite
def tensor_cases(draw, max_tensors: int = 4, min_tensors: int = 0, edge: bool = False) -> tuple[TensorCase, ...]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=min_tensors, max_size=max_tensors, unique=True))
    out = []
    for name in names:
        dtype = draw(st.sampled_from(DTYPE_NAMES))
        shape = draw(shapes(max_side=6))
        bits = None
        if edge and draw(st.booleans()):
            pool = SPECIAL_BITS[dtype]
            count = 1
            for s in shape:
                count *= s
            bits = tuple(draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count)))
        out.append(TensorCase(name, dtype, shape, draw(st.integers(0, 2**16)), bits))
    return tuple(out)


@st.composite
def mesh_of(draw, world: int) -> Mesh:
    return Mesh(draw(st.sampled_from(factorizations(world))))


def _layout_json(layouts: dict[str, TensorLayout]) -> dict[str, dict]:
    return {name: lay.to_json() for name, lay in sorted(layouts.items())}


@st.composite
def _layouts_for(draw, tensors: tuple[TensorCase, ...], mesh: Mesh, allow_flat: bool = True) -> dict[str, dict]:
    fake = {t.name: t.build() for t in tensors}
    if allow_flat:
        return _layout_json(draw(state_layouts(fake, mesh)))
    return _layout_json({n: draw(sharded_layouts(mesh, len(t.shape))) for n, t in fake.items()})


def _save_load(version: int = 0, name: str = "step-1", use_async: bool = False, mutate: bool = False) -> tuple[Op, ...]:
    return (Op("save", name, version, use_async, mutate), Op("load", name, version))


@st.composite
def cases(draw, prop: str, sut: str, ranks: int) -> Case:
    """One case for property ``prop``: saves use a mesh of ``ranks`` ranks; loads may use fewer."""
    save_mesh = draw(mesh_of(ranks))
    load_mesh = draw(mesh_of(draw(st.integers(1, ranks))))
    seed = draw(st.integers(0, 2**16))
    if prop == "P-MOE":
        state, layouts, _mesh, experts, encoding = draw(moe_cases())
        tensors = tuple(
            TensorCase(n, t.dtype.name, t.shape, seed + i) for i, (n, t) in enumerate(sorted(state.items()))
        )
        ep = draw(st.sampled_from([d for d in (1, 2, 4) if experts % d == 0]))
        target = Mesh((draw(st.sampled_from((1, 2))), ep), ("dp", "ep"))
        load = (
            {"model/moe.w1": stacked_layout(target, "ep", experts)}
            if encoding == "stacked"
            else dict(keyed_layouts(target, "ep", experts, "model/moe", "w1"))
        )
        return Case(
            prop, sut, tensors, _layout_json(layouts), _layout_json(load), _save_load(), {"experts": experts}, seed
        )
    tensors = draw(tensor_cases(edge=prop == "P-EDGE", min_tensors=0 if prop == "P-EDGE" else 1))
    if prop == "P-ROUNDTRIP":
        layout = draw(_layouts_for(tensors, save_mesh))
        return Case(prop, sut, tensors, layout, layout, _save_load(), {}, seed)
    if prop in ("P-RESHARD", "P-COVER", "P-EDGE"):
        return Case(
            prop,
            sut,
            tensors,
            draw(_layouts_for(tensors, save_mesh)),
            draw(_layouts_for(tensors, load_mesh)),
            _save_load(),
            {},
            seed,
        )
    if prop == "P-FLAT":
        group = [(t.name, t.shape) for t in tensors]
        align = draw(st.sampled_from((1, 2, 4)))
        if draw(st.booleans()):  # flattened -> unflattened
            save = _layout_json(flat_group(save_mesh, draw(st.integers(0, len(save_mesh.shape) - 1)), group, align))
            load = draw(_layouts_for(tensors, load_mesh, allow_flat=False))
        else:  # unflattened -> flattened
            save = draw(_layouts_for(tensors, save_mesh, allow_flat=False))
            load = _layout_json(flat_group(load_mesh, draw(st.integers(0, len(load_mesh.shape) - 1)), group, align))
        return Case(prop, sut, tensors, save, load, _save_load(), {}, seed)
    if prop == "P-REPEAT":
        layout = draw(_layouts_for(tensors, save_mesh))
        versions = draw(st.integers(2, 4))
        ops = [Op("save", f"step-{v}", v) for v in range(versions)]
        ops += [Op("load", None, versions - 1)]
        ops += [Op("load", f"step-{v}", v) for v in draw(st.permutations(range(versions)))]
        return Case(prop, sut, tensors, layout, layout, tuple(ops), {}, seed)
    if prop == "P-ASYNC-ISOLATION":
        layout = draw(_layouts_for(tensors, save_mesh))
        ops = (*_save_load(use_async=True, mutate=True), Op("save", "step-2", 1, True, True), Op("load", None, 1))
        return Case(prop, sut, tensors, layout, draw(_layouts_for(tensors, load_mesh)), ops, {}, seed)
    raise ValueError(f"no case strategy for property {prop!r}")


__all__ = ["IN_PROCESS_PROPERTIES", "cases", "tensor_cases"]
