"""Reducing a finding past what Hypothesis managed: a smaller world first, then fewer ops.

Hypothesis shrinks a failing case within a time budget, and at 20-odd virtual ranks one run of a 30-op case costs
seconds: a bug met at scale often stays as drawn, too big to read and too big for real ranks to confirm
(harness.judging.fidelity.REAL_MAX). Most bugs do not need the scale they were met at. So a finding is tried again on
smaller meshes (every dimension capped at 1, 2, ...; one or two dimensions collapsed to 1; the smallest world
first), then without chunks of its ops (halves, quarters, ... single ops); a candidate is kept only where it fails
in the same bucket core, as Hypothesis keeps a shrunk case. Only what the case language states changes: mesh
shapes (placements, mesh dims and flat buffers stay; an owner index past a shrunk dim moves to its last index),
the explicit world sizes of empty layouts, and the op list.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import time
from collections.abc import Callable, Iterator

from harness.judging.fidelity import max_world
from properties.model.case import Case
from reference.aoa import AOA
from reference.layout import LayoutError

#: Judges a candidate: True when it fails in the finding's bucket core (harness.campaign.fuzz supplies it).
StillFails = Callable[[Case], bool]


def reduce_case(case: Case, still_fails: StillFails, deadline: float) -> Case:
    """The smallest case found before ``deadline`` (monotonic) that still fails the same way; ``case`` itself
    where none is."""
    for smaller in smaller_worlds(case):
        if time.monotonic() > deadline:
            return case
        if still_fails(smaller):
            case = smaller
            break
    return fewer_ops(case, still_fails, deadline)


def smaller_worlds(case: Case) -> Iterator[Case]:
    """``case`` on smaller meshes, the smallest largest world first: every mesh dimension capped at 1, 2, ...;
    one or two mesh dimensions (by index) collapsed to 1, the others kept (a bug of three ranks along one
    dimension needs that dimension whole)."""
    largest = max_world(case)
    dims = [d for data in (*case.save_layout.values(), *case.load_layout.values()) for d in data["mesh"]["shape"]]
    shapers: list[Callable[[list[int]], list[int]]] = [
        *(functools.partial(_cap, cap=cap) for cap in range(1, max(dims, default=1))),
        *(functools.partial(_collapse, dims=gone) for n in (1, 2) for gone in itertools.combinations(range(3), n))]
    candidates: dict[str, Case] = {}
    for shaper in shapers:
        candidate = reshaped(case, shaper)
        if candidate is not None and max_world(candidate) < largest:
            candidates.setdefault(json.dumps([candidate.save_layout, candidate.load_layout], sort_keys=True),
                                  candidate)
    yield from sorted(candidates.values(), key=max_world)


def capped(case: Case, cap: int) -> Case | None:
    """``case`` with every mesh dimension at most ``cap`` (None: the layouts it gives do not hold the tensors)."""
    return reshaped(case, functools.partial(_cap, cap=cap))


def reshaped(case: Case, shaper: Callable[[list[int]], list[int]]) -> Case | None:
    """``case`` with every mesh reshaped by ``shaper`` (no dimension larger than before); None where the layouts
    it gives do not hold the tensors, or meshes of one world no longer agree."""
    save = {name: _reshaped_layout(data, shaper) for name, data in case.save_layout.items()}
    load = {name: _reshaped_layout(data, shaper) for name, data in case.load_layout.items()}
    options = {key: shaper([value])[0] if key in ("save_world_size", "load_world_size") else value
               for key, value in case.options.items()}  # the world of empty layouts, as a 1-d mesh
    shapes = {t.name: tuple(t.shape) for t in case.tensors}
    try:
        smaller = dataclasses.replace(case, save_layout=save, load_layout=load, options=options)
        for which in ("save", "load"):
            layouts = smaller.layouts(which)
            if len({lay.mesh.world_size for lay in layouts.values()}) > 1:
                return None  # meshes of one world that reshaping gave different worlds: no longer one job
            for name, layout in layouts.items():
                for rank in range(layout.mesh.world_size if name in shapes else 0):
                    layout.local(shapes[name], rank)
        if AOA in options:
            smaller.check_aoa()  # a fusion's degree is the mesh's: a smaller one may not divide its heads
    except (LayoutError, ValueError):
        return None
    return smaller


def fewer_ops(case: Case, still_fails: StillFails, deadline: float) -> Case:
    """Drop chunks of ops (halves, then quarters, ... then single ops) while the case still fails the same way. A
    fault case keeps its ops: its fault names one by index."""
    if case.fault is not None:
        return case
    chunk = max(1, len(case.ops) // 2)
    while chunk >= 1:
        start = 0
        while start < len(case.ops) and len(case.ops) > 1:
            if time.monotonic() > deadline:
                return case
            ops = case.ops[:start] + case.ops[start + chunk:]
            candidate = dataclasses.replace(case, ops=ops) if ops else None
            if candidate is not None and still_fails(candidate):
                case = candidate  # the same start now names the ops after the dropped chunk
            else:
                start += chunk
        chunk //= 2
    return case


def _cap(shape: list[int], cap: int) -> list[int]:
    return [min(d, cap) for d in shape]


def _collapse(shape: list[int], dims: tuple[int, ...]) -> list[int]:
    return [1 if i in dims else d for i, d in enumerate(shape)]


def _reshaped_layout(data: dict, shaper: Callable[[list[int]], list[int]]) -> dict:
    shape = shaper(list(data["mesh"]["shape"]))
    out = {**data, "mesh": {**data["mesh"], "shape": shape}}
    if data.get("owner"):
        out["owner"] = [[dim, min(index, shape[dim] - 1)] for dim, index in data["owner"]]
    return out
