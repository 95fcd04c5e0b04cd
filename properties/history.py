"""The facts of a recorded history (step one of judging it, properties.atomic): which saves were issued, which
were acknowledged and when their fate was settled, the rotations, crashes and corruptions, and for every load what
the allowed outcomes were when it ran and which of them it gave (or that it failed, and how). No judging here:
every field is something that happened, or follows from what happened before that op.

A save is acknowledged when it returned (sync, or async and waited for; a fault case's faulted save only if the
fault report says it had returned), a detached async save when a later ``wait`` returned; until then it is
pending, and a ``kill``, a ``restart`` or a failed ``wait`` settles it unacknowledged. A SUT that rotates inside
every save (option ``keep_last``) counts as a ``rotate(keep_last)`` right after each save.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .anomalies import At, SutError, TensorDiffers
from .case import Case, Op
from .oracle import at, sut_error, tensor_differences
from .outcome import OpRecord, Outcome


@dataclass(frozen=True)
class Save:
    name: str | None
    version: int
    index: int  # the save op
    settled: int | None  # the op that decided its fate (the save itself unless detached); None while pending
    acked: bool = False

    def open_after(self, ack: Save) -> bool:
        """This save was still undecided when ``ack`` was issued, so it may have committed after it."""
        return self.settled is None or self.settled > ack.index


@dataclass(frozen=True)
class OpFacts:
    """A save, wait, kill, restart or rotate and how it ended."""

    at: At
    error: SutError | None  # None: it returned
    faulted: bool  # the fault case's fault was armed around this op
    after_corruption: bool  # a corruption had hit the root before it ran


@dataclass(frozen=True)
class TrainFacts:
    """A train op: how it ended, and how the state it reached differs from the uninterrupted run's."""

    at: At
    step: int
    error: SutError | None
    differences: tuple[TensorDiffers, ...] = ()


@dataclass(frozen=True)
class LoadFacts:
    """A load, with what it was allowed to give when it ran and what it gave."""

    at: At
    name: str | None  # None: "latest"
    error: SutError | None  # None: it gave a state
    ack: Save | None  # the newest save acknowledged under the name by then
    allowed: tuple[Save, ...]  # ack (if any), then every save still undecided when ack was issued
    newest_incomplete: bool  # "latest" in a fault case or behind an unacknowledged newer attempt
    corrupted: bool  # a corruption hit ack
    rotated: bool  # by name: a rotation after ack counted ``keep`` saves that may be newer than it
    lost_since_ack: bool  # a kill, restart or rotation ran after ack was settled
    matched: Save | None = None  # the allowed save whose state it gave bitwise
    came_back: Save | None = None  # else an older save (acknowledged, or any for "latest") whose state it gave
    closest: int | None = None  # else the version its state is compared against ...
    differences: tuple[TensorDiffers, ...] = ()  # ... and how it differs from it


Event = OpFacts | TrainFacts | LoadFacts


@dataclass(frozen=True)
class History:
    case: Case
    fault_op: int | None  # the fault case's faulted op (None: no fault)
    fault_kind: str | None
    saves: tuple[Save, ...]  # as they ended
    corrupted: tuple[int, ...]  # a corruption hit every save with index <= each of these
    events: tuple[Event, ...]  # in op order
    ran: int  # ops recorded
    total: int  # ops in the case

    def loads(self) -> list[LoadFacts]:
        return [e for e in self.events if isinstance(e, LoadFacts)]


@dataclass
class _Builder:
    """The history so far, while the recorded ops are read in order."""

    case: Case
    fault_op: int | None
    fault_kind: str | None
    saves: list[Save] = field(default_factory=list)
    corrupted: list[int] = field(default_factory=list)
    rotations: list[tuple[int, int]] = field(default_factory=list)  # (op index, keep)
    crashes: list[int] = field(default_factory=list)  # kill and restart op indices
    events: list[Event] = field(default_factory=list)

    def settle(self, index: int, acked: bool) -> None:
        self.saves = [dataclasses.replace(s, settled=index, acked=acked) if s.settled is None else s
                      for s in self.saves]

    def rotated_away(self, ack: Save) -> bool:
        """A rotation after ``ack`` was issued saw at least ``keep`` saves that may be newer than it."""
        return any(ack.index < at and sum(1 for s in self.saves if s is not ack and s.index < at and s.open_after(ack))
                   >= keep for at, keep in self.rotations)


def history(case: Case, outcome: Outcome) -> History:
    """The facts of ``outcome``'s records of ``case``'s ops."""
    fault = case.fault
    b = _Builder(case, None if fault is None else fault.op, None if fault is None else fault.kind)
    for op, rec in zip(case.ops, outcome.records):
        _read(b, op, rec, outcome.fault or {})
        if rec.index == b.fault_op and b.fault_kind == "corrupt":
            b.corrupted.append(rec.index)  # the fault corrupts the root after its op
    return History(case, b.fault_op, b.fault_kind, tuple(b.saves), tuple(b.corrupted), tuple(b.events),
                   len(outcome.records), len(case.ops))


def _read(b: _Builder, op: Op, rec: OpRecord, fault_report: dict) -> None:
    """Add one op's record to the history."""
    faulted = rec.index == b.fault_op
    error = None if rec.ok else sut_error(rec)
    if op.kind == "save":
        if op.detach and rec.ok:
            b.saves.append(Save(op.name, op.version, rec.index, None))
        else:
            acknowledged = rec.ok and (not faulted or fault_report.get("acknowledged", True))
            b.saves.append(Save(op.name, op.version, rec.index, rec.index, acknowledged))
            b.events.append(OpFacts(at(rec), error, faulted, bool(b.corrupted)))
        if b.case.options.get("keep_last"):  # the SUT's own rotation inside the save, which counts the save itself
            b.rotations.append((rec.index + 1, b.case.options["keep_last"]))
    elif op.kind in ("wait", "kill", "restart", "rotate"):
        if op.kind == "rotate":
            b.rotations.append((rec.index, op.keep))
        else:
            b.settle(rec.index, op.kind == "wait" and rec.ok)
        if op.kind in ("kill", "restart"):
            b.crashes.append(rec.index)
        b.events.append(OpFacts(at(rec), error, faulted, bool(b.corrupted)))
    elif op.kind == "corrupt":
        b.corrupted.append(rec.index - 1)  # every save issued before it may be damaged
    elif op.kind == "train":
        differences = () if error else tuple(tensor_differences(b.case, op.version, rec))
        b.events.append(TrainFacts(at(rec), op.version, error, differences))
    else:
        b.events.append(_load(b, op.name, rec))


def _load(b: _Builder, name: str | None, rec: OpRecord) -> LoadFacts:
    """What a load was allowed to give when it ran, and which of those it gave."""
    candidates = [s for s in b.saves if name is None or s.name == name]
    ack = max((s for s in candidates if s.acked), key=lambda s: s.index, default=None)
    undecided = [s for s in candidates if s is not ack and (ack is None or s.open_after(ack))]
    allowed = ([ack] if ack is not None else []) + undecided
    facts = LoadFacts(
        at(rec), name, None if rec.ok else sut_error(rec), ack, tuple(allowed),
        newest_incomplete=name is None and (b.fault_kind is not None or any(not s.acked for s in undecided)),
        corrupted=ack is not None and any(ack.index <= c for c in b.corrupted),
        rotated=name is not None and ack is not None and b.rotated_away(ack),
        lost_since_ack=ack is not None and any(i > (ack.settled or 0) for i in [*b.crashes, *dict(b.rotations)]))
    if not rec.ok or not allowed:
        return facts
    return _compare(b, facts, rec)


def _compare(b: _Builder, facts: LoadFacts, rec: OpRecord) -> LoadFacts:
    """Which allowed save the loaded state is; else which older save it is; else how it differs from the closest
    allowed version (the acknowledged one, or the newest attempt)."""
    case, ack = b.case, facts.ack
    matched = next((s for s in facts.allowed if not tensor_differences(case, s.version, rec)), None)
    if matched is not None:
        return dataclasses.replace(facts, matched=matched)
    # Older checkpoints: acknowledged ones, and for "latest" also attempts settled before the acknowledged save.
    older = [s for s in b.saves if (s.acked or facts.name is None) and s.index < ack.index and s not in facts.allowed] \
        if ack is not None else []
    came_back = next((s for s in older if not tensor_differences(case, s.version, rec)), None)
    if came_back is not None:
        return dataclasses.replace(facts, came_back=came_back)
    closest = ack.version if ack is not None else facts.allowed[-1].version
    return dataclasses.replace(facts, closest=closest,
                               differences=tuple(tensor_differences(case, closest, rec)))
