"""A case's fault as typed data: one frozen dataclass per kind, parsed once from the case's JSON object.

The JSON keys are the field names, and ``to_json`` gives back exactly the object that was parsed (the same keys,
the same values, an explicit ``null`` kept), so case and finding files round-trip unchanged. Like the rest of
``faults/`` this knows ops by index, ranks, syscalls, paths and errnos, never a checkpoint format; how a fault is
armed on live ranks is the harness's business (harness.judging.inject).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from .corrupt import KINDS as CORRUPTIONS
from .corrupt import Corruption, apply, check_relpath, corrupt
from .errors import FaultSpecError
from .strace import ERRNO_NAMES

TRIGGERS = ("file_appears", "bytes_written", "delay")  # what fires a kill-when or a stall (exactly one is given)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """The fault of a case: the op it hits (index into the case's ops), and the kind's own fields."""

    kind: ClassVar[str]
    drawn: ClassVar[bool] = False  # names a crash point or state by index: resolved against a recording first
    op: int
    #: Optional fields the case file gave as an explicit null (so ``to_json`` writes them back); not compared.
    nulls: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the kind's fields; every problem is a FaultSpecError naming the field."""

    def given(self, name: str) -> bool:
        """Whether the case gave field ``name`` (a value, or an explicit null)."""
        return getattr(self, name) is not None or name in self.nulls

    def to_json(self) -> dict:
        """The fault's JSON object: kind, op and every field the case gave."""
        out: dict[str, Any] = {"kind": self.kind, "op": self.op}
        out.update((f.name, getattr(self, f.name)) for f in _params(type(self)) if self.given(f.name))
        return out


@dataclass(frozen=True, kw_only=True)
class SyscallFault(Fault):
    """The ``k``-th ``syscall`` on ``path`` (relative to the root; "." is the root itself) in any rank process, or
    with ``rank`` in that rank's only: where every rank makes the call, which one meets the fault is otherwise a
    race, and the two may be different bugs."""

    syscall: str
    k: int
    path: str | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.syscall, str) or not self.syscall.isidentifier():
            raise FaultSpecError(f"syscall must be a syscall name, got {self.syscall!r}")
        _int(self.k, "k")
        if self.rank is not None:
            _int(self.rank, "rank", low=0)
        if self.path not in (None, "."):
            check_relpath(self.path)


@dataclass(frozen=True, kw_only=True)
class KillFault(SyscallFault):
    """SIGKILL whichever process makes that call (strace)."""

    kind = "kill"


@dataclass(frozen=True, kw_only=True)
class ErrorFault(SyscallFault):
    """That call fails with ``errno`` instead (strace)."""

    kind = "error"
    errno: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.errno not in ERRNO_NAMES:
            raise FaultSpecError(f"errno must be one of {ERRNO_NAMES}, got {self.errno!r}")


@dataclass(frozen=True, kw_only=True)
class FsizeFault(Fault):
    """RLIMIT_FSIZE of ``limit`` bytes on the ranks for the op (a write past it fails with EFBIG)."""

    kind = "fsize"
    limit: int

    def __post_init__(self) -> None:
        _int(self.limit, "limit")


@dataclass(frozen=True, kw_only=True)
class TriggerFault(Fault):
    """Fires on rank ``rank`` (every rank when None) when ``file_appears`` (a glob under the root) matches, after
    ``bytes_written`` bytes, or after ``delay`` seconds: exactly one trigger. psutil only, no ptrace."""

    rank: int | None = None
    file_appears: str | None = None
    bytes_written: int | None = None
    delay: float | None = None

    def __post_init__(self) -> None:
        given = [t for t in TRIGGERS if getattr(self, t) is not None]
        if len(given) != 1:
            raise FaultSpecError(f"{self.kind} fault needs exactly one trigger of {TRIGGERS}, got {given}")
        if self.file_appears is not None:
            check_relpath(self.file_appears)
        if self.rank is not None:
            _int(self.rank, "rank", low=0)

    def trigger(self) -> dict[str, Any]:
        """The one trigger, as the injectors (faults.triggers, faults.stall) take it."""
        return {t: getattr(self, t) for t in TRIGGERS if getattr(self, t) is not None}


@dataclass(frozen=True, kw_only=True)
class KillWhenFault(TriggerFault):
    """Kill the rank's process tree (``target`` "tree", the default) or only its children (its async writer)."""

    kind = "kill-when"
    target: str | None = None


@dataclass(frozen=True, kw_only=True)
class StallFault(TriggerFault):
    """SIGSTOP the rank for ``duration`` seconds (a straggler)."""

    kind = "stall"
    duration: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.duration, int | float) or not 0 < self.duration <= 600:
            raise FaultSpecError(f"stall duration must be a number of seconds in (0, 600], got {self.duration!r}")


@dataclass(frozen=True, kw_only=True)
class StateFault(Fault):
    """Power loss: replace the root by crash state ``state`` (faults.crashstates JSON) of the op's recorded IO,
    rearranged into the recorded interleaving ``schedule`` (the rank of each IO op) first."""

    kind = "state"
    state: dict
    schedule: list[int] | None = None

    def __post_init__(self) -> None:
        _check_schedule(self.schedule)


@dataclass(frozen=True, kw_only=True)
class CorruptFault(Fault):
    """After the op, apply the corruption ``plan`` (faults.corrupt JSON) to the root, or draw one from ``seed``,
    ``corruption`` (a kind of faults.corrupt) and ``region`` on the files the op left."""

    kind = "corrupt"
    plan: dict | None = None
    seed: int | None = None
    corruption: str | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        if self.given("plan") == (self.given("seed") or self.given("corruption")):
            raise FaultSpecError("corrupt fault: give either a plan, or a seed and a corruption kind")
        if not self.given("plan"):
            _int(self.seed, "seed", low=0)
            if self.corruption not in CORRUPTIONS:
                raise FaultSpecError(f"corruption must be one of {CORRUPTIONS}, got {self.corruption!r}")

    def inflict(self, root: Path) -> Corruption:
        """Apply the plan, or draw one on the files now under ``root`` and apply it; returns the concrete plan.
        The ``corrupt`` op of a sequence is this too (a seeded fault between two ops)."""
        if self.given("plan"):
            corruption = Corruption.from_json(self.plan)
            apply(root, corruption)
            return corruption
        assert self.seed is not None and self.corruption is not None
        return corrupt(root, self.corruption, self.seed, self.region if self.given("region") else "any")


@dataclass(frozen=True, kw_only=True)
class DrawnFault(Fault):
    """Number ``index`` (modulo how many there are) of what a recording of this very case offers."""

    drawn = True
    index: int

    def __post_init__(self) -> None:
        _int(self.index, "index", low=0)


@dataclass(frozen=True, kw_only=True)
class PointFault(DrawnFault):
    """A crash point, hit with ``action``: ``kill`` (the default) or an errno name; resolves to kill or error."""

    kind = "point"
    syscalls: list[str] | None = None  # only crash points of these syscalls
    action: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.given("action") and self.action not in ("kill", *ERRNO_NAMES):
            raise FaultSpecError(f"point action must be kill or one of {ERRNO_NAMES}, got {self.action!r}")


@dataclass(frozen=True, kw_only=True)
class PowerFault(DrawnFault):
    """A power-loss crash state; resolves to a state fault."""

    kind = "power"


@dataclass(frozen=True, kw_only=True)
class RecordFault(Fault):
    """No fault: trace the op's IO (with the written bytes when ``capture``; the root as it was before the op kept
    beside it when ``keep_base``), to enumerate crash points and states from. A recorded save judged by its IO
    alone keeps the interleaving its verdict was found under (``schedule``, the rank of each IO op, as a state
    fault's): ranks and their writers race, and the replay judges a new run's IO rearranged into it. Where a
    rank's IO depends on its peers' progress (a writer that walks the directory), no other run has the same IO: a
    ``lead`` rank's long-lived writers then run first, the other ranks' are held until its op has returned (within
    a grace), so the interleaving is made, not replayed."""

    kind = "record"
    capture: bool | None = None
    keep_base: bool | None = None
    schedule: list[int] | None = None
    lead: int | None = None

    def __post_init__(self) -> None:
        _check_schedule(self.schedule)
        if self.lead is not None:
            _int(self.lead, "lead", low=0)


FAULT_TYPES: dict[str, type[Fault]] = {cls.kind: cls for cls in (
    KillFault, ErrorFault, FsizeFault, KillWhenFault, StallFault, StateFault, CorruptFault, PointFault, PowerFault,
    RecordFault)}
KINDS = tuple(FAULT_TYPES)


def parse_fault(raw: object, n_ops: int) -> Fault:
    """A case's ``fault`` object (or a Fault) checked against a case of ``n_ops`` ops; every problem is a
    FaultSpecError naming the field."""
    if isinstance(raw, Fault):
        _check_op(raw.op, n_ops)
        return raw
    if not isinstance(raw, dict):
        raise FaultSpecError(f"fault must be an object, got {type(raw).__name__}")
    kind = raw.get("kind")
    cls = FAULT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FaultSpecError(f"fault kind {kind!r} is not one of {', '.join(KINDS)}")
    _check_op(raw.get("op"), n_ops)
    params = {k: v for k, v in raw.items() if k not in ("kind", "op")}
    required = {f.name for f in _params(cls) if f.default is MISSING}
    known = {f.name for f in _params(cls)}
    missing, unknown = required - params.keys(), params.keys() - known
    if missing or unknown:
        raise FaultSpecError(f"{kind} fault: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return cls(op=raw["op"], **params, nulls=frozenset(k for k, v in params.items() if v is None))


def _params(cls: type[Fault]) -> list:
    """The kind's own fields: the JSON keys besides kind and op."""
    return [f for f in fields(cls) if f.name not in ("op", "nulls")]


def _check_op(op: object, n_ops: int) -> None:
    if not isinstance(op, int) or isinstance(op, bool) or not 0 <= op < n_ops:
        raise FaultSpecError(f"fault op must be the index of one of the case's {n_ops} ops, got {op!r}")


def _check_schedule(schedule: object) -> None:
    if schedule is not None and not (isinstance(schedule, list) and all(
            isinstance(s, int) and not isinstance(s, bool) for s in schedule)):
        raise FaultSpecError(f"schedule must be a list of stream numbers (ints), got {str(schedule)[:80]}")


def _int(value: object, name: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise FaultSpecError(f"{name} must be an int >= {low}, got {value!r}")
    return value
