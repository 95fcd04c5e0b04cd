"""Post-commit corruption injectors (docs/design.md §6): bit flips, truncation, appended garbage, deleted files, stale
lock/marker files and zeroed byte ranges, applied to a committed checkpoint directory.

Format-agnostic on purpose (§1): an injector sees a directory of files, never a safetensors header or an index.
Every fault is plain JSON-able data (``Corruption``) drawn from a seed by ``plan``, so a finding can quote it and
``apply`` can replay it byte for byte. Apply faults to a copy (``copy_tree``) so the original checkpoint stays
intact and the run "heals" by deleting the copy.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path, PurePosixPath

from .errors import FaultSpecError, spec_object

KINDS = ("bitflip", "truncate", "append", "delete", "stale_marker", "zero_range")
REGIONS = ("any", "head", "tail")
HEAD_BYTES = 4096  # headers of most formats live in the first few KiB
TAIL_BYTES = 4096  # footers, trailing data, the last written (and most often torn) bytes
MAX_GARBAGE = 64  # appended / zeroed run lengths stay small: a fault, not a rewrite
# Names crashed saves of common engines leave behind; none is special to this module.
MARKER_NAMES = (".lock", "LOCK", "done", ".done", "COMMITTED", "_SUCCESS", ".complete", ".metadata.tmp")
_NEEDS_BYTES = frozenset({"bitflip", "truncate", "zero_range"})  # kinds that need a non-empty target file


@dataclass(frozen=True)
class Corruption:
    """One post-commit fault. ``path`` is relative to the checkpoint dir (POSIX separators).

    bitflip: XOR bit ``bit`` of byte ``offset``. truncate: cut the file to ``length`` bytes. append: add ``length``
    bytes derived from ``seed``. delete: unlink. stale_marker: create ``path`` holding ``content``.
    zero_range: overwrite ``length`` bytes at ``offset`` with zeros.
    """

    kind: str
    path: str
    offset: int = 0
    bit: int = 0
    length: int = 0
    seed: int = 0
    content: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultSpecError(f"field 'kind': {self.kind!r} is not one of {', '.join(KINDS)}")
        check_relpath(self.path)
        for name in ("offset", "bit", "length", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FaultSpecError(f"field {name!r}: expected a non-negative integer, got {value!r}")
        if self.bit > 7:
            raise FaultSpecError(f"field 'bit': {self.bit} is not a bit of a byte (0-7)")
        if self.kind in ("append", "zero_range") and self.length == 0:
            raise FaultSpecError(f"field 'length': {self.kind} needs at least one byte")
        if not isinstance(self.content, str):
            raise FaultSpecError(f"field 'content': expected a string, got {type(self.content).__name__}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping | str) -> Corruption:
        """Parse a dict (or its JSON text); unknown or missing fields are a ``FaultSpecError`` naming the field."""
        data = spec_object(data, "corruption spec", (f.name for f in fields(cls)), ("kind", "path"))
        return cls(**data)

    def describe(self) -> str:
        what = {
            "bitflip": f"flip bit {self.bit} of byte {self.offset}",
            "truncate": f"truncate to {self.length} bytes",
            "append": f"append {self.length} garbage bytes",
            "delete": "delete",
            "stale_marker": f"leave stale marker ({len(self.content)} bytes)",
            "zero_range": f"zero bytes [{self.offset}, {self.offset + self.length})",
        }[self.kind]
        return f"{what}: {self.path}"


def check_relpath(path: object) -> str:
    """A target must be a non-empty relative path that stays inside the checkpoint dir."""
    if not isinstance(path, str) or not path:
        raise FaultSpecError(f"field 'path': expected a non-empty relative path, got {path!r}")
    if "\0" in path or "\\" in path:
        raise FaultSpecError(f"field 'path': {path!r} contains NUL or a backslash")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise FaultSpecError(f"field 'path': {path!r} is absolute; it must be relative to the checkpoint dir")
    if any(part in ("..", ".") for part in path.split("/")) or not pure.parts or str(pure) != path:
        raise FaultSpecError(f"field 'path': {path!r} is not a normalised path inside the checkpoint dir")
    return path


# --- listing and planning ----------------------------------------------------------------------------------


def eligible_files(ckpt_dir: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every regular file under ``ckpt_dir``, sorted; symlinks (files or dirs) skipped."""
    out: list[tuple[str, int]] = []

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                walk(Path(entry.path), rel + "/")
            elif entry.is_file(follow_symlinks=False):
                out.append((rel, entry.stat(follow_symlinks=False).st_size))

    walk(Path(ckpt_dir), "")
    return out


def _offset(rng: random.Random, size: int, region: str) -> int:
    """An offset in [0, size) biased by region; size must be positive."""
    if region == "head":
        return rng.randrange(min(size, HEAD_BYTES))
    if region == "tail":
        return rng.randrange(max(0, size - TAIL_BYTES), size)
    return rng.randrange(size)


def plan(ckpt_dir: Path, kind: str, seed: int, region: str = "any") -> Corruption:
    """Deterministically draw one corruption of ``kind`` for the files now in ``ckpt_dir``.

    The rng is seeded with (kind, region, seed) as a string, which Python hashes with SHA-512: the same inputs
    give the same spec in any process, independent of PYTHONHASHSEED.
    """
    if kind not in KINDS:
        raise FaultSpecError(f"field 'kind': {kind!r} is not one of {', '.join(KINDS)}")
    if region not in REGIONS:
        raise FaultSpecError(f"region {region!r} is not one of {', '.join(REGIONS)}")
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise FaultSpecError(f"{ckpt_dir}: not a directory")
    rng = random.Random(f"{kind}/{region}/{seed}")
    if kind == "stale_marker":
        taken = {rel for rel, _ in eligible_files(ckpt_dir)}
        free = [n for n in MARKER_NAMES if n not in taken and not os.path.lexists(ckpt_dir / n)]
        if not free:
            raise FaultSpecError(f"{ckpt_dir}: every stale marker name already exists")
        content = "" if rng.random() < 0.5 else f"{rng.randrange(2, 1 << 22)}\n"  # empty, or a pid-file
        return Corruption("stale_marker", rng.choice(free), content=content)
    files = [(rel, size) for rel, size in eligible_files(ckpt_dir) if size > 0 or kind not in _NEEDS_BYTES]
    if not files:
        need = "regular, non-symlink" + (", non-empty" if kind in _NEEDS_BYTES else "")
        raise FaultSpecError(f"{ckpt_dir}: no eligible file for {kind} ({need})")
    rel, size = files[rng.randrange(len(files))]
    if kind == "bitflip":
        return Corruption(kind, rel, offset=_offset(rng, size, region), bit=rng.randrange(8))
    if kind == "truncate":
        return Corruption(kind, rel, length=_offset(rng, size, region))
    if kind == "zero_range":
        offset = _offset(rng, size, region)
        return Corruption(kind, rel, offset=offset, length=rng.randint(1, min(MAX_GARBAGE, size - offset)))
    if kind == "append":
        return Corruption(kind, rel, length=rng.randint(1, MAX_GARBAGE), seed=rng.randrange(1 << 32))
    return Corruption(kind, rel)  # delete


def enumerate_corruptions(
    ckpt_dir: Path, kinds: Iterable[str] = KINDS, seeds_per_kind: int = 4, region: str = "any"
) -> list[Corruption]:
    """``plan`` for seeds 0..seeds_per_kind-1 of every kind, duplicates dropped, order kept (deterministic)."""
    out: list[Corruption] = []
    seen: set[Corruption] = set()
    for kind in kinds:
        for seed in range(seeds_per_kind):
            c = plan(ckpt_dir, kind, seed, region)
            if c not in seen:
                seen.add(c)
                out.append(c)
    return out


# --- applying ----------------------------------------------------------------------------------------------


def garbage(seed: int, length: int) -> bytes:
    """The bytes ``append`` writes: a pure function of (seed, length) so a replay writes the same bytes."""
    return random.Random(seed).randbytes(length)


def _open_parent(ckpt_dir: Path, rel: str) -> tuple[int, str]:
    """fd of the directory holding ``rel`` and its last component, walking component by component with
    O_NOFOLLOW so no symlinked directory can lead outside ``ckpt_dir``."""
    parts = check_relpath(rel).split("/")
    try:
        fd = os.open(ckpt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FaultSpecError(f"{ckpt_dir}: cannot open the checkpoint dir ({exc.strerror})") from None
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise _refusal(exc, ckpt_dir, rel) from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _refusal(exc: OSError, ckpt_dir: Path, rel: str) -> FaultSpecError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FaultSpecError(f"field 'path': {rel!r} in {ckpt_dir} goes through a symlink or non-directory")
    if exc.errno == errno.ENOENT:
        return FaultSpecError(f"field 'path': {rel!r} does not exist in {ckpt_dir}")
    if exc.errno == errno.EEXIST:
        return FaultSpecError(f"field 'path': {rel!r} already exists in {ckpt_dir}")
    return FaultSpecError(f"field 'path': cannot open {rel!r} in {ckpt_dir} ({exc.strerror})")


def _open_file(dir_fd: int, name: str, flags: int, ckpt_dir: Path, rel: str) -> tuple[int, int]:
    """Open an existing regular file without following links; returns (fd, size)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, ckpt_dir, rel) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FaultSpecError(f"field 'path': {rel!r} in {ckpt_dir} is not a regular file")
    return fd, st.st_size


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def apply(ckpt_dir: Path, corruption: Corruption) -> None:
    """Perform ``corruption`` inside ``ckpt_dir`` and make it durable (fsync the file and its directory).

    Refuses (``FaultSpecError``) symlinks, paths through symlinked directories, non-regular files and offsets
    outside the file, so a replay against a changed directory fails loudly instead of doing something else.
    """
    c = corruption
    ckpt_dir = Path(ckpt_dir)
    dir_fd, name = _open_parent(ckpt_dir, c.path)
    try:
        if c.kind == "delete":
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _refusal(exc, ckpt_dir, c.path) from None
            if not stat.S_ISREG(st.st_mode):
                raise FaultSpecError(f"field 'path': {c.path!r} in {ckpt_dir} is not a regular file")
            os.unlink(name, dir_fd=dir_fd)
        elif c.kind == "stale_marker":
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(exc, ckpt_dir, c.path) from None
            try:
                _pwrite_all(fd, c.content.encode(), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            fd, size = _open_file(dir_fd, name, os.O_RDWR, ckpt_dir, c.path)
            try:
                _modify(fd, size, c, ckpt_dir)
                os.fsync(fd)
            finally:
                os.close(fd)
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _modify(fd: int, size: int, c: Corruption, ckpt_dir: Path) -> None:
    where = f"{c.path!r} in {ckpt_dir} ({size} bytes)"
    if c.kind == "bitflip":
        if c.offset >= size:
            raise FaultSpecError(f"field 'offset': {c.offset} is past the end of {where}")
        (byte,) = os.pread(fd, 1, c.offset)
        _pwrite_all(fd, bytes([byte ^ (1 << c.bit)]), c.offset)
    elif c.kind == "truncate":
        if c.length >= size:
            raise FaultSpecError(f"field 'length': truncating to {c.length} would not shorten {where}")
        os.ftruncate(fd, c.length)
    elif c.kind == "append":
        _pwrite_all(fd, garbage(c.seed, c.length), size)
    elif c.kind == "zero_range":
        if c.offset + c.length > size:
            raise FaultSpecError(f"field 'length': [{c.offset}, {c.offset + c.length}) runs past the end of {where}")
        _pwrite_all(fd, bytes(c.length), c.offset)
    else:  # pragma: no cover - kinds are validated in Corruption
        raise FaultSpecError(f"field 'kind': {c.kind!r} cannot modify a file")


# --- healing: work on copies, compare by digest ------------------------------------------------------------


def corrupt(ckpt_dir: Path, kind: str, seed: int, region: str = "any") -> Corruption:
    """Draw a corruption for the files now in ``ckpt_dir`` (``plan``) and apply it; returns the concrete spec, which
    replays it with ``apply`` wherever the files are the same."""
    corruption = plan(ckpt_dir, kind, seed, region)
    apply(ckpt_dir, corruption)
    return corruption


def copy_tree(src: Path, dst: Path) -> Path:
    """Copy a checkpoint root (links copied as links, never followed) so faults hit the copy, not the original."""
    shutil.copytree(src, dst, symlinks=True)
    return Path(dst)


def snapshot(ckpt_dir: Path) -> dict[str, str]:
    """relative path → sha256 of every regular file (symlinks skipped), to prove an original was left intact."""
    out = {}
    for rel, _ in eligible_files(ckpt_dir):
        h = hashlib.sha256()
        with open(Path(ckpt_dir) / rel, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(chunk)
        out[rel] = h.hexdigest()
    return out
