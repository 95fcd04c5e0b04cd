"""What a load through an AoA config means (Paddle flex checkpoint's ``aoa_config``), for the subset a model
conversion uses: a checkpoint written by another model's structure is mapped onto this model's tensors by
statements, one per transformation.

The harness asks the converse of a conversion: the case draws this model's state and transformations; each tensor
a transformation names is *stored* in the other structure (the inverse, computed here piece by piece, so sharded
saves stay sharded), and the load through the statements must give back the model's state bit for bit. Written
from the statements' documented meaning, not from Paddle's engine:

=========  =====================================================  ==============================================
op         checkpoint holds                                        statement (checkpoint -> model)
=========  =====================================================  ==============================================
rename     the tensor under another key                           ``K.aoa_renamed -> K``
permute    its transpose: axis ``perm[i]`` of the stored tensor   ``K.aoa_t -> K, permute='[p0, p1, ..]'``
           is axis ``i`` of the model's (``numpy.transpose``)
cast       it widened to F32 (an F16 tensor; exact, NaNs too)      ``K.aoa_f32 -> K, dtype='float16'``
concat     ``parts`` equal parts along ``axis``                    ``K.aoa_part_0, K.aoa_part_1 -> K, axis=a``
split      two model tensors of one shape, dtype and layout,      ``A.aoa_fused -> A, B, axis=a``
           fused along ``axis`` (A first), which that layout
           must not shard
ffn        gate and up (a split's two tensors) fused as a         ``A.aoa_fused -> A, B, fused_ffn, axis=a``
           tensor-parallel job of degree ``S`` holds them: per
           shard ``r`` of ``S``, gate's ``r``-th ``S``-th, then
           up's
qkv        Q, K, V (one dtype and layout, shapes equal off        ``Q.aoa_fused -> Q, K, V, fused_qkv,
           ``axis``; Q holds ``heads`` heads, K and V ``groups``  num_heads=H, num_key_value_groups=G, axis=a``
           each) fused per key-value group ``g``: Q's heads of
           that group (``heads/groups`` of them), K's ``g``-th
           head, V's ``g``-th head
qkv_tp     Q, K, V as for qkv, fused as a tensor-parallel job    ``Q.aoa_fused -> Q, K, V, fused_qkv_old,
           of degree ``S`` holds them: per shard ``r``, Q's       num_heads=H, num_key_value_groups=G, axis=a``
           ``r``-th ``S``-th of heads, then K's, then V's
qkv_parts  one model tensor that is a qkv fusion (``heads``,         ``Q.aoa_q, Q.aoa_k, Q.aoa_v -> Q, fused_qkv,
           ``groups``) of parts the checkpoint holds apart:      num_heads=H, num_key_value_groups=G, axis=a``
           ``K.aoa_q``, ``K.aoa_k``, ``K.aoa_v``
ffn_parts  one model tensor that is an ffn fusion of ``degree``    ``F.aoa_gate, F.aoa_up -> F, fused_ffn, axis=a``
           (the model's), gate and up held apart:
           ``K.aoa_gate``, ``K.aoa_up``
qkv_tp_    one model tensor that is a qkv_tp fusion of            ``Q.aoa_q, Q.aoa_k, Q.aoa_v -> Q,
parts      ``degree`` (the model's), Q, K, V held apart as for   fused_qkv_old, num_heads=H,
           qkv_parts                                             num_key_value_groups=G, axis=a``
ffn_       one model tensor that is an ffn fusion of ``degree``    ``F.aoa_fused -> F, fused_ffn, axis=a``
redegree   (the model's), held fused at the checkpoint's
qkv_tp_    the same of a qkv_tp fusion                            ``F.aoa_fused -> F, fused_qkv_old, num_heads=H,
redegree                                                         num_key_value_groups=G, axis=a``
=========  =====================================================  ==============================================

A fusion's degree ``S`` is how many distinct pieces the checkpoint holds of the fused tensor (what a
tensor-parallel job of degree ``S`` saves): the save layout's count for the model tensors, the checkpoint's own
count on load (``degree``). It must divide what it splits (``check``). Where the model tensor is the fusion
(``ffn_parts``, ``qkv_tp_parts``; the ``_redegree`` ops besides the checkpoint's) the degree is the model's:
Paddle takes it from how many distinct pieces the load gives that tensor, so the transformation names it
(``t["degree"]``, as a conversion to a model of that tensor-parallel degree would) and the case's load layouts
must give it (``Case.check_aoa``). A ``_redegree`` piece, like a fusion's, is stored only whole along the axis.

A tensor no transformation names is stored as it is. A case's transformations are ``options["aoa"]``, a list of
dicts ``{"op": ..., "name": ...}`` (``names`` for split); ``check`` says which are well formed for the case's
tensors. Keys in the statements are Paddle keys, which must be AoA identifiers: the caller passes its key function.

A transformation may be written through one of the language's macros (``"spelling"``; the first of each op's
SPELLINGS is the plain statement above). Each means exactly the plain statement, so the checkpoint and the load's
result do not change with it:

=========  =========  ================================================================================
op         spelling   statement
=========  =========  ================================================================================
rename     id         ``P.$LAYER_ID.S.aoa_renamed -> P.$LAYER_ID.S`` (``$EXPERT_ID`` after ``experts.``):
                      the key's last number made a placeholder, one statement for every renamed tensor
                      whose stored key fits it (each number found among the stored keys)
permute    T          ``K.aoa_t^T -> K``: a permutation that reverses the axes
concat     star       ``K.aoa_part_* -> K, axis=a``: every stored key of that prefix, by its number
concat     array      ``K.aoa_part[0:n] -> K, axis=a``: the names ``K.aoa_part_0`` to ``K.aoa_part_{n-1}``
=========  =========  ================================================================================

One spelling changes what the checkpoint holds: ``offset`` (``P.$LAYER_ID_OFFSET.S.aoa_renamed ->
P.$LAYER_ID_OFFSET.S``, each number found among the stored keys mapped to the one below it) renames a family whose
checkpoint numbers it from one more, the model's ``P.n.S`` stored as ``P.(n+1).S.aoa_renamed``. The statement
takes every stored key its pattern fits, so every rename of that family must be spelled so (``check``).

Not covered: casts named by ``src_dtype``/``dst_dtype``, and configs applied in reverse
(``aoa_config_reverse``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .dtypes import DTYPES
from .engine import LocalTensor
from .errors import LayoutError
from .layout import Box, FlatRange, Region
from .tensor import Tensor

AOA = "aoa"  # case option: the transformations
OPS = ("rename", "permute", "cast", "concat", "split", "ffn", "qkv", "qkv_tp", "qkv_parts", "ffn_parts",
       "qkv_tp_parts", "ffn_redegree", "qkv_tp_redegree")
# Ops whose model tensor is a fusion the checkpoint holds apart, the fusion whose block order it has, and where the
# checkpoint holds each member. The degreed ones' degree is the model's (``t["degree"]``: the load's count).
PARTED = {"qkv_parts": "qkv", "ffn_parts": "ffn", "qkv_tp_parts": "qkv_tp"}
PARTS = {"qkv": (".aoa_q", ".aoa_k", ".aoa_v"), "ffn": (".aoa_gate", ".aoa_up")}
PARTS["qkv_tp"] = PARTS["qkv"]
# Ops whose model tensor is a degreed fusion at the model's degree (``t["degree"]``) that the checkpoint holds fused
# at its own (the save's count), and that fusion.
REDEGREED = {"ffn_redegree": "ffn", "qkv_tp_redegree": "qkv_tp"}
FUSED_MODEL = {**PARTED, **REDEGREED}  # every op whose model tensor is a fusion, and that fusion
# Ops that store several model tensors as one fused tensor (under the first one's name), and how many they fuse.
FUSIONS = {"split": 2, "ffn": 2, "qkv": 3, "qkv_tp": 3}
DEGREED = ("ffn", "qkv_tp")  # fusions whose block order follows the checkpoint's tensor-parallel degree
MACROS = {"ffn": "fused_ffn", "qkv": "fused_qkv", "qkv_tp": "fused_qkv_old"}
# Model dtypes a cast stores widened to F32, and their AoA names. Not BF16: Paddle's float32 -> bfloat16 cast gives
# every NaN as 0x7fff (sign and payload lost, measured on 3.3.1), which a bitwise oracle cannot tell from a bug.
CASTS = {"F16": "float16"}
PIECEWISE = ("rename", "cast")  # the ops a flattened piece (a row-major range, not a box) can be stored through
SPELLINGS = {"rename": ("name", "id", "offset"), "permute": ("perm", "T"), "concat": ("list", "star", "array")}
NUMBERED = re.compile(r"(?<![^./])\d+(?![^./])")  # a name's number between separators (a layer's or an expert's)


class AoaError(LayoutError):
    """Transformations that do not fit the case's tensors (unknown op, wrong shape, a tensor named twice)."""


@dataclass(frozen=True)
class StoredPiece:
    """A piece as the checkpoint stores it: under ``suffix`` appended to the model key of ``owner`` (the first
    tensor the transformation names), with its global shape and dtype there, its region, and its bits."""

    owner: str
    suffix: str
    global_shape: tuple[int, ...]
    dtype: str
    region: Region
    bits: np.ndarray
    shift: int = 0  # what the stored key adds to the owner's last number (an offset rename's 1)

    @property
    def key(self) -> str:
        return shifted(self.owner, self.shift) + self.suffix


def shifted(name: str, by: int) -> str:
    """``name`` with its last number (between separators) ``by`` more."""
    if not by:
        return name
    last = list(NUMBERED.finditer(name))[-1]
    return name[:last.start()] + str(int(last.group()) + by) + name[last.end():]


def named(transform: Mapping) -> tuple[str, ...]:
    """The model tensors a transformation names."""
    return tuple(transform["names"]) if transform["op"] in FUSIONS else (str(transform["name"]),)


def check(transforms: Iterable[Mapping], tensors: Mapping[str, tuple[str, tuple[int, ...]]],
          degrees: Mapping[str, int] | None = None) -> None:
    """Raise AoaError unless every transformation fits ``tensors`` (name -> (dtype, shape)) and none names a
    tensor another one names; ``degrees`` (``degrees_of``), where given, must divide what their fusions split."""
    seen: set[str] = set()
    for t in transforms:
        op = t.get("op")
        if op not in OPS:
            raise AoaError(f"aoa: unknown op {op!r} (known: {', '.join(OPS)})")
        names = named(t)
        for name in names:
            if name not in tensors:
                raise AoaError(f"aoa: {op} names {name!r}, which the case does not hold")
            if name in seen:
                raise AoaError(f"aoa: {name!r} is named by two transformations")
            seen.add(name)
        dtype, shape = tensors[names[0]]
        if op == "permute" and sorted(t["perm"]) != list(range(len(shape))):
            raise AoaError(f"aoa: permute {list(t['perm'])} is no permutation of {name!r}'s {len(shape)} axes")
        if op == "cast" and dtype not in CASTS:
            raise AoaError(f"aoa: cast stores {name!r} widened to F32, which needs {' or '.join(CASTS)}, not {dtype}")
        if op == "concat" or op in FUSED_MODEL or op in FUSIONS:
            axis = int(t["axis"])
            if not 0 <= axis < len(shape):
                raise AoaError(f"aoa: {op} axis {axis} is outside {names[0]!r}'s {len(shape)} axes")
        if op == "concat" and (int(t["parts"]) < 2 or shape[int(t["axis"])] % int(t["parts"])):
            raise AoaError(f"aoa: concat of {t['parts']} parts does not divide {name!r}'s axis {t['axis']}")
        if op in FUSIONS:
            _check_fusion(t, [tensors[n] for n in names], (degrees or {}).get(names[0]))
        if op in FUSED_MODEL:
            _check_parts(t, names[0], shape[int(t["axis"])])
        if op in REDEGREED and (degrees or {}).get(names[0]) is not None:
            _check_parts({**t, "degree": degrees[names[0]]}, names[0], shape[int(t["axis"])])
        spelling = t.get("spelling")
        if spelling is not None and spelling not in SPELLINGS.get(op, ()):
            raise AoaError(f"aoa: {op} has no spelling {spelling!r} (known: {', '.join(SPELLINGS.get(op, ()))})")
        if spelling == "T" and list(t["perm"]) != list(range(len(shape)))[::-1]:
            raise AoaError(f"aoa: ^T reverses the axes; permute {list(t['perm'])} does not")
        if spelling in ("id", "offset") and not NUMBERED.search(names[0]):
            raise AoaError(f"aoa: an id placeholder needs a number in the name, which {names[0]!r} lacks")
    renames = [t for t in transforms if t["op"] == "rename" and NUMBERED.search(str(t["name"]))]
    offset = {offset_pattern(str(t["name"])) for t in renames if t.get("spelling") == "offset"}
    mixed = [str(t["name"]) for t in renames
             if offset_pattern(str(t["name"])) in offset and t.get("spelling") != "offset"]
    if mixed:
        raise AoaError(f"aoa: {mixed[0]!r} is renamed in a family an offset renames: its statement takes them all")


def _check_fusion(t: Mapping, members: list[tuple[str, tuple[int, ...]]], degree: int | None) -> None:
    op, names, axis = t["op"], list(named(t)), int(t["axis"])
    if len(names) != FUSIONS[op] or len({dtype for dtype, _ in members}) > 1 \
            or len({_off_axis(shape, axis) for _, shape in members}) > 1:
        raise AoaError(f"aoa: {op} fuses {FUSIONS[op]} tensors of one dtype and one shape off axis {axis}, "
                       f"not {names}")
    sizes = [shape[axis] for _, shape in members]
    if op in ("split", "ffn") and sizes[0] != sizes[1]:
        raise AoaError(f"aoa: {op} fuses two tensors of one shape, not {names}")
    if op in ("qkv", "qkv_tp"):
        heads, groups = int(t["heads"]), int(t["groups"])
        if heads < 1 or groups < 1 or heads % groups:
            raise AoaError(f"aoa: {op} needs heads ({heads}) a multiple of groups ({groups}), both positive")
        if sizes[0] % heads or sizes[1] != sizes[2] or sizes[0] // heads * groups != sizes[1]:
            raise AoaError(f"aoa: {op} of {names}: {heads} query heads and {groups} key and value heads are not "
                           f"heads of one size along axis {axis} ({sizes})")
    if op in DEGREED and degree is not None:
        divided = [sizes[0]] if op == "ffn" else [int(t["heads"]), int(t["groups"])]
        if degree < 1 or any(n % degree for n in divided):
            raise AoaError(f"aoa: {op} of {names} at degree {degree}: the degree does not divide {divided}")


def _check_parts(t: Mapping, name: str, size: int) -> None:
    op, fusion = t["op"], FUSED_MODEL[t["op"]]
    if fusion == "ffn" and size % 2:
        raise AoaError(f"aoa: {op} of {name!r}: gate and up of one size do not make an odd axis ({size})")
    if fusion != "ffn":
        heads, groups = int(t["heads"]), int(t["groups"])
        if heads < 1 or groups < 1 or heads % groups or size % (heads + 2 * groups):
            raise AoaError(f"aoa: {op} of {name!r}: {heads} query heads and {groups} key and value heads, heads a "
                           f"multiple of groups, are not heads of one size along its axis ({size})")
    if fusion in DEGREED:
        degree = int(t["degree"])
        divided = [size // 2] if fusion == "ffn" else [int(t["heads"]), int(t["groups"])]
        if degree < 1 or any(n % degree for n in divided):
            raise AoaError(f"aoa: {op} of {name!r} at degree {degree}: the degree does not divide {divided}")


def _parts_sizes(t: Mapping, size: int) -> list[int]:
    """The members' extents along a parted fusion's axis of the fused tensor's ``size``: gate's and up's, or Q's,
    K's and V's."""
    if FUSED_MODEL[t["op"]] == "ffn":
        return [size // 2, size // 2]
    head = size // (int(t["heads"]) + 2 * int(t["groups"]))
    return [int(t["heads"]) * head, int(t["groups"]) * head, int(t["groups"]) * head]


def _parts_blocks(t: Mapping, sizes: list[int], degree: int | None = None) -> list[tuple[int, int, int]]:
    """A fused model tensor's blocks: its fusion's, at the model's degree where the fusion has one (or at
    ``degree``: a redegreed tensor as the checkpoint holds it)."""
    fusion = FUSED_MODEL[t["op"]]
    if degree is None:
        degree = int(t["degree"]) if fusion in DEGREED else 1
    return blocks({**t, "op": fusion}, sizes, degree)


def _placed(blocks_: list[tuple[int, int, int]], member: int, start: int, stop: int) -> list[tuple[int, int]]:
    """Where member ``member``'s extent ``[start, stop)`` lies along a fused tensor of ``blocks_``: its runs, in
    the member's order."""
    at, out = 0, []
    for m, lo, hi in blocks_:
        a, b = max(lo, start), min(hi, stop)
        if m == member and a < b:
            out.append((lo, at + a - lo, at + b - lo))
        at += hi - lo
    return [(x, y) for _, x, y in sorted(out)]


def _off_axis(values: Iterable[int], axis: int) -> tuple[int, ...]:
    return tuple(v for i, v in enumerate(values) if i != axis)


def blocks(t: Mapping, sizes: list[int], degree: int = 1) -> list[tuple[int, int, int]]:
    """A fusion's fused tensor along its axis, block by block: (member, start, stop), the member's extent that
    block holds (``sizes``: each member's extent along the axis; ``degree``: the fusion's, where it has one)."""
    op = t["op"]
    if op == "split":
        return [(0, 0, sizes[0]), (1, 0, sizes[1])]
    if op == "ffn":
        chunk = sizes[0] // degree
        return [(m, r * chunk, (r + 1) * chunk) for r in range(degree) for m in (0, 1)]
    heads, groups = int(t["heads"]), int(t["groups"])
    head = sizes[0] // heads
    if op == "qkv":
        q = heads // groups * head  # a key-value group's query heads
        return [b for g in range(groups) for b in ((0, g * q, (g + 1) * q), (1, g * head, (g + 1) * head),
                                                   (2, g * head, (g + 1) * head))]
    q, kv = heads // degree * head, groups // degree * head  # one shard's query heads, and its key (value) heads
    return [b for r in range(degree) for b in ((0, r * q, (r + 1) * q), (1, r * kv, (r + 1) * kv),
                                               (2, r * kv, (r + 1) * kv))]


def member_sizes(t: Mapping, name: str, size: int) -> list[int]:
    """Every member's extent along a fusion's axis, from one member's (``name``'s ``size``)."""
    if t["op"] in ("split", "ffn"):
        return [size, size]
    heads, groups = int(t["heads"]), int(t["groups"])
    head = size // (heads if name == t["names"][0] else groups)
    return [heads * head, groups * head, groups * head]


def degreed_leads(transforms: Iterable[Mapping]) -> list[str]:
    """The first member of each fusion whose block order follows the checkpoint's degree: the name its degree is
    kept under."""
    return [named(t)[0] for t in transforms if t["op"] in DEGREED or t["op"] in REDEGREED]


def model_degrees(transforms: Iterable[Mapping]) -> dict[str, int]:
    """Each fused model tensor whose block order follows the model's degree, and that degree: every load must
    give the tensor that many distinct pieces, the count Paddle fuses it at."""
    return {str(t["name"]): int(t["degree"]) for t in transforms
            if t["op"] in REDEGREED or (t["op"] in PARTED and PARTED[t["op"]] in DEGREED)}


def degrees_of(transforms: Iterable[Mapping], pieces: Callable[[str], int]) -> dict[str, int]:
    """Each degreed fusion's degree, under its first member's name: ``pieces(name)``, how many distinct pieces
    the checkpoint holds (or the save layout gives) of that member, which the fused tensor has too."""
    return {lead: pieces(lead) for lead in degreed_leads(transforms)}


def _degree(t: Mapping, degrees: Mapping[str, int] | None) -> int:
    if t["op"] not in DEGREED and t["op"] not in REDEGREED:
        return 1
    if degrees is None or named(t)[0] not in degrees:
        raise AoaError(f"aoa: {t['op']} of {list(named(t))} needs the checkpoint's degree of the fused tensor")
    return degrees[named(t)[0]]


def statements(transforms: Iterable[Mapping], key: Callable[[str], str], dtypes: Mapping[str, str]) -> list[str]:
    """The AoA statements that map the stored checkpoint back onto the model (``key``: a model tensor's key;
    ``dtypes``: each model tensor's dtype code)."""
    transforms = list(transforms)
    patterns = {_id_pattern(key(t["name"])) for t in transforms if t.get("spelling") == "id"}
    out: list[str] = []
    for t in transforms:
        op, names, spelling = t["op"], named(t), t.get("spelling")
        k = key(names[0])
        if op == "rename":
            pattern = _id_pattern(k) if NUMBERED.search(k) else None
            if spelling == "offset":
                at = offset_pattern(k)
                line = f"{at}.aoa_renamed -> {at}"
            elif spelling == "id" or pattern not in patterns:  # one id statement renames all its pattern fits
                line = f"{pattern}.aoa_renamed -> {pattern}" if spelling == "id" else f"{k}.aoa_renamed -> {k}"
            else:
                continue
            if line not in out:
                    out.append(line)
        elif op == "permute":
            out.append(f"{k}.aoa_t^T -> {k}" if spelling == "T" else f"{k}.aoa_t -> {k}, permute='{list(t['perm'])}'")
        elif op == "cast":
            out.append(f"{k}.aoa_f32 -> {k}, dtype='{CASTS[dtypes[names[0]]]}'")
        elif op == "concat":
            parts = {"star": f"{k}.aoa_part_*", "array": f"{k}.aoa_part[0:{int(t['parts'])}]"}.get(
                spelling or "list", ", ".join(f"{k}.aoa_part_{i}" for i in range(int(t["parts"]))))
            out.append(f"{parts} -> {k}, axis={int(t['axis'])}")
        elif op in FUSED_MODEL:
            fusion = FUSED_MODEL[op]
            heads = "" if fusion == "ffn" else \
                f", num_heads={int(t['heads'])}, num_key_value_groups={int(t['groups'])}"
            held = f"{k}.aoa_fused" if op in REDEGREED else ", ".join(k + part for part in PARTS[fusion])
            out.append(f"{held} -> {k}, {MACROS[fusion]}{heads}, axis={int(t['axis'])}")
        else:
            macro = f", {MACROS[op]}" if op in MACROS else ""
            if op in ("qkv", "qkv_tp"):
                macro += f", num_heads={int(t['heads'])}, num_key_value_groups={int(t['groups'])}"
            out.append(f"{k}.aoa_fused -> {', '.join(key(n) for n in names)}{macro}, axis={int(t['axis'])}")
    return out


def offset_pattern(key: str) -> str:
    """``key`` with its last number the offset placeholder: the family an offset rename takes whole."""
    last = list(NUMBERED.finditer(key))[-1]
    return key[:last.start()] + "$LAYER_ID_OFFSET" + key[last.end():]


def _id_pattern(key: str) -> str:
    """``key`` with its last number made the id placeholder: ``$EXPERT_ID`` for an expert's, else ``$LAYER_ID``."""
    last = list(NUMBERED.finditer(key))[-1]
    placeholder = "$EXPERT_ID" if key[:last.start()].endswith("experts.") else "$LAYER_ID"
    return key[:last.start()] + placeholder + key[last.end():]


@dataclass(frozen=True)
class Piece:
    """One rank's piece of a model tensor: dtype code, global shape, region and bits."""

    dtype: str
    global_shape: tuple[int, ...]
    region: Region
    bits: np.ndarray


def stored(transforms: Iterable[Mapping], pieces: Mapping[str, Piece],
           degrees: Mapping[str, int] | None = None) -> list[StoredPiece]:
    """How the checkpoint stores one rank's ``pieces`` of the model's tensors: as they are, or through the inverse
    of the transformation that names them (a fusion's pieces become one piece of the fused tensor, so each must
    span the fused axis whole: AoaError otherwise; ``degrees``: degrees_of the save layout)."""
    transforms = list(transforms)
    out: list[StoredPiece] = []
    for name, piece in pieces.items():
        t = next((t for t in transforms if name in named(t)), None)
        if t is None:
            out.append(StoredPiece(name, "", piece.global_shape, piece.dtype, piece.region, piece.bits))
        elif t["op"] in FUSIONS:
            if name == t["names"][0]:
                out.append(_fused(t, [pieces.get(n) for n in t["names"]], _degree(t, degrees)))
        elif t["op"] in REDEGREED:
            out.append(_redegreed(t, name, piece, _degree(t, degrees)))
        else:
            out.extend(_stored_one(t, name, piece))
    return out


def _redegreed(t: Mapping, name: str, piece: Piece, degree: int) -> StoredPiece:
    """A rank's piece of a fused model tensor (whole along the axis) as the checkpoint holds it: the members'
    extents, block by block of the fusion at the checkpoint's ``degree``."""
    axis, region = int(t["axis"]), piece.region
    if not isinstance(region, Box) or region.shape[axis] != piece.global_shape[axis]:
        raise AoaError(f"aoa: {t['op']} of {name!r}: a rank's piece must be one box, whole along axis {axis}")
    sizes, cut = _parts_sizes(t, piece.global_shape[axis]), [slice(None)] * len(region.shape)
    model, runs = _parts_blocks(t, sizes), []
    for member, start, stop in _parts_blocks(t, sizes, degree):
        for lo, hi in _placed(model, member, start, stop):
            cut[axis] = slice(lo, hi)
            runs.append(piece.bits[tuple(cut)])
    return StoredPiece(name, ".aoa_fused", piece.global_shape, piece.dtype, region,
                       np.ascontiguousarray(np.concatenate(runs, axis=axis)))


def stored_locals(transforms: Iterable[Mapping], local: Mapping[str, LocalTensor],
                  degrees: Mapping[str, int] | None = None) -> dict[str, LocalTensor]:
    """``stored`` for a rank's local tensors: each stored piece under its owner's name and suffix, saved by the
    ranks that save its owner (a replica is saved once, stored or not)."""
    pieces = {n: Piece(lt.tensor.dtype.name, tuple(lt.global_shape), lt.region, lt.tensor.bits)
              for n, lt in local.items()}
    return {p.key: LocalTensor(p.global_shape, p.region, Tensor(DTYPES[p.dtype], p.bits),
                                            saves=local[p.owner].saves)
            for p in stored(transforms, pieces, degrees)}


def _stored_one(t: Mapping, name: str, piece: Piece) -> list[StoredPiece]:
    op, region, shape = t["op"], piece.region, piece.global_shape
    if isinstance(region, FlatRange) and op not in PIECEWISE:
        raise AoaError(f"aoa: {op} cannot store a flattened piece of {name!r}")
    if op == "rename":
        return [StoredPiece(name, ".aoa_renamed", shape, piece.dtype, region, piece.bits,
                            int(t.get("spelling") == "offset"))]
    if op == "cast":
        return [StoredPiece(name, ".aoa_f32", shape, "F32", region, widened(piece.dtype, piece.bits))]
    assert isinstance(region, Box)
    if op in PARTED:
        return _parts_stored(t, name, piece)
    if op == "permute":
        inverse, stored_shape, box = _transposed(t["perm"], shape, region)
        return [StoredPiece(name, ".aoa_t", stored_shape, piece.dtype, box,
                            np.ascontiguousarray(np.transpose(piece.bits, inverse)))]
    return [StoredPiece(name, f".aoa_part_{part}", part_shape, piece.dtype, box,
                        np.ascontiguousarray(piece.bits[take]))
            for part, part_shape, box, take in _parts(t, shape, region)]


def _parts_stored(t: Mapping, name: str, piece: Piece) -> list[StoredPiece]:
    """The members' pieces of a rank's piece of the fused model tensor (whole along the axis): each member's
    blocks, gathered in order."""
    axis, region = int(t["axis"]), piece.region
    assert isinstance(region, Box)
    if region.shape[axis] != piece.global_shape[axis]:
        raise AoaError(f"aoa: {t['op']} of {name!r}: a rank's piece must be whole along axis {axis}")
    sizes, cut, at = _parts_sizes(t, piece.global_shape[axis]), [slice(None)] * len(region.shape), 0
    gathered: list[list[np.ndarray]] = [[] for _ in sizes]
    for member, start, stop in _parts_blocks(t, sizes):
        cut[axis] = slice(at, at + stop - start)
        gathered[member].append(piece.bits[tuple(cut)])
        at += stop - start
    out = []
    for member, part in enumerate(PARTS[PARTED[t["op"]]]):
        shape = tuple(sizes[member] if i == axis else n for i, n in enumerate(piece.global_shape))
        extent = tuple(sizes[member] if i == axis else n for i, n in enumerate(region.shape))
        out.append(StoredPiece(name, part, shape, piece.dtype, Box(region.offsets, extent),
                               np.ascontiguousarray(np.concatenate(gathered[member], axis=axis))))
    return out


def _transposed(perm: Iterable[int], shape: tuple[int, ...], region: Box
                ) -> tuple[list[int], tuple[int, ...], Box]:
    """A permute's stored side: the inverse permutation, the stored tensor's shape and the piece's box there."""
    inverse = [int(i) for i in np.argsort(list(perm))]
    return inverse, tuple(shape[i] for i in inverse), Box(tuple(region.offsets[i] for i in inverse),
                                                          tuple(region.shape[i] for i in inverse))


def _parts(t: Mapping, shape: tuple[int, ...], region: Box
           ) -> list[tuple[int, tuple[int, ...], Box, tuple[slice, ...]]]:
    """A concat's stored side for one piece: per part it meets, the part number, the part's shape, the box of the
    piece in that part, and the piece's own slice that lies there."""
    axis, parts = int(t["axis"]), int(t["parts"])
    size = shape[axis] // parts
    part_shape = tuple(size if i == axis else n for i, n in enumerate(shape))
    out = []
    for part in range(parts):
        lo = max(region.offsets[axis], part * size)
        hi = min(region.offsets[axis] + region.shape[axis], (part + 1) * size)
        if lo >= hi:
            continue
        take = [slice(None)] * len(shape)
        take[axis] = slice(lo - region.offsets[axis], hi - region.offsets[axis])
        at = tuple(lo - part * size if i == axis else o for i, o in enumerate(region.offsets))
        extent = tuple(hi - lo if i == axis else n for i, n in enumerate(region.shape))
        out.append((part, part_shape, Box(at, extent), tuple(take)))
    return out


def _fused(t: Mapping, members: list[Piece | None], degree: int) -> StoredPiece:
    """The piece of the fused tensor a rank holding the fusion's ``members`` stores: their blocks in order."""
    axis, names = int(t["axis"]), list(named(t))
    held = [p for p in members if p is not None and isinstance(p.region, Box)
            and p.region.shape[axis] == p.global_shape[axis]]
    if len(held) != len(members) or len({_off_axis(p.region.offsets, axis) + _off_axis(p.region.shape, axis)
                                         for p in held}) != 1:
        raise AoaError(f"aoa: {t['op']} of {names}: a rank's pieces must be one box, whole along axis {axis}, to be "
                       "one piece of the fused tensor")
    first = held[0]
    assert isinstance(first.region, Box)
    sizes = [p.global_shape[axis] for p in held]
    cut = [slice(None)] * len(first.global_shape)
    parts = []
    for member, start, stop in blocks(t, sizes, degree):
        cut[axis] = slice(start, stop)
        parts.append(held[member].bits[tuple(cut)])
    total = sum(sizes)
    fused = tuple(total if i == axis else n for i, n in enumerate(first.global_shape))
    extent = tuple(total if i == axis else n for i, n in enumerate(first.region.shape))
    return StoredPiece(names[0], ".aoa_fused", fused, first.dtype, Box(first.region.offsets, extent),
                       np.ascontiguousarray(np.concatenate(parts, axis=axis)))


@dataclass(frozen=True)
class Read:
    """A region of a stored tensor that a model piece is made from (``key``: the owner's name and suffix)."""

    key: str
    dtype: str
    global_shape: tuple[int, ...]
    region: Region


def reads(transforms: Iterable[Mapping], name: str, dtype: str, global_shape: tuple[int, ...],
          region: Region, degrees: Mapping[str, int] | None = None) -> list[Read]:
    """What the statements read to give this piece of model tensor ``name``: the forward meaning of each
    transformation, in regions of the stored tensors (``assemble`` puts them together; ``degrees``: degrees_of
    the checkpoint)."""
    t = next((t for t in transforms if name in named(t)), None)
    op = t["op"] if t is not None else None
    if op is None:
        return [Read(name, dtype, global_shape, region)]
    if isinstance(region, FlatRange) and op not in PIECEWISE:
        raise AoaError(f"aoa: {op} cannot give a flattened piece of {name!r}")
    if op == "rename":
        return [Read(shifted(name, int(t.get("spelling") == "offset")) + ".aoa_renamed", dtype, global_shape, region)]
    if op == "cast":
        return [Read(name + ".aoa_f32", "F32", global_shape, region)]
    assert isinstance(region, Box)
    if op == "permute":
        _, stored_shape, box = _transposed(t["perm"], global_shape, region)
        return [Read(name + ".aoa_t", dtype, stored_shape, box)]
    if op in FUSIONS:
        return _fused_reads(t, name, dtype, global_shape, region, _degree(t, degrees))
    if op in PARTED:
        return _parts_reads(t, name, dtype, global_shape, region)
    if op in REDEGREED:
        return _redegreed_reads(t, name, dtype, global_shape, region, _degree(t, degrees))
    return [Read(f"{name}.aoa_part_{part}", dtype, part_shape, box)
            for part, part_shape, box, _ in _parts(t, global_shape, region)]


def _fused_reads(t: Mapping, name: str, dtype: str, global_shape: tuple[int, ...], region: Box,
                 degree: int) -> list[Read]:
    """The regions of the fused tensor that make a member's piece: the member's blocks it meets, in the member's
    own order."""
    axis, member = int(t["axis"]), list(named(t)).index(name)
    sizes = member_sizes(t, name, global_shape[axis])
    fused = tuple(sum(sizes) if i == axis else n for i, n in enumerate(global_shape))
    lo, hi = region.offsets[axis], region.offsets[axis] + region.shape[axis]
    at, mine = 0, []
    for m, start, stop in blocks(t, sizes, degree):
        if m == member:
            mine.append((start, stop, at))
        at += stop - start
    out = []
    for start, stop, place in sorted(mine):
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            offsets = tuple(place + a - start if i == axis else o for i, o in enumerate(region.offsets))
            extent = tuple(b - a if i == axis else n for i, n in enumerate(region.shape))
            out.append(Read(t["names"][0] + ".aoa_fused", dtype, fused, Box(offsets, extent)))
    return out


def _parts_reads(t: Mapping, name: str, dtype: str, global_shape: tuple[int, ...], region: Box) -> list[Read]:
    """The regions of the members (gate and up, or Q, K and V) that make a piece of the fused model tensor: the
    blocks it meets, in the fused order."""
    axis, parts = int(t["axis"]), PARTS[PARTED[t["op"]]]
    sizes = _parts_sizes(t, global_shape[axis])
    lo, hi = region.offsets[axis], region.offsets[axis] + region.shape[axis]
    at, out = 0, []
    for member, start, stop in _parts_blocks(t, sizes):
        a, b = max(lo, at), min(hi, at + stop - start)
        if a < b:
            shape = tuple(sizes[member] if i == axis else n for i, n in enumerate(global_shape))
            offsets = tuple(start + a - at if i == axis else o for i, o in enumerate(region.offsets))
            extent = tuple(b - a if i == axis else n for i, n in enumerate(region.shape))
            out.append(Read(name + parts[member], dtype, shape, Box(offsets, extent)))
        at += stop - start
    return out


def _redegreed_reads(t: Mapping, name: str, dtype: str, global_shape: tuple[int, ...], region: Box,
                     degree: int) -> list[Read]:
    """The regions of the fused tensor the checkpoint holds (at its ``degree``) that make a piece of the model's
    (at the model's): the model's blocks the piece meets, each found where the checkpoint's blocks put it."""
    axis = int(t["axis"])
    sizes = _parts_sizes(t, global_shape[axis])
    lo, hi = region.offsets[axis], region.offsets[axis] + region.shape[axis]
    stored, at, out = _parts_blocks(t, sizes, degree), 0, []
    for member, start, stop in _parts_blocks(t, sizes):
        a, b = max(lo, at), min(hi, at + stop - start)
        for x, y in _placed(stored, member, start + a - at, start + b - at) if a < b else ():
            offsets = tuple(x if i == axis else o for i, o in enumerate(region.offsets))
            extent = tuple(y - x if i == axis else n for i, n in enumerate(region.shape))
            out.append(Read(name + ".aoa_fused", dtype, global_shape, Box(offsets, extent)))
        at += stop - start
    return out


def assemble(transforms: Iterable[Mapping], name: str, dtype: str, region: Region,
             got: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    """The model piece from the bits of its ``reads`` in order (``empty``: the piece's bits when no read is
    needed, a region with no elements)."""
    t = next((t for t in transforms if name in named(t)), None)
    op = t["op"] if t is not None else None
    if op == "cast":
        return got[0].view(np.float32).astype(np.float16).view(np.uint16)
    if op == "permute":
        return np.ascontiguousarray(np.transpose(got[0], t["perm"]))
    if op == "concat" or op in FUSED_MODEL or op in FUSIONS:
        return np.concatenate(got, axis=int(t["axis"])) if got else empty
    return got[0]


def widened(dtype: str, bits: np.ndarray) -> np.ndarray:
    """The F32 bit patterns of F16 values (exact: every F16 value is an F32 value; NaN payloads move up)."""
    if dtype == "F16":
        return bits.view(np.float16).astype(np.float32).view(np.uint32)
    raise AoaError(f"aoa: no widening of {dtype} to F32")
