"""The warm rank pool: real ranks launched once and fed many cases over Unix sockets (fresh directory per case;
the adapter's ``end_case`` drops per-case state), relaunched after a crash or a hang. A fresh launch per case is
the same pool, closed after each case (``Runners(mode="fresh")``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import tempfile
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import psutil

from faults.procs import kill_trees
from harness.ranks.forkserver import ForkError, ForkServer, Template
from harness.ranks.launch import child_env, launch_commands, start, worker_argv
from harness.ranks.runner import PoolFailure, Runner
from harness.sut import adapter_class
from harness.sut.shm import SHM_VAR, release_shm

#: A traceback's header, or the markers under its source lines (its frames stay: they say where).
_TRACEBACK_LINE = re.compile(r"Traceback \(most recent call last\):|\^+$|~+\^*~*$")
#: A log line that names why a process failed (above a signal dump, which says only which signal).
_CAUSE = re.compile(r"what\(\):|terminate called|Assertion .*failed|Check failed|\w+(Error|Exception): ")


FORKABLE = ("paddle", "plain")  # launchers whose ranks the fork server can start (torchrun's need its agent's store)
MASTER_WAIT_S = 5.0  # a forked rank 0 that does not listen by then: the others start anyway
LOG_CHARS = 4000  # the ranks' log tails quoted in a failure message
IDLE_POLL_S = 0.1  # after a rank raised, how often the others' CPU time is read
IDLE_FOR_S = 0.4  # a rank whose processes used no CPU this long, after a peer raised, waits on that peer
STALL_POLL_S = 1.0  # with an idle limit, how often the silent ranks' CPU time is read


class _IdleWatch:
    """Which ranks sit blocked (no CPU time used by the rank's process tree for ``idle_for`` seconds): after a peer
    raised, such a rank waits in a collective the raiser will never join. The rank worker's own control thread
    blocks too, so "no CPU" means the op makes no progress; a rank reading a file or computing keeps its clock
    moving. Ranks sharing a process (virtual ranks) are read once per process."""

    def __init__(self, pids: dict[int, int], idle_for: float = IDLE_FOR_S) -> None:
        self.pids, self.idle_for = pids, idle_for
        self.seen: dict[int | None, tuple[float, float]] = {}  # pid -> (cpu seconds, when they last changed)
        self.read_at = time.monotonic()

    def due(self, every: float = STALL_POLL_S) -> bool:
        """Whether ``every`` seconds passed since the last read (a read walks the process table)."""
        return time.monotonic() - self.read_at >= every

    def all_idle(self, ranks) -> bool:
        now, idle = time.monotonic(), True
        self.read_at = now
        for pid in {self.pids.get(rank) for rank in ranks}:
            cpu = _tree_cpu(pid)
            last = self.seen.get(pid)
            if cpu is None or last is None or cpu != last[0]:
                self.seen[pid] = (cpu if cpu is not None else -1.0, now)
                idle = False
            elif now - last[1] < self.idle_for:
                idle = False
        return idle


def _tree_cpu(pid: int | None) -> float | None:
    """CPU seconds used so far by ``pid`` and its children (None: gone or unreadable)."""
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total
    except psutil.Error:
        return None


def _await_listening(proc, port: int, bound: float) -> None:
    """Until ``proc`` listens on ``port``, ends, or ``bound`` seconds pass (the others then start and retry as
    they would)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in psutil.Process(proc.pid).net_connections(kind="tcp")):
                return
        except psutil.Error:
            return
        time.sleep(0.01)


class RankPool(Runner):
    """A warm pool of ``world`` real ranks running ``sut``."""

    mode = "warm-pool"
    launched = True
    drifts = True

    def __init__(self, sut: str, world: int, options: dict, start_timeout: float = 120.0, nnodes: int = 1,
                 forks: ForkServer | None = None, fork: bool = False) -> None:
        """``forks``: the runner set's fork server, which a real launch of this pool teaches what its ranks get;
        ``fork``: start the ranks from it where it knows this shape (harness.ranks.forkserver), else launch them."""
        super().__init__()
        self.sut, self.world, self.options, self.nnodes = sut, world, options, nnodes
        self.start_timeout = start_timeout
        self.cls = adapter_class(sut)
        self.launcher = self.cls.launcher
        self.forks = forks if nnodes == 1 and self.launcher in FORKABLE else None
        self.fork = fork
        self.forked = False  # this launch's ranks came from the fork server
        self.rank_envs: dict[int, dict[str, str]] = {}
        self.procs: list = []
        self.conns: dict[int, Connection] = {}
        self._dir: Path | None = None
        #: Where each log begins for the ranks now running (a virtual host's fresh world writes on in its files)
        self.log_starts: dict[Path, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return bool(self.conns) and all(p.poll() is None for p in self.procs)

    def ensure(self) -> None:
        if not self.alive:
            self.close()
            self._launch()

    def _launch(self) -> None:
        """Start the ranks and wait until each has set the SUT up. Whatever keeps them from starting — a rank that
        cannot import or set up the adapter, dies, or is late, a launcher that fails, no GPUs for a ``gpu`` run —
        is a PoolFailure of kind "setup" saying why, with the tail of the ranks' logs (the CLI's exit 2)."""
        self._dir = Path(tempfile.mkdtemp(prefix="ckh-pool-"))  # short path: Unix socket names are limited
        self.launches += 1
        began = time.monotonic()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control = str(self._dir / "ctl")
            listener.bind(control)
            listener.listen(self.world)
            base = self._start(control)
            self._gather(listener, time.monotonic() + self.start_timeout)
            if self.forks is not None and not self.forked:
                self.forks.learn(self.world, Template(base, self.rank_envs, str(self._dir)), start=self.fork)
        except PoolFailure as failure:
            self.close()
            if not self.forked or self.forks is None:
                raise
            self.forks.disable(f"forked ranks did not set up: {failure}")  # e.g. a device the fork cannot use
            self._launch()
        except Exception as exc:
            failure = PoolFailure("setup", f"{type(exc).__name__}: {exc}; logs: {self._logs()}")
            self.close()
            raise failure from exc
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
            self.launch_seconds.append(time.monotonic() - began)

    def _start(self, control: str) -> dict[str, str]:
        """Start the launcher(s) or rank processes, each logging to its own file (or fork the ranks); returns the
        environment the launcher got, before its own additions."""
        base = self._base_env()
        assert self._dir is not None
        log_dir = self._dir / "logs"
        self.forked = False
        if self.fork and self.forks is not None and self.forks.usable(self.world):
            try:
                self._fork(control, base, log_dir)
                self.forked = True
                return base
            except ForkError:
                kill_trees(self.procs)
                self.procs = []
        gpus = self.cls.launch_gpus(self.world // self.nnodes, self.options.get("device", "auto"))
        commands = launch_commands(
            self.launcher, self.world, control, self.sut, json.dumps(self.options), log_dir, gpus, self.nnodes
        )
        for n, (cmd, env) in enumerate(commands):
            env = {**env, SHM_VAR: base[SHM_VAR], "TMPDIR": base["TMPDIR"]}
            self.procs.append(start(cmd, env, log_dir / f"launch-{n}.log"))
        return base

    def _base_env(self) -> dict[str, str]:
        """Make the pool's log and scratch directories; the environment its processes start from."""
        assert self._dir is not None
        (self._dir / "logs").mkdir()
        # The launchers' and ranks' temp files (torch elastic's, multiprocessing's) go with the pool even when its
        # tree is killed before it could clean up; a short name, as sockets are made there.
        scratch = self._dir / "t"
        scratch.mkdir()
        return child_env({SHM_VAR: str(self._dir / "shm"), "TMPDIR": str(scratch)})

    def _fork(self, control: str, base: dict[str, str], log_dir: Path) -> None:
        assert self.forks is not None and self._dir is not None
        argv = worker_argv(control, self.sut, json.dumps(self.options))
        envs, files = self.forks.templates[self.world].for_pool(str(self._dir))
        for path, text in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
        master = envs.get(0, {}).get(self.cls.master_env or "", "")
        for rank, env in sorted(envs.items()):
            self.procs.append(self.forks.spawn(argv, {**base, **env}, log_dir / f"workerlog.{rank}",
                                               fixes=self.options.get("fixes", ())))
            if rank == 0 and master and len(envs) > 1:
                _await_listening(self.procs[0], int(master.rsplit(":", 1)[1]), MASTER_WAIT_S)

    def _gather(self, listener: socket.socket, deadline: float) -> None:
        """Accept every rank and read its hello as it comes, so a rank that reports a failed set-up is heard at once
        (not after its peers connect or the start timeout passes)."""
        waiting: list[Connection] = []
        try:
            while True:
                self._read(waiting, 0)
                if len(self.conns) == self.world:
                    return
                if time.monotonic() > deadline:
                    raise PoolFailure("setup", f"{len(self.conns)} of {self.world} ranks set up within "
                                      f"{self.start_timeout:.0f} s; logs: {self._logs()}")
                # no launcher outlives its ranks
                direct = self.forked or self.launcher in ("plain", "torchrun", "virtual")
                if direct and any(p.poll() is not None for p in self.procs):
                    while self._accept(listener, waiting, 0.0):  # an exited rank may have said why: hear it first
                        pass
                    self._read(waiting, 0.2)
                    raise PoolFailure("setup", f"a rank exited during start-up; logs: {self._logs()}")
                if len(self.conns) + len(waiting) == self.world:
                    self._read(waiting, 1.0)  # every rank connected: wait for their hellos
                else:
                    self._accept(listener, waiting, 1.0)
        finally:
            for conn in waiting:
                conn.close()

    @staticmethod
    def _accept(listener: socket.socket, waiting: list[Connection], timeout: float) -> bool:
        """Accept one rank's connection within ``timeout`` seconds (0: only one already queued)."""
        listener.settimeout(timeout)  # 0.0: non-blocking
        try:
            sock, _ = listener.accept()
        except (TimeoutError, BlockingIOError):
            return False
        sock.setblocking(True)
        waiting.append(Connection(sock.detach()))
        return True

    def _read(self, waiting: list[Connection], timeout: float) -> None:
        """Read the first message of every connection that has one within ``timeout`` seconds."""
        for conn in wait(waiting, timeout=timeout):
            waiting.remove(conn)
            self._hello(conn)

    def _hello(self, conn: Connection) -> None:
        """Register the rank that sent its first message on ``conn``, or raise the start-up failure it reports."""
        try:
            hello = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise PoolFailure("setup", f"a rank died during start-up; logs: {self._logs()}") from None
        if hello.get("type") != "hello":
            conn.close()
            raise PoolFailure("setup", f"rank {hello.get('rank')} could not set up the SUT adapter: "
                              f"{hello.get('error')}; logs: {self._logs()}")
        self.conns[hello["rank"]] = conn
        self.pids[hello["rank"]] = hello["pid"]
        self.shims = hello["shims"]
        self.info[hello["rank"]] = hello.get("info", {})
        self.rank_envs[hello["rank"]] = hello.get("env", {})

    def _logs(self) -> str:
        """The last lines of every non-empty rank and launcher log, in one line (a failure message quotes it), each
        with the last line before them that names an error (a C++ abort prints its cause above the signal dump);
        Paddle's dumps of the environment (``envlog.N``, ``backup_env.N.json``) say nothing about a failure."""
        if self._dir is None:
            return "-"
        tails = []
        for log in sorted((self._dir / "logs").rglob("*")):
            wanted = log.is_file() and not log.name.startswith(("envlog.", "backup_env."))
            text = log.read_bytes()[self.log_starts.get(log, 0):].decode(errors="replace").split("\n") if wanted \
                else []
            # A traceback's header says nothing in one line (and a log read while its rank still writes may end
            # in it): the frames and the error line are what is kept.
            lines = [line.strip()[-300:] for line in text if line.strip() and not _TRACEBACK_LINE.match(line.strip())]
            cause = next((line for line in reversed(lines[:-3]) if _CAUSE.search(line)), None)
            shown = ([cause] if cause else []) + lines[-3:]
            if shown:
                tails.append((cause is None and not any(_CAUSE.search(line) for line in shown),
                              f"{log.name}: {' / '.join(shown)}"))
        # Logs that name a cause first, then whole tails while they fit: a cut never drops the line that says why
        # (a plain cut to the last characters would lose a rank's abort message behind longer logs).
        kept: list[str] = []
        for _, tail in sorted(tails, key=lambda t: t[0]):
            if kept and sum(len(k) + 2 for k in kept) + len(tail) > LOG_CHARS:
                break
            kept.append(tail)
        return "; ".join(kept) or "-"

    def close(self, graceful: bool = True) -> None:
        for conn in self.conns.values() if graceful else ():  # a rank told to stop lets its held writers go
            with contextlib.suppress(OSError):
                conn.send({"type": "stop"})
        deadline = time.monotonic() + 5
        for proc in self.procs if graceful else ():  # not graceful: killed at once (after a fault or a crash)
            with contextlib.suppress(Exception):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        kill_trees(self.procs)
        for conn in self.conns.values():
            conn.close()
        self.procs, self.conns, self.pids, self.log_starts = [], {}, {}, {}
        if self._dir is not None:
            release_shm(self._dir / "shm")
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- cases ----------------------------------------------------------------------------------------------

    def _broadcast(self, msg: dict, timeout: float, what: str, fail_fast: bool = True,
                   stuck_after: float | None = None, idle_limit: float | None = None) -> list[dict]:
        """Send ``msg`` to every rank and collect one reply each. A rank that dies raises "crash" at once
        (``fail_fast``) or once the survivors have answered or ``timeout`` passed (a fault run judges whether the
        survivors turn the death into an error in time); a rank that stays silent raises "hang", unless it is
        still busy ``stuck_after`` seconds after another rank raised (Runner.op); or one whose processes used no CPU
        for ``idle_limit`` seconds raises "hang" before ``timeout``."""
        # What Connection.send pickles, pickled once for all ranks: a 256-rank case's begin carries the whole case.
        data = ForkingPickler.dumps(msg)
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.send_bytes(data)
        replies: dict[int, dict] = {}
        dead: set[int] = set()
        waiting = {conn: rank for rank, conn in self.conns.items()}
        start = time.monotonic()
        deadline = start + timeout
        raised: int | None = None  # the first rank that answered with an error (stuck_after counts from it)
        raised_at = start
        idle = _IdleWatch(self.pids)
        stalled = _IdleWatch(self.pids, idle_limit) if idle_limit is not None else None
        bound = f" within {timeout:.0f} s"
        while waiting and time.monotonic() < deadline and not (dead and fail_fast):
            poll = deadline - time.monotonic() if raised is None else min(deadline - time.monotonic(), IDLE_POLL_S)
            if stalled is not None:
                poll = min(poll, STALL_POLL_S)
            for conn in wait(list(waiting), timeout=max(0.0, poll)):
                rank = waiting.pop(conn)
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    dead.add(rank)
                    continue
                if raised is None and not replies[rank].get("ok", True):
                    raised, raised_at = rank, time.monotonic()
                    if stuck_after is not None:
                        deadline = min(deadline, raised_at + stuck_after)
            if stuck_after is not None and raised is not None and waiting and idle.all_idle(waiting.values()):
                break  # every rank still busy has used no CPU for a while: each waits on a peer that raised
            if stalled is not None and waiting and stalled.due() and stalled.all_idle(waiting.values()):
                bound = f"; its process used no CPU for {idle_limit:.0f} s"
                break  # no rank still busy has used CPU for idle_limit: each waits on what will not come
        if stuck_after is not None and raised is not None and waiting and not dead:
            waited = time.monotonic() - start
            for rank in waiting.values():
                replies[rank] = {"rank": rank, "ok": False, "error_type": "Stuck", "loaded": {}, "seconds": waited,
                                 "stuck": True,
                                 "error": f"still waiting {waited:.1f} s into the op, after rank {raised} raised"}
            waiting.clear()
        answered = [replies[r] for r in sorted(replies)]
        silent = tuple(sorted(waiting.values()))
        if (raised is not None and len(answered) > 1) or silent:  # the op's time spent on ranks that had failed
            self.failure_wait_s += time.monotonic() - (raised_at if raised is not None else start)
        if dead:
            raise PoolFailure("crash", f"rank {min(dead)} died during {what}"
                              + (f" (ranks {list(silent)} still busy)" if silent else "") + f"; logs: {self._logs()}",
                              answered, tuple(sorted(dead)), silent)
        if silent:
            raise PoolFailure("hang", f"rank {silent[0]} did not finish {what}{bound}", answered,
                              (), silent)
        return answered

    def begin(self, case_json: dict, root: str) -> None:
        self.ensure()
        self._broadcast({"type": "begin", "case": case_json, "root": root}, 60, "case set-up")

    def op(self, index: int, timeout: float, fail_fast: bool = True, stuck_after: float | None = None,
           idle_limit: float | None = None) -> list[dict]:
        """``idle_limit``: ranks whose processes used no CPU for that long hang before ``timeout``."""
        return self._broadcast({"type": "op", "index": index, "stuck_after": stuck_after}, timeout, f"op {index}",
                               fail_fast, stuck_after, idle_limit)

    def end(self) -> None:
        if self.alive:
            self._broadcast({"type": "end"}, 60, "case tear-down")

    def healthy(self, timeout: float = 15.0) -> bool:
        """Every rank answers, and the SUT's own collective check passes, within ``timeout``."""
        try:
            return all(r.get("ok") for r in self._broadcast({"type": "health"}, timeout, "health check"))
        except PoolFailure:
            return False
