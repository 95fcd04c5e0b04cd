"""The layout model (docs/design.md §2): meshes, placements, and which slice of each tensor a rank holds.

Conventions follow Paddle and torch DTensor: ranks map to mesh coordinates row-major; an uneven split uses
chunk = ceil(n / k), so trailing chunks may be smaller or empty; several mesh dims sharding one tensor dim split
it successively in mesh-dim order (a chunk of a chunk). Replicas are deduplicated by saving only from the rank
whose coordinate is 0 on every mesh dim that does not shard the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import LayoutError


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk ``index`` when ``n`` items are split into ``parts`` ceil-sized chunks."""
    if n < 0 or parts < 1 or not 0 <= index < parts:
        raise LayoutError(f"cannot take chunk {index} of {n} items in {parts} parts")
    chunk = -(-n // parts) if n else 0
    start = min(index * chunk, n)
    return start, min(start + chunk, n)


@dataclass(frozen=True)
class Mesh:
    shape: tuple[int, ...]
    dim_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= len(self.shape) <= 3 or any(s < 1 for s in self.shape):
            raise LayoutError(f"mesh shape must have 1-3 positive dims, got {self.shape}")
        if not self.dim_names:
            object.__setattr__(self, "dim_names", tuple(f"d{i}" for i in range(len(self.shape))))
        if len(self.dim_names) != len(self.shape) or len(set(self.dim_names)) != len(self.shape):
            raise LayoutError(f"mesh dim names {self.dim_names} do not match shape {self.shape}")

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def coord(self, rank: int) -> tuple[int, ...]:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside mesh of {self.world_size} ranks")
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def dim(self, name_or_index: str | int) -> int:
        if isinstance(name_or_index, int):
            return name_or_index
        return self.dim_names.index(name_or_index)

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dim_names": list(self.dim_names)}

    @classmethod
    def from_json(cls, data: dict) -> Mesh:
        return cls(tuple(data["shape"]), tuple(data.get("dim_names", ())))


@dataclass(frozen=True)
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __str__(self) -> str:
        return "Replicate()"


Placement = Shard | Replicate


def placement_from_json(text: str) -> Placement:
    if text in ("R", "Replicate()"):
        return Replicate()
    if text.startswith("S") and text[1:].isdigit():
        return Shard(int(text[1:]))
    if text.startswith("Shard(") and text.endswith(")") and text[6:-1].isdigit():
        return Shard(int(text[6:-1]))
    raise LayoutError(f"unknown placement {text!r}")


def placement_to_json(p: Placement) -> str:
    return f"S{p.dim}" if isinstance(p, Shard) else "R"


# --- regions: what part of a global tensor a slice is -------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """An axis-aligned block of a global tensor: per-dim offsets and lengths."""

    offsets: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {"box": {"offsets": list(self.offsets), "shape": list(self.shape)}}


@dataclass(frozen=True)
class FlatRange:
    """Elements [start, stop) of the global tensor in row-major order (stage-1 v2 flattened shards)."""

    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.numel,)

    def to_json(self) -> dict:
        return {"flat": [self.start, self.stop]}


Region = Box | FlatRange


def region_from_json(data: dict, global_shape: tuple[int, ...]) -> Region:
    """Parse and bounds-check a region read from an untrusted index."""
    if not isinstance(data, dict) or len(data) != 1:
        raise LayoutError(f"malformed region {data!r}")
    if "box" in data:
        box = data["box"]
        offsets, shape = tuple(box["offsets"]), tuple(box["shape"])
        ok = (
            len(offsets) == len(shape) == len(global_shape)
            and all(isinstance(v, int) and v >= 0 for v in offsets + shape)
            and all(o + s <= g for o, s, g in zip(offsets, shape, global_shape))
        )
        if not ok:
            raise LayoutError(f"box {box} does not fit global shape {list(global_shape)}")
        return Box(offsets, shape)
    if "flat" in data:
        start, stop = data["flat"]
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= math.prod(global_shape)):
            raise LayoutError(f"flat range {data['flat']} does not fit global shape {list(global_shape)}")
        return FlatRange(start, stop)
    raise LayoutError(f"malformed region {data!r}")


# --- tensor layouts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalSlice:
    """What one rank holds of one tensor, and whether it is the rank that saves it (replicas saved once)."""

    region: Region
    saves: bool


@dataclass(frozen=True)
class Sharded:
    """DTensor-style layout: one placement per mesh dim.

    ``owner`` restricts the tensor to ranks whose coordinates match (mesh dim → index; several indices of one dim
    are alternatives): keyed MoE experts live only on their expert-parallel rank, an optimizer's scalar state only
    on the sharding ranks that hold a slice of its parameter. Ranks outside the owner hold nothing; of those inside,
    the lowest index of each owner dim saves a replica.
    """

    mesh: Mesh
    placements: tuple[Placement, ...]
    owner: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.placements) != len(self.mesh.shape):
            raise LayoutError(f"{len(self.placements)} placements for a {len(self.mesh.shape)}-d mesh")
        if len(set(self.owner)) != len(self.owner):
            raise LayoutError(f"owner {list(self.owner)} names a coordinate twice")
        for mesh_dim, index in self.owner:
            if not 0 <= mesh_dim < len(self.mesh.shape) or not 0 <= index < self.mesh.shape[mesh_dim]:
                raise LayoutError(f"owner index {index} outside mesh dim {mesh_dim}")
            if isinstance(self.placements[mesh_dim], Shard):
                raise LayoutError("an owner mesh dim cannot also shard the tensor")

    def local(self, global_shape: tuple[int, ...], rank: int) -> LocalSlice | None:
        if rank >= self.mesh.world_size:  # a rank of the job outside the tensor's mesh holds none of it
            return None
        coord = self.mesh.coord(rank)
        owned = owner_indices(self.owner)
        if any(coord[d] not in indices for d, indices in owned.items()):
            return None
        starts = [0] * len(global_shape)
        stops = list(global_shape)
        for mesh_dim, p in enumerate(self.placements):
            if isinstance(p, Shard):
                if not 0 <= p.dim < len(global_shape):
                    raise LayoutError(f"{p} on a {len(global_shape)}-d tensor")
                lo, hi = split_range(stops[p.dim] - starts[p.dim], self.mesh.shape[mesh_dim], coord[mesh_dim])
                starts[p.dim], stops[p.dim] = starts[p.dim] + lo, starts[p.dim] + hi
        saves = all(coord[d] == (owned[d][0] if d in owned else 0)
                    for d, p in enumerate(self.placements) if isinstance(p, Replicate))
        return LocalSlice(Box(tuple(starts), tuple(b - a for a, b in zip(starts, stops))), saves)

    def to_json(self) -> dict:
        return {
            "kind": "sharded",
            "mesh": self.mesh.to_json(),
            "placements": [placement_to_json(p) for p in self.placements],
            "owner": [list(o) for o in self.owner],
        }


@dataclass(frozen=True)
class Flat:
    """Stage-1 v2 flattened layout: the tensor sits at [offset, offset+numel) of a flat buffer of ``total``
    elements split evenly (ceil) over the ranks of ``mesh_dim``; other mesh dims hold replicas.
    """

    mesh: Mesh
    mesh_dim: int
    offset: int
    total: int

    def local(self, global_shape: tuple[int, ...], rank: int) -> LocalSlice | None:
        numel = math.prod(global_shape)
        if self.offset + numel > self.total:
            raise LayoutError(f"flat tensor [{self.offset}, {self.offset + numel}) exceeds buffer {self.total}")
        if rank >= self.mesh.world_size:  # a rank of the job outside the buffer's mesh holds none of it
            return None
        coord = self.mesh.coord(rank)
        lo, hi = split_range(self.total, self.mesh.shape[self.mesh_dim], coord[self.mesh_dim])
        start = min(max(lo, self.offset), self.offset + numel) - self.offset
        stop = max(min(hi, self.offset + numel), self.offset) - self.offset
        stop = max(stop, start)
        saves = all(c == 0 for d, c in enumerate(coord) if d != self.mesh_dim)
        return LocalSlice(FlatRange(start, stop), saves)

    def to_json(self) -> dict:
        return {
            "kind": "flat",
            "mesh": self.mesh.to_json(),
            "mesh_dim": self.mesh_dim,
            "offset": self.offset,
            "total": self.total,
        }


TensorLayout = Sharded | Flat


def layout_kind(layout: TensorLayout | None, shape: tuple[int, ...] = ()) -> str | None:
    """The ``kind`` a layout's JSON names ("sharded", "flat"), and "flat-unaligned" for a flat layout one of whose
    ranks holds a range of the tensor (of ``shape``) that is not an n-d box: a loader must rebuild such a piece
    through a box around it, a code path of its own. None for no layout (the tensor whole on rank 0)."""
    if isinstance(layout, Flat):
        ranges = (layout.local(shape, r).region for r in range(layout.mesh.world_size))
        return "flat" if all(flat_range_is_box(shape, r.start, r.stop) for r in ranges) else "flat-unaligned"
    return "sharded" if isinstance(layout, Sharded) else None


def flat_range_is_box(shape: tuple[int, ...], start: int, stop: int) -> bool:
    """Whether elements [start, stop) of a row-major tensor of ``shape`` are exactly an n-d box: some dim k spanned
    in part, the dims before it fixed, the dims after it whole."""
    count = stop - start
    if count <= 1:
        return True
    inner = 1
    for size in reversed(shape):
        if start % inner == 0 and count % inner == 0 and (start // inner) % size + count // inner <= size:
            return True
        inner *= size
    return False


def layout_from_json(data: dict) -> TensorLayout:
    mesh = Mesh.from_json(data["mesh"])
    if data["kind"] == "sharded":
        placements = tuple(placement_from_json(p) for p in data["placements"])
        return Sharded(mesh, placements, tuple(tuple(o) for o in data.get("owner", ())))
    if data["kind"] == "flat":
        return Flat(mesh, data["mesh_dim"], data["offset"], data["total"])
    raise LayoutError(f"unknown layout kind {data.get('kind')!r}")


def owner_indices(owner: tuple[tuple[int, int], ...]) -> dict[int, list[int]]:
    """Each owner mesh dim's allowed indices, ascending."""
    out: dict[int, list[int]] = {}
    for mesh_dim, index in owner:
        out.setdefault(mesh_dim, []).append(index)
    return {d: sorted(indices) for d, indices in sorted(out.items())}


def replicated(mesh: Mesh) -> Sharded:
    return Sharded(mesh, tuple(Replicate() for _ in mesh.shape))


def pieces(layout: TensorLayout | None, shape: tuple[int, ...]) -> set[Region]:
    """The distinct pieces ``layout`` cuts a tensor of ``shape`` into, replicas once (a tensor without a layout
    lives whole on rank 0: one piece)."""
    if layout is None:
        return {Box((0,) * len(shape), tuple(shape))}
    return {piece.region for rank in range(layout.mesh.world_size)
            if (piece := layout.local(shape, rank)) is not None}


def piece_count(layout: TensorLayout | None, shape: tuple[int, ...]) -> int:
    return len(pieces(layout, shape))


def whole_on_every_rank(layout: TensorLayout) -> bool:
    """Every rank holds the whole tensor (a data-parallel replica)."""
    return isinstance(layout, Sharded) and not layout.owner and all(isinstance(p, Replicate)
                                                                    for p in layout.placements)


def flat_group(
    mesh: Mesh, mesh_dim: int | str, params: list[tuple[str, tuple[int, ...]]], align: int = 1
) -> dict[str, Flat]:
    """Lay ``params`` end to end in one flat buffer (each start aligned to ``align`` elements, the buffer padded
    to a multiple of ``align`` × sharding degree, as fused stage-1 buffers are) and shard it over ``mesh_dim``.
    """
    dim = mesh.dim(mesh_dim)
    degree = mesh.shape[dim]
    offsets, cursor = {}, 0
    for name, shape in params:
        cursor = -(-cursor // align) * align
        offsets[name] = cursor
        cursor += math.prod(shape)
    unit = align * degree
    total = -(-cursor // unit) * unit if cursor else 0
    return {name: Flat(mesh, dim, offsets[name], total) for name, _ in params}
