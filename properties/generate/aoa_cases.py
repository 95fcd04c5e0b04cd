"""P-AOA cases: a reshard case whose checkpoint is stored in another model's structure, and the AoA transformations
(reference/aoa.py) that map it back, drawn where the tensors and their save layouts allow each one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from itertools import combinations

from hypothesis import strategies as st

from properties.generate.cases import Caps, cases, unmet_choices_dropped
from properties.model.case import Case, TensorCase
from reference.aoa import AOA, CASTS, NUMBERED, SPELLINGS, named
from reference.layout import Flat, Shard, Sharded, TensorLayout
from reference.nesting import EMPTY_DICTS, NESTED

# What the case's load must not do besides the AoA config: rename master weights its own way, or load merged
# tensors (keyed as the checkpoint stores them, not as the model names them).
_LEFT_OUT = (NESTED, EMPTY_DICTS, "mw_names", "load_api")


@st.composite
def aoa_cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str]) -> Case:
    caps = frozenset(capabilities)
    # a MoE job's keyed experts (``….experts.<id>.…``) are what an id placeholder renames as one family
    bases = ("P-RESHARD" if "reshard" in caps else "P-ROUNDTRIP", *(("P-MOE",) if "moe" in caps else ()))
    base = draw(cases(draw(st.sampled_from(bases)), sut, ranks, caps))
    save, load = base.layouts("save"), base.layouts("load")
    tensors = {t.name: t for t in base.tensors}
    transforms: list[dict] = []
    pairs = [(a, b) for a, b in combinations(sorted(tensors), 2)
             if _splittable_axes(tensors[a], tensors[b], save, load)]
    if pairs and draw(st.booleans()):
        a, b = draw(st.sampled_from(pairs))
        axis = draw(st.sampled_from(_splittable_axes(tensors[a], tensors[b], save, load)))
        transforms.append({"op": "split", "names": [a, b], "axis": axis})
    for name in sorted(set(tensors) - {n for t in transforms for n in t.get("names", ())}):
        boxed = not any(isinstance(layouts.get(name), Flat) for layouts in (save, load))
        t = draw(st.one_of(st.none(), _transform(tensors[name], boxed)))
        if t is not None:
            transforms.append(t)
    if not transforms and tensors:
        transforms.append({"op": "rename", "name": draw(st.sampled_from(sorted(tensors)))})
    transforms = [draw(_spelled(t, tensors[named(t)[0]])) for t in transforms]
    options = unmet_choices_dropped({k: v for k, v in base.options.items() if k not in _LEFT_OUT}, Caps(caps))
    options["tensor_kind"] = "sharded_weight"  # stored tensors of other shapes than the model's: no dist tensors
    return dataclasses.replace(base, property=prop, options={**options, AOA: transforms})


def _transform(tensor: TensorCase, boxed: bool) -> st.SearchStrategy[dict]:
    """The transformations one tensor can be stored through; ``boxed``: neither its save nor its load layout is
    flattened (a flattened piece is a row-major range, not a box to transpose or cut)."""
    shape = tensor.shape
    out = [st.just({"op": "rename", "name": tensor.name})]
    if tensor.dtype in CASTS:
        out.append(st.just({"op": "cast", "name": tensor.name}))
    if boxed and len(shape) >= 2:
        out.append(st.permutations(range(len(shape))).map(
            lambda perm: {"op": "permute", "name": tensor.name, "perm": list(perm)}))
    splits = [(axis, parts) for axis, n in enumerate(shape) for parts in (2, 3) if n >= parts and n % parts == 0]
    if boxed and splits:
        out.append(st.sampled_from(splits).map(
            lambda s: {"op": "concat", "name": tensor.name, "axis": s[0], "parts": s[1]}))
    return st.one_of(out)


def _spelled(transform: dict, tensor: TensorCase) -> st.SearchStrategy[dict]:
    """The transformation, written plainly or through one of the macros that mean the same (reference.aoa's
    SPELLINGS) where the tensor allows it: ``^T`` for a permutation reversing the axes, an id placeholder for a
    numbered name."""
    op = transform["op"]
    fits = [s for s in SPELLINGS.get(op, ())[1:]
            if not (s == "T" and list(transform["perm"]) != list(range(len(tensor.shape)))[::-1])
            and not (s == "id" and not NUMBERED.search(tensor.name))]
    return st.sampled_from([None, *fits]).map(
        lambda s: transform if s is None else {**transform, "spelling": s})


def _splittable_axes(a: TensorCase, b: TensorCase, save: dict[str, TensorLayout],
                     load: dict[str, TensorLayout]) -> list[int]:
    """Axes two tensors can be fused along: one dtype, shape and save layout, none of it flattened or sharding
    that axis (each rank's two pieces then sit side by side in one piece of the fused tensor), nor their load
    layouts flattened."""
    layout = save.get(a.name)
    if (a.dtype, a.shape) != (b.dtype, b.shape) or layout != save.get(b.name) or 0 in a.shape \
            or any(isinstance(layouts.get(n), Flat) for layouts in (save, load) for n in (a.name, b.name)):
        return []
    sharded = {p.dim for p in layout.placements if isinstance(p, Shard)} if isinstance(layout, Sharded) else set()
    return [axis for axis in range(len(a.shape)) if axis not in sharded]
