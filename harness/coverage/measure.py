"""Line and branch coverage of the frameworks' checkpoint code, recorded in every process that runs it: launched
and forked ranks, virtual hosts (their ranks are threads), the controller playing ranks in-process, and the writer
processes a framework spawns from a rank.

A process records with coverage.py (branch arcs, only files of ``harness.coverage.scope``) and writes what it saw,
by label (the property of the case it ran), into a file of its own in the campaign's directory after every case:
written whole to a temporary name and renamed, so a process killed mid-write (a crash point, a SIGKILLed writer)
loses at most its last case and never leaves a file nobody can read. A process the framework spawns takes the
recording up from its environment (``start_carried``); one it forks inherits it and writes a file of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.coverage.scope import FORMAT, installed, relative

COVERAGE_OPTION = "coverage"  # set-up option: {"dir": where every process of the campaign writes}
COVERAGE_VAR = "CKH_COVERAGE_DIR"  # the same, carried to the processes a framework spawns from a rank
LABEL_VAR = "CKH_COVERAGE_LABEL"  # the label a spawned writer records under: its rank's case's property then
SETUP = "setup"  # the label of what a rank runs before its first case (imports, the adapter's set-up)
WRITERS = "writers"  # the label of a spawned process whose rank had no case yet
# A virtual host records one case in this many per label: its ranks are threads running the harness's emulation
# (pure Python) besides the framework, and tracing them all would double a case's time (bench/coverage_cost.py).
VIRTUAL_SAMPLE = 4

Arcs = dict[str, list[tuple[int, int]]]  # file (relative to its install root) -> arcs, as coverage.py counts them

_recorder: Recorder | None = None
_users = 0  # the starts that asked for this process's recording and have not stopped it
_threads = threading.local()  # each thread's coverage.py tracer while its tracing is off
_hooked = False  # the fork and exit hooks are registered (once a process: they read ``_recorder``)


class Recorder:
    """This process's recording: coverage.py started on the scopes' files, and what was written so far."""

    def __init__(self, directory: str, label: str) -> None:
        import coverage  # (only where a process records: the harness itself runs without it)

        self.directory, self.label = Path(directory), label
        include = [f"{scope.root()}/{g}" for scope in installed() for g in scope.globs]
        self._cov = coverage.Coverage(data_file=None, branch=True, include=include, config_file=False)
        self._cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured"])
        self._names: dict[str, str | None] = {}  # measured path -> its scope-relative name
        self._labels: dict[str, dict[str, set[tuple[int, int]]]] = {}  # label -> name -> arcs
        self.cases: Counter = Counter()  # cases begun per label (``sampled``)
        self._lock = threading.Lock()
        self._dirty = False  # arcs collected since the last write
        self._path = self._own_path()
        self._cov.start()

    def _own_path(self) -> Path:
        return self.directory / f"{socket.gethostname()}-{os.getpid()}.json"

    def relabel(self, label: str) -> None:
        """From now on what runs counts for ``label`` (what ran before, for the label then)."""
        self.collect()
        self.label = label
        os.environ[LABEL_VAR] = label

    def collect(self) -> None:
        """Move what coverage.py saw since the last collection into the current label. Its data is emptied after
        each look (the tracers keep running, in every thread), so an arc run again under another label counts
        for that label too."""
        with self._lock:
            data = self._cov.get_data()
            for path in data.measured_files():
                if path not in self._names:
                    self._names[path] = relative(path)
                name = self._names[path]
                arcs = data.arcs(path)
                if name is not None and arcs:
                    have = self._labels.setdefault(self.label, {}).setdefault(name, set())
                    before = len(have)
                    have.update(arcs)
                    self._dirty |= len(have) > before
            data.erase()

    def write(self) -> None:
        """Collect, then write everything this process recorded (whole, then renamed into place), where the file
        would change: a case that ran nothing new under its label costs no write."""
        self.collect()
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            doc = {"format": FORMAT, "pid": os.getpid(),
                   "labels": {label: {name: sorted(arcs) for name, arcs in files.items()}
                              for label, files in self._labels.items()}}
            tmp = self._path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, self._path)

    def stop(self) -> None:
        self._cov.stop()

    def forked(self) -> None:
        """In a forked child: a file of its own (what the parent recorded is the parent's to write)."""
        self._lock = threading.Lock()
        self._path = self._own_path()
        self._labels, self._dirty = {}, False


def start(options: dict | None, label: str = SETUP) -> Recorder | None:
    """Start recording in this process where the set-up ``options`` ask for it (``COVERAGE_OPTION``), under
    ``label`` until a case begins, and carry the request to the processes the framework spawns from here.
    Idempotent."""
    global _recorder, _users, _hooked
    wanted = (options or {}).get(COVERAGE_OPTION)
    if not wanted:
        os.environ.pop(COVERAGE_VAR, None)
        return _recorder
    _users += 1
    if _recorder is None:
        Path(wanted["dir"]).mkdir(parents=True, exist_ok=True)
        _recorder = Recorder(wanted["dir"], label)
        os.environ[LABEL_VAR] = label
        os.environ[COVERAGE_VAR] = wanted["dir"]
        if not _hooked:  # a process that stops and starts again (an in-process controller) keeps one set
            os.register_at_fork(after_in_child=_after_fork)
            atexit.register(_write_quietly)
            _write_at_process_exit()
            _hooked = True
    return _recorder


def stop() -> None:
    """One user of this process's recording is done (each ``start`` that asked for it is one); after the last,
    write, stop recording and carry nothing further: a process that lives on after its ranks (the controller that
    played them in-process) must not trace, nor hand the recording to what it starts next."""
    global _recorder, _users
    _users = max(0, _users - 1)
    if _users or _recorder is None:
        return
    recorder, _recorder = _recorder, None
    with contextlib.suppress(Exception):
        recorder.write()
    recorder.stop()
    os.environ.pop(COVERAGE_VAR, None)
    os.environ.pop(LABEL_VAR, None)
    _threads.__dict__.clear()


def start_carried() -> None:
    """In a process the framework spawned from a recording rank: record too, and write when it ends, also when it
    is terminated (a writer pool's workers are)."""
    directory = os.environ.get(COVERAGE_VAR)
    if not directory or _recorder is not None:
        return
    start({COVERAGE_OPTION: {"dir": directory}}, os.environ.get(LABEL_VAR, WRITERS))
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _write_and_die)


def thread_tracing(on: bool) -> None:
    """Tracing in the calling thread on or off: coverage.py's tracer of this thread is kept aside while off. A
    trace hook slows every Python line of its thread (about 2x on Python 3.11, bench/coverage_cost.py), so a
    process that also runs much Python of its own (the controller playing ranks, a virtual host's emulation)
    traces only where the framework runs, or only some cases."""
    if _recorder is None:
        return
    current = sys.gettrace()
    if on and current is None and getattr(_threads, "tracer", None) is not None:
        sys.settrace(_threads.tracer)
    elif not on and current is not None:
        _threads.tracer = current
        sys.settrace(None)


@contextlib.contextmanager
def traced() -> Iterator[None]:
    """The calling thread traced for the duration (where recording is on)."""
    thread_tracing(True)
    try:
        yield
    finally:
        thread_tracing(False)


def sampled(label: str) -> bool:
    """Whether a virtual host records this case of ``label``: the first and every ``VIRTUAL_SAMPLE``-th after it."""
    if _recorder is None:
        return False
    seen = _recorder.cases[label]
    _recorder.cases[label] += 1
    return seen % VIRTUAL_SAMPLE == 0


def case_begins(label: str) -> None:
    """A rank takes a case: what runs now counts for its label (the property)."""
    if _recorder is not None:
        _recorder.relabel(label)


def case_ends() -> None:
    """A rank ended a case: write what the process recorded so far."""
    if _recorder is not None:
        _write_quietly()


def recording() -> bool:
    return _recorder is not None


def _after_fork() -> None:
    if _recorder is not None:
        _recorder.forked()
        _write_at_process_exit()


def _write_at_process_exit() -> None:
    """A multiprocessing child ends through ``os._exit`` after its finalizers, not through ``atexit``."""
    from multiprocessing import util

    util.Finalize(None, _write_quietly, exitpriority=-100)


def _write_quietly() -> None:
    """Coverage is measured, not judged: a process that cannot write it (its directory gone as the campaign
    ends) must not fail or change its exit; its log says so."""
    if _recorder is None:
        return
    try:
        _recorder.write()
    except Exception as exc:
        print(f"ckpt-harness: coverage of process {os.getpid()} not written: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _write_and_die(signum: int, frame: Any) -> None:
    _write_quietly()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
