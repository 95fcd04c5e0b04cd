"""Crash states after a power loss, ALICE-style (docs/design.md §6 "Crash states"); format-agnostic.

A SIGKILL (faults/crashpoints.py) can only leave a *prefix* of a save's syscalls on disk. A power loss can leave
more: the page cache is gone, so whatever was not yet durable may be missing while later operations survived.
This module turns a recording of a save (``faults.strace.record(..., capture_data=True)``) into file-system ops
under one root (:func:`fs_ops`), enumerates the on-disk states a power loss may leave (:func:`enumerate_states`)
and writes any one of them out as a directory tree (:func:`materialize`) for a fresh process to load and judge.

Persistence model (the abstract, ext4 data=ordered-like model ALICE uses, simplified). With ops 0..n-1:

* **prefix** i (i = 0..n): ops 0..i-1 persisted, nothing after. These are what a process kill can leave.
* **torn-half** / **torn-zero** i: prefix i, then op i, a write, persisted in part: only the first half of its
  bytes, or its full length with the second half zero-filled (one block reached the disk, the next did not).
* **lost-data** i: prefix i, except that one file's data written since its last fsync/fdatasync (or sync) is lost:
  it reverts to its content at that sync (a file created and never synced: empty); names and the other files
  persist. **lost-all-data** i: every such file at once (only when there are at least two).
* **lost-dirent** i: prefix i without one directory-changing op (a create, rename, unlink, mkdir, rmdir) whose
  directory was not fsynced after it within the prefix (a rename needs both directories when they differ).
  Later ops that name a path act on whatever is there; ops that cannot apply are skipped and listed in the state's
  detail. Ops made through an fd act on the file the fd was opened on, as in the kernel.

States are deduplicated by content and ordered deterministically (prefix, then kind, then op/file); prefix
states win a tie, the earliest state wins among the rest. States at prefix n (the save had returned) are
deduplicated only among themselves: the same bytes mean more there, as the save had promised its result.
Durability points: fsync and fdatasync (file or directory fd), sync, and syncfs on an fd under the root;
fdatasync counts as fsync.

Limitations (by design; each is a reason to read a verdict with care, not a silent wrong answer where avoidable):

* mmap'ed writes never appear in a syscall trace; a traced writable shared ``mmap`` of a file under the root, and
  fallocate, copy_file_range, sendfile, splice, O_TMPFILE, openat2, hard links, symlinks and RENAME_EXCHANGE
  raise :class:`FaultSpecError`. AIO / io_uring writes are invisible too (they are not traced at all).
* No reordering within a file beyond the torn variants, no combinations of faults (one lost file *or* one lost
  directory entry per state), no lost metadata other than names (sizes and modes persist with the data), and no
  block-granular loss: a lost file loses all its unsynced data.
* File offsets are tracked per open file description, reached through a process's fd table by (fd number, path
  of the open file). strace ``-f`` prints thread ids: a thread uses the table of the process it belongs to (known
  for the threads a recording started with, ``Recording.processes``, and from the clone that made a later one), a
  forked child starts with a copy of its parent's table whose fds share the parent's descriptions (and offsets).
  An fd opened before the recording has no known offset until an lseek.
* Relative paths of non-``*at`` calls resolve against the process's working directory as last seen (a traced
  ``chdir``/``fchdir`` or an ``AT_FDCWD<dir>`` it printed). Record with ``capture_data=True``, which also traces
  chdir, fchdir and mkdirat (``strace.STATE_SYSCALLS``); without them a program that changes directory can be
  misread.
* :func:`enumerate_states` sees no base directory: it assumes a base entry wherever the full run used a name it
  did not create, and treats an ``O_CREAT`` open of a name not seen before as a create (a directory entry that
  can be lost) of a file whose old content is unknown. Dedup stays sound (equal keys, equal trees for any
  base), but the ``skipped`` lists in lost-dirent details follow the assumption; :func:`materialize` is exact
  against the real base.
* Symlinks inside the root are not resolved; paths are compared as written (the root is matched both as given
  and as its realpath).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import FaultSpecError, TraceMismatch, spec_object
from .fsmodel import OP_KINDS, DataKeys, FsOp, Model
from .strace import CAPTURE_LIMIT, Recording, Syscall

__all__ = ["KINDS", "OP_KINDS", "CrashState", "FsOp", "StateList", "enumerate_states", "fs_ops",
           "materialize", "ops_shape", "state_matches"]

KINDS = ("prefix", "torn-half", "torn-zero", "lost-data", "lost-all-data", "lost-dirent")
_RANK = {k: i for i, k in enumerate(KINDS)}
_DIRENT_OPS = frozenset({"rename", "exchange", "unlink", "mkdir", "rmdir", "move-out"})

# --- parsing a recording -----------------------------------------------------------------------------------

_QSTR = re.compile(r'^"((?:[^"\\]|\\.)*)"(\.\.\.)?$', re.S)
_IOV = re.compile(r'iov_base="((?:[^"\\]|\\.)*)"(\.\.\.)?')
_FD = re.compile(r"^(AT_FDCWD|-?\d+)(?:<(.*)>)?(\(deleted\))?$", re.S)
_RES = re.compile(r"^(-?\d+)(?:<(.*)>)?(\(deleted\))?")
_CWD = re.compile(r"AT_FDCWD<(.*?)>")
_AT_FDCWD = -100
#: Calls that touch the root without naming it: syncs of every file system, and the cwd relative paths resolve in.
_ROOTLESS = frozenset(("sync", "syncfs", "chdir", "fchdir", "clone", "clone3", "fork", "vfork"))


def _unrooted(args: str) -> bool:
    """Whether an argument is a quoted string that is no absolute path (a relative path, or a write's data): such a
    call is always parsed. ``str.find`` rather than a regular expression: a traced run has tens of thousands."""
    i = 0 if args.startswith('"') else args.find(', "')
    while i >= 0:
        start = i + 1 if i == 0 and args.startswith('"') else i + 3
        if not (args.startswith("/", start) or args.startswith("\\x2f", start)):
            return True
        i = args.find(', "', start)
    return False


def _unescape(s: str) -> bytes:
    return codecs.escape_decode(s.encode("utf-8", "surrogateescape"))[0]


#: What the argument splitter stops at; the text between is skipped at C speed (a write's data runs to kilobytes).
_ARG_MARK = re.compile(r'["\[\]{}()<>,]')


def _closing_quote(args: str, opening: int) -> int:
    """Where the string opened at ``opening`` closes (a quote after an even run of backslashes), or the end of the
    text (strace may cut a string off unclosed). With ``-xx`` no quote is ever escaped: one ``find``."""
    j = opening + 1
    while (j := args.find('"', j)) >= 0:
        b = j - 1
        while b > opening and args[b] == "\\":
            b -= 1
        if (j - 1 - b) % 2 == 0:
            return j
        j += 1
    return len(args)


def _split_args(args: str) -> list[str]:
    """Top-level arguments of strace's argument text (quotes, brackets and ``<path>`` annotations respected)."""
    out, depth, start, pos = [], 0, 0, 0
    while m := _ARG_MARK.search(args, pos):
        ch, pos = m.group(), m.end()
        if ch == '"':
            pos = _closing_quote(args, m.start()) + 1
        elif ch in "[{(<":
            depth += 1
        elif ch in "]})>":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:m.start()].strip())
            start = pos
    out.append(args[start:].strip())
    return out


@dataclass
class _Desc:
    """An open file description: shared by dup'ed fds; ``handle`` is the index of the open op (None: unseen)."""

    handle: int | None
    offset: int | None
    append: bool


class _Parser:
    def __init__(self, root: str, processes: Mapping[int, int] | None = None) -> None:
        r = os.path.normpath(os.path.abspath(root))
        self.roots = tuple(dict.fromkeys((r, os.path.realpath(r))))
        # The root as strace prints it in a path or an fd's annotation: plain, or every byte in hex (``-xx``).
        self.marks = tuple(dict.fromkeys(m for r in self.roots for m in (r, "".join(f"\\x{b:02x}" for b in
                                                                                  os.fsencode(r)))))
        self.cwd: dict[int, str] = {}
        self.last_cwd: str | None = None
        #: (fd table, fd number, path of the open file) -> its description; a table is named by its process's id
        self.descs: dict[tuple[int, int, str], _Desc] = {}
        self.table_of: dict[int, int] = dict(processes or {})  # thread id -> the process whose fd table it uses
        self.ops: list[FsOp] = []
        self.c: Syscall | None = None
        self.seq = -1

    # helpers

    def err(self, why: str) -> FaultSpecError:
        c = self.c
        assert c is not None
        return FaultSpecError(f"call #{self.seq} (pid {c.pid} {c.name}({c.args_summary[:100]}...)): {why}")

    def rel(self, path: str | None) -> str | None:
        if path is None:
            return None
        for r in self.roots:
            if path == r:
                return ""
            if path.startswith(r.rstrip("/") + "/"):
                return path[len(r.rstrip("/")) + 1:]
        return None

    def fd(self, arg: str) -> tuple[int, str | None, bool]:
        m = _FD.match(arg)
        if not m:
            raise self.err(f"cannot read fd argument {arg[:80]!r}")
        fd = _AT_FDCWD if m.group(1) == "AT_FDCWD" else int(m.group(1))
        path = None if m.group(2) is None else os.fsdecode(_unescape(m.group(2)))
        return fd, path, m.group(3) is not None

    def key(self, fd: int, path: str) -> tuple[int, int, str]:
        """Where the calling thread's fd ``fd`` open on ``path`` is found: in its process's table."""
        pid = self.c.pid
        return self.table_of.get(pid, pid), fd, path

    def string(self, arg: str) -> tuple[bytes, bool]:
        m = _QSTR.match(arg)
        if not m:
            raise self.err(f"cannot read string argument {arg[:80]!r}")
        return _unescape(m.group(1)), m.group(2) is not None

    def path(self, dirarg: str | None, patharg: str) -> str:
        """Absolute, normalised path named by (dirfd, path) or by a path relative to the working directory."""
        p = os.fsdecode(self.string(patharg)[0])
        dirfd, dpath = (None, None) if dirarg is None else self.fd(dirarg)[:2]
        if p.startswith("/"):
            base: str | None = "/"
        elif dirfd is not None and dirfd != _AT_FDCWD:
            base = dpath
            if base is None:
                raise self.err("dirfd without a path: record with strace -y")
        else:
            base = dpath or self.cwd.get(self.c.pid) or self.last_cwd
            if base is None:
                raise self.err(f"relative path {p!r} with an unknown working directory")
        full = os.path.normpath(os.path.join(base, p))
        return "/" + full.lstrip("/")

    def result(self) -> tuple[int, str | None, bool]:
        m = _RES.match(self.c.result.strip()) if self.c else None
        if not m:
            raise self.err(f"cannot read the result {self.c.result if self.c else ''!r}")
        path = None if m.group(2) is None else os.fsdecode(_unescape(m.group(2)))
        return int(m.group(1)), path, m.group(3) is not None

    def emit(self, kind: str, path: str, **kw: object) -> int:
        c = self.c
        assert c is not None
        self.ops.append(FsOp(kind, path, call=f"call #{self.seq} (pid {c.pid} {c.name})", seq=self.seq, **kw))
        return len(self.ops) - 1

    # dispatch

    def feed(self, seq: int, c: Syscall) -> None:
        handler = _HANDLERS.get(c.name)
        if handler is None:
            return
        self.c, self.seq = c, seq
        m = _CWD.match(c.args)
        if m:
            self.cwd[c.pid] = self.last_cwd = os.fsdecode(_unescape(m.group(1)))
        if not self.concerns(c):
            return
        res = c.result.strip()
        if c.killed or not _RES.match(res) or res.startswith("-"):
            return  # killed (took no effect) or failed
        handler(self, _split_args(c.args))

    def concerns(self, c: Syscall) -> bool:
        """Whether the call may touch the root: it names a path or an fd under it, a path relative to a cwd, or
        none at all (``_ROOTLESS``). Most calls of a traced run are the framework's imports and logs (a spawned
        writer imports its framework again): they are passed over before their arguments are split."""
        if any(m in c.args or m in c.result for m in self.marks) or c.name in _ROOTLESS:
            return True
        return _unrooted(c.args)

    def on_open(self, a: list[str]) -> None:
        name = self.c.name
        if name == "creat":
            dirarg, patharg, flagstr = None, a[0], "O_WRONLY|O_CREAT|O_TRUNC"
        elif name == "open":
            dirarg, patharg, flagstr = None, a[0], a[1]
        else:
            dirarg, patharg, flagstr = a[0], a[1], a[2]
        flags = set(flagstr.split("|"))
        full = self.path(dirarg, patharg)
        fd, fdpath, _ = self.result()
        if fdpath is not None:
            self.descs.pop(self.key(fd, fdpath), None)  # the fd number is reused: a new open file
        rel = self.rel(full)
        if rel is None:
            return
        if "O_TMPFILE" in flagstr:
            raise self.err("O_TMPFILE is not modelled")
        if fdpath is None:
            raise self.err("open without the fd's path: record with strace -y")
        idx = self.emit("open", rel, create="O_CREAT" in flags, trunc="O_TRUNC" in flags, excl="O_EXCL" in flags,
                        is_dir="O_DIRECTORY" in flags)
        self.descs[self.key(fd, fdpath)] = _Desc(idx, 0, "O_APPEND" in flags)

    def on_write(self, a: list[str]) -> None:
        name = self.c.name
        fd, fdpath, deleted = self.fd(a[0])
        rel = self.rel(fdpath)
        if rel is None:
            return
        ret = self.result()[0]
        if name in ("write", "pwrite64"):
            data, cut = self.string(a[1])
        else:
            parts = _IOV.findall(a[1])
            data, cut = b"".join(_unescape(p) for p, _ in parts), any(dots for _, dots in parts) or "..." in a[1][-6:]
        if cut or len(data) < ret:
            raise self.err(f"written buffer cut off in the trace ({len(data)} of {ret} bytes printed; more than "
                           f"strace -s {CAPTURE_LIMIT} or not recorded with capture_data=True)")
        data = data[:ret]
        desc = self.descs.get(self.key(fd, fdpath))
        append = (desc is not None and desc.append) or (name == "pwritev2" and "RWF_APPEND" in a[4])
        positional = name in ("pwrite64", "pwritev") or (name == "pwritev2" and int(a[3]) != -1)
        offset = int(a[3]) if positional else 0
        if append:
            if desc is not None and not positional:
                desc.offset = None  # the file's end, which this parser does not know
        elif not positional:
            if desc is None or desc.offset is None:
                raise self.err("write at an unknown offset (fd opened before the recording and never lseek'ed)")
            offset = desc.offset
            desc.offset += ret
        handle = desc.handle if desc is not None else None
        if ret and not (deleted and handle is None):  # an unlinked file without a handle: nothing to address
            self.emit("write", rel, handle=handle, offset=offset, data=data, append=append)

    def on_lseek(self, a: list[str]) -> None:
        fd, fdpath, _ = self.fd(a[0])
        if self.rel(fdpath) is not None:
            self.descs.setdefault(self.key(fd, fdpath), _Desc(None, None, False)).offset = self.result()[0]

    def on_fd_op(self, a: list[str]) -> None:
        """ftruncate, fsync, fdatasync, syncfs."""
        fd, fdpath, deleted = self.fd(a[0])
        rel = self.rel(fdpath)
        if rel is None:
            return
        if self.c.name == "syncfs":
            self.emit("sync", "")
            return
        desc = self.descs.get(self.key(fd, fdpath))
        handle = desc.handle if desc is not None else None
        if deleted and handle is None:
            return
        if self.c.name == "ftruncate":
            self.emit("truncate", rel, handle=handle, length=int(a[1]))
        else:
            self.emit("fsync", rel, handle=handle)

    def on_truncate(self, a: list[str]) -> None:
        rel = self.rel(self.path(None, a[0]))
        if rel is not None:
            self.emit("truncate", rel, length=int(a[1]))

    def on_sync(self, a: list[str]) -> None:
        self.emit("sync", "")

    def on_rename(self, a: list[str]) -> None:
        if self.c.name == "rename":
            src, dst = self.path(None, a[0]), self.path(None, a[1])
        else:
            src, dst = self.path(a[0], a[1]), self.path(a[2], a[3])
        exchange = self.c.name == "renameat2" and "RENAME_EXCHANGE" in a[4]
        rs, rd = self.rel(src), self.rel(dst)
        moved = {}
        for table, fd, p in list(self.descs):  # open files follow their new name (both ways for an exchange)
            if p == src or p.startswith(src + "/"):
                moved[(table, fd, dst + p[len(src):])] = self.descs.pop((table, fd, p))
            elif exchange and (p == dst or p.startswith(dst + "/")):
                moved[(table, fd, src + p[len(dst):])] = self.descs.pop((table, fd, p))
        self.descs.update(moved)
        if rs is None and rd is None:
            return
        if self.c.name == "renameat2" and "RENAME_WHITEOUT" in a[4]:
            raise self.err("RENAME_WHITEOUT is not modelled")
        if rs == "" or rd == "":
            raise self.err("renames the root directory itself")
        if rs is None or (exchange and rd is None):
            raise self.err("moves a file from outside the root in: its content is not in the recording")
        if exchange:
            self.emit("exchange", rs, new_path=rd)
        elif rd is None:
            self.emit("move-out", rs)
        else:
            self.emit("rename", rs, new_path=rd)

    def on_remove(self, a: list[str]) -> None:
        """unlink, unlinkat (AT_REMOVEDIR too), rmdir."""
        name = self.c.name
        full = self.path(a[0], a[1]) if name == "unlinkat" else self.path(None, a[0])
        rel = self.rel(full)
        if rel is None:
            return
        if rel == "":
            raise self.err("removes the root directory itself")
        is_dir = name == "rmdir" or (name == "unlinkat" and "AT_REMOVEDIR" in a[2])
        self.emit("rmdir" if is_dir else "unlink", rel)

    def on_mkdir(self, a: list[str]) -> None:
        rel = self.rel(self.path(a[0], a[1]) if self.c.name == "mkdirat" else self.path(None, a[0]))
        if rel is not None:
            self.emit("mkdir", rel)

    def on_link(self, a: list[str]) -> None:
        new = {"link": (None, 1), "symlink": (None, 1), "linkat": (2, 3), "symlinkat": (1, 2)}[self.c.name]
        full = self.path(None if new[0] is None else a[new[0]], a[new[1]])
        if self.rel(full) is not None:
            raise self.err("hard links and symlinks are not modelled")

    def on_close(self, a: list[str]) -> None:
        fd, fdpath, _ = self.fd(a[0])
        if fdpath is not None:
            self.descs.pop(self.key(fd, fdpath), None)

    def on_fork(self, a: list[str]) -> None:
        """A thread (or a clone sharing the fd table) uses its parent's table; a forked child starts with a copy of
        it whose fds share the parent's open file descriptions."""
        child = int(self.result()[0])
        table = self.table_of.get(self.c.pid, self.c.pid)
        if "CLONE_FILES" in self.c.args or "CLONE_THREAD" in self.c.args:
            self.table_of[child] = table
            return
        self.table_of[child] = child
        for (owner, fd, path), desc in list(self.descs.items()):
            if owner == table:  # the child may have run (and opened) before its parent's clone returned
                self.descs.setdefault((child, fd, path), desc)

    def on_dup(self, a: list[str]) -> None:
        if self.c.name == "fcntl" and not a[1].startswith("F_DUPFD"):
            return
        fd, fdpath, _ = self.fd(a[0])
        new, newpath, _ = self.result()
        desc = self.descs.get(self.key(fd, fdpath or ""))
        if desc is not None and newpath is not None:
            self.descs[self.key(new, newpath)] = desc

    def on_chdir(self, a: list[str]) -> None:
        where = self.fd(a[0])[1] if self.c.name == "fchdir" else self.path(None, a[0])
        if where is not None:
            self.cwd[self.c.pid] = self.last_cwd = where

    def on_unsupported_fd(self, a: list[str]) -> None:
        """Calls that change a file in ways the model cannot express, when they target a file under the root."""
        name = self.c.name
        if name in ("mmap", "mmap2"):
            if "PROT_WRITE" not in a[2] or "MAP_SHARED" not in a[3]:
                return
            target = a[4]
        else:
            target = a[2] if name in ("copy_file_range", "splice") else a[0]
        if _FD.match(target) and self.rel(self.fd(target)[1]) is not None:
            why = "writes through a shared mapping are invisible to strace" if name.startswith("mmap") else \
                "not modelled"
            raise self.err(f"{name} on a file under the root: {why}")

    def on_openat2(self, a: list[str]) -> None:
        if self.rel(self.path(a[0], a[1])) is not None:
            raise self.err("openat2 is not modelled")

    def finish(self) -> list[FsOp]:
        ops = self.ops
        dirs = {""}
        for op in ops:
            for p in (op.path, op.new_path) if op.kind in ("rename", "exchange") else (op.path,):
                parts = p.split("/")
                dirs.update("/".join(parts[:k]) for k in range(1, len(parts)))
            if op.kind in ("mkdir", "rmdir"):
                dirs.add(op.path)
        moves = ("rename", "exchange")
        ops = [replace(op, is_dir=True) if not op.is_dir and op.kind in ("open", *moves, "move-out", "fsync")
               and (op.path in dirs or (op.kind in moves and op.new_path in dirs)) else op for op in ops]
        # opens that neither create nor truncate and whose fd no later op uses change nothing: drop them
        used = {op.handle for op in ops if op.handle is not None}
        keep = [i for i, op in enumerate(ops) if op.kind != "open" or op.create or op.trunc or i in used]
        remap = {old: new for new, old in enumerate(keep)}
        return [replace(ops[i], handle=None if ops[i].handle is None else remap[ops[i].handle]) for i in keep]


_HANDLERS = {
    **dict.fromkeys(("open", "openat", "creat"), _Parser.on_open),
    **dict.fromkeys(("write", "pwrite64", "writev", "pwritev", "pwritev2"), _Parser.on_write),
    "lseek": _Parser.on_lseek,
    **dict.fromkeys(("ftruncate", "fsync", "fdatasync", "syncfs"), _Parser.on_fd_op),
    "truncate": _Parser.on_truncate,
    "sync": _Parser.on_sync,
    **dict.fromkeys(("rename", "renameat", "renameat2"), _Parser.on_rename),
    **dict.fromkeys(("unlink", "unlinkat", "rmdir"), _Parser.on_remove),
    **dict.fromkeys(("mkdir", "mkdirat"), _Parser.on_mkdir),
    **dict.fromkeys(("link", "linkat", "symlink", "symlinkat"), _Parser.on_link),
    "close": _Parser.on_close,
    **dict.fromkeys(("dup", "dup2", "dup3", "fcntl"), _Parser.on_dup),
    **dict.fromkeys(("chdir", "fchdir"), _Parser.on_chdir),
    **dict.fromkeys(("mmap", "mmap2", "fallocate", "copy_file_range", "sendfile", "sendfile64", "splice"),
                    _Parser.on_unsupported_fd),
    "openat2": _Parser.on_openat2,
    **dict.fromkeys(("clone", "clone3", "fork", "vfork"), _Parser.on_fork),
}


def fs_ops(recording: Recording | Sequence[Syscall], root: str | os.PathLike[str]) -> list[FsOp]:
    """The file-system ops a recorded run performed under ``root``, in completion order.

    Reads ``recording.all_calls`` (every traced call; ``FsOp.seq`` indexes it). Failed and killed calls have no
    effect; everything outside ``root`` is ignored. Raises :class:`FaultSpecError` naming the call when a written
    buffer was cut off by the capture limit or the call cannot be expressed (see the module docstring).
    """
    key = os.fspath(root)
    if isinstance(recording, Recording) and key in recording.fs_ops_by_root:
        return list(recording.fs_ops_by_root[key])
    calls = recording.all_calls if isinstance(recording, Recording) else list(recording)
    parser = _Parser(key, recording.processes if isinstance(recording, Recording) else None)
    for seq, c in enumerate(calls):
        parser.feed(seq, c)
    ops = parser.finish()
    if isinstance(recording, Recording):
        recording.fs_ops_by_root[key] = tuple(ops)
    return ops


# A random temporary name (Python's tempfile, the Rust tempfile crate safetensors writes through): another name in
# every run for the same op, so the shape sees only that a temporary file is there.
_TEMP_NAME = re.compile(r"(^|/)(\.?tmp)[A-Za-z0-9_]{6,10}(?=$|/)")


def ops_shape(ops: Sequence[FsOp]) -> str:
    """A short digest of the ops' kinds and paths in order: a state replays only on a trace of the same shape (the
    state's op indices mean the same ops there). Random temporary names are masked."""
    text = "\0".join(op.kind + " " + _TEMP_NAME.sub(r"\1\2*", op.path) for op in ops)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- crash states ------------------------------------------------------------------------------------------


def _int(value: object, name: str, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise FaultSpecError(f"field {name!r}: expected an integer >= {lo}, got {value!r}")
    return value


@dataclass(frozen=True)
class CrashState:
    """One state a power loss may leave: ``kind`` applied at ``prefix`` of a trace of ``n_ops`` ops of ``shape``.

    ``detail`` says which op or file: torn-*: ``op`` (= prefix), ``path``, ``kept`` and ``length`` bytes;
    lost-data: ``path``; lost-all-data: ``paths``; lost-dirent: ``op`` (dropped), ``what``, ``skipped`` (ops that
    could not apply without it, as enumerated against the assumed base).
    """

    kind: str
    prefix: int
    n_ops: int
    shape: str
    detail: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultSpecError(f"field 'kind': {self.kind!r} is not one of {', '.join(KINDS)}")
        _int(self.n_ops, "n_ops")
        _int(self.prefix, "prefix")
        if self.prefix > self.n_ops:
            raise FaultSpecError(f"field 'prefix': {self.prefix} is past the {self.n_ops} ops")
        if not isinstance(self.shape, str) or not self.shape:
            raise FaultSpecError(f"field 'shape': expected a non-empty string, got {self.shape!r}")
        if not isinstance(self.detail, dict):
            raise FaultSpecError(f"field 'detail': expected an object, got {type(self.detail).__name__}")
        d = self.detail
        if self.kind.startswith("torn-"):
            if _int(d.get("op"), "detail.op") != self.prefix or self.prefix >= self.n_ops:
                raise FaultSpecError(f"field 'detail.op': a torn state tears op {self.prefix}, got {d.get('op')!r}")
        elif self.kind == "lost-data":
            if not isinstance(d.get("path"), str):
                raise FaultSpecError(f"field 'detail.path': expected a path, got {d.get('path')!r}")
        elif self.kind == "lost-all-data":
            paths = d.get("paths")
            if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
                raise FaultSpecError(f"field 'detail.paths': expected a list of paths, got {paths!r}")
        elif self.kind == "lost-dirent" and _int(d.get("op"), "detail.op") >= self.prefix:
            raise FaultSpecError(f"field 'detail.op': dropped op {d['op']} is not before prefix {self.prefix}")
        try:
            json.dumps(d)
        except (TypeError, ValueError) as exc:
            raise FaultSpecError(f"field 'detail': not JSON-able ({exc})") from None

    @property
    def id(self) -> str:
        """Stable name, e.g. ``prefix@7``, ``torn-half@3``, ``lost-data@9:a/b``, ``lost-dirent@9:op4``."""
        if self.kind == "lost-data":
            return f"lost-data@{self.prefix}:{self.detail['path']}"
        if self.kind == "lost-dirent":
            return f"lost-dirent@{self.prefix}:op{self.detail['op']}"
        return f"{self.kind}@{self.prefix}"

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "kind": self.kind, "prefix": self.prefix, "n_ops": self.n_ops,
                           "shape": self.shape, "detail": self.detail}, sort_keys=True)

    @classmethod
    def from_json(cls, data: Mapping | str) -> CrashState:
        """Parse a dict (or its JSON text); bad input is a :class:`FaultSpecError` naming the field."""
        known = ("id", "kind", "prefix", "n_ops", "shape", "detail")
        data = spec_object(data, "crash state", known, known[1:])
        state = cls(data["kind"], data["prefix"], data["n_ops"], data["shape"], data["detail"])
        if "id" in data and data["id"] != state.id:
            raise FaultSpecError(f"field 'id': {data['id']!r} does not match the state ({state.id!r})")
        return state

    def describe(self) -> str:
        d, k, i = self.detail, self.kind, self.prefix
        if k == "prefix":
            what = f"ops 0..{i - 1} of {self.n_ops} persisted" if i else f"none of the {self.n_ops} ops persisted"
        elif k.startswith("torn-"):
            rest = "dropped" if k == "torn-half" else "zero-filled"
            what = f"ops 0..{i - 1} persisted, op {i} on {d.get('path')!r} torn: first {d.get('kept')} of " \
                   f"{d.get('length')} bytes written, the rest {rest}"
        elif k == "lost-data":
            what = f"after {i} ops, unsynced data of {d['path']!r} lost (back to its last fsync)"
        elif k == "lost-all-data":
            what = f"after {i} ops, unsynced data of {len(d['paths'])} files lost: {', '.join(d['paths'])}"
        else:
            skipped = d.get("skipped") or []
            what = f"after {i} ops, op {d['op']} ({d.get('what')}) lost: its directory was not fsynced" + \
                (f"; ops {skipped} could not apply without it" if skipped else "")
        return f"{self.id}: {what}"


class StateList(list):
    """The enumerated states; ``total`` counts them before ``limit``, ``dropped`` how many the limit removed."""

    total: int = 0
    dropped: int = 0


def state_matches(ops: Sequence[FsOp], state: CrashState) -> None:
    """Raise :class:`TraceMismatch` unless ``state`` was enumerated from a trace of the same shape as ``ops``."""
    if state.n_ops != len(ops) or state.shape != ops_shape(ops):
        raise TraceMismatch(f"crash state {state.id} is for a trace of {state.n_ops} ops (shape {state.shape}); "
                             f"this one has {len(ops)} ops (shape {ops_shape(ops)})")


def _torn(data: bytes, kind: str) -> bytes:
    half = len(data) // 2
    return data[:half] if kind == "torn-half" else data[:half] + bytes(len(data) - half)


def enumerate_states(ops: Sequence[FsOp], *, limit: int | None = None) -> StateList:
    """Every crash state of the persistence model (module docstring), deduplicated, in a deterministic order.

    With ``limit``, all prefix states and all states at prefix n (right after the save returned) are kept, even
    beyond the limit, and the remaining room is filled with an even spread of the others; ``StateList.dropped``
    says how many were left out.
    """
    ops = list(ops)
    if limit is not None:
        _int(limit, "limit")
    n, shape = len(ops), ops_shape(ops)
    keys = DataKeys()
    full = Model.symbolic_model(keys)
    prefixes: list[tuple[tuple, CrashState]] = []
    others: list[tuple[tuple, CrashState]] = []
    dirent_at: dict[int, list[int]] = {}

    def state(kind: str, i: int, **detail: object) -> CrashState:
        return CrashState(kind, i, n, shape, dict(detail))

    for i in range(n + 1):
        prefixes.append((full.key(), state("prefix", i)))
        op = ops[i] if i < n else None
        if op is not None and op.kind == "write":
            for kind in ("torn-half", "torn-zero"):
                m = full.copy()
                if m.apply(i, op, _torn(op.data, kind)):
                    kept = len(op.data) // 2
                    others.append((m.key(), state(kind, i, op=i, path=op.path, kept=kept, length=len(op.data))))
        dirty = full.dirty_files()
        for path in dirty:
            m = full.copy()
            m.revert([path])
            others.append((m.key(), state("lost-data", i, path=path)))
        if len(dirty) > 1:
            m = full.copy()
            m.revert(dirty)
            others.append((m.key(), state("lost-all-data", i, paths=dirty)))
        for j in sorted(full.pending):
            dirent_at.setdefault(j, []).append(i)
        if op is not None:
            full.apply(i, op)  # the recorded run: every op applied when it was recorded
    for j, at in sorted(dirent_at.items()):
        m, skipped, want = Model.symbolic_model(keys, full.base_names), [], set(at)
        for i in range(max(at) + 1):
            if i in want:
                others.append((m.key(), state("lost-dirent", i, op=j, what=ops[j].describe(), skipped=list(skipped))))
            if i != j and i < n and not m.apply(i, ops[i]):
                skipped.append(i)
    return _select(_dedup(prefixes, others, n), n, limit)


def _order(st: CrashState) -> tuple:
    return st.prefix, _RANK[st.kind], st.detail.get("op", -1), st.detail.get("path", "")


def _dedup(prefixes: list[tuple[tuple, CrashState]], others: list[tuple[tuple, CrashState]],
           n: int) -> list[CrashState]:
    seen: set[tuple] = set()
    out: list[CrashState] = []
    for key, st in [*prefixes, *sorted(others, key=lambda ks: _order(ks[1]))]:  # prefix states win ties
        if (st.prefix == n, key) not in seen:
            seen.add((st.prefix == n, key))
            out.append(st)
    return sorted(out, key=_order)


def _select(states: list[CrashState], n: int, limit: int | None) -> StateList:
    out = StateList(states)
    out.total = len(states)
    if limit is None or len(states) <= limit:
        return out
    must = [k for k, st in enumerate(states) if st.kind == "prefix" or st.prefix == n]
    rest = [k for k, st in enumerate(states) if st.kind != "prefix" and st.prefix != n]
    room = max(0, limit - len(must))
    chosen = set(must) | {rest[(k * len(rest)) // room] for k in range(room)}
    out = StateList(states[k] for k in sorted(chosen))
    out.total, out.dropped = len(states), len(states) - len(chosen)
    return out


# --- materialising -----------------------------------------------------------------------------------------


def materialize(ops: Sequence[FsOp], state: CrashState, dest: Path, base: Path | None = None) -> None:
    """Write the tree ``state`` leaves into ``dest`` (absent or empty), starting from a copy of ``base``.

    ``base`` is the root directory as it was before the recorded run (all of it durable; symlinks and special
    files refused); None means it was empty. Outside lost-dirent states every op must apply: if one cannot, the
    base is not the directory the recording started from, and that is a :class:`FaultSpecError`.
    """
    ops = list(ops)
    state_matches(ops, state)
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise FaultSpecError(f"dest {dest}: must not exist or be an empty directory")
    model = Model.real(base)
    drop = state.detail["op"] if state.kind == "lost-dirent" else None
    for i in range(state.prefix):
        if i != drop and not model.apply(i, ops[i]) and drop is None:
            raise FaultSpecError(f"op {i} ({ops[i].describe()}, {ops[i].call}) cannot apply to base {base}: it is "
                                 "not the directory the recording started from")
    if state.kind.startswith("torn-"):
        op = ops[state.prefix]
        if op.kind != "write" or not model.apply(state.prefix, op, _torn(op.data, state.kind)):
            raise FaultSpecError(f"{state.id}: op {state.prefix} ({op.describe()}) is not a write that applies here")
    elif state.kind in ("lost-data", "lost-all-data"):
        paths = [state.detail["path"]] if state.kind == "lost-data" else state.detail["paths"]
        if not model.revert(paths):
            raise FaultSpecError(f"{state.id}: one of {paths} is not a file after {state.prefix} ops")
    dest.mkdir(parents=True, exist_ok=True)
    model.write_tree(dest)
