"""Held writers (faults.hold): what a call leaves running is held until released — threads gated before they
run, child processes stopped — and nothing outlives a release stopped or gated."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil

from faults.hold import WriterHold


def test_a_thread_started_inside_the_capture_runs_only_after_release() -> None:
    ran = threading.Event()
    hold = WriterHold()
    with hold.capture():
        thread = threading.Thread(target=ran.set, name="writer")
        thread.start()
    assert hold.holding and hold.threads == ["writer"]
    assert not ran.wait(0.3)  # gated
    hold.release()
    assert ran.wait(5) and not hold.holding
    thread.join(5)


def test_threads_started_elsewhere_are_not_held() -> None:
    ran = threading.Event()
    hold = WriterHold()
    with hold.capture():
        other = threading.Thread(target=lambda: threading.Thread(target=ran.set).start())
        other.start()  # this one is gated (the capturing thread started it) ...
    hold.release()
    other.join(5)
    assert ran.wait(5)  # ... the thread it starts after the capture is not
    free = threading.Event()
    threading.Thread(target=free.set).start()  # no capture active: never gated
    assert free.wait(5)


def test_a_call_that_waits_for_its_own_thread_is_let_go_not_hung() -> None:
    hold = WriterHold(sync_grace=0.2)
    start = time.monotonic()
    with hold.capture():
        thread = threading.Thread(target=lambda: None, name="sync-writer")
        thread.start()
        thread.join(10)  # a synchronous "async" save
    assert not thread.is_alive() and hold.leaked == ["sync-writer"]
    assert time.monotonic() - start < 5
    hold.release()


def test_a_spawned_process_is_stopped_until_release_and_can_be_killed_held() -> None:
    hold = WriterHold()
    with hold.capture():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = psutil.Process(child.pid)
        assert _settles(proc, stopped=True)
        hold.release()
        assert _settles(proc, stopped=False)
        again = WriterHold()
        again.stop([child.pid])  # a long-lived writer the adapter names
        assert _settles(proc, stopped=True)
        again.kill()
        assert child.wait(10) < 0  # SIGKILLed where it stood
        again.release()  # releasing what is gone is harmless
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_a_hold_let_go_early_holds_nothing_again() -> None:
    """A grace timer lets a hold go while its call still runs (the job waited for its writer): a process the call
    leaves, or the adapter names after it, must not be stopped by a hold nobody will release again."""
    hold = WriterHold()
    with hold.capture():
        hold.release()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        hold.stop([child.pid])
        assert hold.processes == []
        assert not _settles(psutil.Process(child.pid), stopped=True, within=0.5)
    finally:
        child.kill()
        child.wait(10)


def _settles(proc: psutil.Process, *, stopped: bool, within: float = 5.0) -> bool:
    """Signals land asynchronously: poll until the process is (or is no longer) stopped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (proc.status() == psutil.STATUS_STOPPED) == stopped:
            return True
        time.sleep(0.01)
    return False
