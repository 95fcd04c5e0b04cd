"""The facts of a recorded history (step one of judging it, properties.check.history): which saves were issued, which
were acknowledged and when their fate was settled, the rotations, crashes and corruptions, and for every load what
the allowed outcomes were when it ran and which of them it gave (or that it failed, and how). No judging here:
every field is something that happened, or follows from what happened before that op.

A save is acknowledged when it returned (sync, or async and waited for; a fault case's faulted save only if the
fault report says it had returned), a detached async save when a later ``wait`` returned; until then it is
pending, and a ``kill``, a ``restart`` or a failed ``wait`` settles it unacknowledged. A SUT that rotates inside
every save (option ``keep_last``) counts as a ``rotate(keep_last)`` right after each save.

After every op the harness records which checkpoints the SUT itself presents as finished (``OpRecord.complete``:
its commit marker, done file, metadata or index, read the way its own "latest" reads them); the history keeps
those listings, and each load knows whether its checkpoint was listed just before it ran.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from properties.check.anomalies import At, SutError, TensorDiffers
from properties.check.oracle import at, sut_error, tensor_differences
from properties.model.case import Case, Op
from properties.model.outcome import OpRecord, Outcome
from reference.tensor import differences


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
    newest_incomplete: bool  # "latest" in a fault case or behind an unacknowledged newer attempt; by name, while a
    # save of that name is still in flight (a re-save may rewrite the name in place: a clear error is then allowed)
    corrupted: bool  # a corruption hit ack
    rotated: bool  # by name: a rotation after ack counted ``keep`` saves that may be newer than it
    lost_since_ack: bool  # a kill, restart or rotation ran after ack was settled
    listed: bool = False  # by name: the SUT listed this name as finished after the op before the load
    after_crash: bool = False  # a kill, a restart or the fault case's faulted op (then the job restarts) ran before
    after_corruption: bool = False  # a corruption hit the root before the load
    intact: int | None = None  # "latest": an op showing ack intact then (listed just before, or loaded by name)
    given_before: tuple[int, ...] = ()  # versions earlier loads of the same job (since its last crash) gave
    failed_before: bool = False  # an earlier load of the same job (since its last crash) failed
    repeats_failure: int | None = None  # ... of another checkpoint, with exactly this error: that load's op
    # nothing allowed, yet it gave a state: that of a version an earlier load of the same job gave (a cache)
    repeats_given: bool = False
    matched: Save | None = None  # the allowed save whose state it gave bitwise
    came_back: Save | None = None  # else an older save (acknowledged, or any for "latest") whose state it gave
    closest: int | None = None  # else the version its state is compared against ...
    differences: tuple[TensorDiffers, ...] = ()  # ... and how it differs from it
    repeats_load: int | None = None  # ... and the op of an earlier load of the job that gave exactly this state


Event = OpFacts | TrainFacts | LoadFacts
QUIET = ("load", "train", "kill", "restart")  # ops that neither write nor delete a checkpoint


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
    listings: tuple[tuple[str, ...] | None, ...] = ()  # per recorded op: the names the SUT listed finished after it

    def loads(self) -> list[LoadFacts]:
        return [e for e in self.events if isinstance(e, LoadFacts)]

    def first_acknowledged(self) -> Save | None:
        """The save whose acknowledgement came first: from its settling op on, the job has had a checkpoint."""
        return min((s for s in self.saves if s.acked), key=lambda s: s.settled or 0, default=None)

    def newest_acknowledged_by(self, index: int) -> Save | None:
        """The newest save acknowledged by op ``index`` (the one a job resuming after that op must get back)."""
        return max((s for s in self.saves if s.acked and (s.settled or 0) <= index), key=lambda s: s.index,
                   default=None)

    def corrupted_by(self, index: int) -> bool:
        """A corruption may have hit the root by the end of op ``index``."""
        return any(c <= index for c in self.corrupted)

    def quiet(self, first: int, last: int) -> bool:
        """No op strictly between ops ``first`` and ``last`` could have written or deleted a checkpoint (only
        loads, trains, kills and restarts ran), so what one of them saw on disk the other saw too."""
        lo, hi = sorted((first, last))
        return all(op.kind in QUIET for op in self.case.ops[lo + 1:hi])  # a rotation is a rotate op or a save


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
    listings: list[tuple[str, ...] | None] = field(default_factory=list)  # per op read so far
    given: list[int] = field(default_factory=list)  # versions the loads since the job's last crash gave
    loads: list[OpRecord] = field(default_factory=list)  # the loads since the job's last crash that gave a state
    failed_loads: list[LoadFacts] = field(default_factory=list)  # the loads since the job's last crash that failed

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
        b.listings.append(rec.complete)
    h = History(case, b.fault_op, b.fault_kind, tuple(b.saves), tuple(b.corrupted), tuple(b.events),
                len(outcome.records), len(case.ops), tuple(b.listings))
    return dataclasses.replace(h, events=tuple(_with_intact(h, e) for e in h.events))


def _read(b: _Builder, op: Op, rec: OpRecord, fault_report: dict) -> None:
    """Add one op's record to the history (an op after which the harness replaced the ranks ends as a restart)."""
    _read_op(b, op, rec, fault_report)
    if rec.restarted:
        b.settle(rec.index, False)
        b.crashes.append(rec.index)
    if rec.restarted or op.kind == "restart" or rec.index == b.fault_op:
        b.given.clear()  # a new process: nothing it read before can come back from a cache
        b.loads.clear()
        b.failed_loads.clear()  # ... nor can what a failed load left in one


def _read_op(b: _Builder, op: Op, rec: OpRecord, fault_report: dict) -> None:
    faulted = rec.index == b.fault_op
    error = None if rec.ok else sut_error(rec)
    if op.kind == "save":
        if op.detach and rec.ok:
            b.saves.append(Save(op.name, op.version, rec.index, None))
        else:
            acknowledged = rec.ok and (not faulted or fault_report.get("acknowledged", True))
            b.saves.append(Save(op.name, op.version, rec.index, rec.index, acknowledged))
            b.events.append(OpFacts(at(b.case, rec), error, faulted, bool(b.corrupted)))
        if b.case.options.get("keep_last"):  # the SUT's own rotation inside the save, which counts the save itself
            b.rotations.append((rec.index + 1, b.case.options["keep_last"]))
    elif op.kind in ("wait", "kill", "restart", "rotate"):
        if op.kind == "rotate":
            b.rotations.append((rec.index, op.keep))
        else:
            b.settle(rec.index, op.kind == "wait" and rec.ok)
        if op.kind in ("kill", "restart"):
            b.crashes.append(rec.index)
        b.events.append(OpFacts(at(b.case, rec), error, faulted, bool(b.corrupted)))
    elif op.kind == "resume":  # held writers go on: the saves they write stay pending until a wait settles them
        b.events.append(OpFacts(at(b.case, rec), error, faulted, bool(b.corrupted)))
    elif op.kind == "corrupt":
        b.corrupted.append(rec.index - 1)  # every save issued before it may be damaged
    elif op.kind == "train":
        differences = () if error else tuple(tensor_differences(b.case, op.version, rec))
        b.events.append(TrainFacts(at(b.case, rec), op.version, error, differences))
    else:
        b.events.append(_load(b, op.name, rec))


def _load(b: _Builder, name: str | None, rec: OpRecord) -> LoadFacts:
    """What a load was allowed to give when it ran, and which of those it gave."""
    candidates = [s for s in b.saves if name is None or s.name == name]
    # "latest" is the newest save, except where the SUT resolves it by version (versions of one directory,
    # options["same_dir"]: the highest unique_id): a job that restarted from an older step and saved it again
    # resumes from the highest version still there, as the case's own model expects.
    by_version = name is None and bool(b.case.options.get("same_dir"))
    newest = (lambda s: (s.version, s.index)) if by_version else (lambda s: s.index)
    ack = max((s for s in candidates if s.acked), key=newest, default=None)
    undecided = [s for s in candidates if s is not ack and (ack is None or s.open_after(ack))
                 and not (by_version and ack is not None and s.version < ack.version)]
    allowed = ([ack] if ack is not None else []) + undecided
    facts = LoadFacts(
        at(b.case, rec), name, None if rec.ok else sut_error(rec), ack, tuple(allowed),
        newest_incomplete=(b.fault_kind is not None or any(not s.acked for s in undecided)) if name is None
        else any(s.settled is None for s in undecided),
        corrupted=ack is not None and any(ack.index <= c for c in b.corrupted),
        rotated=name is not None and ack is not None and b.rotated_away(ack),
        lost_since_ack=ack is not None and any(i > (ack.settled or 0) for i in [*b.crashes, *dict(b.rotations)]),
        listed=name is not None and name in _last_listing(b),
        after_crash=bool(b.crashes) or (b.fault_op is not None and b.fault_op < rec.index),
        after_corruption=bool(b.corrupted), given_before=tuple(b.given), failed_before=bool(b.failed_loads))
    if rec.ok and not allowed:
        return dataclasses.replace(facts, repeats_given=any(
            not tensor_differences(b.case, version, rec) for version in sorted(set(b.given))))
    if not rec.ok:
        repeats = next((e.at.op for e in reversed(b.failed_loads) if e.error == facts.error
                        and (e.name, e.ack and e.ack.version) != (name, ack and ack.version)), None)
        b.failed_loads.append(facts)
        return dataclasses.replace(facts, repeats_failure=repeats)
    facts = _compare(b, facts, rec)
    b.loads.append(rec)
    gave = facts.matched or facts.came_back
    if gave is not None:
        b.given.append(gave.version)
    return facts


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
    repeats = next((earlier.index for earlier in reversed(b.loads) if same_state(earlier, rec)), None)
    return dataclasses.replace(facts, closest=closest, differences=tuple(tensor_differences(case, closest, rec)),
                               repeats_load=repeats)


def same_state(a: OpRecord, b: OpRecord) -> bool:
    """Two loads gave every rank the same tensors, bit for bit (the same pieces: loads under other layouts do not)."""
    return a.loaded.keys() == b.loaded.keys() and not any(
        differences(dict(a.loaded[rank]), dict(b.loaded[rank])) for rank in a.loaded)


def _last_listing(b: _Builder) -> tuple[str, ...]:
    """The names the SUT listed as finished after the op before this one (none where it cannot tell)."""
    return (b.listings[-1] if b.listings else None) or ()


def _with_intact(h: History, e: Event) -> Event:
    """A "latest" load, with the op that shows its acknowledged checkpoint intact when it ran: the SUT listed it as
    finished just before, or a load by name gave it bitwise with nothing in between that writes or deletes."""
    if not isinstance(e, LoadFacts) or e.name is not None or e.ack is None:
        return e
    ack, op = e.ack, e.at.op
    if op > 0 and ack.name in (h.listings[op - 1] or ()):
        return dataclasses.replace(e, intact=op - 1)
    shown = next((x.at.op for x in h.loads() if x.name == ack.name and x.matched is not None
                  and x.matched.index == ack.index and h.quiet(x.at.op, op)),
                 None)
    return dataclasses.replace(e, intact=shown)
