"""Runners by world size and set-up, created on demand and kept warm across cases; the launch mode (warm pool,
fresh launch per case, in-process) is chosen here and nowhere else."""

from __future__ import annotations

import json

from .inprocess import InProcessRunner
from .pool import RankPool
from .runner import Runner
from .sut import adapter_class

MODES = ("pool", "fresh", "in-process")
DEVICES = ("auto", "cpu", "gpu")  # auto: one GPU per rank where the framework has CUDA and enough GPUs
OP_TIMEOUT = 120.0


class Runners:
    """Runners by (world size, setup options), created on demand and reused across cases (warm)."""

    def __init__(self, sut: str, mode: str = "pool", op_timeout: float = OP_TIMEOUT, *, device: str = "auto",
                 nnodes: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown launch mode {mode!r}; known: {', '.join(MODES)}")
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
        self.sut, self.mode, self.op_timeout = sut, mode, op_timeout
        self.device, self.nnodes = device, nnodes
        self.cls = adapter_class(sut)
        self._runners: dict[tuple[int, str, bool], Runner] = {}
        self._retired_launches = 0
        self._retired_devices: set[str] = set()

    def get(self, world: int, options: dict, launched: bool = False) -> Runner:
        """A runner for ``world`` ranks; ``launched`` insists on real rank processes (a fault needs their pids)."""
        setup = {"shims": options.get("shims", True), "device": self.device}
        in_process = (not launched and self.mode == "in-process" and self.nnodes == 1
                      and (world == 1 or "in_process_world" in self.cls.capabilities))
        key = (world, json.dumps(setup, sort_keys=True), in_process)
        runner = self._runners.get(key)
        if runner is None:
            nodes = self.nnodes if world % self.nnodes == 0 else 1  # a world too small to split runs on one node
            runner = (InProcessRunner(self.sut, world, setup) if in_process
                      else RankPool(self.sut, world, setup, nnodes=nodes))
            self._runners[key] = runner
        return runner

    def discard(self, runner: Runner, graceful: bool = True) -> None:
        """Close ``runner`` and forget it; ``graceful=False`` kills its ranks at once (after a crash or a fault a
        surviving rank may sit in a collective or a commit wait and would only answer "stop" after a timeout)."""
        self._retired_devices |= runner.devices()
        runner.close(graceful)
        self._retired_launches += runner.launches
        self._runners = {k: r for k, r in self._runners.items() if r is not runner}

    def after_case(self) -> None:
        if self.mode == "fresh":
            self.close()

    @property
    def launches(self) -> int:
        return self._retired_launches + sum(r.launches for r in self._runners.values())

    @property
    def devices(self) -> set[str]:
        """Where the ranks ran, as "device (backend)" strings (a GPU run shows cuda:N here)."""
        return self._retired_devices.union(*(r.devices() for r in self._runners.values()))

    def close(self) -> None:
        for runner in list(self._runners.values()):
            self.discard(runner)
