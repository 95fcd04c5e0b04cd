"""The scheduler that runs virtual ranks: one rank at a time, in rank order, collectives matched by order, a missing
peer turned into the backend's error at once — deterministic whatever the OS scheduler does."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from harness.ranks.virtual.cores import WakeOnWakerCore
from harness.ranks.virtual.scheduler import Entry, OneAtATimeScheduler

#: The cores this process may use, read before any test ran a scheduler (a thread left pinned would shrink its own).
ALLOWED = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


class _Timeout(RuntimeError):
    pass


def _gather(entries: dict[int, Entry]) -> dict[int, tuple[bool, object]]:
    values = [entries[r].payload for r in sorted(entries)]
    kinds = {e.kind for e in entries.values()}
    if len(kinds) > 1:
        return {r: (False, RuntimeError(f"mismatch {sorted(kinds)}")) for r in entries}
    return {r: (True, list(values)) for r in entries}


class _Backend:
    """A toy backend: gathers payloads, times out as "timeout KIND" or "lost KIND", then "closed"."""

    pending_reset = None

    def entry(self, rank: int, kind: str, payload: object) -> tuple[BaseException | None, bool]:
        return (ValueError("refused"), True) if payload == "refuse" else (None, False)

    def resolve(self, entries: dict[int, Entry]) -> dict[int, tuple[bool, object]]:
        return _gather(entries)

    def unfinished(self, entries: dict[int, Entry], members: tuple[int, ...], gone: int | None) -> dict:
        out = {}
        for rank, entry in entries.items():
            error = _Timeout(f"{'lost' if gone is not None else 'timeout'} {entry.kind}")
            error.ckh_breaks, error.ckh_wait_s = "gone" if gone is not None else "timeout", 30.0
            out[rank] = (False, error)
        return out

    def after_break(self, rank: int, how: str, peer: int | None, waited: bool, late: bool) -> BaseException:
        return _Timeout(f"{'closed' if waited else 'late' if late else 'blocked'} after {how}")


def _scheduler(world: int, switches: list[int] | None = None) -> OneAtATimeScheduler:
    def on_switch(rank: int) -> None:
        if switches is not None:
            switches.append(rank)

    return OneAtATimeScheduler(world, on_switch, _Backend())


@pytest.fixture
def closing():
    made: list[OneAtATimeScheduler] = []
    yield made
    for b in made:
        b.close()


def test_only_one_rank_runs_at_a_time_and_the_schedule_is_the_same_every_run(closing) -> None:
    schedules = [_one_schedule(closing) for _ in range(3)]
    assert schedules[0] == schedules[1] == schedules[2]
    assert schedules[0][1][:4] == [(0, "before"), (1, "before"), (2, "before"), (3, "before")]


def _one_schedule(closing: list[OneAtATimeScheduler]) -> tuple[list[int], list[tuple[int, str]]]:
    switches: list[int] = []
    scheduler = _scheduler(4, switches)
    closing.append(scheduler)
    running: list[int] = []
    log: list[tuple[int, str]] = []

    def step(rank: int, what: str) -> None:
        running.append(rank)
        assert len(running) == 1, running
        log.append((rank, what))
        running.pop()

    def task(rank: int) -> list:
        step(rank, "before")
        got = scheduler.collective(rank, "all_gather", rank * 10)
        step(rank, "after")
        return got

    assert scheduler.run([lambda r=r: task(r) for r in range(4)]) == [(True, [0, 10, 20, 30])] * 4
    return switches, log


def test_collectives_match_by_order_within_the_group(closing) -> None:
    scheduler = _scheduler(3)
    closing.append(scheduler)

    def task(rank: int) -> list:
        first = scheduler.collective(rank, "all_gather", ("a", rank))
        second = scheduler.collective(rank, "all_gather", ("b", rank))
        return [first, second]

    results = scheduler.run([lambda r=r: task(r) for r in range(3)])
    for ok, (first, second) in results:
        assert ok
        assert first == [("a", 0), ("a", 1), ("a", 2)]
        assert second == [("b", 0), ("b", 1), ("b", 2)]


def test_a_rank_that_raised_leaves_its_peers_the_timeout_error_at_once(closing) -> None:
    scheduler = _scheduler(3)
    closing.append(scheduler)

    def task(rank: int) -> object:
        if rank == 1:
            raise ValueError("rank 1's own bug")
        return scheduler.collective(rank, "broadcast", rank)

    results = scheduler.run([lambda r=r: task(r) for r in range(3)])
    assert isinstance(results[1][1], ValueError)
    for r in (0, 2):
        ok, exc = results[r]
        assert not ok and isinstance(exc, _Timeout) and str(exc) == "timeout broadcast"
    assert scheduler.timeouts == 1 and scheduler.timed_out_ranks == {0, 2} and scheduler.waited == {0: 30.0, 2: 30.0}
    again = scheduler.run([lambda r=r: scheduler.collective(r, "barrier", None) for r in range(3)])
    # A dead group stays dead: the ranks that timed out have closed pairs in every later op; the rank that raised
    # arrives after the timeout passed.
    assert [str(exc) for _, exc in again] == ["closed after timeout", "late after timeout", "closed after timeout"]
    assert scheduler.closed == {0, 2}


def test_ranks_in_different_collectives_meet_in_one_slot_and_the_resolver_decides(closing) -> None:
    scheduler = _scheduler(2)
    closing.append(scheduler)
    results = scheduler.run([lambda: scheduler.collective(0, "barrier", None),
                         lambda: scheduler.collective(1, "broadcast", 1)])
    assert all(not ok and "mismatch" in str(exc) for ok, exc in results)


def test_a_rank_whose_process_exits_is_gone_and_its_peers_hear_the_connection_close(closing) -> None:
    scheduler = _scheduler(3)
    closing.append(scheduler)

    def task(rank: int) -> object:
        if rank == 0:
            raise SystemExit(255)
        return scheduler.collective(rank, "all_gather", rank)

    results = scheduler.run([lambda r=r: task(r) for r in range(3)])
    assert isinstance(results[0][1], SystemExit)
    assert [str(exc) for _, exc in results[1:]] == ["lost all_gather"] * 2
    again = scheduler.run([lambda: "ran"] * 3)  # the gone rank runs nothing more; the others go on
    assert isinstance(again[0][1], SystemExit) and again[1:] == [(True, "ran")] * 2


def test_close_unwinds_a_rank_left_in_a_collective(closing) -> None:
    scheduler = _scheduler(2)
    scheduler.run([lambda: scheduler.collective(0, "all_gather", 0), lambda: None])
    scheduler.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("ckh-vrank-")]


def test_a_call_the_backend_refuses_may_use_up_the_rank_s_turn(closing) -> None:
    """gloo takes a tag before it checks: a refused call on one rank leaves the ranks' next calls unpaired."""
    scheduler = _scheduler(2)
    closing.append(scheduler)

    def task(rank: int) -> object:
        if rank == 0:
            with contextlib.suppress(ValueError):
                scheduler.collective(0, "broadcast", "refuse")
        return scheduler.collective(rank, "all_reduce", rank)

    results = scheduler.run([lambda r=r: task(r) for r in range(2)])
    assert [str(exc) for _, exc in results] == ["timeout all_reduce"] * 2


@pytest.mark.skipif(not WakeOnWakerCore().supported,
                    reason="the platform cannot pin a thread, or the process has one core")
def test_a_rank_is_woken_on_its_waker_s_core_and_never_runs_pinned(closing) -> None:
    """The scheduler wakes each rank on the core of the thread that wakes it (a cheaper switch), and the woken thread
    lifts that at once: a rank that starts a process or a thread (an async save's writer) gives it the whole
    machine, whichever rank woke it, before and after collectives, in every run."""
    scheduler = _scheduler(4)
    closing.append(scheduler)
    allowed = ALLOWED
    seen: list[tuple[int, set[int]]] = []

    def task(rank: int) -> None:
        seen.append((rank, os.sched_getaffinity(0)))
        scheduler.collective(rank, "all_gather", rank)
        seen.append((rank, os.sched_getaffinity(0)))
        scheduler.collective(rank, "barrier", None)
        seen.append((rank, os.sched_getaffinity(0)))

    for _ in range(3):
        results = scheduler.run([lambda r=r: task(r) for r in range(4)])
        assert all(ok for ok, _ in results)
        assert os.sched_getaffinity(0) == allowed  # the driver, woken by the last rank
    assert len(seen) == 36 and all(mask == allowed for _, mask in seen)


def test_a_thread_woken_on_a_core_is_handed_the_whole_machine_back() -> None:
    """What the scheduler relies on: ``wake_here`` pins a sleeping thread to the caller's core, ``woken`` lifts it."""
    core = WakeOnWakerCore()
    if not core.supported:
        pytest.skip("the platform cannot pin a thread, or the process has one core")
    allowed = ALLOWED
    go, done = threading.Lock(), threading.Lock()
    go.acquire()
    done.acquire()
    masks: list[set[int]] = []

    def sleeper() -> None:
        go.acquire()
        masks.append(os.sched_getaffinity(0))  # as woken: the waker's core alone
        core.woken()
        masks.append(os.sched_getaffinity(0))
        done.release()

    thread = threading.Thread(target=sleeper)
    thread.start()
    core.wake_here(thread.native_id)
    go.release()
    done.acquire()
    thread.join(timeout=5)
    assert len(masks[0]) == 1 and masks[0] <= allowed
    assert masks[1] == allowed
