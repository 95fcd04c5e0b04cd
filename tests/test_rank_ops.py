"""The rank side of the sequence ops: where a ``kill`` lands on async writers is decided by the case, not sampled."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from faults.spec import RecordFault
from harness.ranks import rankops
from harness.ranks.rankops import RankExecutor
from properties.model.case import Op


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


class _OneStalledSave:
    """A case of one stalled, detached async save (no tensors: only the writers matter here)."""

    def __init__(self) -> None:
        self.training = None
        self.options: dict = {}
        self.ops = [Op("save", "step-1", 1, use_async=True, detach=True, stall=True)]
        self.fault: RecordFault | None = None

    def op_layouts(self, index: int) -> str:
        return "save"

    def layouts(self, which: str) -> dict:
        return {}

    def layout_rank(self, rank: int, which: str) -> int:
        return rank

    def expected(self, version: int, which: str) -> dict:
        return {}


class _JobThatWaitsForItsWriter:
    """Zero-Cost Checkpointing's shape: a long-lived writer exists before the save, and the save waits for it."""

    name = "waits-for-its-writer"
    capabilities = frozenset({"async", "kill_writer"})

    def __init__(self, writer: subprocess.Popen) -> None:
        self.writer = writer

    def standing_writers(self) -> list[int]:
        return [self.writer.pid]

    def save(self, root: Any, name: str, tensors: dict, *, use_async: bool, options: dict) -> str:
        for held in (True, False):  # held before the call (signals land asynchronously), then let go by the grace
            deadline = time.monotonic() + 30
            while (psutil.Process(self.writer.pid).status() == psutil.STATUS_STOPPED) != held:
                assert time.monotonic() < deadline, "the writer was never held" if held else "never let go"
                time.sleep(0.01)
        return name

    def writer_pids(self, handle: str) -> list[int]:
        return [self.writer.pid]


def test_a_save_that_waited_out_the_grace_leaves_its_writer_held_by_the_case(monkeypatch, tmp_path) -> None:
    """The grace lets a standing writer go while the save waits for it; once the save returns its writers are held
    again, by a hold the case's wait or resume releases: never by one nobody will release."""
    monkeypatch.setattr(rankops, "TRAIN_GRACE", 0.2)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        executor = RankExecutor(_JobThatWaitsForItsWriter(writer), 0, 1)  # type: ignore[arg-type]
        executor.case, executor.root = _OneStalledSave(), tmp_path  # type: ignore[assignment]
        record = executor.op(0)
        assert record["ok"], record
        executor.release()  # what the case's wait does
        assert executor.holds == []
        time.sleep(0.5)  # a SIGSTOP sent now would show by then
        assert psutil.Process(writer.pid).status() != psutil.STATUS_STOPPED
    finally:
        writer.kill()
        writer.wait(timeout=30)


class _OneRecordedSave(_OneStalledSave):
    """A sync save whose recording makes rank ``lead``'s writers run first."""

    def __init__(self, lead: int) -> None:
        super().__init__()
        self.ops = [Op("save", "step-1", 1)]
        self.fault = RecordFault(op=0, capture=True, lead=lead)


def test_a_lead_ranks_writers_run_first_and_the_others_wait_for_its_op(monkeypatch, tmp_path) -> None:
    """A record fault's ``lead``: another rank's standing writer is held from before its save until the lead rank's
    op has returned (its mark beside the root), not for a grace; the lead leaves that mark, even when its save
    raises, and holds nothing of its own."""
    monkeypatch.setattr(rankops, "LEAD_GRACE", 60.0)
    root = tmp_path / "ckpt"
    root.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        follower = RankExecutor(_JobThatWaitsForItsWriter(writer), 1, 2)  # type: ignore[arg-type]
        follower.case, follower.root = _OneRecordedSave(lead=0), root  # type: ignore[assignment]
        lead = RankExecutor(_Writers(), 0, 2)  # type: ignore[arg-type]  # it cannot save: its call raises
        lead.case, lead.root = _OneRecordedSave(lead=0), root  # type: ignore[assignment]
        threading.Timer(1.0, lead.op, (0,)).start()
        start = time.monotonic()
        record = follower.op(0)
        assert record["ok"], record
        assert 1.0 <= time.monotonic() - start < 30  # let go by the lead's mark, not the grace
        assert (tmp_path / ".lead-returned-0").exists() and not lead.holds and not follower.holds
        time.sleep(0.5)  # a SIGSTOP sent now would show by then
        assert psutil.Process(writer.pid).status() != psutil.STATUS_STOPPED
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_a_deep_stack_keeps_the_frames_where_it_was_raised() -> None:
    """A Trainer's stack is deeper than the frames a record keeps: the kept ones are the innermost, so the frame a
    bucket names is where the error was raised, not a caller some frames above it."""
    def inner() -> None:
        raise KeyError("w.w_0")

    def outer(n: int) -> None:
        return inner() if n == 0 else outer(n - 1)

    with pytest.raises(KeyError) as info:
        outer(20)
    text = rankops.traceback_text(info.value)
    assert ", in inner\n" in text and 'raise KeyError("w.w_0")' in text
    assert "in test_a_deep_stack" not in text  # the outermost frames are the ones left out
