"""Virtual ranks as a runner: one host process (harness.virtual_host) plays every rank of the world.

It is a warm pool in every other respect — the same protocol, timeouts, logs, relaunch after a hang — so a case
runs the same code path whether its ranks are real or virtual. Faults need real rank processes (``launched`` is
False), and the runner set gives fault cases real ranks (harness.runners).
"""

from __future__ import annotations

import json
import math
import os
import sys

from .forkserver import ForkError, ForkServer
from .gloo_model import VirtualUnsupported
from .launch import kill_trees, start, worker_argv
from .pool import RankPool

HOST_MODULE = "harness.virtual_host"


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
                    self.procs.append(self.host_forks.spawn(argv, base, log, main=HOST_MODULE))
                    self.forked = True
                    return base
                except ForkError:
                    kill_trees(self.procs)
                    self.procs = []
        self.procs.append(start([sys.executable, "-m", HOST_MODULE, *argv], base, log))
        return base

    def op(self, index: int, timeout: float, fail_fast: bool = True, stuck_after: float | None = None,
           idle_limit: float | None = None) -> list[dict]:
        """``timeout`` bounds what one real rank does, on a machine of its own. Here W ranks, and the writer
        processes of their async saves, share this machine's cores, so the op may take up to ``timeout`` times W
        over the cores while the host's processes use CPU; a host whose processes use none for ``timeout`` waits on
        what will not come, as a real rank that waited that long would (a virtual collective no peer joins fails at
        once). 32 virtual ranks spawning 32 async writers on 2 cores took 2 minutes and read as a hang before.

        A rank that met something the virtual world does not emulate (``VirtualUnsupported``) makes the op the
        harness's failure, never a record a judge could read as the SUT's bug."""
        replies = super().op(index, timeout * shared_cores_factor(self.world), fail_fast, stuck_after,
                             idle_limit=timeout if idle_limit is None else idle_limit)
        unsupported = next((r for r in replies if r.get("error_type") == VirtualUnsupported.__name__), None)
        if unsupported is not None:
            raise VirtualUnsupported(f"rank {unsupported['rank']}, op {index}: {unsupported.get('error')}")
        return replies


def shared_cores_factor(ranks: int) -> int:
    """How many ranks' work each core of this machine carries when ``ranks`` share it (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, math.ceil(ranks / max(1, cores)))
