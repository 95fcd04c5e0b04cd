"""paddleformers-zcc: hang in P-EMA (paddleformers-zcc-ema-step-offload-never-sent)

Found by drawing gradient_accumulation_steps for the ZCC job (it ran two micro-batches per step only, because one hung; FINDINGS listed it as observed).

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddleformers-zcc-ema-step-offload-never-sent.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

from __future__ import annotations

import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

from collections import namedtuple



if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

FORMAT = 'flex_checkpoint'  # TrainingArguments.save_checkpoint_format
LOGGING_STEPS = 1
USE_ASYNC_SAVE = False  # the optimizer goes to AsyncSaver's writer
TrainingSpec = namedtuple("TrainingSpec", 'lr beta1 beta2 eps weight_decay ema_every ema_decay loss_threshold seed')
SPEC = TrainingSpec(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0, ema_every=1, ema_decay=0.5, loss_threshold=None, seed=7)  # zcc_save_ema_coef = ema_decay, zcc_ema_interval = ema_every, zcc_ema_loss_threshold = loss_threshold
PARAMS = {'w': 'BF16', 'b': 'BF16'}  # the model's parameters and their dtypes
# The reference loop as data: each step's loss (what the model's forward returns) and each parameter's
# FP32 gradient as hex (what AdamW's step applies; the forward gives zero gradients)
LOSSES = {1: 1.2028591632843018, 2: 1.1232956647872925, 3: 0.04979513958096504}
GRADIENTS = {1: {'w': 'c0565c3f4072333e400b433f40ea16be60adae3e10f81ebf', 'b': '602fd4bec04535bf'}, 2: {'w': '8031c5be307556bfa04bb53e00e45c3f007632bec003523e', 'b': 'e0e2da3e107c22bf'}, 3: {'w': '607305bf30cb03bf40603abe00b5de3d00c08cba807eda3e', 'b': '00f5c43ee077f73e'}}
HORIZON = 10000  # max_steps of a live job: the steps, not the loop, decide where it stops
# Zero-Cost Checkpointing on, beyond the Trainer's arguments: sharding stage 1 V2 with fused optimizer
# states (ZCC asserts them), one worker (ZCC's EMA asserts it), the case's micro-batches per step
ZCC_ARGUMENTS = {'split_param': True, 'enable_zero_cost_checkpoint': True, 'fuse_optimizer_states': True, 'zcc_workers_num': 1, 'gradient_accumulation_steps': 1, 'save_tokenizer': False}

CARRIERS = {'BF16': ('uint16', None), 'F32': ('float32', None), 'I64': ('int64', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'BF16': 'bfloat16', 'F32': 'float32', 'I64': 'int64'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['save', 0] = {
    0: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'ema/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '0000c73e00001bbf', (2,), ('R',), ()), 'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '00000cbf0000353f00005cbf00000f3f000050be0000893e', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0000000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, 'c73e1bbf', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '0cbf353f5cbf0f3f50be893e', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, 'd70d3259e4e1cb631c663cf4d73c4c04', (2,), ('R',), ())},
    1: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'ema/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '0000c73e00001bbf', (2,), ('R',), ()), 'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '00000cbf0000353f00005cbf00000f3f000050be0000893e', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0000000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, 'c73e1bbf', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '0cbf353f5cbf0f3f50be893e', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '0000000000000000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000000000000000000000000000000000000000000000000', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, 'd70d3259e4e1cb631c663cf4d73c4c04', (2,), ('R',), ())},
}
DATA['save', 2] = {
    0: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '5fea983e6e1ce2be', (2,), ('R',), ()), 'ema/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '92a0d6be3996063f6e1928bf38c0d83e420025befc3d573e', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '61c5cb3e1de415bf', (2,), ('R',), ()), 'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'e3580fbf20f4333f2deb60bf89f80f3fc9e15cbe9f2e903e', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0200000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, 'cc3e16bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '0fbf343f61bf103f5dbe903e', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '98afb23b814002be', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '62c6b939cae86c3a', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, '86881f3d13448bbd2af3d43d3e8c953d7488593cd6e810bd', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '88e2683a1c02403acee1383a31db483ad9c519396404e039', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '6f07f0e9c70cab95972d7d68dd191dfa', (2,), ('R',), ())},
    1: {'ema/b': Piece('F32', (2,), (0,), (2,), None, '5fea983e6e1ce2be', (2,), ('R',), ()), 'ema/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '92a0d6be3996063f6e1928bf38c0d83e420025befc3d573e', (2,), ('R',), ()), 'master/b': Piece('F32', (2,), (0,), (2,), None, '61c5cb3e1de415bf', (2,), ('R',), ()), 'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'e3580fbf20f4333f2deb60bf89f80f3fc9e15cbe9f2e903e', (2,), ('R',), ()), 'meta/step': Piece('I64', (), (), (), None, '0200000000000000', (2,), ('R',), ()), 'model/b': Piece('BF16', (2,), (0,), (2,), None, 'cc3e16bf', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '0fbf343f61bf103f5dbe903e', (2,), ('R',), ()), 'optimizer/b.m1': Piece('F32', (2,), (0,), (2,), None, '98afb23b814002be', (2,), ('R',), ()), 'optimizer/b.m2': Piece('F32', (2,), (0,), (2,), None, '62c6b939cae86c3a', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, '86881f3d13448bbd2af3d43d3e8c953d7488593cd6e810bd', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '88e2683a1c02403acee1383a31db483ad9c519396404e039', (2,), ('R',), ()), 'rng/state': Piece('I64', (2,), (0,), (2,), None, '6f07f0e9c70cab95972d7d68dd191dfa', (2,), ('R',), ())},
}

def tensor(p, zero=False):
    """A paddle tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = paddle.to_tensor(data)
    return t.view(getattr(paddle, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part (or such a triple)."""
    if isinstance(t, tuple):
        return t
    if getattr(t, "is_dist", lambda: False)():
        t = t._local_value()
    return str(t.dtype).split(".")[-1], list(t.shape), np.ascontiguousarray(t.numpy()).tobytes().hex()


PENDING = []  # the writers (threads, processes or futures) of async saves not waited for yet


def returned(writer, tensors, mutate_after, detach):
    """An async save returned: the caller overwrites its tensors (where the step says so), then waits for the
    writer unless the step leaves it running."""
    if writer is not None:
        PENDING.append(writer)
    if not detach:
        wait()

from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddleformers.trainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddleformers.transformers import PretrainedConfig, PretrainedModel  # noqa: E402

JOB = [None, None]  # the Trainer of the running job, and the checkpoint it last resumed from (None: the seeds)
import contextlib  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from paddleformers.trainer.utils import zero_cost_checkpoint as zcc  # noqa: E402


def cast_bits(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """FP32 values as the bits of ``dtype_name`` (F32, F16, or BF16 rounded to nearest even, NaNs kept quiet)."""
    values = np.asarray(values, np.float32)
    if dtype_name == "F32":
        return values.view(np.uint32).copy()
    if dtype_name == "F16":
        with np.errstate(over="ignore"):  # overflow to ±inf is the cast's defined result
            return values.astype(np.float16).view(np.uint16)
    if dtype_name == "BF16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        quiet = ((bits >> 16) | 0x40).astype(np.uint16)
        return np.where(np.isnan(values), quiet, rounded)
    raise ValueError(f"no cast to {dtype_name}")


def adam_update(spec: TrainingSpec, t: int, grad: np.ndarray, master: np.ndarray, m1: np.ndarray,
                m2: np.ndarray) -> None:
    """Step ``t`` of Adam on FP32 arrays, in place (a SUT whose optimizer the harness stands in for runs this)."""
    f32 = np.float32
    b1, b2 = f32(spec.beta1), f32(spec.beta2)
    m1[...] = b1 * m1 + (f32(1) - b1) * grad
    m2[...] = b2 * m2 + (f32(1) - b2) * (grad * grad)
    bc1, bc2 = f32(1.0 - spec.beta1**t), f32(1.0 - spec.beta2**t)
    step = (m1 / bc1) / (np.sqrt(m2 / bc2) + f32(spec.eps))
    master[...] = master - f32(spec.lr) * (step + f32(spec.weight_decay) * master)


# CPU stand-ins for the CUDA mechanisms on ZCC's path (nothing is installed on a CUDA build)
WHY = {}
_INSTALLERS = {}
_installed = []


def shim(name: str, why: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Registers an installer under ``name`` with the reason it keeps ZCC's contract."""

    def register(fn: Callable[[], None]) -> Callable[[], None]:
        _INSTALLERS[name] = fn
        WHY[name] = why
        return fn

    return register


@shim("base", "Tensor.cuda/.cpu/.pin_memory -> a CPU copy (on a GPU each makes a new tensor); device.synchronize -> "
              "no-op (CPU kernels are synchronous); FLAGS_selected_gpus = local rank (what the launcher sets on GPUs); "
              "BF16 `+` in FP32 rounded to BF16 (no CPU BF16 add kernel): the project's Trainer shims")
def _base() -> None:
    import paddle

    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.clone()

    paddle.Tensor.cuda = copy
    paddle.Tensor.cpu = copy
    paddle.Tensor.pin_memory = copy
    paddle.device.synchronize = lambda device=None: None
    os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", "0"))
    add = paddle.Tensor.__add__

    def bf16_add(a: Any, b: Any) -> Any:
        if isinstance(b, paddle.Tensor) and a.dtype == paddle.bfloat16 and b.dtype == paddle.bfloat16:
            return add(a.astype("float32"), b.astype("float32")).astype("bfloat16")
        return add(a, b)

    paddle.Tensor.__add__ = bf16_add


@shim("fusion-device-cpu", "tensor_fusion_helper / fusion_utils.get_current_device_type assert gpu|npu|xpu (a "
                           "CPUPlace reports 'unknown'): the device type is fixed to 'cpu' with the GPU alignment "
                           "(256 bytes). The value only pads buffer slots; ZCC reads the resulting start/end offsets "
                           "from the same metas, whatever the padding")
def _fusion_device() -> None:
    from paddle.distributed.fleet.utils import tensor_fusion_helper as tfh
    from paddle.optimizer import fusion_utils as fu

    for mod in (tfh, fu):
        mod.alignment["cpu"] = 256
        mod.__current_device_type__ = "cpu"


class _DoneCommTask:
    """What an async collective returns: a task to wait on. The gloo collective behind it has already finished."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@shim("gloo-reduce-scatter", "sharding stage1 V2 (split_param, which fuse_optimizer_states needs) reduce-scatters "
                             "gradients; ProcessGroupGloo has no reduce_scatter. Shim: all_reduce a copy of the "
                             "whole input, then copy this rank's chunk into the output in place, and return a "
                             "finished task. Same result as reduce_scatter (SUM); not a ZCC mechanism")
def _gloo_reduce_scatter() -> None:
    import paddle
    import paddle.distributed as dist

    stock = dist.reduce_scatter

    def reduce_scatter(tensor: Any, tensor_list: Any, op: Any = dist.ReduceOp.SUM, group: Any = None,
                       sync_op: bool = True) -> Any:
        if not isinstance(tensor_list, paddle.Tensor):
            return stock(tensor, tensor_list, op=op, group=group, sync_op=sync_op)
        full = tensor_list.clone()
        dist.all_reduce(full, op=op, group=group, sync_op=True)
        n = tensor._numel()
        rank = max(group.rank if group is not None else dist.get_rank(), 0)
        tensor.copy_(full.flatten()._slice(rank * n, (rank + 1) * n).reshape(tensor.shape), False)
        return _DoneCommTask()

    dist.reduce_scatter = reduce_scatter
    paddle.distributed.reduce_scatter = reduce_scatter


@shim("gloo-calc-stream", "sharding-IO resume under stage1 V2 (reshard/sharding_v2.is_matched_optimizer_state_dict) "
                          "calls paddle.distributed.stream.all_reduce(..., use_calc_stream=True), which gloo refuses. "
                          "use_calc_stream only picks the CUDA stream; on CPU the shim drops it and runs the same "
                          "synchronous all_reduce. Not a ZCC mechanism")
def _gloo_calc_stream() -> None:
    import paddle.distributed as dist
    from paddle.distributed.communication import stream

    stock = stream.all_reduce

    def all_reduce(tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, sync_op: bool = True,
                   use_calc_stream: bool = False) -> Any:
        if use_calc_stream:
            return dist.all_reduce(tensor, op=op, group=group, sync_op=True)
        return stock(tensor, op=op, group=group, sync_op=sync_op, use_calc_stream=use_calc_stream)

    stream.all_reduce = all_reduce


def _to_shm(tensor: Any) -> tuple:
    """Moves a CPU tensor's storage into POSIX shared memory (once: a tensor already there keeps its storage) and
    returns the meta `_new_shared_filename` opens, the CPU form of `_share_cuda`'s IPC handle."""
    return tensor.value().get_tensor()._share_filename(False)


@shim("ipc-shm", "CUDA IPC -> POSIX shared memory: `_share_tensor_ipc_meta` (fusion_utils, tensor_fusion_helper) and "
                 "`DenseTensor._share_cuda` -> `_share_filename(False)`, `_new_shared_cuda` -> "
                 "`_new_shared_filename`. Same contract: the worker opens the SAME bytes the trainer updates. "
                 "`_share_filename` re-homes a tensor not yet in shm (views made earlier by _share_buffer_to would "
                 "be cut off; check_shm_views.py), so the fused optimizer buffer is moved to shm in "
                 "FusionStorage.build_buffer, before mapping_tensor makes the moments/master weights views of it; "
                 "the sharding param buffer is shared by build_reduce_scatter_buffer right after paddle.zeros, "
                 "before its views, as on GPU")
def _ipc() -> None:
    from paddle.base import core
    from paddle.distributed.fleet.utils import tensor_fusion_helper as tfh
    from paddle.optimizer import fusion_utils as fu

    def share(tensor: Any) -> Any:
        return None if tensor is None else _to_shm(tensor)

    fu._share_tensor_ipc_meta = share
    tfh._share_tensor_ipc_meta = share
    try:
        from paddleformers.trainer.utils import zero_cost_checkpoint as zcc

        zcc._share_tensor_ipc_meta = share
    except ImportError:
        pass
    core.DenseTensor._share_cuda = lambda self: self._share_filename(False)
    core.DenseTensor._new_shared_cuda = staticmethod(core.DenseTensor._new_shared_filename)
    build = fu.FusionStorage.build_buffer

    def build_buffer_in_shm(self: Any) -> None:
        build(self)
        _to_shm(self.buffer)

    fu.FusionStorage.build_buffer = build_buffer_in_shm


class _DoneTask:
    """What AsyncLoad's offload returns: a task to wait on. The CPU copy is already done."""

    def cuda_wait(self) -> None:
        return None

    def cpu_wait(self) -> None:
        return None

    def is_completed(self) -> bool:
        return True


class CpuAsyncLoad:
    """core.AsyncLoad (device->pinned-host copies on a side stream) as a synchronous CPU copy of the same range."""

    def offload_with_offset(self, dst: Any, src: Any, dst_offset: int, src_offset: int, size: int) -> _DoneTask:
        delay = float(os.environ.get("ZCC_SLOW_OFFLOAD", "0"))
        if delay > 0:  # a device->host copy of a large buffer takes time: the probe's knob to widen that window
            time.sleep(delay)
        dst._slice(dst_offset, dst_offset + size).copy_(src._slice(src_offset, src_offset + size), False)
        return _DoneTask()


@shim("async-load", "core.AsyncLoad (absent from the CPU build) -> CpuAsyncLoad: offload_with_offset copies "
                    "src[src_off:src_off+n] into dst[dst_off:dst_off+n] in place and returns a task whose "
                    "cuda_wait/cpu_wait return at once (the copy is done). ZCC then reads the destination buffer, "
                    "exactly the range it asked for")
def _async_load() -> None:
    from paddle.base import core

    core.AsyncLoad = CpuAsyncLoad


@shim("worker-device", "ZeroCostCheckpointWorker.run: core.set_cuda_current_device_id (absent) -> no-op, "
                       "paddle.set_device('gpu:N') -> 'cpu'. The worker only picks its device here")
def _worker_device() -> None:
    import paddle
    from paddle.base import core

    core.set_cuda_current_device_id = lambda device_id: None
    stock = paddle.set_device

    def set_device(device: str) -> Any:
        return stock("cpu" if str(device).startswith("gpu") else device)

    if not getattr(paddle.set_device, "_zcc_shim", False):
        set_device._zcc_shim = True
        paddle.set_device = set_device


@shim("worker-entry", "spawned ZCC workers start from a fresh interpreter: zero_cost_checkpoint.worker_loop -> "
                      "harness.sut.zcc_shims.worker_loop, which installs the worker-side shims, then calls "
                      "worker.run() (the stock worker_loop's whole body)")
def _worker_entry() -> None:
    from paddleformers.trainer.utils import zero_cost_checkpoint as zcc

    zcc.worker_loop = worker_loop


def install(names: list[str] | str) -> list[str]:
    """Installs the named shims ("all": every one, in SHIMS order) once each; returns the names installed so far."""
    import paddle

    if paddle.is_compiled_with_cuda():
        return []
    if names == "all":
        names = SHIMS
    for name in names:
        if name not in _installed:
            _INSTALLERS[name]()
            _installed.append(name)
    return list(_installed)


def worker_loop(worker: Any) -> None:
    """Entry point of a spawned ZCC worker: the worker side of the shims the rank installed, then the worker (the
    stock worker_loop's whole body). A standalone repro carries this function as text with its own
    ``worker_side``."""
    worker_side()
    worker.run()


SHIMS = list(_INSTALLERS)  # every shim carried, in the order a run meets them
RANK_SHIMS = ['base', 'fusion-device-cpu', 'gloo-reduce-scatter', 'gloo-calc-stream', 'ipc-shm', 'async-load', 'worker-device', 'worker-entry']
WORKER_SHIMS = ['base', 'fusion-device-cpu', 'ipc-shm', 'async-load', 'worker-device']


def worker_side():
    """The worker side of the shims: ZCC's workers are spawned, fresh interpreters the rank's patches do not reach."""
    install(WORKER_SHIMS)


if __name__ == "__mp_main__":  # this file, imported again in a spawned ZCC worker (before it unpickles its task)
    worker_side()


def adam_step(opt, block, param_and_grad):
    """AdamW's update of one parameter: the reference's Adam step with the listed gradient, on the optimizer's own
    moments, master weight and beta powers (CPU Paddle has no BF16 adamw kernel), over the elements of the flattened
    parameter this rank's optimizer holds (owned_range), written in place: where the optimizer's tensors are views
    of a fused buffer (Zero-Cost Checkpointing's workers read it), they stay views."""
    if isinstance(param_and_grad, dict):
        param_and_grad = opt._update_param_group(param_and_grad)
    param = param_and_grad[0]
    name = JOB[0].harness_names[param.name]
    t = JOB[0].state.global_step + 1
    low = opt._multi_precision and opt._is_dtype_fp16_or_bf16(param.dtype)
    master = opt._master_weights[param.name] if low else param
    m1 = opt._get_accumulator_master(opt._moment1_acc_str, param)
    m2 = opt._get_accumulator_master(opt._moment2_acc_str, param)
    arrays = [x.numpy().astype(np.float32).reshape(-1) for x in (master, m1, m2)]
    lo, hi = owned_range(param)
    grad = np.zeros(arrays[0].size, np.float32)  # past the parameter's end: padding, which no gradient reaches
    grad[:hi - lo] = np.frombuffer(bytes.fromhex(GRADIENTS[t][name]), np.float32)[lo:hi]
    adam_update(SPEC, t, grad, *arrays)
    for target, values in zip((master, m1, m2), arrays):
        target.copy_(paddle.to_tensor(values.reshape(target.shape)), False)
    for acc, beta in ((opt._beta1_pow_acc_str, SPEC.beta1), (opt._beta2_pow_acc_str, SPEC.beta2)):
        pow_acc = opt._get_accumulator_master(acc, param)
        pow_acc.copy_(pow_acc * beta, False)
    if low:
        bits = np.ascontiguousarray(cast_bits(arrays[0], PARAMS[name])).tobytes().hex()
        param.copy_(tensor(Piece(PARAMS[name], None, None, list(param.shape), None, bits, None, (), ())), False)


class HarnessConfig(PretrainedConfig):
    model_type = "ckpt_harness_trainer"


class HarnessModel(PretrainedModel):
    config_class = HarnessConfig
    base_model_prefix = "harness"

    def forward(self, x=None, labels=None):
        """The step's loss (LOSSES), and a zero gradient for every parameter (adam_step applies GRADIENTS)."""
        loss = paddle.to_tensor(np.float32(LOSSES[JOB[0].state.global_step + 1]))
        for p in self.parameters():
            loss = loss + 0.0 * p.astype("float32").sum()
        return (loss,)


def tiny_model():
    """The model at step 0: its parameters ("layers.0.w" nests sub-layers) hold the job's initial pieces."""
    model = HarnessModel(HarnessConfig())
    for name, dtype in sorted(PARAMS.items()):
        piece = DATA["save", 0][RANK]["model/" + name]
        layer, (*path, leaf) = model, name.split(".")
        for part in path:
            if part not in layer._sub_layers:
                layer.add_sublayer(part, paddle.nn.Layer())
            layer = layer._sub_layers[part]
        param = model.create_parameter(list(piece.shape), dtype=DTYPE_NAMES[dtype],
                                       default_initializer=paddle.nn.initializer.Constant(0.0))
        layer.add_parameter(leaf, param)
        param.set_value(tensor(piece))
    return model


class Steps:
    """The data: one dummy sample per step and rank (the loss does not read it)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.zeros(1, np.float32), "labels": np.zeros(1, np.float32)}


def trainer_for(max_steps, **more):
    """A Trainer over the model at step 0: the EMA without Zero-Cost Checkpointing, sharding stage 1 over every rank
    (the Trainer builds this EMA only for a hybrid-parallel job), AMP O2 for BF16 parameters (FP32 master weights),
    the case's saves only (the loop's own schedule off), no gradient clipping; ``more``: arguments beyond these."""
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    low = any(dtype != "F32" for dtype in PARAMS.values())
    args = TrainingArguments(**{**dict(
        output_dir=ROOT, max_steps=max_steps, save_strategy="no", save_steps=SPEC.ema_every, report_to="none",
        disable_tqdm=True, logging_steps=LOGGING_STEPS, per_device_train_batch_size=1, seed=SPEC.seed,
        learning_rate=SPEC.lr, max_grad_norm=0.0, save_checkpoint_format=FORMAT, load_checkpoint_format=FORMAT,
        zcc_save_ema_coef=SPEC.ema_decay, zcc_ema_interval=SPEC.ema_every, zcc_ema_loss_threshold=SPEC.loss_threshold,
        amp_master_grad=low, split_param=False, use_async_save=USE_ASYNC_SAVE, sharding="stage1" if world > 1 else "",
        sharding_parallel_size=world if world > 1 else -1, **({"bf16": True, "fp16_opt_level": "O2"} if low else {}),
        **({"save_sharded_model": True, "load_sharded_model": True} if FORMAT == "sharding_io" else {}),
    ), **more})
    model = tiny_model()
    samples = max_steps * max(world, 1) * args.gradient_accumulation_steps + 8
    trainer = Trainer(model=model, args=args, train_dataset=Steps(samples))
    trainer.harness_names = {param.name: name for name, param in model.named_parameters()}
    JOB[0] = trainer
    return trainer



BEGIN, END = 'begin', 'end'

class JobStopped(Exception):
    """Raised inside the loop, at a pause, to end the job where it stands."""


class TrainerJob:
    """One ``Trainer.train(resume_from_checkpoint=...)`` run, paused at ``(BEGIN, step)`` and ``(END, step)``."""

    def __init__(self, trainer: Any, resume: str | None,
                 scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> None:
        """``scope``: a context the whole run stays in (e.g. Paddle's name scope, which a run in a thread does
        not inherit from the code that built the trainer)."""
        self.trainer = trainer
        self._scope = scope
        self._commands: queue.Queue[str] = queue.Queue()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.at: tuple[str, int] | None = None
        self.finished = False
        trainer.callback_handler.callbacks.insert(1, _gate(self))  # after the default flow, before the rest
        self._thread = threading.Thread(target=self._run, args=(resume,), name="trainer-job", daemon=True)
        self._thread.start()
        self._next()

    def go(self) -> tuple[str, int]:
        """Run to the next pause."""
        return self._send("go")

    def save_here(self) -> tuple[str, int]:
        """At a step's end: have the loop save this step, then run to the next step's begin."""
        if self.at is None or self.at[0] != END:
            raise RuntimeError(f"the loop saves at a step's end; the job is at {self.at}")
        return self._send("save")

    def stop(self) -> None:
        """End the loop where it stands (the thread unwinds out of ``train``)."""
        if not self.finished:
            self._commands.put("stop")
            self._thread.join()
            self.finished = True

    def _send(self, command: str) -> tuple[str, int]:
        if self.finished:
            raise RuntimeError("the Trainer job has ended")
        self._commands.put(command)
        return self._next()

    def _next(self) -> tuple[str, int]:
        kind, value = self._events.get()
        if kind == "error":
            self.finished = True
            self._thread.join()
            raise value
        if kind == "done":
            self.finished = True
            self._thread.join()
            raise RuntimeError(f"the Trainer job ended by itself after step {value}")
        self.at = (kind, value)
        return self.at

    def _run(self, resume: str | None) -> None:
        try:
            with self._scope():
                self.trainer.train(resume_from_checkpoint=resume)
        except JobStopped:
            self._events.put(("stopped", -1))
        except BaseException as exc:  # handed to the harness thread, which raises it
            self._events.put(("error", exc))
        else:
            self._events.put(("done", self.trainer.state.global_step))

    def pause(self, kind: str, step: int) -> str:
        """Called in the job's thread: report where the loop stands, wait for the harness's command."""
        self._events.put((kind, step))
        command = self._commands.get()
        if command == "stop":
            raise JobStopped()
        return command


def _gate(job: TrainerJob) -> Any:
    from paddleformers.trainer import TrainerCallback

    class Gate(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            job.pause(BEGIN, state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # the harness decides, not the loop's schedule (the default flow may have set it from save_steps)
            control.should_save = job.pause(END, state.global_step) == "save"

    return Gate()


def _optimizers(trainer: Any) -> list[Any]:
    """The optimizer and the ones it wraps, outermost first (hybrid-parallel, sharding, AdamW)."""
    chain = [trainer.optimizer]
    while hasattr(chain[-1], "_inner_opt"):
        chain.append(chain[-1]._inner_opt)
    return chain


def _sharding(trainer: Any) -> Any:
    return next(o for o in _optimizers(trainer) if hasattr(o, "_slice_params"))


def _slices(trainer: Any) -> dict[str, tuple[int, int]]:
    """Per parameter (its static name), the elements this rank's optimizer holds, ``[lo, hi)`` of the flattened
    parameter (empty where the rank's slice is padding alone): stage 1 V2 splits each comm buffer evenly over the
    ranks, and a parameter sits at ``_index`` in it, padded."""
    out: dict[str, tuple[int, int]] = {}
    for buffer in _sharding(trainer)._comm_buffer_list:
        for param in buffer._params:
            view = buffer._sharding_param_grad_view[param.name]
            lo = int(view._param_begin - view._index)
            hi = min(int(view._param_end - view._index), int(np.prod(param.shape)))
            out[param.name] = (lo, max(lo, hi))
    return out


def _idle(manager: Any) -> bool:
    """Whether every live worker is idle or has failed: none is offloading or dumping."""
    from paddleformers.trainer.utils.zero_cost_checkpoint import ZCCWorkerStatus

    done = {ZCCWorkerStatus.IDLE.value, ZCCWorkerStatus.ERROR.value}
    return all(w.status.value in done for w, p in zip(manager.workers, manager.processes) if p.is_alive())


LIVE = [None]  # the live job (TrainerJob)
TRAIN_GRACE = 3.0  # seconds the job trains (or saves) with its worker held before the worker goes on
HELD = []  # pids of ZCC workers stopped (SIGSTOP) until resume()
HOLDING = threading.Lock()  # the grace timer lets them go from its own thread


def owned_range(param):
    """The elements of the flattened parameter this rank's optimizer holds: its stage-1 V2 slice."""
    return _slices(JOB[0])[param.name]


def start_job(resume_from):
    """A live job with ZCC on (its manager spawns its worker), resumed from ``resume_from`` (None: step 0), paused
    as its first step begins. Paddle names parameters from a process-wide counter; each job counts from zero."""
    with paddle.utils.unique_name.guard():
        trainer = trainer_for(HORIZON, **ZCC_ARGUMENTS)
    LIVE[0] = TrainerJob(trainer, resume_from, scope=paddle.utils.unique_name.guard)
    return LIVE[0]


def end_job():
    """End the live job as the end of train() does: the loop stops where it stands, ZCC's finalize finishes a save
    in flight and ends the workers; the shared memory the CPU stand-in for CUDA IPC made goes with them."""
    job, LIVE[0] = LIVE[0], None
    if job is None:
        return
    resume()
    job.stop()
    manager = getattr(job.trainer, "zcc_manager", None)
    if manager is not None:
        manager.finalize()
    made = f"paddle_{os.getpid()}_"
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else ():
        if name.startswith(made):
            os.unlink(os.path.join("/dev/shm", name))


def train(to_step, pieces):
    """Train the live job on to ``to_step`` (a new job starts from the checkpoint last loaded, else step 0)."""
    job = LIVE[0] if LIVE[0] is not None else start_job(JOB[1])
    with grace():
        while job.at[1] < to_step:
            job.go()
    return observe(job.trainer, pieces)


def save(name, pieces, async_save=False, detach=False):
    """The loop's own save at the end of the step the job stands at (control.should_save): ZCC's callback hands it
    to its worker, which copies the buffers out while the next steps train, then writes checkpoint-N. An async
    save returns as the job stands at the next step's begin."""
    job, step = LIVE[0], int(name.rsplit("-", 1)[-1])
    if job is None or job.at != (END, step):
        raise RuntimeError(f"save {name}: ZCC saves at the end of a step the job trained; the job is at "
                           f"{None if job is None else job.at}")
    job.trainer.args.output_dir = ROOT
    with grace():
        job.save_here()
    writer = (job, os.path.join(ROOT, f"checkpoint-{step}", f"saved_signal_{dist.get_rank()}"))
    if async_save:
        returned(writer, (), False, detach)
    else:
        finish(writer)


def finish(writer):
    """Until the worker has written the save: first the copy out of the buffers, as ZCC's finalize drives it when
    nothing trains on (a job that trains on drives it from its micro-steps), then the dump, until the worker's
    saved_signal_<rank> and the worker idle again, ZCC's own "this rank is done"; a worker that failed says so
    (ZCC's own check)."""
    job, done = writer
    manager = job.trainer.zcc_manager
    if not job.finished and job.at[0] == BEGIN and manager.current_worker is not None:
        for hook in range(manager.pipeline_hooks_steps):
            manager.zcc_pipeline_hook(hook)
        manager.sync_offload_status()
    while not os.path.exists(done) or not _idle(manager):
        manager.report_error_worker()
        time.sleep(0.01)


def wait():
    """Every save in flight, oldest first, its held worker let go first."""
    resume()
    while PENDING:
        finish(PENDING.pop(0))


def load(name, pieces):
    """End the live job (as train() ends) and resume a new one from ``name``'s checkpoint-N (None: the one
    get_last_checkpoint picks), paused as its first step begins: its state, and the EMA it handed its worker."""
    end_job()
    path = get_last_checkpoint(ROOT) if name is None else os.path.join(ROOT, f"checkpoint-{name.rsplit('-', 1)[-1]}")
    if path is None:
        raise Failed(f"get_last_checkpoint found no checkpoint-N under {ROOT}")
    JOB[1] = path
    job = start_job(path)
    return observe(job.trainer, pieces, handed_ema(job.trainer))


def noting_the_ema(set_ema_state_dict):
    """ZCC's manager hands a resumed job's EMA file to its worker: noted, to be read as the worker reads it."""
    def noted(self, path):
        self.handed_ema = path
        return set_ema_state_dict(self, path)
    return noted


@contextlib.contextmanager
def grace():
    """Train (or save) with the worker held: a job that goes on without waiting for its worker (the race a stalled
    save decides) is done long before TRAIN_GRACE; one that waits for it (ZCC's offload barrier) gets it back then,
    so a correct wait is slow, never a hang."""
    if not HELD:
        yield
        return
    timer = threading.Timer(TRAIN_GRACE, resume)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def resume(how=signal.SIGCONT):
    """Let the held workers go on (or end them: SIGKILL)."""
    with HOLDING:
        pids, HELD[:] = list(HELD), []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)



def optimizer_slot(opt, owner, slot):
    """A moment as the job holds it: made by a step, else kept aside by the resume until the first step makes it."""
    made = opt._accumulators.get(slot, {}).get(owner)
    if made is not None:
        return made
    prefix = f"{owner}_{slot}_"
    return next((v for k, v in opt._accumulators_holder.items() if k.startswith(prefix) and k[len(prefix):].isdigit()),
                None)


def observe(trainer, pieces, ema=None):
    """The job's state by key, as (dtype, shape, bits): the parameters (whole: stage 1 gathers them after each
    step), master weights and moments put together from every rank's stage-1 V2 slice (the rest of a slice is
    padding), ``ema`` (a load's: what the resumed job handed its worker); a slot no rank holds yet is what the job
    had at step 0; the step. (The reference's rng/state is the stream its data comes from; the Trainer has none.)"""
    inner, sharding, slices = _optimizers(trainer)[-1], _sharding(trainer), _slices(trainer)
    named = dict(trainer.model.named_parameters())
    mine = dict(ema or {})
    for name, dtype in PARAMS.items():
        param = named[name]
        mine["model/" + name] = bits_of(param)
        if dtype == "F32":
            mine["master/" + name] = (0, param.numpy().reshape(-1))
        lo, hi = slices[param.name]
        if hi <= lo:
            continue
        master = sharding._slice_params[param.name] if dtype == "F32" else inner._master_weights.get(param.name)
        if master is None:
            continue
        if dtype != "F32":
            mine["master/" + name] = (lo, master.numpy().reshape(-1)[:hi - lo])
        for slot, family in (("moment1", "m1"), ("moment2", "m2")):
            acc = optimizer_slot(inner, master.name, slot)
            if acc is not None:
                mine[f"optimizer/{name}.{family}"] = (lo, acc.numpy().reshape(-1)[:hi - lo])
    gathered = []
    dist.all_gather_object(gathered, mine)
    state = assemble(gathered)
    for key, p in DATA["save", 0][RANK].items():
        if key.split("/")[0] in ("model", "master", "optimizer"):
            state.setdefault(key, (DTYPE_NAMES[p.dtype], list(p.shape), p.bits))
    for name in PARAMS if ema is not None else ():  # no rank handed its worker an EMA: it starts at zero
        state.setdefault("ema/" + name, whole(name, np.zeros(size_of(name), np.float32)))
    state["meta/step"] = ("int64", [], np.array(trainer.state.global_step, np.int64).tobytes().hex())
    return state


def shape_of(name):
    return list(DATA["save", 0][0]["model/" + name].global_shape)


def size_of(name):
    return int(np.prod(shape_of(name), dtype=np.int64))


def whole(name, values):
    return ("float32", shape_of(name), np.ascontiguousarray(values.astype(np.float32)).tobytes().hex())


def assemble(gathered):
    """Whole tensors from every rank's parts: a whole one (the first rank's) or FP32 slices at their offsets (which
    must cover it)."""
    state, slices = {}, {}
    for part in gathered:
        for key, value in part.items():
            if isinstance(value[0], int):
                slices.setdefault(key, []).append(value)
            else:
                state.setdefault(key, tuple(value))
    for key, parts in slices.items():
        name = key.split("/", 1)[1]
        name = name.rsplit(".", 1)[0] if key.startswith("optimizer/") else name  # optimizer/<name>.m1
        flat, covered = np.zeros(size_of(name), np.float32), np.zeros(size_of(name), bool)
        for lo, values in parts:
            flat[lo:lo + values.size] = values
            covered[lo:lo + values.size] = True
        if covered.all():
            state[key] = whole(name, flat)
    return state


def handed_ema(trainer):
    """This rank's part of the EMA the resumed job handed its worker (the file set_ema_state_dict was given, read
    as the worker reads it), as slices at their offsets."""
    if getattr(trainer.zcc_manager, "ema_shared_metas", None) is not None:
        raise RuntimeError("the resume handed its EMA over shared memory (a reshard), which this script does not read")
    path, slices = getattr(trainer.zcc_manager, "handed_ema", None), _slices(trainer)
    static = {name: param.name for name, param in trainer.model.named_parameters()}
    held = paddle.load(path) if path is not None else {}
    mine = {}
    for name, dtype in PARAMS.items():
        value = held.get(name if dtype == "F32" else f"{name}.w_0")
        if value is not None:
            values = value.astype("float32").numpy().reshape(-1)
            mine["ema/" + name] = (0 if values.size == size_of(name) else slices[static[name]][0], values)
    return mine








def check(step, got, pieces, also=(), should="what was saved"):
    """Every loaded piece must have the dtype and the exact bits that were saved: by one save as a whole (``also``:
    the other saves it may rightly give, after a kill in the middle of a re-save of the name). ``should`` says what
    the pieces are."""
    def held(key, p):
        dtype, shape, bits = bits_of(got[key])
        return (dtype, shape, bits) == (DTYPE_NAMES[p.dtype], list(p.shape), p.bits), (dtype, shape, bits)

    keys = [key for key in pieces if key in got]  # not in got: an empty flattened slice, nothing was asked for
    gave = {i for i, saved in enumerate((pieces, *also)) if all(held(key, saved[key])[0] for key in keys)}
    if also and dist.is_initialized():  # one save as a whole: every rank must have given the same one
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(gave))
        everyone = [g for g in everyone if g is not None]  # torch fills the list in place, Paddle appends to it
        common = set.intersection(*(set(g) for g in everyone))
        if gave and not common:
            print(f"BUG: {step} on rank {RANK}: the ranks gave different saves' data (by rank: {everyone}), "
                  "a state no save wrote")
            print(f"EXPECTED: one of the {1 + len(also)} saves it may give, on every rank")
            print(f"ACTUAL:   saves by rank (0: the save this step names, 1 on: the others) {everyone}")
            sys.exit(1)
        gave = common
    if gave:
        return
    for key in keys:
        p = pieces[key]
        same, (dtype, shape, bits) = held(key, p)
        if not same:
            print(f"BUG: {step} on rank {RANK}: {key} does not hold {should}"
                  + (f" (by any of the {1 + len(also)} saves it may give)" if also else ""))
            print(f"EXPECTED: {DTYPE_NAMES[p.dtype]} {list(p.shape)} bits {p.bits}")
            print(f"ACTUAL:   {dtype} {shape} bits {bits}")
            sys.exit(1)


class Failed(Exception):
    """A failure this script detects itself (the framework only logged it)."""


def run(step, action, *args, expect_error=False, tolerate=False, may_fail=False, also=(), **kwargs):
    """Run one step; an error where none is due (or none where one is), or a load that gives back other bits than
    were saved, shows the bug. ``may_fail``: the save it reads was killed part-way, never acknowledged, or its files
    were damaged since: an error is a right answer there, other bits are not."""
    try:
        result = action(*args, **kwargs)
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise
        if traceback.extract_tb(exc.__traceback__)[-1].filename == __file__ and not isinstance(exc, Failed):
            raise  # a mistake of this script, not the framework's failure
        if tolerate:
            print(f"{step} fails on rank {RANK} too ({type(exc).__name__}: {exc}): another known bug this case "
                  "passes through on the way to the one reported; going on")
            return None
        if expect_error:
            print(f"{step}: raised as it should ({type(exc).__name__})")
            return None
        if may_fail:
            print(f"{step}: raised ({type(exc).__name__}), a right answer: the save it reads was killed part-way "
                  "or its files were damaged")
            return None
        print(f"BUG: {step} raised on rank {RANK}")
        print("EXPECTED: it succeeds")
        lines = str(exc).strip().splitlines() or [""]
        last = f" ... {lines[-1].strip()}" if len(lines) > 1 else ""
        print(f"ACTUAL:   {type(exc).__name__}: {lines[0]}{last}")
        sys.exit(1)
    if expect_error:
        print(f"BUG: {step} succeeded on rank {RANK}")
        print("EXPECTED: an error (the checkpoint it reads is not there or not whole)")
        print("ACTUAL:   no error")
        sys.exit(1)
    if action.__name__ in ("load", "train") and not tolerate:  # a job that trains: its state after the step
        check(step, result, args[-1], also, "what was saved" if action is load else "the uninterrupted run's state")

def main():
    global ROOT, PHASE, RANK
    ROOT, PHASE = sys.argv[1], int(sys.argv[2])
    paddle.set_device("cpu")
    RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    install(RANK_SHIMS)
    paddle.optimizer.AdamW._append_optimize_op = adam_step
    zcc.ZeroCostCheckpointManager.set_ema_state_dict = noting_the_ema(zcc.ZeroCostCheckpointManager.set_ema_state_dict)
    if PHASE == 0:  # 2 process(es)
        run('step 0: train to step 2', train, 2, DATA['save', 2][RANK])
    end_job()
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
