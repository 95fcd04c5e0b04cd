"""CPU stand-ins for the CUDA mechanisms on PaddleFormers' Zero-Cost Checkpointing (ZCC) path (CPU Paddle 3.3.1).

Each shim is installed by name (``install(["name", ...])``) so that a probe (examples/zcc-cpu) can add them one
at a time and see the obstacle each one gets past; the ``paddleformers-zcc`` SUT installs all but
``adamw-inplace``, whose place its own reference Adam step takes. ``SHIMS`` lists them in the order a run meets
them; ``WHY`` says why each keeps the contract ZCC reads and writes. Nothing is installed when Paddle is compiled
with CUDA.

ZCC's workers are *spawned* processes (``multiprocessing.get_context("spawn")``): they start from a fresh
interpreter, so the rank's monkeypatches do not reach them. The shim ``worker-entry`` points
``zero_cost_checkpoint.worker_loop`` (looked up by name when the manager starts a worker) at ``worker_loop`` below,
which installs the worker-side shims in the child before ``worker.run()``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

WHY: dict[str, str] = {}
_INSTALLERS: dict[str, Callable[[], None]] = {}
_installed: list[str] = []


def shim(name: str, why: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Registers an installer under ``name`` with the reason it keeps ZCC's contract."""

    def register(fn: Callable[[], None]) -> Callable[[], None]:
        _INSTALLERS[name] = fn
        WHY[name] = why
        return fn

    return register


# --- the project's Trainer shims (harness/sut/paddleformers_trainer.py), Adam made in-place ----------------------


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


@shim("adamw-inplace", "AdamW's update on CPU: no BF16/multi-precision adamw kernel on CPU. The shim runs Adam in "
                       "numpy and writes master weight, moments, beta powers and the BF16 parameter back IN PLACE "
                       "(Tensor.copy_), so tensors that are views of the fused optimizer buffer / the sharding "
                       "param buffer stay views (ZCC reads those buffers, not the tensors)")
def _adamw() -> None:
    import numpy as np
    import paddle

    def update(self: Any, block: Any, param_and_grad: Any) -> Any:
        if isinstance(param_and_grad, dict):
            param_and_grad = self._update_param_group(param_and_grad)
        param, grad = param_and_grad[0], param_and_grad[1]
        low = self._multi_precision and self._is_dtype_fp16_or_bf16(param.dtype)
        master = self._master_weights[param.name] if low else param
        m1 = self._get_accumulator_master(self._moment1_acc_str, param)
        m2 = self._get_accumulator_master(self._moment2_acc_str, param)
        b1p = self._get_accumulator_master(self._beta1_pow_acc_str, param)
        b2p = self._get_accumulator_master(self._beta2_pow_acc_str, param)
        b1, b2, eps = float(self._beta1), float(self._beta2), float(self._epsilon)
        lr = float(self._learning_rate() if callable(self._learning_rate) else self._learning_rate)
        g = grad.astype("float32").numpy().reshape(-1)
        w = master.numpy().astype(np.float32).reshape(-1)
        a1, a2 = m1.numpy().reshape(-1), m2.numpy().reshape(-1)
        p1, p2 = float(b1p.numpy().reshape(-1)[0]), float(b2p.numpy().reshape(-1)[0])
        a1 = b1 * a1 + (1 - b1) * g
        a2 = b2 * a2 + (1 - b2) * g * g
        w = w - lr * (a1 / (1 - p1)) / (np.sqrt(a2 / (1 - p2)) + eps)
        for target, values in ((master, w), (m1, a1), (m2, a2)):
            target.copy_(paddle.to_tensor(values.astype(np.float32).reshape(target.shape)), False)
        b1p.copy_(paddle.to_tensor(np.full(b1p.shape, p1 * b1, np.float32)), False)
        b2p.copy_(paddle.to_tensor(np.full(b2p.shape, p2 * b2, np.float32)), False)
        if low:
            param.copy_(master.astype(param.dtype), False)
        return None

    paddle.optimizer.AdamW._append_optimize_op = update


# --- shims of the ZCC path ---------------------------------------------------------------------------------------


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


SHIMS = list(_INSTALLERS)
WORKER_SHIMS = ["base", "fusion-device-cpu", "ipc-shm", "async-load", "worker-device"]


def install_barrier_fix() -> None:
    """Applies the offload-barrier fix of a later upstream PaddleFormers. Not a CPU shim, and not in SHIMS.

    Upstream, ZeroCostCheckpointCallback.on_step_end sets ``manager.global_step = state.global_step`` before
    ``get_idle_worker_for_saving``. In 1.2.0 manager.global_step is set only by update_zcc_workers (the first
    update), so sync_offload_status compares the worker's echo of that first step with itself and never waits
    again. The probe applies this (ZCC_FIX_BARRIER=1) to show that the torn checkpoints come from that barrier.
    """
    from paddleformers.trainer.utils import zero_cost_checkpoint as zcc

    stock = zcc.ZeroCostCheckpointManager.get_idle_worker_for_saving

    def get_idle_worker_for_saving(self: Any, save_infos_and_non_cached_objects: Any = None) -> Any:
        if save_infos_and_non_cached_objects is not None:
            state = save_infos_and_non_cached_objects[1][1]  # (save_infos, (lr_scheduler, state, rng))
            self.global_step = state.global_step
        return stock(self, save_infos_and_non_cached_objects)

    zcc.ZeroCostCheckpointManager.get_idle_worker_for_saving = get_idle_worker_for_saving


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


def worker_side() -> None:
    """The worker-side shims, and the probe's knobs. The pid line lets run.sh find the worker's leftovers;
    ZCC_SHIMS names the shims to install; ZCC_SLOW_DUMP (seconds before each paddle.save) widens the dump window
    for the kill-mid-dump probe, as a large model's dump would."""
    print(f"[zcc-cpu worker] pid={os.getpid()}", flush=True)
    wanted = os.environ.get("ZCC_SHIMS", "all")
    install(WORKER_SHIMS if wanted == "all" else [n for n in wanted.split(",") if n in WORKER_SHIMS])
    delay = float(os.environ.get("ZCC_SLOW_DUMP", "0"))
    if delay > 0:
        import paddle

        stock_save = paddle.save

        def slow_save(obj: Any, path: str, *a: Any, **kw: Any) -> Any:
            time.sleep(delay)
            return stock_save(obj, path, *a, **kw)

        paddle.save = slow_save
