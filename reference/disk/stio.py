"""Safetensors files written and read by hand: streaming writes with per-block checksums, and reads of only the
byte ranges a load needs, checked against hostile headers.

The safetensors library builds a whole file in memory and reads whole tensors; a reference engine that must read
only needed byte ranges, never follow links and survive lying headers needs its own small reader. Files stay
readable by the safetensors library (tests check it).
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..dtypes import DTYPES, DType
from ..errors import ChecksumMismatch, CorruptCheckpoint, HeaderTooLarge
from .fsutil import SMALL_FILE_LIMIT, open_regular
from .index import checked_shape
from .strictjson import Record, as_int, loads

HEADER_LIMIT = SMALL_FILE_LIMIT  # below safetensors' own 100 MiB cap: a header decodes to ~10x its size in RAM
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
DEFAULT_BLOCK = 1 << 20  # checksum granularity: partial reads verify whole blocks
_IO_CHUNK = 64 << 20  # largest single write
_READ_CHUNK = 4 << 20  # unit of parallel read + verify


@dataclass(frozen=True)
class Entry:
    key: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class WrittenEntry:
    key: str
    offset: int
    nbytes: int
    crcs: list[int]


def block_crcs(data: memoryview, block: int) -> list[int]:
    return [zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)] or [zlib.crc32(b"")]


def _bytes_of(bits: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(bits)).cast("B")


def write_file(
    path: Path, entries: list[tuple[str, DType, tuple[int, ...], np.ndarray]], block: int = DEFAULT_BLOCK
) -> tuple[list[WrittenEntry], int, int]:
    """Write a safetensors file, fsync it; return entries with checksums, file size and header crc32.

    Checksums of each tensor are computed on a helper thread while the previous tensor is being written
    (zlib and os.write both release the GIL), so checksumming costs little wall time.
    """
    header: dict[str, dict] = {}
    cursor = 0
    for key, dt, shape, bits in entries:
        nbytes = int(bits.nbytes)
        header[key] = {"dtype": dt.name, "shape": list(shape), "data_offsets": [cursor, cursor + nbytes]}
        cursor += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    prefix = struct.pack("<Q", len(raw)) + raw
    data_start = len(prefix)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    written: list[WrittenEntry] = []
    try:
        _write_all(fd, memoryview(prefix))
        with ThreadPoolExecutor(1) as pool:
            pending = []
            for key, _dt, _shape, bits in entries:
                view = _bytes_of(bits)
                pending.append((key, header[key]["data_offsets"][0], len(view), pool.submit(block_crcs, view, block)))
                _write_all(fd, view)
            written = [WrittenEntry(k, data_start + off, n, fut.result()) for k, off, n, fut in pending]
        os.fsync(fd)
    finally:
        os.close(fd)
    return written, data_start + cursor, zlib.crc32(prefix)


def _write_all(fd: int, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        pos += os.write(fd, view[pos : pos + _IO_CHUNK])


class SafetensorsReader:
    """An open safetensors file whose size and header checksum match the index (when given) and whose header has
    been parsed strictly and checked against the file's real size: entries tile the data section exactly, so no
    two share a byte."""

    def __init__(self, path: Path, size: int | None = None, header_crc32: int | None = None) -> None:
        self.path = path
        self.fd, self.size = open_regular(path)
        try:
            if size is not None and self.size != size:
                raise CorruptCheckpoint(f"file is {self.size} bytes, the index says {size}", path)
            self.header_bytes, self.entries = self._parse_header(header_crc32)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def _parse_header(self, header_crc32: int | None) -> tuple[bytes, dict[str, Entry]]:
        if self.size < 8:
            raise CorruptCheckpoint(f"file is {self.size} bytes, too short for a safetensors header", self.path)
        (length,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
        if length > HEADER_LIMIT or length > self.size - 8:
            raise HeaderTooLarge(f"header claims {length} bytes but the file has {self.size}", self.path)
        raw = os.pread(self.fd, length, 8)
        if len(raw) != length:
            raise CorruptCheckpoint(f"short read of the header ({len(raw)} of {length} bytes)", self.path)
        prefix = struct.pack("<Q", length) + raw
        if header_crc32 is not None and zlib.crc32(prefix) != header_crc32:
            raise CorruptCheckpoint("safetensors header checksum mismatch", self.path)  # before parsing a byte
        top = Record(loads(raw, self.path, "safetensors header"), self.path, "header")
        data_start = 8 + length
        entries = {key: self._entry(key, meta, data_start) for key, meta in top.data.items() if key != "__metadata__"}
        if "__metadata__" in top.data:
            top.mapping("__metadata__")
        spans = sorted((e.offset, e.offset + e.nbytes, e.key) for e in entries.values())
        end = data_start
        for begin, stop, key in spans:
            if begin != end:
                raise CorruptCheckpoint(
                    f"entry {key!r} starts at byte {begin}, not where the previous one ends ({end}): entries "
                    "must tile the data section",
                    self.path,
                )
            end = stop
        if end != self.size:
            raise CorruptCheckpoint(f"entries end at byte {end} of a {self.size}-byte file", self.path)
        return prefix, entries

    def _entry(self, key: str, meta: object, data_start: int) -> Entry:
        rec = Record(meta, self.path, f"header[{key!r}]", _ENTRY_KEYS)
        code = rec.string("dtype")
        if code not in DTYPES:
            raise CorruptCheckpoint(f"malformed header entry for {key!r}: unknown dtype {code!r}", self.path)
        dt = DTYPES[code]
        shape = checked_shape(rec.array("shape"), dt, self.path, rec.field("shape"))
        bounds = rec.array("data_offsets")
        if len(bounds) != 2:
            raise CorruptCheckpoint(f"malformed header entry for {key!r}: data_offsets is not [begin, end]", self.path)
        begin, end = (as_int(v, self.path, f"{rec.field('data_offsets')}[{i}]") for i, v in enumerate(bounds))
        nbytes = math.prod(shape) * dt.itemsize
        if not begin <= end or end - begin != nbytes or data_start + end > self.size:
            raise CorruptCheckpoint(
                f"entry {key!r} claims bytes [{begin}, {end}) for {nbytes} bytes of data in a {self.size}-byte file",
                self.path,
            )
        return Entry(key, dt, shape, data_start + begin, nbytes)

    def read_blocks(
        self,
        entry: Entry,
        out: memoryview,
        out_byte0: int,
        blocks: list[tuple[int, int]],
        block: int,
        crcs: list[int],
        pool: Executor,
    ) -> None:
        """Read block ranges [b0, b1) of ``entry`` into ``out`` (which holds entry bytes from ``out_byte0``) and
        verify every block's crc32 before returning.

        Work is cut into chunks of a few MiB, each read and checksummed by one pool worker while its bytes are
        still in cache; with two workers reading and checksumming overlap across chunks."""
        per_chunk = max(1, _READ_CHUNK // block)
        jobs = []
        for b0, b1 in blocks:
            for c0 in range(b0, b1, per_chunk):
                c1 = min(b1, c0 + per_chunk)
                jobs.append(pool.submit(self._read_chunk, entry, out, out_byte0, c0, c1, block, crcs))
        for job in jobs:
            job.result()  # re-raises the first short read or checksum mismatch

    def _read_chunk(
        self, entry: Entry, out: memoryview, out_byte0: int, c0: int, c1: int, block: int, crcs: list[int]
    ) -> None:
        lo, hi = c0 * block, min(c1 * block, entry.nbytes)
        target = out[lo - out_byte0 : hi - out_byte0]
        got = os.preadv(self.fd, [target], entry.offset + lo)
        if got != hi - lo:
            raise CorruptCheckpoint(f"short read of {entry.key!r} ({got} of {hi - lo} bytes)", self.path)
        for i, crc in enumerate(block_crcs(target, block)):
            if crc != crcs[c0 + i]:
                raise ChecksumMismatch(
                    f"checksum mismatch in {entry.key!r}, block {c0 + i} (bytes "
                    f"{(c0 + i) * block}..{min((c0 + i + 1) * block, entry.nbytes)})",
                    self.path,
                )
