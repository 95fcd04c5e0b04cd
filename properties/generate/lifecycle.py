"""P-LIFECYCLE: a training job's whole life as one drawn sequence of ops, for any SUT through its capabilities.

A job trains (its version grows), saves (sync, async and waited, or detached: returning at once, perhaps with its
writers held until a ``resume`` while the job trains on, rotates or loads), waits, loses its writers (``kill``) or
itself (``restart``, perhaps onto the case's other layout and world size, resuming from an older step: the next
saves re-save names that exist, beside the debris of the crashed attempt; ``reshape``: back on the other layout,
it saves the step it resumed from again at once), rotates, has its root corrupted, loads
the latest or a name (also one never saved: a failed load, and the next load runs in the same processes), and
keeps up to ``MAX_VERSIONS`` versions in one directory. ``properties.check.history.check_history`` judges the lot.

``JobModel`` is the grammar: which ops may come next and what each does to the job. The strategy draws from it;
the stateful test (tests/test_stateful.py) drives the same model one rule at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hypothesis import strategies as st

from faults.corrupt import KINDS as CORRUPTIONS
from faults.spec import Fault, PointFault, PowerFault
from faults.strace import ERRNO_NAMES
from properties.generate.cases import (
    MAX_VERSIONS,
    Caps,
    _layouts_for,
    in_same_dir,
    load_world_of,
    mesh_of,
    options,
    tensor_cases,
)
from properties.generate.fault_cases import has_latest
from properties.model.case import Case, Op

MIN_STEPS = 3  # drawn steps at least: Hypothesis often stops a loop at once, and one save is no job's life
MAX_OPS = 24  # ops drawn before the closing loads (a burst of versions may pass it once)
MISSING = "step-999"  # a name no job saves: loading it must fail clearly, and the next load must not care
# A job trains between saves inside each save step (``step``), not as a step of its own: Hypothesis draws the first
# kind far more often than the others, and a life of training steps alone would save nothing.
KINDS = ("save", "async", "detach", "wait", "resume", "kill", "restart", "reshape", "latest", "load",
         "missing", "rotate", "corrupt", "burst")


@dataclass
class JobModel:
    """What the job knows of itself while its ops are drawn: enough to keep every op meaningful (a wait has
    something to wait for, a resume something held) and every load's expected version right."""

    caps: frozenset[str]
    latest: bool  # "load the latest" means something here
    two_layouts: bool  # the case's load layouts differ from its save layouts (another mesh or world size)
    max_pending: int = 2
    version: int = 0  # the step the job has trained to
    layout: str = "save"  # which of the case's layouts the job runs under now
    saved: dict[str, int] = field(default_factory=dict)  # name -> the version last saved under it
    pending: int = 0  # detached saves not yet settled
    held: bool = False  # writers of a stalled save are held
    ops: list[Op] = field(default_factory=list)

    def enabled(self) -> list[str]:
        """The kinds that may come next (``KINDS`` order, so shrinking moves towards training and saving)."""
        caps, saves = self.caps, len(self.saved)
        ok = {
            "save": not self.held,
            "async": "async" in caps and not self.held,
            "detach": "async" in caps and not self.held and self.pending < self.max_pending,
            "wait": self.pending > 0 and not self.held,
            "resume": self.held,
            "kill": self.pending > 0 and "kill_writer" in caps,
            "restart": bool(self.ops),
            "reshape": self.two_layouts and saves > 0,
            "latest": self.latest and saves > 0,
            "load": saves > 0,
            "missing": saves > 0,
            "rotate": "rotate" in caps and saves > 0,
            "corrupt": saves > 0 and self.pending == 0,  # what a seed picks must not depend on a writer's progress
            "burst": not self.held and self.pending == 0 and saves <= MAX_VERSIONS - 3,
        }
        return [k for k in KINDS if ok[k]]

    def _op(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    def _layout(self) -> str | None:
        return self.layout if self.two_layouts else None

    def save(self, *, use_async: bool = False, detach: bool = False, stall: bool = False,
             mutate: bool = False) -> Op:
        name = f"step-{self.version}"
        self.saved[name] = self.version
        if detach:
            self.pending += 1
            self.held = self.held or stall
        return self._op(Op("save", name, self.version, use_async, mutate, detach, stall=stall, layout=self._layout()))

    def settle(self, kind: str) -> Op:
        """``wait``, ``kill`` or ``resume``."""
        if kind in ("wait", "kill"):
            self.pending, self.held = 0, False
        else:
            self.held = False
        return self._op(Op(kind, layout=self._layout()))  # on the ranks that hold the pending saves

    def restart(self, layout: str, step: int | None) -> Op:
        """The job dies and comes back (on ``layout``), resuming at ``step`` (None: where it was). Its next save
        either trains first or saves that step again: a name that exists, perhaps under the other layout."""
        self.pending, self.held, self.layout = 0, False, layout
        if step is not None:
            self.version = step
        return self._op(Op("restart"))

    def load(self, name: str | None) -> Op:
        """Load ``name`` (None: the latest; MISSING: a name never saved); the job resumes from what it loads."""
        version = self.saved.get(name, 0) if name is not None else max(self.saved.values(), default=0)
        if name != MISSING:
            self.version = version
        return self._op(Op("load", name, version, layout=self._layout()))

    def rotate(self, keep: int) -> Op:
        return self._op(Op("rotate", keep=keep, layout=self._layout()))

    def corrupt(self, seed: int, corruption: str) -> Op:
        return self._op(Op("corrupt", seed=seed, corruption=corruption))

    def step(self, draw, kind: str) -> None:
        """Append the ops of one drawn ``kind`` (a ``train`` or a ``burst`` changes the job, or adds several)."""
        if kind in ("save", "async", "detach") and not draw(st.booleans()):
            self.version += 1  # a job trains between two saves; without that, it saves the same step again
        if kind == "train":
            self.version += 1
        elif kind in ("save", "async"):
            self.save(use_async=kind == "async")
        elif kind == "detach":
            self.save(use_async=True, detach=True, stall=draw(st.booleans()), mutate=draw(st.booleans()))
        elif kind in ("wait", "resume", "kill"):
            self.settle(kind)
        elif kind == "restart":  # a restarted job resumes from a step it saved: the newest, or an older one
            layout = draw(st.sampled_from(("save", "load"))) if self.two_layouts else "save"
            steps = sorted(set(self.saved.values()), reverse=True)
            self.restart(layout, draw(st.sampled_from(steps)) if steps else None)
        elif kind == "reshape":  # the job comes back on the other layout at a step it saved, and saves it again
            self.restart("load" if self.layout == "save" else "save", draw(st.sampled_from(
                sorted(set(self.saved.values()), reverse=True))))
            self.save()
        elif kind == "latest":
            self.load(None)
        elif kind == "load":
            self.load(draw(st.sampled_from(sorted(self.saved))))
        elif kind == "missing":
            self.load(MISSING)
            self.load(draw(st.sampled_from(sorted(self.saved))))  # in the same processes as the failed one
        elif kind == "rotate":
            self.rotate(draw(st.integers(1, 3)))
        elif kind == "corrupt":
            self.corrupt(draw(st.integers(0, 2**16)), draw(st.sampled_from(CORRUPTIONS)))
        elif kind == "burst":  # many versions in one directory: ids such as 1 and 11 side by side
            for _ in range(draw(st.integers(2, MAX_VERSIONS - 1 - len(self.saved)))):
                self.version += 1
                self.save()
        else:
            raise ValueError(f"unknown lifecycle step {kind!r}")


def _checks(model: JobModel, draw) -> None:
    """End the way a resuming job does: settle what is in flight, then load the latest (or each name)."""
    if model.held:
        model.settle("resume")
    if model.pending:
        model.settle("wait")
    if model.latest:
        model.load(None)
    for name in draw(st.permutations(sorted(model.saved))):
        model.load(name)


@st.composite
def job_faults(draw, ops: tuple[Op, ...], ranks: int, ptrace: bool) -> Fault | None:
    """At most one fault, on a save the job waits for (a detached save writes after its op returns, out of an
    armed fault's reach): killed at a syscall, a syscall failing (ENOSPC, EIO, … in the rank or its async
    writer, which must surface at the save's wait), or power lost."""
    saves = [i for i, op in enumerate(ops) if op.kind == "save" and not op.detach]
    if not (ptrace and saves) or not draw(st.booleans()):
        return None
    op = draw(st.sampled_from(saves))
    index = draw(st.integers(0, 400))
    if draw(st.booleans()):
        return PowerFault(op=op, index=index)
    return PointFault(op=op, index=index, action=draw(st.sampled_from((None, *ERRNO_NAMES))))


@st.composite
def lifecycle_cases(draw, prop: str, sut: str, ranks: int, capabilities: Iterable[str] = (), *,
                    faults: bool = False, ptrace: bool = True) -> Case:
    """A job's life on ``ranks`` ranks (its other layout on 1..ranks where the SUT reshards); with ``faults``,
    perhaps one fault on one of its saves."""
    caps = Caps(capabilities)
    save_mesh = draw(mesh_of(ranks))
    tensors = draw(tensor_cases(caps, max_tensors=3, min_tensors=1))
    opts = draw(options(caps, rotation=True))
    save = draw(_layouts_for(tensors, save_mesh, caps))
    load = draw(_layouts_for(tensors, draw(mesh_of(draw(load_world_of(caps, opts, ranks)))), caps)) if caps.reshard \
        else save
    if "same_dir" in caps.caps and draw(st.booleans()):  # versions of one directory: the SUT's own "latest"
        opts = in_same_dir(opts)
    model = JobModel(caps.caps, has_latest(caps.caps, opts), load != save)
    model.save()  # a job's first checkpoint
    steps = 0  # at least MIN_STEPS (a life, not one save), then each further one with odds 5:1; shrinks to few
    while len(model.ops) < MAX_OPS and (steps < MIN_STEPS or draw(st.integers(0, 5)) > 0):
        model.step(draw, draw(st.sampled_from(model.enabled())))
        steps += 1
    _checks(model, draw)
    ops = tuple(model.ops)
    fault = draw(job_faults(ops, ranks, ptrace)) if faults else None
    if fault is not None or any(op.kind in ("kill", "restart") for op in ops):
        # The reference's file rendezvous: a killed writer's peers fail within 10 s. Only where a writer may die:
        # elsewhere the default bound stands, so a loaded machine that is slow to start writers is no failure.
        opts["commit_timeout"] = 10
    return Case(prop, sut, tensors, save, load, ops, opts, draw(st.integers(0, 2**16)), fault=fault)
