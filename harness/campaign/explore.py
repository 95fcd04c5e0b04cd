"""Bounded-exhaustive crash exploration (ACE/CrashMonkey: almost every crash-consistency bug they found needs at
most three operations): every sequence of at most ``max_len`` writing ops over one fixed small state, every op of
it in turn the fault op, and for each, every crash point (a SIGKILL at each syscall it makes under the root) and
every power-loss state of its IO (faults.crashstates), each judged by the history checker.

A *shape* is a string over ``S`` (save under a new name), ``R`` (re-save into the name saved last: a job resumed
from an older step saves that step again; every SUT is asked, and one that cannot is a finding), ``T`` (``rotate``
keeping 1: SUTs claiming ``rotate``) and ``A`` (an async save under a new name, waited for within its op, so its
writer's calls are the op's own: SUTs claiming ``async``); it starts with ``S`` (a re-save or a rotation before any
save means nothing). Its ops are followed by the recovery tail of the fault scenario
(properties.generate.fault_cases.fault_ops): after the faulted op the job restarts, the ops after it in the shape run,
then the latest is loaded (where the SUT has one), every saved name by the version it should hold, and a new
version is saved and loaded. A SUT running its own training loop (``trains``) saves the step it is at, so there a
version is a step: each new save trains to its step first, a re-save resumes the job from the name's step, and the
fault ops are the shape's saves alone.

Per shape the report counts ``judged / total``: total is what was enumerated, judged what got a verdict; a point or
state that could not be run counts against judged and keeps its error, never dropped. Each fault op is traced
once (harness.judging.fault_runs.Traced) and its points and states reuse the trace. A failure is replayed as its own
case in fresh processes (and charged to the fault only if the shape passes without it) before it counts; findings
carry the exact concrete fault (``kill`` / ``state``) and replay with ``ckpt-harness replay``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from faults.spec import RecordFault
from harness.judging.fault_runs import CaseJudge, CrashResult, at_most, judge_crash_states, judge_points, traced
from harness.judging.judge import charge_to_fault
from harness.judging.run import run_case
from harness.ranks.runners import Runners
from properties.check.history import check_history
from properties.generate.cases import Caps
from properties.generate.fault_cases import COMMIT_TIMEOUT, has_latest
from properties.model.case import Case, Op, TensorCase
from properties.model.verdicts import Judgement
from reference.layout import Mesh, Replicate, Shard, Sharded
from reference.namespaces import STEP_KEY
from reference.training import RNG_KEY, TrainingSpec, family_keys

LETTERS = {"S": "save", "R": "re-save", "T": "rotate", "A": "async save"}


def alphabet(capabilities: Iterable[str]) -> str:
    """The ops a SUT's shapes use: saves and re-saves always, rotations and async saves where it claims them (each
    new letter last, so the shapes the others make keep their order)."""
    caps = set(capabilities)
    return "SR" + ("T" if "rotate" in caps else "") + ("A" if "async" in caps else "")


def shapes(capabilities: Iterable[str], max_len: int) -> list[str]:
    """Every shape of 1..``max_len`` ops over the SUT's alphabet that starts with a save, shortest first."""
    letters = alphabet(capabilities)
    return ["S" + "".join(rest) for n in range(max_len) for rest in itertools.product(letters, repeat=n)]


def family(capabilities: Iterable[str], world: int) -> tuple[tuple[TensorCase, ...], dict[str, dict]]:
    """The fixed small state, within what the SUT holds: a zero-size tensor, an uneven shard (5 rows over the
    ranks), a replicated tensor and a BF16 one; a trainer's state (``trainer_state``) as two parameters, a BF16 one
    of 5 rows (with its FP32 master weight and moments) and a zero-size one, all replicated; a training job's
    (``trains``) as two parameters the job's own loop trains, a BF16 one of 5 rows and an FP32 one, replicated."""
    caps = Caps(capabilities)
    mesh = Mesh((world,))
    rep = Sharded(mesh, (Replicate(),)).to_json()
    shard = rep if caps.replicated_only else Sharded(mesh, (Shard(0),)).to_json()
    plain = "F32" if "F32" in caps.dtypes else caps.dtypes[0]
    bf16 = "BF16" if "BF16" in caps.dtypes else plain
    if "trains" in caps.caps:  # a training job's parameters: the SUT's loop makes their families, RNG and step
        params = (TensorCase("w", bf16, (5, 2), 1), TensorCase("b", "F32", (0,) if caps.zero_size else (3,), 2))
        layout = {key: rep for p in params for key in family_keys(p.name).values()}
        return params, layout | {RNG_KEY: rep, STEP_KEY: rep}
    if caps.trainer_state:
        params = [("w", bf16, (5, 2), 1), ("b", "F32", (0,) if caps.zero_size else (3,), 2)]
        tensors = []
        for p, dtype, shape, seed in params:
            members = [(f"model/{p}", dtype), (f"optimizer/{p}.m1", "F32"), (f"optimizer/{p}.m2", "F32")]
            members += [(f"master/{p}", "F32")] if dtype != "F32" else []
            tensors += [TensorCase(k, dt, shape, seed * 10 + n) for n, (k, dt) in enumerate(members)]
        return tuple(tensors), {t.name: rep for t in tensors}
    tensors = [
        TensorCase("model/w", plain, (5, 2), 1),  # uneven: ceil(5 / world) rows per rank, the last ones fewer
        TensorCase("model/b", plain, (3,), 2),
        TensorCase("ema/w", bf16, (4, 2), 3),
    ]
    layout = {"model/w": shard, "model/b": rep, "ema/w": shard}
    if caps.zero_size:
        tensors.append(TensorCase("model/emb", plain, (0, 3), 4))
        layout["model/emb"] = shard
    return tuple(tensors), layout


def shape_ops(shape: str, *, latest: bool, trains: bool = False) -> tuple[Op, ...]:
    """The shape's ops, then the recovery tail: load the latest (``latest``), every saved name (newest first) by
    the version it should hold, then save a new version and load it. ``trains`` (a SUT running its own training
    loop, which saves the step it is at): a version is a step, each new save trains to its step first, and a
    re-save resumes the job from the name's step and saves that step again."""
    ops: list[Op] = []
    holds: dict[str, int] = {}  # name -> the version its last save wrote (version: the op's index)
    last = "step-0"
    for index, letter in enumerate(shape):
        if letter == "T":
            ops.append(Op("rotate", keep=1))
            continue
        version = holds[last] if trains and letter == "R" else index + trains
        name = last if letter == "R" else f"step-{version}"
        if trains:
            ops.append(Op("load", name, version) if letter == "R" else Op("train", None, version))
        ops.append(Op("save", name, version, use_async=letter == "A"))
        holds.pop(name, None)  # re-inserted: the dict stays in the order of each name's last save
        holds[name], last = version, name
    newest = len(shape) + trains
    tail = [Op("load", None, holds[last])] if latest else []
    tail += [Op("load", name, v) for name, v in reversed(holds.items())]
    tail += [Op("train", None, newest)] if trains else []
    tail += [Op("save", f"step-{newest}", newest), Op("load", f"step-{newest}", newest)]
    return (*ops, *tail)


def shape_writes(case: Case, shape: str) -> list[int]:
    """The index in ``case.ops`` of each op of ``shape`` (each writes: a save or a rotation), the ops a fault hits;
    a training shape's trains and resumes before them are not faulted."""
    return [i for i, op in enumerate(case.ops) if op.kind in ("save", "rotate")][:len(shape)]


def shape_case(sut: str, capabilities: Iterable[str], world: int, shape: str, options: dict | None = None) -> Case:
    """The case of ``shape`` (no fault yet) over the fixed state."""
    caps = set(capabilities)
    bad = set(shape) - set(alphabet(caps))
    if not shape.startswith("S") or bad:
        raise ValueError(f"shape {shape!r}: must start with S and use only {alphabet(caps)} (ops {sorted(bad)})")
    opts = dict(options or {})
    tensors, layout = family(caps, world)
    trains = "trains" in caps
    ops = shape_ops(shape, latest=has_latest(caps, opts), trains=trains)
    training = TrainingSpec.from_json(Caps(caps).training).to_json() if trains else None
    return Case("P-ATOMIC", sut, tensors, layout, layout, ops, opts, 0, training=training)


@dataclass
class ShapeReport:
    """One shape's exploration: every crash point and state of every op of it, judged."""

    shape: str
    case: Case | None = None  # the shape's case explored (without a fault): its findings are this case with theirs
    control: Judgement | None = None  # the shape without a fault
    points: list[CrashResult] = field(default_factory=list)
    states: list[CrashResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # fault ops whose trace could not be taken (each one unjudged)
    failed_control: Judgement | None = None  # the full state's control, where it failed and a smaller state passes
    dropped: str = ""  # the tensor left out of the state for that reason

    @property
    def results(self) -> list[CrashResult]:
        return self.points + self.states

    @property
    def total(self) -> int:
        return len(self.results) + len(self.errors)

    @property
    def judged(self) -> int:
        return sum(1 for r in self.results if r.judged)

    @property
    def failing(self) -> list[CrashResult]:
        return [r for r in self.results if r.failing]

    def row(self) -> dict:
        """The report's numbers for this shape."""
        return {
            "shape": self.shape, "ops": " ".join(LETTERS[c] for c in self.shape),
            "control": ("-" if self.control is None else self.control.verdict.value) + (
                f" (full state: {self.failed_control.verdict.value}; explored without {self.dropped})"
                if self.dropped else ""),
            "points": f"{sum(r.judged for r in self.points)}/{len(self.points)}",
            "states": f"{sum(r.judged for r in self.states)}/{len(self.states)}",
            "judged": self.judged, "total": self.total, "failing": len(self.failing),
            "flaky": sum(1 for r in self.results if r.confirmed is False),
            "unconfirmed": sum(1 for r in self.failing if r.confirmed is None),
            "excused": sum(1 for r in self.results if r.judged and r.judgement.excuse is not None),
        }


def explore_shape(shape: str, case: Case, runners: Runners, confirm: CaseJudge | None, *, points: bool = True,
                  states: bool = True, on_result: Callable[[CrashResult], None] | None = None,
                  confirm_limit: int | None = None, errno: str | None = None) -> ShapeReport:
    """Every crash point and power-loss state of every op of ``shape`` in ``case`` (its shape_case), judged;
    ``confirm_limit``: replay only that many failures per op and kind (the rest stay unconfirmed failures);
    ``errno``: each crash point fails its call with that errno instead of killing the rank."""
    report = ShapeReport(shape)
    report.control = check_history(case, run_case(case, runners), runners.cls.clear_errors)
    if not report.control.ok:  # a bug of the plain shape (often a known one) would excuse every fault: shrink it away
        case, report.dropped, passing = without_failing_tensor(case, runners)
        if passing is not None:
            report.failed_control, report.control = report.control, passing
    report.case = case
    confirm_ = confirm if report.control.ok else None  # failures the shape has anyway are not the fault's
    seen = (lambda n, r: on_result(r)) if on_result is not None else None
    for op in shape_writes(case, shape):  # every op of the shape writes (a save or a rotation); the tail is not
        fcase = dataclasses.replace(case, fault=RecordFault(op=op))  # faulted
        try:
            with traced(fcase, runners) as t:
                if points:
                    report.points += judge_points(t, t.points(errno), runners, at_most(confirm_, confirm_limit),
                                                  seen)
                if states:
                    report.states += judge_crash_states(t, list(t.states()), runners,
                                                        at_most(confirm_, confirm_limit), seen)
        except Exception as exc:  # the trace of this op failed: one unjudged entry says why
            report.errors.append(f"op {op}: {type(exc).__name__}: {exc}")
    if not report.control.ok:
        for r in report.results:
            if r.judged and not r.judgement.ok:
                r.judgement = charge_to_fault(dataclasses.replace(case, fault=r.fault), r.judgement, report.control)
    return report


def without_failing_tensor(case: Case, runners: Runners) -> tuple[Case, str, Judgement | None]:
    """The case without the first tensor whose absence lets its fault-free run pass: a failure the full state has
    without any fault (a zero-size tensor the SUT cannot save, say) would otherwise excuse every crash point and
    power-loss state of the shape, hiding what the fault does to the rest. (case, "", None) where no single tensor
    is to blame: the shape is explored as it is, its failures charged to the fault against the failing control."""
    for tensor in case.tensors:
        name = tensor.name
        keys = {name, *family_keys(name).values()} if case.training is not None else {name}  # a parameter's state
        smaller = dataclasses.replace(
            case, tensors=tuple(t for t in case.tensors if t.name != name),
            save_layout={k: v for k, v in case.save_layout.items() if k not in keys},
            load_layout={k: v for k, v in case.load_layout.items() if k not in keys})
        judgement = check_history(smaller, run_case(smaller, runners), runners.cls.clear_errors)
        if judgement.ok:
            return smaller, name, judgement
    return case, "", None


def explore(sut: str, runners: Runners, world: int, max_len: int, confirm: CaseJudge | None = None, *,
            options: dict | None = None, points: bool = True, states: bool = True,
            only: Iterable[str] | None = None, confirm_limit: int | None = None, errno: str | None = None,
            on_result: Callable[[str, CrashResult], None] | None = None) -> list[ShapeReport]:
    """Explore every shape of at most ``max_len`` ops (or just ``only``) for ``sut`` on ``world`` ranks."""
    caps = runners.cls.capabilities
    options = {"commit_timeout": COMMIT_TIMEOUT, **(options or {})}
    reports = []
    for shape in (list(only) if only is not None else shapes(caps, max_len)):
        case = shape_case(sut, caps, world, shape, options)
        seen = (lambda r, s=shape: on_result(s, r)) if on_result is not None else None
        reports.append(explore_shape(shape, case, runners, confirm, points=points, states=states, on_result=seen,
                                     confirm_limit=confirm_limit, errno=errno))
    return reports
