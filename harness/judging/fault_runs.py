"""Fault cases end to end: the standard fault scenario, crash points resolved from a recording, and exhaustive
enumeration of crash points and power-loss crash states for one case, on any SUT.

The scenario (``fault_ops``): save version 0 and see it acknowledged; save version 1 with the fault armed; then,
in fresh processes, load the latest (or version 1's name where the SUT has no "latest"), load version 0 by name,
and save and load version 2 (the job must recover). ``properties.check.history.check_history`` judges the lot.

Crash points and states of one fault op share one traced run of it (``Traced``: its syscalls with the bytes they
wrote, and the root as it was before it): points start from a copy of that root, states are materialised from it,
so the ops before the fault op run once, not once per point or state; a failure is replayed as its own case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

from faults.crashpoints import enumerate_points
from faults.errors import FaultSpecError, TraceMismatch
from faults.interleave import schedule_of
from faults.spec import ErrorFault, Fault, KillFault, PointFault, PowerFault, RecordFault, StateFault
from faults.strace import DEFAULT_SYSCALLS, Recording
from harness.judging.run import listing, run_ops
from harness.ranks.runner import PoolFailure, RunnerSet
from properties.check.history import check_history
from properties.generate.fault_cases import fault_ops
from properties.model.case import HARNESS_KINDS, Case, CaseError, TensorCase
from properties.model.outcome import Outcome
from properties.model.verdicts import Judgement
from reference.layout import Mesh, Replicate, Shard, Sharded

RUN_ERRORS = (PoolFailure, FaultSpecError, TraceMismatch, CaseError, OSError)  # a point or state that could not run


class NotConfirmed(Exception):
    """A failure left unconfirmed on purpose (a confirmation budget spent): its warm verdict stands."""


def at_most(confirm: CaseJudge | None, n: int | None) -> CaseJudge | None:
    """``confirm`` for the first ``n`` failures only (None: all); later ones stay unconfirmed (NotConfirmed)."""
    if confirm is None or n is None:
        return confirm
    left = [n]

    def limited(case: Case):
        if left[0] <= 0:
            raise NotConfirmed(f"only the first {n} failures of this op are replayed")
        left[0] -= 1
        return confirm(case)

    limited.runners = confirm.runners  # type: ignore[attr-defined]
    return limited  # type: ignore[return-value]


class CaseJudge(Protocol):
    """What crash-point runs need of harness.judging.judge.Judge (named here so this module never imports the judge)."""

    runners: RunnerSet

    def __call__(self, case: Case) -> tuple[Judgement, Outcome]: ...


def as_fault_case(case: Case, prop: str = "P-ATOMIC", *, latest: bool, use_async: bool = False,
                  op: int | None = None) -> Case:
    """``case`` as a fault scenario: its tensors and layouts, the standard ops — unless it has a fault already, or
    lives a job's life (sequence ops, P-LIFECYCLE): then its own ops, crashed at op ``op`` (default: the save
    whose result the first load checks)."""
    if op is not None:
        if not 0 <= op < len(case.ops) or case.ops[op].kind in HARNESS_KINDS:
            raise ValueError(f"--op {op}: the case's op {op} is not an op its ranks run "
                             f"(ops: {', '.join(o.kind for o in case.ops)})")
        return dataclasses.replace(case, fault=RecordFault(op=op))
    if case.fault is not None or case.sequence or case.property == "P-LIFECYCLE":
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


def _trace_fault_op(case: Case, runners: RunnerSet, tmp: Path, *, capture: bool = False) -> Outcome:
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


def kill_faults(root: str, recording: Recording, op: int) -> list[KillFault]:
    """Every syscall the op made on a path under ``root``, as a replayable ``kill`` fault (path relative). Only the
    calls a plain recording traces count (strace.DEFAULT_SYSCALLS), so a recording that also captured data for
    crash states gives the same points."""
    faults: dict[KillFault, None] = {}  # the same call made by two ranks is one fault: its k-th call anywhere
    for point in enumerate_points(recording, DEFAULT_SYSCALLS):
        rel = _under(root, point.path)
        if rel is not None:
            faults.setdefault(KillFault(op=op, syscall=point.syscall, k=point.k, path=rel))
    return list(faults)


def _under(root: str, path: str | None) -> str | None:
    if path is None:
        return None
    if path == root:
        return "."
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else None




@dataclass
class Traced:
    """One traced run of a case up to its fault op — the op's syscalls with the bytes they wrote, and a copy of the
    root as it was before it — shared by every crash point and power-loss state of that op, so the ops before it
    run once per op rather than once per point or state. Each point or state still runs in a fresh directory, on
    ranks that keep nothing from another one (the adapters' ``end_case``)."""

    case: Case  # with its fault op fixed (``case.fault`` names it; fault_op_of)
    op: int
    tmp: Path
    outcome: Outcome  # the records of ops 0..op (op: traced, not faulted)
    runs: int = 0

    @property
    def root(self) -> str:
        return self.outcome.trace[0]

    @property
    def recording(self) -> Recording:
        return self.outcome.trace[1]

    @cached_property
    def fs_ops(self) -> list:
        from faults.crashstates import fs_ops

        return fs_ops(self.recording, self.root)

    @cached_property
    def schedule(self) -> dict:
        return schedule_of(self.fs_ops, self.recording, self.outcome.trace[2])

    def points(self, action: str | None = None) -> list[KillFault | ErrorFault]:
        """Every crash point of the op: a kill at each call, or (``action`` an errno name) that call failing."""
        kills = kill_faults(self.root, self.recording, self.op)
        if action in (None, "kill"):
            return kills
        return [ErrorFault(op=f.op, syscall=f.syscall, k=f.k, path=f.path, errno=action) for f in kills]

    def states(self, limit: int | None = None):
        from faults.crashstates import enumerate_states

        return self.all_states if limit is None else enumerate_states(self.fs_ops, limit=limit)

    @cached_property
    def all_states(self) -> list:
        """Every power-loss state of the op, enumerated once: a drawn state is resolved, then judged, from them."""
        from faults.crashstates import enumerate_states

        return list(enumerate_states(self.fs_ops))

    def concrete(self, drawn: Fault | None) -> list[Fault]:
        """Every concrete fault a drawn ``point`` or ``power`` fault may name here, in index order."""
        if isinstance(drawn, PowerFault):
            return [self.state_fault(s) for s in self.states()]
        if not isinstance(drawn, PointFault):
            raise ValueError(f"fault kind {None if drawn is None else drawn.kind!r} needs no resolving")
        wanted = set(drawn.syscalls or ())
        return [f for f in self.points(drawn.action) if not wanted or f.syscall in wanted]

    def state_fault(self, state) -> StateFault:
        return StateFault(op=self.op, state=json.loads(state.to_json()), schedule=self.schedule)

    def _fresh(self) -> Path:
        self.runs += 1
        return self.tmp / f"run-{self.runs}" / "ckpt"

    def run_point(self, fault: KillFault | ErrorFault, runners: RunnerSet) -> tuple[Judgement, Outcome]:
        """Judge the case with ``fault`` on its op, started from a copy of the root before the op (the records of
        the earlier ops are the traced run's): the op runs on launched ranks with the fault armed, then the job
        restarts and the rest of the ops run. A SUT that trains itself runs the earlier ops again instead."""
        case = dataclasses.replace(self.case, fault=fault)
        root = self._fresh()
        # A SUT that trains itself holds its job (model, optimizer, the loop's own state) in its rank processes, and
        # a copy of the root does not carry it: the ops before the fault op run again (a job is deterministic).
        start = 0 if "trains" in runners.cls.capabilities else self.op
        if start:
            shutil.copytree(self.tmp / "ckpt.before", root, symlinks=True)
        else:
            root.mkdir(parents=True)
        outcome = Outcome(sut=case.sut, launch_mode=runners.mode, records=list(self.outcome.records[:start]))
        try:
            run_ops(case, runners, root, range(start, len(case.ops)), outcome)
        finally:
            shutil.rmtree(root.parent, ignore_errors=True)
            runners.after_case()
        return check_history(case, outcome, runners.cls.clear_errors), outcome

    def run_states(self, states: list, runners: RunnerSet, batch: int = 64) -> Iterator[CrashResult]:
        """Judge every state: materialise a batch of them first (each in a fresh directory), then run the ops after
        the fault op on each, on warm ranks. A state whose run raises is run once more from a fresh copy on fresh
        ranks (a busy machine can stall one run past a bound); one that still cannot be materialised or run is
        yielded unjudged, with the error."""
        from faults.crashstates import materialize

        with runners.warm():
            yield from self.run_states_on(states, runners, materialize, batch)

    def run_states_on(self, states: list, runners: RunnerSet, materialize: Callable,
                      batch: int = 64) -> Iterator[CrashResult]:
        """``run_states`` on the runners as they are (a warm pass around it, or none)."""
        for start in range(0, len(states), batch):
            ready: list[tuple[object, Path, str | None]] = []
            for state in states[start:start + batch]:
                ready.append(self._materialized(state, materialize))
            try:
                for state, root, error in ready:
                    result = self._run_state(state, root, error, runners)
                    if result.error is not None and error is None:  # the run raised: once more, from scratch
                        runners.after_case()
                        result = self._run_state(*self._materialized(state, materialize), runners)
                    yield result
            finally:
                for _, root, _ in ready:
                    shutil.rmtree(root.parent, ignore_errors=True)
                runners.after_case()

    def _materialized(self, state, materialize: Callable) -> tuple[object, Path, str | None]:
        root = self._fresh()
        try:
            materialize(self.fs_ops, state, root, base=self.tmp / "ckpt.before")
            return state, root, None
        except RUN_ERRORS as exc:
            return state, root, f"{type(exc).__name__}: {exc}"

    def _run_state(self, state, root: Path, error: str | None, runners: RunnerSet) -> CrashResult:
        """The ops after the fault op, run on ``state``'s materialised ``root`` (removed after)."""
        fault = self.state_fault(state)
        try:
            if error is not None:
                return CrashResult(fault, state.describe(), None, error=error)
            case = dataclasses.replace(self.case, fault=fault)
            # The fault op's record as the traced run left it, but with what the SUT lists as finished on this
            # state's root (the history holds the next op's load to that listing).
            faulted = dataclasses.replace(self.outcome.records[self.op], complete=listing(case, runners, root))
            outcome = Outcome(sut=case.sut, launch_mode=runners.mode,
                              records=[*self.outcome.records[: self.op], faulted],
                              fault={"kind": "state", "fired": True, "acknowledged": state.prefix >= len(self.fs_ops)})
            try:
                run_ops(case, runners, root, range(self.op + 1, len(case.ops)), outcome)
            except Exception as exc:  # whatever stopped it: this state stays unjudged
                return CrashResult(fault, state.describe(), None, error=f"{type(exc).__name__}: {exc}")
            return CrashResult(fault, state.describe(), check_history(case, outcome, runners.cls.clear_errors),
                               outcome.fault or {})
        finally:
            shutil.rmtree(root.parent, ignore_errors=True)


@contextmanager
def traced(case: Case, runners: RunnerSet) -> Iterator[Traced]:
    """A :class:`Traced` run of ``case`` up to its fault op, its directory removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="ckh-traced-"))
    try:
        yield Traced(case, fault_op_of(case), tmp, _trace_fault_op(case, runners, tmp, capture=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def concrete_fault(case: Case, runners: RunnerSet) -> Case | None:
    """A drawn fault that names a crash point or a power-loss state by index (``point``, ``power``) as the concrete
    fault it picks from a recording of this very case (modulo how many there are); None when the op made no IO
    under the root. Findings carry the concrete fault, so a replay needs no recording."""
    with traced(case, runners) as t:
        faults = t.concrete(case.fault)
    return dataclasses.replace(case, fault=faults[case.fault.index % len(faults)]) if faults else None


@dataclass
class CrashResult:
    """One crash point or power-loss state, judged (``judgement`` None: it could not be run, ``error`` says why)."""

    fault: Fault
    description: str
    judgement: Judgement | None
    report: dict = field(default_factory=dict)
    confirmed: bool | None = None  # for failures: does a replay as its own case, in fresh processes, reproduce it?
    error: str | None = None

    @property
    def judged(self) -> bool:
        return self.judgement is not None

    @property
    def failing(self) -> bool:
        """Failed, and not shown flaky by its replay (an unconfirmed failure still counts)."""
        return self.judgement is not None and not self.judgement.ok and self.confirmed is not False


PointResult = StateResult = CrashResult  # the names crashpoints and crashstates gave them


def _confirm(result: CrashResult, case: Case, confirm: CaseJudge | None) -> CrashResult:
    """A failure on warm ranks, replayed as its own case in fresh processes through the judge (which also charges it
    to the fault only if the ops pass without it, and excuses known findings): the replay's judgement stands; a
    replay that passes plainly marks the failure flaky (``confirmed`` False)."""
    if result.judgement is None or result.judgement.ok or confirm is None:
        return result
    try:
        again, _ = confirm(case)
    except (CaseError, TraceMismatch, NotConfirmed) as exc:  # e.g. the state's interleaving never recurred
        result.error = f"not replayed: {exc}"
        return result
    if not again.ok or again.excuse is not None:
        result.judgement, result.confirmed = again, not again.ok
    else:
        result.confirmed = False
    return result


def judge_points(t: Traced, faults: list[KillFault | ErrorFault], runners: RunnerSet, confirm: CaseJudge | None = None,
                 on_result: Callable[[int, CrashResult], None] | None = None) -> list[CrashResult]:
    """Judge each crash point of a traced op (Traced.run_point); failures are confirmed (``confirm``). Each point
    kills its ranks, so a replacement pool launches in the background while the point runs (RunnerSet.keep_spare)."""
    results: list[CrashResult] = []
    with runners.warm():
        _judge_points(t, faults, runners, confirm, on_result, results)
    return results


def _judge_points(t: Traced, faults: list[KillFault | ErrorFault], runners: RunnerSet, confirm: CaseJudge | None,
                  on_result: Callable[[int, CrashResult], None] | None, results: list[CrashResult]) -> None:
    for n, fault in enumerate(faults):
        description = f"{fault.syscall} #{fault.k} on {fault.path}"
        try:
            judgement, outcome = t.run_point(fault, runners)
            result = CrashResult(fault, description, judgement, outcome.fault or {})
        except Exception as exc:  # e.g. strace could not attach: this point stays unjudged, with the error
            result = CrashResult(fault, description, None, error=f"{type(exc).__name__}: {exc}")
        with runners.strict():
            results.append(_confirm(result, dataclasses.replace(t.case, fault=fault), confirm))
        if on_result is not None:
            on_result(n, results[-1])


def judge_alone(t: Traced, fault: Fault, index: int, runners: RunnerSet) -> CrashResult:
    """A concrete fault a drawn one resolved to here (``index`` in Traced.concrete's order), judged on the traced
    run: a crash point's op runs from the copy of the root before it, a power-loss state is materialised from the
    recorded IO, and the ops after it run. Neither the ops before the fault op nor a traced run of the op itself
    are repeated. Not a warm pass: the runners' own rules hold (no spares stocked for it, no failed ranks kept), so
    a drawn fault case costs what one case costs; a failure here is replayed as its own case before it counts."""
    if isinstance(fault, StateFault):
        from faults.crashstates import materialize

        return next(t.run_states_on([t.all_states[index]], runners, materialize))
    assert isinstance(fault, KillFault | ErrorFault)
    description = f"{fault.syscall} #{fault.k} on {fault.path}"
    try:
        judgement, outcome = t.run_point(fault, runners)
    except Exception as exc:  # e.g. strace could not attach: the caller replays it as its own case
        return CrashResult(fault, description, None, error=f"{type(exc).__name__}: {exc}")
    return CrashResult(fault, description, judgement, outcome.fault or {})


def judge_crash_states(t: Traced, states: list, runners: RunnerSet, confirm: CaseJudge | None = None,
                 on_result: Callable[[int, CrashResult], None] | None = None) -> list[CrashResult]:
    """Judge each power-loss state of a traced op (Traced.run_states); failures are confirmed (``confirm``)."""
    results: list[CrashResult] = []
    for n, result in enumerate(t.run_states(states, runners)):
        with runners.strict():  # the warm pass is suspended here: the replay follows the judge's own rules
            results.append(_confirm(result, dataclasses.replace(t.case, fault=result.fault), confirm))
        if on_result is not None:
            on_result(n, results[-1])
    return results


def crashpoints(case: Case, judge: CaseJudge, sample: int | None = None,
                on_result: Callable[[int, CrashResult], None] | None = None,
                on_traced: Callable[[Traced], None] | None = None) -> list[CrashResult]:
    """SIGKILL the fault op at every syscall it makes under the root and judge each: the ops before it run once (a
    traced run), each point starts from a copy of the root they left; ``sample``: only that many points, evenly
    spread (first and last included); ``on_result`` sees each result as it comes (a long run reports as it goes).
    A failing point is replayed as its own case through ``judge`` before it counts; ``on_traced`` sees the traced
    run first (the crash-point map of report.html, harness/judging/iomap.py)."""
    with traced(case, judge.runners) as t:
        if on_traced is not None:
            on_traced(t)
        faults = t.points()
        if sample is not None and len(faults) > sample > 1:
            faults = [faults[round(i * (len(faults) - 1) / (sample - 1))] for i in range(sample)]
        return judge_points(t, faults, judge.runners, judge, on_result)


def crashstates(case: Case, runners: RunnerSet, *, limit: int | None = None, confirm: CaseJudge | None = None,
                on_traced: Callable[[Traced], None] | None = None) -> tuple[list[CrashResult], int]:
    """Record the fault op's IO once, then for every power-loss state of it (faults.crashstates): materialise it in
    a fresh directory and run the remaining ops there on warm ranks that never saw any other state's directory.
    Returns the results and the number of IO ops modelled. A failing state is replayed as its own case in fresh
    processes (``confirm``) before it counts."""
    with traced(case, runners) as t:
        if on_traced is not None:
            on_traced(t)
        return judge_crash_states(t, t.states(limit=limit), runners, confirm), len(t.fs_ops)
