"""Crash states (power loss, ALICE-style): record tiny writers, enumerate states, materialise them, compare.

The strace-based tests record with ``capture_data=True``; the rest run on
synthetic traces parsed with ``faults.strace.parse_trace``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from faults import strace
from faults.crashpoints import enumerate_points, hit, run_at
from faults.crashstates import (
    CrashState,
    FsOp,
    enumerate_states,
    fs_ops,
    materialize,
    ops_shape,
    state_matches,
)
from faults.errors import FaultSpecError

needs_strace = pytest.mark.skipif(not strace.available(), reason="strace missing or ptrace not permitted here")
TIMEOUT = 30.0
OLD, NEW = b"old checkpoint\n" * 3, bytes(range(256)) * 3

# temp file, fsync, rename over the final name, fsync the directory; options: "marker" writes and fsyncs a
# COMMITTED file after the rename, "nodirsync" skips the directory fsync
DURABLE = r'''
import os, sys
d, new = sys.argv[1], bytes(range(256)) * 3
fd = os.open(os.path.join(d, "final.tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, new[:300]); os.write(fd, new[300:])
os.fsync(fd); os.close(fd)
os.rename(os.path.join(d, "final.tmp"), os.path.join(d, "final"))
if "marker" in sys.argv:
    fd = os.open(os.path.join(d, "COMMITTED"), os.O_WRONLY | os.O_CREAT, 0o644); os.write(fd, b"1"); os.fsync(fd)
if "nodirsync" not in sys.argv:
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
print("OK", flush=True)
'''

# in place, no fsync at all
CARELESS = r'''
import os, sys
d, new = sys.argv[1], bytes(range(256)) * 3
fd = os.open(os.path.join(d, "final"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, new[:300]); os.write(fd, new[300:]); os.close(fd)
fd = os.open(os.path.join(d, "meta"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"step=1\n"); os.close(fd)
print("OK", flush=True)
'''

# binary data, pwrite with a hole, writev, lseek, O_APPEND on a base file, unlink, mkdir, chdir + relative paths,
# a write from a second thread (strace shows another pid; the fd table is shared), ftruncate, truncate, rmdir
EVERYTHING = r'''
import os, sys, threading
os.chdir(sys.argv[1])
os.mkdir("sub"); os.mkdir("gone")
fd = os.open("sub/bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, bytes(range(256)) * 2)
os.pwrite(fd, bytes(range(255, -1, -1)), 2000)
os.writev(fd, [b"\x00\xff", b"\n\r\t\"\\", bytes(range(128, 256))])
os.lseek(fd, 7, os.SEEK_SET); os.write(fd, b"SEVEN")
t = threading.Thread(target=lambda: os.write(fd, b"thread")); t.start(); t.join()
os.fsync(fd); os.close(fd)
fd = os.open("base.log", os.O_WRONLY | os.O_APPEND)
os.write(fd, b"appended 1\n"); os.write(fd, b"appended 2\n"); os.close(fd)
with open("sub/text", "w") as f:
    f.write("line\n" * 50)
os.truncate("sub/text", 12)
fd = os.open("sub/short", os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, b"0123456789"); os.ftruncate(fd, 4)
os.close(fd)
os.unlink("base.drop")
os.rename("sub/text", "renamed")
os.rmdir("gone")
print("OK", flush=True)
'''


def _tree(d: Path) -> dict[str, bytes | None]:
    """relative path → bytes (files) or None (directories), for byte-for-byte comparisons."""
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(d):
        rel = os.path.relpath(root, d)
        for name in sorted(dirs):
            out[os.path.normpath(os.path.join(rel, name))] = None
        for name in sorted(files):
            out[os.path.normpath(os.path.join(rel, name))] = Path(root, name).read_bytes()
    return out


def _record(tmp_path: Path, source: str, base_files: dict[str, bytes], *args: str):
    """Write ``source`` to a script, lay out a base dir, snapshot it, record the script on the live dir."""
    script = tmp_path / "writer.py"
    script.write_text(source)
    out, base = tmp_path / "out", tmp_path / "base"
    base.mkdir()
    for name, data in base_files.items():
        (base / name).write_bytes(data)
    shutil.copytree(base, out)
    cmd = [sys.executable, str(script), str(out), *args]
    rec = strace.record(cmd, capture_data=True, timeout=TIMEOUT)
    assert rec.returncode == 0 and "OK" in rec.stdout_tail, rec.stderr_tail
    return cmd, rec, out, base


def _states_trees(tmp_path: Path, ops: list[FsOp], states: list[CrashState], base: Path | None):
    dest = tmp_path / "state"
    for st in states:
        materialize(ops, st, dest, base)
        yield st, _tree(dest)
        shutil.rmtree(dest)


def _full(ops: list[FsOp]) -> CrashState:
    return CrashState("prefix", len(ops), len(ops), ops_shape(ops))


@needs_strace
def test_durable_writer_leaves_old_or_new_file_in_every_state(tmp_path: Path) -> None:
    _, rec, out, base = _record(tmp_path, DURABLE, {"final": OLD})
    ops = fs_ops(rec, out)
    assert [op.kind for op in ops] == ["open", "write", "write", "fsync", "rename", "open", "fsync"]
    states = enumerate_states(ops)
    assert {"prefix", "torn-half", "torn-zero"} <= {st.kind for st in states}
    assert not any(st.kind == "lost-dirent" for st in states)  # each equals an earlier prefix state: deduplicated
    seen = set()
    for st, tree in _states_trees(tmp_path, ops, states, base):
        assert tree.get("final") in (OLD, NEW), st.describe()
        seen.add(tree["final"])
    assert seen == {OLD, NEW}
    assert not any(st.kind == "lost-dirent" and st.prefix == len(ops) for st in states)
    materialize(ops, _full(ops), tmp_path / "full", base)
    assert _tree(tmp_path / "full") == _tree(out) == {"final": NEW}


@needs_strace
def test_careless_writer_can_lose_or_tear_the_file_and_prefixes_match_sigkill(tmp_path: Path) -> None:
    cmd, rec, out, base = _record(tmp_path, CARELESS, {"final": OLD})
    ops = fs_ops(rec, out)
    states = enumerate_states(ops)
    finals = {st.id: tree.get("final") for st, tree in _states_trees(tmp_path, ops, states, base)}
    assert b"" in finals.values(), finals  # truncated, data not yet (or never) on disk
    assert finals["torn-half@1"] == NEW[:150] and finals["torn-zero@1"] == NEW[:150] + bytes(150)
    assert any(st.kind == "lost-data" and st.prefix == len(ops) for st in states)
    assert finals[f"lost-data@{len(ops)}:final"] == OLD  # never synced: back to the durable (base) content
    materialize(ops, _full(ops), tmp_path / "full", base)
    assert _tree(tmp_path / "full") == _tree(out)

    # a SIGKILL at each IO call leaves exactly the prefix state of the ops completed before that call
    names = ("openat", "write")
    calls = [c for c in rec.all_calls if c.name in names and c.path and c.path.startswith(str(out))]
    rec.calls = calls
    points = enumerate_points(rec, names)
    assert len(points) == len(calls) == 5
    for point, call in zip(points, calls, strict=True):
        seq = next(k for k, c in enumerate(rec.all_calls) if c is call)
        prefix = sum(op.seq < seq for op in ops)
        shutil.rmtree(out)
        shutil.copytree(base, out)
        res = run_at(cmd, point, timeout=TIMEOUT)
        assert hit(res, point), (point, res)
        materialize(ops, CrashState("prefix", prefix, len(ops), ops_shape(ops)), tmp_path / "model", base)
        assert _tree(tmp_path / "model") == _tree(out), (point, prefix)
        shutil.rmtree(tmp_path / "model")


@needs_strace
def test_binary_pwrite_writev_append_unlink_mkdir_chdir_match_the_real_directory(tmp_path: Path) -> None:
    base_files = {"base.log": b"from before\n", "base.drop": b"to be unlinked", "base.keep": bytes(range(256))}
    _, rec, out, base = _record(tmp_path, EVERYTHING, base_files)
    ops = fs_ops(rec, out)
    kinds = [op.kind for op in ops]
    assert {"mkdir", "rmdir", "unlink", "rename", "truncate", "write", "open", "fsync"} <= set(kinds)
    assert any(op.kind == "write" and op.append for op in ops) and any(op.offset == 2000 for op in ops)
    assert len({int(op.call.split("pid ")[1].split()[0]) for op in ops}) == 2  # main thread + the writer thread
    materialize(ops, _full(ops), tmp_path / "full", base)
    real = _tree(out)
    assert _tree(tmp_path / "full") == real
    assert real["base.log"] == b"from before\nappended 1\nappended 2\n" and "base.drop" not in real
    assert len(real["sub/bin"]) == 2256 and real["sub/bin"][647:2000] == bytes(1353)  # the hole reads as zeros
    assert real["sub/bin"][7:18] == b"SEVENthread"
    # every prefix materialises, and from_json(to_json) of each state materialises the same tree
    for st in enumerate_states(ops):
        if st.kind == "prefix":
            materialize(ops, CrashState.from_json(st.to_json()), tmp_path / "p", base)
            shutil.rmtree(tmp_path / "p")


@needs_strace
@pytest.mark.parametrize("dirsync", [False, True])
def test_rename_is_lost_without_a_directory_fsync(tmp_path: Path, dirsync: bool) -> None:
    _, rec, out, base = _record(tmp_path, DURABLE, {}, "marker", *([] if dirsync else ["nodirsync"]))
    ops = fs_ops(rec, out)
    rename = next(i for i, op in enumerate(ops) if op.kind == "rename")
    lost = [st for st in enumerate_states(ops) if st.kind == "lost-dirent" and st.detail["op"] == rename]
    at_end = [st for st in lost if st.prefix == len(ops)]
    if dirsync:
        assert not at_end
    else:
        assert len(at_end) == 1
        materialize(ops, at_end[0], tmp_path / "lost", base)
        assert _tree(tmp_path / "lost") == {"final.tmp": NEW, "COMMITTED": b"1"}  # committed, yet no "final"
        assert "directory was not fsynced" in at_end[0].describe()


# a directory "new" written durably, then swapped with the existing "final" by renameat2(RENAME_EXCHANGE)
EXCHANGE = r'''
import os, sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from reference.disk.fsutil import exchange
d = sys.argv[1]
os.mkdir(os.path.join(d, "new"))
fd = os.open(os.path.join(d, "new", "data"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, bytes(range(256)) * 3); os.fsync(fd); os.close(fd)
for sub in ("new", "."):
    dfd = os.open(os.path.join(d, sub), os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
assert exchange(Path(d, "new"), Path(d, "final"))
if "dirsync" in sys.argv:
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
print("OK", flush=True)
'''


@needs_strace
@pytest.mark.parametrize("dirsync", [False, True])
def test_an_atomic_exchange_leaves_old_or_new_under_the_name_in_every_state(tmp_path: Path, dirsync: bool) -> None:
    """How the reference saves a name again: every power-loss state has the old or the new directory under the
    name (and the other under the staging name); the exchange is lost only without a directory fsync after it."""
    repo = str(Path(__file__).resolve().parent.parent)
    _, rec, out, base = _record_dirs(tmp_path, EXCHANGE, repo, *(["dirsync"] if dirsync else []))
    ops = fs_ops(rec, out)
    assert [op.kind for op in ops].count("exchange") == 1
    full = dict(_states_trees(tmp_path, ops, [_full(ops)], base))
    assert next(iter(full.values())) == _tree(out)  # the model's end state is the real directory
    seen, at_end = set(), set()
    for st, tree in _states_trees(tmp_path, ops, enumerate_states(ops), base):
        assert tree.get("final/data") in (OLD, NEW), (st.describe(), tree)
        seen.add(tree["final/data"])
        if st.prefix == len(ops):
            at_end.add(tree["final/data"])
    assert seen == {OLD, NEW}
    assert at_end == ({NEW} if dirsync else {OLD, NEW})  # once durable, only a lost directory entry undoes it


def _record_dirs(tmp_path: Path, source: str, *args: str):
    """``_record`` with a base holding the directory ``final`` (one file of OLD bytes)."""
    script = tmp_path / "writer.py"
    script.write_text(source)
    out, base = tmp_path / "out", tmp_path / "base"
    (base / "final").mkdir(parents=True)
    (base / "final" / "data").write_bytes(OLD)
    shutil.copytree(base, out)
    rec = strace.record([sys.executable, str(script), str(out), *args], capture_data=True, timeout=TIMEOUT)
    assert rec.returncode == 0 and "OK" in rec.stdout_tail, rec.stderr_tail
    return None, rec, out, base


@needs_strace
def test_truncated_capture_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strace, "CAPTURE_LIMIT", 64)  # strace -s 64: the 300-byte write is cut off
    _, rec, out, _ = _record(tmp_path, DURABLE, {})
    with pytest.raises(FaultSpecError, match=r"call #\d+ .*write.*cut off"):
        fs_ops(rec, out)


def _ops(text: str, root: str = "/r") -> list[FsOp]:
    return fs_ops(strace.parse_trace(text)[0], root)


SYNTHETIC = """\
10 clone(child_stack=0x7f, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM) = 11
10 mkdir("/r/sub", 0777) = 0
10 chdir("/r/sub") = 0
10 mkdir("deep", 0777) = 0
10 openat(AT_FDCWD</r/sub>, "../f", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/f>
11 write(3</r/f>, "ab", 2) = 2
10 write(3</r/f>, "cd", 2) = 2
10 write(3</r/f>, "xx", 2) = -1 ENOSPC (No space left on device) (INJECTED)
10 write(3</r/f>, "yy", 2 <unfinished ...>
11 write(1</dev/pts/0>, "hi", 2) = 2
10 <... write resumed>) = ?
10 fcntl(3</r/f>, F_DUPFD_CLOEXEC, 0) = 4</r/f>
10 write(4</r/f>, "ef", 2) = 2
10 openat(AT_FDCWD</r/sub>, "../g", O_WRONLY|O_CREAT, 0644) = 5</r/g>
10 unlink("/r/g") = 0
10 write(5</r/g>(deleted), "zz", 2) = 2
10 openat(AT_FDCWD</tmp>, "/tmp/x", O_WRONLY|O_CREAT, 0644) = 6</tmp/x>
10 write(6</tmp/x>, "q", 1) = 1
10 renameat2(AT_FDCWD</r/sub>, "/r/f", AT_FDCWD</r/sub>, "/r/h", RENAME_NOREPLACE) = 0
10 write(3</r/h>, "\\x67\\x68", 2) = 2
10 pwrite64(3</r/h>, "P", 1, 10) = 1
10 rename("/r/nothere", "/r/x") = -1 ENOENT (No such file or directory)
"""


def test_synthetic_trace_offsets_threads_dup_deleted_failed_and_outside_calls(tmp_path: Path) -> None:
    ops = _ops(SYNTHETIC)
    assert [op.describe() for op in ops] == [
        "mkdir sub", "mkdir sub/deep", "open f (O_CREAT|O_TRUNC)", "write f @0 +2 bytes", "write f @2 +2 bytes",
        "write f @4 +2 bytes", "open g (O_CREAT)", "unlink g", "write g @0 +2 bytes", "rename f -> h",
        "write h @6 +2 bytes", "write h @10 +1 bytes"]
    materialize(ops, _full(ops), tmp_path / "t")
    assert _tree(tmp_path / "t") == {"sub": None, "sub/deep": None, "h": b"abcdefgh\0\0P"}
    states = enumerate_states(ops)
    assert states == enumerate_states(ops) and len({st.id for st in states}) == len(states)
    assert [st.prefix for st in states] == sorted(st.prefix for st in states)
    for st in states:
        assert CrashState.from_json(st.to_json()) == st == CrashState.from_json(json.loads(st.to_json()))
        assert st.describe().startswith(st.id + ": ") and "\n" not in st.describe()
    limited = enumerate_states(ops, limit=5)
    n = len(ops)
    assert limited.total == len(states) and limited.dropped == len(states) - len(limited) > 0
    assert [st for st in states if st.kind == "prefix" or st.prefix == n] == \
        [st for st in limited if st.kind == "prefix" or st.prefix == n]
    assert enumerate_states(ops, limit=10_000) == states and enumerate_states(ops, limit=10_000).dropped == 0


# Two writer processes forked from one parent each open the same file at the same fd number: their offsets are
# their own, and one's close leaves the other's fd open. A forked child shares its parent's open description.
PROCESSES = """\
10 openat(AT_FDCWD</r>, "/r/log", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 4</r/log>
10 write(4</r/log>, "p", 1) = 1
10 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 20
10 clone3({flags=CLONE_VM|CLONE_VFORK, exit_signal=SIGCHLD, stack=0x7f, stack_size=0x9000}, 88) = 30
20 openat(AT_FDCWD</r>, "/r/f", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 3</r/f>
30 openat(AT_FDCWD</r>, "/r/f", O_WRONLY|O_CREAT, 0644) = 3</r/f>
20 write(3</r/f>, "abcd", 4) = 4
30 write(3</r/f>, "xy", 2) = 2
20 close(3</r/f>) = 0
30 write(3</r/f>, "z", 1) = 1
20 write(4</r/log>, "c", 1) = 1
10 write(4</r/log>, "P", 1) = 1
31 write(3</r/f>, "!", 1) = 1
"""


def test_each_process_has_its_own_fd_table_and_a_fork_shares_its_parents_offsets() -> None:
    ops = fs_ops(strace.parse_trace(PROCESSES.replace("31 write", "30 write"))[0], "/r")
    assert [op.describe() for op in ops] == [
        "open log (O_CREAT|O_TRUNC)", "write log @0 +1 bytes", "open f (O_CREAT|O_TRUNC)", "open f (O_CREAT)",
        "write f @0 +4 bytes", "write f @0 +2 bytes", "write f @2 +1 bytes", "write log @1 +1 bytes",
        "write log @2 +1 bytes", "write f @3 +1 bytes"]
    # A thread of process 30 that was running when the recording started: the recording says whose table it uses.
    recording = strace.Recording([], 0, [], strace.parse_trace(PROCESSES)[0], "", "", False, 0.0)
    with pytest.raises(FaultSpecError, match="unknown offset"):
        fs_ops(recording, "/r")
    recording = strace.Recording([], 0, [], strace.parse_trace(PROCESSES)[0], "", "", False, 0.0, processes={31: 30})
    assert [op.describe() for op in fs_ops(recording, "/r")][-1] == "write f @3 +1 bytes"


@pytest.mark.parametrize(("text", "match"), [
    ('10 openat(AT_FDCWD</r>, "f", O_WRONLY|O_CREAT, 0644) = 3</r/f>\n10 write(3</r/f>, "abc"..., 100) = 100',
     "cut off"),
    ('10 openat(AT_FDCWD</r>, "f", O_WRONLY|O_CREAT, 0644) = 3</r/f>\n10 write(3</r/f>, "abc", 5) = 5', "cut off"),
    ('10 link("/r/a", "/r/b") = 0', "links"),
    ('10 symlinkat("a", AT_FDCWD</r>, "b") = 0', "links"),
    ('10 mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, 3</r/f>, 0) = 0x7f0000000000', "mapping"),
    ('10 rename("/tmp/a", "/r/b") = 0', "outside the root"),
    ('10 unlink("x") = 0', "unknown working directory"),
    ('10 write(7</r/f>, "a", 1) = 1', "unknown offset"),
    ('10 openat(AT_FDCWD</r>, "t", O_RDWR|O_TMPFILE, 0600) = 3</r/#1>', "O_TMPFILE"),
    ('10 renameat2(AT_FDCWD</r>, "a", AT_FDCWD</r>, "b", RENAME_WHITEOUT) = 0', "WHITEOUT"),
])
def test_calls_the_model_cannot_express_are_typed_errors(text: str, match: str) -> None:
    with pytest.raises(FaultSpecError, match=match):
        _ops(text)


def test_ops_outside_the_root_and_a_plain_mmap_are_ignored() -> None:
    text = ('10 mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, 3</r/f>, 0) = 0x7f0000000000\n'
            '10 link("/tmp/a", "/tmp/b") = 0\n10 unlink("/rr/x") = 0\n10 unlinkat(AT_FDCWD</>, "r/y", 0) = 0')
    assert [op.describe() for op in _ops(text)] == ["unlink y"]


def test_bad_state_json_dest_and_base_are_typed_errors(tmp_path: Path) -> None:
    ops = _ops(SYNTHETIC)
    good = json.loads(_full(ops).to_json())
    bad = ["not json", "[1]", {**good, "kind": "meteor"}, {**good, "prefix": -1}, {**good, "prefix": 99},
           {**good, "extra": 1}, {k: v for k, v in good.items() if k != "shape"}, {**good, "id": "prefix@0"},
           {**good, "kind": "lost-data"}, {**good, "kind": "lost-dirent", "detail": {"op": len(ops)}},
           {**good, "kind": "torn-half", "prefix": 2, "detail": {"op": 3}}, {**good, "n_ops": True},
           {**good, "detail": []}, {**good, "kind": "lost-all-data", "detail": {"paths": []}}]
    for data in bad:
        with pytest.raises(FaultSpecError):
            CrashState.from_json(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(FaultSpecError, match="ops"):
        state_matches(ops[:-1], _full(ops))
    with pytest.raises(FaultSpecError, match="ops"):
        materialize(ops[:-1], _full(ops), tmp_path / "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_bytes(b"")
    with pytest.raises(FaultSpecError, match="empty"):
        materialize(ops, _full(ops), tmp_path / "busy")
    base = tmp_path / "base"
    base.mkdir()
    (base / "real").write_bytes(b"x")
    os.symlink("real", base / "link")
    with pytest.raises(FaultSpecError, match="symlink"):
        materialize(ops, _full(ops), tmp_path / "y", base)
    # a base that is not the directory the trace started from: ops cannot apply
    unlink = _ops('10 unlink("/r/missing") = 0')
    with pytest.raises(FaultSpecError, match="cannot apply"):
        materialize(unlink, _full(unlink), tmp_path / "z", tmp_path / "busy")


WIDE = r'''
import os, sys
d = sys.argv[1]
for i in range(6):
    tmp, final = os.path.join(d, "shard%d.tmp" % i), os.path.join(d, "shard%d" % i)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for k in range(3):
        os.write(fd, bytes([i * 16 + k]) * 4096)
    if i % 2 == 0:
        os.fsync(fd)
    os.close(fd)
    os.rename(tmp, final)
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY); os.fsync(dfd); os.close(dfd)
print("OK", flush=True)
'''


@needs_strace
def test_states_per_second_on_a_40_op_trace(tmp_path: Path) -> None:
    _, rec, out, base = _record(tmp_path, WIDE, {"shard0": OLD})
    ops = fs_ops(rec, out)
    assert 30 <= len(ops) <= 45
    t0 = time.perf_counter()
    states = enumerate_states(ops)
    t_enum = time.perf_counter() - t0
    t0 = time.perf_counter()
    trees = sum(1 for _ in _states_trees(tmp_path, ops, states, base))
    t_mat = time.perf_counter() - t0
    by_kind = {k: sum(st.kind == k for st in states) for k in dict.fromkeys(st.kind for st in states)}
    print(f"{len(ops)} ops -> {len(states)} states {by_kind}; enumerate {t_enum * 1e3:.1f} ms; "
          f"materialise {trees / t_mat:.0f} states/s ({t_mat * 1e3 / trees:.2f} ms each, 6 x 12 KiB files)")
    assert trees == len(states)
