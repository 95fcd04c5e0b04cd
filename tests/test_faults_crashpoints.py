"""Crash points via strace: record a tiny writer, kill it at every IO call, check the disk holds a prefix.

Measured here (strace 6.1, Python 3.11, this machine): record ≈ 0.12-0.16 s, one inject_kill ≈ 0.14-0.22 s,
whole module ≈ 7-10 s with -n 2. ``when=k`` counts per process (each child starts from zero); see faults/strace.py.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from faults import strace
from faults.crashpoints import CrashPoint, FaultSpecError, enumerate_points, hit, run_at

pytestmark = pytest.mark.skipif(not strace.available(), reason="strace missing or ptrace not permitted here")

# Each file is written in two write() calls so that per-path k reaches 2; then temp file + rename.
WRITER = r'''
import errno, os, sys
d = sys.argv[1]
def put(p, chunks):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for c in chunks:
            os.write(fd, c)
        os.fsync(fd)
    except OSError as e:
        print("ERR", errno.errorcode[e.errno], flush=True)
        sys.exit(3)
    finally:
        os.close(fd)
for i in range(3):
    put(os.path.join(d, "f%d" % i), [b"head%d;" % i, b"tail%d" % i])
put(os.path.join(d, "final.tmp"), [b"fin", b"al"])
os.rename(os.path.join(d, "final.tmp"), os.path.join(d, "final"))
print("OK", flush=True)
'''

PARENT = r'''
import os, subprocess, sys
rc = subprocess.call([sys.executable, sys.argv[1], sys.argv[2]])
print("PARENT", os.getpid(), "CHILD_RC", rc, flush=True)
'''

TIMEOUT = 30.0


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    out = tmp_path / "out"
    out.mkdir()
    return script, out


def _reset(d: Path) -> None:
    for p in d.iterdir():
        p.unlink()


def _disk(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _model(calls: list[strace.Syscall]) -> dict[str, bytes]:
    """Replay recorded calls on a dict: the state a SIGKILL right before the next call must leave."""
    state: dict[str, bytes] = {}
    for c in calls:
        assert c.path is not None
        name = os.path.basename(c.path)
        if c.name == "openat" and "O_CREAT" in c.args_summary:
            if "O_TRUNC" in c.args_summary or name not in state:
                state[name] = b""
        elif c.name == "write":
            m = re.search(r'"((?:[^"\\]|\\.)*)"', c.args_summary)
            assert m
            state[name] += codecs.escape_decode(m.group(1).encode())[0]
        elif c.name.startswith("rename"):
            state[os.path.basename(c.paths[1])] = state.pop(name)
    return state


def test_record_then_kill_at_every_point_leaves_a_prefix(tmp_path: Path) -> None:
    script, out = _setup(tmp_path)
    cmd = [sys.executable, str(script), str(out)]
    t0 = time.monotonic()
    rec = strace.record(cmd, path_filter=str(out), timeout=TIMEOUT)
    t_record = time.monotonic() - t0
    assert rec.returncode == 0 and "OK" in rec.stdout_tail and not rec.timed_out
    assert _model(rec.calls) == _disk(out) == {
        "f0": b"head0;tail0", "f1": b"head1;tail1", "f2": b"head2;tail2", "final": b"final"}
    assert [c.name for c in rec.calls].count("write") == 8

    points = enumerate_points(rec)
    assert len(points) == len(rec.calls) == 17  # 4 x (openat, write, write, fsync) + rename
    assert [p.k for p in points if p.syscall == "write"] == [1, 2] * 4  # per path, per process
    t_inject = []
    for p in points:
        _reset(out)
        t0 = time.monotonic()
        res = run_at(cmd, p, timeout=TIMEOUT)
        t_inject.append(time.monotonic() - t0)
        assert hit(res, p), (p, res)
        assert res.returncode == -9 and res.killed_pid is not None and "OK" not in res.stdout_tail
        assert _disk(out) == _model(rec.calls[: p.index]), p
    # Spot checks of the prefix property, spelled out.
    _reset(out)
    rename = next(p for p in points if p.syscall == "rename")
    run_at(cmd, rename, timeout=TIMEOUT)
    assert "final" not in _disk(out) and _disk(out)["final.tmp"] == b"final"
    print(f"record {t_record:.3f}s; inject_kill mean {sum(t_inject) / len(t_inject):.3f}s over {len(t_inject)}")


def test_when_k_without_path_counts_every_write_of_the_process(tmp_path: Path) -> None:
    script, out = _setup(tmp_path)
    res = strace.inject_kill([sys.executable, str(script), str(out)], syscall="write", k=3, timeout=TIMEOUT)
    assert res.killed and res.injected_call is not None and res.injected_call.path == str(out / "f1")
    assert _disk(out) == {"f0": b"head0;tail0", "f1": b""}  # 1st file complete, 2nd opened, 3rd write killed


def test_inject_enospc_on_first_write(tmp_path: Path) -> None:
    script, out = _setup(tmp_path)
    res = strace.inject_error([sys.executable, str(script), str(out)], "write", 1, "ENOSPC", timeout=TIMEOUT)
    assert res.injected and not res.killed and res.returncode == 3
    assert "ERR ENOSPC" in res.stdout_tail
    assert _disk(out) == {"f0": b""}


def test_kill_hits_the_writer_child_not_the_parent(tmp_path: Path) -> None:
    script, out = _setup(tmp_path)
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    cmd = [sys.executable, str(parent), str(script), str(out)]
    rec = strace.record(cmd, path_filter=str(out), timeout=TIMEOUT)
    parent_pid = int(re.search(r"PARENT (\d+) CHILD_RC 0", rec.stdout_tail).group(1))
    assert {c.pid for c in rec.calls} - {parent_pid}, "writes come from the child"
    point = next(p for p in enumerate_points(rec, ["write"]) if p.path == str(out / "f1") and p.k == 2)
    assert point.pid != parent_pid
    _reset(out)
    res = run_at(cmd, point, timeout=TIMEOUT)
    assert hit(res, point) and res.returncode == 0 and not res.timed_out
    m = re.search(r"PARENT (\d+) CHILD_RC -9", res.stdout_tail)  # parent survived, saw its child SIGKILLed
    assert m is not None, res.stdout_tail
    assert res.killed_pid != int(m.group(1)) and res.killed_pids == [res.killed_pid]
    assert _disk(out) == {"f0": b"head0;tail0", "f1": b"head1;"}


def test_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    code = ("import os, subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pidfile)!r}, 'w').write('%d %d' % (os.getpid(), c.pid))\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    rec = strace.record([sys.executable, "-c", code], timeout=1.5)
    assert rec.timed_out and time.monotonic() - t0 < 10
    for pid in map(int, pidfile.read_text().split()):
        assert not _alive(pid), pid


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_crash_point_json_round_trip_and_errors() -> None:
    p = CrashPoint(index=3, syscall="write", k=2, path="/d/f1", pid=42)
    assert CrashPoint.from_json(p.to_json()) == p
    assert CrashPoint.from_json(json.loads(p.to_json())) == p
    bad = ['{"index": 0, "syscall": "write"}', '{"index": 0, "syscall": "write", "k": 0, "path": null}',
           '{"index": 0, "syscall": "wr ite", "k": 1}', '{"index": 0, "syscall": "write", "k": 1, "x": 1}',
           "[1, 2]", "not json", '{"index": -1, "syscall": "write", "k": 1}',
           '{"index": 0, "syscall": "write", "k": true}', '{"index": 0, "syscall": "write", "k": 1, "path": ""}']
    for text in bad:
        with pytest.raises(FaultSpecError):
            CrashPoint.from_json(text)
    with pytest.raises(ValueError):
        strace.inject_error(["true"], "write", 1, "EPERM")


def test_parse_trace_joins_unfinished_and_resumed() -> None:
    text = "\n".join([
        '10  write(3</d/a>, "x", 1 <unfinished ...>',
        '11  openat(AT_FDCWD</d>, "/d/b", O_WRONLY|O_CREAT, 0644) = 4</d/b>',
        "10  <... write resumed>) = 1",
        '11  renameat2(AT_FDCWD</d>, "/d/b", AT_FDCWD</d>, "/d/c", RENAME_NOREPLACE) = 0',
        '11  write(4</d/c>, "y", 1) = ?',
        "11  +++ killed by SIGKILL +++",
        "10  --- SIGCHLD {si_signo=SIGCHLD} ---",
    ])
    calls, killed = strace.parse_trace(text)
    assert [(c.pid, c.name, c.path) for c in calls] == [
        (11, "openat", "/d/b"), (10, "write", "/d/a"), (11, "renameat2", "/d/b"), (11, "write", "/d/c")]
    assert calls[2].paths == ("/d/b", "/d/c") and calls[3].killed and killed == [11]
