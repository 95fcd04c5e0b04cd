"""The baton that runs virtual ranks: one rank at a time, in rank order, collectives matched by order, a missing
peer turned into the backend's error at once — deterministic whatever the OS scheduler does."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from harness.ranks.virtual.baton import Baton, Entry
from harness.ranks.virtual.cores import SameCore

#: The cores this process may use, read before any test ran a baton (a thread left pinned would shrink its own).
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


def _baton(world: int, switches: list[int] | None = None) -> Baton:
    def on_switch(rank: int) -> None:
        if switches is not None:
            switches.append(rank)

    return Baton(world, on_switch, _Backend())


@pytest.fixture
def closing():
    made: list[Baton] = []
    yield made
    for b in made:
        b.close()


def test_only_one_rank_runs_at_a_time_and_the_schedule_is_the_same_every_run(closing) -> None:
    schedules = [_one_schedule(closing) for _ in range(3)]
    assert schedules[0] == schedules[1] == schedules[2]
    assert schedules[0][1][:4] == [(0, "before"), (1, "before"), (2, "before"), (3, "before")]


def _one_schedule(closing: list[Baton]) -> tuple[list[int], list[tuple[int, str]]]:
    switches: list[int] = []
    baton = _baton(4, switches)
    closing.append(baton)
    running: list[int] = []
    log: list[tuple[int, str]] = []

    def step(rank: int, what: str) -> None:
        running.append(rank)
        assert len(running) == 1, running
        log.append((rank, what))
        running.pop()

    def task(rank: int) -> list:
        step(rank, "before")
        got = baton.collective(rank, "all_gather", rank * 10)
        step(rank, "after")
        return got

    assert baton.run([lambda r=r: task(r) for r in range(4)]) == [(True, [0, 10, 20, 30])] * 4
    return switches, log


def test_collectives_match_by_order_within_the_group(closing) -> None:
    baton = _baton(3)
    closing.append(baton)

    def task(rank: int) -> list:
        first = baton.collective(rank, "all_gather", ("a", rank))
        second = baton.collective(rank, "all_gather", ("b", rank))
        return [first, second]

    results = baton.run([lambda r=r: task(r) for r in range(3)])
    for ok, (first, second) in results:
        assert ok
        assert first == [("a", 0), ("a", 1), ("a", 2)]
        assert second == [("b", 0), ("b", 1), ("b", 2)]


def test_a_rank_that_raised_leaves_its_peers_the_timeout_error_at_once(closing) -> None:
    baton = _baton(3)
    closing.append(baton)

    def task(rank: int) -> object:
        if rank == 1:
            raise ValueError("rank 1's own bug")
        return baton.collective(rank, "broadcast", rank)

    results = baton.run([lambda r=r: task(r) for r in range(3)])
    assert isinstance(results[1][1], ValueError)
    for r in (0, 2):
        ok, exc = results[r]
        assert not ok and isinstance(exc, _Timeout) and str(exc) == "timeout broadcast"
    assert baton.timeouts == 1 and baton.timed_out_ranks == {0, 2} and baton.waited == {0: 30.0, 2: 30.0}
    again = baton.run([lambda r=r: baton.collective(r, "barrier", None) for r in range(3)])
    # A dead group stays dead: the ranks that timed out have closed pairs in every later op; the rank that raised
    # arrives after the timeout passed.
    assert [str(exc) for _, exc in again] == ["closed after timeout", "late after timeout", "closed after timeout"]
    assert baton.closed == {0, 2}


def test_ranks_in_different_collectives_meet_in_one_slot_and_the_resolver_decides(closing) -> None:
    baton = _baton(2)
    closing.append(baton)
    results = baton.run([lambda: baton.collective(0, "barrier", None),
                         lambda: baton.collective(1, "broadcast", 1)])
    assert all(not ok and "mismatch" in str(exc) for ok, exc in results)


def test_a_rank_whose_process_exits_is_gone_and_its_peers_hear_the_connection_close(closing) -> None:
    baton = _baton(3)
    closing.append(baton)

    def task(rank: int) -> object:
        if rank == 0:
            raise SystemExit(255)
        return baton.collective(rank, "all_gather", rank)

    results = baton.run([lambda r=r: task(r) for r in range(3)])
    assert isinstance(results[0][1], SystemExit)
    assert [str(exc) for _, exc in results[1:]] == ["lost all_gather"] * 2
    again = baton.run([lambda: "ran"] * 3)  # the gone rank runs nothing more; the others go on
    assert isinstance(again[0][1], SystemExit) and again[1:] == [(True, "ran")] * 2


def test_close_unwinds_a_rank_left_in_a_collective(closing) -> None:
    baton = _baton(2)
    baton.run([lambda: baton.collective(0, "all_gather", 0), lambda: None])
    baton.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("ckh-vrank-")]


def test_a_call_the_backend_refuses_may_use_up_the_rank_s_turn(closing) -> None:
    """gloo takes a tag before it checks: a refused call on one rank leaves the ranks' next calls unpaired."""
    baton = _baton(2)
    closing.append(baton)

    def task(rank: int) -> object:
        if rank == 0:
            with contextlib.suppress(ValueError):
                baton.collective(0, "broadcast", "refuse")
        return baton.collective(rank, "all_reduce", rank)

    results = baton.run([lambda r=r: task(r) for r in range(2)])
    assert [str(exc) for _, exc in results] == ["timeout all_reduce"] * 2


@pytest.mark.skipif(not SameCore().supported, reason="the platform cannot pin a thread, or the process has one core")
def test_a_rank_is_woken_on_its_waker_s_core_and_never_runs_pinned(closing) -> None:
    """The baton wakes each rank on the core of the thread that wakes it (a cheaper switch), and the woken thread
    lifts that at once: a rank that starts a process or a thread (an async save's writer) gives it the whole
    machine, whichever rank woke it, before and after collectives, in every run."""
    baton = _baton(4)
    closing.append(baton)
    allowed = ALLOWED
    seen: list[tuple[int, set[int]]] = []

    def task(rank: int) -> None:
        seen.append((rank, os.sched_getaffinity(0)))
        baton.collective(rank, "all_gather", rank)
        seen.append((rank, os.sched_getaffinity(0)))
        baton.collective(rank, "barrier", None)
        seen.append((rank, os.sched_getaffinity(0)))

    for _ in range(3):
        results = baton.run([lambda r=r: task(r) for r in range(4)])
        assert all(ok for ok, _ in results)
        assert os.sched_getaffinity(0) == allowed  # the driver, woken by the last rank
    assert len(seen) == 36 and all(mask == allowed for _, mask in seen)


def test_a_thread_woken_on_a_core_is_handed_the_whole_machine_back() -> None:
    """What the baton relies on: ``wake_here`` pins a sleeping thread to the caller's core, ``woken`` lifts it."""
    core = SameCore()
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
