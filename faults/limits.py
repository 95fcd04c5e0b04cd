"""RLIMIT_FSIZE on running processes: writes past a size fail, as on a full quota (docs/design.md §6, syscall errors).

No ptrace needed: the limit is set from outside with prlimit(2) (psutil ``rlimit``), which needs the same uid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import psutil

from .errors import FaultSpecError
from .triggers import descendants

Limits = tuple[int, int]


def _soft(max_bytes: int, hard: int) -> int:
    return max_bytes if hard == psutil.RLIM_INFINITY else min(max_bytes, hard)


class FileSizeLimit:
    """Lower the soft RLIMIT_FSIZE of running ``pids`` and of their descendants to ``max_bytes`` for the length of
    a ``with`` block; restore the previous limits on exit, for every process that still lives.

    * Children forked inside the block inherit the limit; those still alive at exit are restored as well (any
      descendant whose limit is still ours). A process that changed its own limit meanwhile is left alone.
    * Python ignores SIGXFSZ, so in a Python process the write that crosses the limit is cut short (it writes up
      to the limit and returns a short count) and the next one fails with EFBIG, ``OSError: [Errno 27] File too
      large``; the process lives on. A non-Python process dies with SIGXFSZ instead (one started by
      ``subprocess`` gets the default disposition back: ``restore_signals=True``).
    * The hard limit is kept, so the change can be undone without privileges; a lower hard limit wins.

    A limit cannot see whether a write crossed it: ``report()["fired"]`` means the limit was in force on at least
    one process, ``detail["limited"]`` / ``detail["restored"]`` list the pids.
    """

    def __init__(self, pids: Sequence[int], max_bytes: int) -> None:
        if not pids:
            raise FaultSpecError("no pids to apply the fault to")
        if max_bytes < 0:
            raise FaultSpecError(f"max_bytes must be >= 0, got {max_bytes}")
        self.pids, self.max_bytes = [int(p) for p in pids], max_bytes
        self._roots: list[psutil.Process] = []
        self._set: dict[psutil.Process, tuple[Limits, Limits]] = {}  # process -> (previous, ours)
        self.restored: list[int] = []

    def __enter__(self) -> FileSizeLimit:
        try:
            self._roots = [psutil.Process(p) for p in self.pids]
        except psutil.NoSuchProcess as exc:
            raise FaultSpecError(f"pid {exc.pid} is not running") from exc
        for p in [*self._roots, *descendants(self._roots)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                soft, hard = p.rlimit(psutil.RLIMIT_FSIZE)
                ours = (_soft(self.max_bytes, hard), hard)
                p.rlimit(psutil.RLIMIT_FSIZE, ours)
                self._set[p] = ((soft, hard), ours)
        return self

    def __exit__(self, *exc: object) -> None:
        born = {c: self._set[r] for r in self._roots if r in self._set for c in descendants([r])}
        for p, (previous, ours) in {**born, **self._set}.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.rlimit(psutil.RLIMIT_FSIZE) == ours:
                    p.rlimit(psutil.RLIMIT_FSIZE, previous)
                    self.restored.append(p.pid)

    @property
    def fired(self) -> bool:
        return bool(self._set)

    def report(self) -> dict[str, object]:
        """What was limited and restored, as JSON."""
        return {"mechanism": "psutil", "trigger": {"rlimit_fsize": self.max_bytes}, "fired": self.fired,
                "target_pid": self.pids[0] if self.fired else None,
                "detail": {"max_bytes": self.max_bytes, "limited": sorted(p.pid for p in self._set),
                           "restored": sorted(self.restored)}}
