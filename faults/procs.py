"""Ending a process tree for good: every launcher, rank and writer the harness or an injector started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psutil

TREE_VAR = "CKPT_HARNESS_TREE"  # marks every process a launch starts, however far it strays from the tree
SHM_DIR = "/dev/shm"
TRACKER_GRACE = 5.0  # seconds a resource tracker gets to clean up after its users died (it may still be starting)


def popen(argv: list[str], *, env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, with a token in its environment that every descendant inherits:
    launchers put ranks in sessions of their own (Paddle's calls setsid), and a writer whose rank was killed
    re-parents to init, so neither the tree nor the session reaches it; the token does (``kill_tree``)."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(argv, env={**(os.environ if env is None else env), TREE_VAR: token},
                            start_new_session=True, **kwargs)
    proc.tree_token = token  # type: ignore[attr-defined]
    return proc


def _marked(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and p.environ().get(TREE_VAR) == token:
                out.append(p)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``, everything under it, and anything left in its session (orphans re-parent to init), then
    reap. Children are walked only while ``proc`` is alive: a reaped pid may already belong to someone else.

    Python's ``multiprocessing`` resource trackers go last: once every process that used one is dead, a tracker
    unlinks the semaphores and shared memory they left (``/dev/shm/sem.mp-*``, whose names say nothing of their
    maker) and exits; killed with the rest, it leaks them, a few per killed job, for good."""
    kids: list[psutil.Process] = []
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(proc.pid).children(recursive=True)
    trackers = [p for p in kids if _is_tracker(p)]
    for p in kids:
        if p not in trackers:
            with contextlib.suppress(psutil.Error):
                p.kill()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # reaped only after the killpg below: until then its pid, and so its group, is not reused
    token = getattr(proc, "tree_token", None)
    strays = [p for p in _marked(token) if p not in trackers] if token else []  # orphaned writers, ranks in
    for p in strays:                                                             # sessions of their own
        with contextlib.suppress(psutil.Error):
            if _is_tracker(p):
                trackers.append(p)
            else:
                p.kill()
    _wait_dead(trackers, timeout=TRACKER_GRACE)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the process was started with start_new_session=True
    proc.wait()
    for p in trackers:  # one that did not end in its grace
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait_dead(kids + strays, timeout=5.0)
    remove_shared_memory([proc.pid, *(p.pid for p in kids + strays)])


def _is_tracker(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("multiprocessing.resource_tracker" in part for part in p.cmdline())
    return False


def remove_shared_memory(pids: list[int]) -> list[str]:
    """Unlink the POSIX shared-memory segments these (dead) processes made through Paddle (``paddle_<pid>_*``:
    tensors shared with writers and workers). A process killed mid-run never unlinks its own, and a CPU stand-in
    for CUDA IPC makes some on every save; nothing can open them once their maker is gone. Returns the names."""
    wanted = tuple(f"paddle_{pid}_" for pid in pids)
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(wanted)]
    except OSError:
        return []
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
    return names


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until each process is gone or a zombie: either way it makes no more syscalls. (Orphans are reaped by
    init, whenever init gets to it; waiting for their pids to vanish costs a poll loop per process.)"""
    deadline = time.monotonic() + timeout
    left = list(procs)
    while left and time.monotonic() < deadline:
        alive = []
        for p in left:
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        left = alive
        if left:
            time.sleep(0.005)
