"""Which strategy draws a property's cases: the one entry point fuzzing and the pytest properties share."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from .case_strategies import CASE_PROPERTIES, cases
from .fault_strategies import FAULT_PROPERTIES, fault_cases
from .training_strategies import TRAINING_PROPERTIES, trainable, training_cases


def drawable(prop: str, capabilities: Iterable[str]) -> bool:
    """Whether cases of ``prop`` can be drawn for a SUT with these capabilities at all."""
    return prop not in TRAINING_PROPERTIES or trainable(capabilities)


def property_cases(prop: str, sut: str, ranks: int, capabilities: Iterable[str] = (), *, faults: bool = False,
                   ptrace: bool = True) -> st.SearchStrategy:
    """Cases of ``prop``. ``faults``: the campaign injects faults, so P-RESUME may also crash a save. P-COVER also
    draws DP-MoE training states (ranks with ep > 0 save only their experts) where the SUT can hold one."""
    caps = frozenset(capabilities)
    if prop in FAULT_PROPERTIES:
        return fault_cases(prop, sut, ranks, caps, ptrace=ptrace)
    if prop in TRAINING_PROPERTIES:
        return training_cases(prop, sut, ranks, caps, with_faults=faults, ptrace=ptrace)
    if prop not in CASE_PROPERTIES:
        raise ValueError(f"no strategy draws property {prop!r}")
    if prop == "P-COVER" and "moe" in caps and trainable(caps):
        return st.one_of(cases(prop, sut, ranks, caps), training_cases(prop, sut, ranks, caps))
    return cases(prop, sut, ranks, caps)
