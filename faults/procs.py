"""Ending a process tree for good: every launcher, rank and writer the harness or an injector started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``, everything under it, and anything left in its session (orphans re-parent to init), then
    reap. Children are walked only while ``proc`` is alive: a reaped pid may already belong to someone else."""
    kids: list[psutil.Process] = []
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(proc.pid).children(recursive=True)
        for p in kids:
            with contextlib.suppress(psutil.Error):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the process was started with start_new_session=True
    proc.wait()
    psutil.wait_procs(kids, timeout=5)
