"""A thread woken by another runs on the waker's core: the handoff between virtual ranks
(harness.ranks.virtual.scheduler).

A switch between two virtual ranks is a lock the running thread releases and the next one was waiting on, and the
running one blocks right after. Left to itself the kernel wakes the next thread on another, idle core: an
inter-processor wake-up that cost 22 us a switch on a 2-core VM, against 6 us between two threads sharing a core,
and a 16-rank case makes about 200 switches. So the waker restricts the sleeping thread to its own core just
before waking it, and the woken thread lifts the restriction at once: a thread that runs is never pinned, so
what it starts (an async save's writer process, a framework's worker threads) inherits the whole machine. 9 us a
switch, the two system calls included (bench/virtual.py). Only where the next thread runs changes, never which
thread runs or what it computes: the scheduler alone decides that.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable


def _sched_getcpu() -> Callable[[], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return fn


class WakeOnWakerCore:
    """``wake_here(tid)`` before releasing the lock thread ``tid`` waits on; ``woken()`` first thing after an
    acquire returns. Does nothing where the platform cannot pin a thread, or the process has one core anyway."""

    def __init__(self) -> None:
        getcpu = _sched_getcpu()
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            allowed = set()
        self._getcpu = getcpu
        self._allowed = allowed
        self.supported = getcpu is not None and len(allowed) > 1 and getcpu() >= 0
        self.enabled = self.supported  # pinning before a wake-up; off after an error, lifting stays on

    def wake_here(self, tid: int | None) -> None:
        if not self.enabled or tid is None:
            return
        try:
            os.sched_setaffinity(tid, (self._getcpu(),))  # type: ignore[misc]
        except OSError:  # the thread is gone, or a cpuset changed under the process: stop pinning
            self.enabled = False

    def woken(self) -> None:
        if not self.supported:
            return
        try:
            os.sched_setaffinity(0, self._allowed)
        except OSError:  # the cpuset shrank: keep what the kernel allows
            self.enabled = False
