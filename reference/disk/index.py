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

from ..dtypes import DTYPES, DType
from ..errors import MalformedMetadata, UnsafePath, UnsupportedFormatVersion
from ..layout import Box, FlatRange, Region
from ..regions import check_exact_cover
from .fsutil import read_small_file
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
_BOX_KEYS = frozenset({"offsets", "shape"})


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
    block = top.integer("block", 8, MAX_BLOCK)  # checked before any division by it
    if block % 8:
        raise MalformedMetadata(f"index.block = {block} is not a multiple of 8", path)
    commit = top.string("commit")
    if commit not in COMMITS:
        raise MalformedMetadata(f"index.commit = {commit!r} is not one of {COMMITS}", path)
    tensors = {name: _tensor(name, spec, path) for name, spec in top.mapping("tensors").items()}
    files = {
        check_safe_name(name, "data file", path): _file(name, rec, path) for name, rec in top.mapping("files").items()
    }
    slices = tuple(_slice(i, s, tensors, files, block, path) for i, s in enumerate(top.array("slices")))
    _check_disjoint_bytes(slices, path)
    index = Index(
        name=top.string("name"),
        seq=top.integer("seq"),
        save_id=top.string("save_id"),
        world_size=top.integer("world_size", 1),
        block=block,
        commit=commit,
        meta=top.mapping("meta"),
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
    code = rec.string("dtype")
    if code not in DTYPES:
        raise MalformedMetadata(f"{rec.field('dtype')} = {code!r} is not a known dtype", path)
    dt = DTYPES[code]
    return TensorMeta(dt, checked_shape(rec.array("shape"), dt, path, rec.field("shape")))


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
    return FileRecord(rec.integer("size"), rec.integer("header_crc32", 0, 0xFFFFFFFF))


def _slice(
    i: int, data: object, tensors: dict[str, TensorMeta], files: dict[str, FileRecord], block: int, path: Path
) -> SliceRecord:
    """One slice record. Types are checked by one fast predicate (an index may hold tens of thousands of slices
    and must parse well within a second); only a record that fails it is walked field by field to name the
    offending field."""
    if not _well_typed_slice(data):
        _explain_slice(i, data, path)
    assert isinstance(data, dict)
    where = f"index.slices[{i}]"
    tname, fname = data["tensor"], data["file"]
    meta = tensors.get(tname)
    if meta is None:
        raise MalformedMetadata(f"{where}.tensor = {tname!r} is not a listed tensor", path)
    if fname not in files:  # listed names passed check_safe_name already
        check_safe_name(fname, "data file", path)
        raise MalformedMetadata(f"{where}.file = {fname!r} is not a listed file", path)
    region = _region(data["region"], meta.shape, f"{where}.region", path)
    offset, nbytes, crcs = data["offset"], data["nbytes"], tuple(data["crc32"])
    if nbytes != region.numel * meta.dtype.itemsize:
        raise MalformedMetadata(f"{where}.nbytes = {nbytes} but {region} holds {region.numel} elements", path)
    if offset + nbytes > files[fname].size:
        raise MalformedMetadata(
            f"{where}.offset: bytes [{offset}, {offset + nbytes}) lie past the end of {fname!r} "
            f"({files[fname].size} bytes)",
            path,
        )
    if len(crcs) != max(1, -(-nbytes // block)):
        raise MalformedMetadata(f"{where}.crc32 lists {len(crcs)} checksums for {nbytes} bytes", path)
    return SliceRecord(tname, fname, data["key"], region, offset, nbytes, crcs)


def _uint(value: object, hi: int = MAX_INT) -> bool:
    return type(value) is int and 0 <= value <= hi


def _uints(value: object, hi: int = MAX_INT) -> bool:
    return type(value) is list and all(type(v) is int and 0 <= v <= hi for v in value)


def _well_typed_slice(data: object) -> bool:
    if type(data) is not dict or data.keys() != _SLICE_KEYS or type(data["region"]) is not dict:
        return False
    region = data["region"]
    if region.keys() == {"flat"}:
        typed_region = _uints(region["flat"]) and len(region["flat"]) == 2
    else:
        box = region.get("box")
        typed_region = (region.keys() == {"box"} and type(box) is dict and box.keys() == _BOX_KEYS
                        and _uints(box["offsets"]) and _uints(box["shape"]))
    return (typed_region and type(data["tensor"]) is str and type(data["file"]) is str and type(data["key"]) is str
            and _uint(data["offset"]) and _uint(data["nbytes"]) and _uints(data["crc32"], 0xFFFFFFFF))


def _explain_slice(i: int, data: object, path: Path) -> None:
    """Raise the MalformedMetadata that names the first mistyped field of a slice record."""
    rec = Record(data, path, f"index.slices[{i}]", _SLICE_KEYS)
    rec.string("tensor"), rec.string("file"), rec.string("key"), rec.integer("offset"), rec.integer("nbytes")
    rec.integers("crc32", 0xFFFFFFFF)
    region = rec.get("region")
    where = rec.field("region")
    if type(region) is dict and region.keys() == {"flat"}:
        bounds = region["flat"]
        if type(bounds) is not list or len(bounds) != 2:
            raise MalformedMetadata(f"{where}.flat is {kind(bounds)}, expected [start, stop]", path)
        for j, v in enumerate(bounds):
            as_int(v, path, f"{where}.flat[{j}]")
    elif type(region) is dict and region.keys() == {"box"}:
        box = Record(region["box"], path, f"{where}.box", _BOX_KEYS)
        box.integers("offsets"), box.integers("shape")
    raise MalformedMetadata(f"{where} is {kind(region)}, expected {{'box': ...}} or {{'flat': ...}}", path)


def _region(data: dict, shape: tuple[int, ...], where: str, path: Path) -> Region:
    """A well-typed box or flat range, bounds-checked against the tensor's global shape."""
    if "flat" in data:
        start, stop = data["flat"]
        if not start <= stop <= math.prod(shape):
            raise MalformedMetadata(f"{where}.flat = [{start}, {stop}) does not fit shape {list(shape)}", path)
        return FlatRange(start, stop)
    offsets, extent = tuple(data["box"]["offsets"]), tuple(data["box"]["shape"])
    if not (len(offsets) == len(extent) == len(shape) and all(o + n <= g for o, n, g in zip(offsets, extent, shape))):
        raise MalformedMetadata(
            f"{where}.box at {list(offsets)} of shape {list(extent)} does not fit shape {list(shape)}", path
        )
    return Box(offsets, extent)


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
