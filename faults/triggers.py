"""ptrace-free crash points: SIGKILL running processes when a trigger is met (docs/design.md §6, the strace fallback).

A background thread polls a :class:`Trigger` (a file appears, N bytes written, a delay passed) and, once it is
met, acts on the process tree. :class:`Watcher` is that one polling mechanism; :class:`KillWhen` (here) and
:class:`faults.stall.Stall` are its two actions. Only psutil and /proc are used, so this works where ptrace is
forbidden (reading /proc/PID/io needs the same uid, not ptrace permission).

Facts measured here (Linux 6.18, psutil 7.2, Python 3.11):

* ``write_bytes`` in /proc/PID/io is not a byte count of write() calls: on ext4 it grows by whole dirtied
  pages (a 1000-byte write shows 4096 or more), on tmpfs it stays 0. So ``bytes_written`` counts ``wchar``
  (psutil ``write_chars``): bytes handed to write()-family calls, updated at once, for *any* fd (files, pipes,
  stdout). A child's counter starts at 0 and dies with it, so the sum keeps the last value seen of every
  process; bytes a short-lived child writes between two polls are missed.
* ``psutil.wait_procs`` on a process that is our own child reaps it, and ``subprocess.Popen.wait`` then returns
  0 instead of -9 (ECHILD is read as success). So the kill waits until each process is *dead* (gone or a
  zombie) and leaves our own children for their owner to reap: a killed rank still reads ``returncode == -9``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import psutil

from .errors import FaultSpecError

TARGETS = ("tree", "children")
#: How long a SIGKILLed process may take to die (one stuck in uninterruptible IO needs its IO to finish).
KILL_TIMEOUT = 10.0
_W = TypeVar("_W", bound="Watcher")
_PROC_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")  # CONFIG_PROC_CHILDREN


@dataclass(frozen=True)
class Trigger:
    """Exactly one condition, measured from the moment of arming.

    * ``file_appears``: an absolute glob pattern (``**`` allowed; ``*`` skips dot-files, as in :mod:`glob`) that
      matches a path it did not match at arming; a pre-existing match never fires it.
    * ``bytes_written``: bytes passed to write() calls (``wchar``) by the pids and their descendants since arming.
    * ``delay``: seconds since arming (monotonic clock).
    """

    file_appears: str | None = None
    bytes_written: int | None = None
    delay: float | None = None

    def __post_init__(self) -> None:
        given = self.spec()
        if len(given) != 1:
            raise FaultSpecError(f"give exactly one of file_appears, bytes_written, delay; got {given or 'none'}")
        if self.file_appears is not None and not os.path.isabs(self.file_appears):
            raise FaultSpecError(f"file_appears must be an absolute glob pattern, got {self.file_appears!r}")
        if self.bytes_written is not None and self.bytes_written < 0:
            raise FaultSpecError(f"bytes_written must be >= 0, got {self.bytes_written}")
        if self.delay is not None and self.delay < 0:
            raise FaultSpecError(f"delay must be >= 0, got {self.delay}")

    def spec(self) -> dict[str, object]:
        """The one condition as JSON: ``{"delay": 0.5}``."""
        return {k: v for k, v in vars(self).items() if v is not None}


def _children(p: psutil.Process) -> list[psutil.Process]:
    """Direct children of a live ``p``. Read from /proc/PID/task/*/children where the kernel has it: that costs
    O(tree), where psutil's ``children()`` scans every process on the machine (≈ 3 ms for 80 processes)."""
    if not _PROC_CHILDREN:
        return p.children()
    if not p.is_running():  # is_running also catches a reused pid
        return []
    pids: list[int] = []
    task = f"/proc/{p.pid}/task"
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(task):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(f"{task}/{tid}/children") as f:
                pids += [int(c) for c in f.read().split()]
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            out.append(psutil.Process(pid))
    return out


def descendants(procs: Iterable[psutil.Process], *, recursive: bool = True) -> list[psutil.Process]:
    """Children (and, if ``recursive``, their children…) of every live process in ``procs``, parents first."""
    out: list[psutil.Process] = []
    level = list(procs)
    while level:
        kids: list[psutil.Process] = []
        for p in level:
            with contextlib.suppress(psutil.NoSuchProcess):
                kids += _children(p)
        out += kids
        level = kids if recursive else []
    return out


def _wchar(p: psutil.Process) -> int | None:
    try:
        return p.io_counters().write_chars
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


class _Probe:
    """A trigger armed now: remembers what already matched, what was already written, and when."""

    def __init__(self, trigger: Trigger, roots: Sequence[psutil.Process]) -> None:
        self.trigger, self.roots, self.t0 = trigger, list(roots), time.monotonic()
        pattern = trigger.file_appears
        self.before = set(glob.glob(pattern, recursive=True)) if pattern is not None else set()
        self.base: dict[psutil.Process, int] = {}
        if trigger.bytes_written is not None:
            self.base = {p: w for p in [*self.roots, *descendants(self.roots)] if (w := _wchar(p)) is not None}
        self.seen = dict(self.base)

    def check(self) -> dict[str, object] | None:
        """None while unmet; else what met it (goes into the report's ``detail``)."""
        t = self.trigger
        if t.delay is not None:
            return {} if time.monotonic() - self.t0 >= t.delay else None
        if t.file_appears is not None:
            new = sorted(set(glob.glob(t.file_appears, recursive=True)) - self.before)
            return {"matched": new[0]} if new else None
        for p in [*self.roots, *descendants(self.roots)]:
            w = _wchar(p)
            if w is not None:
                self.seen[p] = max(self.seen.get(p, 0), w)
        written = sum(w - self.base.get(p, 0) for p, w in self.seen.items())
        assert t.bytes_written is not None
        return {"bytes_seen": written} if written >= t.bytes_written else None


def freeze(roots: Sequence[psutil.Process], *, include_roots: bool = True) -> list[psutil.Process]:
    """SIGSTOP ``roots`` (unless ``include_roots`` is False) and all their descendants, parents before children.

    A stopped parent cannot fork (a fork racing the SIGSTOP is restarted), so the walk sees the whole tree; with
    ``include_roots=False`` a root may still fork a child after the walk. Returns what was stopped, in order.
    """
    frozen: dict[psutil.Process, None] = {}
    try:
        level = list(roots) if include_roots else descendants(roots, recursive=False)
        while level:
            for p in level:
                if p not in frozen:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.suspend()
                        frozen[p] = None
            level = [c for c in descendants(level, recursive=False) if c not in frozen]
    except BaseException:  # e.g. AccessDenied half-way: leave nothing stopped behind
        for p in reversed(frozen):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
        raise
    return list(frozen)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_dead(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process is gone or a zombie, without reaping it; return those still alive at timeout."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _dead(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    return alive


class Watcher:
    """Arms a :class:`Trigger` on running ``pids`` for the length of a ``with`` block; a thread polls it every
    ``poll`` seconds and calls :meth:`_act` once when it is met. ``__exit__`` stops the thread, joins it, and
    calls :meth:`_heal`, even when the block raised. Subclasses set :attr:`hit` (pids acted on)."""

    def __init__(self, pids: Sequence[int], trigger: Trigger, poll: float) -> None:
        if not pids:
            raise FaultSpecError("no pids to apply the fault to")
        if poll <= 0:
            raise FaultSpecError(f"poll must be > 0, got {poll}")
        self.pids, self.trigger, self.poll = [int(p) for p in pids], trigger, poll
        self.hit: list[int] = []
        self.detail: dict[str, object] = {"trigger_met": False}
        self.seconds: dict[str, float] = {}
        self._roots: list[psutil.Process] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self: _W) -> _W:
        try:
            self._roots = [psutil.Process(p) for p in self.pids]
        except psutil.NoSuchProcess as exc:
            raise FaultSpecError(f"pid {exc.pid} is not running") from exc
        probe = _Probe(self.trigger, self._roots)
        self._thread = threading.Thread(target=self._run, args=(probe,), name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def _run(self, probe: _Probe) -> None:
        try:
            while not self._done.is_set():
                met = probe.check()
                if met is not None:
                    self.detail.update(met, trigger_met=True)
                    self.seconds["fired_after"] = time.monotonic() - probe.t0
                    self._act()
                    return
                self._done.wait(self.poll)
        except BaseException as exc:  # reported by __exit__, after healing
            self._error = exc

    def _act(self) -> None:
        raise NotImplementedError

    def _heal(self) -> None:
        """Undo whatever :meth:`_act` left in force; runs after the thread has ended."""

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._heal()
        if self._error is not None and exc_type is None:
            raise FaultSpecError(f"{type(self).__name__} could not act on {self.pids}: {self._error!r}") \
                from self._error

    @property
    def fired(self) -> bool:
        return bool(self.hit)

    def report(self) -> dict[str, object]:
        """What fired, as JSON; wall-clock readings only under ``seconds``."""
        return {"mechanism": "psutil", "trigger": self.trigger.spec(), "fired": self.fired,
                "target_pid": self.pids[0] if self.fired else None,
                "detail": {**self.detail, "hit": sorted(self.hit)}, "seconds": dict(self.seconds)}


class KillWhen(Watcher):
    """SIGKILL running ``pids`` with their descendants (``target="tree"``), or only the descendants, e.g. the
    async writer a rank spawned (``target="children"``; the pid lives on), once the trigger is met.

    The tree is stopped top-down first so nothing forks away while it is walked, then killed; the kill returns
    once every process is dead (see the module docstring on why our own children are not reaped here).
    ``report()["fired"]`` is True when at least one process was killed; ``detail["trigger_met"]`` says whether
    the condition was seen at all (with ``target="children"`` there may have been no child to kill).
    """

    def __init__(self, pids: Sequence[int], *, file_appears: str | None = None, bytes_written: int | None = None,
                 delay: float | None = None, target: str = "tree", poll: float = 0.002) -> None:
        if target not in TARGETS:
            raise FaultSpecError(f"target must be one of {TARGETS}, got {target!r}")
        super().__init__(pids, Trigger(file_appears, bytes_written, delay), poll)
        self.target = target
        self.detail["target"] = target

    def _act(self) -> None:
        frozen = freeze(self._roots, include_roots=self.target == "tree")
        for p in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.hit = [p.pid for p in frozen]
        alive = wait_dead(frozen, KILL_TIMEOUT)
        if alive:
            raise RuntimeError(f"still alive {KILL_TIMEOUT} s after SIGKILL: {[p.pid for p in alive]}")
