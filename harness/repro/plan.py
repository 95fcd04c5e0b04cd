"""A case as a standalone script sees it: launches (phases), named steps, and explicit per-rank data tables.

A repro script must not know the harness's layouts, seeds or case language, so everything it needs is worked out
here, once, from the case: which processes each launch starts, what each rank hands the framework (its piece of
each tensor: region and bits) and what each load must give back. Framework-free, like the case itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from properties.case import Case
from reference.engine import local_tensors
from reference.layout import Box, Flat, FlatRange, Sharded
from reference.layout import Shard as ShardPlacement


class ReproUnsupported(Exception):
    """The case uses something a standalone script cannot show yet; the message says what, for the report."""


@dataclass(frozen=True)
class Piece:
    """One rank's piece of one tensor: the global shape, where the piece sits, its bits, and for a dist tensor
    the mesh it is laid out on (shape, placements as "S<dim>"/"R", and the owner coordinates it is pinned to)."""

    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...] | None  # a box piece: its offsets and shape
    shape: tuple[int, ...]
    flat: tuple[int, int] | None  # a flattened piece: [start, stop) of the row-major tensor
    hexbits: str
    mesh: tuple[int, ...] | None = None
    placements: tuple[str, ...] = ()
    owner: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Step:
    """One operation of the case on every rank of a launch. ``table`` names the data it saves or must load:
    (layout, version). ``expect_error``: the reference engine refuses this op too, so an error is the right answer."""

    index: int
    kind: str  # save | load | wait
    name: str | None
    table: tuple[str, int] | None = None
    use_async: bool = False
    mutate_after: bool = False
    detach: bool = False
    expect_error: bool = False
    tolerate: bool = False  # fails on the SUT before the reported step: an earlier bug the case passes through

    @property
    def label(self) -> str:
        what = f"{self.kind} {self.name or 'latest'}" if self.kind != "wait" else "wait for detached saves"
        return f"step {self.index}: {what}" + (" (async)" if self.use_async else "")


@dataclass
class Phase:
    """One launch: ``world`` fresh processes running ``steps`` in order."""

    world: int
    steps: list[Step] = field(default_factory=list)


@dataclass
class Plan:
    sut: str
    options: dict
    phases: list[Phase]
    tables: dict[tuple[str, int], dict[int, dict[str, Piece]]]  # (layout, version) -> rank -> tensor -> piece

    def uses(self, flag: str) -> bool:
        """Whether any step sets ``flag`` (use_async, mutate_after, detach): the script leaves out what none needs."""
        return any(getattr(step, flag) for phase in self.phases for step in phase.steps)

    def has_flat(self) -> bool:
        return any(p.flat is not None for table in self.tables.values() for ps in table.values() for p in ps.values())

    @property
    def max_world(self) -> int:
        return max(p.world for p in self.phases)


RANK_OPS = ("save", "load", "wait")


def plan_case(case: Case, expect_errors: frozenset[int] = frozenset(), upto: int | None = None,
              tolerated: frozenset[int] = frozenset()) -> Plan:
    """The case as launches and tables. ``expect_errors``: indices of ops the reference engine fails as well;
    ``upto``: the op where the reported failure shows (later ops are left out); ``tolerated``: earlier ops that fail
    on the SUT too, which the script reports and goes past."""
    if case.training is not None:
        raise ReproUnsupported("a training case (its state is computed by the harness's training loop)")
    if case.fault is not None:
        raise ReproUnsupported(f"a {case.fault.kind} fault (the script cannot inject it yet)")
    phases: list[Phase] = []
    tables: dict[tuple[str, int], dict[int, dict[str, Piece]]] = {}
    fresh = True
    for index, op in enumerate(case.ops[: None if upto is None else upto + 1]):
        if op.kind == "restart":
            fresh = True
            continue
        if op.kind not in RANK_OPS:
            raise ReproUnsupported(f"op {index} is a {op.kind!r} (the script cannot do it yet)")
        if op.stall:
            raise ReproUnsupported(f"op {index} holds its writer (stall): the script cannot hold a writer yet")
        which = case.op_layouts(index)
        world = case.world_size(which)
        if fresh or phases[-1].world != world:
            phases.append(Phase(world))
            fresh = False
        table = None
        if op.kind in ("save", "load"):
            table = (which, op.version)
            if table not in tables:
                tables[table] = _table(case, which, op.version, world)
        phases[-1].steps.append(Step(index, op.kind, op.name, table, op.use_async, op.mutate_after, op.detach,
                                     index in expect_errors, index in tolerated))
    return Plan(case.sut, dict(case.options), phases, tables)


def _table(case: Case, which: str, version: int, world: int) -> dict[int, dict[str, Piece]]:
    state = case.expected(version, which)
    layouts = case.layouts(which)
    out: dict[int, dict[str, Piece]] = {}
    for rank in range(world):
        pieces = {}
        for name, lt in local_tensors(state, layouts, rank).items():
            pieces[name] = _piece(lt.tensor.dtype.name, lt.global_shape, lt.region, lt.tensor.bits,
                                  layouts.get(name))
        out[rank] = pieces
    return out


def _piece(dtype: str, gshape: tuple[int, ...], region, bits: np.ndarray, layout) -> Piece:
    hexbits = np.ascontiguousarray(bits).tobytes().hex()
    mesh: tuple[int, ...] | None = None
    placements: tuple[str, ...] = ()
    owner: tuple[tuple[int, int], ...] = ()
    if isinstance(layout, Sharded):
        mesh = tuple(layout.mesh.shape)
        placements = tuple(f"S{p.dim}" if isinstance(p, ShardPlacement) else "R" for p in layout.placements)
        owner = tuple((int(d), int(i)) for d, i in layout.owner)
    elif isinstance(layout, Flat):
        mesh = tuple(layout.mesh.shape)
    if isinstance(region, FlatRange):
        return Piece(dtype, tuple(gshape), None, tuple(bits.shape), (region.start, region.stop), hexbits, mesh)
    assert isinstance(region, Box)
    return Piece(dtype, tuple(gshape), tuple(region.offsets), tuple(region.shape), None, hexbits, mesh, placements,
                 owner)
