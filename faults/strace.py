"""Record and fault-inject file-IO syscalls of a process tree with strace (docs/design.md §6, §9).

This module knows processes, syscalls and paths; it knows nothing about checkpoint formats.

Facts measured here (strace 6.1, Debian, x86_64, Python 3.11):

* ``when=k`` under ``-f`` counts **per process**, not across the tree: every traced process has its own
  counter per syscall, and a child starts at zero (it does not inherit the parent's count). With
  ``inject=write:signal=KILL:when=2`` a parent that spawns two children loses *each* child at that child's 2nd
  write and is itself killed at its own 2nd write. So ``when=k`` means "the k-th call in whichever process
  gets there first", and every other process that reaches its own k-th call is hit too.
* ``-P path`` narrows the counting, not just the printing: with ``-P /d/f1 -e inject=write:...:when=1`` the
  first write *to /d/f1* is hit. ``-P`` is an exact match against the path argument as written (a relative
  ``"f1"`` is not matched by ``-P /d/f1``) or against the path behind an fd argument. So crash points carry the
  exact path and a k counted per process over calls touching that path; that also keeps a parent that merely
  writes to stdout from being hit. Substring filters exist only for :func:`record`.
* ``signal=KILL`` injection is silently dropped under ``--seccomp-bpf`` (the call runs, nobody dies), while
  ``error=ENOSPC`` works under it. So :func:`inject_kill` runs without ``--seccomp-bpf`` (slower: every syscall
  stops) and :func:`record` / :func:`inject_error` use it.
* The kill is delivered at syscall entry: the killed call does not take effect (a killed ``write`` leaves
  nothing; a killed ``rename`` leaves the old name).
* Cost of a tiny Python writer (13 IO calls): untraced ≈ 0.08 s, ``record`` ≈ 0.12 s, one ``inject_kill`` ≈
  0.14 s (see tests/test_faults_crashpoints.py, which prints them).
"""

from __future__ import annotations

import codecs
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from .procs import kill_tree, popen

DEFAULT_SYSCALLS: tuple[str, ...] = (
    "openat", "write", "pwrite64", "rename", "renameat", "renameat2", "fsync", "fdatasync", "unlink", "unlinkat",
    "ftruncate", "mkdir",
)
#: What a crash-state model needs on top of :data:`DEFAULT_SYSCALLS`: every way bytes or names change on disk.
STATE_SYSCALLS: tuple[str, ...] = (
    *DEFAULT_SYSCALLS, "creat", "open", "writev", "pwritev", "pwritev2", "lseek", "truncate", "rmdir", "link",
    "linkat", "symlink", "symlinkat", "chdir", "fchdir", "mkdirat",
    "sync", "syncfs", "sync_file_range", "close", "dup", "dup2", "dup3", "fcntl",
    "clone", "clone3", "fork", "vfork",  # which fd table a thread or child process uses
)
ERRNO_NAMES = ("ENOSPC", "EIO", "EDQUOT")
#: ``-s`` for data capture: strace prints written buffers up to this many bytes (longer ones end in ``...``).
CAPTURE_LIMIT = 1 << 26

# Syscalls whose first argument is an fd (-y prints its path); the rest name paths as quoted strings.
_FD_CALLS = frozenset({
    "write", "pwrite64", "writev", "pwritev", "pwritev2", "fsync", "fdatasync", "ftruncate", "read", "pread64", "close",
    "lseek", "dup", "dup2", "dup3", "fcntl", "syncfs", "sync_file_range",
})
_TAIL = 4000

_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(.*)$", re.S)
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$", re.S)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD_PATH = re.compile(r"^-?\d+<(.*?)>(?:, |$)", re.S)


@dataclass(frozen=True)
class Syscall:
    """One completed (or killed) syscall; ``paths`` are the strings strace's ``-P`` would match."""

    pid: int
    name: str
    path: str | None
    args_summary: str
    result: str
    paths: tuple[str, ...] = ()
    #: The full argument text as strace printed it (written data included when recorded with ``capture_data``).
    args: str = field(default="", repr=False, compare=False)

    @property
    def killed(self) -> bool:
        return self.result.strip() == "?"


@dataclass
class Recording:
    """A traced run: ``calls`` pass the path filter, ``all_calls`` is everything (needed to count ``when=k``)."""

    cmd: list[str]
    returncode: int | None
    calls: list[Syscall]
    all_calls: list[Syscall]
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    duration_s: float
    #: The file-system ops under a root parsed from ``all_calls`` (faults.crashstates.fs_ops), by root: the crash
    #: states and the persistence-order check of one recording read the same ones.
    fs_ops_by_root: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    #: Thread id -> the process it belongs to, for the threads of processes already running when the recording
    #: started (an attach); threads started later are known from their clone calls.
    processes: dict[int, int] = field(default_factory=dict, compare=False)


@dataclass
class InjectionResult:
    """Outcome of one injected run; ``injected_call`` is the call strace tampered with (first one seen)."""

    cmd: list[str]
    returncode: int | None
    killed: bool
    killed_pid: int | None
    injected: bool
    injected_call: Syscall | None
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    duration_s: float
    killed_pids: list[int] = field(default_factory=list)


def available() -> bool:
    """True when strace is on PATH and ptrace is permitted (containers often forbid it)."""
    exe = shutil.which("strace")
    if exe is None:
        return False
    try:
        proc = subprocess.run([exe, "-f", "-qq", "-e", "trace=none", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _unescape(s: str) -> str:
    try:
        return codecs.escape_decode(s.encode("utf-8", "surrogateescape"))[0].decode("utf-8", "surrogateescape")
    except ValueError:
        return s


def _paths_of(name: str, args: str) -> tuple[str, ...]:
    if name in _FD_CALLS:
        m = _FD_PATH.match(args)
        return (_unescape(m.group(1)),) if m else ()
    quoted = [_unescape(q) for q in _QUOTED.findall(args)]
    if name.startswith("rename"):
        return tuple(quoted[:2])
    return tuple(quoted[:1])


def parse_trace(text: str) -> tuple[list[Syscall], list[int]]:
    """Parse ``strace -f -o`` output into ordered calls and the pids reported ``killed by SIGKILL``.

    Interleaved ``<unfinished ...>`` / ``<... X resumed>`` halves are joined per pid; the call is placed where it
    completes (its effect is visible from then on).
    """
    calls: list[Syscall] = []
    killed: list[int] = []
    pending: dict[int, str] = {}
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        pid, rest = int(m.group(1)), m.group(2)
        if rest.startswith("+++"):
            if "killed by SIGKILL" in rest:
                killed.append(pid)
            continue
        if rest.startswith("---"):
            continue
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        r = _RESUMED.match(rest)
        if r:
            rest = pending.pop(pid, r.group(1) + "(") + r.group(2)
        c = _CALL.match(rest)
        if not c:
            continue
        name, args, result = c.group(1), c.group(2), c.group(3).strip()
        paths = _paths_of(name, args)
        calls.append(Syscall(pid, name, paths[0] if paths else None, args[:160], result, paths, args))
    return calls, killed


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return data[-_TAIL:].decode("utf-8", "replace")


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def _run(argv: list[str], timeout: float, env: Mapping[str, str] | None, cwd: str | None,
         tmp: str) -> tuple[int | None, str, str, bool, float]:
    out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    t0 = time.monotonic()
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        timed_out = False
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
        kill_tree(proc)  # also reaps stragglers after a normal exit
    return rc, _tail(out), _tail(err), timed_out, time.monotonic() - t0


def _threads(pids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Thread id -> (the pid of ``pids`` whose tree it is in, the process it belongs to), for every thread of those
    processes and their descendants."""
    out: dict[int, tuple[int, int]] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                out.update({t.id: (pid, proc.pid) for t in proc.threads()})
            except psutil.Error:
                continue
            out[proc.pid] = (pid, proc.pid)
    return out


def _processes(pids: Sequence[int]) -> list[int]:
    """``pids`` and every process below them."""
    out = set(pids)
    for pid in pids:
        try:
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return sorted(out)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _check_syscall(name: str) -> str:
    if not re.fullmatch(r"\w+", name):
        raise ValueError(f"bad syscall name {name!r}")
    return name


def _trace_options(syscalls: Sequence[str], capture_data: bool) -> list[str]:
    names = ",".join(_check_syscall(s) for s in (*syscalls, *(STATE_SYSCALLS if capture_data else ())))
    names = ",".join(dict.fromkeys(names.split(",")))
    return ["-y", "-e", f"trace={names}", *(["-s", str(CAPTURE_LIMIT), "-xx"] if capture_data else [])]


def _recording(cmd: Sequence[str], all_calls: list[Syscall], path_filter: str | None, rc: int | None, so: str,
               se: str, to: bool, dt: float) -> Recording:
    calls = [c for c in all_calls if path_filter is None or any(path_filter in p for p in c.paths)]
    return Recording(list(cmd), rc, calls, all_calls, so, se, to, dt)


def record(cmd: Sequence[str], *, syscalls: Sequence[str] = DEFAULT_SYSCALLS, path_filter: str | None = None,
           timeout: float = 60.0, env: Mapping[str, str] | None = None, cwd: str | None = None,
           capture_data: bool = False) -> Recording:
    """Run ``cmd`` under ``strace -f --seccomp-bpf -y`` and return its IO syscalls in completion order.

    ``path_filter`` (substring) only narrows ``calls``; ``all_calls`` keeps every traced call so per-process
    ``when=k`` counts can be derived exactly. ``capture_data`` also traces :data:`STATE_SYSCALLS` and keeps the
    bytes every write carried (in ``Syscall.args``), which a crash-state model replays.
    """
    with tempfile.TemporaryDirectory(prefix="ckpt-strace-") as tmp:
        trace = os.path.join(tmp, "trace")
        argv = ["strace", "-f", "--seccomp-bpf", "-qq", *_trace_options(syscalls, capture_data), "-o", trace,
                "--", *cmd]
        rc, so, se, to, dt = _run(argv, timeout, env, cwd, tmp)
        text = _read(trace)
    return _recording(cmd, parse_trace(text)[0], path_filter, rc, so, se, to, dt)


class Attached:
    """strace attached to already-running processes (and every thread and child they have or start) for the
    length of a ``with`` block: record their IO, or inject one fault, without paying for tracing their start-up.

    Counting for ``when=k`` starts at the attach, so a warm rank's k-th write is the k-th write of the operation
    run inside the block. On exit strace detaches (the tracees run on) and :attr:`recording` holds the calls;
    :attr:`injected_call` / :attr:`killed_pids` say whether an injection fired.
    """

    def __init__(self, pids: Sequence[int], *, syscalls: Sequence[str] = DEFAULT_SYSCALLS,
                 path_filter: str | None = None, inject: tuple[str, int, str, str | None] | None = None,
                 capture_data: bool = False, attach_timeout: float = 30.0) -> None:
        if not pids:
            raise ValueError("nothing to attach to")
        self.pids = [int(p) for p in pids]
        self.syscalls, self.path_filter, self.capture_data = tuple(syscalls), path_filter, capture_data
        self.inject = inject  # (syscall, k, "signal=KILL" | "error=ENOSPC", exact path or None)
        self.attach_timeout = attach_timeout
        self.recording: Recording | None = None
        self.injected_call: Syscall | None = None
        self.killed_pids: list[int] = []
        #: thread id -> attached pid, for every thread of the attached processes and their descendants at attach
        #: time (with ``capture_data`` clone/fork calls are traced too, so later children can be placed as well).
        self.initial_tids: dict[int, int] = {}
        self._processes: dict[int, int] = {}
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None
        self._t0 = 0.0

    def __enter__(self) -> Attached:
        self._tmp = tempfile.TemporaryDirectory(prefix="ckpt-strace-")
        trace, err = os.path.join(self._tmp.name, "trace"), os.path.join(self._tmp.name, "stderr")
        argv = ["strace", "-f", *_trace_options(self.syscalls, self.capture_data), "-o", trace]
        threads = _threads(self.pids)
        self.initial_tids = {tid: root for tid, (root, _) in threads.items()}
        self._processes = {tid: process for tid, (_, process) in threads.items()}
        if self.inject is not None:
            argv += _inject_options(*self.inject)
        tree = _processes(self.pids)
        for pid in tree:  # -f follows only children born after the attach: attach to existing ones (writers) too
            argv += ["-p", str(pid)]
        self._t0 = time.monotonic()
        with open(err, "wb") as fe:
            self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fe, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        deadline = time.monotonic() + self.attach_timeout
        while True:  # strace reports "Process N attached" once each tracee is stopped and traced
            attached = {int(m) for m in re.findall(r"Process (\d+) attached", _read(err))}
            if set(tree) <= attached | {p for p in tree if not _running(p)}:
                # A thread started between the first look and the attach made no clone strace saw: look again.
                for tid, (root, process) in _threads(self.pids).items():
                    self.initial_tids.setdefault(tid, root)
                    self._processes.setdefault(tid, process)
                return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"strace could not attach to {self.pids}: {_read(err)[-_TAIL:]}")
            time.sleep(0.01)

    def _await_kill_logged(self, trace: str, timeout: float = 2.0) -> None:
        """Before detaching, let strace log a kill it caused: a tracee's death reaches the harness (a closed socket)
        before strace has reaped it and written ``= ?`` / ``killed by SIGKILL``, and a detach would drop both.
        A dead attached process must have its own ``killed by`` line: its threads die (and are logged) first, and
        a detach in the middle of that group exit leaves strace waiting on the leader (30 s, measured)."""
        if self.inject is None or not self.inject[2].startswith("signal="):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = _read(trace)
            gone = [p for p in self.pids if not _running(p)]
            if gone and all(f"{p} +++ killed by SIG" in text for p in gone):
                return
            if not gone and (("killed by SIG" in text and " = ?" in text) or " = ?" not in text):
                return
            time.sleep(0.01)

    def _stop(self) -> str:
        assert self._proc is not None and self._tmp is not None
        self._await_kill_logged(os.path.join(self._tmp.name, "trace"))
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # detach: the tracees carry on untraced
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_tree(self._proc)
        kill_tree(self._proc)
        text = _read(os.path.join(self._tmp.name, "trace"))
        self._tmp.cleanup()
        return text

    def __exit__(self, *exc: object) -> None:
        all_calls, self.killed_pids = parse_trace(self._stop())
        self.recording = _recording([f"pid {p}" for p in self.pids], all_calls, self.path_filter, None, "", "", False,
                                    time.monotonic() - self._t0)
        self.recording.processes = self._processes
        if self.inject is not None:
            syscall, _, action, _ = self.inject
            # The call's own thread may be logged as killed only after the detach: any death in the tree will do.
            self.injected_call = _injected_call(all_calls, self.killed_pids, syscall, action, own_death_logged=False)


def _inject_options(syscall: str, k: int, action: str, path: str | None) -> list[str]:
    """strace options making the k-th ``syscall`` (per process, on exactly ``path`` if given) suffer ``action``."""
    _check_syscall(syscall)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [*(["-P", path] if path is not None else []), "-e", f"inject={syscall}:{action}:when={k}"]


def _injected_call(calls: list[Syscall], killed_pids: list[int], syscall: str, action: str, *,
                   own_death_logged: bool) -> Syscall | None:
    """The call an injection hit: for a kill, a ``syscall`` that never returned (``own_death_logged``: made by a
    process the trace saw killed); for an error, the call strace marks ``(INJECTED)``."""
    if not action.startswith("signal="):
        return next((c for c in calls if c.result.endswith("(INJECTED)")), None)
    if not killed_pids:
        return None
    return next((c for c in calls if c.killed and c.name == syscall and (c.pid in killed_pids or not own_death_logged)),
                None)


def _inject(cmd: Sequence[str], syscall: str, k: int, action: str, path: str | None, timeout: float,
            env: Mapping[str, str] | None, cwd: str | None, seccomp: bool) -> InjectionResult:
    options = _inject_options(syscall, k, action, path)
    with tempfile.TemporaryDirectory(prefix="ckpt-strace-") as tmp:
        trace = os.path.join(tmp, "trace")
        argv = ["strace", "-f", *(["--seccomp-bpf"] if seccomp else []), "-y", "-q", "-e", f"trace={syscall}",
                *options, "-o", trace, "--", *cmd]
        rc, so, se, to, dt = _run(argv, timeout, env, cwd, tmp)
        text = _read(trace)
    calls, killed_pids = parse_trace(text)
    hit = _injected_call(calls, killed_pids, syscall, action, own_death_logged=True)
    return InjectionResult(
        cmd=list(cmd), returncode=rc, killed=bool(killed_pids) and action.startswith("signal=") and hit is not None,
        killed_pid=hit.pid if hit is not None and action.startswith("signal=") else None, injected=hit is not None,
        injected_call=hit, stdout_tail=so, stderr_tail=se, timed_out=to, duration_s=dt, killed_pids=killed_pids,
    )


def inject_kill(cmd: Sequence[str], *, syscall: str, k: int, path_filter: str | None = None, timeout: float = 60.0,
                env: Mapping[str, str] | None = None, cwd: str | None = None) -> InjectionResult:
    """SIGKILL the process making its k-th ``syscall`` (per-process count; exact ``path_filter`` via ``-P``).

    Runs without ``--seccomp-bpf`` because strace 6.1 drops signal injection under it (module docstring).
    """
    return _inject(cmd, syscall, k, "signal=KILL", path_filter, timeout, env, cwd, seccomp=False)


def inject_error(cmd: Sequence[str], syscall: str, k: int, errno_name: str, *, path_filter: str | None = None,
                 timeout: float = 60.0, env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> InjectionResult:
    """Make the k-th ``syscall`` (per process; exact ``path_filter`` via ``-P``) fail with ``errno_name``."""
    if errno_name not in ERRNO_NAMES:
        raise ValueError(f"errno_name must be one of {ERRNO_NAMES}, got {errno_name!r}")
    return _inject(cmd, syscall, k, f"error={errno_name}", path_filter, timeout, env, cwd, seccomp=True)
