"""Fault cases end to end: the standard fault scenario, crash points resolved from a recording, and exhaustive
enumeration of crash points and power-loss crash states for one case, on any SUT.

The scenario (``fault_ops``): save version 0 and see it acknowledged; save version 1 with the fault armed; then,
in fresh processes, load the latest (or version 1's name where the SUT has no "latest"), load version 0 by name,
and save and load version 2 (the job must recover). ``properties.atomic.check_history`` judges the lot.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from faults.crashpoints import enumerate_points
from faults.interleave import schedule_of
from faults.spec import ErrorFault, Fault, KillFault, PointFault, PowerFault, RecordFault, StateFault
from faults.strace import Recording
from properties.atomic import check_history
from properties.case import Case, TensorCase
from properties.fault_strategies import fault_ops
from properties.outcome import Outcome
from properties.verdicts import Judgement, Verdict
from reference.layout import Mesh, Replicate, Shard, Sharded

from .run import run_ops
from .runners import Runners


class CaseJudge(Protocol):
    """What crash-point runs need of harness.judge.Judge (named here so this module never imports the judge)."""

    runners: Runners

    def __call__(self, case: Case) -> tuple[Judgement, Outcome]: ...


def as_fault_case(case: Case, prop: str = "P-ATOMIC", *, latest: bool, use_async: bool = False) -> Case:
    """``case`` as a fault scenario: its tensors and layouts, the standard ops (unless it already has a fault)."""
    if case.fault is not None:
        return case
    return dataclasses.replace(case, property=prop, ops=fault_ops(latest=latest, use_async=use_async))


def standard_case(rows: int = 4, sut: str = "reference", *, latest: bool = True, use_async: bool = False) -> Case:
    """The crash-point case of the benchmark: a 2-rank save of 4 tensors (sharded bf16 weights and fp32 EMA, a
    replicated bias, replicated RNG bytes); ``rows`` scales the sharded tensors."""
    mesh = Mesh((2,))
    shard, rep = Sharded(mesh, (Shard(0),)).to_json(), Sharded(mesh, (Replicate(),)).to_json()
    tensors = (
        TensorCase("model/w", "BF16", (rows, rows // 2), 1),
        TensorCase("model/b", "F32", (rows // 2 + 1,), 2),
        TensorCase("ema/w", "F32", (rows, rows // 2), 3),
        TensorCase("rng/state", "U8", (8,), 4),
    )
    layout = {"model/w": shard, "model/b": rep, "ema/w": shard, "rng/state": rep}
    return Case("P-ATOMIC", sut, tensors, layout, layout, fault_ops(latest=latest, use_async=use_async), {}, 0)


def fault_op_of(case: Case) -> int:
    """The case's fault op; without a fault, the save whose result the first load checks (the last save before
    it, or the last save)."""
    if case.fault is not None:
        return case.fault.op
    first_load = next((i for i, op in enumerate(case.ops) if op.kind == "load"), len(case.ops))
    saves = [i for i, op in enumerate(case.ops[:first_load]) if op.kind == "save"] or [
        i for i, op in enumerate(case.ops) if op.kind == "save"]
    if not saves:
        raise ValueError("the case has no save to put a fault in")
    return saves[-1]


def _trace_fault_op(case: Case, runners: Runners, tmp: Path, *, capture: bool = False) -> Outcome:
    """Run ``case`` in ``tmp``/ckpt up to its fault op, that op traced instead of faulted (``capture``: with the
    written bytes, and the root as it was before the op kept at ``tmp``/ckpt.before). The ops after it are not
    needed to know its IO and are not run; ``outcome.trace`` holds the recording."""
    f = fault_op_of(case)
    root = tmp / "ckpt"
    root.mkdir()
    fault = RecordFault(op=f, capture=True, keep_base=True) if capture else RecordFault(op=f)
    outcome = Outcome(sut=case.sut, launch_mode=runners.mode)
    run_ops(dataclasses.replace(case, fault=fault), runners, root, range(f + 1), outcome)
    if outcome.trace is None or outcome.trace[1] is None or len(outcome.records) <= f:
        raise RuntimeError(f"the recording run did not reach op {f}: {outcome.records[-1:]}")
    return outcome


def record(case: Case, runners: Runners) -> tuple[str, Recording, Outcome]:
    """(root it ran in, the fault op's syscalls, outcome) of a traced run of ``case`` up to its fault op."""
    tmp = Path(tempfile.mkdtemp(prefix="ckh-record-"))
    try:
        outcome = _trace_fault_op(case, runners, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return outcome.trace[0], outcome.trace[1], outcome


def kill_faults(root: str, recording: Recording, op: int) -> list[KillFault]:
    """Every syscall the op made on a path under ``root``, as a replayable ``kill`` fault (path relative)."""
    faults = []
    for point in enumerate_points(recording):
        rel = _under(root, point.path)
        if rel is not None:
            faults.append(KillFault(op=op, syscall=point.syscall, k=point.k, path=rel))
    return faults


def _under(root: str, path: str | None) -> str | None:
    if path is None:
        return None
    if path == root:
        return "."
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else None


def concrete_fault(case: Case, runners: Runners) -> Case | None:
    """A drawn fault that names a crash point or a power-loss state by index (``point``, ``power``) as the concrete
    fault it picks from a recording of this very case (modulo how many there are); None when the op made no IO
    under the root. Findings carry the concrete fault, so a replay needs no recording."""
    fault = case.fault
    if isinstance(fault, PointFault):
        root, recording, _ = record(case, runners)
        wanted = set(fault.syscalls or ())
        kills = [f for f in kill_faults(root, recording, fault.op) if not wanted or f.syscall in wanted]
        faults: list[Fault] = list(kills) if fault.action in (None, "kill") else [
            ErrorFault(op=f.op, syscall=f.syscall, k=f.k, path=f.path, errno=fault.action) for f in kills]
        return dataclasses.replace(case, fault=faults[fault.index % len(faults)]) if faults else None
    if isinstance(fault, PowerFault):
        results, _ = crashstates(case, runners, only=fault.index)
        return dataclasses.replace(case, fault=results[0].fault) if results else None
    raise ValueError(f"fault kind {None if fault is None else fault.kind!r} needs no resolving")


@dataclass
class PointResult:
    fault: KillFault
    judgement: Judgement
    report: dict


def crashpoints(case: Case, judge: CaseJudge, sample: int | None = None,
                on_result: Callable[[int, PointResult], None] | None = None) -> list[PointResult]:
    """SIGKILL the fault op at every syscall it makes under the root (one fresh run per point) and judge each;
    ``sample``: only that many points, evenly spread (first and last included); ``on_result`` sees each result as
    it comes (a long run reports as it goes)."""
    root, recording, _ = record(case, judge.runners)
    faults = kill_faults(root, recording, fault_op_of(case))
    if sample is not None and len(faults) > sample > 1:
        faults = [faults[round(i * (len(faults) - 1) / (sample - 1))] for i in range(sample)]
    results = []
    for n, fault in enumerate(faults):
        judgement, outcome = judge(dataclasses.replace(case, fault=fault))
        results.append(PointResult(fault, judgement, outcome.fault or {}))
        if on_result is not None:
            on_result(n, results[-1])
    return results


@dataclass
class StateResult:
    fault: StateFault
    description: str
    judgement: Judgement
    confirmed: bool | None = None  # for failures: does a replay in fresh processes reproduce it?


def crashstates(case: Case, runners: Runners, *, limit: int | None = None, confirm: CaseJudge | None = None,
                only: int | None = None) -> tuple[list[StateResult], int]:
    """Record the fault op's IO once, then for every power-loss state of it (faults.crashstates): materialise it in
    a fresh directory and run the remaining ops there. Returns the results and the number of IO ops modelled.
    ``only``: just state number ``only`` (modulo their count), unjudged — what ``concrete_fault`` needs.

    Loads of all states share warm ranks that never saw any other state's directory; a failing state is replayed
    as its own case in fresh processes (``confirm``) before it counts."""
    from faults.crashstates import enumerate_states, fs_ops, materialize

    f = fault_op_of(case)
    tmp = Path(tempfile.mkdtemp(prefix="ckh-states-"))
    try:
        outcome = _trace_fault_op(case, runners, tmp, capture=True)
        root, recording, tid_stream = outcome.trace
        ops = fs_ops(recording, root)
        schedule = schedule_of(ops, recording, tid_stream)

        def state_case(state) -> Case:
            return dataclasses.replace(case, fault=StateFault(op=f, state=json.loads(state.to_json()),
                                                              schedule=schedule))

        results: list[StateResult] = []
        states = enumerate_states(ops, limit=limit)
        if only is not None:
            if not states:
                return [], len(ops)
            state = states[only % len(states)]
            return [StateResult(state_case(state).fault, state.describe(), Judgement(case.property, Verdict.PASS))], \
                len(ops)
        for n, state in enumerate(states):
            dest = tmp / f"state-{n}" / "ckpt"
            materialize(ops, state, dest, base=tmp / "ckpt.before")
            case_n = state_case(state)
            run = Outcome(sut=case.sut, launch_mode=runners.mode, records=list(outcome.records[: f + 1]),
                          fault={"kind": "state", "acknowledged": state.prefix >= len(ops)})
            run_ops(case_n, runners, dest, range(f + 1, len(case.ops)), run)
            judgement = check_history(case_n, run, runners.cls.clear_errors)
            result = StateResult(case_n.fault, state.describe(), judgement)
            if not judgement.ok and confirm is not None:
                result.confirmed = not confirm(case_n)[0].ok
            results.append(result)
            shutil.rmtree(dest.parent, ignore_errors=True)
        return results, len(ops)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
