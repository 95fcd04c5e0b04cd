"""The property registry: one row per property id says everything the harness needs to know about it.

Its description (``ckpt-harness list``, docs/properties.md), which strategy draws its cases, which checker judges
them, the capability a SUT must claim, and whether it injects faults (and so needs ``fuzz --faults``). ``list``,
``fuzz``, the judge, the pytest property suite and the docs tests all read this table; ids are stable (reports and
case files use them), and its order is the catalogue's.

The strategy modules only draw; they do not import this module (it imports them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from hypothesis import strategies as st

from properties.generate.aoa_cases import aoa_cases
from properties.generate.cases import cases
from properties.generate.fault_cases import fault_cases
from properties.generate.layouts import world_sizes
from properties.generate.lifecycle import lifecycle_cases
from properties.generate.producer_cases import producer_cases
from properties.generate.training_cases import trainable, training_cases
from properties.model.case import Case, CaseError

NO_TRAINING_STATE = "SUT cannot hold a training state (needs F32, I64 and a parameter dtype)"
TRAINS_ITSELF = "SUT is a training job running its own loop: it is given training cases only"


class Checker(str, Enum):
    """Which checker judges a property's fault-free, single-job cases."""

    ORACLE = "oracle"  # properties.check.oracle.check_oracle: the loaded state against the reference's expectation
    DIFF = "diff"  # properties.check.oracle.check_diff: against the reference engine run on the same case
    HISTORY = "history"  # properties.check.history.check_history: every load against the history of saves


#: Draws one property's cases: (property id, sut, ranks, capabilities, faults on, ptrace available).
Strategy = Callable[[str, str, int, frozenset[str], bool, bool], st.SearchStrategy]


def _cases(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return cases(prop, sut, ranks, caps)


def _aoa(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return aoa_cases(prop, sut, ranks, caps)


def _model(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return producer_cases(prop, sut, ranks, caps)


def _cover(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    """Fixed tensors, and DP-MoE training states (ranks with ep > 0 save only their experts) where the SUT can hold
    one: replicas are where a lost or duplicated slice hides."""
    if "moe" in caps and trainable(caps):
        return st.one_of(cases(prop, sut, ranks, caps), training_cases(prop, sut, ranks, caps))
    return cases(prop, sut, ranks, caps)


def _training(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return training_cases(prop, sut, ranks, caps, with_faults=faults and REGISTRY[prop].crashes_with_faults,
                          ptrace=ptrace)


def _lifecycle(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return lifecycle_cases(prop, sut, ranks, caps, faults=faults and REGISTRY[prop].crashes_with_faults,
                           ptrace=ptrace)


def _faults(prop: str, sut: str, ranks: int, caps: frozenset[str], faults: bool, ptrace: bool) -> st.SearchStrategy:
    return fault_cases(prop, sut, ranks, caps, ptrace=ptrace)


@dataclass(frozen=True)
class PropertySpec:
    """One property: what ``list`` says of it, how its cases are drawn and judged, and what it needs."""

    id: str
    description: str
    strategy: Strategy
    checker: Checker = Checker.ORACLE
    # a capability the SUT must claim, else the property is skipped; ending in ":", any capability of that family
    requires: str | None = None
    fault: bool = False  # injects faults: runs only with ``fuzz --faults``, never by default without it
    training: bool = False  # draws training states: skipped where the SUT cannot hold one
    crashes_with_faults: bool = False  # ``--faults`` lets its (fault-free by default) cases crash a save too

    def skip_reason(self, capabilities: Iterable[str]) -> str | None:
        """Why a SUT with these capabilities cannot be given this property's cases (None: it can)."""
        caps = frozenset(capabilities)
        if self.requires is not None and self.requires.endswith(":"):
            if not any(c.startswith(self.requires) for c in caps):
                return f"SUT does not claim any {self.requires!r} capability"
        elif self.requires is not None and self.requires not in caps:
            return f"SUT does not claim {self.requires!r}"
        if self.training and not trainable(caps):
            return NO_TRAINING_STATE
        if "trains" in caps and not self.training:
            return TRAINS_ITSELF
        return None

    def drawable(self, capabilities: Iterable[str]) -> bool:
        return self.skip_reason(capabilities) is None


_SPECS = (
    PropertySpec(
        "P-ROUNDTRIP",
        "save then load, same layout: every tensor bitwise equal (dtype, shape, bytes)",
        _cases,
    ),
    PropertySpec(
        "P-RESHARD",
        "save under layout A, load under layout B (other mesh/placements/world size): bitwise equal",
        _cases, requires="reshard",
    ),
    PropertySpec(
        "P-EDGE",
        "empty state_dict, zero-size tensors, empty local shards, 0-d tensors, special bit patterns",
        _cases,
    ),
    PropertySpec(
        "P-COVER",
        "what was written covers each tensor exactly once (no lost or duplicated slices)",
        _cover,
    ),
    PropertySpec(
        "P-MOE",
        "expert tensors keep their global ids across EP/DP degree changes",
        _cases, requires="moe",
    ),
    PropertySpec(
        "P-FLAT",
        "flattened (stage-1 v2) slices round-trip and reshard to unflattened layouts and back",
        _cases, requires="flat",
    ),
    PropertySpec(
        "P-AOA",
        "a checkpoint stored in another model's structure (renamed, transposed, fused, in parts, widened) loads "
        "through an aoa_config into this model's layout: bitwise equal",
        _aoa, requires="aoa",
    ),
    PropertySpec(
        "P-MODEL",
        "a real model's and optimizer's state, as their sharded_state_dict gives it (tensor-parallel layers or "
        "sharding stage 1 V2's fused buffers, AdamW with master weights), saved and loaded into the same model on "
        "the same or another degree: each piece where the layout puts it, read back from the model and optimizer, "
        "bitwise equal",
        _model, requires="producer:",
    ),
    PropertySpec(
        "P-REPEAT",
        "repeated saves to one directory load the version asked for",
        _cases, requires="repeat",
    ),
    PropertySpec(
        "P-DIFF",
        "the SUT's loaded state equals the reference engine's for the same case",
        _cases, checker=Checker.DIFF,
    ),
    PropertySpec(
        "P-ASYNC-ISOLATION",
        "mutating tensors after async save returns does not change what is saved",
        _cases, requires="async",
    ),
    PropertySpec(
        "P-LIFECYCLE",
        "a job's whole life (saves sync, async and held, waits, kills, restarts onto another layout, re-saves into "
        "existing names, many versions, rotation, corruption, failed loads): every load keeps the history's rules",
        _lifecycle, checker=Checker.HISTORY, crashes_with_faults=True,
    ),
    PropertySpec(
        "P-ATOMIC",
        "a crash at any point of a save leaves the last acknowledged checkpoint or a newer complete one; what looks "
        "complete loads, anything else fails clearly",
        _faults, checker=Checker.HISTORY, fault=True,
    ),
    PropertySpec(
        "P-NOLOSS",
        "a crash during save or rotation never destroys the previous complete checkpoint, hides it from resuming "
        "(latest), or leaves the job without one",
        _faults, checker=Checker.HISTORY, fault=True,
    ),
    PropertySpec(
        "P-CORRUPT",
        "bit flips, truncation, deleted files, stale markers: a clear error, never silent wrong data",
        _faults, checker=Checker.HISTORY, fault=True,
    ),
    PropertySpec(
        "P-LIVENESS",
        "a killed rank or writer turns into an error within a bound, never a hang",
        _faults, checker=Checker.HISTORY, fault=True,
    ),
    PropertySpec(
        "P-EMA",
        "EMA buffers restore bitwise, also under reshard",
        _training, training=True,
    ),
    PropertySpec(
        "P-RESUME",
        "train, save, crash, resume == uninterrupted run, bitwise",
        _training, training=True, crashes_with_faults=True,
    ),
)
REGISTRY: dict[str, PropertySpec] = {spec.id: spec for spec in _SPECS}

FAULT_PROPERTIES = tuple(p for p, spec in REGISTRY.items() if spec.fault)


def default_properties(faults: bool) -> list[str]:
    """What ``fuzz`` runs without ``--property``: every fault-free property, then (with ``--faults``) the fault
    properties, each group in catalogue order."""
    return [p for p in REGISTRY if not REGISTRY[p].fault] + (list(FAULT_PROPERTIES) if faults else [])


def drawable_properties(capabilities: Iterable[str], faults: bool = False) -> list[str]:
    """The default properties that a SUT with these capabilities can be given, in ``fuzz``'s order."""
    caps = frozenset(capabilities)
    return [p for p in default_properties(faults) if REGISTRY[p].drawable(caps)]


def property_cases(prop: str, sut: str, ranks: int, capabilities: Iterable[str] = (), *, faults: bool = False,
                   ptrace: bool = True, worlds: str = "fixed") -> st.SearchStrategy:
    """Cases of ``prop``: the one entry point fuzzing and the pytest properties share. ``faults``: the campaign
    injects faults; ``ptrace``: strace may attach (else fault cases use the psutil fallbacks). ``worlds``:
    "fixed" saves on ``ranks`` ranks; "drawn" saves on a world drawn from 1..``ranks`` (odd sizes and primes
    favoured: virtual ranks reach sizes no machine here launches, and Paddle's splits break on uneven ones)."""
    if prop not in REGISTRY:
        raise ValueError(f"no strategy draws property {prop!r}")
    if worlds not in ("fixed", "drawn"):
        raise ValueError(f"worlds must be 'fixed' or 'drawn', not {worlds!r}")
    spec, caps = REGISTRY[prop], frozenset(capabilities)
    if worlds == "fixed":
        return spec.strategy(prop, sut, ranks, caps, faults, ptrace)
    return world_sizes(ranks).flatmap(lambda world: spec.strategy(prop, sut, world, caps, faults, ptrace))


def checker_for(case: Case) -> Checker:
    """A case with a fault, or one that lives a job's life (detached saves, kills, restarts, rotation), is judged
    against its history whatever its property; any other case by its property's checker."""
    if case.fault is not None or case.sequence:
        return Checker.HISTORY
    if case.property not in REGISTRY:
        raise CaseError(f"unknown property {case.property!r}; see `ckpt-harness list`")
    return REGISTRY[case.property].checker
