"""The checkpoint index (format contract, docs/design.md §3): parse and validate untrusted JSON into typed records.

Everything read from disk is treated as hostile: the file's checksum is verified before a byte of it is parsed,
the JSON is read by the strict reader (strictjson.py), names are checked before they touch the filesystem, every
size and offset is checked against the files' recorded sizes (which a load checks against the files on disk), and
no two slices may share bytes. Exact cover is checked per tensor, for the tensors a load asks for.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .dtypes import DTYPES, DType
from .errors import MalformedMetadata, UnsafePath, UnsupportedFormatVersion
from .fsutil import read_small_file
from .layout import Box, FlatRange, Region
from .regions import check_exact_cover
from .strictjson import MAX_INT, Record, as_int, kind, loads, seal, unseal

FORMAT = "ckpt-harness-reference"
VERSION = 2  # 2: index.json is sealed (crc32 envelope, strictjson.seal); 1 had no checksum and is refused
INDEX_NAME = "index.json"
COMMITS = ("rename", "marker")
MAX_BLOCK = 1 << 30
MAX_NDIM = 32  # numpy's own limit in 1.x
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=-]{0,254}")  # fullmatch: ``$`` would let a trailing newline in
_V1_HEAD = b'{"format": "ckpt-harness-reference", "version": 1,'  # what version 1 wrote first, byte for byte
_INDEX_KEYS = frozenset(
    {"format", "version", "name", "seq", "save_id", "world_size", "block", "commit", "meta", "tensors", "files",
     "slices"}
)
_SLICE_KEYS = frozenset({"tensor", "file", "key", "region", "offset", "nbytes", "crc32"})


def check_safe_name(name: object, what: str, path: Path | str | None = None) -> str:
    """A file or checkpoint name must be one plain path component: no separators, no '..', no leading dot."""
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or ".." in name:
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
    path: Path | None = None

    @cached_property
    def by_tensor(self) -> dict[str, list[SliceRecord]]:
        """Slices grouped by tensor, built once: callers look up every tensor, so a scan each is quadratic."""
        grouped: dict[str, list[SliceRecord]] = {}
        for s in self.slices:
            grouped.setdefault(s.tensor, []).append(s)
        return grouped

    def slices_of(self, tensor: str) -> list[SliceRecord]:
        return list(self.by_tensor.get(tensor, ()))

    def check_cover(self, tensor: str) -> None:
        """Raise a CoverError unless the slices of ``tensor`` cover it exactly once (O(n log n) in its slices)."""
        check_exact_cover(
            tensor, self.tensors[tensor].shape, [s.region for s in self.by_tensor.get(tensor, ())], str(self.path)
        )


def encode_index(data: dict) -> bytes:
    """The bytes of ``index.json`` for an index dict: sealed, so every bit of it is covered by a checksum."""
    return seal(data)


def read_index(ckpt_dir: Path, check_cover: bool = True) -> Index:
    """Read, verify and parse ``index.json`` once; ``check_cover=False`` leaves cover checks to the caller (a load
    checks only what it loads; a checker inspects a bad cover instead of failing)."""
    path = ckpt_dir / INDEX_NAME
    raw = read_small_file(path)
    if raw.startswith(_V1_HEAD):
        raise UnsupportedFormatVersion(
            f"index format {FORMAT!r} version 1 (no checksum); this engine reads version {VERSION}", path
        )
    return parse_index(loads(unseal(raw, path, "index"), path, "index"), path, check_cover)


def parse_index(data: object, path: Path, check_cover: bool = True) -> Index:
    """Typed, validated index from decoded JSON; every failure names the file and the field."""
    top = Record(data, path, "index")
    version = top.data.get("version")
    if top.data.get("format") != FORMAT or type(version) is not int or version != VERSION:
        raise UnsupportedFormatVersion(
            f"index format {top.data.get('format')!r} version {top.data.get('version')!r}; this engine reads "
            f"{FORMAT!r} version {VERSION}",
            path,
        )
    top = Record(data, path, "index", _INDEX_KEYS)
    block = top.int("block", 8, MAX_BLOCK)  # checked before any division by it
    if block % 8:
        raise MalformedMetadata(f"index.block = {block} is not a multiple of 8", path)
    commit = top.str("commit")
    if commit not in COMMITS:
        raise MalformedMetadata(f"index.commit = {commit!r} is not one of {COMMITS}", path)
    tensors = {name: _tensor(name, spec, path) for name, spec in top.map("tensors").items()}
    files = {
        check_safe_name(name, "data file", path): _file(name, rec, path) for name, rec in top.map("files").items()
    }
    slices = tuple(_slice(i, s, tensors, files, block, path) for i, s in enumerate(top.list("slices")))
    _check_disjoint_bytes(slices, path)
    index = Index(
        name=top.str("name"),
        seq=top.int("seq"),
        save_id=top.str("save_id"),
        world_size=top.int("world_size", 1),
        block=block,
        commit=commit,
        meta=top.map("meta"),
        tensors=tensors,
        files=files,
        slices=slices,
        path=path,
    )
    for name in tensors if check_cover else ():
        index.check_cover(name)
    return index


def _tensor(name: str, spec: object, path: Path) -> TensorMeta:
    rec = Record(spec, path, f"index.tensors[{name!r}]", frozenset({"dtype", "shape"}))
    code = rec.str("dtype")
    if code not in DTYPES:
        raise MalformedMetadata(f"{rec.field('dtype')} = {code!r} is not a known dtype", path)
    dt = DTYPES[code]
    return TensorMeta(dt, checked_shape(rec.list("shape"), dt, path, rec.field("shape")))


def checked_shape(value: list, dt: DType, path: Path | str, field: str) -> tuple[int, ...]:
    """A shape numpy can allocate: at most MAX_NDIM dims whose byte count (zero dims counted as one, as numpy's
    overflow check does) fits an intp. Whether the bytes exist is checked against the files, later."""
    if len(value) > MAX_NDIM:
        raise MalformedMetadata(f"{field} has {len(value)} dims, more than {MAX_NDIM}", path)
    shape = tuple(as_int(v, path, f"{field}[{i}]") for i, v in enumerate(value))
    if math.prod(max(d, 1) for d in shape) * dt.itemsize > MAX_INT:
        raise MalformedMetadata(f"{field} = {list(shape)} is too large for any array", path)
    return shape


def _file(name: str, rec_data: object, path: Path) -> FileRecord:
    rec = Record(rec_data, path, f"index.files[{name!r}]", frozenset({"size", "header_crc32"}))
    return FileRecord(rec.int("size"), rec.int("header_crc32", 0, 0xFFFFFFFF))


def _slice(
    i: int, data: object, tensors: dict[str, TensorMeta], files: dict[str, FileRecord], block: int, path: Path
) -> SliceRecord:
    rec = Record(data, path, f"index.slices[{i}]", _SLICE_KEYS)
    tname = rec.str("tensor")
    meta = tensors.get(tname)
    if meta is None:
        raise MalformedMetadata(f"{rec.field('tensor')} = {tname!r} is not a listed tensor", path)
    fname = check_safe_name(rec.get("file"), "data file", path)
    if fname not in files:
        raise MalformedMetadata(f"{rec.field('file')} = {fname!r} is not a listed file", path)
    region = _region(rec, meta.shape, path)
    offset, nbytes = rec.int("offset"), rec.int("nbytes")
    if nbytes != region.numel * meta.dtype.itemsize:
        raise MalformedMetadata(f"{rec.field('nbytes')} = {nbytes} but {region} holds {region.numel} elements", path)
    if offset + nbytes > files[fname].size:
        raise MalformedMetadata(
            f"{rec.field('offset')}: bytes [{offset}, {offset + nbytes}) lie past the end of {fname!r} "
            f"({files[fname].size} bytes)",
            path,
        )
    crcs = rec.ints("crc32", 0xFFFFFFFF)
    if len(crcs) != max(1, -(-nbytes // block)):
        raise MalformedMetadata(f"{rec.field('crc32')} lists {len(crcs)} checksums for {nbytes} bytes", path)
    return SliceRecord(tname, fname, rec.str("key"), region, offset, nbytes, crcs)


def _region(rec: Record, shape: tuple[int, ...], path: Path) -> Region:
    """A box or flat range, bounds-checked against the tensor's global shape."""
    where = rec.field("region")
    data = rec.get("region")
    if type(data) is dict and data.keys() == {"flat"}:
        bounds = data["flat"]
        if type(bounds) is not list or len(bounds) != 2:
            raise MalformedMetadata(f"{where}.flat is {kind(bounds)}, expected [start, stop]", path)
        start, stop = (as_int(v, path, f"{where}.flat[{j}]") for j, v in enumerate(bounds))
        if not start <= stop <= math.prod(shape):
            raise MalformedMetadata(f"{where}.flat = [{start}, {stop}) does not fit shape {list(shape)}", path)
        return FlatRange(start, stop)
    if type(data) is dict and data.keys() == {"box"}:
        box = Record(data["box"], path, f"{where}.box", frozenset({"offsets", "shape"}))
        offsets, extent = box.ints("offsets"), box.ints("shape")
        if not (len(offsets) == len(extent) == len(shape) and all(
            o + n <= g for o, n, g in zip(offsets, extent, shape)
        )):
            raise MalformedMetadata(
                f"{where}.box at {list(offsets)} of shape {list(extent)} does not fit shape {list(shape)}", path
            )
        return Box(offsets, extent)
    raise MalformedMetadata(f"{where} is {kind(data)}, expected {{'box': ...}} or {{'flat': ...}}", path)


def _check_disjoint_bytes(slices: tuple[SliceRecord, ...], path: Path) -> None:
    """No two slices may name the same safetensors entry or overlapping bytes of a file: aliased bytes would load
    one piece of a tensor into two places without any checksum noticing."""
    distinct = set(slices)  # an exact duplicate record aliases nothing new: the cover check names it overlapping
    spans = sorted((s.file, s.offset, s.offset + s.nbytes, s.key) for s in distinct if s.nbytes)
    if len({(s.file, s.key) for s in distinct}) != len(distinct):
        raise MalformedMetadata("two slices name the same safetensors entry", path)
    for (f0, _b0, e0, k0), (f1, b1, _e1, k1) in itertools.pairwise(spans):
        if f0 == f1 and b1 < e0:
            raise MalformedMetadata(f"slices {k0!r} and {k1!r} share bytes of {f0!r}", path)
