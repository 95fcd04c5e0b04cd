"""P-ATOMIC, P-NOLOSS, P-CORRUPT and P-LIVENESS over a recorded history (pure: the harness loads).

One rule, from the user's side: a checkpoint the system acknowledged must load back bitwise; one it did not
acknowledge may load back complete or fail clearly; nothing may ever load as a mix.

The history is a fault case (one fault armed around one op) or a sequence (properties.model.case: detached saves,
``wait``, ``kill``, ``restart``, ``rotate``, ``corrupt``), or both. A save is acknowledged when it returned (sync,
or async and waited for), a detached async save when a later ``wait`` returned; until then it is pending, and a
``kill``, a ``restart`` or a failed ``wait`` leaves it unacknowledged (it may have committed, or not). A load gives
the newest acknowledged save (the one issued last) or any save whose fate was still open when that one was issued
(a newer attempt, or a concurrent pending save); an older acknowledged one is data loss. Where it may fail clearly:
nothing acknowledged yet; "latest" in a fault case or behind an unacknowledged newer attempt (the newest checkpoint
is incomplete); a name while a save of it is still in flight (a re-save may rewrite it in place); a checkpoint
saved before a ``corrupt`` (which must still never load wrong data); a name that a ``rotate`` may have deleted,
i.e. ``keep`` other saves may be newer — never the newest acknowledged one itself.
A SUT that rotates inside every save (option ``keep_last``, as a Trainer's ``save_total_limit``) is judged as if
each save were followed by ``rotate(keep_last)`` counting that save, finished or not. Where a rotation excuses a
named acknowledged checkpoint that no longer loads, some newer save it counted must load: if every one of them was
tried by name and failed, the rotation deleted the last complete checkpoint for an incomplete one (P-NOLOSS).

Three rules a training job would sign hold over the whole history, beyond what each load was allowed to give:
- *resume never lost*: after a crash, kill, restart or power loss (a fault case restarts the job after its fault),
  "latest" must give the last acknowledged checkpoint or a newer complete one; an incomplete newer attempt excuses a
  failure only while nothing shows the acknowledged one intact (listed as finished just before, or loaded by name
  with nothing in between that writes or deletes), and a corruption excuses it always (P-NOLOSS);
- *never without a complete checkpoint*: from the first acknowledgement on, no op may leave the job with none —
  the SUT lists none as finished, or a rotation left only checkpoints that then fail by name — and a later save
  does not excuse the gap (P-NOLOSS);
- *looks complete, is complete*: a checkpoint the SUT itself listed as finished (``OpRecord.complete``, from the
  adapter's ``complete``) just before a load of it must load, acknowledged or not (P-ATOMIC).

Judging takes three steps: the facts of the history (properties.check.facts), the anomalies they show by the rules
below (properties.check.anomalies: typed, with the ops they cite and the property each breaks), and the judgement, the
worst of them rendered as text (properties.model.verdicts.worst).
"""

from __future__ import annotations

from collections.abc import Collection

from properties.check.anomalies import (
    AcknowledgedLost,
    Anomaly,
    At,
    CorruptionRedirected,
    FailedAfterFault,
    FaultKilledRank,
    ListedIncomplete,
    LoadedNoVersion,
    LoadedUnsaved,
    LoadStopped,
    NoCompleteCheckpoint,
    OlderCameBack,
    OpFailed,
    OpsMissing,
    RankDied,
    RankHung,
    ResumedRunDiffers,
    ResumeLost,
    RotationDeletedLast,
    SaveAfterFaultLost,
    SutError,
    UnclearError,
    judged,
    op_failure,
)
from properties.check.facts import Event, History, LoadFacts, OpFacts, Save, TrainFacts, history
from properties.model.case import Case
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement, Verdict, worst

KILLS = ("kill", "kill-when", "point")  # faults whose whole point is that a process dies


def check_history(case: Case, outcome: Outcome, clear_errors: Collection[str] | None = None) -> Judgement:
    """Judge a fault case's or a sequence's ops in order. ``clear_errors`` names the exception types that count
    as a clear "incomplete/corrupt checkpoint" error (None: any exception the SUT raises counts, for SUTs without
    typed errors); anything else a load raises about an unacknowledged or corrupted checkpoint is a loud failure."""
    found = anomalies(history(case, outcome), clear_errors)
    return worst([judged([a]) for a in found]) or Judgement(case.property, Verdict.PASS)


def anomalies(h: History, clear_errors: Collection[str] | None) -> list[Anomaly]:
    """Every anomaly of the history, in op order, then those of the history as a whole."""
    found = [_event(h, e, clear_errors) for e in h.events]
    found += [rotation_deleted_last(h), never_without_complete(h)]
    found = [a for a in found if a is not None]
    missing = ops_missing(h)  # a run stops early after a hang or a dead rank: then that is the anomaly, not this
    return found if found or missing is None else [missing]


def _event(h: History, e: Event, clear_errors: Collection[str] | None) -> Anomaly | None:
    if isinstance(e, LoadFacts):
        return load_anomaly(h, e, clear_errors)
    if isinstance(e, TrainFacts):
        return train_anomaly(h, e)
    return op_anomaly(h, e, clear_errors)


def _clear(error: SutError, clear_errors: Collection[str] | None) -> bool:
    return clear_errors is None or error.error_type in clear_errors


# --- saves, waits, kills, restarts, rotations ---------------------------------------------------------------------


def op_anomaly(h: History, e: OpFacts, clear_errors: Collection[str] | None) -> Anomaly | None:
    """A save, wait, kill, restart or rotate that failed. A hang is always P-LIVENESS. In a fault case the faulted
    op may fail (what later loads see is judged), but only a killing fault may kill a rank, and every later op must
    work. Any other failure is one too, except a clear refusal to go on over a corrupted root."""
    if e.error is None:
        return None
    if e.error.failure == "hang":
        return RankHung("P-LIVENESS", e.at, e.error)
    prop = h.case.property
    after_fault = h.fault_op is not None and e.at.op > h.fault_op
    if e.faulted:
        if e.error.failure == "crash" and h.fault_kind not in KILLS:
            return FaultKilledRank("P-LIVENESS", e.at, e.error, h.fault_kind)
        return None
    if after_fault and e.error.failure:
        return FailedAfterFault(prop, e.at, e.error)
    if e.error.failure:
        return RankDied(prop, e.at, e.error)
    if e.after_corruption and _clear(e.error, clear_errors):
        return None
    return FailedAfterFault(prop, e.at, e.error) if after_fault else OpFailed(prop, e.at, e.error)


def train_anomaly(h: History, e: TrainFacts) -> Anomaly | None:
    """Training resumes from whatever the loads gave (or from the seeds where nothing loaded), and the loop is
    deterministic, so every train must reach the uninterrupted run's state bitwise (P-RESUME)."""
    if e.error is not None:
        return op_failure(h.case.property, e.at, e.error)
    if e.differences:
        return ResumedRunDiffers(h.case.property, e.at, e.step, e.differences)
    return None


# --- loads --------------------------------------------------------------------------------------------------------


def load_anomaly(h: History, load: LoadFacts, clear_errors: Collection[str] | None) -> Anomaly | None:
    """A load that hung or died (P-LIVENESS), failed, or gave a state none of its allowed saves hold."""
    if load.error is not None and load.error.failure:
        return LoadStopped("P-LIVENESS", load.at, load.error)
    if load.error is not None:
        return failed_load(h, load, clear_errors)
    return wrong_state(h, load)


def excused(load: LoadFacts) -> bool:
    """The acknowledged checkpoint may fail to load: a corruption hit it, "latest" may name an incomplete newer
    one, or a rotation may have deleted it."""
    return load.corrupted or load.newest_incomplete or load.rotated


def failed_load(h: History, load: LoadFacts, clear_errors: Collection[str] | None) -> Anomaly | None:
    """An acknowledged checkpoint must load unless excused (a fault case's recovery save that does not load is a
    loud failure, an older one lost is data loss); any other failure must be a clear error."""
    assert load.error is not None
    ack = load.ack
    if ack is not None and not excused(load):
        resaved = _resaved(h, ack)
        facts = (load.at, load.error, ack.version, ack.index, resaved, load.failed_before, load.repeats_failure)
        if h.fault_op is not None and ack.index > h.fault_op:
            return SaveAfterFaultLost(h.case.property, *facts)
        return AcknowledgedLost(broken_property(h, load, loss=True), *facts)
    lost = resume_lost(load) or listed_incomplete(load)
    if lost is not None:
        return lost
    if _clear(load.error, clear_errors):
        return None
    return UnclearError(broken_property(h, load), load.at, load.error)


def _resaved(h: History, ack: Save) -> str | None:
    """Whether an earlier save of the job wrote ``ack``'s name, and under the same layouts or others."""
    earlier = [s for s in h.saves if s.name == ack.name and s.index < ack.index]
    if not earlier:
        return None
    mine = h.case.layouts(h.case.op_layouts(ack.index))
    same = all(h.case.layouts(h.case.op_layouts(s.index)) == mine for s in earlier)
    return "same-layout" if same else "other-layout"


def resume_lost(load: LoadFacts) -> ResumeLost | None:
    """Rule "resume never lost": after a crash, kill, restart or power loss, resuming as the SUT's users resume
    ("latest") must give the last acknowledged checkpoint or a newer complete one. An incomplete newer attempt
    does not excuse a clear error while the acknowledged one sits intact on disk (listed as finished, or loaded by
    name): the job would stop, or start over, with its checkpoint right there (P-NOLOSS). Only where nothing was
    acknowledged or a corruption may have hit it may latest fail."""
    if load.name is not None or load.ack is None or not load.after_crash or load.after_corruption \
            or load.intact is None:
        return None
    assert load.error is not None
    ack = load.ack
    return ResumeLost("P-NOLOSS", load.at, load.error, ack.version, ack.index, ack.name, load.intact)


def listed_incomplete(load: LoadFacts) -> ListedIncomplete | None:
    """Rule "looks complete, is complete": a checkpoint the SUT itself listed as finished just before the load
    (its marker, done file, metadata or index) must load, acknowledged or not — a user, a resume selector or a
    rotation takes it for a checkpoint. Unless a corruption may have hit it, failing is a partial checkpoint made
    visible (data loss, P-ATOMIC)."""
    if not load.listed or load.after_corruption:
        return None
    assert load.error is not None
    return ListedIncomplete("P-ATOMIC", load.at, load.error, load.at.op - 1)


def wrong_state(h: History, load: LoadFacts) -> Anomaly | None:
    """A state must be one an allowed save holds: never data where nothing was saved, never an older
    checkpoint (data loss; wrong data where a corruption redirected the load), never a mix."""
    if load.matched is not None:
        return None
    if not load.allowed:
        return LoadedUnsaved(h.case.property, load.at, load.repeats_given)
    ack, older = load.ack, load.came_back
    if older is not None and ack is not None:
        cls = CorruptionRedirected if load.corrupted else OlderCameBack
        return cls(broken_property(h, load, loss=not load.corrupted), load.at, ack.version, ack.index, older.version,
                   older.index, load.name, older.version in load.given_before)
    assert load.closest is not None
    return LoadedNoVersion(broken_property(h, load), load.at, tuple(s.version for s in load.allowed), load.closest,
                           load.differences, load.repeats_load)


# --- which property a load's anomaly breaks -----------------------------------------------------------------------


def damaged(h: History, load: LoadFacts) -> bool:
    """Rule "damaged": the case corrupts its root, or a corruption hit the acknowledged save (P-CORRUPT)."""
    return h.fault_kind == "corrupt" or load.corrupted


def acknowledged_before_fault(h: History, load: LoadFacts) -> bool:
    """Rule "acknowledged before the fault": loaded by name, acknowledged before the faulted op (P-NOLOSS)."""
    return load.ack is not None and h.fault_op is not None and load.name is not None and load.ack.index < h.fault_op


def lost_to_crash_or_rotation(h: History, load: LoadFacts) -> bool:
    """Rule "lost to a crash or a rotation" (data loss only): a kill, a restart or a rotation ran after the
    acknowledged save was settled (P-NOLOSS)."""
    return load.lost_since_ack


PROPERTY_RULES = (  # (rule, property, only where the verdict is data loss); the first that applies wins
    (damaged, "P-CORRUPT", False),
    (acknowledged_before_fault, "P-NOLOSS", False),
    (lost_to_crash_or_rotation, "P-NOLOSS", True),
)


def broken_property(h: History, load: LoadFacts, loss: bool = False) -> str:
    """The property a load's anomaly breaks (``loss``: its verdict is data loss): the first rule that applies,
    else the case's own property."""
    return next((prop for rule, prop, loss_only in PROPERTY_RULES if (loss or not loss_only) and rule(h, load)),
                h.case.property)


# --- the history as a whole ---------------------------------------------------------------------------------------


def rotation_deleted_last(h: History) -> Anomaly | None:
    """A rotation excused losing an acknowledged checkpoint, yet every newer save it could have counted was
    tried by name and none loaded: the rotation deleted the last complete checkpoint (P-NOLOSS). A corruption
    anywhere may explain the newer failures, so then this is not judged."""
    if h.corrupted:
        return None
    loads = h.loads()
    failed = {x.name for x in loads if x.name is not None and x.error is not None and not x.error.failure}
    loaded = {x.matched.index for x in loads if x.matched is not None}
    for load in loads:
        lost = load.ack
        if lost is None or load.error is None or load.error.failure or not load.rotated or load.corrupted \
                or load.newest_incomplete:
            continue
        newer = [s for s in h.saves if s.index > lost.index and s.open_after(lost)]
        if newer and all(s.name in failed and s.index not in loaded for s in newer):
            return RotationDeletedLast("P-NOLOSS", load.at, lost.version, lost.index, tuple(s.name for s in newer))
    return None


def never_without_complete(h: History) -> NoCompleteCheckpoint | None:
    """Rule "never without a complete checkpoint": once a save has been acknowledged, no op (a rotation, a crash,
    a later save) may leave the job with no complete checkpoint, and a later save does not excuse the gap: a
    crash inside it would have lost the job (P-NOLOSS). The first op after which the SUT lists none as finished,
    or a rotation after which every checkpoint saved before it fails to load. From a corruption on, damage may
    explain a gap, so none is judged."""
    first = h.first_acknowledged()
    if first is None or first.settled is None:
        return None
    for index in range(first.settled, h.ran):
        if h.corrupted_by(index):
            return None
        gone = _gap(h, index)
        if gone is not None:
            ack = h.newest_acknowledged_by(index)
            assert ack is not None
            op = h.case.ops[index]
            where = At(index, op.kind, op.name, h.case.op_world(index), h.case.tensor_kinds(), h.case.storage_format(),
                       h.case.op_api(index))
            return NoCompleteCheckpoint("P-NOLOSS", where, ack.version, ack.index, gone)
    return None


def _gap(h: History, index: int) -> tuple[str | None, ...] | None:
    """How op ``index`` left the job without a complete checkpoint: () when the SUT listed none as finished after
    it; the names saved up to it when the op rotated and each of them then failed every load by name with
    nothing in between that writes or deletes a checkpoint; None when the history does not show a gap."""
    if h.listings[index] == ():
        return ()
    op = h.case.ops[index]
    if op.kind != "rotate" and not (op.kind == "save" and h.case.options.get("keep_last")):
        return None
    names = sorted({s.name for s in h.saves if s.index <= index}, key=str)
    return tuple(names) if names and all(_gone_after(h, n, index) for n in names) else None


def _gone_after(h: History, name: str | None, index: int) -> bool:
    """Checkpoint ``name`` was tried by name after op ``index``, with only loads, trains, kills and restarts in
    between, and every such load failed with an error (not a hang or a dead rank)."""
    tried = [x for x in h.loads() if x.name == name and x.at.op > index and h.quiet(index, x.at.op)]
    return bool(tried) and all(x.error is not None and not x.error.failure for x in tried)


def ops_missing(h: History) -> Anomaly | None:
    """Every op of the case must have run."""
    return OpsMissing(h.case.property, h.ran, h.total) if h.ran < h.total else None
