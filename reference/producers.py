"""What a small model and its AdamW optimizer hand a checkpoint through their ``sharded_state_dict``, independent
of any framework: which tensors, of which dtypes and shapes, and which piece each rank holds, under each producer.

The model is four layers of the kind a transformer is built from, each optional: ``emb``, an embedding
[vocab, hidden]; ``up``, a linear hidden -> ffn with a bias; ``down``, a linear ffn -> hidden with a bias; ``norm``,
a layer norm over hidden. AdamW keeps for each parameter two moments (F32, laid out as the parameter), two
beta-power accumulators (F32 [1]) and, for a 16-bit parameter under multi_precision, an F32 master weight laid out
as the parameter. Case names: ``model/<p>``, ``optimizer/<p>.m1|.m2|.beta1_pow|.beta2_pow``, ``master/<p>``.

Producers (``PRODUCERS``), each a parallelism of degree n over a 1-D mesh of the n ranks:

- ``tp``, tensor parallelism (the layers are vocab-parallel, column-parallel and row-parallel): the embedding is
  split by rows, the column-parallel weight by columns and its bias with them, the row-parallel weight by rows;
  the row-parallel bias and the norm are whole on every rank, and so are the beta powers. Every split is even:
  vocab and ffn are multiples of n, as the layers require.
- ``stage1v2``, sharding stage 1 V2 (``DygraphShardingOptimizerV2``): every rank holds the whole model; the
  parameters lie end to end in one fused buffer of the parameter dtype, in the model's order, each in a slot
  padded to a multiple of ``ALIGN_BYTES`` per rank (the buffer's alignment on a GPU), and the buffer is split
  evenly over the ranks. A rank keeps the moments and master weight of the elements of its part of the buffer,
  flattened (``Flat``), and a parameter's beta powers where its part holds any element of it; a rank whose part
  holds none of a parameter (only padding, or nothing) keeps none of its state.
"""

from __future__ import annotations

import math

from .errors import LayoutError
from .layout import Flat, Mesh, Replicate, Shard, Sharded, TensorLayout, replicated

PRODUCER = "producer"  # the case option: the producer whose sharded_state_dict gives the case's tensors
PRODUCERS = ("tp", "stage1v2")
ALIGN_BYTES = 256  # a fused sharding buffer's slot alignment per rank (tensor_fusion_helper.alignment on a GPU)
_BYTES = {"F32": 4, "BF16": 2}
LAYERS = ("emb", "up", "down", "norm")
PARAM_DTYPES = ("F32", "BF16")
# parameter -> (layer, the tensor dim tensor parallelism splits, None: whole on every rank)
_SPLITS = {"emb.weight": ("emb", 0), "up.weight": ("up", 1), "up.bias": ("up", 0), "down.weight": ("down", 0),
           "down.bias": ("down", None), "norm.weight": ("norm", None), "norm.bias": ("norm", None)}
MOMENTS = (".m1", ".m2")
POWERS = (".beta1_pow", ".beta2_pow")


def parameters(layers: tuple[str, ...]) -> list[str]:
    return [p for p, (layer, _) in _SPLITS.items() if layer in layers]


def shapes(layers: tuple[str, ...], vocab: int, hidden: int, ffn: int) -> dict[str, tuple[int, ...]]:
    """Each parameter's global shape."""
    every = {"emb.weight": (vocab, hidden), "up.weight": (hidden, ffn), "up.bias": (ffn,),
             "down.weight": (ffn, hidden), "down.bias": (hidden,), "norm.weight": (hidden,), "norm.bias": (hidden,)}
    return {p: every[p] for p in parameters(layers)}


def tensors(layers: tuple[str, ...], vocab: int, hidden: int, ffn: int, dtype: str,
            optimizer: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Case name -> (dtype, global shape) of everything the model (and, with ``optimizer``, AdamW) gives."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for param, shape in shapes(layers, vocab, hidden, ffn).items():
        out[f"model/{param}"] = (dtype, shape)
        if optimizer:
            out.update({f"optimizer/{param}{m}": ("F32", shape) for m in MOMENTS})
            out.update({f"optimizer/{param}{b}": ("F32", (1,)) for b in POWERS})
            if dtype != "F32":
                out[f"master/{param}"] = ("F32", shape)
    return out


def parameter_of(name: str) -> str:
    """The parameter a case name belongs to ("optimizer/up.weight.m1" -> "up.weight")."""
    family, _, rest = name.partition("/")
    for suffix in (*MOMENTS, *POWERS):
        if family == "optimizer" and rest.endswith(suffix):
            return rest[: -len(suffix)]
    return rest


def layouts(producer: str, given: dict[str, tuple[str, tuple[int, ...]]], world: int) -> dict[str, TensorLayout]:
    """Where ``producer`` of degree ``world`` puts the pieces of each case tensor of ``given`` (name -> (dtype,
    shape), exactly what ``tensors`` gives)."""
    if producer == "tp":
        return {name: _tp_layout(name, world) for name in given}
    if producer == "stage1v2":
        return _stage1v2_layouts(given, world)
    raise LayoutError(f"unknown producer {producer!r} (known: {', '.join(PRODUCERS)})")


def _tp_layout(name: str, world: int) -> Sharded:
    mesh = Mesh((world,), ("mp",))
    dim = _SPLITS[parameter_of(name)][1]
    if dim is None or name.endswith(POWERS):
        return replicated(mesh)
    return Sharded(mesh, (Shard(dim),))


def slots(given: dict[str, tuple[str, tuple[int, ...]]], world: int) -> tuple[dict[str, int], int]:
    """Stage 1 V2's fused buffer: each parameter's start in it, and its size."""
    layers, vocab, hidden, ffn, dtype, _ = spec(given)
    slot = ALIGN_BYTES // _BYTES[dtype] * world
    starts, cursor = {}, 0
    for param, shape in shapes(layers, vocab, hidden, ffn).items():
        starts[param] = cursor
        cursor += -(-math.prod(shape) // slot) * slot
    return starts, cursor


def _stage1v2_layouts(given: dict[str, tuple[str, tuple[int, ...]]], world: int) -> dict[str, TensorLayout]:
    mesh = Mesh((world,), ("sharding",))
    starts, total = slots(given, world)
    part = total // world
    out: dict[str, TensorLayout] = {}
    for name in given:
        param = parameter_of(name)
        if name.startswith("model/"):
            out[name] = replicated(mesh)
        elif name.endswith(POWERS):
            numel = math.prod(given[f"model/{param}"][1])
            holders = [r for r in range(world) if r * part < starts[param] + numel and starts[param] < (r + 1) * part]
            out[name] = Sharded(mesh, (Replicate(),), () if len(holders) == world else tuple((0, r) for r in holders))
        else:
            out[name] = Flat(mesh, 0, starts[param], total)
    return out


def spec(given: dict[str, tuple[str, tuple[int, ...]]],
         rank: bool = False) -> tuple[tuple[str, ...], int, int, int, str, bool]:
    """(layers, vocab, hidden, ffn, parameter dtype, optimizer) of a case's tensors (name -> (dtype, shape)),
    LayoutError unless they are exactly what ``tensors`` gives for them; with ``rank``, those one rank holds: every
    parameter and, with an optimizer, every moment (stage 1 V2's flattened ones, if only as empty pieces), but only
    some of the beta powers."""
    params = {n.partition("/")[2]: v for n, v in given.items() if n.startswith("model/")}
    layers = tuple(layer for layer in LAYERS if any(_SPLITS.get(p, ("",))[0] == layer for p in params))
    if not layers:
        raise LayoutError("a producer case holds at least one of the model's layers")
    dtypes = {dt for dt, _ in params.values()}
    if len(dtypes) != 1 or not dtypes <= set(PARAM_DTYPES):
        raise LayoutError(f"a producer's parameters share one dtype of {PARAM_DTYPES}, got {sorted(dtypes)}")
    dims = {"vocab": 1, "hidden": 1, "ffn": 1}
    for param, dim_names in (("emb.weight", ("vocab", "hidden")), ("up.weight", ("hidden", "ffn")),
                             ("down.weight", ("ffn", "hidden")), ("norm.weight", ("hidden",))):
        if param in params:
            dims.update(zip(dim_names, params[param][1]))
    optimizer = any(n.startswith("optimizer/") for n in given)
    out = (layers, dims["vocab"], dims["hidden"], dims["ffn"], dtypes.pop(), optimizer)
    whole = tensors(*out[:4], out[4], optimizer)
    if not (given.items() <= whole.items() and all(n in given for n in whole if not rank or not n.endswith(POWERS))):
        raise LayoutError(f"the tensors are not what the model gives for layers {list(layers)}, vocab "
                          f"{out[1]}, hidden {out[2]}, ffn {out[3]}, {out[4]}, optimizer {optimizer}")
    return out


def check(producer: str, given: dict[str, tuple[str, tuple[int, ...]]],
          by_side: dict[str, dict[str, TensorLayout]]) -> None:
    """LayoutError unless ``given`` is what the model gives and each side's layouts (``by_side``: save and load,
    name -> layout) are where ``producer`` of that side's world puts the tensors; under ``tp`` the split sizes
    (vocab, where there is an embedding; ffn, where there is a linear) must be divisible by that world."""
    layers, vocab, _, ffn, _, _ = spec(given)
    split = {"vocab": vocab if "emb" in layers else 0, "ffn": ffn if {"up", "down"} & set(layers) else 0}
    for which, by_name in by_side.items():
        worlds = {lay.mesh.world_size for lay in by_name.values()}
        if len(worlds) != 1 or set(by_name) != set(given):
            raise LayoutError(f"the {which} layouts of a producer case are one {producer} world over every tensor")
        world = worlds.pop()
        uneven = {dim: n for dim, n in split.items() if n % world}
        if producer == "tp" and uneven:
            raise LayoutError(f"{uneven} must be multiples of the {which} world {world}")
        expected = layouts(producer, given, world)
        wrong = sorted(n for n, lay in by_name.items() if lay != expected[n])
        if wrong:
            raise LayoutError(f"{which} layouts of {wrong} are not where {producer} of degree {world} puts them")
