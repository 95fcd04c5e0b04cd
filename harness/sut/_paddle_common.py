"""Pieces both Paddle adapters share: a base class, runtime setup, CPU shims, and bit-exact numpy <-> paddle
conversion.

Paddle is imported lazily inside functions so the controller can import the adapters without Paddle installed.
Conversions never go through float values: each dtype travels in a numpy "carrier" Paddle accepts bit for bit
(Paddle reads numpy uint16 as bfloat16), and fp8/bool are reinterpreted with ``Tensor.view(dtype)``, so NaN
payloads, -0.0 and odd bool bytes survive. See docs/paddle-notes.md for the evidence.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import warnings
from typing import Any

import numpy as np

from harness.sut.base import SutAdapter
from reference.dtypes import DType, dtype
from reference.tensor import Tensor

# dtype code -> (paddle dtype name, numpy carrier Paddle ingests bitwise, paddle dtype to view the carrier as).
# U16 is absent: paddle.uint16 *is* bfloat16. U32/U64: Paddle 3.3.1 cannot build tensors from them.
_CARRIERS: dict[str, tuple[str, str, str | None]] = {
    "F64": ("float64", "<f8", None),
    "F32": ("float32", "<f4", None),
    "F16": ("float16", "<f2", None),
    "BF16": ("bfloat16", "<u2", None),
    "F8_E4M3": ("float8_e4m3fn", "u1", "float8_e4m3fn"),
    "F8_E5M2": ("float8_e5m2", "u1", "float8_e5m2"),
    "I64": ("int64", "<i8", None),
    "I32": ("int32", "<i4", None),
    "I16": ("int16", "<i2", None),
    "I8": ("int8", "i1", None),
    "U8": ("uint8", "u1", None),
    "BOOL": ("bool", "u1", "bool"),
}
SUPPORTED_DTYPES: tuple[str, ...] = tuple(_CARRIERS)
_CODES = {name: code for code, (name, _, _) in _CARRIERS.items()}
# Same-width integer dtypes, to scribble over a tensor's bits in place.
_SCRIBBLE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}

_shims: list[str] | None = None
_shim_lock = threading.Lock()


def carriers() -> dict[str, tuple[str, str, str | None]]:
    """dtype code -> (paddle dtype name, numpy carrier, paddle dtype to view it as): what repro scripts spell out."""
    return dict(_CARRIERS)


def paddle_dtype_name(dt: DType) -> str:
    if dt.name not in _CARRIERS:
        raise NotImplementedError(f"Paddle 3.3.1 has no tensor dtype for {dt.name}")
    return _CARRIERS[dt.name][0]


def to_paddle(t: Tensor) -> Any:
    """A fresh paddle tensor on the current device holding exactly ``t``'s bits."""
    import paddle

    paddle_dtype_name(t.dtype)  # raises for dtypes Paddle lacks
    _, carrier, view = _CARRIERS[t.dtype.name]
    out = paddle.to_tensor(np.require(t.bits, requirements="C").view(carrier), place=paddle.get_device())
    return out.view(getattr(paddle, view)) if view else out


def zeros(dt: DType, shape: tuple[int, ...]) -> Any:
    """A zero-filled paddle tensor (load target); built from numpy so fp8 works where full_like does not."""
    return to_paddle(Tensor(dt, np.zeros(shape, dt.bits_dtype)))


def from_paddle(x: Any, shape: tuple[int, ...] | None = None) -> Tensor:
    """The bits of a paddle tensor (dense, or a dist tensor's local value) as a reference Tensor, with the dtype
    Paddle reports: a load that silently turned float8 into int8 shows up as a dtype mismatch, not a pass."""
    if getattr(x, "is_dist", lambda: False)():
        x = x._local_value()
    dt = dtype(dtype_code(x))
    array = np.require(x.numpy(), requirements="C")  # not ascontiguousarray: it makes 0-d 1-d
    bits = array.view(dt.bits_dtype).copy()  # fp8 comes back as int8, bool as bool, bf16 as uint16
    if shape is None:
        return Tensor(dt, bits)
    if bits.size != math.prod(shape):
        raise ValueError(f"Paddle left a tensor of shape {list(x.shape)} where shape {list(shape)} was loaded into")
    return Tensor(dt, bits.reshape(shape))


def dtype_code(x: Any) -> str:
    """The harness's code of a paddle tensor's dtype ("BF16", ...)."""
    code = _CODES.get(str(x.dtype).split(".")[-1])
    if code is None:
        raise TypeError(f"Paddle returned a tensor of dtype {x.dtype}, which the harness has no code for")
    return code


def raw_bytes(x: Any) -> bytes:
    """A dense paddle tensor's bytes, row-major, as a backend sends them."""
    return np.require(x.numpy(), requirements="C").tobytes()


def write_bytes(x: Any, data: bytes) -> None:
    """Overwrite a dense paddle tensor's elements in place with ``data`` (its dtype and shape kept), bit for bit, as
    a backend receives into a buffer: a view stays a view of its base."""
    import paddle

    _, carrier, view = _CARRIERS[dtype_code(x)]
    src = paddle.Tensor(np.frombuffer(data, carrier).reshape(tuple(x.shape)))
    x.copy_(src.view(getattr(paddle, view)) if view else src, False)


def scribble(x: Any) -> None:
    """Invert every bit of ``x`` in place (through a same-width integer view sharing its storage)."""
    import paddle

    if int(np.prod(x.shape)) == 0:
        return
    x.view(getattr(paddle, _SCRIBBLE[x.element_size()])).bitwise_not_()


def apply_cpu_shims(options: dict) -> list[str]:
    """docs/design.md §9: on a CPU-only Paddle, ``Tensor.cuda`` and ``Tensor.pin_memory`` -> a CPU copy and
    ``device.synchronize`` -> no-op, so flex checkpoint's reshard, offload and async paths run, and the fused
    sharding buffers take a GPU's slot alignment
    (``tensor_fusion_helper`` asserts a gpu, npu or xpu device), so sharding stage 1 V2 builds the buffers it
    builds on a GPU: a producer of sharded state (P-MODEL), not checkpoint code. Process-wide, applied once; never
    when CUDA is compiled in."""
    global _shims
    import paddle

    with _shim_lock:
        if _shims is not None:
            return list(_shims)
        if paddle.is_compiled_with_cuda() or not options.get("shims", True):
            _shims = []
            return []

        def cuda(self: Any, device_id: Any = None, blocking: bool = True) -> Any:
            return self.clone()

        def synchronize(device: Any = None) -> None:
            return None

        paddle.Tensor.cuda = cuda
        paddle.Tensor.pin_memory = cuda
        paddle.device.synchronize = synchronize
        from paddle.distributed.fleet.utils import tensor_fusion_helper

        tensor_fusion_helper.alignment["cpu"] = tensor_fusion_helper.alignment["gpu"]
        tensor_fusion_helper.__current_device_type__ = "cpu"
        _shims = ["Tensor.cuda->copy", "Tensor.pin_memory->copy", "device.synchronize->noop", "fusion-alignment->gpu"]
        return list(_shims)


def init_runtime(rank: int, world_size: int, options: dict) -> list[str]:
    """Pick the device (gpu:<local rank> when Paddle has CUDA and GPUs, else cpu), init the process group once,
    and apply CPU shims. Returns the active shims."""
    import paddle
    import paddle.distributed as dist

    if options.get("device", "auto") != "cpu" and paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count():
        local = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("LOCAL_RANK", rank)))
        paddle.set_device(f"gpu:{local}")
    else:
        paddle.set_device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_parallel_env()
    return apply_cpu_shims(options)


_health_round = 0


def collective_healthy() -> bool:
    """True when every rank answers a small all-reduce with the same round number (a gloo group that timed out
    raises at once; ranks out of step give a wrong sum). World size 1 is always healthy."""
    global _health_round
    import paddle
    import paddle.distributed as dist

    world = dist.get_world_size()
    if world <= 1:
        return True
    _health_round += 1
    probe = paddle.to_tensor(np.array([1, _health_round], np.int64))
    try:
        dist.all_reduce(probe)
    except Exception:
        return False
    return probe.numpy().tolist() == [world, world * _health_round]


class PaddleAdapter(SutAdapter):
    """What both Paddle adapters share: the launcher, the runtime set-up, the collective health check, and
    scribbling over the tensors an async save was handed (each handle keeps them in ``handle.tensors``)."""

    launcher = "paddle"
    master_env = "PADDLE_MASTER"  # rank 0's TCPStore; a client that finds it closed retries seconds later
    framework = "paddle"

    @classmethod
    def preload(cls) -> None:
        super().preload()
        # what init_runtime and the checkpoint calls import, full_param's module included: fixes patch it
        # (harness/fixes/assembling), and a zygote applies a fix set only where every module it patches is imported
        import paddle.distributed.flex_checkpoint.dcp.full_param  # noqa: F401

    @classmethod
    def launch_gpus(cls, world: int, device: str = "auto") -> int:
        if device == "cpu":
            return 0
        with warnings.catch_warnings():  # Paddle warns about ccache on import; noise in a findings table
            warnings.simplefilter("ignore")
            import paddle  # the controller of a paddle-launched SUT pays for this import, no other

        count = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
        if device == "gpu" and count < world:
            raise RuntimeError(f"device gpu asked for, but Paddle sees {count} GPU(s) for {world} ranks on a node")
        return world if count >= world else 0

    @classmethod
    def virtual_world(cls, size: int) -> Any:
        from harness.ranks.virtual.paddle_world import PaddleWorld

        cls.preload()
        return PaddleWorld(size, sys.modules[__name__])

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        return init_runtime(rank, world_size, options)

    def describe(self) -> dict[str, str]:
        import paddle

        return {"device": str(paddle.get_device()), "backend": "nccl" if paddle.is_compiled_with_cuda() else "gloo"}

    def mutate(self, handle: Any) -> None:
        for local in handle.tensors:
            scribble(local)

    def healthy(self) -> bool:
        return collective_healthy()

    def close(self) -> None:
        self.end_case()


def add_nested_parameter(model: Any, name: str, shape: tuple[int, ...], dtype_code: str) -> Any:
    """A zero parameter of ``model`` under a dotted structured name ("layers.0.qkv": sub-layers ``layers`` and ``0``,
    parameter ``qkv``), as a real model nests them; returns it."""
    import paddle

    layer = model
    *path, leaf = name.split(".")
    for part in path:
        child = layer._sub_layers.get(part)
        if child is None:
            child = paddle.nn.Layer()
            layer.add_sublayer(part, child)
        layer = child
    param = model.create_parameter(list(shape), dtype=paddle_dtype_name(dtype(dtype_code)),
                                   default_initializer=paddle.nn.initializer.Constant(0.0))
    layer.add_parameter(leaf, param)
    return param


def trailing_int(name: str) -> int:
    """The version number a checkpoint name ends with ("step-12" -> 12); Paddle versions are integers."""
    match = re.search(r"(\d+)$", name)
    if match is None:
        raise ValueError(f"checkpoint name {name!r} does not end with an integer version")
    return int(match.group(1))
