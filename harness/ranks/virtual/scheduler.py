"""W ranks as threads of one process, exactly one running at a time, in turn.

A rank runs until it enters a collective or finishes its task; the turn then passes to the next runnable rank in
rank order (cyclically). A collective completes when every member of its group has entered it, matched by order
within the group, as gloo matches them; its results are handed out by a ``resolve`` function that knows the
backend's semantics (harness.ranks.virtual.gloo). When no rank can run and some wait in collectives no peer will join,
the waiting ranks get the backend's timeout raised in them — what it does after its timeout, without waiting for it —
and a group that failed so stays dead, as a real one does. Nothing here knows a framework: ``on_switch`` swaps what
each rank must own (harness.ranks.virtual.paddle_world).

The schedule depends only on the ranks' calls, never on the clock or the OS scheduler, so a run is replayable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.ranks.virtual.cores import WakeOnWakerCore


@dataclass
class Entry:
    """One rank's part in a collective: what it called and what it brought."""

    kind: str
    payload: Any


@dataclass
class Slot:
    """The n-th collective of a group: the entries so far, and each member's result once complete."""

    members: tuple[int, ...]
    entries: dict[int, Entry] = field(default_factory=dict)
    results: dict[int, tuple[bool, Any]] = field(default_factory=dict)  # rank -> (ok, value or exception)


class Abandoned(BaseException):
    """Raised in a rank's thread to unwind it when the world is torn down mid-op (never seen by a judge)."""


class Backend(Protocol):
    """What the scheduler asks of a backend model (harness.ranks.virtual.gloo.Gloo)."""

    pending_reset: int | None

    def entry(self, rank: int, kind: str, payload: Any) -> tuple[BaseException | None, bool]: ...

    def resolve(self, entries: Mapping[int, Entry]) -> dict[int, tuple[bool, Any]]: ...

    def unfinished(self, entries: Mapping[int, Entry], members: tuple[int, ...], gone: int | None
                   ) -> dict[int, tuple[bool, Any]]: ...

    def after_break(self, rank: int, how: str, peer: int | None, waited: bool, late: bool) -> BaseException: ...


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


class OneAtATimeScheduler:
    """Runs W rank threads one at a time. ``run(tasks)`` runs one task per rank to completion, in turn, and
    returns each rank's return value or exception; ``collective`` is what a rank's thread calls to meet its peers."""

    def __init__(self, world: int, on_switch: Callable[[int], None], backend: Backend) -> None:
        self.world = world
        self.on_switch, self.backend = on_switch, backend
        self.current: int | None = None
        # Binary semaphores as raw locks, held until released (a switch is a release and an acquire: C-level
        # locks cost a fraction of threading.Semaphore's Condition, and a case makes thousands of switches).
        self._go = [_held_lock() for _ in range(world)]
        self._back = _held_lock()  # the driver waits here while ranks run
        self._tasks: list[Callable[[], Any] | None] = [None] * world
        self._results: list[tuple[bool, Any] | None] = [None] * world
        self._state = ["idle"] * world  # idle | runnable | running | blocked | done | gone (its process exited)
        self._exits: dict[int, SystemExit] = {}
        self._waiting: dict[int, tuple[tuple[int, ...], int]] = {}  # rank -> (group, slot index) it waits in
        self._slots: dict[tuple[tuple[int, ...], int], Slot] = {}
        self._seq: dict[tuple[int, tuple[int, ...]], int] = {}  # (rank, group) -> collectives entered so far
        self._closing = False
        self.timeouts = 0  # collectives that timed out (the world is then out of step, as a real one would be)
        self.timed_out_ranks: set[int] = set()  # ranks whose collective timed out in the current run
        self.waited: dict[int, float] = {}  # rank -> seconds a real rank would have waited in the current run
        self.broken: tuple[str, int | None] | None = None  # (how, peer): the group is dead for good
        self.closed: set[int] = set()  # ranks that timed out in this group, in any run: their pairs are closed
        self._runs = 0  # runs so far (a run: one op on every rank)
        self._broke_in = 0  # the run in which the group died
        self.completed = 0  # collectives completed so far: ranks between the same two collectives share an epoch
        self._threads = [threading.Thread(target=self._main, args=(r,), name=f"ckh-vrank-{r}", daemon=True)
                         for r in range(world)]
        for t in self._threads:
            t.start()
        # a woken rank runs on its waker's core (harness.ranks.virtual.cores): where, never which
        self._core = WakeOnWakerCore()
        self._tids = [t.native_id for t in self._threads]
        self._driver: int | None = None  # the thread that called run(), woken when every rank is done

    # -- driver side ---------------------------------------------------------------------------------------------

    def run(self, tasks: Sequence[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Run ``tasks[r]`` on rank r, all of them, one at a time; (ok, value or exception) per rank."""
        if len(tasks) != self.world:
            raise ValueError(f"{len(tasks)} tasks for {self.world} ranks")
        for r, task in enumerate(tasks):
            if r in self._exits:  # a rank whose process exited runs nothing more
                self._results[r] = (False, self._exits[r])
                continue
            self._tasks[r], self._results[r], self._state[r] = task, None, "runnable"
        self.timed_out_ranks, self.waited = set(), {}
        self._runs += 1
        self._driver = threading.get_native_id()
        self._pass(None)
        self._back.acquire()
        self._core.woken()
        out = [res for res in self._results]
        assert all(res is not None for res in out)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """End the rank threads (a rank blocked in a collective is unwound with ``Abandoned``)."""
        self._closing = True
        for r in range(self.world):
            if self._state[r] != "gone" and self._go[r].locked():
                self._go[r].release()
        for t in self._threads:
            t.join(timeout=5)

    # -- rank side -----------------------------------------------------------------------------------------------

    def collective(self, rank: int, kind: str, payload: Any, group: tuple[int, ...] | None = None) -> Any:
        """Enter a collective of ``group`` (default: every rank) and wait for its result; raises what the backend
        would raise on this rank (``RankExit``, a SystemExit, where its process would end)."""
        members = group if group is not None else tuple(range(self.world))
        if self.broken is None and self.backend.pending_reset is not None:
            self._break("reset", self.backend.pending_reset)
        if self.broken is not None:  # late: the group died in an earlier op, its timeout long over
            error = self.backend.after_break(rank, *self.broken, rank in self.closed, self._broke_in < self._runs)
            wait = getattr(error, "ckh_wait_s", 0.0)
            if wait:  # it blocked until the group failed: as long as a rank that timed out
                self.waited[rank] = self.waited.get(rank, 0.0) + wait
                self._timed_out(rank)
            raise error
        error, used_tag = self.backend.entry(rank, kind, payload)
        n = self._seq.get((rank, members), 0)
        if error is not None:
            if used_tag:
                self._seq[(rank, members)] = n + 1
            raise error
        self._seq[(rank, members)] = n + 1
        slot = self._slots.setdefault((members, n), Slot(members))
        slot.entries[rank] = Entry(kind, payload)
        if len(slot.entries) == len(members):
            self._complete(slot, self.backend.resolve(slot.entries), rank)
            del self._slots[(members, n)]
            self.completed += 1
        else:
            self._state[rank] = "blocked"
            self._waiting[rank] = (members, n)
            self._pass(rank)
            self._go[rank].acquire()  # back when the slot completed, timed out or the world closes
            self._core.woken()
            if self._closing:
                raise Abandoned()
        ok, value = slot.results.pop(rank)
        if not ok:
            raise value
        return value

    def _complete(self, slot: Slot, results: dict[int, tuple[bool, Any]], current: int | None) -> None:
        """Hand each member its result and wake the waiting ones; note what a real rank would have waited and
        whether the failure killed the group."""
        for member in slot.members:
            if member not in slot.entries:
                continue
            ok, value = results[member]
            slot.results[member] = (ok, value)
            if not ok:
                self.waited[member] = self.waited.get(member, 0.0) + getattr(value, "ckh_wait_s", 0.0)
                how = getattr(value, "ckh_breaks", None)
                if how == "timeout":
                    self._timed_out(member)
                if how is not None and self.broken is None:
                    self._break(how, _peer(value))
                    self.timeouts += 1
            if member != current:
                self._waiting.pop(member, None)
                self._state[member] = "runnable"

    def _break(self, how: str, peer: int | None) -> None:
        self.broken, self._broke_in = (how, peer), self._runs

    def _timed_out(self, rank: int) -> None:
        self.timed_out_ranks.add(rank)
        self.closed.add(rank)

    def _main(self, rank: int) -> None:
        while True:
            self._go[rank].acquire()
            self._core.woken()
            if self._closing:
                return
            task = self._tasks[rank]
            assert task is not None
            try:
                self._results[rank] = (True, task())
            except Abandoned:
                return
            except SystemExit as exc:  # the rank's process would end here: it is gone for good
                self._results[rank], self._exits[rank] = (False, exc), exc
                self._tasks[rank], self._state[rank] = None, "gone"
                self._pass(rank)
                return
            except BaseException as exc:  # the task's outcome, judged by the caller
                self._results[rank] = (False, exc)
            self._tasks[rank] = None
            self._state[rank] = "done"
            self._pass(rank)

    # -- the turn ------------------------------------------------------------------------------------------------

    def _pass(self, after: int | None) -> None:
        """Give the turn to the next runnable rank after ``after`` in rank order; with none runnable, time out
        the waiting ranks, or (all done) hand control back to the driver."""
        nxt = self._next_runnable(after)
        if nxt is None and self._waiting:
            self._time_out()
            nxt = self._next_runnable(after)
        if nxt is None:
            self.current = None
            self._core.wake_here(self._driver)
            self._back.release()
            return
        self._state[nxt] = "running"
        if nxt != self.current:
            self.on_switch(nxt)
            self.current = nxt
        if nxt != after:  # a rank that passes to itself runs on
            self._core.wake_here(self._tids[nxt])
        self._go[nxt].release()

    def _next_runnable(self, after: int | None) -> int | None:
        start = 0 if after is None else after + 1
        for i in range(self.world):
            r = (start + i) % self.world
            if self._state[r] == "runnable":
                return r
        return None

    def _time_out(self) -> None:
        """Every rank left waiting waits for a peer that will not come (it finished, waits elsewhere, or its process
        exited): each gets the backend's error for that, as it would once the timeout passed or the peer's exit was
        noticed."""
        for key in sorted(set(self._waiting.values())):
            slot = self._slots.pop(key)
            gone = next((m for m in slot.members if m not in slot.entries and m in self._exits), None)
            self._complete(slot, self.backend.unfinished(slot.entries, slot.members, gone), None)
        self._waiting.clear()


def _peer(error: BaseException) -> int | None:
    return getattr(error, "ckh_peer", None)
