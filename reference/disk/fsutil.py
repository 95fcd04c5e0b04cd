"""Filesystem primitives shared by the writer and the reader: durable writes, and opens that refuse links,
FIFOs and devices (a hostile checkpoint directory must not make a load follow a link or block forever)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import MalformedMetadata, UnsafePath

SMALL_FILE_LIMIT = 16 * 1024 * 1024  # index and manifests; larger is hostile (decoding it would cost ~10x in RAM)


_IO_ERRORS = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR})


def open_regular(path: Path) -> tuple[int, int]:
    """Open ``path`` read-only as a regular file; returns (fd, size). Raises UnsafePath for links and non-files,
    FileNotFoundError when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath("is a symbolic link", path) from None
        if exc.errno in _IO_ERRORS:  # the disk or the process, not the path: never evidence about the checkpoint
            raise
        raise UnsafePath(f"cannot open safely ({exc.strerror})", path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePath("is not a regular file", path)
    return fd, st.st_size


def read_small_file(path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The whole of a small regular file, opened without blocking (a FIFO is refused, never waited on) and read
    only when fstat says it fits ``limit``."""
    fd, size = open_regular(path)
    try:
        if size > limit:
            raise MalformedMetadata(f"is {size} bytes, more than the {limit}-byte limit for metadata", path)
        chunks, remaining = [], size
        while remaining > 0:
            chunk = os.read(fd, remaining)  # never more than fstat said: a file growing meanwhile stays bounded
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Create ``path`` (must not exist) with ``data`` and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux ``renameat2(RENAME_EXCHANGE)``): replacing a committed
    checkpoint by a new one of the same name leaves one or the other under the name, at every instant and after
    any crash. False where the platform or file system cannot (nothing changed then)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
