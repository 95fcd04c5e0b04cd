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
    reap (``kill_trees`` of one)."""
    kill_trees([proc])


def kill_trees(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every process of these trees, and anything left in their sessions, then reap. Children are walked
    only while their root is alive: a reaped pid may already belong to someone else.

    Every tree dies before any grace is waited out: the trees are one job's ranks, and a rank told to stop may
    let its held writers go, so a writer must not outlive the kill of another rank by a grace.

    Python's ``multiprocessing`` resource trackers go last: once every process that used one is dead, a tracker
    unlinks the semaphores and shared memory they left (``/dev/shm/sem.mp-*``, whose names say nothing of their
    maker) and exits; killed with the rest, it leaks them, a few per killed job, for good."""
    trees = [(proc, _kids(proc)) for proc in procs]
    trackers: list[psutil.Process] = []
    killed: list[psutil.Process] = []

    def kill_or_spare(found: list[psutil.Process]) -> None:
        for p in found:
            if p in trackers or p in killed:
                continue
            with contextlib.suppress(psutil.Error):
                if _is_tracker(p):
                    trackers.append(p)
                else:
                    p.kill()
                    killed.append(p)

    for proc, kids in trees:
        kill_or_spare(kids)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # reaped only after the killpg below: until then its pid, and so its group, is not reused
    for proc, _ in trees:
        token = getattr(proc, "tree_token", None)
        kill_or_spare(_marked(token) if token else [])  # orphaned writers, ranks in sessions of their own
    for p in trackers:  # a tracker a hold stopped with the writers it serves cleans up only once it runs
        with contextlib.suppress(psutil.Error):
            p.resume()
    _wait_dead(trackers, timeout=TRACKER_GRACE)
    for proc, _ in trees:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the process was started with start_new_session=True
        proc.wait()
    for p in trackers:  # one that did not end in its grace
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait_dead(killed + trackers, timeout=5.0)
    remove_shared_memory([*(proc.pid for proc in procs), *(p.pid for p in killed + trackers)])


def _kids(proc: subprocess.Popen) -> list[psutil.Process]:
    if proc.poll() is not None:
        return []
    with contextlib.suppress(psutil.Error):
        return psutil.Process(proc.pid).children(recursive=True)
    return []


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
