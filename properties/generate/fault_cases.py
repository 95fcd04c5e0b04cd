"""Fault cases: the standard fault scenario (``fault_ops``) over drawn tensors and layouts, with a fault drawn per
property (a faults.spec type; plain JSON in the case). Crash points and power-loss states are drawn as indices
that the harness resolves against a recording of the case itself, so shrinking moves towards the first crash point
and the first state.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from faults.corrupt import KINDS as CORRUPTIONS
from faults.corrupt import REGIONS
from faults.spec import CorruptFault, Fault, FsizeFault, KillWhenFault, PointFault, PowerFault, StallFault
from faults.strace import ERRNO_NAMES
from properties.generate.cases import Caps, _layouts_for, in_same_dir, mesh_of, options, tensor_cases
from properties.model.case import Case, Op

FAULT_OP = 1  # the save the fault hits in fault_ops
# Seconds a rank waits for its peers' part of a commit in a fault case: a peer the fault took away is waited for
# seconds, not the minute a healthy job allows (SUTs that wait for their peers' files read it; others ignore it).
COMMIT_TIMEOUT = 5


def fault_ops(*, latest: bool, use_async: bool = False, rotate: bool = False) -> tuple[Op, ...]:
    """Save version 0 (acknowledged); save version 1 (the fault hits it); then, after a restart, rotate down to one
    checkpoint first (``rotate``: a job that prunes what the crash left before it resumes), load the latest (where
    the SUT has one), version 1 and version 0 by name, save and load version 2."""
    return (
        Op("save", "step-0", 0),
        Op("save", "step-1", 1, use_async=use_async),
        *((Op("rotate", keep=1),) if rotate else ()),
        *((Op("load", None, 1),) if latest else ()),
        Op("load", "step-1", 1),
        Op("load", "step-0", 0),
        Op("save", "step-2", 2),
        Op("load", "step-2", 2),
    )


def has_latest(capabilities: Iterable[str], options: dict) -> bool:
    """Whether "load the latest" means something for this SUT and case (a same_dir SUT: only in same_dir mode)."""
    caps = set(capabilities)
    return "latest" in caps and ("same_dir" not in caps or bool(options.get("same_dir")))


def _psutil_trigger(draw) -> dict:
    return draw(st.one_of(
        st.builds(lambda d: {"delay": d}, st.sampled_from((0.0, 0.01, 0.05, 0.2))),
        st.builds(lambda b: {"bytes_written": b}, st.sampled_from((1, 256, 4096, 65536))),
    ))


@st.composite
def faults(draw, prop: str, ranks: int, use_async: bool, ptrace: bool, op: int = FAULT_OP) -> Fault:
    """One fault for ``prop`` on op ``op``; ``ptrace`` says whether strace may attach here (else the psutil
    fallbacks)."""
    rank = draw(st.integers(0, ranks - 1))
    if prop == "P-ATOMIC":
        if ptrace and draw(st.booleans()):
            return PowerFault(op=op, index=draw(st.integers(0, 400)))
        if ptrace:
            return PointFault(op=op, index=draw(st.integers(0, 400)))
        target = draw(st.sampled_from(("tree", "children") if use_async else ("tree",)))
        return KillWhenFault(op=op, rank=rank, target=target, **_psutil_trigger(draw))
    if prop == "P-NOLOSS":
        if ptrace and draw(st.booleans()):
            return PointFault(op=op, index=draw(st.integers(0, 400)), action=draw(st.sampled_from(ERRNO_NAMES)))
        if ptrace and draw(st.booleans()):
            return PointFault(op=op, index=draw(st.integers(0, 400)))
        return FsizeFault(op=op, limit=draw(st.sampled_from((1, 64, 1024, 16384))))
    if prop == "P-CORRUPT":
        return CorruptFault(op=op, seed=draw(st.integers(0, 2**16)), corruption=draw(st.sampled_from(CORRUPTIONS)),
                            region=draw(st.sampled_from(REGIONS)))
    if prop == "P-LIVENESS":
        if draw(st.booleans()):
            return StallFault(op=op, rank=rank, duration=draw(st.sampled_from((0.5, 1.0, 3.0))),
                              **_psutil_trigger(draw))
        target = draw(st.sampled_from(("tree", "children") if use_async else ("tree",)))
        return KillWhenFault(op=op, rank=rank, target=target, **_psutil_trigger(draw))
    raise ValueError(f"no fault strategy for property {prop!r}")


@st.composite
def fault_cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str] = (), ptrace: bool = True) -> Case:
    caps = Caps(capabilities)
    mesh = draw(mesh_of(ranks))
    tensors = draw(tensor_cases(caps, max_tensors=3, min_tensors=1))
    layout = draw(_layouts_for(tensors, mesh, caps))
    use_async = "async" in caps.caps and draw(st.booleans())
    fault = draw(faults(prop, ranks, use_async, ptrace))
    opts = draw(options(caps, rotation=True))
    if "same_dir" in caps.caps and draw(st.booleans()):  # versions of one directory: the SUT's own "latest"
        opts = in_same_dir(opts)
    latest = has_latest(caps.caps, opts)
    # P-LIVENESS judges what the survivors do: they get a little longer to turn a lost peer into an error
    opts["commit_timeout"] = 10 if prop == "P-LIVENESS" else COMMIT_TIMEOUT
    rotate = "rotate" in caps.caps and draw(st.booleans())
    return Case(prop, sut, tensors, layout, layout, fault_ops(latest=latest, use_async=use_async, rotate=rotate),
                opts, draw(st.integers(0, 2**16)), fault=fault)
