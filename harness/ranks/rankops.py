"""Rank-side execution of a case: rebuild this rank's pieces from the case, drive the adapter, record results.

The same code runs inside a launched rank (harness.ranks.worker) and in the controller for in-process runs, so a case
behaves the same under every launch mode.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from faults.hold import WriterHold
from harness.sut.base import RankTensor, SutAdapter
from properties.model.case import Case
from reference.dtypes import dtype
from reference.engine import LocalTensor, local_tensors
from reference.tensor import Tensor
from reference.training import initial_pieces, seen_live, train

# What ends a rank for real. Everything else a SUT raises is an outcome, BaseException included: torch's
# CheckpointException derives from BaseException, so `except Exception` would let a clear load error kill the rank.
FATAL = (SystemExit, KeyboardInterrupt)
TRAIN_GRACE = 3.0  # seconds a train op runs with its job's writers held before they go on
LEAD_GRACE = 10.0  # seconds a save holds its writers for the lead rank's op (a record fault's ``lead``) to return


class RankExecutor:
    def __init__(self, adapter: SutAdapter, rank: int, world_size: int) -> None:
        self.adapter, self.rank, self.world_size = adapter, rank, world_size
        self.case: Case | None = None
        self.root: Path | None = None
        self.pending: list[Any] = []  # handles of detached async saves not yet settled by wait or kill
        self.live: dict[str, LocalTensor] | None = None  # a training case's state on this rank (trained in place)
        self.holds: list[WriterHold] = []  # writers of stalled saves, held until a resume (or wait, kill, save, end)

    @property
    def trains(self) -> bool:
        """The SUT runs its own training loop (capability "trains"): ``train`` ops are its, not the reference's."""
        return "trains" in self.adapter.capabilities

    def begin(self, case_json: dict | Case, root: str) -> None:
        """Take a case (as sent, or already parsed: ranks in one process share one immutable Case)."""
        self.case = case_json if isinstance(case_json, Case) else Case.from_json(case_json)
        self.root = Path(root)
        if self.case.training and self.trains:
            self.adapter.begin_training(self.case.spec(), tuple(self.case.params()))

    def end(self) -> None:
        self.live = None
        self.drop_pending()
        self.adapter.end_case()
        self.case = self.root = None

    def drop_pending(self) -> None:
        """What a crash of the job does to detached saves still in flight: their writers die (where the SUT can
        kill them; otherwise they are waited for, their errors ignored)."""
        pending, self.pending = self.pending, []
        try:
            self.kill(pending)
        except NotImplementedError:
            self.release()
            self._settle(pending)

    def rank_tensors(self, which: str, version: int, zeros: bool) -> dict[str, RankTensor]:
        assert self.case is not None
        layouts = self.case.layouts(which)
        # Zeros only need dtypes and shapes, which no version changes: step 0 spares a training case the loop.
        rank = self.case.layout_rank(self.rank, which)
        if rank is None:  # an idle rank of a job whose calls run on a subset of it holds nothing
            return {}
        state = self.case.expected(0 if zeros else version, which)
        return {name: RankTensor(name, layouts.get(name), lt)
                for name, lt in local_tensors(state, layouts, rank, empty=zeros).items()}

    def op(self, index: int) -> dict:
        """Run op ``index`` on this rank; the record is plain data (it crosses a socket)."""
        assert self.case is not None and self.root is not None
        op = self.case.ops[index]
        record: dict = {"rank": self.rank, "index": index, "ok": True, "loaded": {},
                        "layout_rank": self.case.layout_rank(self.rank, self.case.op_layouts(index))}
        start = time.perf_counter()
        try:
            if op.kind == "save":
                self.release()  # a SUT may let only one async save run at a time: a held one must go on first
                tensors = self._live_tensors(index) if self.case.training else self.rank_tensors(
                    self.case.op_layouts(index), op.version, zeros=False)
                lead = self._lead(index)
                follows = lead not in (None, self.rank)
                hold = WriterHold() if op.stall else None  # the writers the save starts, and names after it
                standing = WriterHold() if op.stall or follows else None  # long-lived writers, held before the call
                if standing is not None:
                    # before the call: a save that raises must not leave one held
                    self.holds += [standing, *([hold] if hold is not None else [])]
                    standing.stop(self.adapter.standing_writers())  # held before the save hands them its work
                try:
                    with hold.capture() if hold is not None else contextlib.nullcontext(), \
                            self._holds_yield_to_a_waiting_job(standing, self._lead_done(index) if follows else None):
                        handle = self.adapter.save(
                            self.root, op.name, tensors, use_async=op.use_async, options=self._save_options(index)
                        )
                finally:
                    if lead == self.rank:
                        self._lead_done(index).touch()
                if follows and not op.stall:
                    self.holds.remove(standing)
                    standing.release()
                if hold is not None:
                    hold.stop(self.adapter.writer_pids(handle))
                if op.use_async:
                    if op.mutate_after:
                        self.adapter.mutate(handle)
                    if op.detach:
                        self.pending.append(handle)
                    else:
                        self.adapter.wait(handle)
            elif op.kind == "load":
                targets = self.rank_tensors(self.case.op_layouts(index), op.version, zeros=True)
                self.live = None  # a failed load leaves no state to train on: the job would start over
                got = self.adapter.load(self.root, op.name, targets, options=self.case.options)
                record["loaded"] = {name: _pack(t) for name, t in got.items()}
                record["plan"] = self.adapter.read_plan()
                if self.case.training:
                    self.live = {name: LocalTensor(rt.local.global_shape, rt.region, got[name].copy(), rt.local.saves)
                                 for name, rt in targets.items() if name in got}
            elif op.kind == "train":
                live = self._live(index)
                with self._holds_yield_to_a_waiting_job():
                    if self.trains:
                        self.adapter.train(self.root, live, op.version, options=self.case.options)
                    else:
                        train(self.case.spec(), self.case.params(), live, op.version)
                spec = self.case.spec()
                record["loaded"] = {name: _pack(lt.tensor) for name, lt in live.items() if seen_live(spec, name)}
            elif op.kind == "wait":
                self.release()
                self._wait_pending()
            elif op.kind == "kill":
                pending, self.pending = self.pending, []
                self.kill(pending, settled=True)
            elif op.kind == "resume":
                self.release()
            elif op.kind == "rotate":
                self.adapter.rotate(self.root, op.keep)
            else:
                raise ValueError(f"op {index} ({op.kind}) is done by the harness, not on a rank")
        except FATAL:
            raise
        except BaseException as exc:  # an outcome to judge, not a harness failure
            record.update(
                ok=False, error_type=type(exc).__name__, error=_one_line(exc), traceback=traceback_text(exc)
            )
        record["seconds"] = time.perf_counter() - start
        return record

    def _save_options(self, index: int) -> dict:
        """The case's options, and for a name saved again its ``save_attempt`` (how many saves of the name came
        before in the case): what every rank knows alike, so a SUT whose ranks agree on a save id without talking
        can tell this attempt from an earlier one, in flight or crashed, whose debris is still there."""
        assert self.case is not None
        name = self.case.ops[index].name
        attempt = sum(1 for op in self.case.ops[:index] if op.kind == "save" and op.name == name)
        return {**self.case.options, "save_attempt": attempt} if attempt else self.case.options

    def kill(self, pending: list[Any], settled: bool = False) -> None:
        """SIGKILL the writers of these saves: held processes where they stand, then (held threads let go, which
        the SUT's own kill must stop) the SUT's kill. ``settled`` (the ``kill`` op, where the trainer goes on):
        with no writer held, the kill lands once the writers have finished their files (a long-lived writer dies
        idle, waiting for the next save), so how far a free writer got is decided by the case (its ``stall``), not
        sampled from the scheduler. A crash of the job kills writers wherever they are."""
        if "kill_writer" not in self.adapter.capabilities:
            raise NotImplementedError(f"{self.adapter.name} cannot kill the writers of its async saves")
        if settled and not self.holds:
            self._settle(pending)
        self.release(kill=True)
        self.adapter.kill_pending(pending)

    def _settle(self, pending: list[Any]) -> None:
        """Let these saves' writers finish; their errors go nowhere, as the kill that follows would lose them."""
        for handle in pending:
            try:
                self.adapter.wait(handle)
            except FATAL:
                raise
            except BaseException:
                pass

    def _lead(self, index: int) -> int | None:
        """The rank whose writers run first in op ``index``: a record fault's ``lead``."""
        fault = self.case.fault if self.case is not None else None
        return getattr(fault, "lead", None) if fault is not None and fault.op == index else None

    def _lead_done(self, index: int) -> Path:
        """The mark the lead rank leaves when its op ``index`` has returned: beside the root, in the case's own
        directory (never judged as the op's IO, never met by another case)."""
        assert self.root is not None
        return self.root.parent / f".lead-returned-{index}"

    @contextlib.contextmanager
    def _holds_yield_to_a_waiting_job(self, standing: WriterHold | None = None,
                                      lead_done: Path | None = None) -> Iterator[None]:
        """Train (or save) with writers held: a job that goes on without waiting for its writer (the race a stalled
        save decides) is done long before ``TRAIN_GRACE``; one that waits for it (Zero-Cost Checkpointing's offload
        barrier, a worker's first update) gets it back then, so a correct wait is slow, never a hang. A save lets
        only its ``standing`` writers go: the writers it starts are stopped once it returns, so it cannot wait for
        them, and a slow call must not free them early (the race the stall decides would be lost). A save that
        follows a lead rank lets its writers go once the lead's op has returned (``lead_done``), or after
        ``LEAD_GRACE``: a lead that waits for them is slow, never hung."""
        if not self.holds:
            yield
            return
        done = threading.Event()
        release = self.release if standing is None else standing.release
        grace = TRAIN_GRACE if lead_done is None else LEAD_GRACE
        threading.Thread(target=_release_after, args=(release, grace, done, lead_done), daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def release(self, kill: bool = False) -> None:
        """Let held writers go on (``kill``: SIGKILL held processes first; threads cannot be killed)."""
        holds, self.holds = self.holds, []
        for hold in holds:
            if kill:
                hold.kill()
            hold.release()

    def _live(self, index: int) -> dict[str, LocalTensor]:
        """The live training state; a job without one (fresh ranks, a failed load) starts from the seeds."""
        assert self.case is not None
        if self.live is None:
            which = self.case.op_layouts(index)
            rank = self.case.layout_rank(self.rank, which)
            self.live = {} if rank is None else initial_pieces(self.case.spec(), self.case.params(),
                                                                self.case.layouts(which), rank)
        return self.live

    def _live_tensors(self, index: int) -> dict[str, RankTensor]:
        assert self.case is not None
        layouts = self.case.layouts(self.case.op_layouts(index))
        return {name: RankTensor(name, layouts.get(name), lt) for name, lt in self._live(index).items()}

    def _wait_pending(self) -> None:
        """Wait for every detached save, oldest first; all are settled, and the first error is raised."""
        pending, self.pending = self.pending, []
        error: BaseException | None = None
        for handle in pending:
            try:
                self.adapter.wait(handle)
            except FATAL:
                raise
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error


def _release_after(release: Callable[[], None], grace: float, done: threading.Event, mark: Path | None) -> None:
    """Call ``release`` after ``grace`` seconds, or once ``mark`` exists; never once ``done`` is set (the call
    returned: its caller decides about the hold then)."""
    if mark is None:
        if not done.wait(grace):
            release()
        return
    deadline = time.monotonic() + grace
    while not mark.exists() and time.monotonic() < deadline:
        if done.wait(0.01):
            return
    release()


def _pack(t: Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return (t.dtype.name, t.shape, np.ascontiguousarray(t.bits).tobytes())


def unpack(packed: tuple[str, tuple[int, ...], bytes]) -> Tensor:
    name, shape, raw = packed
    dt = dtype(name)
    return Tensor(dt, np.frombuffer(raw, dt.bits_dtype).reshape(shape).copy())


def traceback_text(exc: BaseException, limit: int = 8) -> str:
    """What ``traceback.format_exc(-limit)`` prints for ``exc`` (its chain included, the innermost ``limit``
    frames of each), without the column carets.
    Python 3.11 places those by scanning each frame's position table and parsing its source line, which made
    formatting a fifth of a 16-rank virtual op that failed on every rank; the frames and messages, all a reader
    or a bucket (properties.triage.buckets.innermost_frame) uses, are the same."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    joint = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, joint))
        if current.__cause__ is not None:
            current, joint = current.__cause__, _CAUSE_JOINT
        elif current.__context__ is not None and not current.__suppress_context__:
            current, joint = current.__context__, _CONTEXT_JOINT
        else:
            current = None
    parts: list[str] = []
    for error, joint in reversed(chain):
        if error.__traceback__ is not None:
            # the innermost frames: where it was raised, which a bucket names (a Trainer's stack is deeper)
            frames = traceback.StackSummary.extract(traceback.walk_tb(error.__traceback__), limit=-limit)
            parts += ["Traceback (most recent call last):\n", *frames.format()]
        parts += traceback.format_exception_only(type(error), error)
        parts.append(joint)
    return "".join(parts)


_CAUSE_JOINT = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT_JOINT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _one_line(exc: BaseException, limit: int = 500) -> str:
    """The error on one line; a long one keeps its head and its tail, where a wrapping error (torch's
    CheckpointException quotes each rank's traceback) puts the root error that signatures name."""
    text = " ".join(str(exc).split())
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"
