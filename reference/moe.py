"""Mixture-of-experts layouts (docs/design.md §2): expert parallelism, global expert ids, DP-MoE replicas.

Global expert id = ep_rank * (E / EP) + local_id. Two encodings: *stacked* (one ``[E, ...]`` tensor sharded on
dim 0 over the EP mesh dim) and *keyed* (one tensor per expert whose key carries the global id, owned by one EP
rank). Every other mesh dim (data parallel) holds replicas, which are saved once.
"""

from __future__ import annotations

import re

from .errors import LayoutError
from .layout import Mesh, Replicate, Shard, Sharded


def experts_per_rank(num_experts: int, ep_degree: int) -> int:
    if num_experts < 1 or ep_degree < 1 or num_experts % ep_degree:
        raise LayoutError(f"{num_experts} experts cannot be split evenly over EP degree {ep_degree}")
    return num_experts // ep_degree


def global_expert_id(ep_rank: int, local_id: int, num_experts: int, ep_degree: int) -> int:
    per = experts_per_rank(num_experts, ep_degree)
    if not 0 <= local_id < per or not 0 <= ep_rank < ep_degree:
        raise LayoutError(f"local expert {local_id} on EP rank {ep_rank} outside {num_experts}/{ep_degree}")
    return ep_rank * per + local_id


def expert_key(prefix: str, expert_id: int, suffix: str) -> str:
    return f"{prefix}.experts.{expert_id}.{suffix}"


def stacked_layout(mesh: Mesh, ep_dim: int | str, num_experts: int) -> Sharded:
    """``[E, ...]`` expert tensor sharded on dim 0 over the EP mesh dim, replicated elsewhere."""
    dim = mesh.dim(ep_dim)
    experts_per_rank(num_experts, mesh.shape[dim])
    return Sharded(mesh, tuple(Shard(0) if d == dim else Replicate() for d in range(len(mesh.shape))))


def keyed_layouts(mesh: Mesh, ep_dim: int | str, num_experts: int, prefix: str, suffix: str) -> dict[str, Sharded]:
    """One whole tensor per expert, keyed by global id, living on (and saved from) its EP rank only."""
    dim = mesh.dim(ep_dim)
    ep = mesh.shape[dim]
    per = experts_per_rank(num_experts, ep)
    replicate = tuple(Replicate() for _ in mesh.shape)
    return {
        expert_key(prefix, gid, suffix): Sharded(mesh, replicate, owner=((dim, gid // per),))
        for gid in range(num_experts)
    }


def expert_layouts(
    mesh: Mesh, ep_dim: int | str, num_experts: int, prefix: str, suffix: str, *, stacked: bool
) -> dict[str, Sharded]:
    """Either encoding behind one call: ``{prefix}.{suffix}`` stacked, or one keyed tensor per expert."""
    if stacked:
        return {f"{prefix}.{suffix}": stacked_layout(mesh, ep_dim, num_experts)}
    return keyed_layouts(mesh, ep_dim, num_experts, prefix, suffix)


def local_expert_ids(mesh: Mesh, ep_dim: int | str, num_experts: int, rank: int) -> list[int]:
    """Global ids of the experts ``rank`` holds, in local-id order."""
    dim = mesh.dim(ep_dim)
    ep_rank = mesh.coord(rank)[dim]
    per = experts_per_rank(num_experts, mesh.shape[dim])
    return [global_expert_id(ep_rank, j, num_experts, mesh.shape[dim]) for j in range(per)]


EXPERT_ID = re.compile(r"(?:^|\.)experts\.(\d+)\.")  # a keyed expert's structured name: ``….experts.<id>.…``


def keyed_expert_id(name: str) -> int | None:
    """The global expert id a keyed expert's name carries (the first ``experts.<id>.``), else None."""
    match = EXPERT_ID.search(name)
    return None if match is None else int(match.group(1))


def expert_parallel_degree(layouts: dict[str, object]) -> int:
    """How many expert-parallel ranks the keyed experts of ``layouts`` are spread over (1: none are)."""
    for name, layout in layouts.items():
        if keyed_expert_id(name) is not None and whole_on_its_ep_ranks(layout):
            return layout.mesh.shape[layout.owner[0][0]]
    return 1


def whole_on_its_ep_ranks(layout: object) -> bool:
    """A keyed expert's layout: whole on every rank of one expert-parallel coordinate (owner on the "ep" mesh dim
    only), replicated over every other dim."""
    if not isinstance(layout, Sharded) or not all(isinstance(p, Replicate) for p in layout.placements):
        return False
    return len(layout.owner) == 1 and layout.mesh.dim_names[layout.owner[0][0]] == "ep"
