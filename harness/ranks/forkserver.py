"""Ranks forked from a process that has already imported the framework: a relaunch in a fraction of a second.

A Paddle pool costs about five CPU seconds to launch on a small machine (the launcher and every rank import
Paddle), and a fuzzing campaign or a warm pass over crash states loses a pool each time one rank raises while
another waits on it. The fork server imports the SUT adapter's framework once (``SutAdapter.preload``: imports
only, no device, no process group) and forks fresh rank processes on request; each child sets up the SUT from
scratch (its process group included), exactly as a launched rank does. Ranks whose set-up applies fixes
(``harness.fixes``) are forked from a child of the server that applied that set of fixes once (a zygote): applying
thirty fixes rebuilds their functions from source, seconds of CPU that every rank would pay again; applying them
is idempotent, so the rank's own set-up finds them in force. Only fixes of modules the preload imported are applied
there: importing a module may read the environment, and the server's is not a rank's (PaddleFormers' fixes).

What each rank gets from the framework's launcher is learned from a real launch of the same shape (``Template``):
its environment, with every loopback port and the pool's directory replaced by those of the new pool. So a forked
rank sees what a launched one sees; what differs is only that no launcher process watches it. Fault-free cases do
not depend on that (a pool whose rank died is dropped whole); P-LIVENESS, which judges what survivors of a dead
peer do, may (a launcher can end them itself): its replay on real ranks is the reference. The first pool of every
runner set is a real launch, and so is every pool of a replay that must follow the judge's strict rules
(``harness.ranks.runners``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing import Pipe
from multiprocessing.connection import Client, Connection
from pathlib import Path

import psutil

if __package__ in (None, ""):  # started as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from faults.procs import TREE_VAR, kill_tree, popen
from harness.ranks.launch import REPO_ROOT, child_env, free_port

#: The modules a forked process runs (``main(argv)``), named rather than imported: the fork server starts them as
#: a launcher starts ``python -m``, and imports them once before forking so every child finds them loaded.
WORKER_MAIN = "harness.ranks.worker"
ENTRY_POINTS = (WORKER_MAIN, "harness.ranks.virtual_host")

START_TIMEOUT_S = 120.0
#: Fix sets with a zygote of their own at once (a campaign uses one, a patched replay or a round that leaves fixes
#: out a few more); the set used least recently gives way.
ZYGOTES = 4
_ENDPOINT = re.compile(r"\b(127\.0\.0\.1|localhost):(\d+)\b")


class ForkError(RuntimeError):
    """The fork server is gone or refused: the caller launches the pool the usual way."""


class Template:
    """What a framework launcher gave each rank of a real launch, beyond the environment the launcher itself got,
    and the files it wrote for them that their environment names (Paddle's ``PADDLE_BACKUP_ENV_PATH``): rewritten
    per pool (fresh loopback ports, the new pool's directory)."""

    def __init__(self, launcher_env: dict[str, str], rank_envs: dict[int, dict[str, str]], pool_dir: str) -> None:
        self.pool_dir = pool_dir
        self.ranks = {r: {k: v for k, v in env.items() if launcher_env.get(k) != v and k != TREE_VAR}
                      for r, env in rank_envs.items()}
        # Keys every rank got alike, with no endpoint or path of the pool in them: the fork server's own environment
        # (read when the framework is imported, e.g. OMP_NUM_THREADS).
        common = set.intersection(*(set(e.items()) for e in self.ranks.values())) if self.ranks else set()
        self.common = {k: v for k, v in common if not _ENDPOINT.search(v) and pool_dir not in v}
        self.files = {v: Path(v).read_text(encoding="utf-8", errors="replace")
                      for env in self.ranks.values() for v in env.values()
                      if v.startswith(pool_dir + os.sep) and Path(v).is_file() and Path(v).stat().st_size < 2**20}

    def for_pool(self, pool_dir: str) -> tuple[dict[int, dict[str, str]], dict[str, str]]:
        """Each rank's launcher-given environment for a new pool in ``pool_dir``, and the files to write for it
        (path -> text): every port the real launch used maps to a fresh one, the same in every rank and file."""
        ports: dict[str, str] = {}

        def port(match: re.Match) -> str:
            if match.group(2) not in ports:
                ports[match.group(2)] = str(free_port())
            return f"{match.group(1)}:{ports[match.group(2)]}"

        def rewrite(text: str) -> str:
            return _ENDPOINT.sub(port, text).replace(self.pool_dir, pool_dir)

        envs = {r: {k: rewrite(v) for k, v in env.items()} for r, env in self.ranks.items()}
        return envs, {rewrite(path): rewrite(text) for path, text in self.files.items()}


class ForkedRank:
    """A rank forked by the server, seen like a ``subprocess.Popen`` (what ``faults.procs.kill_tree`` and the pool
    use). The server reaps it; its exit status is not known here, only that it ended (-SIGKILL stands in)."""

    def __init__(self, pid: int, token: str) -> None:
        self.pid, self.tree_token = pid, token
        self.returncode: int | None = None
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._proc, self.returncode = None, -signal.SIGKILL

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                gone = self._proc is None or not self._proc.is_running() or \
                    self._proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.poll() is None:
                os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """Controller side: one server process per runner set, started in the background on first need."""

    def __init__(self, sut: str, zygotes: bool = True) -> None:
        """``zygotes``: fork the ranks of a fix set from a zygote that applied it (off: each rank applies its own,
        as a benchmark compares)."""
        self.sut, self.zygotes = sut, zygotes
        self.templates: dict[int, Template] = {}  # world size -> what its ranks got from a real launch
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error: str | None = None

    def learn(self, world: int, template: Template, start: bool) -> None:
        """A real launch of ``world`` ranks told what its ranks got; ``start``: start the server now (in the
        background) if it is not running."""
        self.templates.setdefault(world, template)
        if start:
            self.start()

    def start(self) -> None:
        with self._lock:
            if self._proc is not None or self._error is not None:
                return
            self._ready.clear()
            common = next(iter(self.templates.values())).common if self.templates else {}
            self._dir = Path(os.environ.get("TMPDIR") or "/tmp") / f"ckh-fork-{uuid.uuid4().hex[:8]}"
            self._dir.mkdir(parents=True)
            address = str(self._dir / "ctl")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(address)
            listener.listen(1)
            log = open(self._dir / "server.log", "ab")  # noqa: SIM115 -- the server's stdout, closed with it
            self._proc = popen([sys.executable, "-m", "harness.ranks.forkserver", "--sut", self.sut,
                                "--control", address, *([] if self.zygotes else ["--no-zygotes"])],
                               env=child_env(common), cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT)
            log.close()
        threading.Thread(target=self._accept, args=(listener,), name="ckh-fork-server", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        try:
            listener.settimeout(START_TIMEOUT_S)
            sock, _ = listener.accept()
            sock.setblocking(True)
            conn = Connection(sock.detach())
            hello = conn.recv()
            if hello.get("type") != "ready":
                raise ForkError(str(hello.get("error")))
            self._conn = conn
        except Exception as exc:  # no server: every pool is launched the usual way
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            listener.close()
            self._ready.set()

    def usable(self, world: int) -> bool:
        """A real launch of ``world`` ranks was seen, and the server has not failed."""
        return world in self.templates and self._error is None

    def disable(self, why: str) -> None:
        """Forked ranks failed where launched ones set up: launch every later pool for real."""
        self._error = why

    def ready(self) -> bool:
        """The server is up and has not failed (never waits: a caller launches the usual way meanwhile)."""
        return self._ready.is_set() and self._conn is not None and self._error is None

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, main: str = WORKER_MAIN,
              fixes: tuple[str, ...] | list[str] = ()) -> ForkedRank:
        """Fork one process running module ``main``'s ``main(argv)`` (a rank worker, or a host of virtual ranks) in
        ``env``, its output appended to ``log``; ``fixes``: those its set-up applies, applied before the fork."""
        self.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._conn is None:
            raise ForkError(f"the fork server did not start: {self._error}")
        token = uuid.uuid4().hex
        with self._lock:
            try:
                self._conn.send({"argv": argv, "env": {**env, TREE_VAR: token}, "log": str(log), "main": main,
                                 "fixes": sorted(fixes)})
                reply = self._conn.recv()
            except (OSError, EOFError) as exc:
                self._error = f"{type(exc).__name__}: {exc}"
                raise ForkError(f"the fork server is gone: {self._error}") from None
        if "pid" not in reply:
            raise ForkError(str(reply.get("error")))
        return ForkedRank(int(reply["pid"]), token)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        if self._proc is not None:
            kill_tree(self._proc)  # its forks carry their own tokens: the pools kill those
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._proc = self._conn = self._dir = None


# -- the server process ----------------------------------------------------------------------------------------


def _child(inherited: list[Connection], request: dict) -> None:
    """In the forked child: become a rank process of its own and run the rank worker; never returns.
    ``inherited``: the server's and zygotes' connections, closed here (a zygote ends when its pipe closes)."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the SUT reaps its own children (async writers)
        for conn in inherited:
            conn.close()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the new pool's
        os.chdir(REPO_ROOT)

        main = request.get("main", WORKER_MAIN)
        sys.argv = [main, *request["argv"]]
        module = importlib.import_module(main)
        sys.modules["__main__"] = module  # what a process the SUT spawns imports again, as from a launched rank
        code = module.main(request["argv"])
    except BaseException:  # the rank's log says why; the controller sees it exit
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code or 0)


def _freeze() -> None:
    gc.collect()
    gc.freeze()  # what was imported is never collected in a fork: its pages stay shared, and no rank walks them


def _fork_rank(inherited: list[Connection], request: dict) -> dict:
    """Fork the rank ``request`` asks for; the reply for the controller."""
    try:
        pid = os.fork()
    except OSError as exc:
        return {"error": f"fork failed: {exc}"}
    if pid == 0:
        _child(inherited, request)
    return {"pid": pid}


class _Zygotes:
    """The server's children that applied a set of fixes, by set, each forking the ranks of its set."""

    def __init__(self, control: Connection, enabled: bool) -> None:
        self.control, self.enabled = control, enabled
        self.pipes: dict[tuple[str, ...], Connection] = {}  # least recently used first
        self.failed: set[tuple[str, ...]] = set()  # sets whose zygote failed: their ranks apply them themselves

    def inherited(self) -> list[Connection]:
        return [self.control, *self.pipes.values()]

    def fork_rank(self, request: dict) -> dict:
        fixes = tuple(request.get("fixes", ()))
        zygote = self.enabled and fixes and fixes not in self.failed
        pipe = (self.pipes.pop(fixes, None) or self._start(fixes)) if zygote else None
        if not isinstance(pipe, Connection):
            if isinstance(pipe, dict):  # the rank's own set-up applies them again: its log says what failed
                self.failed.add(fixes)
            return _fork_rank(self.inherited(), request)
        try:
            pipe.send(request)
            reply = pipe.recv()
        except (OSError, EOFError) as exc:
            pipe.close()
            return {"error": f"the zygote of {len(fixes)} fixes is gone: {type(exc).__name__}: {exc}"}
        self.pipes[fixes] = pipe
        return reply

    def _start(self, fixes: tuple[str, ...]) -> Connection | dict:
        while len(self.pipes) >= ZYGOTES:
            self.pipes.pop(next(iter(self.pipes))).close()  # its zygote sees EOF and ends
        ours, theirs = Pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            return {"error": f"fork failed: {exc}"}
        if pid == 0:
            inherited = self.inherited()
            for conn in (*inherited, ours):
                conn.close()
            os._exit(_zygote(theirs, fixes))
        theirs.close()
        hello = ours.recv() if ours.poll(START_TIMEOUT_S) else {"error": "the zygote did not answer"}
        if "error" in hello:
            ours.close()
            return hello
        return ours


def _zygote(pipe: Connection, fixes: tuple[str, ...]) -> int:
    """A child of the server with ``fixes`` applied: forks the ranks of that set until the server closes its pipe."""
    try:  # the first step of the worker's own set-up, whose module the server imported by name
        registry = sys.modules["harness.fixes"]  # imported with it
        if not registry.imports_nothing(fixes):  # a module's import-time code would read the server's environment
            pipe.send({"error": "the fixes patch modules the framework's preload does not import"})
            return 0
        importlib.import_module(WORKER_MAIN).prepare({"fixes": list(fixes)})
    except Exception as exc:  # the rank's own set-up would fail the same way: let it, with its log saying why
        pipe.send({"error": f"fixes not applied before the fork: {type(exc).__name__}: {exc}"})
        return 1
    _freeze()
    pipe.send({"type": "ready"})
    while True:
        try:
            request = pipe.recv()
        except (EOFError, OSError):
            return 0
        pipe.send(_fork_rank([pipe], request))


def serve(sut: str, control: str, zygotes: bool = True) -> int:
    conn = Client(control, family="AF_UNIX")
    try:
        # Where the ranks record coverage, the server records what importing the framework runs (its ranks never
        # import it again), and its forks go on recording, each into a file of its own (the worker's recorder,
        # named, as the zygotes apply fixes).
        measure = importlib.import_module(WORKER_MAIN).measure
        measure.start_carried()
        for entry in ENTRY_POINTS:  # what every rank or host imports, paid for once
            importlib.import_module(entry)
        from harness.sut import adapter_class

        adapter_class(sut).preload()
        measure.case_ends()
    except Exception as exc:
        conn.send({"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forked ranks and zygotes are reaped as they end
    conn.send({"type": "ready"})
    forks = _Zygotes(conn, zygotes)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return 0  # the controller went away (its zygotes see their pipes close)
        conn.send(forks.fork_rank(request))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sut", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--no-zygotes", action="store_true")
    args = parser.parse_args(argv)
    return serve(args.sut, args.control, not args.no_zygotes)


if __name__ == "__main__":
    sys.exit(main())


