"""Anomalies: what a judge found wrong, as typed facts (the op, the SUT's own error, versions, bits), each with the
property it breaks and its verdict. A judgement's detail lines are rendered from them, and known findings match
their types and fields (properties.triage.known), so rewording a message never changes which failures are recognised.

``kind`` names a type for good (kebab-case, used in regression files); ``render`` gives the detail line users read
(``lines`` where an anomaly explains itself over several); ``to_json`` gives flat fields for matching.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from properties.model.verdicts import Judgement, Verdict
from reference.tensor import Difference

# --- the facts anomalies cite -------------------------------------------------------------------------------------


SHOWN = 8  # difference lines rendered under a wrong state or a resumed run that differs (all are kept, for judges)


@dataclass(frozen=True)
class At:
    """The op an anomaly is about, as its record names it, with the job it ran in: the number of ranks (None: a
    harness op), the tensor kinds its case asks of the SUT (empty: the SUT's default), the file format (None:
    the SUT's default) and the API the op called where the case chose one (``api``: a load's ``load_api``). A bug
    that lives in one world size, one kind of tensor, one format or one API is recognised by them, whichever
    property met it."""

    op: int
    kind: str
    name: str | None
    world: int | None = None
    tensor_kinds: tuple[str, ...] = ()
    format: str | None = None
    api: str | None = None

    def render(self) -> str:
        return f"op {self.op} ({self.kind} {self.name or 'latest'})"


@dataclass(frozen=True)
class SutError:
    """What a failed op said: the SUT's exception type and message, or the harness's "hang"/"crash" (``failure``)
    when a rank stopped answering or died."""

    error_type: str | None
    message: str | None
    failure: str | None = None

    def render(self) -> str:
        return f"{self.error_type}: {self.message}"


def _prefix(at: At | None) -> str:
    return f"{at.render()}: " if at is not None else ""


# --- the anomaly types --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Anomaly:
    """Base: the property broken; subclasses add the facts they cite and say how they read."""

    property: str

    kind: ClassVar[str] = ""
    verdict_is: ClassVar[Verdict] = Verdict.SILENT_CORRUPTION

    @property
    def verdict(self) -> Verdict:
        return self.verdict_is

    def render(self) -> str:
        raise NotImplementedError

    def lines(self) -> tuple[str, ...]:
        return (self.render(),)

    def fields(self) -> dict[str, Any]:
        """Flat JSON values: an op as op/op_kind/name, an error as error_type/message/failure, a tensor difference
        as its own fields, nested anomalies as lists of their JSON."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            _flatten(out, f.name, getattr(self, f.name))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"anomaly": self.kind, "verdict": self.verdict.value, **self.fields()}


@dataclass(frozen=True)
class _OpError(Anomaly):
    """An op that failed: where and what the SUT (or the harness, for a hang or a crash) said."""

    at: At | None
    error: SutError

    def render(self) -> str:
        return f"{_prefix(self.at)}{self.error.render()}"


@dataclass(frozen=True)
class _OpFailure(_OpError):
    """``after_failed_load``: the op is a load, and an earlier load of the same processes (no restart between)
    failed, so what that one left in them (a module-global cache) may be what broke this one."""

    after_failed_load: bool = False


@dataclass(frozen=True)
class OpFailed(_OpFailure):
    kind = "op-failed"
    verdict_is = Verdict.LOUD_FAILURE


@dataclass(frozen=True)
class RankHung(_OpFailure):
    kind = "rank-hung"
    verdict_is = Verdict.HANG


@dataclass(frozen=True)
class RankDied(_OpFailure):
    kind = "rank-died"
    verdict_is = Verdict.CRASH


def op_failure(prop: str, at: At | None, error: SutError, after_failed_load: bool = False) -> _OpError:
    """The anomaly of a failed op by how it failed: a hang, a dead rank, or an error the SUT raised."""
    cls = {"hang": RankHung, "crash": RankDied}.get(error.failure or "", OpFailed)
    return cls(prop, at, error, after_failed_load)


@dataclass(frozen=True)
class FailedAfterFault(_OpError):
    """A fault case's op after the faulted one failed: the job must recover."""

    kind = "failed-after-fault"

    @property
    def verdict(self) -> Verdict:
        return Verdict.CRASH if self.error.failure else Verdict.LOUD_FAILURE

    def render(self) -> str:
        return f"after the fault: {super().render()}"


@dataclass(frozen=True)
class FaultKilledRank(_OpError):
    """A fault meant to make an op fail (an IO error, a stall, ...) killed a rank instead."""

    fault: str
    kind = "fault-killed-rank"
    verdict_is = Verdict.CRASH

    def render(self) -> str:
        return f"a {self.fault} fault killed a rank instead of an error: {super().render()}"


@dataclass(frozen=True)
class LoadStopped(_OpError):
    """A load whose rank hung or died (the history checker names it by the harness's message alone)."""

    kind = "load-stopped"

    @property
    def verdict(self) -> Verdict:
        return Verdict.HANG if self.error.failure == "hang" else Verdict.CRASH

    def render(self) -> str:
        return f"{_prefix(self.at)}{self.error.message}"


@dataclass(frozen=True)
class _LostSave(_OpError):
    """A load of an acknowledged save (``version``, saved by op ``save_op``) that failed. ``resaved``: whether an
    earlier save of the job (acknowledged or not, before a restart or not) wrote the same name — None, or
    "same-layout" / "other-layout" (an earlier one ran under other layouts than this save's), so what that attempt
    left on disk may be what broke it; ``after_failed_load``: an earlier load of the same processes failed, so what
    it left in them (a module-global cache) may be what broke this one."""

    version: int
    save_op: int
    resaved: str | None = None
    after_failed_load: bool = False
    repeats_failure: int | None = None  # the op of an earlier load of the same processes, of another checkpoint,
    # that failed with exactly this error: a cache that keeps serving what that load read


@dataclass(frozen=True)
class SaveAfterFaultLost(_LostSave):
    kind = "save-after-fault-lost"
    verdict_is = Verdict.LOUD_FAILURE

    def render(self) -> str:
        return f"the save after the fault does not load: {super().render()}"


@dataclass(frozen=True)
class AcknowledgedLost(_LostSave):
    kind = "acknowledged-lost"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        return f"acknowledged version {self.version} (op {self.save_op}) no longer loads: {super().render()}"


@dataclass(frozen=True)
class UnclearError(_OpError):
    """A load of an unacknowledged or damaged checkpoint failed, but not with one of the SUT's clear errors."""

    kind = "unclear-error"
    verdict_is = Verdict.LOUD_FAILURE

    def render(self) -> str:
        return f"unclear error about an incomplete or damaged checkpoint: {super().render()}"


@dataclass(frozen=True)
class LoadedUnsaved(Anomaly):
    """A load gave data although nothing was ever acknowledged or attempted under its name. ``loaded_before``: the
    data is a version an earlier load of the same job (no restart between) gave, as a process-level cache that
    ignores the name would give it."""

    at: At
    loaded_before: bool = False
    kind = "loaded-unsaved"

    def render(self) -> str:
        return f"{self.at.render()}: loaded data although no checkpoint was ever acknowledged or attempted"


@dataclass(frozen=True)
class OlderCameBack(Anomaly):
    """A load gave an older checkpoint (``older_version`` of op ``older_op``) instead of the acknowledged one."""

    at: At
    version: int
    save_op: int
    older_version: int
    older_op: int
    name: str | None = None  # the load's: None for "latest"
    loaded_before: bool = False  # an earlier load of the same job (no crash or restart between) gave that version
    kind = "older-came-back"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        return (f"{self.at.render()}: an older checkpoint came back instead of acknowledged version {self.version} "
                f"(op {self.save_op})")


@dataclass(frozen=True)
class CorruptionRedirected(OlderCameBack):
    """After a corruption, the load gave an older checkpoint: wrong data, however genuine its bits."""

    kind = "corruption-redirected"
    verdict_is = Verdict.SILENT_CORRUPTION

    def render(self) -> str:
        return (f"{self.at.render()}: after a corruption, the older version {self.older_version} (op "
                f"{self.older_op}) loaded silently instead of acknowledged version {self.version} (op {self.save_op})")


@dataclass(frozen=True)
class TensorDiffers(Anomaly):
    """One tensor of one rank differs from what it must be (``against`` the oracle's "expected" state, or what the
    "reference" engine's run gave). ``layout``: the kind of the tensor's layout in the op ("sharded", "flat", or
    "flat-unaligned": saved flat in pieces not all n-d boxes, properties.check.oracle.op_layout_kind; None: none, or not
    known), so a bug of flattened slices is recognised whichever property met it. ``state_from``: in a train op, the
    load whose state the rank trained on (properties.model.case.Case.state_source), so a difference that load's known
    bug
    set off is recognised as that bug's (properties.triage.known)."""

    at: At | None
    rank: int | None
    difference: Difference
    against: str = "expected"
    layout: str | None = None
    state_from: int | None = None
    kind = "tensor-differs"

    def render(self) -> str:
        head = ", ".join(p for p in (self.at.render() if self.at else "",
                                     f"rank {self.rank}" if self.rank is not None else "") if p)
        head += " vs reference" if self.against == "reference" else ""
        return f"{head}: {self.difference.render()}" if head else self.difference.render()


@dataclass(frozen=True)
class LoadedNoVersion(Anomaly):
    """A load gave a state that is none of the allowed ``versions`` (a mix, or garbage); the differences are against
    version ``closest`` (all of them; the first SHOWN are rendered). ``repeats_load``: the op of an earlier load of
    the same processes (no restart between) that gave every rank exactly this state — a cache that served that
    load's state again, whatever was wrong with it."""

    at: At
    versions: tuple[int, ...]
    closest: int
    differences: tuple[TensorDiffers, ...]
    repeats_load: int | None = None
    kind = "loaded-none-of-versions"

    def render(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> tuple[str, ...]:
        again = f", the state op {self.repeats_load} gave" if self.repeats_load is not None else ""
        return (f"{self.at.render()}: loaded state is none of versions {list(self.versions)}{again} (diff against "
                f"version {self.closest}):", *(d.render() for d in self.differences[:SHOWN]))


@dataclass(frozen=True)
class WrongVersion(Anomaly):
    """A load gave another saved version, whole and bitwise (``got`` instead of ``version``): a resolver that picks
    the wrong version, a cache keyed without it, a pointer that moved. ``newest``: ``got`` is the newest version
    saved before the load; ``loaded_before``: an earlier load of the same job (no restart between) asked for
    ``got``. The differences against ``version`` follow (the first eight lines)."""

    at: At
    version: int
    got: int
    newest: bool
    loaded_before: bool
    differences: tuple[TensorDiffers, ...]
    kind = "wrong-version"

    def render(self) -> str:
        return "\n".join(self.lines())

    @property
    def relation(self) -> str:
        """How the version it gave relates to the job: the newest saved, else one an earlier load read, else an
        older one. The newest comes first: a load that always gives the newest reads as one bug whether or not an
        earlier load happened to read the newest too (the ``loaded_before`` fact stays, for signatures)."""
        return "newest" if self.newest else "loaded-before" if self.loaded_before else "older"

    def lines(self) -> tuple[str, ...]:
        why = {"loaded-before": ", which an earlier load of this job read", "newest": ", the newest saved",
               "older": ""}[self.relation]
        return (f"{self.at.render()}: gave version {self.got} whole{why}, instead of version {self.version}:",
                *(d.render() for d in self.differences))


@dataclass(frozen=True)
class ResumedRunDiffers(Anomaly):
    """A resumed training run's state at ``step`` differs from the uninterrupted run's (all the differences; the
    first SHOWN are rendered)."""

    at: At
    step: int
    differences: tuple[TensorDiffers, ...]
    kind = "resumed-run-differs"

    def render(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> tuple[str, ...]:
        return (f"{self.at.render()}: the resumed run differs from the uninterrupted run at step {self.step}:",
                *(d.render() for d in self.differences[:SHOWN]))


@dataclass(frozen=True)
class RotationDeletedLast(Anomaly):
    """A rotation excused losing acknowledged ``version`` (op ``save_op``; the load at ``at`` failed), but every
    newer save it counted (``newer``, by name) failed to load too."""

    at: At
    version: int
    save_op: int
    newer: tuple[str | None, ...]
    kind = "rotation-deleted-last"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        return (f"{self.at.render()}: acknowledged version {self.version} (op {self.save_op}) was rotated away, and no "
                f"newer checkpoint loads either ({', '.join(str(n) for n in self.newer)}): the rotation deleted the "
                "last complete checkpoint while its successor was incomplete")


@dataclass(frozen=True)
class ResumeLost(_OpError):
    """After a crash, resuming as the SUT's users resume ("latest") failed although acknowledged ``version`` (op
    ``save_op``, checkpoint ``checkpoint``) was intact: op ``intact_op`` shows it (listed as finished, or loaded
    by name bitwise with nothing in between)."""

    version: int
    save_op: int
    checkpoint: str | None
    intact_op: int
    kind = "resume-lost"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        return (f"{_prefix(self.at)}resume lost: latest fails although acknowledged version {self.version} "
                f"({self.checkpoint}, op {self.save_op}) is intact (op {self.intact_op}): {self.error.render()}")


@dataclass(frozen=True)
class ListedIncomplete(_OpError):
    """A checkpoint the SUT itself listed as finished (after op ``listed_op``) does not load: it looks complete
    but is not (acknowledged or not)."""

    listed_op: int
    kind = "listed-incomplete"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        name = self.at.name if self.at is not None else None
        return (f"{_prefix(self.at)}the SUT lists {name} as complete (after op {self.listed_op}) but it does not "
                f"load: {self.error.render()}")


@dataclass(frozen=True)
class NoCompleteCheckpoint(Anomaly):
    """After op ``at`` the job had no complete checkpoint although version ``version`` (op ``save_op``) had been
    acknowledged: the SUT listed none as finished (``gone`` empty), or every checkpoint saved before then
    (``gone``, by name) failed to load afterwards with nothing in between that writes or deletes one."""

    at: At
    version: int
    save_op: int
    gone: tuple[str | None, ...]
    kind = "no-complete-checkpoint"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        how = (f"none of {', '.join(str(n) for n in self.gone)} loads afterwards" if self.gone
               else "the SUT lists no finished checkpoint")
        return (f"{self.at.render()}: the job is left without a complete checkpoint although version "
                f"{self.version} (op {self.save_op}) was acknowledged: {how}")


@dataclass(frozen=True)
class PersistenceOrder(Anomaly):
    """A save's recorded IO breaks the durability contract (faults/persistence.py), whether or not a power-loss state
    the model enumerates separates the writes involved: a record (index, metadata, ``latest``) vouching for data that
    is not durable yet, or a save acknowledged before all it wrote is durable. ``record`` and ``path`` are the files'
    names with their digits masked (the bucket's); ``calls`` quotes the offending calls; ``more``: further
    violations of the same rule in that save."""

    at: At
    rule: str  # record-before-data, not-durable-at-return
    record: str
    path: str
    why: str
    calls: tuple[str, ...]
    more: int = 0
    kind = "persistence-order"
    verdict_is = Verdict.DATA_LOSS

    def render(self) -> str:
        what = (f"{self.record} vouches for {self.path} before it is durable" if self.rule == "record-before-data"
                else f"{self.path} is not durable when the save returns")
        more = f" (and {self.more} more)" if self.more else ""
        return (f"{self.at.render()}: a power loss may lose it: {what} ({self.why}){more}: "
                + "; ".join(self.calls))


@dataclass(frozen=True)
class CoverViolated(Anomaly):
    """What a save wrote does not cover a tensor exactly once (``error_type``: MissingSlices, OverlappingSlices,
    SliceOutOfRange)."""

    at: At | None
    tensor: str
    error_type: str
    message: str
    kind = "cover-violated"

    def render(self) -> str:
        return f"{_prefix(self.at)}{self.message}"


@dataclass(frozen=True)
class ReadPlanViolated(Anomaly):
    """A load's read plan — what each rank reads from which saved piece, as the SUT planned it — does not fill one
    of the rank's target pieces exactly once, or reads outside every piece that was saved. Found from the plan
    alone, so it holds even where the bits happen to come out right (two sources of equal data)."""

    at: At | None
    rank: int
    tensor: str
    error_type: str  # MissingSlices, OverlappingSlices, SliceOutOfRange, UnsavedSource
    message: str
    kind = "read-plan-violated"

    def render(self) -> str:
        return f"{_prefix(self.at)}rank {self.rank}: {self.message}"


@dataclass(frozen=True)
class OutcomeDiffers(Anomaly):
    """The SUT and the reference engine disagree on whether an op succeeded (None: it did)."""

    at: At
    sut: SutError | None
    reference: SutError | None
    kind = "outcome-differs-from-reference"

    @property
    def verdict(self) -> Verdict:
        return Verdict.LOUD_FAILURE if self.sut is not None else Verdict.SILENT_CORRUPTION

    def render(self) -> str:
        said = self.sut.render() if self.sut is not None else "succeeded"
        theirs = self.reference.render() if self.reference is not None else "succeeded"
        return f"{self.at.render()}: SUT {said}; reference {theirs}"


@dataclass(frozen=True)
class OpsMissing(Anomaly):
    """Fewer ops ran than the case has: the run stopped early."""

    ran: int
    total: int
    kind = "ops-missing"
    verdict_is = Verdict.CRASH

    def render(self) -> str:
        return f"only {self.ran} of {self.total} ops ran"


TYPES: dict[str, type[Anomaly]] = {cls.kind: cls for cls in (
    OpFailed, RankHung, RankDied, FailedAfterFault, FaultKilledRank, LoadStopped, SaveAfterFaultLost,
    AcknowledgedLost, UnclearError, LoadedUnsaved, OlderCameBack, CorruptionRedirected, TensorDiffers,
    LoadedNoVersion, WrongVersion, ResumedRunDiffers, RotationDeletedLast, ResumeLost, ListedIncomplete,
    NoCompleteCheckpoint, CoverViolated, ReadPlanViolated, OutcomeDiffers, OpsMissing, PersistenceOrder)}


def cited_error(anomaly: Anomaly) -> SutError | None:
    """The SUT's error (or the harness's "crash"/"hang") the anomaly quotes, if it quotes one."""
    if isinstance(anomaly, _OpError):
        return anomaly.error
    return anomaly.sut if isinstance(anomaly, OutcomeDiffers) else None


def cites_sut_error(anomaly: Anomaly) -> bool:
    """The anomaly quotes an error the SUT raised (or a hang or death of its ranks): the error names the bug, and
    which rule it broke — a failed op, an acknowledged checkpoint lost, a listed one that does not load, a resume
    lost — says only where in the job's life it struck."""
    return cited_error(anomaly) is not None


def ranks_stopped(anomalies: Sequence[Anomaly]) -> bool:
    """The failure is only that ranks died or hung (no data the SUT got wrong): such a failure may come from the
    machine or the runtime's own races, so a fuzzing judge runs the case once more before it stands."""
    def stopped(a: Anomaly) -> bool:
        error = cited_error(a)
        return error is not None and error.failure in ("crash", "hang")
    return any(stopped(a) for a in anomalies) and all(stopped(a) or isinstance(a, OpsMissing) for a in anomalies)


#: The anomaly types that quote the SUT's error (``cites_sut_error``).
ERROR_KINDS = frozenset(k for k, cls in TYPES.items() if issubclass(cls, (_OpError, OutcomeDiffers)))


# --- judgements from anomalies ------------------------------------------------------------------------------------


def judged(anomalies: Sequence[Anomaly]) -> Judgement:
    """The judgement these anomalies make (they agree on property and verdict): their lines are its details."""
    first = anomalies[0]
    if any((a.property, a.verdict) != (first.property, first.verdict) for a in anomalies):
        raise ValueError("anomalies of one judgement must agree on property and verdict")
    return Judgement(first.property, first.verdict, tuple(line for a in anomalies for line in a.lines()),
                     tuple(anomalies))


# --- JSON ---------------------------------------------------------------------------------------------------------


def _error_prefix(name: str) -> str:
    """The SUT's own error has the same flat fields (error_type, message, failure) in every anomaly that cites
    it, whether an op failed or the SUT disagreed with the reference; the reference engine's are prefixed."""
    return "reference_" if name == "reference" else ""


def _flatten(out: dict[str, Any], name: str, value: Any) -> None:
    if name == "at":
        out.update(op=value.op if value else None, op_kind=value.kind if value else None,
                   name=value.name if value else None, world=value.world if value else None,
                   tensor_kinds=list(value.tensor_kinds) if value else [], format=value.format if value else None)
        if value and value.api is not None:  # only where the case chose one: records from before read the same
            out["api"] = value.api
    elif name in ("error", "sut", "reference"):
        prefix = _error_prefix(name)
        for key in ("error_type", "message", "failure"):
            out[prefix + key] = getattr(value, key) if value is not None else None
    elif name == "difference":
        out.update(value.fields())
    elif name == "differences":
        out[name] = [d.to_json() for d in value]
    else:
        out[name] = list(value) if isinstance(value, tuple) else value


def from_json(data: dict[str, Any]) -> Anomaly:
    """The anomaly ``to_json`` gave (round trip)."""
    cls = TYPES[data["anomaly"]]
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "at":
            # world, tensor_kinds, format, api: absent from anomalies written before they were recorded
            kwargs[f.name] = At(data["op"], data["op_kind"], data["name"], data.get("world"),
                                tuple(data.get("tensor_kinds", ())), data.get("format"), data.get("api")) \
                if data["op"] is not None else None
        elif f.name in ("error", "sut", "reference"):
            prefix = _error_prefix(f.name)
            parts = [data[prefix + k] for k in ("error_type", "message", "failure")]
            kwargs[f.name] = None if parts == [None, None, None] else SutError(*parts)
        elif f.name == "difference":
            kwargs[f.name] = _difference(data)
        elif f.name == "differences":
            kwargs[f.name] = tuple(from_json(d) for d in data[f.name])
        elif f.name not in data and f.default is not dataclasses.MISSING:
            continue  # a field recorded since (TensorDiffers.layout): its default
        else:
            kwargs[f.name] = tuple(data[f.name]) if isinstance(data[f.name], list) else data[f.name]
    return cls(**kwargs)


def _difference(data: dict[str, Any]) -> Difference:
    cls = next(c for c in _subclasses(Difference) if c.what == data["difference"])
    return cls(**{f.name: tuple(data[f.name]) if isinstance(data[f.name], list) else data[f.name]
                  for f in dataclasses.fields(cls)})


def _subclasses(cls: type) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def field_names(cls: type[Anomaly]) -> frozenset[str]:
    """The keys ``to_json`` gives for anomalies of ``cls`` (any kind of tensor difference's, for a difference)."""
    names = {"anomaly", "verdict"}
    for f in dataclasses.fields(cls):
        if f.name == "at":
            names |= {"op", "op_kind", "name", "world", "tensor_kinds", "format", "api"}
        elif f.name in ("error", "sut", "reference"):
            prefix = _error_prefix(f.name)
            names |= {prefix + k for k in ("error_type", "message", "failure")}
        elif f.name == "difference":
            names |= {"difference", *(g.name for c in _subclasses(Difference) for g in dataclasses.fields(c))}
        else:
            names.add(f.name)
    return frozenset(names)
