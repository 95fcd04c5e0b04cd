"""Runners by world size and set-up, created on demand and kept warm across cases; the launch mode (warm pool,
fresh launch per case, in-process) is chosen here and nowhere else."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from harness.coverage.measure import COVERAGE_OPTION
from harness.fixes import FIXES
from harness.fixes.reach import REACH_OPTION
from harness.ranks.forkserver import ForkServer
from harness.ranks.inprocess import InProcessRunner
from harness.ranks.pool import RankPool
from harness.ranks.runner import Runner
from harness.ranks.virtual_pool import VirtualPool
from harness.sut import adapter_class

MODES = ("pool", "fresh", "in-process", "virtual")
DEVICES = ("auto", "cpu", "gpu")  # auto: one GPU per rank where the framework has CUDA and enough GPUs
OP_TIMEOUT = 120.0
# Pools kept launching in the background during a warm pass, per world size and set-up: a pass over crash states
# loses a pool on every state where one rank raised and another waits on it, often several in a row.
SPARES = 2
# Exploring outside a warm pass, the world sizes (and set-ups) whose lost pool or virtual host has one spare
# starting in the background.
EXPLORING_SPARE_KEYS = 2


class Runners:
    """Runners by (world size, setup options), created on demand and reused across cases (warm)."""

    def __init__(self, sut: str, mode: str = "pool", op_timeout: float = OP_TIMEOUT, *, device: str = "auto",
                 nnodes: int = 1, fixes: tuple[str, ...] = (), forks: ForkServer | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown launch mode {mode!r}; known: {', '.join(MODES)}")
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; known: {', '.join(DEVICES)}")
        self.sut, self.mode, self.op_timeout = sut, mode, op_timeout
        self.device, self.nnodes = device, nnodes
        self.fixes = fixes  # applied on every rank before the adapter's set-up (harness.fixes)
        self.reach: dict | None = None  # the fix table's watch on every rank (harness.fixes.reach): dir and fix ids
        self.coverage: dict | None = None  # coverage recorded on every rank (harness.coverage.measure): its dir
        self.cls = adapter_class(sut)
        if mode == "virtual" and "virtual" not in self.cls.capabilities:
            raise ValueError(f"{sut} has no virtual ranks (capability 'virtual'); launch it as a pool")
        self._runners: dict[tuple[int, str, str], Runner] = {}
        self._retired_launches = 0
        self._losses = {"restart": 0, "failure": 0}  # ranks lost by a case's own restart op, or by a failure
        self._retired: list[Runner] = []  # closed runners, kept for the recovery figures
        self._keys_launched: set[tuple[int, str, str]] = set()
        self._retired_devices: set[str] = set()
        # keep_spare: a pool killed by a fault is replaced at once by one launched in the background, ready for the
        # next op that needs it (crash-point runs kill a pool per point, and a launch is most of a point's cost).
        self.keep_spare = False
        # keep_failed: after a failed op of a fault case, ranks that all failed the same way and pass a health check
        # stay for the next op (as between cases) instead of being replaced; the warm passes over crash points and
        # states set it, and every failure they find is replayed under the strict rule before it counts.
        self.keep_failed = False
        self._spares: dict[tuple[int, str, str], list[_Spare]] = {}
        # spare_lost (a campaign's runner set, harness.campaign.fuzz.fuzz): while exploring, a lost pool or virtual host
        # gets one spare started in the background at once. Off elsewhere: a long-lived judge shared by tests
        # would have spares starting while other tests run.
        self.spare_lost = False
        # fast_failures (a fuzzing judge): ranks that sit idle in an op after a peer raised are not waited on until
        # the backend's timeout; the fault-free case stops there (harness.judging.run, harness.judging.judge).
        self.fast_failures = False
        # Exploring (fuzzing, warm passes), a lost pool is replaced by ranks forked from a process that has the
        # framework imported, told by the first real launch what its ranks get (harness.ranks.forkserver); replays under
        # the strict rules and everything else launch for real. ``forks``: a fork server shared with other runner
        # sets (of other fixes), which its owner closes.
        self._owns_forks = forks is None
        self.forks = forks if forks is not None else ForkServer(sut) if mode in ("pool", "virtual") else None
        # fork_pools: every pool after the first real launch of its shape is forked, exploring or not (a test suite
        # replaying many findings on warm ranks; fresh launches are its nightly run).
        self.fork_pools = False

    def get(self, world: int, options: dict, launched: bool = False, fault_case: bool = False,
            shape: str = "") -> Runner:
        """A runner for ``world`` ranks; ``launched`` insists on real rank processes (a fault needs their pids).
        ``fault_case``: the op belongs to a case with a fault, which virtual ranks never play (the job its fault
        restarts and the state it leaves are those of real processes), or to one the virtual world cannot play
        (SutAdapter.virtual_plays). ``shape``: the adapter's process shape of
        the op (SutAdapter.process_shape), whose processes are kept apart from other shapes'."""
        setup = {"shims": options.get("shims", True), "device": self.device}
        if shape:
            setup["shape"] = shape
        if self.fixes:
            setup["fixes"] = list(self.fixes)
        if self.reach:
            setup[REACH_OPTION] = self.reach
        if self.coverage:
            setup[COVERAGE_OPTION] = self.coverage
        in_process = (not launched and self.mode == "in-process" and self.nnodes == 1
                      and (world == 1 or "in_process_world" in self.cls.capabilities))
        virtual = not launched and not fault_case and self.mode == "virtual"
        how = "in-process" if in_process else "virtual" if virtual else "ranks"
        key = (world, json.dumps(setup, sort_keys=True), how)
        runner = self._runners.get(key)
        if runner is None and self._spares.get(key) and (self.exploring or not self._spares[key][0].pool.fork):
            # (a spare forked while exploring is no launch for a replay under the strict rules)
            runner = self._spares[key].pop(0).take()
            if runner is not None:
                self._runners[key] = runner
                self._stock(key, runner)  # a warm pass that lost one pool tends to lose the next: have some ready
        if runner is None:
            nodes = self.nnodes if world % self.nnodes == 0 else 1  # a world too small to split runs on one node
            runner = (InProcessRunner(self.sut, world, setup) if in_process
                      else VirtualPool(self.sut, world, setup, forks=self.forks) if virtual
                      else RankPool(self.sut, world, setup, nnodes=nodes, forks=self.forks,
                                     fork=self.exploring or self.fork_pools))
            runner.replacement = key in self._keys_launched
            self._keys_launched.add(key)
            self._runners[key] = runner
        return runner

    @contextmanager
    def warm(self) -> Iterator[Runners]:
        """Crash points and states judged one after another: ``keep_spare`` and ``keep_failed`` on."""
        before = self.keep_spare, self.keep_failed
        self.keep_spare = self.keep_failed = True
        try:
            yield self
        finally:
            self.keep_spare, self.keep_failed = before
            if not self.keep_spare:  # the outermost pass is over: no idle spare outlives it
                self._close_spares()

    @property
    def exploring(self) -> bool:
        """Fuzzing or a warm pass: a pool may be forked (harness.ranks.forkserver) rather than launched."""
        return self.fast_failures or self.keep_failed

    @property
    def virtual(self) -> bool:
        """Its runners host ranks virtually (launch mode "virtual"): a campaign reduces and confirms its findings."""
        return self.mode == "virtual"

    @contextmanager
    def patched(self, fixes: tuple[str, ...]) -> Iterator[Runners]:
        """Cases run with these fixes instead (harness.fixes): a patched replay proving a failure known. The
        runners and spares started meanwhile are closed on the way out: no patched pool outlives it, and an
        in-process runner takes its patches back. In-process, the fixes this process carries and ``fixes`` lacks
        are lifted meanwhile (a replay on stock code), and put back after; its runners are set aside meanwhile, since
        a lift changes the code they run."""
        before, self.fixes = self.fixes, fixes
        parked: dict = {}
        if self.mode == "in-process":
            parked, self._runners = self._runners, {}
        kept, spared = set(self._runners), set(self._spares)
        lifted = [FIXES[f] for f in before if f not in fixes and FIXES[f].applied()] if self.mode == "in-process" \
            else []
        for fix in reversed(lifted):
            fix.revert()
        try:
            yield self
        finally:
            self.fixes = before
            for runner in [r for k, r in self._runners.items() if k not in kept]:
                self.discard(runner)
            self._close_spares([k for k in self._spares if k not in spared])
            for fix in lifted:
                fix.apply()
            self._runners.update(parked)

    def waiting(self) -> AbstractContextManager[Runners]:
        """Ranks stuck behind a raiser are waited on until the backend's own timeout (``fast_failures`` off)."""
        return self._off("fast_failures")

    def strict(self) -> AbstractContextManager[Runners]:
        """Inside a warm pass: a replay that must follow the judge's own rules (``keep_failed`` off)."""
        return self._off("keep_failed")

    @contextmanager
    def _off(self, flag: str) -> Iterator[Runners]:
        before = getattr(self, flag)
        setattr(self, flag, False)
        try:
            yield self
        finally:
            setattr(self, flag, before)

    def lose(self, runner: Runner, graceful: bool = True, restart: bool = False) -> None:
        """The job lost these ranks (a crash, a hang, a fault, ranks out of step; or ``restart``, the case's own
        restart op): fresh ones in their place, by the runner itself where it can (Runner.recover), else by
        discarding it (a spare is stocked)."""
        self._losses["restart" if restart else "failure"] += 1
        if not runner.recover():
            self.discard(runner, graceful)

    def discard(self, runner: Runner, graceful: bool = True) -> None:
        """Close ``runner`` and forget it; ``graceful=False`` kills its ranks at once (after a crash or a fault a
        surviving rank may sit in a collective or a commit wait and would only answer "stop" after a timeout)."""
        self._retired_devices |= runner.devices()
        runner.close(graceful)
        self._retired_launches += runner.launches
        self._retired.append(runner)
        keys = [k for k, r in self._runners.items() if r is runner]
        self._runners = {k: r for k, r in self._runners.items() if r is not runner}
        if keys and not graceful:
            self._stock(keys[0], runner)

    def _stock(self, key: tuple[int, str, str], like: Runner) -> None:
        """Keep pools like ``like`` launching or launched in the background for ``key``: in a warm pass SPARES real
        pools; else, in a campaign (``spare_lost``) while exploring, SPARES real pools or one virtual host, for the
        EXPLORING_SPARE_KEYS world sizes that lost one last (a known bug that exits a rank recurs case after case,
        a third of the cases at 16 virtual ranks, and ranks started meanwhile on another core take the relaunch out
        of the next case). A fault case loses real ranks twice or more (its fault's restart, a load that fails on
        one rank after it), and a forked pool's launch is mostly rendezvous waits, not CPU: one spare was still
        starting when the second loss came."""
        if self.mode == "fresh" or not isinstance(like, RankPool):
            return
        virtual = isinstance(like, VirtualPool)
        campaign = self.exploring and self.spare_lost
        wanted = SPARES if (self.keep_spare or campaign) and not virtual else 1 if campaign else 0
        if not wanted:
            return
        spares = self._spares.pop(key, [])
        if not self.keep_spare:
            self._evict_spares(keep=EXPLORING_SPARE_KEYS - 1)
        self._spares[key] = spares  # the world size stocked last is the last evicted
        while len(spares) < wanted:
            pool = (VirtualPool(like.sut, like.world, like.options, forks=self.forks) if virtual
                    else RankPool(like.sut, like.world, like.options, nnodes=like.nnodes, forks=self.forks,
                                  fork=self.exploring))
            pool.replacement = True
            spares.append(_Spare(pool))

    def _evict_spares(self, keep: int) -> None:
        """Close the spares of all but the ``keep`` world sizes stocked last (each holds a world's processes)."""
        keys = list(self._spares)
        self._close_spares(keys[:max(0, len(keys) - keep)])

    def after_case(self) -> None:
        if self.mode == "fresh":
            self.close()

    @property
    def launches(self) -> int:
        return self._retired_launches + sum(r.launches for r in self._runners.values())

    def recovery(self) -> dict[str, float]:
        """What lost ranks cost so far: launches, their seconds, the seconds of launches that replaced ranks lost
        to failures (relaunches and spares, in the background or not), those that a case's own restart asked for
        (fresh processes are what a restart means, not a recovery), and seconds spent on ranks that had failed. A
        replacement launch is not told apart by its cause (a spare stands ready for either), so the replacement
        seconds are shared out by the number of losses of each cause."""
        every = [*self._retired, *self._runners.values()]
        replaced = sum(r.recovery_launch_s for r in every)
        losses = sum(self._losses.values())
        restarts = replaced * self._losses["restart"] / losses if losses else 0.0
        return {"launches": self.launches,
                "launch_seconds": round(sum(sum(r.launch_seconds) for r in every), 1),
                "replacement_launch_seconds": round(replaced - restarts, 1),
                "restart_launch_seconds": round(restarts, 1),
                "restart_losses": self._losses["restart"], "failure_losses": self._losses["failure"],
                "failure_wait_seconds": round(sum(r.failure_wait_s for r in every), 1)}

    @property
    def devices(self) -> set[str]:
        """Where the ranks ran, as "device (backend)" strings (a GPU run shows cuda:N here)."""
        return self._retired_devices.union(*(r.devices() for r in self._runners.values()))

    def _close_spares(self, keys: list[tuple[int, str, str]] | None = None) -> None:
        """Close the spares of ``keys`` (all of them by default), keeping their launches for the recovery figures."""
        for key in list(self._spares) if keys is None else keys:
            for spare in self._spares.pop(key, []):
                self._retired_launches += spare.close()
                self._retired.append(spare.pool)

    def close(self) -> None:
        self._close_spares()
        for runner in list(self._runners.values()):
            self.discard(runner)
        if self.forks is not None and self._owns_forks:
            self.forks.close()


class _Spare:
    """A rank pool launching in a background thread (launching is mostly waiting for the ranks to start)."""

    def __init__(self, pool: RankPool) -> None:
        self.pool, self.error = pool, None
        self.thread = threading.Thread(target=self._launch, name="ckh-spare-pool", daemon=True)
        self.thread.start()

    def _launch(self) -> None:
        try:
            self.pool.ensure()
        except BaseException as exc:
            self.error = exc

    def take(self) -> RankPool | None:
        """The launched pool, or None if its launch failed (the caller then launches one the usual way)."""
        self.thread.join()
        if self.error is not None:
            self.pool.close(False)
            return None
        return self.pool

    def close(self) -> int:
        """Stop it (after its launch finished); returns its launches, for the count."""
        self.thread.join()
        self.pool.close(False)
        return self.pool.launches
