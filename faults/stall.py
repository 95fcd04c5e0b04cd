"""Stragglers: SIGSTOP a running rank and its descendants for a while, then SIGCONT (docs/design.md §6).

Same trigger machinery as :mod:`faults.triggers` (one polling thread, a different action), so a rank can be
stalled e.g. right after its shard file appears, while its peers wait in a collective.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import psutil

from .errors import FaultSpecError
from .triggers import Trigger, Watcher, freeze


class Stall(Watcher):
    """When the trigger is met, suspend ``pids`` and all their descendants for ``duration`` seconds, then resume.

    Leaving the ``with`` block ends a stall early and resumes everything still stopped, also when the block
    raised: no process outlives the block in the stopped state. ``detail["hit"]`` lists what was stopped;
    ``seconds["stopped_for"]`` is how long it really was (shorter than ``duration`` when cut by the exit).
    """

    def __init__(self, pids: Sequence[int], *, file_appears: str | None = None, bytes_written: int | None = None,
                 delay: float | None = None, duration: float, poll: float = 0.002) -> None:
        if duration < 0:
            raise FaultSpecError(f"duration must be >= 0, got {duration}")
        super().__init__(pids, Trigger(file_appears, bytes_written, delay), poll)
        self.duration = duration
        self.detail["duration"] = duration
        self._frozen: list[psutil.Process] = []
        self._t_stop = 0.0

    def _act(self) -> None:
        self._t_stop = time.monotonic()
        self._frozen = freeze(self._roots)
        self.hit = [p.pid for p in self._frozen]
        self._done.wait(self.duration)  # set by __exit__: the stall ends with the block at the latest
        self._heal()

    def _heal(self) -> None:
        if not self._frozen:
            return
        for p in reversed(self._frozen):  # children first, so a resumed parent finds them running
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
        self._frozen = []
        self.seconds["stopped_for"] = time.monotonic() - self._t_stop
