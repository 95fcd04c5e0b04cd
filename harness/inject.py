"""A case's ``fault``: parsed from the case file, armed around one operation on the live ranks, and undone after.

The fault layer (``faults/``) knows processes, syscalls and files; this module maps a case's fault onto them: the
ranks' pids, the case's checkpoint root, the operation the fault hits. Every fault is plain JSON in the case, so a
finding replays the same fault (kind, target, syscall and k, or the crash state) exactly.

Kinds (``op`` is the index of the operation the fault hits; paths are relative to the checkpoint root):

* ``kill``: SIGKILL whichever rank process or child (async writer) makes its ``k``-th ``syscall`` on ``path``
  (strace attached to the warm ranks; counting starts at the operation).
* ``error``: that call fails with ``errno`` (ENOSPC, EIO, EDQUOT) instead.
* ``fsize``: RLIMIT_FSIZE of ``limit`` bytes on the ranks for the operation (a write past it fails with EFBIG).
* ``kill-when``: psutil fallback where ptrace is not allowed: kill rank ``rank``'s tree (or only its ``children``)
  when ``file_appears`` (a glob) matches, after ``bytes_written`` bytes, or after ``delay`` seconds.
* ``stall``: SIGSTOP rank ``rank`` for ``duration`` seconds when one of those triggers fires (a straggler).
* ``state``: record the operation's IO, then replace the root by the power-loss ``state`` (faults.crashstates)
  built from that trace before the next operation; ``schedule`` (the rank of each IO op as recorded) rearranges
  this run's IO into the recorded interleaving first (faults.interleave).
* ``corrupt``: apply the corruption ``plan`` (faults.corrupt) to the root after the operation; or plan one from
  ``seed``, ``corruption`` (a kind of faults.corrupt) and ``region`` on the files the operation left (the report
  then carries the concrete plan, which the finding keeps).
* ``point``: crash point number ``index`` of a recording of this very case, hit with ``action`` (``kill``, or an
  errno name for an ``error``); ``power``: power-loss state number ``index`` of it. Both are resolved into the
  concrete ``kill`` / ``error`` / ``state`` first (harness.faultrun.concrete_fault), so findings carry the concrete
  fault.
* ``record``: no fault; trace the operation's IO (with the written bytes when ``capture``; a copy of the root as
  it was before the op beside it when ``keep_base``) for enumerating crash points and crash states. The ranks
  still restart after it, like after any fault.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.corrupt import KINDS as CORRUPTIONS
from faults.corrupt import Corruption, apply, check_relpath, corrupt
from faults.crashstates import CrashState, fs_ops, materialize
from faults.errors import FaultSpecError
from faults.interleave import follow, streams
from faults.limits import FileSizeLimit
from faults.stall import Stall
from faults.strace import ERRNO_NAMES, Attached
from faults.triggers import KillWhen

KINDS = ("kill", "error", "fsize", "kill-when", "stall", "state", "corrupt", "point", "power", "record")
_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # kind -> (required, optional) besides kind and op
    "kill": ({"syscall", "k"}, {"path"}),
    "error": ({"syscall", "k", "errno"}, {"path"}),
    "fsize": ({"limit"}, set()),
    "kill-when": (set(), {"rank", "target", "file_appears", "bytes_written", "delay"}),
    "stall": ({"duration"}, {"rank", "file_appears", "bytes_written", "delay"}),
    "state": ({"state"}, {"schedule"}),
    "corrupt": (set(), {"plan", "seed", "corruption", "region"}),
    "point": ({"index"}, {"syscalls", "action"}),
    "power": ({"index"}, set()),
    "record": (set(), {"capture", "keep_base"}),
}
_TRIGGERS = ("file_appears", "bytes_written", "delay")


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    op: int
    params: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: object, n_ops: int) -> FaultSpec:
        """Validate a case's ``fault`` object; every problem is a FaultSpecError naming the field."""
        if not isinstance(raw, dict):
            raise FaultSpecError(f"fault must be an object, got {type(raw).__name__}")
        kind = raw.get("kind")
        if kind not in _FIELDS:
            raise FaultSpecError(f"fault kind {kind!r} is not one of {', '.join(KINDS)}")
        op = raw.get("op")
        if not isinstance(op, int) or isinstance(op, bool) or not 0 <= op < n_ops:
            raise FaultSpecError(f"fault op must be the index of one of the case's {n_ops} ops, got {op!r}")
        required, optional = _FIELDS[kind]
        params = {k: v for k, v in raw.items() if k not in ("kind", "op")}
        missing, unknown = required - params.keys(), params.keys() - required - optional
        if missing or unknown:
            raise FaultSpecError(f"{kind} fault: missing {sorted(missing)}, unknown {sorted(unknown)}")
        spec = cls(kind, op, params)
        spec._check()
        return spec

    def _check(self) -> None:
        p = self.params
        if self.kind in ("kill", "error"):
            if not isinstance(p["syscall"], str) or not p["syscall"].isidentifier():
                raise FaultSpecError(f"syscall must be a syscall name, got {p['syscall']!r}")
            _int(p["k"], "k")
            if p.get("path") not in (None, "."):  # "." is the root directory itself
                check_relpath(p["path"])
        if self.kind == "error" and p["errno"] not in ERRNO_NAMES:
            raise FaultSpecError(f"errno must be one of {ERRNO_NAMES}, got {p['errno']!r}")
        if self.kind == "fsize":
            _int(p["limit"], "limit")
        if self.kind in ("kill-when", "stall"):
            given = [t for t in _TRIGGERS if p.get(t) is not None]
            if len(given) != 1:
                raise FaultSpecError(f"{self.kind} fault needs exactly one trigger of {_TRIGGERS}, got {given}")
            if p.get("file_appears") is not None:
                check_relpath(p["file_appears"])
            if p.get("rank") is not None:
                _int(p["rank"], "rank", low=0)
        if self.kind in ("point", "power"):
            _int(p["index"], "index", low=0)
        if self.kind == "point" and p.get("action", "kill") not in ("kill", *ERRNO_NAMES):
            raise FaultSpecError(f"point action must be kill or one of {ERRNO_NAMES}, got {p['action']!r}")
        if self.kind == "stall" and (not isinstance(p["duration"], int | float) or not 0 < p["duration"] <= 600):
            raise FaultSpecError(f"stall duration must be a number of seconds in (0, 600], got {p['duration']!r}")
        if self.kind == "corrupt":
            if ("plan" in p) == ("seed" in p or "corruption" in p):
                raise FaultSpecError("corrupt fault: give either a plan, or a seed and a corruption kind")
            if "plan" not in p:
                _int(p.get("seed"), "seed", low=0)
                if p.get("corruption") not in CORRUPTIONS:
                    raise FaultSpecError(f"corruption must be one of {CORRUPTIONS}, got {p.get('corruption')!r}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "op": self.op, **self.params}


def _int(value: object, name: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise FaultSpecError(f"{name} must be an int >= {low}, got {value!r}")
    return value


class ArmedFault:
    """The fault of a case around its operation on live ranks: ``with ArmedFault(spec, pids, root): op()``, then
    ``after()`` for the root the next operations use, and ``report`` for the finding (what fired, and how)."""

    def __init__(self, spec: FaultSpec, pids: dict[int, int], root: Path) -> None:
        self.spec, self.pids, self.root = spec, dict(pids), root
        self.report: dict[str, Any] = {"kind": spec.kind}
        self._stack = ExitStack()
        self._injector: Any = None
        self._base: Path | None = None
        self.recording = None  # the operation's trace, for kinds that attach strace
        self.resolved: dict | None = None  # the concrete fault, when the spec named one by seed
        self.tid_stream: dict[int, int] = {}  # traced thread id -> rank (faults.interleave)

    def _targets(self) -> list[int]:
        rank = self.spec.params.get("rank")
        if rank is None:
            return [self.pids[r] for r in sorted(self.pids)]
        if rank not in self.pids:
            raise FaultSpecError(f"fault rank {rank} is not one of the ranks {sorted(self.pids)}")
        return [self.pids[rank]]

    def __enter__(self) -> ArmedFault:
        p, kind = self.spec.params, self.spec.kind
        if kind in ("kill", "error"):
            path = None if p.get("path") is None else str(self.root if p["path"] == "." else self.root / p["path"])
            action = "signal=KILL" if kind == "kill" else f"error={p['errno']}"
            self._injector = Attached(self._targets(), syscalls=(p["syscall"],),
                                      inject=(p["syscall"], p["k"], action, path))
            self.report.update(mechanism="strace", syscall=p["syscall"], k=p["k"], path=p.get("path"))
        elif kind == "record":
            if p.get("keep_base"):
                self._keep_base()
            self._injector = Attached(self._targets(), capture_data=bool(p.get("capture")))
        elif kind == "state":
            self._keep_base()
            self._injector = Attached(self._targets(), capture_data=True)
            self.report.update(mechanism="strace", state=p["state"])
        elif kind == "fsize":
            self._injector = FileSizeLimit(self._targets(), p["limit"])
        elif kind in ("kill-when", "stall"):
            trigger = {t: p[t] for t in _TRIGGERS if p.get(t) is not None}
            if "file_appears" in trigger:
                trigger["file_appears"] = str(self.root / trigger["file_appears"])
            if kind == "kill-when":
                self._injector = KillWhen(self._targets(), target=p.get("target", "tree"), **trigger)
            else:
                self._injector = Stall(self._targets(), duration=p["duration"], **trigger)
        elif kind in ("point", "power"):
            raise FaultSpecError(f"a {kind} fault must be resolved (harness.faultrun.concrete_fault) before it runs")
        if self._injector is not None:
            self._stack.enter_context(self._injector)
        return self

    def _keep_base(self) -> None:
        self._base = self.root.parent / (self.root.name + ".before")
        shutil.copytree(self.root, self._base, symlinks=True)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        inj = self._injector
        if isinstance(inj, Attached):
            self.recording = inj.recording
            rank_of = {pid: rank for rank, pid in self.pids.items()}
            roots = {tid: rank_of[pid] for tid, pid in inj.initial_tids.items() if pid in rank_of}
            self.tid_stream = streams(inj.recording, roots)
            if self.spec.kind in ("kill", "error"):
                call = inj.injected_call
                self.report.update(fired=call is not None,
                                   hit=None if call is None else f"{call.name} on {call.path} (pid {call.pid})",
                                   target=None if call is None else self._role(call.pid, inj.initial_tids))
        elif inj is not None:
            self.report.update(inj.report())

    def _role(self, pid: int, initial_tids: dict[int, int]) -> str:
        """Which process the fault hit, in the case's terms (pids differ from run to run)."""
        for rank, rank_pid in self.pids.items():
            if pid == rank_pid:
                return f"rank {rank}"
            if initial_tids.get(pid) == rank_pid:
                return f"rank {rank} (a thread or child it had before the op)"
        return "a process or thread started during the op (an async writer)"

    def after(self) -> Path:
        """Apply post-operation faults; returns the root the remaining operations use."""
        p = self.spec.params
        if self.spec.kind == "corrupt":
            if "plan" in p:
                corruption = Corruption.from_json(p["plan"])
                apply(self.root, corruption)
            else:
                corruption = corrupt(self.root, p["corruption"], p["seed"], p.get("region", "any"))
                self.resolved = {"kind": "corrupt", "op": self.spec.op, "plan": corruption.to_json()}
            self.report.update(mechanism="file", fired=True, plan=corruption.to_json())
            return self.root
        if self.spec.kind == "state":
            assert isinstance(self._injector, Attached) and self._injector.recording is not None
            ops = fs_ops(self.recording, str(self.root))
            if p.get("schedule") is not None:
                ops = follow(ops, self.recording, self.tid_stream, p["schedule"])
            state = CrashState.from_json(p["state"])
            dest = self.root.parent / (self.root.name + ".state")
            materialize(ops, state, dest, base=self._base)
            # A save counts as acknowledged only in states where all of its IO had been issued (it returned).
            self.report.update(fired=True, acknowledged=state.prefix >= len(ops))
            return dest
        return self.root
