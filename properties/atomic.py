"""P-ATOMIC, P-NOLOSS, P-CORRUPT and P-LIVENESS over a recorded history (pure: the harness loads).

One rule, from the user's side: a checkpoint the system acknowledged must load back bitwise; one it did not
acknowledge may load back complete or fail clearly; nothing may ever load as a mix.

The history is a fault case (one fault armed around one op) or a sequence (properties.case: detached saves,
``wait``, ``kill``, ``restart``, ``rotate``, ``corrupt``), or both. A save is acknowledged when it returned (sync,
or async and waited for), a detached async save when a later ``wait`` returned; until then it is pending, and a
``kill``, a ``restart`` or a failed ``wait`` leaves it unacknowledged (it may have committed, or not). A load gives
the newest acknowledged save (the one issued last) or any save whose fate was still open when that one was issued
(a newer attempt, or a concurrent pending save); an older acknowledged one is data loss. Where it may fail clearly:
nothing acknowledged yet; "latest" in a fault case or behind an unacknowledged newer attempt (the newest checkpoint
is incomplete); a checkpoint saved before a ``corrupt`` (which must still never load wrong data); a name that a
``rotate`` may have deleted, i.e. ``keep`` other saves may be newer — never the newest acknowledged one itself.
A SUT that rotates inside every save (option ``keep_last``, as a Trainer's ``save_total_limit``) is judged as if
each save were followed by ``rotate(keep_last)`` counting that save, finished or not. Where a rotation excuses a
named acknowledged checkpoint that no longer loads, some newer save it counted must load: if every one of them was
tried by name and failed, the rotation deleted the last complete checkpoint for an incomplete one (P-NOLOSS).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from .case import Case
from .judge import mismatch
from .outcome import OpRecord, Outcome
from .verdicts import Judgement, Verdict, worst

KILLS = ("kill", "kill-when", "point")  # faults whose whole point is that a process dies


@dataclass(eq=False)
class _Save:
    name: str | None
    version: int
    index: int  # the save op
    settled: int | None  # the op that decided its fate (the save itself unless detached); None while pending
    acked: bool = False


@dataclass
class _History:
    case: Case
    fault_op: int | None  # the fault case's faulted op (None: no fault)
    kind: str | None  # the fault's kind
    saves: list[_Save] = field(default_factory=list)
    corrupted: list[int] = field(default_factory=list)  # a corruption hit every save with index <= each of these
    rotations: list[tuple[int, int]] = field(default_factory=list)  # (op index, keep)
    crashes: list[int] = field(default_factory=list)  # kill and restart op indices
    loaded: set[int] = field(default_factory=set)  # op indices of saves some load gave back bitwise
    failed_names: set[str] = field(default_factory=set)  # names whose load by name failed
    rotation_excused: list[tuple[_Save, str]] = field(default_factory=list)  # (lost save, where) a rotation excused

    def pending(self) -> list[_Save]:
        return [s for s in self.saves if s.settled is None]

    def rotated_away(self, ack: _Save) -> bool:
        """A rotation after ``ack`` was issued saw at least ``keep`` saves that may be newer than it."""
        return any(ack.index < at and sum(1 for s in self.saves if s is not ack and s.index < at and _open(s, ack))
                   >= keep for at, keep in self.rotations)

    def lost_property(self, name: str | None, ack: _Save | None, corrupted: bool, loss: bool = False) -> str:
        """The property a failed load breaks (``loss``: the verdict is data loss)."""
        if self.kind == "corrupt" or corrupted:
            return "P-CORRUPT"
        if ack is not None and self.fault_op is not None and name is not None and ack.index < self.fault_op:
            return "P-NOLOSS"  # named, acknowledged before the fault
        if loss and ack is not None and any(at > (ack.settled or 0) for at in [*self.crashes, *dict(self.rotations)]):
            return "P-NOLOSS"  # acknowledged, then lost to a crash or a rotation
        return self.case.property

    def nothing_left(self) -> Judgement | None:
        """A rotation excused losing an acknowledged checkpoint, yet every newer save it could have counted was
        tried by name and none loaded: the rotation deleted the last complete checkpoint (P-NOLOSS)."""
        if self.corrupted:
            return None  # a corruption may explain the newer failures
        for lost, where in self.rotation_excused:
            newer = [s for s in self.saves if s.index > lost.index and _open(s, lost)]
            if newer and all(s.name in self.failed_names and s.index not in self.loaded for s in newer):
                return Judgement("P-NOLOSS", Verdict.DATA_LOSS, (
                    f"{where}: acknowledged version {lost.version} (op {lost.index}) was rotated away, and no newer "
                    f"checkpoint loads either ({', '.join(str(s.name) for s in newer)}): the rotation deleted the last "
                    "complete checkpoint while its successor was incomplete",))
        return None


def _open(save: _Save, ack: _Save) -> bool:
    """``save`` was still undecided when ``ack`` was issued, so it may have committed after it."""
    return save.settled is None or save.settled > ack.index


def judge_history(case: Case, outcome: Outcome, clear_errors: Collection[str] | None = None) -> Judgement:
    """Judge a fault case's or a sequence's ops in order. ``clear_errors`` names the exception types that count
    as a clear "incomplete/corrupt checkpoint" error (None: any exception the SUT raises counts, for SUTs without
    typed errors); anything else a load raises about an unacknowledged or corrupted checkpoint is a loud failure."""
    fault_op = case.fault.op if case.fault is not None else None
    h = _History(case, fault_op, case.fault.kind if case.fault is not None else None)
    keep_last = case.options.get("keep_last")
    fault_report = outcome.fault or {}
    results: list[Judgement | None] = []
    for op, rec in zip(case.ops, outcome.records):
        where = f"op {rec.index} ({rec.kind} {rec.name or 'latest'})"
        faulted = rec.index == fault_op
        if op.kind == "save":
            if op.detach and rec.ok:
                h.saves.append(_Save(op.name, op.version, rec.index, None))
            else:
                acknowledged = rec.ok and (not faulted or fault_report.get("acknowledged", True))
                h.saves.append(_Save(op.name, op.version, rec.index, rec.index, acknowledged))
                if not acknowledged:
                    results.append(_failed_op(h, rec, where, faulted, clear_errors))
            if keep_last:  # the SUT's own rotation inside the save, which counts the save itself
                h.rotations.append((rec.index + 1, keep_last))
        elif op.kind in ("wait", "kill", "restart"):
            for save in h.pending():
                save.settled, save.acked = rec.index, op.kind == "wait" and rec.ok
            if op.kind != "wait":
                h.crashes.append(rec.index)
            results.append(_failed_op(h, rec, where, faulted, clear_errors))
        elif op.kind == "rotate":
            h.rotations.append((rec.index, op.keep))
            results.append(_failed_op(h, rec, where, faulted, clear_errors))
        elif op.kind == "corrupt":
            h.corrupted.append(rec.index - 1)  # every save issued before it may be damaged
        elif op.kind == "train":
            results.append(_judge_train(case, op.version, rec, where))
        else:
            results.append(_judge_load(h, op.name, rec, where, clear_errors))
        if faulted and h.kind == "corrupt":
            h.corrupted.append(rec.index)  # the fault corrupts the root after its op
    results.append(h.nothing_left())
    if len(outcome.records) < len(case.ops):
        results.append(Judgement(case.property, Verdict.CRASH,
                                 (f"only {len(outcome.records)} of {len(case.ops)} ops ran",)))
    return worst([r for r in results if r is not None]) or Judgement(case.property, Verdict.PASS)


def _failed_op(h: _History, rec: OpRecord, where: str, faulted: bool,
               clear_errors: Collection[str] | None) -> Judgement | None:
    """A save, wait, kill or rotate that did not succeed."""
    if rec.ok:
        return None
    error = f"{where}: {rec.error_type}: {rec.error}"
    if rec.failure == "hang":
        return Judgement("P-LIVENESS", Verdict.HANG, (error,))
    if h.kind is not None:  # a fault case
        if not faulted:
            return Judgement(h.case.property, Verdict.CRASH if rec.failure else Verdict.LOUD_FAILURE,
                             (f"after the fault: {error}",))
        if rec.failure == "crash" and h.kind not in KILLS:
            return Judgement("P-LIVENESS", Verdict.CRASH,
                             (f"a {h.kind} fault killed a rank instead of an error: {error}",))
        return None  # the fault made the save fail: that is allowed, what later loads see is judged
    if rec.failure:
        return Judgement(h.case.property, Verdict.CRASH, (error,))
    if h.corrupted and (clear_errors is None or rec.error_type in clear_errors):
        return None  # refusing to go on, clearly, over a damaged root is allowed
    return Judgement(h.case.property, Verdict.LOUD_FAILURE, (error,))


def _judge_train(case: Case, step: int, rec: OpRecord, where: str) -> Judgement | None:
    """Training resumes from whatever the loads gave (or from the seeds where nothing loaded), and the loop is
    deterministic, so every train must reach the uninterrupted run's state bitwise (P-RESUME)."""
    if not rec.ok:
        verdict = {"hang": Verdict.HANG, "crash": Verdict.CRASH}.get(rec.failure or "", Verdict.LOUD_FAILURE)
        return Judgement(case.property, verdict, (f"{where}: {rec.error_type}: {rec.error}",))
    problems = mismatch(case, step, rec)
    if not problems:
        return None
    return Judgement(case.property, Verdict.SILENT_CORRUPTION,
                     (f"{where}: the resumed run differs from the uninterrupted run at step {step}:", *problems[:8]))


def _judge_load(h: _History, name: str | None, rec: OpRecord, where: str,
                clear_errors: Collection[str] | None) -> Judgement | None:
    case = h.case
    if not rec.ok and rec.failure:
        verdict = Verdict.HANG if rec.failure == "hang" else Verdict.CRASH
        return Judgement("P-LIVENESS", verdict, (f"{where}: {rec.error}",))
    candidates = [s for s in h.saves if name is None or s.name == name]
    ack = max((s for s in candidates if s.acked), key=lambda s: s.index, default=None)
    undecided = [s for s in candidates if s is not ack and (ack is None or _open(s, ack))]
    allowed = ([ack] if ack is not None else []) + undecided
    corrupted = ack is not None and any(ack.index <= at for at in h.corrupted)
    lost_prop, loss_prop = h.lost_property(name, ack, corrupted), h.lost_property(name, ack, corrupted, loss=True)
    if not rec.ok:
        clear = clear_errors is None or rec.error_type in clear_errors
        error = f"{where}: {rec.error_type}: {rec.error}"
        incomplete_latest = name is None and (h.kind is not None or any(not s.acked for s in undecided))
        rotated = name is not None and ack is not None and h.rotated_away(ack)
        if name is not None:
            h.failed_names.add(name)
        if rotated and not (corrupted or incomplete_latest):
            h.rotation_excused.append((ack, where))
        if ack is not None and not (corrupted or incomplete_latest or rotated):
            if h.fault_op is not None and ack.index > h.fault_op:
                return Judgement(case.property, Verdict.LOUD_FAILURE, (f"the save after the fault does not load: "
                                                                       f"{error}",))
            return Judgement(loss_prop, Verdict.DATA_LOSS, (f"acknowledged version {ack.version} (op {ack.index}) "
                                                           f"no longer loads: {error}",))
        if clear:
            return None
        return Judgement(lost_prop, Verdict.LOUD_FAILURE, (f"unclear error about an incomplete or damaged "
                                                           f"checkpoint: {error}",))
    for save in allowed:
        if not mismatch(case, save.version, rec):
            h.loaded.add(save.index)
            return None
    if not allowed:
        return Judgement(case.property, Verdict.SILENT_CORRUPTION,
                         (f"{where}: loaded data although no checkpoint was ever acknowledged or attempted",))
    versions = [s.version for s in allowed]
    closest = ack.version if ack is not None else versions[-1]
    # Older checkpoints: acknowledged ones, and for "latest" also attempts settled before the acknowledged save.
    older = [s for s in h.saves if (s.acked or name is None) and s.index < ack.index and s not in allowed] \
        if ack is not None else []
    came_back = next((s for s in older if not mismatch(case, s.version, rec)), None)
    if came_back is not None and not corrupted:
        return Judgement(loss_prop, Verdict.DATA_LOSS, (f"{where}: an older checkpoint came back instead of "
                                                       f"acknowledged version {ack.version} (op {ack.index})",))
    if came_back is not None:  # the corruption redirected the load: wrong data, however genuine its bits
        return Judgement(lost_prop, Verdict.SILENT_CORRUPTION,
                         (f"{where}: after a corruption, the older version {came_back.version} (op {came_back.index}) "
                          f"loaded silently instead of acknowledged version {ack.version} (op {ack.index})",))
    return Judgement(lost_prop, Verdict.SILENT_CORRUPTION,
                     (f"{where}: loaded state is none of versions {versions} (diff against version {closest}):",
                      *mismatch(case, closest, rec)[:8]))
