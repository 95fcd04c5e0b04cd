"""Virtual ranks as a runner: one host process (harness.virtual_host) plays every rank of the world.

It is a warm pool in every other respect — the same protocol, timeouts, logs, relaunch after a hang — so a case
runs the same code path whether its ranks are real or virtual. Faults need real rank processes (``launched`` is
False), and the runner set gives fault cases real ranks (harness.runners).
"""

from __future__ import annotations

import json
import sys

from .launch import start, worker_argv
from .pool import RankPool

HOST_MODULE = "harness.virtual_host"


class VirtualPool(RankPool):
    mode = "virtual"
    launched = False

    def __init__(self, sut: str, world: int, options: dict, start_timeout: float = 120.0) -> None:
        super().__init__(sut, world, options, start_timeout)
        self.launcher = "virtual"  # no framework launcher: the host is the ranks' only process
        self.forks = None

    def _start(self, control: str) -> dict[str, str]:
        assert self._dir is not None
        base = self._base_env()
        log_dir = self._dir / "logs"
        argv = [sys.executable, "-m", HOST_MODULE, *worker_argv(control, self.sut, json.dumps(self.options)),
                "--world", str(self.world)]
        self.procs.append(start(argv, base, log_dir / "virtual-host.log"))
        return base
