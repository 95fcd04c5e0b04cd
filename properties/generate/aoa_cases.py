"""P-AOA cases: a reshard case whose checkpoint is stored in another model's structure, and the AoA transformations
(reference/aoa.py) that map it back, drawn where the tensors and their save layouts allow each one."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from hypothesis import strategies as st

from properties.generate.cases import Caps, cases, unmet_choices_dropped
from properties.model.case import Case, TensorCase
from reference.aoa import AOA, CASTS, FUSIONS, NUMBERED, SPELLINGS, named, offset_pattern
from reference.layout import Flat, LayoutError, Shard, Sharded, TensorLayout, pieces
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
    save_layout, load_layout = dict(base.save_layout), dict(base.load_layout)
    # fusions first (up to two, as a model fuses in every layer, through the same temporary names): their members
    # take the lead's dtype and save layout
    for fusion in [draw(st.sampled_from(["pair", "qkv"])) for _ in range(draw(st.sampled_from([0, 1, 2])))]:
        taken = {n for t in transforms for n in named(t)}
        fusable = [n for n in _fusable(tensors, save, load) if n not in taken]
        leads = [n for n in fusable if _free_axes(save[n], tensors[n].shape or (1,))]
        if not leads:
            break
        lead = draw(st.sampled_from(leads))
        size, others = FUSIONS["split" if fusion == "pair" else "qkv"], [m for m in fusable if m != lead]
        rest = draw(st.lists(st.sampled_from(others), max_size=size - 1, unique=True)) if others else []
        for i in range(size - 1 - len(rest)):  # members the case lacks: new tensors, loaded as the lead is
            name = f"{lead}_fused{i}"
            tensors[name] = TensorCase(name, tensors[lead].dtype, (), draw(st.integers(1, 2**31 - 1)))
            load_layout[name] = base.load_layout[lead]
            rest.append(name)
        # the lead's shape with elements: a 0-d lead (unsharded) becomes a vector, an empty axis one element
        shape = tuple(max(1, n) for n in tensors[lead].shape) or (draw(st.integers(1, 4)),)
        axis = draw(st.sampled_from(_free_axes(save[lead], shape)))
        degree = _degree(save[lead], shape)
        if fusion == "pair":
            ops = ["split", *(("ffn",) if degree and shape[axis] % degree == 0 else ())]
            t, names, shapes = {"op": draw(st.sampled_from(ops))}, [lead, *rest], [shape, shape]
        else:  # the lead is K; Q holds heads/groups times its heads
            t = draw(_qkv(shape[axis], degree))
            q = tuple(n * t["heads"] // t["groups"] if i == axis else n for i, n in enumerate(shape))
            names, shapes = [rest[0], lead, rest[1]], [q, shape, shape]
        for name, member_shape in zip(names, shapes):
            tensors[name] = _reshaped(tensors[name], member_shape, tensors[lead].dtype)
            save_layout[name] = base.save_layout[lead]
            if not _holds(load.get(name), member_shape):  # its load layout shards an axis it no longer has
                load_layout[name] = base.load_layout[lead]
        transforms.append({**t, "names": names, "axis": axis})
    for name in sorted(set(tensors) - {n for t in transforms for n in t.get("names", ())}):
        boxed = not any(isinstance(layouts.get(name), Flat) for layouts in (save, load))
        free = _free_axes(save[name], tensors[name].shape) if boxed and name in save else []
        degree = _degree(load.get(name), tensors[name].shape)
        if degree > 1 and free and draw(st.booleans()):  # sized to be a fusion of the load's degree
            tensors[name] = _fitted(tensors[name], draw(st.sampled_from(free)), draw(st.sampled_from((2, 6))) * degree,
                                    [save[name], load[name]])
        save_degree = _degree(save.get(name), tensors[name].shape)
        t = draw(st.one_of(st.none(), _transform(tensors[name], boxed, free, degree, save_degree)))
        if t is not None:
            transforms.append(t)
    if not transforms and tensors:
        transforms.append({"op": "rename", "name": draw(st.sampled_from(sorted(tensors)))})
    transforms = _offset_families([draw(_spelled(t, tensors[named(t)[0]])) for t in transforms])
    options = unmet_choices_dropped({k: v for k, v in base.options.items() if k not in _LEFT_OUT}, Caps(caps))
    options["tensor_kind"] = "sharded_weight"  # stored tensors of other shapes than the model's: no dist tensors
    return dataclasses.replace(base, property=prop, tensors=tuple(tensors.values()), save_layout=save_layout,
                               load_layout=load_layout, options={**options, AOA: transforms})


def _offset_families(transforms: list[dict]) -> list[dict]:
    """An offset's statement renames every stored key of its family (reference.aoa): each rename of a family one
    of them offsets is spelled so too."""
    families = {offset_pattern(t["name"]) for t in transforms if t.get("spelling") == "offset"}
    return [{**t, "spelling": "offset"} if t["op"] == "rename" and NUMBERED.search(t["name"])
            and offset_pattern(t["name"]) in families else t for t in transforms]


def _fusable(tensors: dict[str, TensorCase], save: dict[str, TensorLayout],
             load: dict[str, TensorLayout]) -> list[str]:
    """Tensors a fusion can take, made to fit it (reshaped like its first member, saved under its layout): saved
    by a plain layout (no expert's owner, no flat buffer), loaded by any but a flattened one."""
    return [n for n in sorted(tensors) if isinstance(save.get(n), Sharded) and not save[n].owner
            and not isinstance(load.get(n), Flat)]


def _holds(layout: TensorLayout | None, shape: tuple[int, ...]) -> bool:
    """Whether ``layout`` can place a tensor of ``shape`` on every rank of its mesh."""
    try:
        pieces(layout, shape)
    except LayoutError:
        return False
    return True


def _free_axes(layout: TensorLayout, shape: tuple[int, ...]) -> list[int]:
    """The axes a save layout does not shard: a rank's pieces of the members then sit side by side there."""
    sharded = {p.dim for p in layout.placements if isinstance(p, Shard)} if isinstance(layout, Sharded) else set()
    return [axis for axis in range(len(shape)) if axis not in sharded]


def _reshaped(tensor: TensorCase, shape: tuple[int, ...], dtype: str) -> TensorCase:
    """``tensor`` at another shape and dtype; its explicit bits (special values) repeated to fill it where the
    dtype stays, else drawn from its seed."""
    bits = tensor.bits if dtype == tensor.dtype else None
    if bits:
        bits = tuple(bits[i % len(bits)] for i in range(math.prod(shape)))
    return dataclasses.replace(tensor, shape=shape, dtype=dtype, bits=bits or None)


def _degree(layout: TensorLayout | None, shape: tuple[int, ...]) -> int:
    """How many distinct pieces ``layout`` gives a tensor of ``shape``, the degree Paddle fuses it at; 0 where it
    gives none, or an empty one (the degree is then ambiguous: no degreed fusion)."""
    cut = pieces(layout, shape) if layout is not None else set()
    return len(cut) if cut and all(r.numel for r in cut) else 0


def _fitted(tensor: TensorCase, axis: int, size: int, layouts: list[TensorLayout]) -> TensorCase:
    """``tensor`` with ``size`` elements along ``axis``, where every one of ``layouts`` still places it and gives
    it as many pieces as before, all with elements; else ``tensor`` as it is."""
    shape = tuple(size if i == axis else n for i, n in enumerate(tensor.shape))
    before = [pieces(lay, tensor.shape) for lay in layouts]
    if not all(_holds(lay, shape) for lay in layouts):
        return tensor
    after = [pieces(lay, shape) for lay in layouts]
    if [len(c) for c in after] != [len(c) for c in before] or any(r.numel == 0 for c in after for r in c):
        return tensor
    return _reshaped(tensor, shape, tensor.dtype)


def _qkv(size: int, degree: int) -> st.SearchStrategy[dict]:
    """Heads for a Q, K, V fusion whose K and V are ``size`` long on its axis: ``groups`` key-value heads of one
    size, ``heads`` query heads a multiple of them; the tensor-parallel layout where ``degree`` divides both (0: the
    save layout leaves a rank an empty piece, and the degree the checkpoint shows is ambiguous)."""
    groups = [g for g in range(1, size + 1) if size % g == 0]

    def spelled(g: int, ratio: int) -> st.SearchStrategy[dict]:
        heads = g * ratio
        ops = ["qkv", *(("qkv_tp",) if degree and heads % degree == 0 and g % degree == 0 else ())]
        return st.sampled_from(ops).map(lambda op: {"op": op, "heads": heads, "groups": g})

    return st.tuples(st.sampled_from(groups), st.sampled_from((1, 2, 3))).flatmap(lambda gr: spelled(*gr))


def _transform(tensor: TensorCase, boxed: bool, free: list[int], degree: int,
               save_degree: int) -> st.SearchStrategy[dict]:
    """The transformations one tensor can be stored through; ``boxed``: neither its save nor its load layout is
    flattened (a flattened piece is a row-major range, not a box to transpose or cut); ``free``: the axes its save
    layout does not cut, along which it can be a fusion the checkpoint holds apart or at its own degree;
    ``degree``, ``save_degree``: how many distinct pieces its load and its save give it (0: an empty one among
    them), the degrees Paddle fuses it at on either side."""
    shape = tensor.shape
    out = [st.just({"op": "rename", "name": tensor.name})]
    if tensor.dtype in CASTS:
        out.append(st.just({"op": "cast", "name": tensor.name}))
    if boxed and len(shape) >= 2:  # the reversal half the time: only it can be spelled ``^T``
        perms = st.one_of(st.just(list(range(len(shape)))[::-1]), st.permutations(range(len(shape))))
        out.append(perms.map(lambda perm: {"op": "permute", "name": tensor.name, "perm": list(perm)}))
    splits = [(axis, parts) for axis, n in enumerate(shape) for parts in (2, 3) if n >= parts and n % parts == 0]
    if boxed and splits:
        out.append(st.sampled_from(splits).map(
            lambda s: {"op": "concat", "name": tensor.name, "axis": s[0], "parts": s[1]}))
    heads = [(axis, ratio * g, g) for axis in free for g in (1, 2, 3) for ratio in (1, 2, 3)
             if shape[axis] and shape[axis] % (ratio * g + 2 * g) == 0]
    if heads:
        out.append(st.sampled_from(heads).map(
            lambda h: {"op": "qkv_parts", "name": tensor.name, "axis": h[0], "heads": h[1], "groups": h[2]}))
    both = math.lcm(degree, save_degree)  # 0 where either is
    for op, at in (("parts", degree), ("redegree", both)):
        tp_heads = [h for h in heads if at and h[1] % at == 0 and h[2] % at == 0]
        if tp_heads:
            out.append(st.sampled_from(tp_heads).map(lambda h, op=op: {
                "op": f"qkv_tp_{op}", "name": tensor.name, "axis": h[0], "heads": h[1], "groups": h[2],
                "degree": degree}))
        halves = [axis for axis in free if shape[axis] >= 2 and at and shape[axis] % (2 * at) == 0]
        if halves:
            out.append(st.sampled_from(halves).map(
                lambda axis, op=op: {"op": f"ffn_{op}", "name": tensor.name, "axis": axis, "degree": degree}))
    return st.one_of(out)


def _spelled(transform: dict, tensor: TensorCase) -> st.SearchStrategy[dict]:
    """The transformation, written plainly or through one of the macros that mean the same (reference.aoa's
    SPELLINGS) where the tensor allows it: ``^T`` for a permutation reversing the axes, an id placeholder for a
    numbered name."""
    op = transform["op"]
    fits = [s for s in SPELLINGS.get(op, ())[1:]
            if not (s == "T" and list(transform["perm"]) != list(range(len(tensor.shape)))[::-1])
            and not (s in ("id", "offset") and not NUMBERED.search(tensor.name))]
    return st.sampled_from([None, *fits]).map(
        lambda s: transform if s is None else {**transform, "spelling": s})
