"""ptrace-free injectors on warm processes: KillWhen, Stall, FileSizeLimit (faults/triggers, stall, limits).

Each test starts a small writer that parks on stdin (a warm rank), arms an injector on its pid, then lets it write
``data`` in chunks; ``spawn`` writers hand the writing to a child (an async writer) that already exists at arming.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from faults.errors import FaultSpecError
from faults.limits import FileSizeLimit
from faults.procs import TRACKER_GRACE, kill_tree, kill_trees, popen
from faults.stall import Stall
from faults.triggers import KillWhen, freeze

WRITER = r'''
import os, subprocess, sys, time
role, out, chunks, size, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

def write():
    sizes = []
    fd = os.open(os.path.join(out, "data"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(chunks):
            sizes.append(str(os.write(fd, b"x" * size)))
            time.sleep(pause)
    except OSError as e:
        sizes.append("E%d" % e.errno)
    os.close(fd)
    print("WROTE", ",".join(sizes), flush=True)

if role == "child":
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(out, "go")):
        if time.monotonic() > deadline:
            sys.exit(2)
        time.sleep(0.002)
    write()
    sys.exit(0)
child = subprocess.Popen([sys.executable, __file__, "child", *sys.argv[2:]]) if role == "spawn" else None
print("READY", child.pid if child else os.getpid(), flush=True)
sys.stdin.readline()
if child:
    open(os.path.join(out, "go"), "w").close()
    print("CHILD_RC", child.wait(), flush=True)
else:
    write()
sys.stdin.readline()  # parked until the test closes stdin
'''

TIMEOUT = 10.0
FSIZE = psutil.RLIMIT_FSIZE


def _line(p: subprocess.Popen, timeout: float = TIMEOUT) -> str:
    """One line of ``p``'s stdout, or TimeoutError: a hang fails the test instead of stalling it."""
    buf, deadline = b"", time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
            raise TimeoutError(f"no line from {p.pid} within {timeout} s (got {buf!r})")
        byte = p.stdout.read(1)
        if not byte:
            raise EOFError(f"{p.pid} closed stdout (got {buf!r})")
        buf += byte
    return buf.decode().strip()


def _go(p: subprocess.Popen) -> None:
    p.stdin.write(b"go\n")


def _finish(p: subprocess.Popen) -> int:
    p.stdin.close()
    return p.wait(timeout=TIMEOUT)


def _until(cond: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def _stopped(*pids: int) -> bool:
    return all(_status(p) == psutil.STATUS_STOPPED for p in pids)


class Writers:
    """Starts writers in their own session and kills whatever is left of them at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.script, self.out = tmp_path / "writer.py", tmp_path / "out"
        self.script.write_text(WRITER)
        self.out.mkdir()
        self.data = self.out / "data"
        self.procs: list[subprocess.Popen] = []

    def popen(self, argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self, role: str, chunks: int = 5, size: int = 1000, pause: float = 0.0) -> tuple[subprocess.Popen, int]:
        """A parked writer and the pid that will write (its child for ``spawn``)."""
        p = self.popen([sys.executable, str(self.script), role, str(self.out), str(chunks), str(size), str(pause)])
        word, pid = _line(p).split()
        assert word == "READY"
        return p, int(pid)

    def close(self) -> None:
        for p in self.procs:
            kill_tree(p)
            for f in (p.stdin, p.stdout):
                if f is not None and not f.closed:
                    f.close()


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[Writers]:
    w = Writers(tmp_path)
    yield w
    w.close()


def _check_report(r: dict, *, fired: bool, target_pid: int | None) -> None:
    json.dumps(r)
    assert r["mechanism"] == "psutil"
    assert r["fired"] is fired
    assert r["target_pid"] == target_pid


# --- KillWhen ----------------------------------------------------------------------------------------------------


def test_file_appears_kills_tree_before_file_is_complete(writers: Writers) -> None:
    p, child = writers.start("spawn", chunks=30, size=1000, pause=0.01)
    with KillWhen([p.pid], file_appears=str(writers.out / "da*")) as k:
        _go(p)
        assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL  # not reaped by KillWhen: the Popen still sees -9
    r = k.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["trigger"] == {"file_appears": str(writers.out / "da*")}
    assert r["detail"]["matched"] == str(writers.data)
    assert sorted(r["detail"]["hit"]) == sorted([p.pid, child])
    assert _status(child) in ("gone", psutil.STATUS_ZOMBIE)
    assert not writers.data.exists() or writers.data.stat().st_size < 30_000


def test_bytes_written_fires_after_n_bytes_and_before_the_end(writers: Writers) -> None:
    n = 10_000
    p, _ = writers.start("inline", chunks=30, size=1000, pause=0.01)
    with KillWhen([p.pid], bytes_written=n) as k:
        _go(p)
        assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL
    r = k.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["detail"]["bytes_seen"] >= n
    assert n <= writers.data.stat().st_size < 30_000


def test_delay_fires(writers: Writers) -> None:
    p, _ = writers.start("inline")
    with KillWhen([p.pid], delay=0.05) as k:
        assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL
    r = k.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["trigger"] == {"delay": 0.05} and r["detail"]["hit"] == [p.pid]
    assert r["seconds"]["fired_after"] >= 0.05


def test_target_children_kills_the_async_writer_and_spares_the_rank(writers: Writers) -> None:
    p, child = writers.start("spawn", chunks=30, size=1000, pause=0.01)
    with KillWhen([p.pid], file_appears=str(writers.data), target="children") as k:
        _go(p)
        assert _line(p) == f"CHILD_RC {-signal.SIGKILL}"
    r = k.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["detail"]["hit"] == [child] and r["detail"]["target"] == "children"
    assert p.poll() is None
    assert _finish(p) == 0


def test_not_fired_is_reported_and_preexisting_matches_do_not_count(writers: Writers) -> None:
    (writers.out / "stale").write_text("old")
    p, _ = writers.start("inline", chunks=3, size=100)
    with KillWhen([p.pid], file_appears=str(writers.out / "stale*")) as k:
        _go(p)
        assert _line(p) == "WROTE 100,100,100"
    r = k.report()
    _check_report(r, fired=False, target_pid=None)
    assert r["detail"] == {"trigger_met": False, "target": "tree", "hit": []} and r["seconds"] == {}
    assert _finish(p) == 0


# --- Stall -------------------------------------------------------------------------------------------------------


def test_stall_stops_the_tree_for_duration_then_the_writer_completes(writers: Writers) -> None:
    p, child = writers.start("spawn", chunks=5, size=1000, pause=0.01)
    with Stall([p.pid], file_appears=str(writers.data), duration=1.0) as s:  # long enough to see under load
        _go(p)
        _until(lambda: _stopped(p.pid, child))
        size = writers.data.stat().st_size
        time.sleep(0.05)
        assert _stopped(p.pid, child) and writers.data.stat().st_size == size  # no progress while stopped
        assert [_line(p), _line(p)] == ["WROTE 1000,1000,1000,1000,1000", "CHILD_RC 0"]
    r = s.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert sorted(r["detail"]["hit"]) == sorted([p.pid, child]) and r["detail"]["duration"] == 1.0
    assert r["seconds"]["stopped_for"] >= 1.0
    assert writers.data.stat().st_size == 5000
    assert _finish(p) == 0


def test_stall_resumes_on_exit_when_the_body_raises(writers: Writers) -> None:
    p, _ = writers.start("inline", chunks=3, size=100)
    with pytest.raises(RuntimeError, match="boom"), Stall([p.pid], delay=0, duration=60) as s:
        _until(lambda: _stopped(p.pid))
        raise RuntimeError("boom")
    assert _status(p.pid) != psutil.STATUS_STOPPED
    r = s.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["seconds"]["stopped_for"] < 30  # cut short by the exit, not waited out
    _go(p)
    assert _line(p) == "WROTE 100,100,100"
    assert _finish(p) == 0


# --- FileSizeLimit -----------------------------------------------------------------------------------------------


def _limits_or_skip(pid: int) -> tuple[int, int]:
    before = psutil.Process(pid).rlimit(FSIZE)
    if before[0] != psutil.RLIM_INFINITY:
        pytest.skip(f"RLIMIT_FSIZE already limited here: {before}")
    return before


def test_file_size_limit_makes_python_writes_fail_with_efbig_and_is_restored(writers: Writers) -> None:
    p, _ = writers.start("inline", chunks=5, size=256)
    before = _limits_or_skip(p.pid)
    with FileSizeLimit([p.pid], 1000) as lim:
        assert psutil.Process(p.pid).rlimit(FSIZE) == (1000, before[1])
        _go(p)
        # the crossing write is cut short at the limit, the next one fails with EFBIG; Python survives
        assert _line(p) == "WROTE 256,256,256,232,E27"
    assert psutil.Process(p.pid).rlimit(FSIZE) == before
    r = lim.report()
    _check_report(r, fired=True, target_pid=p.pid)
    assert r["trigger"] == {"rlimit_fsize": 1000}
    assert r["detail"] == {"max_bytes": 1000, "limited": [p.pid], "restored": [p.pid]}
    assert writers.data.stat().st_size == 1000
    assert _finish(p) == 0


def test_file_size_limit_covers_existing_children(writers: Writers) -> None:
    p, child = writers.start("spawn", chunks=5, size=256)
    before = _limits_or_skip(child)
    with FileSizeLimit([p.pid], 1000) as lim:
        assert psutil.Process(child).rlimit(FSIZE) == (1000, before[1])
    assert psutil.Process(child).rlimit(FSIZE) == before
    assert lim.report()["detail"]["restored"] == sorted([p.pid, child])
    with FileSizeLimit([p.pid], 1000):
        _go(p)
        assert [_line(p), _line(p)] == ["WROTE 256,256,256,232,E27", "CHILD_RC 0"]
    assert _finish(p) == 0


@pytest.mark.skipif(shutil.which("head") is None, reason="needs coreutils head")
def test_file_size_limit_kills_a_non_python_writer_and_restores_children_born_inside(writers: Writers) -> None:
    data = writers.out / "sh-data"
    script = 'read x; sleep 30 & echo "$!"; head -c 5000 /dev/zero > "$1"; echo "rc=$?"; read y; exit 0'
    p = writers.popen(["sh", "-c", script, "sh", str(data)])
    before = _limits_or_skip(p.pid)
    with FileSizeLimit([p.pid], 1000) as lim:
        _go(p)
        late = int(_line(p))
        assert _line(p) == f"rc={128 + signal.SIGXFSZ}"  # head died of SIGXFSZ
        assert psutil.Process(late).rlimit(FSIZE) == (1000, before[1])  # forked inside: inherited
    assert data.stat().st_size == 1000
    assert psutil.Process(late).rlimit(FSIZE) == before
    assert lim.report()["detail"]["restored"] == sorted([p.pid, late])
    assert _finish(p) == 0


# --- errors ------------------------------------------------------------------------------------------------------

BAD: dict[str, Callable[[], object]] = {
    "no trigger": lambda: KillWhen([1]),
    "two triggers": lambda: KillWhen([1], delay=1, bytes_written=3),
    "negative delay": lambda: KillWhen([1], delay=-1),
    "negative bytes": lambda: KillWhen([1], bytes_written=-1),
    "relative glob": lambda: KillWhen([1], file_appears="out/*"),
    "unknown target": lambda: KillWhen([1], delay=1, target="parent"),
    "no pids": lambda: KillWhen([], delay=1),
    "zero poll": lambda: KillWhen([1], delay=1, poll=0),
    "stall negative duration": lambda: Stall([1], delay=1, duration=-1),
    "stall no trigger": lambda: Stall([1], duration=1),
    "stall no pids": lambda: Stall([], delay=0, duration=1),
    "limit negative": lambda: FileSizeLimit([1], -1),
    "limit no pids": lambda: FileSizeLimit([], 10),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_bad_arguments_raise_fault_spec_error(make: Callable[[], object]) -> None:
    with pytest.raises(FaultSpecError):
        make()


def test_arming_on_a_dead_pid_raises_fault_spec_error() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=TIMEOUT)
    for fault in (KillWhen([p.pid], delay=0), Stall([p.pid], delay=0, duration=0), FileSizeLimit([p.pid], 1)):
        with pytest.raises(FaultSpecError, match="not running"), fault:
            pass


SEMAPHORE_USER = """
import multiprocessing, sys, time
if __name__ == "__main__":
    lock = multiprocessing.get_context("spawn").Lock()  # named, its unlink left to the resource tracker
    print(lock._semlock.name, flush=True)
    time.sleep(60)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory lives elsewhere here")
@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_a_killed_tree_leaves_no_multiprocessing_semaphore_behind(tmp_path: Path, stopped: bool) -> None:
    """Killed with its users, Python's resource tracker never unlinks their named semaphores (/dev/shm/sem.mp-*,
    a few per killed job, for good); spared until they are dead, it does, even where a hold had stopped it with
    the writers it serves."""
    script = tmp_path / "user.py"
    script.write_text(SEMAPHORE_USER)
    proc = popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("/mp-"), name
        assert Path("/dev/shm", "sem." + name[1:]).exists()
        _wait_for_tracker(proc.pid)
        if stopped:
            freeze([psutil.Process(proc.pid)])
    finally:
        kill_tree(proc)
        proc.stdout.close()
    assert not Path("/dev/shm", "sem." + name[1:]).exists()


def _wait_for_tracker(pid: int, timeout: float = 30.0) -> None:
    """Until the user's tracker runs as one: a tracker killed while still between fork and exec is not yet told
    from its user (what it would do is what this test asks), which a loaded machine makes likely."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children()
        with contextlib.suppress(psutil.Error):
            if any("multiprocessing.resource_tracker" in part for k in kids for part in k.cmdline()):
                return
        time.sleep(0.01)
    raise AssertionError(f"no resource tracker under {pid} after {timeout} s")


STAMPER = """
import subprocess, sys, time
if sys.argv[1] == "stamp":  # a writer: says it still runs, every few milliseconds
    while True:
        with open(sys.argv[2], "a") as out:
            out.write(f"{time.monotonic()}\\n")
        time.sleep(0.01)
if sys.argv[1] == "tracker":  # stands for a resource tracker that outlives the grace
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "multiprocessing.resource_tracker"])
else:
    subprocess.Popen([sys.executable, __file__, "stamp", sys.argv[2]])
print("up", flush=True)
time.sleep(60)
"""


def test_every_tree_of_a_job_dies_before_a_tracker_grace_is_waited_out(tmp_path: Path) -> None:
    """The trees are one job's ranks: a rank's writer must not run on while another rank's resource tracker gets
    its grace (a writer let go then writes files a crash would never have let it write)."""
    script, stamps = tmp_path / "tree.py", tmp_path / "stamps"
    script.write_text(STAMPER)
    procs = [popen([sys.executable, str(script), role, str(stamps)], stdout=subprocess.PIPE, text=True)
             for role in ("tracker", "writer")]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 30
        while not stamps.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        began = time.monotonic()
        kill_trees(procs)
        for proc in procs:
            proc.stdout.close()
    last = float(stamps.read_text().split()[-1])
    assert last < began + TRACKER_GRACE / 2, f"the writer ran {last - began:.1f} s into the kill"
