"""Save and load: the reference engine's rank step, coordinator step and loader.

A real multi-rank run calls ``save_rank`` on every rank and ``commit`` on the coordinator after a barrier
(``commit`` can also wait for the ranks' manifests itself, which is what an async writer does). The in-process
``save`` plays every rank in turn, so the reference needs no launcher for any world size.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .disk.commit import collect_garbage, committed_checkpoints, open_committed, protocol, rotate, set_latest
from .disk.fsutil import read_small_file, write_durable
from .disk.index import FORMAT, INDEX_NAME, VERSION, Index, SliceRecord, check_safe_name, encode_index, parse_index
from .disk.stio import DEFAULT_BLOCK, Entry, SafetensorsReader, write_file
from .disk.strictjson import Record, loads, seal, unseal
from .dtypes import DType, dtype
from .errors import (
    CheckpointIncomplete,
    CorruptCheckpoint,
    LayoutError,
    MalformedMetadata,
    MissingSlices,
    MissingTensor,
    SliceOutOfRange,
    TargetMismatch,
)
from .layout import Box, FlatRange, Region, TensorLayout
from .regions import check_in_range, copy_between, intersect_boxes, needed_runs, strides
from .tensor import Tensor


@dataclass(frozen=True)
class LocalTensor:
    """One rank's piece of a tensor: where it sits in the global tensor, its bits, and whether this rank is the
    one that saves it (replicas are saved once)."""

    global_shape: tuple[int, ...]
    region: Region
    tensor: Tensor
    saves: bool = True


@dataclass(frozen=True)
class Target:
    """What a rank wants loaded: the global dtype and shape it expects, and the region it holds."""

    dtype: DType
    global_shape: tuple[int, ...]
    region: Region


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    path: Path
    seq: int
    save_id: str
    world_size: int


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


_MANIFEST_KEYS = frozenset(
    {"rank", "save_id", "world_size", "file", "size", "header_crc32", "block", "tensors", "slices"}
)


def _manifest_file(rank: int) -> str:
    return f"rank-{rank:05d}.manifest.json"


def new_save_id() -> str:
    return uuid.uuid4().hex[:16]


# --- save --------------------------------------------------------------------------------------------------


def save_rank(
    root: str | Path,
    name: str,
    save_id: str,
    rank: int,
    world_size: int,
    tensors: Mapping[str, LocalTensor],
    *,
    block: int = DEFAULT_BLOCK,
    commit: str = "rename",
) -> Path:
    """Rank step: write this rank's deduplicated slices and its manifest into the staging directory."""
    root = Path(root)
    check_safe_name(name, "checkpoint name", root)
    check_safe_name(save_id, "save id", root)
    if block <= 0 or block % 8:
        raise LayoutError(f"checksum block size {block} must be a positive multiple of 8")
    staging = protocol(commit).staging_dir(root, name, save_id)
    staging.mkdir(parents=True, exist_ok=True)
    entries, described, specs = [], [], {}
    for tname in sorted(tensors):
        lt = tensors[tname]
        _check_local(tname, lt)
        specs[tname] = {"dtype": lt.tensor.dtype.name, "shape": list(lt.global_shape)}
        if lt.saves and lt.region.numel > 0:
            key = f"{tname}#{rank}"
            entries.append((key, lt.tensor.dtype, lt.tensor.shape, lt.tensor.bits))
            described.append((tname, key, lt.region))
    fname = rank_file(rank)
    written, size, header_crc = write_file(staging / fname, entries, block)
    manifest = {
        "rank": rank,
        "save_id": save_id,
        "world_size": world_size,
        "file": fname,
        "size": size,
        "header_crc32": header_crc,
        "block": block,
        "tensors": specs,
        "slices": [
            {"tensor": t, "key": k, "region": r.to_json(), "offset": w.offset, "nbytes": w.nbytes, "crc32": w.crcs}
            for (t, k, r), w in zip(described, written)
        ],
    }
    tmp = staging / f".{_manifest_file(rank)}.tmp"
    tmp.unlink(missing_ok=True)
    write_durable(tmp, seal(manifest))
    os.replace(tmp, staging / _manifest_file(rank))
    return staging


def _check_local(name: str, lt: LocalTensor) -> None:
    if lt.tensor.shape != lt.region.shape:
        raise LayoutError(f"{name}: local data shape {lt.tensor.shape} != region shape {lt.region.shape}")
    if isinstance(lt.region, Box):
        fits = len(lt.region.offsets) == len(lt.global_shape) and all(
            o + s <= g for o, s, g in zip(lt.region.offsets, lt.region.shape, lt.global_shape)
        )
    else:
        fits = lt.region.stop <= math.prod(lt.global_shape)
    if not fits:
        raise LayoutError(f"{name}: region {lt.region} does not fit global shape {lt.global_shape}")


def commit(
    root: str | Path,
    name: str,
    save_id: str,
    world_size: int,
    *,
    meta: Mapping | None = None,
    commit: str = "rename",
    keep_last: int | None = None,
    timeout: float = 0.0,
    coordinator: int | None = 0,
) -> CheckpointInfo:
    """Coordinator step: gather manifests, check exact cover, write the index, publish, move ``latest``,
    rotate, and collect what crashed saves left behind. ``coordinator``: the rank this process also writes as, or
    None where it plays every rank (commit.collect_garbage: what may still be in flight)."""
    root = Path(root)
    proto = protocol(commit)
    staging = proto.staging_dir(root, name, save_id)
    manifests = _gather_manifests(staging, world_size, save_id, timeout)
    tensors: dict[str, dict] = {}
    files, slices = {}, []
    for m in manifests:
        for tname, spec in m["tensors"].items():
            if tensors.setdefault(tname, spec) != spec:
                raise LayoutError(f"{tname}: rank {m['rank']} saves it as {spec}, another rank as {tensors[tname]}")
        files[m["file"]] = {"size": m["size"], "header_crc32": m["header_crc32"]}
        slices += [{**s, "file": m["file"]} for s in m["slices"]]
    if len({m["block"] for m in manifests}) > 1:
        raise MalformedMetadata(f"ranks disagree on the checksum block: {sorted({m['block'] for m in manifests})}",
                                staging)
    known = committed_checkpoints(root)
    index = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "seq": max(known.values(), default=-1) + 1,
        "save_id": save_id,
        "world_size": world_size,
        "block": manifests[0]["block"] if manifests else DEFAULT_BLOCK,
        "commit": proto.name,
        "meta": dict(meta or {}),
        "tensors": tensors,
        "files": files,
        "slices": slices,
    }
    path = staging / INDEX_NAME
    try:
        raw = encode_index(index)
    except ValueError as exc:  # NaN or infinity in ``meta``: JSON cannot carry them
        raise LayoutError(f"checkpoint meta is not finite JSON ({exc})") from None
    # Parsed back as a load will read it: exact cover asserted before publishing, and nothing is written that the
    # strict reader would refuse (meta nested too deep, integers too long).
    parse_index(loads(unseal(raw, path, "index"), path, "index"), path)
    write_durable(path, raw)
    final = root / name
    proto.finalize(staging, final)
    set_latest(root, name, save_id)
    if keep_last is not None:
        rotate(root, keep_last, save_id)
    collect_garbage(root, keep={name}, coordinator=coordinator)
    return CheckpointInfo(name, final, index["seq"], save_id, world_size)


def _gather_manifests(staging: Path, world_size: int, save_id: str, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    paths = [staging / _manifest_file(r) for r in range(world_size)]
    while True:
        missing = [r for r, p in enumerate(paths) if not p.is_file()]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    if missing:
        raise CheckpointIncomplete(f"ranks {missing} did not finish writing (no manifest)", staging)
    return [_read_manifest(path, rank, save_id, world_size) for rank, path in enumerate(paths)]


def _read_manifest(path: Path, rank: int, save_id: str, world_size: int) -> dict:
    """A rank's manifest, checksum-verified and strictly parsed: the coordinator trusts nothing a rank wrote
    (the slices themselves are validated with the whole index by ``parse_index``)."""
    rec = Record(loads(unseal(read_small_file(path), path, "manifest"), path, "manifest"), path, "manifest",
                 _MANIFEST_KEYS)
    if rec.string("save_id") != save_id or rec.integer("world_size") != world_size:
        raise CheckpointIncomplete(f"manifest belongs to another save ({rec.data['save_id']})", path)
    if rec.integer("rank") != rank or rec.string("file") != rank_file(rank):
        raise MalformedMetadata(f"manifest of rank {rank} describes rank {rec.data['rank']}", path)
    rec.integer("size"), rec.integer("header_crc32"), rec.integer("block")
    rec.mapping("tensors")
    for i, item in enumerate(rec.array("slices")):
        Record(item, path, f"manifest.slices[{i}]")
    return rec.data


def world_size_of(layouts: Mapping[str, TensorLayout]) -> int:
    sizes = {layout.mesh.world_size for layout in layouts.values()}
    if len(sizes) > 1:
        raise LayoutError(f"layouts disagree on the world size: {sorted(sizes)}")
    return sizes.pop() if sizes else 1


def extract(tensor: Tensor, region: Region) -> Tensor:
    """The bits of ``region`` of a global tensor, as a contiguous local tensor."""
    if isinstance(region, FlatRange):
        return Tensor(tensor.dtype, tensor.bits.reshape(-1)[region.start : region.stop].copy())
    sel = tuple(slice(o, o + s) for o, s in zip(region.offsets, region.shape))
    return Tensor(tensor.dtype, np.array(tensor.bits[sel], order="C", copy=True))


def local_tensors(
    state: Mapping[str, Tensor], layouts: Mapping[str, TensorLayout], rank: int, empty: bool = False
) -> dict[str, LocalTensor]:
    """What ``rank`` holds of a global state under ``layouts`` (tensors without a layout live whole on rank 0);
    ``empty``: the same pieces zero-filled (a load's targets), without copying bits that would be thrown away."""
    out = {}
    for tname, tensor in state.items():
        layout = layouts.get(tname)
        if layout is None:
            if rank == 0:
                whole = Tensor.empty(tensor.dtype, tensor.shape) if empty else tensor
                out[tname] = LocalTensor(tensor.shape, Box((0,) * len(tensor.shape), tensor.shape), whole)
            continue
        local = layout.local(tensor.shape, rank)
        if local is not None:
            piece = Tensor.empty(tensor.dtype, _region_shape(local.region)) if empty else extract(tensor, local.region)
            out[tname] = LocalTensor(tensor.shape, local.region, piece, local.saves)
    return out


def _region_shape(region: Region) -> tuple[int, ...]:
    """The shape ``extract`` gives a region: a flat range is 1-d."""
    return (region.stop - region.start,) if isinstance(region, FlatRange) else tuple(region.shape)


def save(
    root: str | Path,
    state: Mapping[str, Tensor],
    layouts: Mapping[str, TensorLayout] | None = None,
    *,
    name: str,
    meta: Mapping | None = None,
    keep_last: int | None = None,
    block: int = DEFAULT_BLOCK,
    commit_protocol: str = "rename",
    save_id: str | None = None,
) -> CheckpointInfo:
    """Save a global state as every rank of ``layouts`` would, then commit (in-process, any world size)."""
    world, ranks = per_rank(state, layouts)
    save_id = save_id or new_save_id()
    for rank, tensors in ranks.items():
        save_rank(root, name, save_id, rank, world, tensors, block=block, commit=commit_protocol)
    return commit(root, name, save_id, world, meta=meta, commit=commit_protocol, keep_last=keep_last, coordinator=None)


def per_rank(
    state: Mapping[str, Tensor], layouts: Mapping[str, TensorLayout] | None
) -> tuple[int, dict[int, dict[str, LocalTensor]]]:
    """World size and every rank's local tensors, for code that plays all ranks in one process."""
    layouts = dict(layouts or {})
    world = world_size_of(layouts)
    return world, {rank: local_tensors(state, layouts, rank) for rank in range(world)}


# --- load --------------------------------------------------------------------------------------------------


class _Files:
    """Data files of one checkpoint, opened on demand and checked against the index (size, then header checksum,
    then the strict header) before any of their bytes is used."""

    def __init__(self, ckpt: Path, index: Index) -> None:
        self.ckpt, self.index = ckpt, index
        self.open: dict[str, SafetensorsReader] = {}
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="ckpt-read")  # one per load: read + verify in parallel

    def entry(self, s: SliceRecord) -> tuple[SafetensorsReader, Entry]:
        reader = self.open.get(s.file)
        path = self.ckpt / s.file
        if reader is None:
            record = self.index.files[s.file]
            try:
                reader = SafetensorsReader(path, record.size, record.header_crc32)
            except FileNotFoundError:
                raise CheckpointIncomplete("data file listed in the index is missing", path) from None
            self.open[s.file] = reader
        entry = reader.entries.get(s.key)
        meta = self.index.tensors[s.tensor]
        if entry is None or (entry.offset, entry.nbytes, entry.dtype) != (s.offset, s.nbytes, meta.dtype):
            raise CorruptCheckpoint(f"header entry {s.key!r} disagrees with the index", path)
        return reader, entry

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for reader in self.open.values():
            reader.close()


def _fill(files: _Files, tname: str, target: Target, slices: list[SliceRecord], block: int) -> Tensor:
    """Load one target. The tensor's cover is proved and every file it reads from is opened and checked against
    the index first, so the destination is allocated only once the bytes it will hold are known to exist."""
    dt = target.dtype
    files.index.check_cover(tname)
    want = target.region.numel
    if want == 0:
        return Tensor(dt, np.empty(target.region.shape, dt.bits_dtype))
    plan: list[tuple[SliceRecord, tuple | None]] = []  # (slice, its element runs; () = later; None = the target)
    whole = isinstance(target.region, Box) and target.region.shape == tuple(target.global_shape)
    for s in slices:
        if s.region == target.region:
            plan.append((s, None))
        elif whole:  # every saved element is wanted (load_global): no overlap test per slice
            if s.region.numel:
                plan.append((s, ()))
        elif isinstance(s.region, Box) and isinstance(target.region, Box):
            if _may_overlap(s.region, target.region, target.global_shape):  # exact for two boxes
                plan.append((s, ()))
        elif _may_overlap(s.region, target.region, target.global_shape):
            runs = needed_runs(s.region, target.region, target.global_shape)
            if len(runs[0]):
                plan.append((s, runs))
    opened = [files.entry(s) for s, _ in plan]  # only files it needs: a damaged file it does not need is no error
    dst = np.empty(target.region.shape, dt.bits_dtype)
    copied = 0
    for (s, runs), (reader, entry) in zip(plan, opened):
        if runs is None:
            view = memoryview(dst.reshape(-1)).cast("B")
            reader.read_blocks(entry, view, 0, [(0, len(s.crcs))], block, list(s.crcs), files.pool)
            copied += want
            continue
        starts, lengths = runs or needed_runs(s.region, target.region, target.global_shape)
        lo, hi = int(starts.min()), int((starts + lengths).max())
        if isinstance(s.region, Box) and s.region.shape:
            row = math.prod(s.region.shape[1:])
            lo, hi = lo // row * row, -(-hi // row) * row
        it = dt.itemsize
        first_block = lo * it // block
        byte0 = first_block * block
        byte_end = min(-(-hi * it // block) * block, s.nbytes)
        buffer = np.empty(byte_end - byte0, np.uint8)
        reader.read_blocks(
            entry,
            memoryview(buffer),
            byte0,
            _needed_blocks(starts, lengths, it, block, first_block),
            block,
            list(s.crcs),
            files.pool,
        )
        src = buffer[lo * it - byte0 : hi * it - byte0].view(dt.bits_dtype)
        copied += copy_between(s.region, src, lo, target.region, dst, target.global_shape)
    if copied != want:
        raise MissingSlices(f"tensor {tname!r}: saved slices gave {copied} of {want} elements", files.ckpt)
    return Tensor(dt, dst)


def _may_overlap(a: Region, b: Region, global_shape: tuple[int, ...]) -> bool:
    """Cheap test (no runs built) whether two non-empty regions can share an element: exact for two boxes, by flat
    bounding spans otherwise."""
    if a.numel == 0 or b.numel == 0:
        return False
    if isinstance(a, Box) and isinstance(b, Box):
        inter = intersect_boxes(a, b)
        return inter is not None and inter.numel > 0
    (a0, a1), (b0, b1) = _flat_span(a, global_shape), _flat_span(b, global_shape)
    return a0 < b1 and b0 < a1


def _flat_span(region: Region, global_shape: tuple[int, ...]) -> tuple[int, int]:
    if isinstance(region, FlatRange):
        return region.start, region.stop
    st = strides(global_shape)
    first = sum(o * k for o, k in zip(region.offsets, st))
    last = sum((o + n - 1) * k for o, n, k in zip(region.offsets, region.shape, st))
    return first, last + 1


def _needed_blocks(
    starts: np.ndarray, lengths: np.ndarray, itemsize: int, block: int, first: int
) -> list[tuple[int, int]]:
    """Coalesced block ranges [b0, b1) holding the given element runs."""
    b0 = starts * itemsize // block - first
    b1 = -(-(starts + lengths) * itemsize // block) - first
    marks = np.zeros(int(b1.max()) + 1, np.int64)
    np.add.at(marks, b0, 1)
    np.add.at(marks, b1, -1)
    used = np.cumsum(marks)[:-1] > 0
    edges = np.flatnonzero(np.diff(np.concatenate(([False], used, [False])).astype(np.int8)))
    return [(int(a) + first, int(b) + first) for a, b in zip(edges[::2], edges[1::2])]


def open_checkpoint(root: str | Path, name: str | None = None) -> tuple[Path, Index]:
    """Directory and verified index of checkpoint ``name`` or the latest (commit.open_committed)."""
    return open_committed(Path(root), name)


def load(root: str | Path, targets: Mapping[str, Target], *, name: str | None = None) -> dict[str, Tensor]:
    """Load each target's region (any layout) from checkpoint ``name`` or the latest, reading only the blocks
    that overlap what is asked for and verifying their checksums."""
    ckpt, index = open_checkpoint(root, name)
    return _load(ckpt, index, targets)


def _load(ckpt: Path, index: Index, targets: Mapping[str, Target]) -> dict[str, Tensor]:
    files = _Files(ckpt, index)
    try:
        out = {}
        for tname, target in targets.items():
            meta = index.tensors.get(tname)
            if meta is None:
                raise MissingTensor(f"tensor {tname!r} is not in the checkpoint", ckpt)
            if (meta.dtype, meta.shape) != (target.dtype, tuple(target.global_shape)):
                raise TargetMismatch(
                    f"tensor {tname!r} is saved as {meta.dtype.name}{list(meta.shape)}, target wants "
                    f"{target.dtype.name}{list(target.global_shape)}",
                    ckpt,
                )
            try:  # the caller's region, checked before anything is allocated for it
                check_in_range(tname, meta.shape, target.region)
            except SliceOutOfRange as exc:
                raise TargetMismatch(f"target {exc}", ckpt) from None
            out[tname] = _fill(files, tname, target, index.by_tensor.get(tname, []), index.block)
        return out
    finally:
        files.close()


def load_global(root: str | Path, *, name: str | None = None, names: list[str] | None = None) -> dict[str, Tensor]:
    """Every (or the named) tensor of a checkpoint, whole (the index is read once)."""
    ckpt, index = open_checkpoint(root, name)
    wanted = names if names is not None else list(index.tensors)
    targets = {}
    for tname in wanted:
        meta = index.tensors.get(tname)
        if meta is None:
            raise MissingTensor(f"tensor {tname!r} is not in the checkpoint", root)
        targets[tname] = Target(meta.dtype, meta.shape, Box((0,) * len(meta.shape), meta.shape))
    return _load(ckpt, index, targets)


def load_rank(
    root: str | Path,
    specs: Mapping[str, tuple[str | DType, tuple[int, ...]]],
    layouts: Mapping[str, TensorLayout],
    rank: int,
    *,
    name: str | None = None,
) -> dict[str, Tensor]:
    """What ``rank`` holds under ``layouts`` (any layout, any world size), loaded from the checkpoint."""
    targets = {}
    for tname, (dt, shape) in specs.items():
        shape = tuple(shape)
        layout = layouts.get(tname)
        if layout is None:
            if rank == 0:
                targets[tname] = Target(dtype(dt), shape, Box((0,) * len(shape), shape))
            continue
        local = layout.local(shape, rank)
        if local is not None:
            targets[tname] = Target(dtype(dt), shape, local.region)
    return load(root, targets, name=name)


def read_meta(root: str | Path, *, name: str | None = None) -> dict:
    return open_checkpoint(root, name)[1].meta
