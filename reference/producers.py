"""What a tensor-parallel model and its AdamW optimizer hand a checkpoint through their ``sharded_state_dict``,
independent of any framework: which tensors, of which dtypes and shapes, and which piece each rank holds.

The model ``tp`` is four layers of the kind a transformer is built from, each optional: ``emb``, a vocab-parallel
embedding [vocab, hidden]; ``up``, a column-parallel linear hidden -> ffn with a bias; ``down``, a row-parallel
linear ffn -> hidden with a bias; ``norm``, a layer norm over hidden. Under tensor parallelism of degree n (a 1-D
mesh "mp" of the n ranks) the embedding is split by rows, the column-parallel weight by columns and its bias with
them, the row-parallel weight by rows; the row-parallel bias and the norm are whole on every rank. Every split is
even: vocab and ffn are multiples of n, as the layers require.

AdamW keeps for each parameter two moments (F32, laid out as the parameter), two beta-power accumulators (F32 [1],
whole on every rank) and, for a 16-bit parameter under multi_precision, an F32 master weight laid out as the
parameter. Case names: ``model/<p>``, ``optimizer/<p>.m1|.m2|.beta1_pow|.beta2_pow``, ``master/<p>``.
"""

from __future__ import annotations

from .errors import LayoutError
from .layout import Mesh, Shard, Sharded, replicated

PRODUCER = "producer"  # the case option: the producer whose sharded_state_dict gives the case's tensors
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


def layout(name: str, world: int) -> Sharded:
    """Where tensor parallelism of degree ``world`` puts the pieces of case tensor ``name``."""
    mesh = Mesh((world,), ("mp",))
    dim = _SPLITS[parameter_of(name)][1]
    if dim is None or name.endswith(POWERS):
        return replicated(mesh)
    return Sharded(mesh, (Shard(dim),))


def spec(given: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[tuple[str, ...], int, int, int, str, bool]:
    """(layers, vocab, hidden, ffn, parameter dtype, optimizer) of a case's tensors (name -> (dtype, shape)),
    LayoutError unless they are exactly what ``tensors`` gives for them."""
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
    if tensors(*out[:4], out[4], optimizer) != given:
        raise LayoutError(f"the tensors are not what the tp model gives for layers {list(layers)}, vocab "
                          f"{out[1]}, hidden {out[2]}, ffn {out[3]}, {out[4]}, optimizer {optimizer}")
    return out


def check(given: dict[str, tuple[str, tuple[int, ...]]], layouts: dict[str, dict[str, Sharded]]) -> None:
    """LayoutError unless ``given`` is what the producer gives and each layout (``layouts``: save and load, name ->
    layout) is where tensor parallelism of its world puts the tensor, with the split sizes (vocab, where there is
    an embedding; ffn, where there is a linear) divisible by that world."""
    layers, vocab, _, ffn, _, _ = spec(given)
    split = {"vocab": vocab if "emb" in layers else 0, "ffn": ffn if {"up", "down"} & set(layers) else 0}
    for which, by_name in layouts.items():
        worlds = {lay.mesh.world_size for lay in by_name.values()}
        if len(worlds) != 1 or set(by_name) != set(given):
            raise LayoutError(f"the {which} layouts of a producer case are one tensor-parallel world over every tensor")
        world = worlds.pop()
        uneven = {dim: n for dim, n in split.items() if n % world}
        if uneven:
            raise LayoutError(f"{uneven} must be multiples of the {which} world {world}")
        wrong = sorted(n for n, lay in by_name.items() if lay != layout(n, world))
        if wrong:
            raise LayoutError(f"{which} layouts of {wrong} are not where tensor parallelism of {world} puts them")
