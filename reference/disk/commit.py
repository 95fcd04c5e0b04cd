"""How a checkpoint becomes visible: the commit step as one small protocol with two implementations.

``AtomicRename`` writes into a staging directory and renames it to the final name (POSIX filesystems).
``CommitMarker`` writes in place and publishes by writing a marker file last (stores without atomic rename).
Either way a reader sees a checkpoint only once every byte of it is durable. The ``latest`` pointer moves only
after the commit, and rotation never deletes what ``latest`` points at.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import (
    CheckpointError,
    CheckpointExists,
    CheckpointIncomplete,
    CheckpointNotFound,
    CorruptCheckpoint,
    MalformedMetadata,
    UnsafePath,
)
from .fsutil import exchange, fsync_dir, read_small_file, write_durable
from .index import INDEX_NAME, Index, check_safe_name, read_index

_log = logging.getLogger(__name__)
LATEST = "latest"
LATEST_LIMIT = 4096  # a name of at most 255 bytes and its checksum; anything larger is hostile
_POINTER = re.compile(rb"([^\n]{1,1024})\n(crc32:[0-9a-f]{8})\n")
MARKER = "COMMITTED"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"


class CommitProtocol(Protocol):
    name: str

    def staging_dir(self, root: Path, ckpt: str, save_id: str) -> Path: ...

    def finalize(self, staging: Path, final: Path) -> None: ...

    def is_committed(self, ckpt_dir: Path) -> bool: ...


class AtomicRename:
    name = "rename"

    def staging_dir(self, root: Path, ckpt: str, save_id: str) -> Path:
        return root / f"{STAGING_PREFIX}{ckpt}-{save_id}"

    def finalize(self, staging: Path, final: Path) -> None:
        """Publish ``staging`` as ``final``. A name saved again (a job resumed from an older step saves that step
        again) is replaced by one atomic exchange, never in place: until the exchange is durable the old
        checkpoint is the one under the name, and the staging name then holds the old one as debris."""
        fsync_dir(staging)
        if final.exists() or final.is_symlink():
            if final.is_symlink() or not final.is_dir():
                raise UnsafePath("a checkpoint name is taken by something that is not a checkpoint", final)
            if not exchange(staging, final):
                raise CheckpointExists("a checkpoint of this name is already committed (this file system cannot "
                                       "replace it atomically)", final)
            fsync_dir(final.parent)
            shutil.rmtree(staging, ignore_errors=True)
            return
        os.rename(staging, final)
        fsync_dir(final.parent)

    def is_committed(self, ckpt_dir: Path) -> bool:
        return (ckpt_dir / INDEX_NAME).is_file()


class CommitMarker:
    """In place, published by a marker: a name cannot be replaced atomically, so saving it again is refused."""

    name = "marker"

    def staging_dir(self, root: Path, ckpt: str, save_id: str) -> Path:
        if _is_committed_dir(root / ckpt):
            raise CheckpointExists("a checkpoint of this name is already committed", root / ckpt)
        return root / ckpt

    def finalize(self, staging: Path, final: Path) -> None:
        fsync_dir(staging)
        write_durable(final / MARKER, b"")
        fsync_dir(final)

    def is_committed(self, ckpt_dir: Path) -> bool:
        return (ckpt_dir / INDEX_NAME).is_file() and (ckpt_dir / MARKER).is_file()


PROTOCOLS: dict[str, CommitProtocol] = {"rename": AtomicRename(), "marker": CommitMarker()}


def protocol(name: str) -> CommitProtocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise CheckpointError(f"unknown commit protocol {name!r}; known: {', '.join(PROTOCOLS)}") from None


@dataclass
class Scan:
    """What a scan of a root found: committed names → sequence numbers, the newest one's parsed index, and the
    directories it skipped because they could not be read (a bad sibling is reported, never fatal)."""

    found: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, CheckpointError] = field(default_factory=dict)
    newest: tuple[str, Index] | None = None


def scan_checkpoints(root: Path) -> Scan:
    """Every committed checkpoint under ``root``, each index read and verified once. A directory whose index is
    corrupt, hostile or unreadable lands in ``skipped``; an I/O error of the disk itself still propagates (see
    ``committed_index``)."""
    scan = Scan()
    if not root.is_dir():
        return scan
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.name == LATEST or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            index = committed_index(entry)
        except CheckpointError as exc:
            scan.skipped[entry.name] = exc
            continue
        if index is not None:
            scan.found[entry.name] = index.seq
            if scan.newest is None or index.seq > scan.newest[1].seq:
                scan.newest = (entry.name, index)
    return scan


def committed_checkpoints(root: Path) -> dict[str, int]:
    """Committed checkpoint names under ``root`` → their sequence numbers (commit order)."""
    return scan_checkpoints(root).found


def committed_index(ckpt_dir: Path) -> Index | None:
    """The verified index of a committed checkpoint; None when the directory is positively not committed (no
    index, or the marker protocol without its marker); a typed error when its index is corrupt or names another
    checkpoint. An I/O error while reading is *not* evidence either way: it propagates, so that no caller (garbage
    collection above all) takes a committed checkpoint it could not read for debris (found by the fault layer: EIO
    on this read made the next save's collector delete the previous checkpoint)."""
    if not os.path.lexists(ckpt_dir / INDEX_NAME):
        return None
    index = read_index(ckpt_dir, check_cover=False)
    if not PROTOCOLS[index.commit].is_committed(ckpt_dir):
        return None
    if index.name != ckpt_dir.name:
        raise CorruptCheckpoint(f"index names checkpoint {index.name!r} but lives in {ckpt_dir.name!r}", ckpt_dir)
    return index


def read_latest(root: Path) -> str | None:
    """The name ``latest`` points at, or None without a pointer. Read without blocking (a FIFO is refused), at most
    LATEST_LIMIT bytes, and exactly the name, a newline, ``crc32:`` and 8 lowercase hex digits, a newline: any
    other byte is an error."""
    path = root / LATEST
    if path.is_symlink():
        raise UnsafePath("the latest pointer is a symlink", path)
    try:
        raw = read_small_file(path, LATEST_LIMIT)
    except FileNotFoundError:
        return None
    except CheckpointError:
        raise
    except OSError as exc:  # as before: an unreadable pointer is a corrupt one
        raise CorruptCheckpoint(f"latest pointer is unreadable ({exc})", path) from None
    framed = _POINTER.fullmatch(raw)
    if framed is None:
        raise MalformedMetadata("latest pointer is not a name and its checksum", path)
    name = framed.group(1).decode("utf-8", "surrogateescape")
    if framed.group(2).decode() != _pointer_check(name):
        # A flipped bit can turn one valid name into another (step-001 -> step-000): without this check the
        # load would silently return an older, complete checkpoint (found by the stateful machine).
        raise MalformedMetadata("latest pointer fails its checksum", path)
    return check_safe_name(name, "latest pointer target", path)


def _pointer_check(name: str) -> str:
    return f"crc32:{zlib.crc32(name.encode('utf-8', 'surrogateescape')):08x}"


def pointer_text(name: str) -> str:
    """The content of a ``latest`` pointer naming ``name``: the name, then a checksum of it."""
    return f"{name}\n{_pointer_check(name)}\n"


def set_latest(root: Path, name: str, save_id: str) -> None:
    tmp = root / f".latest-{save_id}.tmp"
    write_durable(tmp, pointer_text(name).encode())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def checkpoint_dir(root: Path, name: str | None = None) -> Path:
    """Directory of checkpoint ``name`` (or of the latest one), which must be committed."""
    return open_committed(root, name)[0]


def open_committed(root: Path, name: str | None = None) -> tuple[Path, Index]:
    """Directory and verified index of checkpoint ``name``, else of the one ``latest`` names, else of the newest
    committed one (siblings that cannot be read are skipped and logged). The index is read once."""
    if name is not None:
        ckpt = root / check_safe_name(name, "checkpoint name", root)
        if not ckpt.exists():
            raise CheckpointNotFound(f"no checkpoint named {name!r}", root)
        return ckpt, _require_committed(ckpt, f"checkpoint {name!r}")
    pointed = read_latest(root)
    if pointed is not None:
        ckpt = root / pointed
        return ckpt, _require_committed(ckpt, f"latest pointer target {pointed!r}")
    scan = scan_checkpoints(root)
    for skipped, exc in sorted(scan.skipped.items()):
        _log.warning("skipped unreadable checkpoint %s while looking for the newest: %s", skipped, exc)
    if scan.newest is None:
        unread = f" ({len(scan.skipped)} unreadable skipped: {sorted(scan.skipped)})" if scan.skipped else ""
        raise CheckpointNotFound(f"no committed checkpoint{unread}", root)
    return root / scan.newest[0], scan.newest[1]


def _require_committed(ckpt: Path, what: str) -> Index:
    """The verified index of a directory that should hold a committed checkpoint, or the most specific error."""
    if ckpt.is_symlink():
        raise UnsafePath(f"{what} is a symbolic link", ckpt)
    if not ckpt.is_dir():
        raise CheckpointIncomplete(f"{what} does not exist", ckpt)
    index = committed_index(ckpt)  # raises CorruptCheckpoint / UnsupportedFormatVersion / UnsafePath
    if index is None:
        raise CheckpointIncomplete(f"{what} was never committed (no index or commit marker)", ckpt)
    return index


def _is_committed_dir(ckpt: Path) -> bool:
    """For the collector and the marker protocol: a directory whose index cannot be read counts as uncommitted,
    as an unparseable one always did (a save that crashed while writing it)."""
    if not ckpt.is_dir() or ckpt.is_symlink():
        return False
    try:
        return committed_index(ckpt) is not None
    except CheckpointError:
        return False


def rotate(root: Path, keep_last: int, save_id: str) -> list[str]:
    """Delete all but the newest ``keep_last`` committed checkpoints; never the one ``latest`` names.

    Each victim is first renamed into a trash name (atomic), so a crash mid-delete never leaves a half-deleted
    directory that still looks committed.
    """
    if keep_last < 1:
        raise CheckpointError(f"keep_last must be at least 1, got {keep_last}")
    found = committed_checkpoints(root)
    protected = read_latest(root)
    newest_first = sorted(found, key=found.__getitem__, reverse=True)
    victims = [n for n in newest_first[keep_last:] if n != protected]
    for victim in victims:
        trash = root / f"{TRASH_PREFIX}{victim}-{save_id}"
        os.rename(root / victim, trash)
    if victims:
        fsync_dir(root)
    for victim in victims:
        shutil.rmtree(root / f"{TRASH_PREFIX}{victim}-{save_id}", ignore_errors=True)
    return victims


def collect_garbage(root: Path, keep: set[str], coordinator: int | None = None) -> list[str]:
    """Remove stale staging, trash and pointer temp files left by crashed saves (never those in ``keep``).

    A staging directory may belong to a save still in flight: ranks of a multi-process job write at their own pace,
    and a fast rank may stage the next save while the coordinator still commits this one. The coordinator's own
    saves run one after another, so a staging directory holding a file of the ``coordinator`` rank belongs to a
    save that is over (committed elsewhere, failed or crashed); one without is a save it has not joined yet and
    stays. ``coordinator=None``: this process plays every rank (or every rank is stopped), so nothing else can be
    in flight. Trash and pointer temp files are the coordinator's alone."""
    removed = []
    own = None if coordinator is None else f"rank-{coordinator:05d}."
    for entry in root.iterdir():
        if entry.name in keep:
            continue
        stale_dir = entry.name.startswith((STAGING_PREFIX, TRASH_PREFIX))
        stale_marker_dir = (
            not entry.name.startswith(".")
            and entry.name != LATEST
            and entry.is_dir()
            and not entry.is_symlink()
            and not _is_committed_dir(entry)
            and _looks_like_marker_staging(entry)
        )
        joined = own is None or entry.name.startswith(TRASH_PREFIX) or _holds_file_of(entry, own)
        if ((stale_dir and entry.is_dir() and not entry.is_symlink()) or stale_marker_dir) and joined:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
        elif entry.name.startswith(".latest-") and entry.is_file():
            entry.unlink()
            removed.append(entry.name)
    return removed


def _holds_file_of(entry: Path, prefix: str) -> bool:
    try:
        return entry.is_dir() and any(p.name.startswith((prefix, f".{prefix}")) for p in entry.iterdir())
    except OSError:  # removed meanwhile
        return False


def _looks_like_marker_staging(entry: Path) -> bool:
    """An uncommitted in-place (marker protocol) checkpoint: nothing but our own rank files and index."""
    names = [p.name for p in entry.iterdir()]
    return bool(names) and all(n.startswith("rank-") or n == INDEX_NAME for n in names)
