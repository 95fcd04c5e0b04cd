"""Held writers: what a call leaves running in the background (threads it started, child processes it spawned)
is kept from running until released, so a writer's race with whatever the caller does next is decided, not
sampled.

Threads are gated before their target runs (``threading.Thread.start`` is wrapped while a hold captures, for
threads the capturing thread starts); processes are SIGSTOPped with their descendants as soon as the call returns
(a spawned interpreter is still starting up then). A call that waits for a thread it started itself cannot return
while that thread is gated: after ``sync_grace`` seconds of such waiting the thread is let go and the hold says so
(``leaked``), so a synchronous "async" path shows up as a slow save, never as a hang.

Knows threads and processes only, never a checkpoint format (the harness decides what a writer is).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import psutil

from .triggers import descendants, freeze

_local = threading.local()  # the hold capturing on this thread, if any
_patched = threading.Lock()
_original_start = threading.Thread.start


def _start(self: threading.Thread) -> None:
    """``Thread.start`` while a hold may be capturing: a thread started by a capturing thread waits for the gate."""
    hold: WriterHold | None = getattr(_local, "hold", None)
    if hold is not None:
        hold._gate(self)
    _original_start(self)


def _install() -> None:
    with _patched:
        if threading.Thread.start is not _start:
            threading.Thread.start = _start  # type: ignore[method-assign]


class WriterHold:
    """Holds the writers of calls made inside ``capture()`` until ``release()``; safe to release twice."""

    def __init__(self, sync_grace: float = 2.0) -> None:
        self.sync_grace = sync_grace
        self._gate_open = threading.Event()
        self._calling = threading.Event()  # set while a capturing call has not returned
        self.threads: list[str] = []
        self.processes: list[psutil.Process] = []
        self.leaked: list[str] = []  # threads let go because the call that started them waited for them
        self._releasing = threading.Lock()  # release() may come from another thread (a grace timer) mid-stop

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Run the block's call with the threads it starts gated; when it returns, stop the child processes it
        left behind (new since the block began, with their descendants)."""
        _install()
        me = psutil.Process()
        before = {p.pid for p in descendants([me])}
        _local.hold = self
        self._calling.set()
        try:
            yield
        finally:
            _local.hold = None
            self._calling.clear()
        self.stop(p for p in descendants([me], recursive=False) if p.pid not in before)

    def stop(self, processes: Iterable[psutil.Process | int]) -> None:
        """Hold these processes too (long-lived writers a SUT started before the call), with their descendants;
        nothing once released: a hold let go early (a call that waited for its writer) holds nothing again, since
        nobody would let a writer it stopped then go."""
        procs = []
        for p in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(p if isinstance(p, psutil.Process) else psutil.Process(p))
        with self._releasing:
            if not self._gate_open.is_set():
                self.processes += [p for p in freeze([p for p in procs if p not in self.processes])]

    def _gate(self, thread: threading.Thread) -> None:
        run = thread.run
        self.threads.append(thread.name)

        def gated() -> None:
            waited = 0.0
            while not self._gate_open.wait(0.05):
                waited += 0.05
                if self._calling.is_set() and waited >= self.sync_grace:  # the call itself waits for this thread
                    self.leaked.append(thread.name)
                    break
            run()

        thread.run = gated  # type: ignore[method-assign]

    @property
    def holding(self) -> bool:
        return bool(self.threads or self.processes) and not self._gate_open.is_set()

    def kill(self) -> None:
        """SIGKILL the held processes where they stand (a crash of the job's writers: none of them may run on)."""
        for p in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

    def release(self) -> None:
        """Let every held writer go on (children resumed before parents, as ``freeze`` stopped them)."""
        with self._releasing:
            for p in reversed(self.processes):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.resume()
            self.processes = []
            self._gate_open.set()

