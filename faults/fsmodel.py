"""File-system operations and the in-memory file system that crash states are computed on (faults/crashstates.py).

An :class:`FsOp` is one effect a recorded syscall had under the root directory, with paths relative to that root.
A :class:`Model` applies ops to inodes: directories map names to inodes, files hold content plus the content that
was durable at their last fsync. Renames move names, unlink drops them, and ops made through an fd act on the
inode the fd was opened on (its ``handle``), not on whatever carries the name now, as the kernel does.

Two kinds of content, one model:

* ``Model.real(base)``: bytes. The base directory is scanned (names only; a base file's bytes are read on its
  first modification and otherwise copied when the tree is written out). Used to materialise one state.
* ``Model.symbolic(...)``: no bytes, only a hash chain of the edits a file received, and a base that is assumed
  rather than read: a name the full recorded run used without creating it is taken to be a base entry. Used to
  enumerate and deduplicate states cheaply; two states with equal :meth:`Model.key` have equal content for any
  base that fits the recording (the converse need not hold, so a few duplicates can survive).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FaultSpecError

OP_KINDS = ("open", "write", "truncate", "fsync", "sync", "rename", "exchange", "unlink", "mkdir", "rmdir",
            "move-out")


@dataclass(frozen=True)
class FsOp:
    """One file-system effect of a recorded syscall; ``path`` is relative to the root ("" is the root itself).

    ``handle`` (write/truncate/fsync made through an fd) is the index, in the same op list, of the ``open`` whose
    file the fd refers to; None when the fd was opened before the recording started (then ``path`` addresses it).
    ``offset`` is the file offset of a write (ignored when ``append``), ``length`` the size a truncate sets.
    ``is_dir`` says the opened/renamed object is a directory (O_DIRECTORY, or inferred from the other paths).
    """

    kind: str
    path: str
    call: str = ""
    seq: int = -1
    handle: int | None = None
    new_path: str = ""
    offset: int = 0
    length: int = 0
    data: bytes = field(default=b"", repr=False)
    append: bool = False
    create: bool = False
    trunc: bool = False
    excl: bool = False
    is_dir: bool = False

    def describe(self) -> str:
        p = self.path or "."
        if self.kind == "open":
            flags = [f for f, on in (("O_CREAT", self.create), ("O_TRUNC", self.trunc), ("O_EXCL", self.excl),
                                     ("dir", self.is_dir)) if on]
            return f"open {p}" + (f" ({'|'.join(flags)})" if flags else "")
        if self.kind == "write":
            where = "append" if self.append else f"@{self.offset}"
            return f"write {p} {where} +{len(self.data)} bytes"
        if self.kind == "truncate":
            return f"truncate {p} to {self.length}"
        if self.kind == "rename":
            return f"rename {p} -> {self.new_path or '.'}"
        if self.kind == "exchange":
            return f"exchange {p} <-> {self.new_path or '.'}"
        if self.kind == "sync":
            return "sync"
        return f"{self.kind} {p}"


# --- content -----------------------------------------------------------------------------------------------


class Digest:
    """Symbolic content: a hash chain over the edits since the file was empty (or since it was base ``origin``)."""

    __slots__ = ("h",)

    def __init__(self, h: str = "empty") -> None:
        self.h = h

    def _then(self, *parts: object) -> Digest:
        return Digest(hashlib.sha256("\0".join((self.h, *map(str, parts))).encode()).hexdigest()[:32])

    def write(self, offset: int, data: bytes, dkey: str) -> Digest:
        return self._then("w", offset, dkey) if data else self

    def append(self, data: bytes, dkey: str) -> Digest:
        return self._then("a", dkey) if data else self

    def truncate(self, length: int) -> Digest:
        return Digest() if length == 0 else self._then("t", length)

    def snapshot(self) -> Digest:
        return self

    def key(self) -> str:
        return self.h

    def __deepcopy__(self, memo: dict) -> Digest:
        return self  # immutable


class Bytes:
    """Real content: a base file ``src`` read lazily on first modification, or a buffer."""

    __slots__ = ("buf", "src")

    def __init__(self, src: str | None = None, buf: bytearray | None = None) -> None:
        self.src, self.buf = src, buf

    def _load(self) -> bytearray:
        if self.buf is None:
            self.buf = bytearray(Path(self.src).read_bytes() if self.src else b"")
        return self.buf

    def write(self, offset: int, data: bytes, dkey: str) -> Bytes:
        buf = self._load()
        if len(buf) < offset:
            buf.extend(bytes(offset - len(buf)))  # writing past the end leaves a hole of zeros
        buf[offset:offset + len(data)] = data
        return self

    def append(self, data: bytes, dkey: str) -> Bytes:
        self._load().extend(data)
        return self

    def truncate(self, length: int) -> Bytes:
        buf = self._load()
        if length < len(buf):
            del buf[length:]
        else:
            buf.extend(bytes(length - len(buf)))
        return self

    def snapshot(self) -> Bytes:
        return Bytes(self.src, None if self.buf is None else bytearray(self.buf))

    def write_to(self, path: Path) -> None:
        if self.buf is None and self.src:
            shutil.copyfile(self.src, path)
        else:
            path.write_bytes(bytes(self.buf or b""))


class DataKeys:
    """Digest of each written buffer, computed once and shared by every symbolic walk (never deep-copied)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[bytes, str]] = {}

    def __call__(self, data: bytes) -> str:
        hit = self._seen.get(id(data))
        if hit is None or hit[0] is not data:
            hit = self._seen[id(data)] = (data, hashlib.sha256(data).hexdigest()[:32])  # keeps data alive
        return hit[1]

    def __deepcopy__(self, memo: dict) -> DataKeys:
        return self


# --- inodes and the model ----------------------------------------------------------------------------------


class File:
    __slots__ = ("content", "dirty", "durable")

    def __init__(self, content: Digest | Bytes) -> None:
        self.content, self.durable, self.dirty = content, content.snapshot(), False


class Dir:
    """``origin``: the base path this directory had (symbolic mode: names not in ``entries`` and not yet
    ``consumed`` may still exist in the base); None for a directory created by the recording (or in real mode)."""

    __slots__ = ("consumed", "entries", "origin")

    def __init__(self, origin: str | None = None) -> None:
        self.entries: dict[str, File | Dir] = {}
        self.origin, self.consumed = origin, set()


Node = File | Dir


def _join(a: str, b: str) -> str:
    return f"{a}/{b}" if a else b


def _split(path: str) -> tuple[str, str]:
    head, _, tail = path.rpartition("/")
    return head, tail


class Model:
    """Names → inodes, plus what a crash needs: per-file durable content and dirty flag, and ``pending``: for each
    directory-changing op (by index) the directories that still need an fsync before the change is durable."""

    def __init__(self, symbolic: bool, keys: DataKeys | None = None, base_names: set[str] | None = None,
                 learn: bool = False) -> None:
        self.symbolic, self.keys, self.learn = symbolic, keys or DataKeys(), learn
        self.base_names: set[str] = base_names if base_names is not None else set()
        self.root = Dir("" if symbolic else None)
        self.handles: dict[int, Node] = {}
        self.files: list[File] = []
        self.pending: dict[int, set[Dir]] = {}
        self._fresh: str | None = None

    @classmethod
    def symbolic_model(cls, keys: DataKeys, base_names: Iterable[str] | None = None) -> Model:
        """``base_names`` None: the walk of the whole recording, which learns (into ``base_names``) the base entries
        it uses; otherwise a walk that may find exactly those base entries."""
        if base_names is None:
            return cls(True, keys, set(), learn=True)
        return cls(True, keys, set(base_names))

    @classmethod
    def real(cls, base: Path | None) -> Model:
        """A model of ``base`` as it is on disk (everything durable); symlinks and special files are refused."""
        m = cls(False)
        if base is None:
            return m
        base = Path(base)
        if base.is_symlink() or not base.is_dir():
            raise FaultSpecError(f"base {base}: not a directory (or a symlink)")

        def load(d: Dir, directory: Path) -> None:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = d.entries[e.name] = Dir()
                    load(sub, Path(e.path))
                elif stat.S_ISREG(st.st_mode):
                    f = d.entries[e.name] = File(Bytes(e.path))
                    m.files.append(f)
                else:
                    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file or directory"
                    raise FaultSpecError(f"base {base}: {e.path} is {kind}; crash states copy plain trees only")

        load(m.root, base)
        return m

    # --- lookups -----------------------------------------------------------------------------------------

    def _empty(self) -> Digest | Bytes:
        return Digest() if self.symbolic else Bytes(buf=bytearray())

    def _touch(self, d: Dir, name: str, is_dir: bool, creating: bool) -> None:
        """Symbolic mode: bring base entry ``name`` of ``d`` into the model the first time it is used.

        A name first used by a creating op stays out (the recording creates it) but is remembered in ``_fresh``:
        an O_CREAT open of it may have found an existing base file, so its content starts as an opaque symbol.
        """
        self._fresh = None
        if d.origin is None or name in d.entries or name in d.consumed:
            return
        d.consumed.add(name)
        path = _join(d.origin, name)
        if self.learn:
            if creating:
                self._fresh = path
                return
            self.base_names.add(path)
        elif path not in self.base_names:
            self._fresh = path
            return
        if is_dir:
            d.entries[name] = Dir(path)
        else:
            f = d.entries[name] = File(Digest("base:" + path))
            self.files.append(f)

    def _dir(self, path: str) -> Dir | None:
        d = self.root
        for part in path.split("/") if path else ():
            self._touch(d, part, True, False)
            nxt = d.entries.get(part)
            if not isinstance(nxt, Dir):
                return None
            d = nxt
        return d

    def _entry(self, path: str, is_dir: bool = False, creating: bool = False) -> tuple[Dir | None, str, Node | None]:
        """(parent dir, name, node or None) of ``path``; parent None when it does not resolve."""
        if not path:
            return None, "", self.root
        head, name = _split(path)
        d = self._dir(head)
        if d is None:
            return None, name, None
        self._touch(d, name, is_dir, creating)
        return d, name, d.entries.get(name)

    def lookup(self, path: str, is_dir: bool = False) -> Node | None:
        return self._entry(path, is_dir)[2]

    def _target(self, op: FsOp) -> Node | None:
        if op.handle is not None:
            return self.handles.get(op.handle)
        return self.lookup(op.path, op.is_dir)

    # --- applying ops ------------------------------------------------------------------------------------

    def apply(self, i: int, op: FsOp, data: bytes | None = None) -> bool:
        """Apply ``op`` (index ``i``; ``data`` overrides a write's bytes); False when it cannot apply here."""
        kind = op.kind
        if kind == "sync":
            for f in self.files:
                f.durable, f.dirty = f.content.snapshot(), False
            self.pending.clear()
            return True
        if kind == "open":
            return self._open(i, op)
        if kind in ("write", "truncate", "fsync"):
            node = self._target(op)
            if node is None:
                return False
            if kind == "fsync":
                self._fsync(node)
                return True
            if not isinstance(node, File):
                return False
            if kind == "truncate":
                node.content = node.content.truncate(op.length)
            else:
                data = op.data if data is None else data
                if not data:
                    return True
                dkey = self.keys(data) if self.symbolic else ""
                node.content = (node.content.append(data, dkey) if op.append
                                else node.content.write(op.offset, data, dkey))
            node.dirty = True
            return True
        if kind == "rename":
            return self._rename(i, op)
        if kind == "exchange":
            return self._exchange(i, op)
        parent, name, node = self._entry(op.path, op.is_dir or kind == "rmdir", creating=kind == "mkdir")
        if parent is None:
            return False
        if kind == "mkdir":
            if node is not None:
                return False
            parent.entries[name] = Dir()
        elif (node is None or (kind == "unlink" and isinstance(node, Dir))
              or (kind == "rmdir" and (not isinstance(node, Dir) or node.entries))):
            return False
        else:  # unlink, rmdir, move-out
            del parent.entries[name]
        self.pending[i] = {parent}
        return True

    def _fsync(self, node: Node) -> None:
        if isinstance(node, File):
            node.durable, node.dirty = node.content.snapshot(), False
            return
        for j in list(self.pending):
            self.pending[j].discard(node)
            if not self.pending[j]:
                del self.pending[j]

    def _open(self, i: int, op: FsOp) -> bool:
        parent, name, node = self._entry(op.path, op.is_dir, creating=op.create)
        if node is None:
            if parent is None or not op.create:
                return False
            fresh = self._fresh if op.path else None  # unseen name: maybe an existing base file (or nothing)
            node = parent.entries[name] = File(Digest("maybe:" + fresh) if fresh is not None else self._empty())
            self.files.append(node)
            self.pending[i] = {parent}
        elif (op.create and op.excl) or (isinstance(node, Dir) and op.trunc):
            return False  # O_EXCL on an existing name; O_TRUNC on a directory
        if op.trunc and isinstance(node, File):
            node.content, node.dirty = node.content.truncate(0), True
        self.handles[i] = node  # ``is_dir`` is only a hint (often inferred): it never makes an open fail
        return True

    def _rename(self, i: int, op: FsOp) -> bool:
        sp, sname, node = self._entry(op.path, op.is_dir)
        if sp is None or node is None:
            return False
        dp, dname, old = self._entry(op.new_path, op.is_dir, creating=True)
        if dp is None or op.new_path.startswith(op.path + "/"):
            return False
        if old is node:
            return True  # same name (or same inode): rename is a no-op
        if old is not None:
            if isinstance(node, Dir) and (not isinstance(old, Dir) or old.entries):
                return False
            if isinstance(node, File) and isinstance(old, Dir):
                return False
        del sp.entries[sname]
        dp.entries[dname] = node
        self.pending[i] = {sp, dp}
        return True

    def _exchange(self, i: int, op: FsOp) -> bool:
        """renameat2(RENAME_EXCHANGE): both names exist, and each now names the other's inode."""
        sp, sname, a = self._entry(op.path, op.is_dir)
        dp, dname, b = self._entry(op.new_path, op.is_dir)
        if sp is None or dp is None or a is None or b is None:
            return False
        if a is not b:
            sp.entries[sname], dp.entries[dname] = b, a
        self.pending[i] = {sp, dp}
        return True

    # --- crash views ---------------------------------------------------------------------------------------

    def tree(self) -> list[tuple[str, Node]]:
        """(path, node) of every named inode, depth first, names sorted (deterministic)."""
        out: list[tuple[str, Node]] = []

        def walk(d: Dir, prefix: str) -> None:
            for name in sorted(d.entries):
                node = d.entries[name]
                out.append((prefix + name, node))
                if isinstance(node, Dir):
                    walk(node, prefix + name + "/")

        walk(self.root, "")
        return out

    def dirty_files(self) -> list[str]:
        """Paths of named files holding data written since their last fsync (or sync)."""
        return [p for p, n in self.tree() if isinstance(n, File) and n.dirty]

    def revert(self, paths: Iterable[str]) -> bool:
        """Power loss for these files' data: each goes back to its durable content. False if one is missing."""
        for p in paths:
            node = self.lookup(p)
            if not isinstance(node, File):
                return False
            node.content, node.dirty = node.durable.snapshot(), False
        return True

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def key(self) -> tuple:
        """Content identity of the named tree (symbolic mode); untouched base entries are left out."""
        out: list[tuple] = []

        def walk(d: Dir, prefix: str) -> None:
            if d.origin is not None:
                gone = sorted(n for n in d.consumed - d.entries.keys() if _join(d.origin, n) in self.base_names)
                if gone:
                    out.append((prefix, "gone", tuple(gone)))
            for name in sorted(d.entries):
                node, here = d.entries[name], None if d.origin is None else _join(d.origin, name)
                if isinstance(node, Dir):
                    if node.origin is None or node.origin != here:
                        out.append((prefix + name, "dir", node.origin))
                    walk(node, prefix + name + "/")
                elif node.content.key() != f"base:{here}":
                    out.append((prefix + name, node.content.key()))

        walk(self.root, "")
        return tuple(out)

    def write_tree(self, dest: Path) -> None:
        """Write the named tree (real mode) into the existing, empty directory ``dest``."""
        for path, node in self.tree():
            target = dest / path
            if isinstance(node, Dir):
                target.mkdir()
            else:
                assert isinstance(node.content, Bytes)
                node.content.write_to(target)
