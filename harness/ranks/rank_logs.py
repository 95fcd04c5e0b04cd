"""Per-rank logs for virtual ranks: what a rank thread prints goes to ``workerlog.<rank>``, as a launched rank's
output goes to its own log.

A failure message quotes the tail of every log (harness.ranks.pool), and signatures of known findings read those tails
(a rank that died right after reshard_comm logged its tasks): with every rank's lines in one host log, the tail was
whichever rank spoke last, followed by the host's own notes, and a virtual finding did not read as the same bug on
real ranks. Python-level output only: what the framework's C++ writes to file descriptor 2 stays in the host log.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


class RankStreams(io.TextIOBase):
    """A text stream that writes to the running rank's log (``current()``), or to ``host`` between ranks."""

    def __init__(self, logs: Path, current: Callable[[], int | None], host: TextIO) -> None:
        self._logs, self._current, self._host = logs, current, host
        self._files: dict[int, TextIO] = {}

    def _target(self) -> TextIO:
        rank = self._current()
        if rank is None:
            return self._host
        if rank not in self._files:
            self._files[rank] = (self._logs / f"workerlog.{rank}").open("a", encoding="utf-8", buffering=1)
        return self._files[rank]

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        for f in (self._host, *self._files.values()):
            f.flush()

    def writable(self) -> bool:
        return True

    def close_logs(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def route(logs: Path, current: Callable[[], int | None]) -> RankStreams:
    """Send ``sys.stdout``, ``sys.stderr`` and every logging handler already writing to them through per-rank
    logs under ``logs`` (handlers made at import hold the stream they were given, so they are re-pointed)."""
    streams = RankStreams(logs, current, sys.stderr)
    originals = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and any(handler.stream is o for o in originals):
                handler.setStream(streams)
    sys.stdout = sys.stderr = streams
    return streams
