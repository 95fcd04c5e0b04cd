"""The rank side of the sequence ops: where a ``kill`` lands on async writers is decided by the case, not sampled."""

from __future__ import annotations

from typing import Any

import pytest

from harness.ranks.rankops import RankExecutor


class _Writers:
    """An adapter that only records what the executor asks of its writers."""

    name = "recording"
    capabilities = frozenset({"kill_writer"})

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.failing = failing

    def wait(self, handle: str) -> None:
        self.calls.append(("wait", handle))
        if handle in self.failing:
            raise OSError(f"the writer of {handle} failed")

    def kill_pending(self, handles: list[str]) -> None:
        self.calls.append(("kill", tuple(handles)))


class _Hold:
    def __init__(self) -> None:
        self.killed = self.released = False

    def kill(self) -> None:
        self.killed = True

    def release(self) -> None:
        self.released = True


def test_a_kill_of_free_writers_lands_once_their_files_are_done_and_loses_their_errors() -> None:
    adapter = _Writers(failing=frozenset({"step-1"}))
    executor = RankExecutor(adapter, 0, 1)  # type: ignore[arg-type]
    executor.kill(["step-1", "step-2"], settled=True)
    assert adapter.calls == [("wait", "step-1"), ("wait", "step-2"), ("kill", ("step-1", "step-2"))]


def test_a_crash_of_the_job_kills_free_writers_wherever_they_are() -> None:
    adapter = _Writers()
    RankExecutor(adapter, 0, 1).kill(["step-1"])  # type: ignore[arg-type]
    assert adapter.calls == [("kill", ("step-1",))]


def test_a_kill_of_held_writers_lands_where_the_hold_stopped_them() -> None:
    adapter, hold = _Writers(), _Hold()
    executor = RankExecutor(adapter, 0, 1)  # type: ignore[arg-type]
    executor.holds.append(hold)  # type: ignore[arg-type]
    executor.kill(["step-1"], settled=True)
    assert adapter.calls == [("kill", ("step-1",))]
    assert hold.killed and hold.released and not executor.holds


def test_a_sut_that_cannot_kill_its_writers_says_so_before_waiting() -> None:
    adapter = _Writers()
    adapter.capabilities = frozenset()  # type: ignore[misc]
    with pytest.raises(NotImplementedError, match="cannot kill"):
        RankExecutor(adapter, 0, 1).kill(["step-1"])  # type: ignore[arg-type]
    assert adapter.calls == []
