"""Paddle flex checkpoint (``paddle.distributed.save_state_dict`` / ``load_state_dict``) as a system under test.

Each rank hands Paddle its local pieces, either as ``ShardedWeight`` (explicit offsets; the default, and the only
form that expresses flattened stage-1 v2 slices) or as a dist tensor built from the local piece with the global
shape given explicitly (``tensor_kind="dist_from_local"``). ``dist.shard_tensor`` is not offered: it needs the whole
global tensor on every rank, which the worker never has. Each checkpoint name is its own directory; with
``options["same_dir"]`` (capability "same_dir", used by P-REPEAT) names are versions (``unique_id``) of one
directory instead, Paddle's own notion of versions and "latest". Quirks and evidence: docs/paddle-notes.md.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from harness.sut import paddle_producers
from harness.sut._paddle_common import (
    SUPPORTED_DTYPES,
    PaddleAdapter,
    from_paddle,
    to_paddle,
    trailing_int,
    zeros,
)
from harness.sut.base import RankTensor, aoa_stored
from harness.sut.paddle_group_watch import check_own_group, world_group_use
from properties.model.case import IDLE_RANK, PROCESS_GROUP, group_members, idle_ranks
from reference import aoa, nesting
from reference.engine import extract
from reference.layout import Box, Flat, FlatRange, Region, Shard, Sharded, owner_indices
from reference.namespaces import NAMESPACES
from reference.producers import PRODUCER, PRODUCERS
from reference.tensor import Tensor

_SAME_DIR = "dcp"  # options["same_dir"]: every version lives in root/dcp, told apart by unique_id
_SAVE_MODULE = "paddle.distributed.flex_checkpoint.dcp.save_state_dict"
_LOAD_MODULE = "paddle.distributed.flex_checkpoint.dcp.load_state_dict"
_RESHARDER_MODULE = "paddle.distributed.flex_checkpoint.dcp.resharder"
# What Paddle's resharder planned during the load in progress on this rank, as (target keys, read items) per
# resharder (module level, so virtual ranks each keep their own: harness.ranks.virtual.paddle_world copies this
# module's state
# per rank); None outside a load. A load Paddle finds "resumable locally" plans nothing and is not checked.
_reads: list | None = None


@dataclass
class DcpHandle:
    """What one save handed to Paddle: the local tensors (for ``mutate``) and, for async, the writer process."""

    tensors: list[Any]
    processes: list[Any] = field(default_factory=list)  # async: one writer per save_state_dict call
    waited: bool = field(default=False)


# load_state_dict's communicators: every one must load the same bits. parallel_broadcast reshards within a grid of
# horizontal and vertical groups, and across a parallel group of such grids where there are several
# (PARALLEL_GRIDS: the world as 1 grid, or split into 2 equal halves, each a grid, the parallel groups pairing a
# rank with its place in the other half); the grid is the one _grid draws, so its loads run on the worlds that have
# one (GRID_WORLDS: 4 ranks or more, not prime; 2 grids: 8, 12, 16), and the strategies draw those ("load_world:").
COMM_METHODS = ("broadcast", "send_recv", "grouped_send_recv", "multi_group_broadcast", "parallel_broadcast")


def _rows(size: int) -> list[tuple[int, ...]]:
    """The world's ranks as rows of its largest proper divisor (one row when its size is prime)."""
    row = max((d for d in range(2, size) if size % d == 0), default=size)
    return [tuple(range(start, start + row)) for start in range(0, size, row)]


def _grid(size: int) -> list[tuple[int, ...]] | None:
    """``_rows`` where both its rows and its columns have 2 ranks or more, else None."""
    rows = _rows(size) if size > 1 else []
    return rows if len(rows) > 1 and len(rows[0]) > 1 else None


def _blocks(size: int, count: int) -> list[list[tuple[int, ...]]]:
    """The world as ``count`` equal blocks of consecutive ranks, each laid out as ``_rows`` (in global ranks)."""
    block = size // count
    return [[tuple(start + r for r in row) for row in _rows(block)] for start in range(0, size, block)]


def _grids(size: int, count: int) -> list[list[tuple[int, ...]]] | None:
    """``_blocks`` where the world splits into ``count`` blocks that are each a ``_grid``, else None."""
    return _blocks(size, count) if size % count == 0 and _grid(size // count) else None


GRID_WORLDS = tuple(size for size in range(1, 17) if _grid(size))
PARALLEL_GRIDS = (1, 2)

VIRTUAL_COMM = ("broadcast",)  # the virtual world emulates collectives, not point-to-point sends or sub-groups
# coordinator_rank of both calls: Paddle's default, and the world's last rank (-1, resolved per op's world).
COORDINATORS = (0, -1)
# How a load names a master weight ("master/<p>" in a flat case) against the save, and mw_name_compatibility:
# "off" the same name, compatibility off; "to_static" saved under the dynamic-graph name
# (``optimizer.master_weights.<p>``), loaded under the static-graph one (``optimizer.<p>_fp32_master_0``);
# "to_dynamic" the reverse. Both renames rely on the default, compatibility on.
MW_NAMES = ("off", "to_static", "to_dynamic")
# How a load reads: load_state_dict into the rank's layout; load_merged_state_dict, every tensor whole (as a
# conversion script reads a checkpoint), the rank's region then cut from it; or load_state_dict followed by
# full_param over what it loaded (as an export of a model's full parameters after a resume), every tensor whole
# on every rank; or merge_sharded_state_dict into a Hugging Face checkpoint (safetensors files and their index, no
# flex metadata), then load_state_dict of that directory into the rank's layout, as a conversion and the job that
# reads its output do. Each must give the saved bits.
LOAD_APIS = ("load_state_dict", "load_merged_state_dict", "full_param", "merge_sharded_state_dict")
# full_param's groups: the world as its one process_group, or horizontal and vertical groups ("hv": rows of the
# world's largest proper divisor of ranks, the whole world when its size is prime; a column of one rank is the
# assembler's one-dimensional path). It runs split by split, num_splits of 1 to 3, as an export bounds its memory.
FULL_PARAM_GROUPS = ("world", "hv")
# process_group of both calls: Paddle's default (the world's group), or "subset": a group of the ranks the case's
# layouts fix while one more rank of the job takes no part (properties.model.case.idle_ranks), that job's first
# rank, its second (a group with a hole where the group has 2 members or more past it) or its last (ranks 0..k-1).
PROCESS_GROUPS = ("world", "subset")
IDLE_RANKS = (0, 1, -1)
FULL_PARAM_SPLITS = (1, 2, 3)


class PaddleDcpSut(PaddleAdapter):
    name = "paddle-dcp"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"reshard", "async", "zero_size", "flat", "moe", "repeat", "latest", "same_dir", "save_replicas", "empty_state",
         "split_families", "virtual", "nested"}
        | {f"choice:comm_method={m}" for m in COMM_METHODS}
        | {f"load_world:{size}@comm_method=parallel_broadcast" for size in GRID_WORLDS}
        | {f"choice:parallel_grids={n}@comm_method=parallel_broadcast" for n in PARALLEL_GRIDS}
        | {f"load_world:{size}@parallel_grids={n}" for n in PARALLEL_GRIDS for size in range(1, 17) if _grids(size, n)}
        | {f"choice:coordinator_rank={r}" for r in COORDINATORS}
        | {f"choice:mw_names={m}" for m in MW_NAMES}
        | {f"choice:load_api={a}" for a in LOAD_APIS}
        | {f"choice:full_param_groups={g}@load_api=full_param" for g in FULL_PARAM_GROUPS}
        | {f"choice:full_param_splits={k}@load_api=full_param" for k in FULL_PARAM_SPLITS}
        | {f"choice:{PROCESS_GROUP}={g}@load_api=load_state_dict" for g in PROCESS_GROUPS}
        | {f"choice:{IDLE_RANK}={r}@{PROCESS_GROUP}=subset" for r in IDLE_RANKS}
        | {"flag:offload", "unique_id", "aoa"} | {f"producer:{p}" for p in PRODUCERS}
        | {"format:pickle", "format:safetensors", "tensor_kind:sharded_weight", "tensor_kind:dist_from_local"}
        | {f"dtype:{d}" for d in SUPPORTED_DTYPES}
    )

    def __init__(self) -> None:
        self._pending: list[DcpHandle] = []
        self._plan: dict | None = None

    # --- save ------------------------------------------------------------------------------------------------

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        import paddle.distributed as dist

        path, unique_id = _location(root, name, options)
        handle = DcpHandle([])
        process_group, takes_part = _process_group(options)
        if not takes_part:
            return handle
        for sub, model_group in _families(tensors, options):
            group = _stored_form(model_group, options)
            state = {}
            kind, meshes = _kind(group, options, sub), {}
            if PRODUCER in options:  # the pieces as Paddle's own model and optimizer give them, holding the case's bits
                given = paddle_producers.filled(paddle_producers.produced(options[PRODUCER], group,
                                                                          dist.get_world_size()))
                handle.tensors.extend(sw.local_tensor for sw in given.values())
            else:
                for tname, rt in group.items():
                    value, local = _wrap(state_key(tname, options, "save"), rt, to_paddle(rt.local.tensor), kind,
                                         meshes, options)
                    if value is not None:
                        state[tname] = value
                        handle.tensors.append(local)
                given = _given(state, options, sub, "save")
            with _on_own_group("save_state_dict", options):
                dist.save_state_dict(
                    given,
                    str(path / sub if sub else path),
                    unique_id=unique_id,
                    async_save=use_async,
                    safetensors=options.get("format") == "safetensors",
                    save_replicas=bool(options.get("save_replicas", False)),
                    coordinator_rank=_coordinator(options),
                    process_group=process_group,
                )
            if use_async:
                queue = sys.modules[_SAVE_MODULE].async_save_queue  # Paddle keeps its writer processes here
                if queue:
                    handle.processes.append(queue[-1])
        if use_async:
            self._pending.append(handle)
        return handle

    def wait(self, handle: DcpHandle) -> None:
        """Join the spawned writer and raise on a non-zero exit (Paddle itself only logs it)."""
        handle.waited = True
        for process in handle.processes:
            process.join()
        for process in handle.processes:
            if process.exitcode != 0:
                raise RuntimeError(
                    f"paddle async save writer (pid {process.pid}) exited {process.exitcode}; its traceback is in "
                    "this rank's log"
                )

    # --- load ------------------------------------------------------------------------------------------------

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:

        if name is None and not options.get("same_dir", False):
            raise ValueError("paddle-dcp keeps versions apart only inside one directory: load latest needs same_dir")
        global _reads
        if not _process_group(options)[1]:
            return {}
        path, unique_id = (Path(root) / _SAME_DIR, None) if name is None else _location(root, name, options)
        out = {}
        _watch_read_plans()
        _reads, self._plan = [], None
        try:
            merged = options.get("load_api") in ("load_merged_state_dict", "merge_sharded_state_dict")
            for sub, group in _families(targets, options):
                where = path / sub if sub else path
                if options.get("load_api") == "merge_sharded_state_dict":
                    out.update(self._merge_then_load(where, unique_id, group, _kind(group, options, sub), options))
                elif merged:
                    out.update(_load_merged(where, unique_id, group, options))
                elif PRODUCER in options:
                    out.update(_load_produced(where, unique_id, group, options))
                else:
                    out.update(self._load_group(where, unique_id, group, _kind(group, options, sub), options))
            names_of = {state_key(t, options, side): t for t in targets for side in ("load", "save")}
            # a merged load plans whole tensors, an AoA load the reads of the stored structure: not the case's
            self._plan = None if merged or options.get(aoa.AOA) else _plan_rows(_reads, names_of)
        finally:
            _reads = None
        return out

    def read_plan(self) -> dict | None:
        """The read items Paddle's resharder planned for this rank in the last load (``_watch_read_plans``)."""
        return self._plan

    def _merge_then_load(self, path: Path, unique_id: int | None, targets: dict[str, RankTensor], kind: str,
                         options: dict) -> dict[str, Tensor]:
        """merge_sharded_state_dict of the checkpoint into a directory beside it, then load_state_dict of that
        Hugging Face checkpoint into the rank's layout: its tensors are named by their stored keys."""
        from paddle.distributed.flex_checkpoint.dcp.load_state_dict import merge_sharded_state_dict

        merged = path.with_name(f"{path.name}.merged" + ("" if unique_id is None else f"-{unique_id}"))
        merge_sharded_state_dict(str(path), str(merged), unique_id=unique_id, offload=bool(options.get("offload")),
                                 safetensors=options.get("format") == "safetensors")
        return self._load_group(merged, None, targets, kind, {**options, "format": "safetensors"}, side="save")

    def _load_group(self, path: Path, unique_id: int | None, targets: dict[str, RankTensor], kind: str,
                    options: dict, side: str = "load") -> dict[str, Tensor]:
        """``side``: whose keys the state dict takes ("save": a merged checkpoint's, which holds the stored ones)."""
        import paddle.distributed as dist

        state, read_back, out, meshes = {}, {}, {}, {}
        for tname, rt in targets.items():
            lt = rt.local
            value, local = _wrap(state_key(tname, options, side), rt, zeros(lt.tensor.dtype, lt.tensor.shape), kind,
                                 meshes, options)
            if value is None:  # a zero-length flat slice: nothing to ask Paddle for
                out[tname] = Tensor(lt.tensor.dtype, np.zeros(lt.tensor.shape, lt.tensor.dtype.bits_dtype))
                continue
            state[tname] = value
            read_back[tname] = local
        family = path.name if options.get("split_families") else ""  # _families names each call's directory so
        given = _given(state, options, family, side)
        with _on_own_group("load_state_dict", options):
            dist.load_state_dict(given, str(path), unique_id=unique_id, aoa_config=_aoa_config(targets, options),
                                 **_load_arguments(options))
        sep = options.get(nesting.NESTED)
        if sep:  # what the caller's dict holds after the load, read where a training script reads it
            state = {tname: nesting.leaf(given, tname, sep) for tname in state}
            lost = nesting.empty_dicts_lost(given, _empty_dicts(options, family), sep)
            if lost:
                raise RuntimeError(f"load_state_dict left the empty sub-dicts {lost} of the state dict changed")
        else:  # read at the key the load was given (a master weight's other name)
            state = {tname: given[state_key(tname, options, side)] for tname in state}
        loaded = {tname: _loaded_local(state[tname], local) for tname, local in read_back.items()}
        if options.get("load_api") == "full_param":
            return {**out, **_full_param(loaded, targets, options)}
        for tname, local in loaded.items():
            out[tname] = from_paddle(local, targets[tname].local.tensor.shape)
        return out

    # --- lifecycle -------------------------------------------------------------------------------------------

    def end_case(self) -> None:
        """Join writers left running and drop Paddle's per-process caches, as a fresh process would have them:
        ``PATH_TO_CHECKPOINT_FILES`` (file lists cached per path) and the global metadata manager (left filled
        when a load raises). Within a case they stay, so repeated saves/loads see Paddle's real behaviour."""
        for handle in self._pending:
            if not handle.waited:
                for process in handle.processes:
                    process.join()
        self._pending.clear()
        module = sys.modules.get(_LOAD_MODULE)
        if module is not None:
            module.PATH_TO_CHECKPOINT_FILES.clear()
            module._metadata_manager.clear()

    # --- controller side -------------------------------------------------------------------------------------

    @classmethod
    def virtual_plays(cls, case: Any) -> bool:
        return (case.options.get("comm_method", "broadcast") in VIRTUAL_COMM
                and case.options.get("load_api") not in ("full_param", "merge_sharded_state_dict")
                and PRODUCER not in case.options and not idle_ranks(case.options))

    @classmethod
    def process_shape(cls, case: Any, index: int) -> str:
        """A producer case's ranks make fleet's hybrid groups, once per process: such ops run on processes of their
        own, as a tensor-parallel job is a launch of its own."""
        return f"producer={case.options[PRODUCER]}" if PRODUCER in case.options else ""

    @classmethod
    def refuses(cls, case: Any) -> str | None:
        """Besides the base's: multi_group_broadcast or full_param's horizontal and vertical groups in a world of
        one, which has no group to name (Paddle requires "worker_groups"; its assembler asserts a distributed
        job); parallel_broadcast without a grid of groups (_grid), or of dist tensors; a merge it cannot make
        (_unmergeable)."""
        lone = [i for i, op in enumerate(case.ops) if op.kind == "load" and case.world_size(case.op_layouts(i)) == 1]
        if case.options.get("comm_method") == "multi_group_broadcast" and lone:
            return f"op {lone[0]} loads with multi_group_broadcast in a world of one, which has no worker group"
        gridless = [i for i, op in enumerate(case.ops)
                    if op.kind == "load" and _grids(case.world_size(case.op_layouts(i)),
                                                    int(case.options.get("parallel_grids", 1))) is None]
        if case.options.get("comm_method") == "parallel_broadcast" and gridless:
            return (f"op {gridless[0]} loads with parallel_broadcast in a world of "
                    f"{case.world_size(case.op_layouts(gridless[0]))}, which has no "
                    f"{case.options.get('parallel_grids', 1)} grid(s) of groups of 2 ranks or more")
        if case.options.get("load_api") == "merge_sharded_state_dict":
            refused = _unmergeable(case)
            if refused:
                return refused
        if case.options.get("comm_method") == "parallel_broadcast" and case.options.get("tensor_kind") == \
                "dist_from_local":  # its resharder asserts "All sharded weights must be ShardedWeight type."
            return "parallel_broadcast loads ShardedWeights only (docs/paddle-notes.md)"
        refused = _subset_refused(case)
        lone_group = [i for i, op in enumerate(case.ops) if op.kind in ("save", "load") and idle_ranks(case.options)
                      and case.world_size(case.op_layouts(i)) - idle_ranks(case.options) == 1]
        if refused or lone_group:  # Paddle: a group of fewer than 2 ranks has no members (Group.is_member)
            return refused or (f"op {lone_group[0]} runs on a process group of one rank, which has no members "
                               "(docs/paddle-notes.md §5)")
        if case.options.get("load_api") == "full_param" and case.options.get("full_param_groups") == "hv" and lone:
            return f"op {lone[0]} runs full_param on horizontal and vertical groups in a world of one"
        return super().refuses(case)

    @classmethod
    def stored_key(cls, name: str, options: dict) -> str:
        return state_key(name, options, "save")

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str]:
        """Names whose Paddle metadata file exists (under same_dir, the version's ``<unique_id>.metadata``): the
        file Paddle's load reads first and picks the newest unique_id by, so it is what "finished" means here."""
        return sorted(n for n in names if _metadata_files(Path(root), n))

    @classmethod
    def written(cls, root: Path, name: str) -> dict[str, tuple[tuple[int, ...], list[Region]]] | None:
        """Regions listed in Paddle's ``<unique_id>.metadata`` files (one per family directory when families are
        split; declared extra replicas, replica_id > 0, left out: they are copies by request, not duplicates)."""
        paths = _metadata_files(Path(root), name)
        if not paths:
            return None
        out: dict[str, tuple[tuple[int, ...], list[Region]]] = {}
        for path in paths:
            with open(path, "rb") as f:
                _add_regions(out, _MetadataUnpickler(f).load())
        return out


# --- helpers ---------------------------------------------------------------------------------------------------


def _watch_read_plans() -> None:
    """Wrap Paddle's ``StateDictResharder.preprocess`` (once per process) so each load keeps the read items it
    planned; the wrapper hands back exactly what Paddle returned, so the load itself is Paddle's, unchanged."""
    import paddle.distributed.flex_checkpoint.dcp.resharder  # noqa: F401 -- where the resharder lives

    cls = sys.modules[_RESHARDER_MODULE].StateDictResharder
    if getattr(cls.preprocess, "ckh_watched", False):
        return
    original = cls.preprocess

    def preprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if _reads is not None and isinstance(out, tuple) and len(out) == 2:
            _reads.append((list(self.target_state_dict), list(out[1])))
        return out

    preprocess.ckh_watched = True  # type: ignore[attr-defined]
    cls.preprocess = preprocess


def _plan_rows(planned: list, names_of: dict[str, str]) -> dict | None:
    """This rank's plan as plain data: the target keys the resharder filled, and its reads as rows (tensor, dst
    offsets, shape, src piece offsets, offsets in that piece), each key as the case names it (``names_of``: a
    nested or renamed tensor's keys on either side); None when no resharder ran (a local load)."""
    import paddle.distributed as dist

    if not planned:
        return None
    rank = dist.get_rank() if dist.get_world_size() > 1 else 0
    keys: set[str] = set()
    rows = []
    for targets, reads in planned:
        keys.update(names_of.get(str(k), str(k)) for k in targets)
        for item in reads:
            if rank not in tuple(item.dst_rank) or item.dst_global_offset is None:
                continue
            dst = tuple(int(a) + int(b) for a, b in zip(item.dst_global_offset, item.dst_local_offset))
            rows.append((names_of.get(item.tensor_name, item.tensor_name), dst, tuple(int(n) for n in item.slice_shape),
                         tuple(int(o) for o in item.src_global_offset),
                         tuple(int(o) for o in item.src_local_offset)))
    return {"tensors": sorted(keys), "reads": rows}


def _add_regions(out: dict[str, tuple[tuple[int, ...], list[Region]]], meta: Any) -> None:
    shapes = {
        key: tuple(metas[0].global_shape)
        for key, metas in meta.state_dict_metadata.items()
        if metas and metas[0].global_shape is not None
    }
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


def _families(tensors: dict[str, RankTensor], options: dict) -> list[tuple[str, dict[str, RankTensor]]]:
    """(subdirectory, tensors) per save_state_dict call: one call for the whole state, or with
    ``options["split_families"]`` one call per state family (model, optimizer, master, ema, rng, meta), each in
    its own subdirectory, as trainers keep model, optimizer and EMA checkpoints apart. Every rank makes a call for
    every family, empty or not, so the collective calls pair up."""
    if not options.get("split_families"):
        return [("", tensors)]
    families = (*NAMESPACES, "meta")
    strays = sorted({k for k in tensors if k.partition("/")[0] not in families})
    if strays:
        raise ValueError(f"split_families: keys in no state family: {strays}")
    return [(ns, {k: rt for k, rt in tensors.items() if k.partition("/")[0] == ns}) for ns in families]


def _kind(tensors: dict[str, RankTensor], options: dict, family: str = "") -> str:
    """The tensor kind for one save/load call (``options["tensor_kinds"]`` may choose one per family). Paddle
    rejects dicts mixing ShardedWeight with tensors, and only ShardedWeight expresses flat slices, so a call with
    any flat layout is all ShardedWeight (every rank sees the same layouts, so all ranks decide alike)."""
    kind = options.get("tensor_kinds", {}).get(family) or options.get("tensor_kind", "sharded_weight")
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


def _unmergeable(case: Any) -> str | None:
    """Why merge_sharded_state_dict cannot merge the case's checkpoint, by its documented design: every rank writes
    one file of whole tensors, so it refuses ("tensor number ... should be greater than or equal to processor
    number") a checkpoint of fewer tensors than ranks (a zero-size one, which a checkpoint may omit, not counted),
    and a family of split_families holds fewer."""
    if case.options.get("split_families"):
        return "merge_sharded_state_dict merges one directory: split_families saves several, some nearly empty"
    held = sum(1 for t in case.tensors if math.prod(t.shape) > 0)
    worlds = [case.world_size(case.op_layouts(i)) for i, op in enumerate(case.ops) if op.kind == "load"]
    if worlds and held < max(worlds):
        return f"merge_sharded_state_dict gives each of {max(worlds)} ranks a tensor: the case holds {held}"
    return None


def _worker_groups(options: dict) -> list[Any] | None:
    """``multi_group_broadcast`` broadcasts within groups the caller names (a trainer passes its parallel groups):
    the job here has one, the world's (none in a world of one, which has no group). ``parallel_broadcast`` takes a
    horizontal, a vertical and a parallel group: the rank's row and column of its grid, and its parallel group
    across the grids (none for one grid, the two-dimensional path)."""
    import paddle.distributed as dist

    comm_method = options.get("comm_method", "broadcast")
    if comm_method not in ("multi_group_broadcast", "parallel_broadcast") or not dist.is_initialized():
        return None
    if comm_method == "parallel_broadcast":
        groups = _grid_groups(int(options.get("parallel_grids", 1)))
        return [groups["h_group"], groups["v_group"], groups.get("p_group")]
    from paddle.distributed.communication.group import _get_global_group

    return [_get_global_group()]


def _stored_form(group: dict[str, RankTensor], options: dict) -> dict[str, RankTensor]:
    """A save's pieces as the checkpoint stores them: under ``options["aoa"]``, in the other model's structure that
    the load's AoA statements map back (reference.aoa), each under its owner's name and suffix."""
    if aoa.AOA not in options:
        return group
    stored = aoa_stored(group, options[aoa.AOA])
    return {name: RankTensor(name, None, lt) for name, lt in stored.items()}


def _aoa_config(targets: dict[str, RankTensor], options: dict) -> dict | None:
    """The load's ``aoa_config``: the statements of the case's transformations that name its targets."""
    if aoa.AOA not in options:
        return None
    transforms = [t for t in options[aoa.AOA] if set(aoa.named(t)) <= set(targets)]
    dtypes = {name: rt.local.tensor.dtype.name for name, rt in targets.items()}
    return {"aoa_statements": aoa.statements(transforms, lambda n: state_key(n, options, "load"), dtypes)}


def _load_arguments(options: dict) -> dict[str, Any]:
    """load_state_dict's keyword arguments the case's options choose (besides the path, version and AoA config)."""
    return {"safetensors": options.get("format") == "safetensors",
            "comm_method": options.get("comm_method", "broadcast"),
            "worker_groups": _worker_groups(options),
            "coordinator_rank": _coordinator(options),
            "process_group": _process_group(options)[0],
            "offload": bool(options.get("offload", False)),
            "mw_name_compatibility": options.get("mw_names") != "off"}


def _subset_refused(case: Any) -> str | None:
    """What a process group of a subset of the job is not modelled with: the calls that take no process_group
    (load_merged_state_dict, merge_sharded_state_dict), worker groups and full_param's groups, which this adapter
    makes over the whole job, a producer's model, whose fleet groups are the whole job's, and a training job, whose
    every rank holds the training state (its rng, its step) that an idle rank would not."""
    options = case.options
    if not idle_ranks(options):
        return None
    if case.training is not None:
        return "a training job on a process group of a subset of the job"
    if options.get("load_api", "load_state_dict") != "load_state_dict":
        return f"load_api {options['load_api']} on a process group of a subset of the job"
    if options.get("comm_method") in ("multi_group_broadcast", "parallel_broadcast"):
        return f"comm_method {options['comm_method']}'s worker groups on a process group of a subset of the job"
    if PRODUCER in options:
        return "a producer's model on a process group of a subset of the job"
    return None


def _load_produced(path: Path, unique_id: int | None, targets: dict[str, RankTensor],
                   options: dict) -> dict[str, Tensor]:
    """A load into a fresh model's (and optimizer's) own sharded state, read back from what the model and optimizer
    give after it: a load that filled the pieces Paddle handed out but not the state behind them reads as lost."""
    import paddle.distributed as dist

    made = paddle_producers.produced(options[PRODUCER], targets, dist.get_world_size())
    dist.load_state_dict(made.state(), str(path), unique_id=unique_id, **_load_arguments(options))
    return made.read(made.state())


def _load_merged(path: Path, unique_id: int | None, targets: dict[str, RankTensor], options: dict) -> dict[str, Tensor]:
    """Each target's piece of the tensor ``load_merged_state_dict`` gives whole under its stored key (a master
    weight under the name it was saved with)."""
    import paddle.distributed as dist

    merged = dist.load_merged_state_dict(str(path), unique_id=unique_id, offload=bool(options.get("offload", False)),
                                         safetensors=options.get("format") == "safetensors")
    out = {}
    for tname, rt in targets.items():
        key = state_key(tname, options, "save")
        lt = rt.local
        if key not in merged and math.prod(lt.global_shape) == 0:  # no bits to give: a zero-size tensor may be in
            # no checkpoint at all (stage-1 v2 omits empty flat slices), as a load into its layout needs nothing
            out[tname] = Tensor(lt.tensor.dtype, np.zeros(lt.tensor.shape, lt.tensor.dtype.bits_dtype))
            continue
        if key not in merged:
            raise KeyError(f"load_merged_state_dict gave no {key!r} (it gave {sorted(merged)})")
        out[tname] = extract(from_paddle(merged[key], tuple(rt.local.global_shape)), rt.local.region)
    return out


def _full_param(loaded: dict[str, Any], targets: dict[str, RankTensor], options: dict) -> dict[str, Tensor]:
    """Each loaded tensor's piece of what ``full_param`` assembles whole from the rank's loaded pieces, given as a
    model's ``sharded_state_dict`` gives them (a flat slice is optimizer state a model never hands it: such a
    piece is read back from the load itself). Every split of the export is run, and what the iterator promises is
    held to: each tensor in exactly one split, the same bits on every rank."""
    import paddle.distributed as dist
    from paddle.distributed.flex_checkpoint.dcp.full_param import full_param

    out, sharded, names = {}, {}, {}
    for tname, local in loaded.items():
        lt = targets[tname].local
        if isinstance(lt.region, FlatRange):
            out[tname] = from_paddle(local, lt.tensor.shape)
            continue
        key = names[tname] = state_key(tname, options, "load")
        sharded[key] = dist.ShardedWeight(key, local, tuple(lt.region.shape), tuple(lt.global_shape),
                                          tuple(lt.region.offsets))
    splits = int(options.get("full_param_splits", 1))
    groups = _full_param_groups(options.get("full_param_groups", "world"))
    whole: dict[str, Any] = {}
    split_of: dict[str, int] = {}
    for index in range(splits):
        for key, tensor in full_param(sharded, num_splits=splits, shard_idx=index, **groups):
            if key in split_of:
                raise RuntimeError(f"full_param(num_splits={splits}) gave {key!r} in split {split_of[key]} and "
                                   f"again in split {index}")
            split_of[key], whole[key] = index, tensor
    _same_on_every_rank(whole)
    for tname, key in names.items():  # a tensor it never gave is left out: the oracle sees it missing
        if key not in whole:
            continue
        lt = targets[tname].local
        out[tname] = extract(from_paddle(whole[key], tuple(lt.global_shape)), lt.region)
    return out


def _full_param_groups(choice: str) -> dict[str, Any]:
    """``full_param``'s group arguments for FULL_PARAM_GROUPS' ``choice``: none, or the rank's row and column of
    ``_rows`` (a world of prime size is one row of columns of one rank: the assembler's one-dimensional path)."""
    return {} if choice == "world" else _grid_groups()


def _grid_groups(count: int = 1) -> dict[str, Any]:
    """The rank's row (``h_group``) and column (``v_group``) of its block among ``count`` (``_blocks``), and with
    several its parallel group (``p_group``): the ranks at its place in every grid. Every rank makes every group,
    in one order, as Paddle's ``new_group`` requires; a process keeps its groups (its world never changes)."""
    import paddle.distributed as dist

    size, rank = dist.get_world_size(), dist.get_rank()
    assert size % count == 0, f"a world of {size} has no {count} equal blocks"
    grids = _blocks(size, count)
    rows = [row for grid in grids for row in grid]
    columns = [tuple(r[i] for r in grid) for grid in grids for i in range(len(grid[0]))]
    block = size // count
    parallel = [tuple(range(place, size, block)) for place in range(block)] if count > 1 else []
    made = {ranks: _group(ranks) for ranks in (*rows, *columns, *parallel)}
    mine = {"h_group": next(r for r in rows if rank in r), "v_group": next(c for c in columns if rank in c)}
    if parallel:
        mine["p_group"] = parallel[rank % block]
    return {name: made[ranks] for name, ranks in mine.items()}


_groups: dict[tuple[int, ...], Any] = {}


def _group(ranks: tuple[int, ...]) -> Any:
    import paddle.distributed as dist

    if ranks not in _groups:
        _groups[ranks] = dist.new_group(list(ranks))
    return _groups[ranks]


def _same_on_every_rank(whole: dict[str, Any]) -> None:
    """Raise where ranks were given different bits for one tensor: each rank's own piece is judged against the
    reference, the rest of each whole tensor only by agreeing with the ranks that own it."""
    import hashlib

    import paddle.distributed as dist

    if dist.get_world_size() == 1:
        return
    mine = {}
    for key, tensor in sorted(whole.items()):
        bits = from_paddle(tensor)
        mine[key] = hashlib.sha256(f"{bits.dtype.name}{bits.shape}".encode() + bits.bits.tobytes()).hexdigest()
    every: list[dict[str, str]] = []
    dist.all_gather_object(every, mine)
    for key in sorted(mine):
        differ = sorted({rank for rank, theirs in enumerate(every) if theirs.get(key) != every[0].get(key)})
        if differ:
            raise RuntimeError(f"full_param gave ranks {differ} other bits of {key!r} than rank 0")


def _coordinator(options: dict) -> int:
    """``coordinator_rank`` of a save or load: the option's place among the ranks that take part (a negative one
    counted from their end), a rank of the calls' group as their collectives count it; Paddle's default, 0, where
    the case names none."""
    import paddle.distributed as dist

    members = group_members(options, dist.get_world_size())
    return int(options.get("coordinator_rank", 0)) % len(members)


@contextlib.contextmanager
def _on_own_group(call: str, options: dict) -> Iterator[None]:
    """A call on a group of a subset of the job must communicate over that group alone (paddle_group_watch)."""
    if not idle_ranks(options):
        yield
        return
    import paddle.distributed as dist

    with world_group_use() as used:
        yield
    check_own_group(call, group_members(options, dist.get_world_size()), used)


def _process_group(options: dict) -> tuple[Any, bool]:
    """The calls' ``process_group`` (None: Paddle's default) and whether this rank takes part in them. Every rank
    makes the group, the idle ones too, as Paddle's ``new_group`` requires."""
    import paddle.distributed as dist

    if not idle_ranks(options):
        return None, True
    members = group_members(options, dist.get_world_size())
    return _group(members), dist.get_rank() in members


def state_key(name: str, options: dict, side: str) -> str:
    """The key a ShardedWeight carries on the ``side`` ("save" or "load"): the tensor's name, in a nested state dict
    its path joined as Paddle joins it (the key a model's ``sharded_state_dict`` gives the same tensor), and a flat
    case's master weight under the naming ``options["mw_names"]`` gives that side (MW_NAMES)."""
    sep = options.get(nesting.NESTED)
    if sep:
        return nesting.stored_key(name, sep)
    if PRODUCER in options:  # as the producer's sharded_state_dict keys it
        return paddle_producers.key(name)
    if aoa.AOA in options:  # AoA statements name tensors by identifiers, which hold no "/"
        return name.replace("/", ".")
    style = _MW_STYLES.get((options.get("mw_names"), side))
    family, _, param = name.partition("/")
    if style is None or family != "master" or not param:
        return name
    return f"optimizer.master_weights.{param}" if style == "dynamic" else f"optimizer.{param}_fp32_master_0"


# (mw_names, side) -> the graph mode whose master-weight naming that side uses
_MW_STYLES = {("to_static", "save"): "dynamic", ("to_static", "load"): "static",
              ("to_dynamic", "save"): "static", ("to_dynamic", "load"): "dynamic"}


def _empty_dicts(options: dict, family: str) -> list[str]:
    """The case's empty sub-dicts of one save_state_dict call (a family's under ``split_families``)."""
    empty = options.get(nesting.EMPTY_DICTS, ())
    return [e for e in empty if not family or e.partition(options[nesting.NESTED])[0] == family]


def _given(state: dict[str, Any], options: dict, family: str, side: str) -> dict:
    """The state dict as the case gives it to Paddle on ``side``: flat under each tensor's key (``_key``), or
    nested at ``options["nested"]`` with its empty sub-dicts."""
    sep = options.get(nesting.NESTED)
    if sep:
        return nesting.build(state, sep, _empty_dicts(options, family))
    return {state_key(tname, options, side): value for tname, value in state.items()}


def _wrap(name: str, rt: RankTensor, local: Any, kind: str, meshes: dict, options: dict) -> tuple[Any, Any]:
    """(what goes in Paddle's state dict, the dense local tensor holding the bits) for one rank's piece.
    ``meshes``: the ProcessMesh objects this state dict's dist tensors use so far (``_dist_tensor``)."""
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
        return _dist_tensor(rt.layout, local, gshape, meshes, group_members(options, dist.get_world_size())), local
    return dist.ShardedWeight(name, local, tuple(lt.region.shape), gshape, tuple(lt.region.offsets)), local


def _dist_tensor(layout: Sharded, local: Any, gshape: tuple[int, ...], meshes: dict,
                 members: tuple[int, ...]) -> Any:
    """A dist tensor over the layout's mesh (restricted to its owner coordinates) of the processes that take part
    (``members``: the layouts' rank r is the process members[r]), with the global shape given
    explicitly: ``dist.dtensor_from_local`` would infer local × mesh size, wrong for uneven splits. Tensors of one
    state dict on the same processes share one ProcessMesh (``meshes``), as a model's parameters do: each new one
    is registered process-wide by a linear scan of every mesh before it, so a mesh per piece would make a load's
    registration quadratic in its pieces (bench/virtual.py measures the load)."""
    import paddle
    import paddle.distributed as dist

    ids = np.asarray(members)[np.arange(layout.mesh.world_size)].reshape(layout.mesh.shape)
    for mesh_dim, indices in owner_indices(layout.owner).items():
        ids = np.take(ids, indices, axis=mesh_dim)
    key = (ids.shape, ids.tobytes(), tuple(layout.mesh.dim_names))
    mesh = meshes.get(key)
    if mesh is None:
        mesh = meshes[key] = dist.ProcessMesh(ids.tolist(), dim_names=list(layout.mesh.dim_names))
    placements = [dist.Shard(p.dim) if isinstance(p, Shard) else dist.Replicate() for p in layout.placements]
    return paddle.Tensor(local, dims=list(gshape), process_mesh=mesh, placements=placements, place=local.place)


def _location(root: Path, name: str, options: dict) -> tuple[Path, int | None]:
    """Default: root/<name>, unique_id from options. same_dir: every checkpoint is a version of root/dcp with
    unique_id = the name's trailing integer — Paddle's own notion of versions and of "latest" (P-REPEAT)."""
    if options.get("same_dir", False):
        return Path(root) / _SAME_DIR, trailing_int(name)
    return Path(root) / name, options.get("unique_id")


def _metadata_files(root: Path, name: str) -> list[Path]:
    """The metadata of checkpoint ``name``: the newest ``*.metadata`` of its directory, or of each family
    subdirectory when families are split; under same_dir, the version's ``<unique_id>.metadata`` (per family)."""
    own = root / name
    if own.is_dir():
        dirs = [own] if any(own.glob("*.metadata")) else sorted(p for p in own.iterdir() if p.is_dir())
        found = [sorted(d.glob("*.metadata"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1) for d in dirs]
        return [files[-1] for files in found if files]
    try:
        uid = trailing_int(name)
    except ValueError:
        return []
    shared = root / _SAME_DIR
    return [p for p in [shared / f"{uid}.metadata", *sorted(shared.glob(f"*/{uid}.metadata"))] if p.is_file()]


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
