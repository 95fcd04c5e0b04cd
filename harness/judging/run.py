"""Run a case: its ops in lock-step across the ranks of the runners a ``RunnerSet`` hands out, a fault armed around
its op, and the Outcome the checkers judge."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from faults.errors import FaultSpecError
from faults.spec import RecordFault, StallFault
from harness.judging.inject import ArmedFault
from harness.ranks.rankops import unpack
from harness.ranks.runner import PoolFailure, Runner, RunnerSet
from properties.model.case import HARNESS_KINDS, Case, Op
from properties.model.outcome import OpRecord, Outcome
from reference import nesting

T = TypeVar("T")


def run_case(case: Case, runners: RunnerSet) -> Outcome:
    """Run every op of ``case`` in a fresh directory; failures of the SUT become records, not exceptions.

    A case with a fault arms it around its op on launched ranks (harness.judging.inject); afterwards those ranks are
    discarded — the job "restarts" — and the remaining ops run in fresh processes on whatever the fault left.
    A ``restart`` op does the same on purpose; a ``corrupt`` op damages the root between two ops.
    """
    outcome = Outcome(sut=case.sut, launch_mode=runners.mode)
    tmp = Path(tempfile.mkdtemp(prefix="ckh-case-"))
    root = tmp / "ckpt"
    root.mkdir()
    try:
        run_ops(case, runners, root, range(len(case.ops)), outcome)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        runners.after_case()
    return outcome


def run_ops(case: Case, runners: RunnerSet, root: Path, indices: Iterable[int], outcome: Outcome,
            live: list[Runner] | None = None) -> Path:
    """Run ops ``indices`` of ``case`` on ``root`` (the fault armed on its op), appending their records; returns
    the root the last op saw. Stops at the first op whose ranks died or hung, unless the fault caused it.

    ``live``: for a caller that grows a case op by op (a state machine) — the runners begun so far, kept begun
    across calls so in-flight async saves survive, and ended by that caller (``runner.end()``) when it is done."""
    indices = list(indices)
    job = _Job(case, runners, root, outcome, [] if live is None else live,
               last=indices[-1] if indices and live is None else None)
    for runner in job.active:  # the case has grown since they began: hand them the new ops (nothing else changes)
        runner.begin(case.to_json(), str(root))
    first = len(outcome.records)
    try:
        for i in indices:
            rec, stop = job.step(i)
            outcome.records.append(rec)
            if stop:
                break
    finally:
        if live is None:
            job.end_runners(outcome.records[first:])
    return job.root


@dataclass
class _Job:
    """Some ops of one case on live ranks: the runners begun so far, and the root the next op sees (a fault may
    replace it by the state it left)."""

    case: Case
    runners: RunnerSet
    root: Path
    outcome: Outcome
    active: list[Runner]
    last: int | None = None  # the last op this run has (None: a caller grows the case op by op)
    ran: list[tuple[Runner, OpRecord]] = field(default_factory=list)  # each op's record, with the runner that ran it

    def step(self, i: int) -> tuple[OpRecord, bool]:
        """Op ``i``'s record, and whether the case stops there (its ranks died or hung without a fault)."""
        op = self.case.ops[i]
        faulted = self.case.fault is not None and self.case.fault.op == i
        if op.kind in HARNESS_KINDS:
            if faulted:
                raise FaultSpecError(f"fault op {i} is a {op.kind}: a fault needs an op that runs on the ranks")
            return self.listed(self.harness_op(op, i)), False
        world = self.case.world_size(self.case.op_layouts(i))
        cls = self.runners.cls
        real_only = self.case.fault is not None or not cls.virtual_plays(self.case)
        runner = self.runners.get(world, self.case.options, launched=faulted, fault_case=real_only,
                                  shape=cls.process_shape(self.case, i))
        rec = OpRecord(i, op.kind, op.name)
        self.ran.append((runner, rec))
        try:
            self.begin(runner)
            if faulted:
                self.faulted_op(runner, rec)
            elif self.ranks_op(runner, op, rec):
                return self.listed(rec), True
        except PoolFailure as failure:
            _failed(rec, failure)
            self.drop(runner)
            if failure.kind == "setup":
                self.outcome.records.append(rec)
                raise
            return self.listed(rec), True
        return self.listed(rec), False

    def listed(self, rec: OpRecord) -> OpRecord:
        """Record what the SUT presents as finished checkpoints after the op (on the root a fault left): the
        history judge holds every one of them to loading bitwise, and a job to never having none. A listing, no
        load; a root the SUT cannot read counts as "cannot tell"."""
        rec.complete = listing(self.case, self.runners, self.root)
        return rec

    def begin(self, runner: Runner) -> None:
        if runner not in self.active:
            runner.begin(self.case.to_json(), str(self.root))
            self.active.append(runner)
            self.outcome.shims = tuple(runner.shims)

    def drop(self, runner: Runner, restart: bool = False) -> None:
        """The job loses these ranks at once (a crash, a hang, a fault, or the case's ``restart``): the next op
        starts them afresh."""
        if runner in self.active:
            self.active.remove(runner)
        self.runners.lose(runner, graceful=False, restart=restart)

    def ranks_op(self, runner: Runner, op: Op, rec: OpRecord) -> bool:
        """Run the op on the ranks; True when the case stops there (ranks stuck behind one that raised, in a
        fault-free case on runners that do not wait those out)."""
        replies = runner.op(rec.index, op_timeout(self.case, self.runners), stuck_after=self.stuck_after(),
                            idle_limit=idle_limit(self.case, self.runners))
        _merge(rec, replies)
        stuck_ranks = tuple(r["rank"] for r in replies if r.get("stuck"))
        if stuck_ranks and self.case.fault is None:
            rec.failure, rec.silent = "hang", stuck_ranks  # the job would wait here until the backend times out
            self.outcome.cut_short = True
            self.drop(runner)
            return True
        if op.kind == "save" and rec.ok:
            written = _unless_unreadable(lambda: self.runners.cls.written(self.root, op.name)) or {}
            # listed under their stored keys (a nested path joined, a renamed tensor's): by the case's names again
            rec.written = nesting.by_name(written, [t.name for t in self.case.tensors],
                                          lambda name: self.runners.cls.stored_key(name, self.case.options))
        if self.case.fault is not None and not rec.ok and runner.launched and not (
                self.runners.keep_failed and rec.symmetric and runner.healthy()):
            # After a fault every op is judged on its own: a failed op may leave the group wedged
            # (one rank raised, one waits), which must not be charged to the next op (RunnerSet.keep_failed:
            # the warm pass over crash points and states keeps ranks that pass a health check). The history
            # hears of it: saves the ranks had in flight died with them.
            self.drop(runner)
            rec.restarted = True
        return False

    def stuck_after(self) -> float | None:
        """How long ranks still busy after a peer raised are waited on (None: until the op's bounds). The warm pass
        over crash points and states does not wait out a collective that a raising rank left (gloo: 30 s per
        failing state): the ranks still in it are dropped, and a failure it finds is replayed as its own case, with
        every wait, before it counts. A fuzzing judge does not either (RunnerSet.fast_failures): it stops a
        fault-free case there and settles it (harness.judging.judge), and in a fault case it takes the raiser's
        error as the op's (what the fault left on disk is judged next, after the restart). A property about what
        ranks do after a peer failed waits everything out."""
        fast = self.runners.fast_failures and self.case.property not in WAITS_OUT_FAILURES
        if self.case.fault is not None and self.runners.keep_failed:
            return STUCK_AFTER_S
        return FAST_STUCK_CAP_S if fast else None

    def faulted_op(self, runner: Runner, rec: OpRecord) -> None:
        """Run the fault's op with the fault armed, then restart the job: the next ops see only what is on disk
        (the root the fault left). A rank killed by the fault is recorded, not raised; P-LIVENESS cases wait for
        the survivors (up to the op timeout) to see whether they turn the death into an error or hang. A recording
        that ends the run (a traced run up to its fault op: no later op for a restart to stand before) leaves its
        ranks, which saw no fault, warm for the next case."""
        assert self.case.fault is not None
        armed = ArmedFault(self.case.fault, runner.pids, self.root)
        kept = False
        try:
            with armed:
                try:
                    _merge(rec, runner.op(rec.index, op_timeout(self.case, self.runners),
                                          fail_fast=self.case.property != "P-LIVENESS",
                                          stuck_after=self.stuck_after(),
                                          idle_limit=idle_limit(self.case, self.runners)))
                except PoolFailure as failure:
                    _failed(rec, failure)
            self.root = armed.after()
            kept = rec.ok and rec.index == self.last and isinstance(self.case.fault, RecordFault)
        finally:
            self.outcome.fault = armed.report
            self.outcome.trace = (str(self.root), armed.recording, armed.tid_stream)
            if armed.resolved is not None:
                self.outcome.resolved_fault = armed.resolved
            if not kept:
                self.drop(runner)
        for other in self.active:  # ranks of another world size: begin again on the (new) root
            other.end()
        self.active.clear()

    def harness_op(self, op: Op, index: int) -> OpRecord:
        """``restart``: the job dies (its ranks are killed, in-process ranks lose their in-flight async saves) and
        the next op runs in fresh processes. ``corrupt``: the seeded corrupt fault it stands for, inflicted on the
        root now; the record keeps the concrete plan (or why there was nothing to corrupt)."""
        rec = OpRecord(index, op.kind, op.name)
        if op.kind == "restart":
            for runner in list(self.active):
                self.drop(runner, restart=True)
            return rec
        try:
            rec.applied = op.corruption_fault(index).inflict(self.root).to_json()
        except (FaultSpecError, OSError) as exc:  # e.g. nothing eligible yet: the root stays as it was
            rec.applied = {"skipped": f"{type(exc).__name__}: {exc}"}
        return rec

    def end_runners(self, records: list[OpRecord]) -> None:
        """End the case on every runner still begun. After a failed op the ranks may disagree about where they are
        in a collective (one raised, another still waits): such a pool is poisoned for the next case. It stays
        warm only if every rank failed the same way and a collective health check passes; else it is relaunched.
        Only the ops a runner ran count against it (ranks started after a dropped pool never saw its failure)."""
        first = {id(r) for r in records}
        for runner in self.active:
            mine = [rec for r, rec in self.ran if r is runner and id(rec) in first]
            failed = any(not r.ok for r in mine)
            suspect = any(not r.symmetric or r.failure for r in mine)
            try:
                runner.end()
                if failed and runner.drifts and ((suspect and not runner.exact_health) or not runner.healthy()):
                    self.runners.lose(runner)
            except PoolFailure:
                self.runners.lose(runner)


def listing(case: Case, runners: RunnerSet, root: Path) -> tuple[str, ...] | None:
    """The case's checkpoint names that the SUT presents as finished on ``root`` (None: it cannot tell)."""
    names = sorted({op.name for op in case.ops if op.kind == "save" and op.name})
    found = _unless_unreadable(lambda: runners.cls.complete(root, names, case.options))
    return None if found is None else tuple(found)


def idle_limit(case: Case, runners: RunnerSet) -> float | None:
    """How long the ranks of a fault case's op may all sit idle before it is hung (None: a case without a fault
    waits its op timeout, since its failures are never replayed with longer waits)."""
    if case.fault is None:
        return None
    fast = (runners.keep_failed or runners.fast_failures) and case.property not in WAITS_OUT_FAILURES
    bound = FAULT_IDLE_FAST_S if fast else FAULT_IDLE_STRICT_S
    return bound + (case.fault.duration if isinstance(case.fault, StallFault) else 0.0)


def op_timeout(case: Case, runners: RunnerSet) -> float:
    """How long one op may take before its ranks count as hung: the case's own bound (``options["op_timeout"]``,
    part of a P-LIVENESS case: it says what "within a bound" means there), else the runners'."""
    return float(case.options.get("op_timeout", runners.op_timeout))


def _unless_unreadable(read: Callable[[], T]) -> T | None:
    """What an adapter reads of the SUT's files on the controller (its listing, what a save wrote), or None ("cannot
    tell") where those files do not parse: a root that a corruption, a crash or a concurrent writer left damaged is
    what the loads are judged on, never a reason for the harness to stop."""
    try:
        return read()
    except Exception:  # the SUT's own parsers raise their own types on damaged files
        return None


def _failed(rec: OpRecord, failure: PoolFailure) -> None:
    if failure.replies:
        _merge(rec, failure.replies)
    rec.ok, rec.failure, rec.error_type, rec.error = False, failure.kind, failure.kind, str(failure)
    rec.dead, rec.silent = failure.dead, failure.silent


CAUSE_MARGIN_S = 5.0  # a rank that failed this much sooner than the others raised first; they waited on it
# Warm fault passes: ranks still busy this long after one raised are taken to wait on it (their replies say
# "stuck", so cause() cites the raiser without the margin). Every failure a warm pass finds is replayed with every
# wait before it counts, so a rank that was only slow costs a replay, never a wrong verdict.
STUCK_AFTER_S = 1.5
# Fuzzing: the bound on that wait where ranks do not go idle (NCCL spins while it waits); below gloo's 30 s.
FAST_STUCK_CAP_S = 10.0
# A fault case's op is hung once no rank still in it has used CPU for this long: nothing but a timer can change
# then, so a fault that leaves the SUT waiting costs seconds, not the op timeout. Warm passes and fuzzing replay
# every failure they find before it counts; a strict run, and every run of a property about what ranks do after a
# peer failed, waits past gloo's 30 s collective timeout, so a SUT that waits out a lost peer and then raises is
# judged by its error. A stall adds its own duration.
FAULT_IDLE_FAST_S = 5.0
FAULT_IDLE_STRICT_S = 45.0
WAITS_OUT_FAILURES = ("P-LIVENESS",)  # properties about what ranks do after a peer failed: every wait is theirs


def cause(replies: list[dict]) -> dict | None:
    """The failed reply an op's record cites: the lowest failed rank, unless another failed rank's op ended at
    least ``CAUSE_MARGIN_S`` sooner. One rank raising inside a collective load or save leaves its peers waiting in
    the next collective until the backend times out (gloo: ``TIMEOUT`` after 30 s); the timeout says nothing of
    the bug and no known finding's signature can recognise it, the first rank's error does. The margin keeps the
    choice deterministic where ranks fail on their own at about the same time (rank order then)."""
    failed = sorted((r for r in replies if not r["ok"]), key=lambda r: r["rank"])
    failed = [r for r in failed if not r.get("stuck")] or failed  # a rank left waiting on a raiser never caused it
    if not failed:
        return None
    first = min(failed, key=lambda r: r["seconds"])
    return first if first["seconds"] + CAUSE_MARGIN_S <= failed[0]["seconds"] else failed[0]


def _merge(rec: OpRecord, replies: list[dict]) -> None:
    rec.seconds = max((r["seconds"] for r in replies), default=0.0)
    r = cause(replies)
    if r is not None and rec.ok:
        rec.ok, rec.error_type, rec.traceback = False, r["error_type"], r.get("traceback")
        rec.error = f"rank {r['rank']}: {r['error']}"
    for r in replies:
        held = r.get("layout_rank", r["rank"])  # what a rank loads is judged against its layouts' pieces
        if held is not None:  # an idle rank of a group of a subset of the job holds nothing
            rec.loaded[held] = {name: unpack(p) for name, p in r["loaded"].items()}
            if r.get("plan") is not None:
                rec.plans[held] = r["plan"]
        if not r["ok"]:
            rec.errors[r["rank"]] = (r["error_type"], r.get("error", ""))
    rec.symmetric = len({(r["ok"], r.get("error_type")) for r in replies}) <= 1
