"""A case's fault (a faults.spec.Fault) armed around one operation on the live ranks, and undone after.

The fault layer (``faults/``) knows processes, syscalls and files, and the kinds of fault (faults.spec: one type
per kind, with its fields); this module maps a case's fault onto the live job: the ranks' pids, the case's
checkpoint root, the operation the fault hits. ``ARMING`` holds how each fault type runs: the injector it enters
around the op (strace, psutil triggers, a stall, RLIMIT_FSIZE, or none), what it reports, and the root it leaves
for the next ops (a power-loss state, a corrupted root). Drawn faults (``point``, ``power``) are resolved into the
concrete ``kill`` / ``error`` / ``state`` first (harness.judging.fault_runs.concrete_fault), so findings carry the
concrete fault; a ``record`` fault only traces the op's IO, and the ranks still restart after it, like after any fault.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults.crashstates import CrashState, fs_ops, materialize
from faults.errors import FaultSpecError
from faults.interleave import follow, streams
from faults.limits import FileSizeLimit
from faults.spec import (
    CorruptFault,
    DrawnFault,
    ErrorFault,
    Fault,
    FsizeFault,
    KillFault,
    KillWhenFault,
    PointFault,
    PowerFault,
    RecordFault,
    StallFault,
    StateFault,
    SyscallFault,
    TriggerFault,
)
from faults.stall import Stall
from faults.strace import Attached
from faults.triggers import KillWhen


class ArmedFault:
    """The fault of a case around its operation on live ranks: ``with ArmedFault(fault, pids, root): op()``, then
    ``after()`` for the root the next operations use, and ``report`` for the finding (what fired, and how)."""

    def __init__(self, fault: Fault, pids: dict[int, int], root: Path) -> None:
        self.fault, self.pids, self.root = fault, dict(pids), root
        self.report: dict[str, Any] = {"kind": fault.kind}
        self._arming = ARMING[type(fault)]
        self._stack = ExitStack()
        self._injector: Any = None
        self.base: Path | None = None  # a copy of the root as it was before the op (kinds that need it)
        self.recording = None  # the operation's trace, for kinds that attach strace
        self.resolved: Fault | None = None  # the concrete fault, when the case's fault named one by seed
        self.tid_stream: dict[int, int] = {}  # traced thread id -> rank (faults.interleave)

    def targets(self, rank: int | None = None) -> list[int]:
        """The pids a fault hits: rank ``rank``'s, or every rank's."""
        if rank is None:
            return [self.pids[r] for r in sorted(self.pids)]
        if rank not in self.pids:
            raise FaultSpecError(f"fault rank {rank} is not one of the ranks {sorted(self.pids)}")
        return [self.pids[rank]]

    def keep_base(self) -> None:
        self.base = self.root.parent / (self.root.name + ".before")
        shutil.copytree(self.root, self.base, symlinks=True)

    def __enter__(self) -> ArmedFault:
        self._injector = self._arming.arm(self, self.fault)
        if self._injector is not None:
            self._stack.enter_context(self._injector)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        inj = self._injector
        if isinstance(inj, Attached):
            self.recording = inj.recording
            rank_of = {pid: rank for rank, pid in self.pids.items()}
            roots = {tid: rank_of[pid] for tid, pid in inj.initial_tids.items() if pid in rank_of}
            self.tid_stream = streams(inj.recording, roots)
        elif inj is not None:
            self.report.update(inj.report())
        if self._arming.on_exit is not None:
            self._arming.on_exit(self, inj)

    def role(self, pid: int, initial_tids: dict[int, int]) -> str:
        """Which process the fault hit, in the case's terms (pids differ from run to run)."""
        for rank, rank_pid in self.pids.items():
            if pid == rank_pid:
                return f"rank {rank}"
            if initial_tids.get(pid) == rank_pid:
                return f"rank {rank} (a thread or child it had before the op)"
        return "a process or thread started during the op (an async writer)"

    def after(self) -> Path:
        """Apply post-operation faults; returns the root the remaining operations use."""
        return self._arming.after(self, self.fault)


# --- one arming per fault type ----------------------------------------------------------------------------------


def _strace_injection(armed: ArmedFault, fault: SyscallFault) -> Attached:
    path = None if fault.path is None else str(armed.root if fault.path == "." else armed.root / fault.path)
    action = f"error={fault.errno}" if isinstance(fault, ErrorFault) else "signal=KILL"
    injector = Attached(armed.targets(fault.rank), syscalls=(fault.syscall,),
                        inject=(fault.syscall, fault.k, action, path))
    armed.report.update(mechanism="strace", syscall=fault.syscall, k=fault.k, path=fault.path)
    return injector


def _injected_call(armed: ArmedFault, injector: Attached) -> None:
    call = injector.injected_call
    armed.report.update(fired=call is not None,
                        hit=None if call is None else f"{call.name} on {call.path} (pid {call.pid})",
                        target=None if call is None else armed.role(call.pid, injector.initial_tids))


def _recording(armed: ArmedFault, fault: RecordFault) -> Attached:
    if fault.lead is not None:
        armed.targets(fault.lead)  # a rank of the case
    if fault.keep_base:
        armed.keep_base()
    return Attached(armed.targets(), capture_data=bool(fault.capture))


def _state_recording(armed: ArmedFault, fault: StateFault) -> Attached:
    armed.keep_base()
    armed.report.update(mechanism="strace", state=fault.state)
    return Attached(armed.targets(), capture_data=True)


def _power_loss(armed: ArmedFault, fault: StateFault) -> Path:
    """Replace the root by the crash state of the op's recorded IO (rearranged into the recorded schedule)."""
    assert armed.recording is not None
    ops = fs_ops(armed.recording, str(armed.root))
    if fault.schedule is not None:
        ops = follow(ops, armed.recording, armed.tid_stream, fault.schedule)
    state = CrashState.from_json(fault.state)
    dest = armed.root.parent / (armed.root.name + ".state")
    materialize(ops, state, dest, base=armed.base)
    # A save counts as acknowledged only in states where all of its IO had been issued (it returned).
    armed.report.update(fired=True, acknowledged=state.prefix >= len(ops))
    return dest


def _fsize(armed: ArmedFault, fault: FsizeFault) -> FileSizeLimit:
    return FileSizeLimit(armed.targets(), fault.limit)


def _trigger(armed: ArmedFault, fault: TriggerFault) -> dict[str, Any]:
    trigger = fault.trigger()
    if "file_appears" in trigger:
        trigger["file_appears"] = str(armed.root / trigger["file_appears"])
    return trigger


def _kill_when(armed: ArmedFault, fault: KillWhenFault) -> KillWhen:
    target = fault.target if fault.given("target") else "tree"
    return KillWhen(armed.targets(fault.rank), target=target, **_trigger(armed, fault))


def _stall(armed: ArmedFault, fault: StallFault) -> Stall:
    return Stall(armed.targets(fault.rank), duration=fault.duration, **_trigger(armed, fault))


def _corruption(armed: ArmedFault, fault: CorruptFault) -> Path:
    """Corrupt the root after the op; a drawn plan is reported and kept as the resolved (concrete) fault."""
    corruption = fault.inflict(armed.root)
    if not fault.given("plan"):
        armed.resolved = CorruptFault(op=fault.op, plan=corruption.to_json())
    armed.report.update(mechanism="file", fired=True, plan=corruption.to_json())
    return armed.root


def _unresolved(armed: ArmedFault, fault: DrawnFault) -> None:
    raise FaultSpecError(f"a {fault.kind} fault must be resolved (harness.judging.fault_runs.concrete_fault) "
                         "before it runs")


def _nothing(armed: ArmedFault, fault: Fault) -> None:
    return None


def _same_root(armed: ArmedFault, fault: Fault) -> Path:
    return armed.root


@dataclass(frozen=True)
class Arming:
    """How one fault type runs: ``arm`` returns the injector entered around the op (or None); ``on_exit`` sees it
    once it has exited; ``after`` returns the root the next ops use."""

    arm: Callable[[ArmedFault, Any], Any]
    after: Callable[[ArmedFault, Any], Path] = _same_root
    on_exit: Callable[[ArmedFault, Any], None] | None = None


ARMING: dict[type[Fault], Arming] = {
    KillFault: Arming(_strace_injection, on_exit=_injected_call),
    ErrorFault: Arming(_strace_injection, on_exit=_injected_call),
    FsizeFault: Arming(_fsize),
    KillWhenFault: Arming(_kill_when),
    StallFault: Arming(_stall),
    StateFault: Arming(_state_recording, after=_power_loss),
    CorruptFault: Arming(_nothing, after=_corruption),
    PointFault: Arming(_unresolved),
    PowerFault: Arming(_unresolved),
    RecordFault: Arming(_recording),
}
