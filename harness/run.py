"""Run a case: pick runners (in-process, fresh launch, or warm pool) for its save and load worlds, run its ops
in lock-step across ranks, and assemble the Outcome the checkers judge."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from faults.corrupt import corrupt
from faults.errors import FaultSpecError
from properties.case import HARNESS_KINDS, Case, Op
from properties.outcome import OpRecord, Outcome

from .inject import ArmedFault, FaultSpec
from .pool import InProcessRunner, PoolFailure, RankPool
from .rankops import unpack
from .sut import resolve

MODES = ("pool", "fresh", "in-process")
DEVICES = ("auto", "cpu", "gpu")  # auto: one GPU per rank where the framework has CUDA and enough GPUs
OP_TIMEOUT = 120.0


class Runners:
    """Runners by (world size, setup options), created on demand and reused across cases (warm)."""

    def __init__(self, sut: str, mode: str = "pool", op_timeout: float = OP_TIMEOUT, *, device: str = "auto",
                 nnodes: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown launch mode {mode!r}; known: {', '.join(MODES)}")
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
        self.sut, self.mode, self.op_timeout = sut, mode, op_timeout
        self.device, self.nnodes = device, nnodes
        self.cls = resolve(sut)
        self._runners: dict[tuple[int, str], InProcessRunner | RankPool] = {}
        self._retired_launches = 0
        self._retired_devices: set[str] = set()

    def get(self, world: int, options: dict, launched: bool = False):
        """A runner for ``world`` ranks; ``launched`` insists on real rank processes (a fault needs their pids)."""
        setup = {"shims": options.get("shims", True), "device": self.device}
        in_process = (not launched and self.mode == "in-process" and self.nnodes == 1
                      and (world == 1 or "in_process_world" in self.cls.capabilities))
        key = (world, json.dumps(setup, sort_keys=True), in_process)
        runner = self._runners.get(key)
        if runner is None:
            nodes = self.nnodes if world % self.nnodes == 0 else 1  # a world too small to split runs on one node
            runner = (InProcessRunner(self.sut, world, setup) if in_process
                      else RankPool(self.sut, world, setup, nnodes=nodes))
            self._runners[key] = runner
        return runner

    def discard(self, runner, graceful: bool = True) -> None:
        """Close ``runner`` and forget it; ``graceful=False`` kills its ranks at once (after a crash or a fault a
        surviving rank may sit in a collective or a commit wait and would only answer "stop" after a timeout)."""
        self._retired_devices |= _devices(runner)
        runner.close(graceful)
        self._retired_launches += getattr(runner, "launches", 0)
        self._runners = {k: r for k, r in self._runners.items() if r is not runner}

    def after_case(self) -> None:
        if self.mode == "fresh":
            self.close()

    @property
    def launches(self) -> int:
        return self._retired_launches + sum(getattr(r, "launches", 0) for r in self._runners.values())

    @property
    def devices(self) -> set[str]:
        """Where the ranks ran, as "device (backend)" strings (a GPU run shows cuda:N here)."""
        return self._retired_devices.union(*(_devices(r) for r in self._runners.values()))

    def close(self) -> None:
        for runner in list(self._runners.values()):
            self.discard(runner)


def _devices(runner) -> set[str]:
    return {f"{i.get('device', '?')} ({i['backend']})" if "backend" in i else i.get("device", "?")
            for i in getattr(runner, "info", {}).values()}


def run_case(case: Case, runners: Runners) -> Outcome:
    """Run every op of ``case`` in a fresh directory; failures of the SUT become records, not exceptions.

    A case with a fault arms it around its op on launched ranks (harness.inject); afterwards those ranks are
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


def run_ops(case: Case, runners: Runners, root: Path, indices: Iterable[int], outcome: Outcome,
            live: list | None = None) -> Path:
    """Run ops ``indices`` of ``case`` on ``root`` (the fault armed on its op), appending their records; returns
    the root the last op saw. Stops at the first op whose ranks died or hung, unless the fault caused it.

    ``live``: for a caller that grows a case op by op (a state machine) — the runners begun so far, kept begun
    across calls so in-flight async saves survive, and ended by that caller (``runner.end()``) when it is done."""
    fault = FaultSpec.parse(case.fault, len(case.ops)) if case.fault is not None else None
    worlds = {"save": case.world_size("save"), "load": case.world_size("load")}
    active: list = [] if live is None else live
    for runner in active:  # the case has grown since they began: hand them the new ops (nothing else changes)
        runner.begin(case.to_json(), str(root))
    first = len(outcome.records)
    try:
        for i in indices:
            op = case.ops[i]
            faulted = fault is not None and fault.op == i
            if op.kind in HARNESS_KINDS:
                if faulted:
                    raise FaultSpecError(f"fault op {i} is a {op.kind}: a fault needs an op that runs on the ranks")
                outcome.records.append(_harness_op(op, i, root, runners, active))
                continue
            runner = runners.get(worlds[case.op_layouts(i)], case.options, launched=faulted)
            rec = OpRecord(i, op.kind, op.name)
            try:
                if runner not in active:
                    runner.begin(case.to_json(), str(root))
                    active.append(runner)
                    outcome.shims = tuple(runner.shims)
                if faulted:
                    try:
                        root = _faulted_op(case, fault, runner, root, rec, runners, outcome)
                    finally:
                        active.remove(runner)
                        runners.discard(runner, graceful=False)  # a restart: the next ops see only what is on disk
                    outcome.records.append(rec)
                    for other in active:  # ranks of another world size: begin again on the (new) root
                        other.end()
                    active.clear()
                    continue
                replies = runner.op(i, op_timeout(case, runners))
                _merge(rec, replies)
                if op.kind == "save" and rec.ok:
                    rec.written = runners.cls.written(root, op.name) or {}
                if fault is not None and not rec.ok and isinstance(runner, RankPool):
                    # After a fault every op is judged on its own: a failed op may leave the group wedged
                    # (one rank raised, one waits), which must not be charged to the next op.
                    active.remove(runner)
                    runners.discard(runner, graceful=False)
            except PoolFailure as failure:
                _failed(rec, failure)
                if runner in active:
                    active.remove(runner)
                runners.discard(runner, graceful=False)
                outcome.records.append(rec)
                if failure.kind == "setup":
                    raise
                break
            outcome.records.append(rec)
    finally:
        # After a failed op the ranks may disagree about where they are in a collective (one raised, another
        # still waits): such a pool is poisoned for the next case. It stays warm only if every rank failed the
        # same way and a collective health check passes; otherwise it is relaunched.
        mine = outcome.records[first:]
        failed = any(not r.ok for r in mine)
        suspect = any(not r.symmetric or r.failure for r in mine)
        for runner in active if live is None else ():
            try:
                runner.end()
                if failed and isinstance(runner, RankPool) and (suspect or not runner.healthy()):
                    runners.discard(runner)
            except PoolFailure:
                runners.discard(runner)
    return root


def op_timeout(case: Case, runners: Runners) -> float:
    """How long one op may take before its ranks count as hung: the case's own bound (``options["op_timeout"]``,
    part of a P-LIVENESS case: it says what "within a bound" means there), else the runners'."""
    return float(case.options.get("op_timeout", runners.op_timeout))


def _harness_op(op: Op, index: int, root: Path, runners: Runners, active: list) -> OpRecord:
    """``restart``: the job dies (its ranks are killed, in-process ranks lose their in-flight async saves) and the
    next op runs in fresh processes. ``corrupt``: a seeded faults.corrupt plan drawn on the root's files now,
    applied; the record keeps the concrete plan (or why there was nothing to corrupt)."""
    rec = OpRecord(index, op.kind, op.name)
    if op.kind == "restart":
        for runner in active:
            if isinstance(runner, InProcessRunner):  # its ranks live in this process: kill their async writers
                with contextlib.suppress(Exception):
                    runner.end()
            runners.discard(runner, graceful=False)
        active.clear()
        return rec
    try:
        rec.applied = corrupt(root, op.corruption, op.seed).to_json()
    except (FaultSpecError, OSError) as exc:  # e.g. nothing eligible yet: the root stays as it was
        rec.applied = {"skipped": f"{type(exc).__name__}: {exc}"}
    return rec


def _faulted_op(case: Case, fault: FaultSpec, runner, root: Path, rec: OpRecord, runners: Runners,
                outcome: Outcome) -> Path:
    """Run op ``fault.op`` with the fault armed; returns the root the following ops use. A rank killed by the fault
    is recorded, not raised; P-LIVENESS cases wait for the survivors (up to the op timeout) to see whether they
    turn the death into an error or hang."""
    armed = ArmedFault(fault, runner.pids, root)
    try:
        with armed:
            try:
                _merge(rec, runner.op(fault.op, op_timeout(case, runners), fail_fast=case.property != "P-LIVENESS"))
            except PoolFailure as failure:
                _failed(rec, failure)
        return armed.after()
    finally:
        outcome.fault = armed.report
        outcome.trace = (str(root), armed.recording, armed.tid_stream)
        if armed.resolved is not None:
            outcome.resolved_fault = armed.resolved


def _failed(rec: OpRecord, failure: PoolFailure) -> None:
    if failure.replies:
        _merge(rec, failure.replies)
    rec.ok, rec.failure, rec.error_type, rec.error = False, failure.kind, failure.kind, str(failure)
    rec.dead, rec.silent = failure.dead, failure.silent


def _merge(rec: OpRecord, replies: list[dict]) -> None:
    rec.seconds = max((r["seconds"] for r in replies), default=0.0)
    for r in replies:
        if not r["ok"] and rec.ok:
            rec.ok, rec.error_type, rec.traceback = False, r["error_type"], r.get("traceback")
            rec.error = f"rank {r['rank']}: {r['error']}"
        rec.loaded[r["rank"]] = {name: unpack(p) for name, p in r["loaded"].items()}
    rec.symmetric = len({(r["ok"], r.get("error_type")) for r in replies}) <= 1
