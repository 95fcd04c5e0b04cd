"""P-ATOMIC, P-NOLOSS, P-CORRUPT and P-LIVENESS over what loads returned after a fault (pure: the harness loads).

One rule, from the user's side: a checkpoint the system acknowledged (its save returned) must load back bitwise;
one it did not acknowledge may load back complete or fail clearly; nothing may ever load as a mix.
"""

from __future__ import annotations

from collections.abc import Collection

from reference.engine import local_tensors
from reference.tensor import diff_states

from .case import Case
from .outcome import OpRecord, Outcome
from .verdicts import Judgement, Verdict, worst

KILLS = ("kill", "kill-when", "point")  # faults whose whole point is that a process dies


def judge_history(case: Case, outcome: Outcome, clear_errors: Collection[str] | None = None) -> Judgement:
    """Judge a fault case's ops in order. ``clear_errors`` names the exception types that count as a clear
    "incomplete/corrupt checkpoint" error (None: any exception the SUT raises counts, for SUTs without typed
    errors); anything else a load raises about an unacknowledged or corrupted checkpoint is a loud failure."""
    assert case.fault is not None
    fault_op, kind = case.fault["op"], case.fault["kind"]
    fault_report = outcome.fault or {}
    acked: dict[str | None, tuple[int, int]] = {}  # name -> (version, op index of the acknowledging save)
    attempts: list[tuple[str | None, int, int]] = []  # unacknowledged saves: (name, version, op index)
    results: list[Judgement] = []
    for op, rec in zip(case.ops, outcome.records):
        where = f"op {rec.index} ({rec.kind} {rec.name or 'latest'})"
        if op.kind == "save":
            acknowledged = rec.ok and (rec.index != fault_op or fault_report.get("acknowledged", True))
            if acknowledged:
                acked[op.name] = acked[None] = (op.version, rec.index)
            else:
                attempts.append((op.name, op.version, rec.index))
                results.append(_failed_save(case, rec, where, rec.index == fault_op, kind))
            continue
        results.append(_judge_load(case, op.name, rec, where, acked, attempts, fault_op, kind, clear_errors))
    if len(outcome.records) < len(case.ops):
        results.append(Judgement(case.property, Verdict.CRASH,
                                 (f"only {len(outcome.records)} of {len(case.ops)} ops ran",)))
    return worst([r for r in results if r is not None]) or Judgement(case.property, Verdict.PASS)


def _failed_save(case: Case, rec: OpRecord, where: str, faulted: bool, kind: str) -> Judgement | None:
    if rec.ok:
        return None
    error = f"{where}: {rec.error_type}: {rec.error}"
    if rec.failure == "hang":
        return Judgement("P-LIVENESS", Verdict.HANG, (error,))
    if not faulted:
        return Judgement(case.property, Verdict.CRASH if rec.failure else Verdict.LOUD_FAILURE,
                         (f"after the fault: {error}",))
    if rec.failure == "crash" and kind not in KILLS:
        return Judgement("P-LIVENESS", Verdict.CRASH, (f"a {kind} fault killed a rank instead of an error: {error}",))
    return None  # the fault made the save fail: that is allowed, what later loads see is judged


def _judge_load(case: Case, name: str | None, rec: OpRecord, where: str, acked: dict, attempts: list,
                fault_op: int, kind: str, clear_errors: Collection[str] | None) -> Judgement | None:
    ack = acked.get(name)
    newer = [v for (n, v, i) in attempts if (name is None or n == name) and (ack is None or i > ack[1])]
    if not rec.ok and rec.failure:
        verdict = Verdict.HANG if rec.failure == "hang" else Verdict.CRASH
        return Judgement("P-LIVENESS", verdict, (f"{where}: {rec.error}",))
    corrupted = kind == "corrupt" and ack is not None and ack[1] <= fault_op
    previous = name is not None and ack is not None and ack[1] < fault_op  # named, acknowledged before the fault
    lost_prop = "P-NOLOSS" if previous and kind != "corrupt" else case.property
    if kind == "corrupt":
        lost_prop = "P-CORRUPT"
    if not rec.ok:
        clear = clear_errors is None or rec.error_type in clear_errors
        error = f"{where}: {rec.error_type}: {rec.error}"
        if ack is not None and not corrupted and name is not None:  # "latest" may always fail clearly
            if ack[1] > fault_op:
                return Judgement(case.property, Verdict.LOUD_FAILURE, (f"the save after the fault does not load: "
                                                                       f"{error}",))
            return Judgement(lost_prop, Verdict.DATA_LOSS, (f"acknowledged version {ack[0]} (op {ack[1]}) no longer "
                                                           f"loads: {error}",))
        if clear:
            return None
        return Judgement(lost_prop, Verdict.LOUD_FAILURE, (f"unclear error about an incomplete or damaged "
                                                           f"checkpoint: {error}",))
    allowed = ([ack[0]] if ack is not None else []) + newer
    for version in allowed:
        if not _mismatch(case, version, rec):
            return None
    if not allowed:
        return Judgement(case.property, Verdict.SILENT_CORRUPTION,
                         (f"{where}: loaded data although no checkpoint was ever acknowledged or attempted",))
    closest = ack[0] if ack is not None else allowed[-1]
    if ack is not None and not corrupted and _older(case, rec, acked, ack):
        return Judgement(lost_prop, Verdict.DATA_LOSS, (f"{where}: an older checkpoint came back instead of "
                                                       f"acknowledged version {ack[0]}",))
    return Judgement(lost_prop, Verdict.SILENT_CORRUPTION,
                     (f"{where}: loaded state is none of versions {allowed} (diff against version {closest}):",
                      *_mismatch(case, closest, rec)[:8]))


def _older(case: Case, rec: OpRecord, acked: dict, ack: tuple[int, int]) -> bool:
    return any(not _mismatch(case, v, rec) for (v, i) in set(acked.values()) if i < ack[1])


def _mismatch(case: Case, version: int, rec: OpRecord) -> list[str]:
    """Differences between what each rank loaded and its slice of ``version`` (empty: bitwise equal)."""
    layouts = case.layouts("load")
    state = case.state(version)
    out: list[str] = []
    for rank, got in sorted(rec.loaded.items()):
        expected = {n: lt.tensor for n, lt in local_tensors(state, layouts, rank).items()}
        out += [f"rank {rank}: {d}" for d in diff_states(expected, dict(got))]
    return out
