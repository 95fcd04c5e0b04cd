"""A case as a standalone script sees it: launches (phases), named steps, and explicit per-rank data tables.

A repro script must not know the harness's layouts, seeds or case language, so everything it needs is worked out
here, once, from the case: which processes each launch starts, what each rank hands the framework (its piece of
each tensor: region and bits) and what each load must give back. Framework-free, like the case itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from faults.corrupt import Corruption, garbage
from faults.spec import CorruptFault, ErrorFault, KillFault, KillWhenFault, StateFault
from properties.model.case import Case
from reference import aoa
from reference.engine import local_tensors
from reference.layout import Box, Flat, FlatRange, Sharded, piece_count
from reference.layout import Shard as ShardPlacement
from reference.training import Param, TrainingSpec


class ReproUnsupported(Exception):
    """The case uses something a standalone script cannot show yet; the message says what, for the report."""


@dataclass(frozen=True)
class Piece:
    """One rank's piece of one tensor: the global shape, where the piece sits, its bits, and for a dist tensor
    the mesh it is laid out on (shape, placements as "S<dim>"/"R", and the owner coordinates it is pinned to)."""

    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...] | None  # a box piece: its offsets and shape
    shape: tuple[int, ...]
    flat: tuple[int, int] | None  # a flattened piece: [start, stop) of the row-major tensor
    hexbits: str
    mesh: tuple[int, ...] | None = None
    placements: tuple[str, ...] = ()
    owner: tuple[tuple[int, int], ...] = ()


# A syscall the harness kills at, as the Python audit event a script can catch it by (the call is made through
# Python: open(), os.rename, os.remove, os.mkdir); a call made in native code (a Rust or C++ writer) raises none.
AUDIT_EVENTS = {"open": "open", "openat": "open", "creat": "open", "rename": "os.rename", "renameat": "os.rename",
                "renameat2": "os.rename", "unlink": "os.remove", "unlinkat": "os.remove", "mkdir": "os.mkdir",
                "mkdirat": "os.mkdir"}


# A kill at the first of these on a path leaves what a kill right after the path's open leaves (truncated or new,
# no data): the script kills there, on the open's audit event, after making the open itself.
FIRST_WRITES = frozenset({"write", "pwrite64", "writev", "pwritev", "pwritev2"})


@dataclass(frozen=True)
class Crash:
    """A rank SIGKILLed at its ``k``-th ``syscall`` on ``path`` (relative to the checkpoint root), before the call
    runs, as the harness's kill fault does — or, with ``errno``, that call failing with it, as its error fault
    does; the script catches the call by its audit ``event``."""

    syscall: str
    event: str
    path: str
    k: int
    errno: str | None = None
    after: bool = False  # killed right after the call (its open) returns: the first write on a file it opened
    rank: int | None = None  # only this rank's call (else whichever rank makes it)
    delay: float | None = None  # killed this many seconds into the step, at no call in particular (a kill-when)
    # The processes the rank spawned meet it too, as strace follows the rank's whole tree: a training job's standing
    # writers (ZCC's worker), started before the step, make the save's calls
    spawned: bool = False

    def describe(self) -> str:
        who = "" if self.rank is None else f"rank {self.rank} "
        if self.spawned:
            who = f"{who or 'a rank '}or a process it spawned "
        if self.delay is not None:
            return f"{who or 'every rank '}killed {self.delay:g} s into the step"
        if self.after:
            return f"{who}killed at its first {self.syscall} on {self.path}, right after opening it"
        how = "killed at" if self.errno is None else f"{self.errno} at"
        return f"{who}{how} call {self.k} of {self.syscall} on {self.path}"


@dataclass(frozen=True)
class Step:
    """One operation of the case on every rank of a launch. ``table`` names the data it saves or must load:
    (layout, version). ``expect_error``: the reference engine refuses this op too, so an error is the right answer."""

    index: int
    kind: str  # save | load | wait | kill (the writers of detached saves) | resume (held writers) | check (what a
    # save recorded) | damage (files changed between ops: a corruption, what a power loss leaves) | train (a job that
    # trains itself, to the step its table holds)
    name: str | None
    table: tuple[str, int] | None = None
    use_async: bool = False
    mutate_after: bool = False
    detach: bool = False
    expect_error: bool = False
    tolerate: bool = False  # fails on the SUT before the reported step: an earlier bug the case passes through
    edits: tuple[dict, ...] = ()  # damage: concrete file edits (faults.corrupt JSON), and ``why`` says what they are
    why: str = ""
    crash: Crash | None = None  # the rank making this call is killed in the step, and the launch ends with it
    also: tuple[tuple[str, int], ...] = ()  # a load: other saves' tables it may rightly give (a re-save was killed)
    # A kill of writers: once they have handed this many bytes to write() (a kill-when fault's trigger); None, the
    # harness's kill op: once they have finished their files, as the harness kills writers no hold stopped.
    after_bytes: int | None = None
    hold: bool = False  # a save whose writers are held from the start until a resume step (the harness's stall)
    may_fail: bool = False  # a load of a name whose only save was killed part-way, or whose files were damaged since:
    # an error is right, wrong bits not

    @property
    def label(self) -> str:
        named = f"{self.kind} {self.name or 'latest'}"
        what = {"wait": "wait for detached saves", "damage": self.why,
                "kill": "SIGKILL the writers of the detached saves (the trainer goes on)",
                "check": f"the pieces save {self.name} recorded cover each tensor once",
                "resume": "let the held writers go",
                "train": f"train to step {self.table[1] if self.table else '?'}"}.get(self.kind, named)
        crash = f" ({self.crash.describe()})" if self.crash else ""
        held = " (its writers held)" if self.hold else ""
        return f"step {self.index}: {what}" + (" (async)" if self.use_async else "") + held + crash


@dataclass
class Phase:
    """One launch: ``world`` fresh processes running ``steps`` in order."""

    world: int
    steps: list[Step] = field(default_factory=list)


@dataclass
class ScriptedCase:
    sut: str
    options: dict
    phases: list[Phase]
    tables: dict[tuple[str, int], dict[int, dict[str, Piece]]]  # (layout, version) -> rank -> tensor -> piece
    case_property: str = ""  # P-COVER: the script checks what each save recorded, not only what loads give
    training: TrainingSpec | None = None  # a job that trains itself: its loop, and the parameters it trains
    params: tuple[Param, ...] = ()

    def uses(self, flag: str) -> bool:
        """Whether any step sets ``flag`` (use_async, mutate_after, detach): the script leaves out what none needs."""
        return any(getattr(step, flag) for phase in self.phases for step in phase.steps)

    def has(self, kind: str) -> bool:
        return any(step.kind == kind for phase in self.phases for step in phase.steps)

    def edit_kinds(self) -> set[str]:
        return {e["kind"] for phase in self.phases for step in phase.steps for e in step.edits}

    def crash_phases(self) -> list[int]:
        """The launches that end with a rank killed (the job restarts after them)."""
        return [number for number, phase in enumerate(self.phases) if any(s.crash for s in phase.steps)]

    def has_flat(self) -> bool:
        return any(p.flat is not None for table in self.tables.values() for ps in table.values() for p in ps.values())

    @property
    def max_world(self) -> int:
        return max(p.world for p in self.phases)


RANK_OPS = ("save", "load", "wait", "kill", "resume")
TRAINING_OPS = ("train", "save", "load", "restart", "wait", "resume")  # each emitter says which it renders
INITIAL = 0  # a training case's table of this version holds the job's state before its first step


def script_case(case: Case, expect_errors: frozenset[int] = frozenset(), upto: int | None = None,
              tolerated: frozenset[int] = frozenset(), corruptions: dict[int, dict] | None = None) -> ScriptedCase:
    """The case as launches and tables. ``expect_errors``: indices of ops the reference engine fails as well;
    ``upto``: the op where the reported failure shows (later ops are left out); ``tolerated``: earlier ops that fail
    on the SUT too, which the script reports and goes past; ``corruptions``: the concrete plan each ``corrupt`` op
    applied in the harness's run (faults.corrupt JSON)."""
    after = check_supported(case)  # a fault as file edits after its op, then the job restarts (as the harness does)
    phases: list[Phase] = []
    tables: dict[tuple[str, int], dict[int, dict[str, Piece]]] = {}
    fresh = True
    saved: dict[str | None, list[tuple[str, int]]] = {}  # name -> the tables of its saves so far, in order
    killed: dict[str | None, tuple[str, int]] = {}  # name -> the table of the save of it last killed part-way
    damaged: set[str | None] = set()  # names whose files a corruption changed since their last save
    order: list[str | None] = []  # saved names, the one saved last at the end
    for index, op in enumerate(case.ops[: None if upto is None else upto + 1]):
        if op.kind == "restart":
            fresh = True
            continue
        if op.kind == "corrupt":
            plan = (corruptions or {}).get(index)
            if not plan or "kind" not in plan:
                raise ReproUnsupported(f"op {index} is a 'corrupt' whose concrete plan is unknown (it damaged nothing)")
            if not phases:
                raise ReproUnsupported(f"op {index} corrupts before any launch")
            phases[-1].steps.append(Step(index, "damage", None, edits=(_edit(plan),), why=f"corrupt {describe(plan)}"))
            damaged |= _damaged_names(plan, saved)
            continue
        which = case.op_layouts(index)
        world = case.world_size(which)
        if fresh or phases[-1].world != world:
            phases.append(Phase(world))
            fresh = False
        table = None
        if op.kind in ("save", "load", "train"):
            stored = op.kind == "save" and aoa.AOA in case.options  # saved in the other model's structure
            # a load restores a weight or its master saved in place of the other (reference.master_weights)
            restored = op.kind == "load" and case.restored(op.version, which) != case.expected(op.version, which)
            table = (f"{which}:stored" if stored else f"{which}:restored" if restored else which, op.version)
            if table not in tables:
                tables[table] = _table(case, which, op.version, world, stored, restored)
        crash = _crash(case) if case.fault is not None and index == case.fault.op else None
        also: tuple[tuple[str, int], ...] = ()
        acknowledged = [n for n in order if n not in killed]
        latest = op.kind == "load" and op.name is None and bool(order) and order[-1] in killed
        versions: dict[int, None] = {}
        if latest:  # "latest" after a save killed part-way: that save whole, or the newest one acknowledged
            versions = dict.fromkeys([killed[order[-1]][1], *(saved[n][-1][1] for n in acknowledged[-1:])])
        elif op.kind == "load" and op.name in killed:  # the killed re-save, or the save before it, whole
            before = saved[op.name][:-1] or [killed[op.name]]
            versions = dict.fromkeys((before[-1][1], killed[op.name][1]))
        also = tuple((which, v) for v in versions if (which, v) != table)
        for key in also:
            if key not in tables:
                tables[key] = _table(case, which, key[1], world)
        kills = index == getattr(case.fault, "op", None) and _kills_writers(case)
        unacknowledged = op.kind == "load" and ((op.name in killed and not saved[op.name][:-1]) or op.name in damaged
                                                or (latest and not acknowledged))
        phases[-1].steps.append(Step(index, op.kind, op.name, table, op.use_async, op.mutate_after,
                                     op.detach or kills, index in expect_errors, index in tolerated, crash=crash,
                                     also=also, hold=op.kind == "save" and op.stall, may_fail=unacknowledged))
        if op.kind == "save" and case.property == "P-COVER" and crash is None:
            phases[-1].steps.append(Step(index, "check", op.name))  # what the save recorded tiles each tensor
        if kills:  # its writers killed once it returned, then waited for: the job restarts after
            trigger = case.fault.bytes_written or 0
            phases[-1].steps += [Step(index, "kill", None, after_bytes=trigger), Step(index, "wait", None)]
            fresh = True
        if op.kind == "save" and table is not None:
            saved.setdefault(op.name, []).append(table)
            order = [n for n in order if n != op.name] + [op.name]
            damaged.discard(op.name)
            if crash is not None:
                killed[op.name] = table
            else:
                killed.pop(op.name, None)
        if crash is not None:
            fresh = True  # the job restarts: what follows runs in fresh processes on what the kill left
        elif after is not None and index == case.fault.op:
            phases[-1].steps.append(Step(index, "damage", None, edits=after[0], why=after[1]))
            if isinstance(case.fault, CorruptFault):
                damaged |= _damaged_names(case.fault.plan, saved)
            fresh = True
    if case.training is None:
        return ScriptedCase(case.sut, dict(case.options), phases, tables, case.property)
    start = ("save", INITIAL)  # the job starts under the save layouts (Case.op_layouts)
    tables.setdefault(start, _table(case, *start, phases[0].world if phases else 1))
    return ScriptedCase(case.sut, dict(case.options), phases, tables, case.property, case.spec(), case.params())


def check_supported(case: Case) -> tuple[tuple[dict, ...], str] | None:
    """Raise ``ReproUnsupported`` for what no script can show yet (before any launch is spent on the case); else
    the case's fault as file edits (None without one)."""
    if case.training is not None:
        return _check_training(case)
    for index, op in enumerate(case.ops):
        if op.kind not in (*RANK_OPS, "restart", "corrupt"):
            raise ReproUnsupported(f"op {index} is a {op.kind!r} (the script cannot do it yet)")
    return None if _kills_writers(case) or _crash(case) is not None else _fault_edits(case)


def _check_training(case: Case) -> None:
    """A training case's steps, where its SUT's emitter trains (harness.repro.render.emitter says whether it does),
    and its fault where it is a kill or an injected errno at a syscall (or a rank's kill on a delay), which the
    script inflicts itself in the rank and in the processes it spawned; other faults are not scripted there yet."""
    for index, op in enumerate(case.ops):
        if op.kind not in TRAINING_OPS:
            raise ReproUnsupported(f"op {index} is a {op.kind!r} in a training case (the script cannot do it yet)")
    fault = case.fault
    if fault is None:
        return None
    if _kills_writers(case) or _crash(case) is None:
        which = f" ({fault.state.get('kind')} state)" if isinstance(fault, StateFault) else ""
        raise ReproUnsupported(f"a {fault.kind} fault{which} in a training case (the script injects a kill or an "
                               "errno at a syscall, or a rank's kill on a delay, into a training job; not this kind "
                               "yet)")
    return None


def _kills_writers(case: Case) -> bool:
    """Whether the fault kills the background writers of an async save (kill-when, target "children"). The script
    kills them once they have written the trigger's bytes (none: as soon as the save returns; a file appearing or a
    delay is not waited for): verification accepts that only if the script still shows the bug."""
    fault = case.fault
    if not isinstance(fault, KillWhenFault) or fault.target != "children":
        return False
    op = case.ops[fault.op]
    if op.kind != "save" or not op.use_async:
        raise ReproUnsupported(f"a kill of the writers of op {fault.op} ({op.kind}), which starts none")
    return True


def _crash(case: Case) -> Crash | None:
    """The case's kill at a syscall, or error injected into one, as a script can inflict it: on a path under the
    root, in the rank's own process (a synchronous op: an async save's writer process would not carry the script's
    hook) and, in a training job, in the processes it spawned before (its standing writers, an async save's
    included), at a call Python makes
    visible by an audit event. Others raise ``ReproUnsupported`` saying why; not such
    a fault: None."""
    fault = case.fault
    if isinstance(fault, KillWhenFault) and fault.target in (None, "tree"):
        return _timed_kill(case, fault)
    if not isinstance(fault, KillFault | ErrorFault):
        return None
    op, what = case.ops[fault.op], "a kill" if isinstance(fault, KillFault) else f"an injected {fault.errno}"
    first_write = isinstance(fault, KillFault) and fault.syscall in FIRST_WRITES and fault.k == 1
    if fault.syscall not in AUDIT_EVENTS and not first_write:
        raise ReproUnsupported(f"{what} at a {fault.syscall} call (the script can hit "
                               f"{', '.join(sorted(AUDIT_EVENTS))} only: Python raises no audit event for the others)")
    if not fault.path:
        raise ReproUnsupported(f"{what} at a call on no named path (the script matches the call by its path)")
    allowed: tuple[str, ...] = ("save",) if isinstance(fault, KillFault) else ("save", "load")
    if case.training is not None:
        allowed += ("train",)  # a job that trains itself writes while it trains too (its writers' dumps)
    spawned = case.training is not None  # a training job's writers stand from its start, in the rank's tree
    if op.kind not in allowed or (op.use_async and not spawned):
        raise ReproUnsupported(f"{what} in op {fault.op} ({op.kind}{', async' if op.use_async else ''}): the script "
                               f"hits a synchronous {' or '.join(allowed)} only (an async writer process would not "
                               "carry its hook), or a training job's async save (its writers stand from its start)")
    if first_write:  # nothing between a file's open and its first write: killed as the open returns, on disk alike
        return Crash(fault.syscall, "open", fault.path, 1, after=True, rank=fault.rank, spawned=spawned)
    return Crash(fault.syscall, AUDIT_EVENTS[fault.syscall], fault.path, fault.k,
                 fault.errno if isinstance(fault, ErrorFault) else None, rank=fault.rank, spawned=spawned)


def _timed_kill(case: Case, fault: KillWhenFault) -> Crash:
    """A kill of a rank some seconds into a synchronous op, as the harness's kill-when fault with a delay does; a
    trigger on a file or on bytes written needs the harness's watcher, and an async op's writers are processes the
    script's timer would not end."""
    op = case.ops[fault.op]
    if fault.delay is None:
        raise ReproUnsupported(f"a kill-when fault triggered by {', '.join(fault.trigger())} (the script kills on a "
                               "delay only)")
    if op.kind not in ("save", "load") or op.use_async:
        raise ReproUnsupported(f"a kill-when fault in op {fault.op} ({op.kind}{', async' if op.use_async else ''}): "
                               "the script kills ranks in a synchronous save or load only")
    return Crash("kill-when", "", "", 0, rank=fault.rank, delay=float(fault.delay))


def describe(plan: dict) -> str:
    return Corruption.from_json(plan).describe()


def _damaged_names(plan: dict, saved: dict[str | None, list]) -> set[str | None]:
    """The saved names a corruption touches: the one whose folder holds the damaged path, or every name saved so far
    where the path names none (saves sharing one folder). A load of such a name may rightly raise, as the harness's
    P-CORRUPT allows: a damaged checkpoint must give back what was saved or fail loudly, never other bits."""
    top = str(plan.get("path", "")).split("/", 1)[0]
    return {top} if top in saved else set(saved)


def _edit(plan: dict) -> dict:
    """A corruption as the script applies it: ``append`` carries its garbage bytes (the harness draws them)."""
    edit = dict(Corruption.from_json(plan).to_json())
    if edit["kind"] == "append":
        edit["content"] = garbage(edit["seed"], edit["length"]).hex()
    return edit


def _fault_edits(case: Case) -> tuple[tuple[dict, ...], str] | None:
    """A case's fault as concrete file edits after its op: a corruption with its plan; a power loss that loses the
    data of files never fsynced (they come back empty — what the finding's trace shows for them). Anything else
    needs the harness (a kill at a syscall, an injected errno, torn writes, lost directory entries)."""
    fault = case.fault
    if fault is None:
        return None
    if isinstance(fault, CorruptFault) and fault.plan:
        return (_edit(fault.plan),), f"corrupt {describe(fault.plan)}"
    if isinstance(fault, StateFault) and fault.state.get("kind") in ("lost-data", "lost-all-data"):
        detail = fault.state.get("detail", {})
        paths = detail.get("paths") or [detail.get("path")]
        edits = tuple({"kind": "lose_data", "path": p} for p in paths if p)
        return edits, (f"power loss after the save returned: the data of {', '.join(paths)} was never fsynced, "
                       "so those files come back empty")
    if isinstance(fault, StateFault) and fault.state.get("kind") == "lost-dirent":
        return _lost_entry(case, fault)
    which = f" ({fault.state.get('kind')} state)" if isinstance(fault, StateFault) else ""
    raise ReproUnsupported(f"a {fault.kind} fault{which} (the script cannot inject it yet)")


def _lost_entry(case: Case, fault: StateFault) -> tuple[tuple[dict, ...], str]:
    """A power loss that loses one directory entry, as the edit that undoes it: a created file removed, a made
    directory removed with what is in it, a rename moved back. Exact only where nothing came after the lost op (it
    is the trace's last) and the entry was new (the save's own directory, saved for the first time): a rename over
    an old file, or an unlink, cannot be undone by a script, since the old content is gone."""
    state, detail = fault.state, fault.state.get("detail", {})
    what, name = str(detail.get("what", "")), case.ops[fault.op].name or ""
    if detail.get("op") != state.get("n_ops", 0) - 1 or state.get("prefix") != state.get("n_ops"):
        raise ReproUnsupported(f"a lost directory entry ({what}) with later calls after it")
    if any(op.kind == "save" and op.name == name for op in case.ops[: fault.op]):
        raise ReproUnsupported(f"a lost directory entry ({what}) in a re-save: its old content is gone")
    kind, _, rest = what.partition(" ")
    paths = [p.split(" (")[0] for p in rest.split(" -> ")]
    if not all(p == name or p.startswith(name + "/") for p in paths):
        raise ReproUnsupported(f"a lost directory entry ({what}) outside the save's own directory")
    if kind == "rename":
        edit = {"kind": "rename_back", "path": paths[1], "to": paths[0]}
    elif kind == "mkdir" or (kind == "open" and "O_CREAT" in rest):
        edit = {"kind": "remove", "path": paths[0]}
    else:
        raise ReproUnsupported(f"a lost directory entry ({what}): the script cannot bring back what it removed")
    return (edit,), (f"power loss after the save returned: the directory entry of its last call ({what}) was "
                     "never fsynced, so it is lost")


def _table(case: Case, which: str, version: int, world: int, stored: bool = False,
           restored: bool = False) -> dict[int, dict[str, Piece]]:
    """Each rank's pieces of the state; ``stored``: as the checkpoint stores them under the case's AoA
    transformations (reference.aoa), each under its owner's name and suffix; ``restored``: as a load restores it
    (Case.restored)."""
    state = case.restored(version, which) if restored else case.expected(version, which)
    layouts = case.layouts(which)
    out: dict[int, dict[str, Piece]] = {}
    degrees = aoa.degrees_of(case.options.get(aoa.AOA, ()), lambda n: piece_count(layouts.get(n), state[n].shape))
    for rank in range(world):
        pieces = {}
        held = case.layout_rank(rank, which)  # an idle rank of a group of a subset of the job holds nothing
        local = {} if held is None else local_tensors(state, layouts, held)
        if stored:
            model = {n: aoa.Piece(lt.tensor.dtype.name, tuple(lt.global_shape), lt.region, lt.tensor.bits)
                     for n, lt in local.items()}
            for p in aoa.stored(case.options[aoa.AOA], model, degrees):
                pieces[p.key] = _piece(p.dtype, p.global_shape, p.region, p.bits, None)
        for name, lt in ({} if stored else local).items():
            pieces[name] = _piece(lt.tensor.dtype.name, lt.global_shape, lt.region, lt.tensor.bits,
                                  layouts.get(name))
        out[rank] = pieces
    return out


def _piece(dtype: str, gshape: tuple[int, ...], region, bits: np.ndarray, layout) -> Piece:
    hexbits = np.ascontiguousarray(bits).tobytes().hex()
    mesh: tuple[int, ...] | None = None
    placements: tuple[str, ...] = ()
    owner: tuple[tuple[int, int], ...] = ()
    if isinstance(layout, Sharded):
        mesh = tuple(layout.mesh.shape)
        placements = tuple(f"S{p.dim}" if isinstance(p, ShardPlacement) else "R" for p in layout.placements)
        owner = tuple((int(d), int(i)) for d, i in layout.owner)
    elif isinstance(layout, Flat):
        mesh = tuple(layout.mesh.shape)
    if isinstance(region, FlatRange):
        return Piece(dtype, tuple(gshape), None, tuple(bits.shape), (region.start, region.stop), hexbits, mesh)
    assert isinstance(region, Box)
    return Piece(dtype, tuple(gshape), tuple(region.offsets), tuple(region.shape), None, hexbits, mesh, placements,
                 owner)
