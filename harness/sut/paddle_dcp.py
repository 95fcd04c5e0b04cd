"""Paddle flex checkpoint (``paddle.distributed.save_state_dict`` / ``load_state_dict``) as a system under test.

Each rank hands Paddle its local pieces, either as ``ShardedWeight`` (explicit offsets; the default, and the only
form that expresses flattened stage-1 v2 slices) or as a dist tensor built from the local piece with the global
shape given explicitly (``tensor_kind="dist_from_local"``). ``dist.shard_tensor`` is not offered: it needs the whole
global tensor on every rank, which the worker never has. Each checkpoint name is its own directory; with
``options["same_dir"]`` (capability "same_dir", used by P-REPEAT) names are versions (``unique_id``) of one
directory instead, Paddle's own notion of versions and "latest". Quirks and evidence: docs/paddle-notes.md.
"""

from __future__ import annotations

import math
import pickle
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from reference.layout import Box, Flat, FlatRange, Region, Shard, Sharded
from reference.tensor import Tensor

from ._paddle_common import (
    SUPPORTED_DTYPES,
    PaddleAdapter,
    from_paddle,
    to_paddle,
    trailing_int,
    zeros,
)
from .base import RankTensor

_SAME_DIR = "dcp"  # options["same_dir"]: every version lives in root/dcp, told apart by unique_id
_SAVE_MODULE = "paddle.distributed.flex_checkpoint.dcp.save_state_dict"
_LOAD_MODULE = "paddle.distributed.flex_checkpoint.dcp.load_state_dict"


@dataclass
class DcpHandle:
    """What one save handed to Paddle: the local tensors (for ``mutate``) and, for async, the writer process."""

    tensors: list[Any]
    process: Any = None
    waited: bool = field(default=False)


class PaddleDcpSut(PaddleAdapter):
    name = "paddle-dcp"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"reshard", "async", "zero_size", "flat", "moe", "repeat", "latest", "same_dir", "save_replicas", "empty_state"}
        | {"format:pickle", "format:safetensors", "tensor_kind:sharded_weight", "tensor_kind:dist_from_local"}
        | {f"dtype:{d}" for d in SUPPORTED_DTYPES}
    )

    def __init__(self) -> None:
        self._pending: list[DcpHandle] = []

    # --- save ------------------------------------------------------------------------------------------------

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        import paddle.distributed as dist

        state, locals_ = {}, []
        kind = _kind(tensors, options)
        for tname, rt in tensors.items():
            value, local = _wrap(tname, rt, to_paddle(rt.local.tensor), kind)
            if value is not None:
                state[tname] = value
                locals_.append(local)
        path, unique_id = _location(root, name, options)
        dist.save_state_dict(
            state,
            str(path),
            unique_id=unique_id,
            async_save=use_async,
            safetensors=options.get("format") == "safetensors",
            save_replicas=bool(options.get("save_replicas", False)),
        )
        handle = DcpHandle(locals_)
        if use_async:
            queue = sys.modules[_SAVE_MODULE].async_save_queue  # Paddle keeps its writer processes here
            handle.process = queue[-1] if queue else None
            self._pending.append(handle)
        return handle

    def wait(self, handle: DcpHandle) -> None:
        """Join the spawned writer and raise on a non-zero exit (Paddle itself only logs it)."""
        handle.waited = True
        if handle.process is None:
            return
        handle.process.join()
        if handle.process.exitcode != 0:
            raise RuntimeError(
                f"paddle async save writer (pid {handle.process.pid}) exited {handle.process.exitcode}; its traceback "
                "is in this rank's log"
            )

    # --- load ------------------------------------------------------------------------------------------------

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        import paddle.distributed as dist

        if name is None and not options.get("same_dir", False):
            raise ValueError("paddle-dcp keeps versions apart only inside one directory: load latest needs same_dir")
        path, unique_id = (Path(root) / _SAME_DIR, None) if name is None else _location(root, name, options)
        state, read_back, out = {}, {}, {}
        kind = _kind(targets, options)
        for tname, rt in targets.items():
            lt = rt.local
            value, local = _wrap(tname, rt, zeros(lt.tensor.dtype, lt.tensor.shape), kind)
            if value is None:  # a zero-length flat slice: nothing to ask Paddle for
                out[tname] = Tensor(lt.tensor.dtype, np.zeros(lt.tensor.shape, lt.tensor.dtype.bits_dtype))
                continue
            state[tname] = value
            read_back[tname] = local
        dist.load_state_dict(
            state,
            str(path),
            unique_id=unique_id,
            safetensors=options.get("format") == "safetensors",
            comm_method=options.get("comm_method", "broadcast"),
        )
        for tname, local in read_back.items():
            lt = targets[tname].local
            out[tname] = from_paddle(_loaded_local(state[tname], local), lt.tensor.shape)
        return out

    # --- lifecycle -------------------------------------------------------------------------------------------

    def end_case(self) -> None:
        """Join writers left running and drop Paddle's per-process caches, as a fresh process would have them:
        ``PATH_TO_CHECKPOINT_FILES`` (file lists cached per path) and the global metadata manager (left filled
        when a load raises). Within a case they stay, so repeated saves/loads see Paddle's real behaviour."""
        for handle in self._pending:
            if handle.process is not None and not handle.waited:
                handle.process.join()
        self._pending.clear()
        module = sys.modules.get(_LOAD_MODULE)
        if module is not None:
            module.PATH_TO_CHECKPOINT_FILES.clear()
            module._metadata_manager.clear()

    # --- controller side -------------------------------------------------------------------------------------

    @classmethod
    def written(cls, root: Path, name: str) -> dict[str, tuple[tuple[int, ...], list[Region]]] | None:
        """Regions listed in Paddle's ``<unique_id>.metadata`` (declared extra replicas, replica_id > 0, left
        out: they are copies by request, not duplicates)."""
        meta_path = _metadata_file(Path(root), name)
        if meta_path is None:
            return None
        with open(meta_path, "rb") as f:
            meta = _MetadataUnpickler(f).load()
        shapes = {
            key: tuple(metas[0].global_shape)
            for key, metas in meta.state_dict_metadata.items()
            if metas and metas[0].global_shape is not None
        }
        out: dict[str, tuple[tuple[int, ...], list[Region]]] = {}
        for index in meta.storage_metadata:
            if index.replica_id not in (None, 0):
                continue
            gshape = shapes.get(index.tensor_key, ())
            regions = out.setdefault(index.tensor_key, (gshape, []))[1]
            offset, shape = tuple(index.global_offset), tuple(index.local_shape or ())
            if not index.is_flattened:
                regions.append(Box(offset, shape))
            elif shape == gshape and not any(offset):
                regions.append(FlatRange(*index.flattened_range))
            else:
                regions.extend(_flat_to_boxes(offset, shape, *index.flattened_range))
        return out


# --- helpers ---------------------------------------------------------------------------------------------------


def _kind(tensors: dict[str, RankTensor], options: dict) -> str:
    """The tensor kind for one save/load. Paddle rejects dicts mixing ShardedWeight with tensors, and only
    ShardedWeight expresses flat slices, so a state with any flat layout is all ShardedWeight (every rank sees
    the same layouts, so all ranks decide alike)."""
    kind = options.get("tensor_kind", "sharded_weight")
    if kind not in ("sharded_weight", "dist_from_local"):
        raise NotImplementedError(
            f"tensor_kind {kind!r}: only sharded_weight and dist_from_local (shard_tensor needs the global tensor)"
        )
    if any(isinstance(rt.layout, Flat) for rt in tensors.values()):
        return "sharded_weight"
    return kind


def _loaded_local(value: Any, fallback: Any) -> Any:
    """The dense tensor Paddle loaded into: a load may replace a dist tensor's local value rather than write
    into the buffer it was built from, so read it back from the object Paddle was given."""
    if hasattr(value, "local_tensor"):  # ShardedWeight
        return value.local_tensor
    if hasattr(value, "is_dist") and value.is_dist():
        return value._local_value()
    return value if value is not None else fallback


def _wrap(name: str, rt: RankTensor, local: Any, kind: str) -> tuple[Any, Any]:
    """(what goes in Paddle's state dict, the dense local tensor holding the bits) for one rank's piece."""
    import paddle.distributed as dist

    lt = rt.local
    gshape = tuple(lt.global_shape)
    if isinstance(lt.region, FlatRange):
        if lt.region.numel == 0:
            return None, None  # Paddle's sharding optimizer omits empty flat slices too
        sw = dist.ShardedWeight(
            name,
            local,
            local_shape=gshape,
            global_shape=gshape,
            global_offset=(0,) * len(gshape),
            is_flattened=True,
            flattened_range=slice(lt.region.start, lt.region.stop),
        )
        return sw, local
    if kind == "dist_from_local":
        if rt.layout is None:
            return local, local  # a plain tensor on rank 0 only
        return _dist_tensor(rt.layout, local, gshape), local
    return dist.ShardedWeight(name, local, tuple(lt.region.shape), gshape, tuple(lt.region.offsets)), local


def _dist_tensor(layout: Sharded, local: Any, gshape: tuple[int, ...]) -> Any:
    """A dist tensor over the layout's mesh (restricted to its owner coordinates) with the global shape given
    explicitly: ``dist.dtensor_from_local`` would infer local × mesh size, wrong for uneven splits."""
    import paddle
    import paddle.distributed as dist

    ids = np.arange(layout.mesh.world_size).reshape(layout.mesh.shape)
    for mesh_dim, index in layout.owner:
        ids = np.take(ids, [index], axis=mesh_dim)
    mesh = dist.ProcessMesh(ids.tolist(), dim_names=list(layout.mesh.dim_names))
    placements = [dist.Shard(p.dim) if isinstance(p, Shard) else dist.Replicate() for p in layout.placements]
    return paddle.Tensor(local, dims=list(gshape), process_mesh=mesh, placements=placements, place=local.place)


def _location(root: Path, name: str, options: dict) -> tuple[Path, int | None]:
    """Default: root/<name>, unique_id from options. same_dir: every checkpoint is a version of root/dcp with
    unique_id = the name's trailing integer — Paddle's own notion of versions and of "latest" (P-REPEAT)."""
    if options.get("same_dir", False):
        return Path(root) / _SAME_DIR, trailing_int(name)
    return Path(root) / name, options.get("unique_id")


def _metadata_file(root: Path, name: str) -> Path | None:
    own = root / name
    if own.is_dir():
        files = sorted(own.glob("*.metadata"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
        return files[-1] if files else None
    try:
        shared = root / _SAME_DIR / f"{trailing_int(name)}.metadata"
    except ValueError:
        return None
    return shared if shared.is_file() else None


def _flat_to_boxes(offset: tuple[int, ...], shape: tuple[int, ...], start: int, stop: int) -> list[Box]:
    """Row-major elements [start, stop) of a box at ``offset`` with ``shape``, as disjoint boxes."""
    if start >= stop:
        return []
    if not shape:
        return [Box((), ())]
    row = math.prod(shape[1:])
    if start % row == 0 and stop % row == 0:
        return [Box((offset[0] + start // row, *offset[1:]), (stop // row - start // row, *shape[1:]))]
    if start % row:  # a partial first row, then the rest
        r = start // row
        end = min(stop, (r + 1) * row)
        return _in_row(offset, shape, r, start - r * row, end - r * row) + _flat_to_boxes(offset, shape, end, stop)
    r = stop // row  # whole rows, then a partial last row
    return _flat_to_boxes(offset, shape, start, r * row) + _in_row(offset, shape, r, 0, stop - r * row)


def _in_row(offset: tuple[int, ...], shape: tuple[int, ...], r: int, start: int, stop: int) -> list[Box]:
    inner = _flat_to_boxes(tuple(offset[1:]), tuple(shape[1:]), start, stop)
    return [Box((offset[0] + r, *b.offsets), (1, *b.shape)) for b in inner]


class _Record:
    """Stand-in for Paddle's metadata dataclasses, so reading the metadata needs no Paddle import."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return None  # fields missing from older Paddle versions read as absent


class _MetadataUnpickler(pickle.Unpickler):
    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("builtins", "slice"),
        ("collections", "OrderedDict"),
        ("copyreg", "_reconstructor"),
        ("builtins", "object"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module == "paddle.distributed.flex_checkpoint.dcp.metadata":
            return type(name, (_Record,), {})
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected class {module}.{name} in Paddle metadata")
