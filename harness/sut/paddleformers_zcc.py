"""PaddleFormers' Zero-Cost Checkpointing (ZCC) as a system under test: the Trainer's loop saves, ZCC's workers write.

A training case runs as one live Trainer job (harness.sut.trainer_job): ``Trainer.train`` with
``enable_zero_cost_checkpoint``, paused between steps. A ``save`` is the loop's own save at the step the job stands
at: ZCC's callback hands it to its worker process, which copies the fused optimizer buffer and the parameters out
of shared memory while the next steps train, and dumps the checkpoint (flex-checkpoint format). An async save
returns there; a sync one, and ``wait``, first finish the copy as ZCC's ``finalize`` does when a job ends on a
save step, then wait for the worker to go idle. ``kill_pending`` SIGKILLs the workers. A ``load`` ends the job
(``finalize``, as the end of ``train`` does) and resumes a new one, paused before its first step.

What the harness reads, and where:
* parameters, master weights and moments from the rank processes. ZCC needs sharding stage 1 V2
  (``split_param``) with ``fuse_optimizer_states``, so each rank's optimizer holds a slice of every parameter's
  flattened (padded) master weight and moments: the slices of all ranks are put together;
* the EMA lives in the worker (``ZeroCostCheckpointEMAProcessor``), so only a checkpoint shows it
  (``ema_seen: saved``): a train op's record leaves it out, and a load reports the EMA file the resumed job hands
  to its worker (or zeros, where the job hands none: the worker's EMA then starts over).

Where the harness stands in (docs/paddleformers-notes.md, "Zero-Cost Checkpointing on CPU ranks"): the CUDA
mechanisms on ZCC's path are harness.sut.zcc_shims; AdamW's update is the reference loop's Adam step on this rank's
slice, written in place so the moments and master weights stay views of the fused buffer ZCC's worker reads;
the model's forward returns the reference loss (the Trainer SUT's model). The job accumulates one or two
micro-batches per step (``gradient_accumulation_steps``, drawn): ZCC sizes its offload in steps of the
accumulation, and with one micro-batch an EMA step that is no save step never asks for its offload
(``paddleformers-zcc-ema-step-offload-never-sent``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from faults.procs import remove_shared_memory
from harness.sut import paddleformers_trainer as job_model
from harness.sut._paddle_common import apply_cpu_shims, from_paddle, to_paddle, trailing_int
from harness.sut.base import RankTensor
from harness.sut.paddleformers_trainer import (
    LOGGING_STEPS,
    PaddleFormersTrainerSut,
    TrainerCaseError,
    _fresh_names,
    _optimizers,
    _pack,
    _unpack,
    expert_parallel,
    optimizer_slot,
)
from harness.sut.paddleformers_uc import checkpoint_to_resume
from harness.sut.trainer_job import BEGIN, END, TrainerJob
from reference.dtypes import dtype
from reference.moe import expert_parallel_degree, keyed_expert_id
from reference.namespaces import STEP_KEY
from reference.tensor import Tensor
from reference.training import (
    RNG_KEY,
    Param,
    TrainingSpec,
    adam_update,
    cast_bits,
    family_keys,
    gradient,
    initial_state,
    rng_output,
    rng_state,
    seen_live,
)

FORMAT = "flex_checkpoint"
HORIZON = 10_000  # max_steps of a live job: the case's ops, not the loop, decide where it stops
ACCUMULATIONS = (1, 2)  # micro-batches per step; more would sum the reference loss in rounded quarters
SETTLE_S = 30.0  # how long a stall waits for ZCC's workers to finish what they hold from before the save


class _Save:
    """An in-flight ZCC save: the job whose worker writes it, and the file that says this rank's dump is done."""

    def __init__(self, job: TrainerJob, signal: Path) -> None:
        self.job, self.signal = job, signal

    @property
    def manager(self) -> Any:
        return self.job.trainer.zcc_manager


class PaddleFormersZccSut(PaddleFormersTrainerSut):
    """"min_world:2": TrainingArguments asserts hybrid parallelism for Zero-Cost Checkpointing, which a job of one
    rank does not have (ZCC's design)."""

    name = "paddleformers-zcc"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"trains", "replicated", "reshard", "min_world:2", "moe", "moe:keyed", "ep_change", "latest", "async",
         "kill_writer", "master_init:param", "ema_seen:saved", "ema_every:1",
         "dtype:I64", "dtype:F32", "dtype:BF16", f"format:{FORMAT}"}
        | {f"choice:logging_steps={n}" for n in LOGGING_STEPS}
        | {f"choice:gradient_accumulation_steps={n}" for n in ACCUMULATIONS}
    )

    def __init__(self) -> None:
        super().__init__()
        self._job: TrainerJob | None = None

    @classmethod
    def refuses(cls, case: Any) -> str | None:
        """Beyond the Trainer's: ZCC's format, its EMA read from checkpoints, saves on EMA steps only (which
        TrainingArguments asserts), and only at the end of a step the job trained."""
        fmt = case.options.get("format", FORMAT)
        if fmt != FORMAT:
            return f"format {fmt!r}: this SUT runs Zero-Cost Checkpointing in {FORMAT}"
        micro = case.options.get("gradient_accumulation_steps", ACCUMULATIONS[-1])
        if micro not in ACCUMULATIONS or isinstance(micro, bool):
            kept = " or ".join(map(str, ACCUMULATIONS))
            return f"gradient_accumulation_steps {micro!r}: the job accumulates {kept} micro-batches per step " \
                   "(the reference loss sums exactly in halves)"
        if case.training is not None:
            spec = case.spec()
            if spec.ema_seen != "saved":
                return "ZCC's EMA lives in its worker process: the case must read it from checkpoints " \
                       "(training.ema_seen = \"saved\")"
            odd = next((op for op in case.ops if op.kind == "save" and op.version % spec.ema_every), None)
            if odd is not None:
                return f"save at step {odd.version}: ZCC saves only on EMA steps (zcc_ema_interval " \
                       f"{spec.ema_every} must divide save_steps)"
        return super().refuses(case) or _save_without_a_step(case)

    @classmethod
    def process_shape(cls, case: Any, index: int) -> str:
        """The expert-parallel degree: ``fleet.init`` makes a process's hybrid groups once (a job's
        ``TrainingArguments`` make them only where none exist), so a job on another EP degree runs on other
        processes, as it is another launch in real use."""
        ep = expert_parallel_degree(case.layouts(case.op_layouts(index)))
        return f"ep={ep}" if ep > 1 else ""

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        import paddle

        from harness.sut import zcc_shims

        paddle.set_device("cpu")
        shims = apply_cpu_shims(options)
        if paddle.is_compiled_with_cuda():
            return shims
        os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", str(rank)))
        installed = zcc_shims.install([n for n in zcc_shims.SHIMS if n != "adamw-inplace"])
        return [*shims, *installed, *_install_zcc_job_shims()]

    # --- the job ------------------------------------------------------------------------------------------------

    def train(self, root: Path, live: dict, to_step: int, *, options: dict) -> None:
        spec, params = self._training()
        self._alive()
        try:
            if self._job is None:
                self._job = self._start_job(root, spec, params, options, self._start.path, set(live))
            job = self._job
            if job.at[1] > to_step:
                raise TrainerCaseError(f"the job is at step {job.at[1]}, past step {to_step}")
            while job.at[1] < to_step:
                job.go()
        except Exception as exc:
            self._died = exc
            self._drop_job()
            raise
        state = _observe(job.trainer, spec, params)
        for key, lt in live.items():
            if seen_live(spec, key):
                lt.tensor.bits[...] = state[key].bits.reshape(lt.tensor.bits.shape)

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        self._alive()
        step, job = trailing_int(name), self._job
        if job is None or job.at != (END, step):
            raise TrainerCaseError(f"save {name}: ZCC saves at the end of a step the job trained; the job is at "
                                   f"{None if job is None else job.at}")
        job.trainer.args.output_dir = str(root)  # where the loop's save lands (ZCC reads it at the save step)
        job.save_here()
        import paddle.distributed as dist

        handle = _Save(job, root / f"checkpoint-{step}" / f"saved_signal_{dist.get_rank()}")
        if not use_async:
            self.wait(handle)
        return handle

    def wait(self, handle: _Save) -> None:
        """Until the worker has written the save: first the copy out of the buffers, as ``finalize`` drives it
        when nothing trains on (a job that trains on drives it from its micro-steps), then the dump."""
        manager = handle.manager
        if not handle.job.finished and handle.job.at[0] == BEGIN and manager.current_worker is not None:
            for hook in range(manager.pipeline_hooks_steps):
                manager.zcc_pipeline_hook(hook)
            manager.sync_offload_status()
        # The worker's last file of the dump, and then the worker idle again: ZCC's own "this rank is done" (the
        # dump task has returned, so whatever it does after the signal's write is part of the save).
        while not handle.signal.exists() or not _idle(manager):
            manager.report_error_worker()  # ZCC's own check: a worker that failed its dump says so
            time.sleep(0.01)

    def writer_pids(self, handle: _Save) -> list[int]:
        return [p.pid for p in handle.manager.processes if p.is_alive()]

    def standing_writers(self) -> list[int]:
        """ZCC's workers, once idle: work a worker still does from before the save (the last EMA step's) is not
        this save's, and a hold that froze it would make the save wait for the hold's grace instead."""
        manager = getattr(self._job.trainer, "zcc_manager", None) if self._job is not None else None
        if manager is None:
            return []
        _settle(manager)
        return [p.pid for p in manager.processes if p.is_alive()]

    def kill_pending(self, handles: list[Any]) -> None:
        for handle in handles:
            _kill_workers(handle.manager)

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        spec, params = self._training()
        self._end_job(finalize=True)
        path = str(checkpoint_to_resume(root, name))
        try:
            self._job = self._start_job(root, spec, params, options, path, set(targets))
        except Exception:
            self._drop_job()
            raise
        self._died = None
        self._start = job_model._Start(path, self._job.at[1])
        state = _observe(self._job.trainer, spec, params)
        state.update(_handed_ema(self._job.trainer, spec, params))
        return {key: state[key] for key in targets if key in state}

    def end_case(self) -> None:
        self._drop_job()
        super().end_case()

    def _start_job(self, root: Path, spec: TrainingSpec, params: tuple[Param, ...], options: dict,
                   resume: str | None, held: set[str]) -> TrainerJob:
        """A job over the parameters this rank holds (``held``: its keys of the case's state): every dense one,
        and the experts of its expert-parallel rank."""
        self._ep, mine = expert_parallel(params, held)
        with _fresh_names():
            trainer = self._trainer_for(root, spec, mine, options, max_steps=HORIZON)
        _check_expert_ranks(trainer, mine, self._ep)
        return TrainerJob(trainer, resume, scope=_fresh_names)

    def _end_job(self, finalize: bool) -> None:
        """End the live job: as ``train`` ends (``finalize``: finish a save in flight, stop the workers), or as a
        crash does (the workers killed)."""
        job, self._job = self._job, None
        if job is None:
            return
        job.stop()
        manager = getattr(job.trainer, "zcc_manager", None)
        if manager is not None:
            if finalize:
                manager.finalize()
            else:
                _kill_workers(manager)
        # the shared memory the CPU stand-in for CUDA IPC made for this job's workers, gone with them
        remove_shared_memory([os.getpid()])

    def _drop_job(self) -> None:
        self._end_job(finalize=False)

    def _arguments(self, root: Path, spec: TrainingSpec, params: tuple[Param, ...], options: dict, world: int,
                   max_steps: int) -> dict[str, Any]:
        """The Trainer's arguments, with ZCC on: sharding stage 1 V2 with fused optimizer states (ZCC asserts
        them), one worker (ZCC's EMA asserts it), the case's saves (save_steps = the EMA interval, so that ZCC
        writes a save the loop is told to make to output_dir) and the case's micro-batches per step."""
        return {
            **super()._arguments(root, spec, params, options, world, max_steps),
            "save_steps": spec.ema_every, "split_param": True, "amp_master_grad": True,
            "enable_zero_cost_checkpoint": True, "fuse_optimizer_states": True, "zcc_workers_num": 1,
            "gradient_accumulation_steps": int(options.get("gradient_accumulation_steps", ACCUMULATIONS[-1])),
            "save_tokenizer": False, "bf16": True, "fp16_opt_level": "O2",
            "sharding": "stage1", "sharding_parallel_size": world,
            # experts over more than one rank: expert parallelism (its optimizer needs stage 1 V2, as ZCC does)
            **({"use_expert_parallel": True, "expert_model_parallel_size": self._ep} if self._ep > 1 else {}),
        }


def _check_expert_ranks(trainer: Any, mine: tuple[Param, ...], ep: int) -> None:
    """The experts this rank holds are those of its expert-parallel rank in the job's groups: global id // (experts
    per rank) = the rank's EP index, as PaddleFormers' MoE layers place them."""
    if ep <= 1:
        return
    import paddle.distributed as dist

    ep_rank = dist.fleet.get_hybrid_communicate_group().get_expert_parallel_rank()
    ids = sorted({i for p in mine if (i := keyed_expert_id(p.name)) is not None})
    if any(i // len(ids) != ep_rank for i in ids):
        raise TrainerCaseError(f"this rank holds experts {ids}, but its expert-parallel rank is {ep_rank} of {ep}")


def _save_without_a_step(case: Any) -> str | None:
    """A save where the job has not trained a step since it started (after a load or a restart): ZCC saves from
    a step's end."""
    trained = False
    for index, op in enumerate(case.ops):
        if op.kind in ("load", "restart"):
            trained = False
        elif op.kind == "train":
            trained = trained or op.version > _job_start(case, index)
        elif op.kind == "save" and not trained:
            return f"op {index} saves before the job has trained a step: ZCC saves at the end of a step"
    return None


def _job_start(case: Any, index: int) -> int:
    """The step the job that runs op ``index`` started from: its last load's, else 0."""
    for op in reversed(case.ops[:index]):
        if op.kind == "restart":
            return 0
        if op.kind == "load":
            return op.version
    return 0


def _idle(manager: Any) -> bool:
    """Whether every live worker is idle or has failed: none is offloading or dumping."""
    from paddleformers.trainer.utils.zero_cost_checkpoint import ZCCWorkerStatus

    done = {ZCCWorkerStatus.IDLE.value, ZCCWorkerStatus.ERROR.value}
    return all(w.status.value in done for w, p in zip(manager.workers, manager.processes) if p.is_alive())


def _settle(manager: Any) -> None:
    """Until every live worker is idle (or failed), within ``SETTLE_S``: a worker that never gets there is left
    to the save, whose own wait shows it."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and not _idle(manager):
        time.sleep(0.01)


def _kill_workers(manager: Any) -> None:
    """SIGKILL ZCC's workers and reap them: none can write after this."""
    for process in manager.processes:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)


# --- the state the job reached ----------------------------------------------------------------------------------


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


def _observe(trainer: Any, spec: TrainingSpec, params: tuple[Param, ...]) -> dict[str, Tensor]:
    """Every key the job holds (the EMA aside: its worker holds it), put together from every rank's slices."""
    import paddle.distributed as dist

    mine = _local_pieces(trainer, params)
    gathered: list = []
    dist.all_gather_object(gathered, mine)
    state = _assemble(gathered, params)
    start = initial_state(spec, params)
    for key, tensor in start.items():  # a slot no rank holds yet (before the first step) is a fresh job's
        state.setdefault(key, tensor)
    step = trainer.state.global_step
    state[RNG_KEY] = rng_state(spec, step)
    state[STEP_KEY] = Tensor.from_array(np.array(step, np.int64), "I64")
    return state


def _local_pieces(trainer: Any, params: tuple[Param, ...]) -> dict[str, Any]:
    """This rank's parameters (whole: stage 1 gathers them after each step) and its slices of master weights and
    moments, each as (lo, packed)."""
    inner = _optimizers(trainer)[-1]
    sharding, slices = _sharding(trainer), _slices(trainer)
    named = dict(trainer.model.named_parameters())
    out: dict[str, Any] = {}
    for p in params:
        if p.name not in named:  # an expert of another expert-parallel rank
            continue
        keys, param = family_keys(p.name), named[p.name]
        out[keys["model"]] = _pack(from_paddle(param))
        if p.dtype == "F32":
            out[keys["master"]] = (0, _pack(from_paddle(param)))
        lo, hi = slices[param.name]
        if hi <= lo:
            continue
        piece = sharding._slice_params[param.name]
        master = piece if p.dtype == "F32" else inner._master_weights.get(param.name)
        if master is None:
            continue
        if p.dtype != "F32":
            out[keys["master"]] = (lo, _head(master, hi - lo))
        for slot, family in (("moment1", "m1"), ("moment2", "m2")):
            acc = optimizer_slot(inner, master.name, slot)
            if acc is not None:
                out[keys[family]] = (lo, _head(acc, hi - lo))
    return out


def _head(tensor: Any, n: int) -> tuple[str, tuple[int, ...], bytes]:
    """The first ``n`` elements of a flat slice (the rest is padding)."""
    return _pack(Tensor.from_array(tensor.numpy().reshape(-1)[:n].astype(np.float32), "F32"))


def _assemble(gathered: list[dict[str, Any]], params: tuple[Param, ...]) -> dict[str, Tensor]:
    """Whole tensors from every rank's parts: a whole one (the first rank's) or slices (which must cover it)."""
    shapes = {k: p.shape for p in params for k in family_keys(p.name).values()}
    state: dict[str, Tensor] = {}
    pieces: dict[str, list[tuple[int, Tensor]]] = {}
    for part in gathered:
        for key, value in part.items():
            if isinstance(value[0], int):
                pieces.setdefault(key, []).append((value[0], _unpack(value[1])))
            else:
                state.setdefault(key, _unpack(value))
    for key, parts in pieces.items():
        size = int(np.prod(shapes[key]))
        flat = np.zeros(size, np.float32)
        covered = np.zeros(size, bool)
        for lo, t in parts:
            values = t.bits.view(np.float32).reshape(-1)
            flat[lo:lo + values.size] = values
            covered[lo:lo + values.size] = True
        if covered.all():
            state[key] = Tensor.from_array(flat.reshape(shapes[key]), "F32")
    return state


def _handed_ema(trainer: Any, spec: TrainingSpec, params: tuple[Param, ...]) -> dict[str, Tensor]:
    """The EMA the resumed job hands its worker, its ranks' parts put together: the file ``set_ema_state_dict``
    was given (this rank's part of the flex checkpoint's ``ema_state``, read as the worker reads it), or, where the
    job's parallelism changed, what the Trainer's own reshard of that EMA put in shared memory for the worker
    (``set_ema_shared_memory``); zeros where no rank was handed one (the worker's EMA then starts at zero)."""
    import paddle.distributed as dist

    held = _handed(trainer.zcc_manager)
    slices = _slices(trainer)
    static = {name: prm.name for name, prm in trainer.model.named_parameters()}
    mine: dict[str, Any] = {}
    for p in params:
        key = family_keys(p.name)["ema"]
        value = held.get(p.name if p.dtype == "F32" else f"{p.name}.w_0")
        if value is None or p.name not in static:
            continue
        values = np.asarray(value, np.float32).reshape(-1)
        lo, hi = (0, values.size) if values.size == int(np.prod(p.shape)) else slices[static[p.name]]
        mine[key] = (lo, _pack(Tensor.from_array(values[:hi - lo], "F32")))
    gathered: list = []
    dist.all_gather_object(gathered, mine)
    state = _assemble(gathered, params)
    zeros = {p.name: Tensor.from_array(np.zeros(p.shape, np.float32), "F32") for p in params}
    return {key: state.get(key, zeros[p.name]) for p in params for key in [family_keys(p.name)["ema"]]}


def _handed(manager: Any) -> dict[str, Any]:
    """What a resume handed ZCC's worker as its EMA, by the key the worker reads (nothing: an empty dict)."""
    import paddle

    shared = getattr(manager, "_ckpt_harness_ema_shm", None)
    if shared is not None:
        return shared
    path = getattr(manager, "_ckpt_harness_ema", None)
    return {} if path is None else {k: v.astype("float32").numpy() for k, v in paddle.load(path).items()
                                    if hasattr(v, "astype")}


# --- CPU shims of the job -------------------------------------------------------------------------------------


_shimmed: list[str] | None = None


def _install_zcc_job_shims() -> list[str]:
    """Process-wide, once: the reference Adam step in place, and a note of the EMA a resume hands its worker."""
    global _shimmed
    if _shimmed is not None:
        return list(_shimmed)
    import paddle
    from paddleformers.trainer.utils import zero_cost_checkpoint as zcc

    stock = paddle.optimizer.AdamW._append_optimize_op

    def adamw_update(self: Any, block: Any, param_and_grad: Any) -> Any:
        run = job_model._run
        if getattr(run, "_ckpt_harness", None) is None:
            return stock(self, block, param_and_grad)
        if isinstance(param_and_grad, dict):
            param_and_grad = self._update_param_group(param_and_grad)
        _reference_adam_in_place(self, run, param_and_grad[0])
        return None

    paddle.optimizer.AdamW._append_optimize_op = adamw_update
    set_path, set_shm = zcc.ZeroCostCheckpointManager.set_ema_state_dict, \
        zcc.ZeroCostCheckpointManager.set_ema_shared_memory

    def set_ema_state_dict(self: Any, path: str) -> Any:
        self._ckpt_harness_ema = path
        return set_path(self, path)

    def set_ema_shared_memory(self: Any, metas: Any, tensor_refs: Any = None, **kwargs: Any) -> Any:
        # copied now: the refs go once the worker has read them
        self._ckpt_harness_ema_shm = {k: t.numpy().copy() for k, t in (tensor_refs or {}).items()}
        return set_shm(self, metas, tensor_refs=tensor_refs, **kwargs)

    zcc.ZeroCostCheckpointManager.set_ema_state_dict = set_ema_state_dict
    zcc.ZeroCostCheckpointManager.set_ema_shared_memory = set_ema_shared_memory
    _shimmed = ["AdamW update->reference Adam step on the rank's slice, in place",
                "ZCC manager: note the EMA a resume hands its worker"]
    return list(_shimmed)


def _reference_adam_in_place(opt: Any, run: Any, param: Any) -> None:
    """The reference loop's Adam step on this rank's slice of ``param`` (a stage-1 V2 slice, padded), written
    into the optimizer's own tensors in place: they are views of the fused buffer ZCC's worker copies."""
    import paddle

    job = run._ckpt_harness
    spec: TrainingSpec = job["spec"]
    p: Param = job["params"][job["by_static"][param.name]]
    lo, hi = _slices(run)[param.name]
    t = run.state.global_step + 1
    low = opt._multi_precision and opt._is_dtype_fp16_or_bf16(param.dtype)
    master = opt._master_weights[param.name] if low else param
    m1 = opt._get_accumulator_master(opt._moment1_acc_str, param)
    m2 = opt._get_accumulator_master(opt._moment2_acc_str, param)
    arrays = [x.numpy().astype(np.float32).reshape(-1) for x in (master, m1, m2)]
    grad = np.zeros(arrays[0].size, np.float32)
    grad[:hi - lo] = gradient(p, rng_output(spec, t)).reshape(-1)[lo:hi]
    adam_update(spec, t, grad, *arrays)
    for target, values in zip((master, m1, m2), arrays):
        target.copy_(paddle.to_tensor(values.reshape(target.shape)), False)
    for acc, beta in ((opt._beta1_pow_acc_str, spec.beta1), (opt._beta2_pow_acc_str, spec.beta2)):
        pow_acc = opt._get_accumulator_master(acc, param)
        pow_acc.copy_(pow_acc * beta, False)
    if low:
        bits = cast_bits(arrays[0], p.dtype)
        param.copy_(to_paddle(Tensor(dtype(p.dtype), bits)).reshape(param.shape), False)
