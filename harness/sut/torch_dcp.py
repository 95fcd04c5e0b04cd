"""PyTorch distributed checkpoint (``torch.distributed.checkpoint``: save, load, async_save) as a system under test.

Launched with torchrun. Each rank wraps its local piece as a DTensor on a DeviceMesh built from the case's mesh,
with the global shape and stride given explicitly (``DTensor.from_local`` would otherwise assume even shards);
tensors owned by some ranks only (keyed experts) are plain tensors on their owners, which DCP treats as
replicated and saves once. On a GPU machine each rank takes ``cuda:<local rank>``, tensors live on it and the
process group is ``cpu:gloo,cuda:nccl`` (DCP gathers its plans on the CPU group); elsewhere everything is CPU
and gloo. Async saves use DCP's own thread or process executor (``options["async_executor"]``); they stage
device memory to the host before returning. A thread-executor save runs DCP's collectives in a background thread,
so each gets a gloo process group of its own (as torchtitan does for its async checkpoints): on the default group
they would interleave with the caller's next load or save, or another pending save, in an order that differs
between ranks, and the ranks would wait on each other until gloo's timeout — a misuse, not DCP's bug.

Capabilities, honestly: no "flat" (DTensor has no flattened ranges), no "latest" (DCP has no notion of the newest
checkpoint), no "same_dir" (one checkpoint per directory), no typed errors (any exception counts as clear).

DeviceMeshes are kept per mesh shape for the life of the rank process: each one creates process groups, which
torch cannot cheaply tear down. They hold no checkpoint state, so no case sees another's data through them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from harness.sut.base import RankTensor, SutAdapter
from reference import nesting
from reference.dtypes import dtype
from reference.layout import Box, Region, Shard, Sharded
from reference.tensor import Tensor

# dtype code -> (torch dtype name, numpy carrier torch ingests bit for bit, torch dtype to view the carrier as)
_CARRIERS: dict[str, tuple[str, str]] = {
    "F64": ("float64", "<f8"),
    "F32": ("float32", "<f4"),
    "F16": ("float16", "<f2"),
    "BF16": ("bfloat16", "<i2"),
    "F8_E4M3": ("float8_e4m3fn", "u1"),
    "F8_E5M2": ("float8_e5m2", "u1"),
    "I64": ("int64", "<i8"),
    "I32": ("int32", "<i4"),
    "I16": ("int16", "<i2"),
    "I8": ("int8", "i1"),
    "U8": ("uint8", "u1"),
    "BOOL": ("bool", "u1"),
}
SUPPORTED_DTYPES = tuple(_CARRIERS)
_CODES = {name: code for code, (name, _) in _CARRIERS.items()}
_INT_OF_WIDTH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
EXECUTORS = ("thread", "process")
COLLECTIVE_TIMEOUT = 30.0


def carriers() -> dict[str, tuple[str, str]]:
    """dtype code -> (torch dtype name, numpy carrier): what repro scripts spell out."""
    return dict(_CARRIERS)


@dataclass
class TorchHandle:
    """One save: the local tensors handed to DCP (for ``mutate``) and, for async, DCP's future."""

    tensors: list[Any]
    future: Any = None
    waited: bool = field(default=False)
    group: Any = None  # the process group its background thread's collectives run on (thread executor)


class TorchDcpSut(SutAdapter):
    name = "torch-dcp"
    launcher = "torchrun"
    framework = "torch"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"reshard", "async", "zero_size", "moe", "repeat", "empty_state", "nested"}
        | {f"async_executor:{e}" for e in EXECUTORS}
        | {f"dtype:{d}" for d in SUPPORTED_DTYPES}
    )
    clear_errors = None

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        import torch
        import torch.distributed as dist

        self.rank, self.world = rank, world_size
        self.device = _device(options.get("device", "auto"))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            # A dead peer turns into an error after this long (torch's default is 10 minutes; Paddle's gloo 30 s),
            # well inside the harness's per-op bound, so P-LIVENESS sees an error rather than a hang.
            timeout = timedelta(seconds=float(options.get("collective_timeout", COLLECTIVE_TIMEOUT)))
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        self._meshes: dict[tuple, Any] = {}
        self._pending: list[TorchHandle] = []
        self._free_groups: list[Any] = []  # async save groups whose saves every rank has settled (oldest first)
        return []

    def describe(self) -> dict[str, str]:
        import torch.distributed as dist

        return {"device": str(self.device), "backend": str(dist.get_backend_config())}

    # --- save ------------------------------------------------------------------------------------------------

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        import torch.distributed.checkpoint as dcp

        handle = TorchHandle([])
        state = {}
        for tname, rt in tensors.items():
            local = self._to_torch(rt.local.tensor)
            state[tname] = self._wrap(rt, local)
            handle.tensors.append(local)
        path = str(Path(root) / name)
        state = _given(state, options)
        if not use_async:
            dcp.save(state, checkpoint_id=path)
            return handle
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        executor = options.get("async_executor", "thread")
        if executor not in EXECUTORS:
            raise NotImplementedError(f"async_executor {executor!r}: only {', '.join(EXECUTORS)}")
        handle.group = self._async_group() if executor == "thread" else None
        response = dcp.async_save(state, checkpoint_id=path, async_checkpointer_type=AsyncCheckpointerType(executor),
                                  process_group=handle.group)
        handle.future = getattr(response, "upload_completion", response)  # newer torch wraps the future
        self._pending.append(handle)
        return handle

    def wait(self, handle: TorchHandle) -> None:
        handle.waited = True
        try:
            if handle.future is not None:
                handle.future.result()
        finally:
            self._release_group(handle)

    def _async_group(self) -> Any:
        """A process group for one thread-executor save: a settled save's, or a new one. Every rank saves and
        settles its saves in the same op order, so every rank picks the same group (``new_group`` is collective).
        None (the default group) in a one-process world, which has no collectives to interleave."""
        import torch.distributed as dist

        if not dist.is_initialized() or self.world <= 1:
            return None
        return self._free_groups.pop(0) if self._free_groups else dist.new_group(backend="gloo")

    def _release_group(self, handle: TorchHandle) -> None:
        """The save's collectives are over on this rank; its peers reuse the group only after settling it too."""
        if handle.group is not None:
            self._free_groups.append(handle.group)
            handle.group = None

    def mutate(self, handle: TorchHandle) -> None:
        import torch

        for local in handle.tensors:
            if local.numel():
                view = local.view(getattr(torch, _INT_OF_WIDTH[local.element_size()]))
                view.bitwise_not_()

    # --- load ------------------------------------------------------------------------------------------------

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        import torch.distributed.checkpoint as dcp

        if name is None:
            raise ValueError("torch-dcp has no notion of the latest checkpoint: a load needs a name")
        state = _given({tname: self._wrap(rt, self._to_torch(rt.local.tensor)) for tname, rt in targets.items()},
                       options)
        dcp.load(state, checkpoint_id=str(Path(root) / name))
        sep = options.get(nesting.NESTED)
        if sep:  # read back where a training script reads it; empty sub-dicts must stay empty dicts
            lost = nesting.empty_dicts_lost(state, options.get(nesting.EMPTY_DICTS, ()), sep)
            if lost:
                raise RuntimeError(f"dcp.load left the empty sub-dicts {lost} of the state dict changed")
        out = {}
        for tname in targets:
            value = nesting.leaf(state, tname, sep) if sep else state[tname]
            local = value.to_local() if hasattr(value, "to_local") else value
            out[tname] = _from_torch(local, targets[tname].local.tensor.shape)
        return out

    # --- lifecycle -------------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        import torch
        import torch.distributed as dist

        if self.world <= 1:
            return True
        probe = torch.ones(1, dtype=torch.int64, device=self.device)
        try:
            dist.all_reduce(probe)
        except Exception:
            return False
        return int(probe.item()) == self.world

    def end_case(self) -> None:
        """Let async saves left running finish (their errors belong to the case that made them)."""
        for handle in self._pending:
            if not handle.waited and handle.future is not None:
                with contextlib.suppress(Exception):
                    handle.future.result()
            self._release_group(handle)
        self._pending.clear()

    def close(self) -> None:
        import torch.distributed as dist

        self.end_case()
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- helpers ---------------------------------------------------------------------------------------------

    def _to_torch(self, t: Tensor) -> Any:
        import torch

        if t.dtype.name not in _CARRIERS:
            raise NotImplementedError(f"torch-dcp: no torch dtype for {t.dtype.name}")
        torch_name, carrier = _CARRIERS[t.dtype.name]
        array = np.array(t.bits, copy=True, order="C").view(carrier)
        out = torch.from_numpy(array).view(getattr(torch, torch_name)).reshape(t.shape)
        return out.to(self.device)

    def _wrap(self, rt: RankTensor, local: Any) -> Any:
        """A DTensor over the layout's mesh, or the plain tensor for one that lives whole on its owners."""
        layout = rt.layout
        if layout is None or not isinstance(layout, Sharded) or layout.owner:
            return local
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Replicate as TorchReplicate
        from torch.distributed.tensor import Shard as TorchShard

        placements = [TorchShard(p.dim) if isinstance(p, Shard) else TorchReplicate() for p in layout.placements]
        shape = tuple(rt.local.global_shape)
        return DTensor.from_local(local, self._mesh(layout), placements, shape=shape, stride=_contiguous(shape))

    def _mesh(self, layout: Sharded) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        key = (layout.mesh.shape, layout.mesh.dim_names)
        if key not in self._meshes:
            if layout.mesh.world_size != self.world:
                raise ValueError(f"a mesh of {layout.mesh.world_size} ranks in a world of {self.world}")
            ranks = np.arange(self.world).reshape(layout.mesh.shape).tolist()
            names = tuple(layout.mesh.dim_names) if layout.mesh.dim_names else None
            self._meshes[key] = DeviceMesh(self.device.type, ranks, mesh_dim_names=names)
        return self._meshes[key]

    # --- controller side -------------------------------------------------------------------------------------

    @classmethod
    def complete(cls, root: Path, names: Collection[str], options: dict) -> list[str]:
        """Names whose ``.metadata`` exists: DCP writes it last, after every rank's data, and reads it first."""
        return sorted(n for n in names if (Path(root) / n / ".metadata").is_file())

    @classmethod
    def written(cls, root: Path, name: str) -> dict[str, tuple[tuple[int, ...], list[Region]]] | None:
        """The chunks DCP's ``.metadata`` lists per tensor (what landed on disk, after its dedup)."""
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        path = Path(root) / name
        if not (path / ".metadata").is_file():
            return None
        meta = FileSystemReader(str(path)).read_metadata()
        out: dict[str, tuple[tuple[int, ...], list[Region]]] = {}
        for key, md in meta.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                out[key] = (tuple(md.size), [Box(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks])
        return out


def _given(state: dict[str, Any], options: dict) -> dict:
    """The state dict as the case gives it to DCP: flat under each tensor's name, or nested at ``options["nested"]``
    with its empty sub-dicts (DCP flattens it itself, each leaf under its path joined with ".")."""
    sep = options.get(nesting.NESTED)
    return nesting.build(state, sep, options.get(nesting.EMPTY_DICTS, ())) if sep else state


def _device(choice: str) -> Any:
    """cuda:<local rank> when asked (or "auto" and CUDA has a GPU for this rank), else the CPU."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if choice not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device {choice!r}: auto, cpu or gpu")
    if choice == "cpu" or (choice == "auto" and not (torch.cuda.is_available() and torch.cuda.device_count() > local)):
        return torch.device("cpu")
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
        raise RuntimeError(f"device gpu asked for, but CUDA sees {torch.cuda.device_count()} GPU(s) for local rank "
                           f"{local}")
    return torch.device("cuda", local)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _from_torch(x: Any, shape: tuple[int, ...]) -> Tensor:
    """The bits of a torch tensor, with the dtype torch reports (a silently changed dtype shows as a mismatch)."""
    import torch

    code = _CODES.get(str(x.dtype).removeprefix("torch."))
    if code is None:
        raise TypeError(f"torch returned a tensor of dtype {x.dtype}, which the harness has no code for")
    dt = dtype(code)
    raw = x.detach().to("cpu").contiguous().view(getattr(torch, _INT_OF_WIDTH[dt.itemsize]))
    bits = raw.numpy().view(dt.bits_dtype).copy()
    if bits.size != int(np.prod(shape)):
        raise ValueError(f"torch left a tensor of shape {list(x.shape)} where shape {list(shape)} was loaded into")
    return Tensor(dt, bits.reshape(shape))
