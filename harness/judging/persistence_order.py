"""A recorded save judged by its IO alone (faults/persistence.py): a case whose fault is ``record`` with the written
bytes captured is a persistence-order case; its judgement adds a ``PersistenceOrder`` anomaly per broken rule of the
recorded op, so the finding replays like any other."""

from __future__ import annotations

import dataclasses
import re

from faults.crashstates import fs_ops
from faults.errors import TraceMismatch
from faults.fsmodel import FsOp
from faults.interleave import follow, schedule_of
from faults.persistence import order_violations
from faults.spec import RecordFault
from properties.check.anomalies import At, PersistenceOrder, judged
from properties.model.case import Case
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement

CALLS = 4  # offending calls quoted per anomaly


def is_order_case(case: Case) -> bool:
    return isinstance(case.fault, RecordFault) and bool(case.fault.capture)


def order_judgement(case: Case, outcome: Outcome) -> Judgement | None:
    """The recorded op's broken rules as a judgement (one anomaly per rule: its first violation, how many more),
    or None where it keeps them all (or nothing was recorded)."""
    if not is_order_case(case) or outcome.trace is None or outcome.trace[1] is None:
        return None
    found = order_violations(judged_ops(case, outcome))
    if not found:
        return None
    op = case.fault.op
    record = outcome.records[op] if op < len(outcome.records) else None
    at = At(op, case.ops[op].kind, case.ops[op].name, getattr(record, "world", None))
    anomalies = []
    for rule in dict.fromkeys(v.kind for v in found):
        same = [v for v in found if v.kind == rule]
        first = same[0]
        anomalies.append(PersistenceOrder(case.property, at, rule, _masked(first.record), _masked(first.path),
                                          _masked(first.why), first.calls[:CALLS], len(same) - 1))
    return judged(anomalies)


def _masked(name: str) -> str:
    """Digits masked: the rule broken and the kind of file, not which step or rank."""
    return re.sub(r"\d+", "N", name)


def judged_ops(case: Case, outcome: Outcome) -> list[FsOp]:
    """The recorded op's IO in the interleaving the case keeps (its ``schedule``), or as this run made it where the
    case keeps none or this run's IO differs per rank from the one it was found on (a fix changed it)."""
    root, recording, tid_stream = outcome.trace
    ops = fs_ops(recording, root)
    if case.fault.schedule is None:
        return ops
    try:
        return follow(ops, recording, tid_stream, case.fault.schedule)
    except TraceMismatch:
        return ops


def found_under(case: Case, outcome: Outcome) -> RecordFault:
    """The case's record fault with the interleaving this run judged (a finding replays under it)."""
    if case.fault.schedule is not None:
        return case.fault
    root, recording, tid_stream = outcome.trace
    return dataclasses.replace(case.fault, schedule=schedule_of(fs_ops(recording, root), recording, tid_stream))
