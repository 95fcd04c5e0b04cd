"""Persistence-order analysis of one recorded op's IO (after ALICE): the trace itself judged against the durability
contract, whether or not an enumerated power-loss state happens to separate the writes involved.

Two rules, over the op's file-system ops (faults/fsmodel.FsOp, in completion order):

* **A record vouches only for what is durable.** A file that names files or directories the op wrote (an index,
  a metadata file, ``latest``: its bytes contain their names) vouches for them. When it takes its final name (a
  rename) or, written in place, when its bytes are written, every file it names must have had its data fsynced
  after its last write and its directory entry made durable (its directory fsynced after the entry appeared).
* **An acknowledged save is durable when it returns.** At the end of the op every file it wrote must have its data
  fsynced and every entry it created (files, directories, renames) its directory fsynced.

``sync`` makes everything durable. A name shorter than ``MIN_NAME`` characters is not looked for (too many chance
matches), nor one inside a longer word, and a bare name resolves from the record's directory. Files the op writes
and later unlinks (temporaries) are not required to be durable, and a record the op removes before it returns (a
scratch manifest in a private directory) vouches for nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .fsmodel import FsOp

MIN_NAME = 4
RECORD_BEFORE_DATA = "record-before-data"
NOT_DURABLE = "not-durable-at-return"


@dataclass(frozen=True)
class OrderViolation:
    """One broken rule: ``kind``, the ``record`` whose visibility came too early (record-before-data), the
    ``path`` that was not durable, why, and the calls that show it (``FsOp.describe`` with the call's seq)."""

    kind: str
    path: str
    why: str
    record: str = ""
    calls: tuple[str, ...] = ()
    record_id: int = field(default=0, compare=False, repr=False)  # the record's file in this analysis (id of it)

    def render(self) -> str:
        head = (f"{self.record} vouches for {self.path} before it is durable ({self.why})" if self.record
                else f"{self.path} is not durable when the save returns ({self.why})")
        return head + (": " + "; ".join(self.calls) if self.calls else "")


@dataclass
class _Inode:
    is_dir: bool = False
    dirty: FsOp | None = None  # the last write not yet fsynced
    written: bool = False
    content: bytearray = field(default_factory=bytearray)


@dataclass
class _Entry:
    made: FsOp  # the call that put the name in its directory
    durable: bool = False


def _call(op: FsOp) -> str:
    return f"#{op.seq} {op.call or op.kind}: {op.describe()}"


def _parent(path: str) -> str:
    return os.path.dirname(path)


class _Trace:
    """The op's files, names and what of them is durable, as the ops go."""

    def __init__(self) -> None:
        self.names: dict[str, _Inode] = {}  # path -> inode (paths the op touched or made)
        self.entries: dict[str, _Entry] = {}  # path -> the op's own entry for it, while it is not yet durable
        self.handles: dict[int, _Inode] = {}  # open op index -> inode
        self.first_write: dict[int, int] = {}  # id(inode) -> index of its first write
        self.gone: set[int] = set()  # id of inodes unlinked

    def inode(self, path: str, is_dir: bool = False) -> _Inode:
        return self.names.setdefault(path, _Inode(is_dir=is_dir))

    def target(self, op: FsOp) -> _Inode:
        return self.handles.get(op.handle) if op.handle is not None and op.handle in self.handles \
            else self.inode(op.path)

    def move(self, old: str, new: str, swap: bool = False) -> list[str]:
        """Rename ``old`` (a file, or a directory with what lies under it) to ``new``; returns the new paths."""
        def under(root: str, path: str) -> bool:
            return path == root or path.startswith(root + "/")

        going = {p: self.names.pop(p) for p in [p for p in self.names if under(old, p)]}
        coming = {p: self.names.pop(p) for p in [p for p in self.names if under(new, p)]} if swap else {}
        if old not in going:
            going[old] = _Inode()
        moved = {new + p[len(old):]: i for p, i in going.items()}
        self.names.update(moved)
        self.names.update({old + p[len(new):]: i for p, i in coming.items()})
        for p in [p for p in self.entries if under(old, p) and p != old]:
            self.entries[new + p[len(old):]] = self.entries.pop(p)
        self.entries.pop(old, None)
        return sorted(moved)

    def make_entry(self, path: str, op: FsOp) -> None:
        self.entries[path] = _Entry(op)

    def fsync_dir(self, path: str) -> None:
        for name, entry in self.entries.items():
            if _parent(name) == path:
                entry.durable = True

    def sync(self) -> None:
        for inode in self.names.values():
            inode.dirty = None
        for entry in self.entries.values():
            entry.durable = True

    def not_durable(self, path: str) -> tuple[str, tuple[str, ...]] | None:
        """Why ``path`` (a file, or a directory and what the op wrote under it) is not durable now, or None."""
        inode = self.names.get(path)
        if inode is None or inode.is_dir:
            for name in sorted(self.names):
                if name.startswith(path + "/") and id(self.names[name]) not in self.gone and self.names[name].written:
                    problem = self.not_durable(name)
                    if problem is not None:
                        return problem
        if inode is not None and inode.dirty is not None:
            return f"{path}: data written, not fsynced", (_call(inode.dirty),)
        entry = self.entries.get(path)
        if entry is not None and not entry.durable:
            return f"{path}: entry not made durable (its directory not fsynced)", (_call(entry.made),)
        return None


def order_violations(ops: Sequence[FsOp]) -> list[OrderViolation]:
    """Every broken rule of the module docstring in one op's file-system ops, one violation per record and file
    (record-before-data) or per file (not durable at return)."""
    trace, found, seen = _Trace(), [], set()
    # Directories the op renames later (a staging directory): nothing inside one is visible before that rename.
    staged = [(n, op.path) for n, op in enumerate(ops) if op.kind in ("rename", "exchange") and op.path]

    def published(path: str, n: int) -> bool:
        return not any(m > n and path.startswith(old + "/") for m, old in staged)

    in_place: list[tuple[int, int, OrderViolation]] = []  # (inode, write index, violation): kept unless renamed later
    by_rename: list[tuple[int, int, OrderViolation]] = []  # (inode, rename index, violation): kept if its last
    events: list[tuple[int, str, bytes, FsOp, int]] = []  # every publication: index, record, bytes, call, file
    renamed: dict[int, int] = {}  # id(inode) -> index of its last rename
    for n, op in enumerate(ops):
        if op.kind == "open":
            inode = trace.inode(op.path, op.is_dir)
            if op.trunc and not op.is_dir:
                inode.content.clear()
            trace.handles[n] = inode
            if op.create and op.path not in trace.entries:
                trace.make_entry(op.path, op)
        elif op.kind in ("write", "truncate"):
            inode = trace.target(op)
            inode.dirty, inode.written = op, True
            trace.first_write.setdefault(id(inode), n)
            if op.kind == "write":
                inode.content[op.offset:op.offset + len(op.data)] = op.data
                record = _path_of(trace, inode, op.path)
                if published(record, n):
                    in_place += [(id(inode), n, v) for v in _vouching(trace, op, record, n, seen)]
                    events.append((n, record, bytes(inode.content), op, id(inode)))
        elif op.kind == "fsync":
            inode = trace.target(op)
            if inode.is_dir:
                trace.fsync_dir(_path_of(trace, inode, op.path))
            else:
                inode.dirty = None
        elif op.kind == "sync":
            trace.sync()
        elif op.kind in ("rename", "exchange"):
            moved = trace.move(op.path, op.new_path, swap=op.kind == "exchange")
            trace.make_entry(op.new_path, op)
            for path in moved:  # what the rename published: a record, or a directory of them, vouches now
                inode = trace.names[path]
                renamed[id(inode)] = n
                if published(path, n):
                    if inode.is_dir:
                        found += _vouching(trace, op, path, n, seen)
                    else:  # a file renamed on again (tmp -> tmp2 -> final) vouches at its last rename
                        by_rename += [(id(inode), n, v) for v in _vouching(trace, op, path, n, seen)]
                    events.append((n, path, bytes(inode.content), op, id(inode)))
        elif op.kind == "mkdir":
            trace.inode(op.path, True)
            trace.make_entry(op.path, op)
        elif op.kind in ("unlink", "rmdir", "move-out"):
            gone = trace.names.pop(op.path, None)
            if gone is not None:
                trace.gone.add(id(gone))
            trace.entries.pop(op.path, None)
    # A record written under a temporary name and renamed into place vouches at the rename, not at its writes; a
    # file renamed more than once, at its last rename.
    found = ([v for inode, n, v in in_place if renamed.get(inode, -1) < n]
             + [v for inode, n, v in by_rename if renamed[inode] == n] + found)
    # Likewise a publication: a write of a record renamed later publishes nothing, nor does a rename followed by
    # another (the record's name before its last rename is a temporary one).
    events = [e for e in events if renamed.get(e[4], -1) == e[0] or (
        e[3].kind not in ("rename", "exchange") and renamed.get(e[4], -1) < e[0])]
    found += _named_before_written(trace, events, ops, seen)
    found = [v for v in found if v.kind != RECORD_BEFORE_DATA or v.record_id not in trace.gone]
    for path in sorted(trace.names):
        inode = trace.names[path]
        if inode.is_dir or (not inode.written and path not in trace.entries):
            continue
        problem = trace.not_durable(path)
        if problem is not None:
            found.append(OrderViolation(NOT_DURABLE, path, problem[0], calls=problem[1]))
    for path in sorted(trace.entries):
        entry = trace.entries[path]
        if not entry.durable and trace.names.get(path) is not None and trace.names[path].is_dir:
            found.append(OrderViolation(NOT_DURABLE, path, "directory entry not made durable",
                                        calls=(_call(entry.made),)))
    return found


def _named_before_written(trace: _Trace, events: list[tuple[int, str, bytes, FsOp, int]], ops: Sequence[FsOp],
                          seen: set) -> list[OrderViolation]:
    """Records published naming a file the op writes only later: they vouch for data that is not there yet."""
    out = []
    for path, inode in sorted(trace.names.items()):
        first = trace.first_write.get(id(inode))
        if first is None or inode.is_dir or id(inode) in trace.gone:
            continue
        for n, record, content, op, record_id in events:
            if n < first and record != path and _named(record, content, path) and (record, path) not in seen:
                seen.add((record, path))
                out.append(OrderViolation(RECORD_BEFORE_DATA, path, f"{path}: named before it is written", record,
                                          (_call(op), _call(ops[first])), record_id))
    return out


def _named(record: str, content: bytes, path: str) -> bool:
    """Whether ``record``'s bytes name ``path``. A name resolves from the record's own directory: a bare file name
    names a file there or below (an index beside its shards, ``latest`` beside the steps), not a file of the same
    name in a sibling directory (each family's metadata names its own ``0_0.distcp``); a file elsewhere is named
    by its path from the record's directory, or from the root."""
    name = os.path.basename(path)
    if len(name) < MIN_NAME or not _mentions(content, name):
        return False
    home = os.path.dirname(record)
    if not home or path.startswith(home + "/"):
        return True
    return _mentions(content, os.path.relpath(path, home)) or _mentions(content, path)


def _mentions(content: bytes, name: str) -> bool:
    """Whether ``name`` occurs in ``content`` other than inside a longer word: a directory ``optimizer_state`` is
    not named by a pickled option ``fuse_optimizer_states``. Wordy on one side only still counts (a pickled
    string's length byte may be a letter)."""
    text = re.escape(name.encode())
    return re.search(rb"(?<![A-Za-z0-9_])" + text + rb"|" + text + rb"(?![A-Za-z0-9_])", content) is not None


def _path_of(trace: _Trace, inode: _Inode, fallback: str) -> str:
    return next((p for p, i in trace.names.items() if i is inode), fallback)


def _vouching(trace: _Trace, op: FsOp, record: str, n: int, seen: set) -> list[OrderViolation]:
    """The files and directories ``record``'s bytes name (written before it by this op), each not yet durable."""
    inode = trace.names.get(record)
    if inode is None or not inode.content:
        return []
    content = bytes(inode.content)
    out = []
    for path in sorted(trace.names):
        other = trace.names[path]
        if path == record or other is inode or id(other) in trace.gone or record.startswith(path + "/"):
            continue  # itself, gone, or a directory it lies in
        if not _named(record, content, path):
            continue
        if not other.is_dir and trace.first_write.get(id(other), n) >= n:
            continue  # a file the record could not vouch for: not written (by this op) before it
        if other.is_dir and not any(p.startswith(path + "/") and trace.names[p].written for p in trace.names):
            continue
        problem = trace.not_durable(path)
        if problem is not None and (record, path) not in seen:
            seen.add((record, path))
            out.append(OrderViolation(RECORD_BEFORE_DATA, path, problem[0], record, (_call(op), *problem[1]),
                                      id(inode)))
    return out
