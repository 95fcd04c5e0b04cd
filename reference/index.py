"""The checkpoint index (format contract, docs/design.md §3): parse and validate untrusted JSON into typed records.

Everything read from disk is treated as hostile: names are checked before they touch the filesystem, regions
are bounds-checked against global shapes, and every tensor's slices must cover it exactly once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .dtypes import DTYPES, DType
from .errors import CorruptCheckpoint, LayoutError, UnsafePath, UnsupportedFormatVersion
from .fsutil import read_small_file
from .layout import Region, region_from_json
from .regions import check_exact_cover

FORMAT = "ckpt-harness-reference"
VERSION = 1
INDEX_NAME = "index.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=-]{0,254}$")


def check_safe_name(name: object, what: str, path: Path | str | None = None) -> str:
    """A file or checkpoint name must be one plain path component: no separators, no '..', no leading dot."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise UnsafePath(f"{what} {name!r} is not a plain name (path traversal or odd characters)", path)
    return name


@dataclass(frozen=True)
class TensorMeta:
    dtype: DType
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SliceRecord:
    tensor: str
    file: str
    key: str
    region: Region
    offset: int
    nbytes: int
    crcs: tuple[int, ...]


@dataclass(frozen=True)
class FileRecord:
    size: int
    header_crc32: int


@dataclass(frozen=True)
class Index:
    name: str
    seq: int
    save_id: str
    world_size: int
    block: int
    commit: str
    meta: dict
    tensors: dict[str, TensorMeta]
    files: dict[str, FileRecord]
    slices: tuple[SliceRecord, ...]

    @cached_property
    def by_tensor(self) -> dict[str, list[SliceRecord]]:
        """Slices grouped by tensor, built once: callers look up every tensor, so a scan each is quadratic."""
        grouped: dict[str, list[SliceRecord]] = {}
        for s in self.slices:
            grouped.setdefault(s.tensor, []).append(s)
        return grouped

    def slices_of(self, tensor: str) -> list[SliceRecord]:
        return list(self.by_tensor.get(tensor, ()))


def read_index(ckpt_dir: Path, check_cover: bool = True) -> Index:
    path = ckpt_dir / INDEX_NAME
    raw = read_small_file(path)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpoint(f"index is not valid JSON ({exc})", path) from None
    return parse_index(data, path, check_cover)


def parse_index(data: object, path: Path, check_cover: bool = True) -> Index:
    """Typed, validated index; ``check_cover=False`` lets a checker inspect a bad cover instead of failing."""
    if not isinstance(data, dict):
        raise CorruptCheckpoint("index is not a JSON object", path)
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise UnsupportedFormatVersion(
            f"index format {data.get('format')!r} version {data.get('version')!r}; this engine reads "
            f"{FORMAT!r} version {VERSION}",
            path,
        )
    try:
        tensors = {name: TensorMeta(DTYPES[t["dtype"]], _shape(t["shape"])) for name, t in data["tensors"].items()}
        files = {
            check_safe_name(name, "data file", path): FileRecord(_nonneg(f["size"]), _nonneg(f["header_crc32"]))
            for name, f in data["files"].items()
        }
        block = _nonneg(data["block"])
        slices = []
        for s in data["slices"]:
            meta = tensors[s["tensor"]]
            region = region_from_json(s["region"], meta.shape)
            if check_safe_name(s["file"], "data file", path) not in files:
                raise CorruptCheckpoint(f"slice of {s['tensor']!r} names unlisted file {s['file']!r}", path)
            nbytes = _nonneg(s["nbytes"])
            if nbytes != region.numel * meta.dtype.itemsize:
                raise CorruptCheckpoint(f"slice of {s['tensor']!r} has {nbytes} bytes for {region}", path)
            crcs = tuple(_nonneg(c) for c in s["crc32"])
            if len(crcs) != max(1, -(-nbytes // block)):
                raise CorruptCheckpoint(f"slice of {s['tensor']!r} lists {len(crcs)} checksums", path)
            slices.append(
                SliceRecord(s["tensor"], s["file"], str(s["key"]), region, _nonneg(s["offset"]), nbytes, crcs)
            )
        index = Index(
            name=str(data["name"]),
            seq=_nonneg(data["seq"]),
            save_id=str(data["save_id"]),
            world_size=_nonneg(data["world_size"]),
            block=block,
            commit=str(data.get("commit", "rename")),
            meta=dict(data.get("meta", {})),
            tensors=tensors,
            files=files,
            slices=tuple(slices),
        )
    except (KeyError, TypeError, ValueError, LayoutError) as exc:
        raise CorruptCheckpoint(f"malformed index ({type(exc).__name__}: {exc})", path) from None
    if block <= 0 or block % 8:
        raise CorruptCheckpoint(f"checksum block size {block} is not a positive multiple of 8", path)
    for name, meta in tensors.items() if check_cover else ():
        check_exact_cover(name, meta.shape, [s.region for s in index.slices_of(name)], str(path))
    return index


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TypeError("shape must be a list")
    return tuple(_nonneg(v) for v in value)


def _nonneg(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value
