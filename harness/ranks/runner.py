"""The one interface every runner implements: run one op of a case on every rank of a world.

A runner is warm: begun once per case, fed that case's ops one at a time, ended, and reused for the next case.
``run.run_ops`` and ``runners.Runners`` use nothing else, so a new way to host ranks (a pool, a fresh launch per
case, ranks inside this process, virtual ranks) is one class implementing this, with no ``isinstance`` anywhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Protocol

from harness.sut.base import SutAdapter


class PoolFailure(Exception):
    """The ranks could not be started or stopped answering; ``kind`` is "crash", "hang" or "setup".

    ``replies`` holds what the ranks that did answer said (a fault run judges the survivors of a killed rank);
    ``dead`` and ``silent`` name the ranks that died or never answered."""

    def __init__(self, kind: str, message: str, replies: list[dict] | None = None, dead: tuple[int, ...] = (),
                 silent: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.kind, self.replies, self.dead, self.silent = kind, replies or [], dead, silent


class Runner(ABC):
    """Ranks of one world running one SUT. ``launched``: the ranks are real processes whose ``pids`` a fault can
    attach to (and whose failures may leave the group out of step, so a failed op is checked with ``healthy``)."""

    mode: str
    launched: bool
    #: Its ranks meet in collectives, so a failed op may leave them out of step (one raised, one waits): a failed
    #: case's runner is checked with ``healthy`` before it is kept.
    drifts: bool = False
    #: ``healthy`` sees every way the ranks can be out of step (virtual ranks: the scheduler knows each rank's place in
    #: every collective), so a failed op that was not symmetric needs no relaunch where the check passes.
    exact_health: bool = False

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}  # rank -> pid of the rank process (real ranks only)
        self.info: dict[int, dict] = {}  # rank -> where it runs (SutAdapter.describe)
        self.shims: list[str] = []  # CPU shims the adapter applied
        self.launches = 0  # rank launches so far (a pool relaunches after a crash)
        # Recovery accounting (the campaign's summary): seconds each launch took, whether this runner's first
        # launch replaced a lost one (Runners sets it), and seconds spent on ranks that had failed (waiting on
        # ranks stuck behind a rank that raised, or silent until an op timed out).
        self.launch_seconds: list[float] = []
        self.replacement = False
        self.failure_wait_s = 0.0

    @property
    def recovery_launch_s(self) -> float:
        """Seconds of launches that replaced lost ranks: every relaunch, and the first launch of a replacement."""
        return sum(self.launch_seconds[0 if self.replacement else 1:])

    @abstractmethod
    def begin(self, case_json: dict, root: str) -> None:
        """Hand every rank the case and the directory its checkpoints live in."""

    @abstractmethod
    def op(self, index: int, timeout: float, fail_fast: bool = True, stuck_after: float | None = None,
           idle_limit: float | None = None) -> list[dict]:
        """Run op ``index`` on every rank; one reply per rank, sorted by rank. Raises PoolFailure when a rank dies
        (at once, or with ``fail_fast=False`` once the survivors answered) or stays silent past ``timeout``.
        ``stuck_after``: once a rank has raised, ranks still busy this much later are answered for by a "Stuck"
        reply (they wait on it in a collective it left; the caller drops such ranks) instead of being waited on
        until the backend's own timeout. ``idle_limit``: ranks whose processes used no CPU for that long raise
        "hang" before ``timeout`` (runners whose ranks share the harness's process cannot tell, and ignore it)."""

    @abstractmethod
    def end(self) -> None:
        """End the case: the ranks drop its state (in-flight async saves included)."""

    @abstractmethod
    def close(self, graceful: bool = True) -> None:
        """Stop the ranks; ``graceful=False`` ends them at once, as a crash of the job would."""

    def recover(self) -> bool:
        """The job lost these ranks (one died, some were left stuck, a restart): start fresh ones without
        relaunching, where this runner can; False when it cannot (the caller then closes it and starts another)."""
        return False

    def healthy(self, timeout: float = 15.0) -> bool:
        """Whether the ranks still agree about where they are (after a failed op); True where nothing can drift."""
        return True

    def devices(self) -> set[str]:
        """Where the ranks ran, as "device (backend)" strings (a GPU run shows cuda:N here)."""
        return {f"{i.get('device', '?')} ({i['backend']})" if "backend" in i else i.get("device", "?")
                for i in self.info.values()}


class RunnerSet(Protocol):
    """What running and judging a case ask of the runners they run on (``harness.ranks.runners.Runners``): the
    judging stage depends on this, never on how ranks are hosted."""

    mode: str  # recorded in each Outcome; a decision that differs by mode belongs to the runners
    op_timeout: float
    cls: type[SutAdapter]
    #: After a failed op of a fault case, ranks that failed alike and pass a health check stay (warm passes).
    keep_failed: bool
    #: Ranks idle in an op after a peer raised are not waited on until the backend's timeout (a fuzzing judge).
    fast_failures: bool

    def get(self, world: int, options: dict, launched: bool = False, fault_case: bool = False) -> Runner: ...

    def warm(self) -> AbstractContextManager[RunnerSet]: ...

    def strict(self) -> AbstractContextManager[RunnerSet]: ...

    def lose(self, runner: Runner, graceful: bool = True, restart: bool = False) -> None: ...

    def after_case(self) -> None: ...
