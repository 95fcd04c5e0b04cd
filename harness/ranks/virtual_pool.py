"""Virtual ranks as a runner: one host process (harness.ranks.virtual_host) plays every rank of the world.

It is a warm pool in every other respect — the same protocol, timeouts, logs, a relaunch after a hang — so a case
runs the same code path whether its ranks are real or virtual. Where a case only lost ranks, the host starts a
fresh world in its own process instead of being relaunched (``recover``). Faults need real rank processes
(``launched`` is False), and the runner set gives fault cases real ranks (harness.ranks.runners).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from multiprocessing.connection import Connection, wait

from faults.procs import kill_trees
from harness.ranks.forkserver import ForkError, ForkServer
from harness.ranks.launch import start, worker_argv
from harness.ranks.pool import RankPool
from harness.ranks.runner import PoolFailure
from harness.ranks.virtual.gloo import VirtualUnsupported

HOST_MODULE = "harness.ranks.virtual_host"
#: How long a host may take to answer a request for a fresh world: it first finishes the op a lost rank cut short
#: (its other ranks, left waiting on that rank in a collective, fail at once: no peer can join a virtual one).
REBUILD_ANSWER_S = 10.0


class VirtualPool(RankPool):
    mode = "virtual"
    launched = False
    exact_health = True

    def __init__(self, sut: str, world: int, options: dict, start_timeout: float = 120.0,
                 forks: ForkServer | None = None) -> None:
        """``forks``: the runner set's fork server; once it is up, hosts are forked from it (a relaunch after a
        wedged world then costs a fork, not a Paddle import), else launched."""
        super().__init__(sut, world, options, start_timeout)
        self.launcher = "virtual"  # no framework launcher: the host is the ranks' only process
        self.forks = None  # nothing for the fork server to learn from a host
        self.host_forks = forks
        self.rebuilds = 0  # fresh worlds its host made in place of a relaunch (recover)
        self._lost: set[int] = set()  # ranks the last message lost (their connections are closed)
        self._hung = False  # the last message found ranks silent past its timeout: the host may be wedged

    def _start(self, control: str) -> dict[str, str]:
        assert self._dir is not None
        base = self._base_env()
        log = self._dir / "logs" / "virtual-host.log"
        argv = [*worker_argv(control, self.sut, json.dumps(self.options)), "--world", str(self.world),
                "--logs", str(log.parent)]
        self.forked = False
        if self.host_forks is not None:
            self.host_forks.start()  # in the background: this launch does not wait for it
            if self.host_forks.ready():
                try:
                    self.procs.append(self.host_forks.spawn(argv, base, log, main=HOST_MODULE,
                                                            fixes=self.options.get("fixes", ())))
                    self.forked = True
                    return base
                except ForkError:
                    kill_trees(self.procs)
                    self.procs = []
        self.procs.append(start([sys.executable, "-m", HOST_MODULE, *argv], base, log))
        return base

    def recover(self) -> bool:
        """After a case lost ranks, the host starts a fresh world in its own process — new rank threads, module
        state and adapters, as a relaunch would — and its ranks connect again: no host to kill, fork and warm up
        (docs/design.md §13). Not where the host died (an abort in Paddle is real), every rank was lost (no
        connection to ask on), ranks hung past the timeout, or the host refuses (detached saves in flight, whose
        writers a crash kills with the process)."""
        live = [conn for rank, conn in self.conns.items() if rank not in self._lost]
        if self._hung or not live or self._dir is None or not self.procs or any(p.poll() is not None
                                                                                 for p in self.procs):
            return False
        began = time.monotonic()
        # The fresh ranks' logs start here, as a relaunch's start empty: a later failure quotes only their lines.
        self.log_starts = {log: log.stat().st_size for log in (self._dir / "logs").rglob("*") if log.is_file()}
        control = str(self._dir / f"ctl{self.rebuilds + 1}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(control)
            listener.listen(self.world)
            if not _rebuilding(live, control):
                return False
            for conn in self.conns.values():
                conn.close()
            self.conns, self.pids = {}, {}
            self._gather(listener, time.monotonic() + self.start_timeout)
        except (PoolFailure, OSError):
            return False
        finally:
            listener.close()
        self._lost, self.rebuilds = set(), self.rebuilds + 1
        self.launch_seconds.append(time.monotonic() - began)
        return True

    def _broadcast(self, msg: dict, timeout: float, what: str, fail_fast: bool = True,
                   stuck_after: float | None = None, idle_limit: float | None = None) -> list[dict]:
        try:
            replies = super()._broadcast(msg, timeout, what, fail_fast, stuck_after, idle_limit)
        except PoolFailure as failure:
            self._lost, self._hung = set(failure.dead), failure.kind == "hang"
            raise
        self._lost, self._hung = set(), False
        return replies

    def op(self, index: int, timeout: float, fail_fast: bool = True, stuck_after: float | None = None,
           idle_limit: float | None = None) -> list[dict]:
        """``timeout`` bounds what one real rank does, on a machine of its own. Here W ranks, and the writer
        processes of their async saves, share this machine's cores, so the op may take up to ``timeout`` times W
        over the cores while the host's processes use CPU; a host whose processes use none for ``timeout`` waits on
        what will not come, as a real rank that waited that long would (a virtual collective no peer joins fails at
        once). Without that factor, 32 virtual ranks spawning 32 async writers on 2 cores would read as a hang.

        A rank that met something the virtual world does not emulate (``VirtualUnsupported``) makes the op the
        harness's failure, never a record a judge could read as the SUT's bug."""
        replies = super().op(index, timeout * shared_cores_factor(self.world), fail_fast, stuck_after,
                             idle_limit=timeout if idle_limit is None else idle_limit)
        unsupported = next((r for r in replies if r.get("error_type") == VirtualUnsupported.__name__), None)
        if unsupported is not None:
            raise VirtualUnsupported(f"rank {unsupported['rank']}, op {index}: {unsupported.get('error')}")
        return replies


def _rebuilding(live: list[Connection], control: str) -> bool:
    """Ask the host, on every connection it still has, for a fresh world whose ranks connect to ``control``; True
    once each has said it is rebuilding (replies to the op a lost rank cut short, still on their way, are read and
    dropped: the failure was already recorded)."""
    for conn in live:
        with contextlib.suppress(OSError):
            conn.send({"type": "rebuild", "control": control})
    deadline = time.monotonic() + REBUILD_ANSWER_S
    waiting = list(live)
    while waiting and time.monotonic() < deadline:
        for conn in wait(waiting, timeout=max(0.0, deadline - time.monotonic())):
            try:
                kind = conn.recv().get("type")
            except (EOFError, OSError):
                return False
            if kind == "refused":
                return False
            if kind == "rebuilding":
                waiting.remove(conn)
    return not waiting


def shared_cores_factor(ranks: int) -> int:
    """How many ranks' work each core of this machine carries when ``ranks`` share it (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, math.ceil(ranks / max(1, cores)))
