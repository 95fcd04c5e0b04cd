"""PaddleFormers' Trainer as a system under test for a training job: its own loop, its EMA and its checkpoints.

A training case (docs/training.md) runs here through ``Trainer.train`` itself: the loop that sums the loss the EMA
threshold reads, the ``NonZCCEMACallback`` that accumulates the EMA every ``zcc_ema_interval`` steps and saves it
beside each checkpoint, and the Trainer's flex-checkpoint (or sharding-IO) save and resume. That is the code a job
runs with ``zcc_save_ema_coef`` set and Zero-Cost Checkpointing off. The Trainer builds this EMA only for a
hybrid-parallel job, so the ranks run sharding stage 1 over the whole world; the case's state is replicated and
every rank reports all of it (the owner of an optimizer slot or master weight shares it with the others).

A ``train`` op is a ``Trainer.train`` run to the op's step: resumed from the checkpoint the case last loaded, else
from the seeds. A job that trained on without a checkpoint in between is run again from that start: the loop is
deterministic, so that equals training on in place. A ``save`` makes the two calls the loop makes at a save step
(the EMA callback's save, then ``_save_checkpoint``); a ``load`` is a resume, stopped before its first step, of a
named checkpoint or of the latest (``get_last_checkpoint``, as ``resume_from_checkpoint=True`` picks it).

Where the harness stands in, and why (docs/paddleformers-notes.md, "The Trainer's EMA on CPU"):
* the model's forward returns the reference loop's loss of the step, so what the Trainer sums, all-reduces and
  hands to the EMA threshold is the oracle's loss;
* AdamW's update: CPU Paddle has no BF16 ``adamw`` kernel. The shim runs the reference loop's Adam step
  (``reference.training.adam_update``) with the reference's gradient on the optimizer's own moments and master
  weights, so parameters follow the oracle bit for bit and the checkpoints hold the Trainer's own optimizer state;
* CUDA calls of the EMA on a CPU-only build: ``Tensor.cuda``, ``Tensor.cpu`` and ``Tensor.pin_memory`` copy (on a
  GPU each makes a new tensor); a BF16 ``+`` runs in FP32 and rounds to nearest even, as a GPU's BF16 add does (CPU
  Paddle has no BF16 add kernel); ``FLAGS_selected_gpus`` is the local rank, as Paddle's launcher sets it on GPUs;
* ``max_grad_norm`` is 0: with clipping on, the Trainer's hybrid-parallel optimizer wrapper raises before training
  (``_wrap_distributed_optimizer`` reads ``_inner_opt`` of the unwrapped AdamW); not a checkpoint path.

Async saves are the Trainer's ``use_async_save`` (drawn as a flag): the optimizer goes to ``AsyncSaver``, a pool of
one spawned writer the Trainer starts with the job, which writes it and then its ``saved_signal_<rank>``. In such a
job a sync save op turns the switch off for that save, as the Trainer's own final save does without it (the switch
is read per save). The pool's writer exists before any save hands it work, so a stalled save holds it from before
the call (``standing_writers``); a kill SIGKILLs it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from harness.sut._paddle_common import (
    PaddleAdapter,
    add_nested_parameter,
    apply_cpu_shims,
    from_paddle,
    to_paddle,
    trailing_int,
)
from harness.sut.base import RankTensor
from harness.sut.paddleformers_uc import checkpoint_to_resume
from reference.dtypes import dtype
from reference.moe import keyed_expert_id
from reference.namespaces import STEP_KEY
from reference.tensor import Tensor
from reference.training import (
    RNG_KEY,
    Param,
    TrainingSpec,
    adam_update,
    cast_bits,
    current_step,
    family_keys,
    gradient,
    initial_state,
    rng_output,
    rng_state,
    step_loss,
)

PARAM_DTYPES = ("F32", "BF16")  # CPU Paddle has no F16 add kernel either; the shims cover BF16 only
FORMATS = ("flex_checkpoint", "sharding_io")
LOGGING_STEPS = (1, 2, 3)


class TrainerCaseError(ValueError):
    """The case asks for what a Trainer job cannot be; the message says what."""


@dataclass
class _Start:
    """Where the next ``train`` op starts: the checkpoint the case last loaded (None: the seeds) and its step."""

    path: str | None = None
    step: int = 0


class _Resumed(Exception):
    """Raised at the resumed job's first step: a load ends where the Trainer would start training."""


_run: Any = None  # the Trainer the shims serve (one run at a time in a rank process)


class PaddleFormersTrainerSut(PaddleAdapter):
    """"reshard": a job resumes on another world (data parallel, or sharding stage 1 on another degree).
    "min_world:2": a job with an EMA on one rank dies as training starts (paddleformers-trainer-ema-needs-hybrid-
    parallel, which no patch fixes), so no world of a drawn world change has one rank."""

    name = "paddleformers-trainer"
    framework = "paddleformers"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"trains", "replicated", "latest", "ema_start:first", "master_init:param", "dtype:I64", "async", "kill_writer",
         "flag:use_async_save", "reshard", "min_world:2"}
        | {f"dtype:{d}" for d in PARAM_DTYPES} | {f"format:{f}" for f in FORMATS}
        | {f"choice:logging_steps={n}" for n in LOGGING_STEPS}
    )

    def __init__(self) -> None:
        self._trainer: Any = None
        self._start = _Start()
        self._spec: TrainingSpec | None = None
        self._params: tuple[Param, ...] = ()
        self._died: BaseException | None = None  # the error a run ended with: the job is dead until a resume
        self._savers: list[Any] = []  # the AsyncSavers of the case's Trainers: their pools end with the case
        self._ep = 1  # the job's expert-parallel degree (keyed experts spread over this many ranks)

    @classmethod
    def refuses(cls, case: Any) -> str | None:
        """What no Trainer job is: a case without a training loop, another format, a parameter dtype the CPU
        shims do not cover, a layout other ranks do not hold whole, a save of a step the job is not at."""
        if case.training is None:
            return "a Trainer job runs training cases only (the case has no training spec)"
        fmt = case.options.get("format", FORMATS[0])
        if fmt not in FORMATS:
            return f"format {fmt!r}: the Trainer saves an EMA in {', '.join(FORMATS)}"
        logging = case.options.get("logging_steps", 1)
        if not isinstance(logging, int) or isinstance(logging, bool) or logging < 1:
            return f"logging_steps {logging!r}: TrainingArguments takes a positive integer"
        odd = next((p for p in case.params() if p.dtype not in PARAM_DTYPES), None)
        if odd is not None:
            return f"parameter {odd.name!r} is {odd.dtype}: the Trainer job trains {', '.join(PARAM_DTYPES)}"
        return super().refuses(case) or _misplaced_save(case)

    def setup(self, rank: int, world_size: int, options: dict) -> list[str]:
        import paddle

        paddle.set_device("cpu")  # TrainingArguments inits fleet and its groups itself
        shims = apply_cpu_shims(options)
        if paddle.is_compiled_with_cuda():
            return shims
        os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("PADDLE_LOCAL_RANK", str(rank)))
        return [*shims, *_install_trainer_shims()]

    # --- the job ------------------------------------------------------------------------------------------------

    def begin_training(self, spec: TrainingSpec, params: tuple[Param, ...]) -> None:
        self._spec, self._params = spec, tuple(params)

    def train(self, root: Path, live: dict, to_step: int, *, options: dict) -> None:
        """Train the job to ``to_step`` with ``Trainer.train`` and write the state it reached into ``live``."""
        spec, params = self._training()
        self._alive()
        start = current_step(live)
        if start < self._start.step:
            raise TrainerCaseError(f"the job is at step {start}, before the checkpoint it resumed from "
                                   f"(step {self._start.step})")
        try:
            with _fresh_names():
                trainer = self._trainer_for(root, spec, params, options, max_steps=to_step)
                trainer.train(resume_from_checkpoint=self._start.path)
        except Exception as exc:
            self._died, self._trainer = exc, None
            raise
        self._trainer = trainer
        state = _observe(trainer, spec, params)
        for key, lt in live.items():
            lt.tensor.bits[...] = state[key].bits.reshape(lt.tensor.bits.shape)

    def save(self, root: Path, name: str, tensors: dict[str, RankTensor], *, use_async: bool, options: dict) -> Any:
        self._alive()
        trainer = self._trainer
        step = trailing_int(name)
        if trainer is None or trainer.state.global_step != step:
            at = "has not trained" if trainer is None else f"is at step {trainer.state.global_step}"
            raise TrainerCaseError(f"save {name}: the job {at}; the Trainer saves the step it is at")
        # The job trained into the root of its train op; a crash-point run replays this save on a copy of that root,
        # and the checkpoint must land where the case's later ops (and the fault) look for it.
        trainer.args.output_dir = str(root)
        ema = _ema_callback(trainer)
        if ema is not None:  # what on_step_end does at a save step, before the loop's own save
            ema.buffer.save(step)
        saver = _saver(trainer)
        configured = trainer.args.use_async_save
        trainer.args.use_async_save = configured and use_async  # a sync save in an async job: the switch off
        try:
            trainer._save_checkpoint(trainer.model_wrapped, metrics=None)
        finally:
            trainer.args.use_async_save = configured
        return _AsyncSave(saver) if saver is not None and use_async else trainer

    def wait(self, handle: Any) -> None:
        """An async save is done when its AsyncSaver's result is: the wait the Trainer makes before its next save
        (which retries a failed write and raises once the retries are spent)."""
        if isinstance(handle, _AsyncSave):
            handle.saver._wait_for_previous_result()

    def writer_pids(self, handle: Any) -> list[int]:
        return _pool_pids(handle.saver) if isinstance(handle, _AsyncSave) else []

    def standing_writers(self) -> list[int]:
        """The pool's writer, started with the job before any save hands it work."""
        saver = _saver(self._trainer) if self._trainer is not None else None
        return _pool_pids(saver) if saver is not None else []

    def kill_pending(self, handles: list[Any]) -> None:
        import psutil

        for handle in handles:
            if isinstance(handle, _AsyncSave):
                for pid in _pool_pids(handle.saver):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        proc = psutil.Process(pid)
                        proc.kill()
                        proc.wait(10)

    def load(self, root: Path, name: str | None, targets: dict[str, RankTensor], *, options: dict) -> dict[str, Tensor]:
        spec, params = self._training()
        path = str(checkpoint_to_resume(root, name))
        with _fresh_names():
            trainer = self._trainer_for(root, spec, params, options, max_steps=trailing_int(Path(path).name) + 1)
            trainer.add_callback(_stop_at_first_step())
            try:
                trainer.train(resume_from_checkpoint=path)
            except _Resumed:
                pass
            else:
                raise RuntimeError(f"the Trainer resumed from {path} without starting a step")
            _first_step_slots(trainer)  # names its slots as the resumed job's process would: fresh
        self._trainer, self._died = trainer, None
        self._start = _Start(path, trainer.state.global_step)
        state = _observe(trainer, spec, params)
        return {key: state[key] for key in targets if key in state}

    def end_case(self) -> None:
        global _run
        savers, self._savers = self._savers, []
        for saver in savers:  # the job is over: its writers go (a pool whose writer was killed never joins)
            saver.pool.terminate()
        self._trainer, self._start, _run = None, _Start(), None
        self._spec, self._params, self._died = None, (), None

    def _alive(self) -> None:
        """A job whose training died can neither save nor train on: each such op fails as the job did (the same
        error, so it reads as that bug's consequence), until a load resumes a new job."""
        if self._died is not None:
            raise type(self._died)(*self._died.args)

    def _training(self) -> tuple[TrainingSpec, tuple[Param, ...]]:
        if self._spec is None:
            raise TrainerCaseError("a Trainer job runs training cases only (the case has no training spec)")
        return self._spec, self._params

    # --- building a run -------------------------------------------------------------------------------------------

    def _trainer_for(self, root: Path, spec: TrainingSpec, params: tuple[Param, ...], options: dict,
                     max_steps: int) -> Any:
        global _run
        import paddle.distributed as dist
        from paddleformers.trainer import Trainer, TrainingArguments

        world = int(os.environ.get("PADDLE_TRAINERS_NUM", dist.get_world_size() if dist.is_initialized() else 1))
        fmt = options.get("format", FORMATS[0])
        if fmt not in FORMATS:
            raise TrainerCaseError(f"format {fmt!r}: the Trainer saves an EMA in {', '.join(FORMATS)}")
        args = TrainingArguments(**self._arguments(root, spec, params, options, world, max_steps))
        model = _build_model(spec, params, experts_apart=self._ep > 1)
        samples = max_steps * max(world, 1) * args.gradient_accumulation_steps + 8
        trainer = Trainer(model=model, args=args, train_dataset=_Steps(samples))
        saver = _saver(trainer)
        if saver is not None:
            self._savers.append(saver)
        trainer._ckpt_harness = {"spec": spec, "params": {p.name: p for p in params},
                                 "by_static": {prm.name: name for name, prm in model.named_parameters()}}
        _run = trainer
        return trainer

    def _arguments(self, root: Path, spec: TrainingSpec, params: tuple[Param, ...], options: dict, world: int,
                   max_steps: int) -> dict[str, Any]:
        """The job's ``TrainingArguments``."""
        fmt = options.get("format", FORMATS[0])
        low = any(p.dtype != "F32" for p in params)
        return dict(
            # The case's save ops save (the loop's own schedule is off); save_steps must still be a multiple of
            # the EMA interval, which TrainingArguments asserts.
            output_dir=str(root), max_steps=max_steps, save_strategy="no", save_steps=spec.ema_every,
            report_to="none", disable_tqdm=True,
            logging_steps=int(options.get("logging_steps", 1)), per_device_train_batch_size=1, seed=spec.seed,
            learning_rate=spec.lr, max_grad_norm=0.0, save_checkpoint_format=fmt, load_checkpoint_format=fmt,
            zcc_save_ema_coef=spec.ema_decay, zcc_ema_interval=spec.ema_every,
            zcc_ema_loss_threshold=spec.loss_threshold, amp_master_grad=low, split_param=False,
            use_async_save=bool(options.get("use_async_save", False)),
            sharding="stage1" if world > 1 else "", sharding_parallel_size=world if world > 1 else -1,
            **({"bf16": True, "fp16_opt_level": "O2"} if low else {}),
            # sharding IO resumes only under its switch (load_checkpoint_format alone is not read there)
            **({"save_sharded_model": True, "load_sharded_model": True} if fmt == "sharding_io" else {}),
        )

@dataclass
class _AsyncSave:
    """A save whose optimizer file the Trainer's AsyncSaver writes in its pool."""

    saver: Any


def _saver(trainer: Any) -> Any:
    return getattr(trainer, "_async_optimizer_saver", None)


def _pool_pids(saver: Any) -> list[int]:
    """The pool's live writer processes (the pool replaces one that died)."""
    return [p.pid for p in getattr(saver.pool, "_pool", None) or () if p.is_alive()]


def _misplaced_save(case: Any) -> str | None:
    """A save of a step the job is not at: the Trainer saves the step it has trained to (or resumed at)."""
    step: int | None = 0  # None: no job since a restart, until a train or a load
    saved: set[int] = set()
    for index, op in enumerate(case.ops):
        if op.kind == "restart":
            step = None
        elif op.kind == "train":
            if step is not None and op.version < step:
                return f"op {index} trains to step {op.version}, behind the step {step} the job is at"
            step = op.version
        elif op.kind in ("save", "load") and op.name is not None:
            try:
                named = trailing_int(op.name)
            except ValueError as exc:
                return f"op {index}: {exc}"
            if op.kind == "load":
                step = named
            elif step != named:
                at = "has not trained since it started" if step is None else f"is at step {step}"
                return f"op {index} saves {op.name!r}, but the job {at}: the Trainer saves the step it is at"
            else:
                saved.add(named)
        elif op.kind == "load":  # "latest": get_last_checkpoint picks the highest-numbered checkpoint-N
            step = max(saved, default=None)
    return None


# --- the model and its data -----------------------------------------------------------------------------------


def _fresh_names() -> Any:
    """Paddle names parameters and master weights from a process-wide counter: a job started in a fresh process
    counts from zero, and a resume in this warm process must meet the names its checkpoint was saved under (sharding
    IO and the EMA key optimizer slots by them)."""
    import paddle

    return paddle.utils.unique_name.guard()


def expert_parallel(params: tuple[Param, ...], held: set[str]) -> tuple[int, tuple[Param, ...]]:
    """(expert-parallel degree, the parameters a rank's model holds) from the keys of the state it holds: every
    dense parameter, and the keyed experts (``….experts.<global id>.…``) of its expert-parallel rank. The degree is
    how many ranks the experts are spread over; 1 where the rank holds them all (or there are none)."""
    mine = tuple(p for p in params if keyed_expert_id(p.name) is None or held & set(family_keys(p.name).values()))
    experts = {i for p in params if (i := keyed_expert_id(p.name)) is not None}
    own = {i for p in mine if (i := keyed_expert_id(p.name)) is not None}
    if experts and (not own or len(experts) % len(own)):
        raise TrainerCaseError(f"this rank holds {len(own)} of {len(experts)} experts: expert parallelism gives "
                               "every rank the same number")
    return (len(experts) // len(own) if experts else 1), mine


def _build_model(spec: TrainingSpec, params: tuple[Param, ...], experts_apart: bool = False) -> Any:
    """A PretrainedModel holding the case's parameters at their step-0 values; its forward returns the reference
    loop's loss of the step the Trainer is about to take, and gives every parameter a gradient (zero: the AdamW shim
    applies the reference's). ``experts_apart``: the keyed experts live on their expert-parallel ranks only, and
    are marked as PaddleFormers' expert-parallel MoE layers (DeepSeek-V3's) mark them: ``expert``, ``no_sync`` and
    ``is_distributed`` (no data-parallel gradient sync; each rank saves its own), and the ``moe_expert`` color over
    the MoE sharding group (stage 1 V2 fuses them apart from the dense parameters, sharded over that group)."""
    import paddle
    from paddleformers.transformers import PretrainedConfig, PretrainedModel

    class HarnessConfig(PretrainedConfig):
        model_type = "ckpt_harness_trainer"

    class HarnessModel(PretrainedModel):
        config_class = HarnessConfig
        base_model_prefix = "harness"

        def forward(self, x: Any = None, labels: Any = None) -> Any:
            step = _run.state.global_step + 1
            loss = paddle.to_tensor(np.float32(step_loss(spec, step)))
            for p in self.parameters():
                loss = loss + 0.0 * p.astype("float32").sum()
            return (loss,)

    model = HarnessModel(HarnessConfig())
    start = initial_state(spec, params)
    for p in params:
        param = add_nested_parameter(model, p.name, p.shape, p.dtype)
        param.set_value(to_paddle(start[family_keys(p.name)["model"]]))
        if experts_apart and keyed_expert_id(p.name) is not None:
            param.expert = param.no_sync = param.is_distributed = param.is_moe_param = True
            param.color = {"color": "moe_expert",
                           "group": paddle.distributed.fleet.get_hybrid_communicate_group()
                           .get_moe_sharding_parallel_group()}
    return model


class _Steps:
    """The data: one dummy sample per step and rank (the loss does not read it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": np.zeros(1, np.float32), "labels": np.zeros(1, np.float32)}


def _stop_at_first_step() -> Any:
    """A callback that ends the resumed job as its first step begins (after every load the resume makes)."""
    from paddleformers.trainer import TrainerCallback

    class StopAtFirstStep(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            raise _Resumed()

    return StopAtFirstStep()


# --- reading the state the job reached -----------------------------------------------------------------------


def _ema_callback(trainer: Any) -> Any:
    return next((cb for cb in trainer.callback_handler.callbacks if hasattr(cb, "buffer")), None)


def _first_step_slots(trainer: Any) -> None:
    """What the resumed job's first step does before it updates: create the moments and master weights of the
    parameters this rank updates, from what the resume loaded (Paddle keeps a loaded slot aside until then)."""
    import paddle

    owns = _owned(trainer)
    params = [p for p in trainer.model.parameters() if owns(p) and not p.stop_gradient]
    _inner_optimizer(trainer)._create_accumulators(paddle.static.default_main_program().global_block(), params)


def _optimizers(trainer: Any) -> list[Any]:
    """The optimizer and the ones it wraps, outermost first (hybrid-parallel, sharding, AdamW)."""
    chain = [trainer.optimizer]
    while hasattr(chain[-1], "_inner_opt"):
        chain.append(chain[-1]._inner_opt)
    return chain


def _inner_optimizer(trainer: Any) -> Any:
    return next(o for o in _optimizers(trainer) if hasattr(o, "_master_weights"))


def _owned(trainer: Any) -> Any:
    """Which parameters this rank's optimizer updates: under sharding stage 1 those it owns (another rank may hold
    stale or zero slots for the rest), else all."""
    sharding = next((o for o in _optimizers(trainer) if hasattr(o, "_param2rank")), None)
    if sharding is None:
        return lambda param: True
    rank = sharding._sharding_rank
    return lambda param: sharding._param2rank.get(param.name) == rank


def _observe(trainer: Any, spec: TrainingSpec, params: tuple[Param, ...]) -> dict[str, Tensor]:
    """Every key of the case's state as the job holds it, gathered from the rank that owns each slot."""
    import paddle.distributed as dist

    mine = _local_state(trainer, params)
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list = []
        dist.all_gather_object(gathered, mine)
    else:
        gathered = [mine]
    step = trainer.state.global_step
    state: dict[str, Tensor] = {}
    for part in gathered:  # rank order: the first rank holding a slot gives it
        for key, packed in part.items():
            state.setdefault(key, _unpack(packed))
    start = initial_state(spec, params)
    for key, tensor in start.items():  # a slot no rank holds yet (moments before a step, an EMA before its first
        state.setdefault(key, tensor)  # update) is what a fresh job has
    state[RNG_KEY] = rng_state(spec, step)
    state[STEP_KEY] = Tensor.from_array(np.array(step, np.int64), "I64")
    return state


def _local_state(trainer: Any, params: tuple[Param, ...]) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """What this rank holds of each parameter's families: the parameter everywhere; master weights, moments and
    the EMA where this rank's optimizer owns the parameter (sharding stage 1: the owner updates it and broadcasts
    the parameter)."""
    opt, owns = _inner_optimizer(trainer), _owned(trainer)
    ema = _ema_callback(trainer)
    named = dict(trainer.model.named_parameters())
    out: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for p in params:
        keys, param = family_keys(p.name), named[p.name]
        out[keys["model"]] = _pack(from_paddle(param))
        if not owns(param):
            continue
        master = param if p.dtype == "F32" else opt._master_weights.get(param.name)
        if master is not None:
            out[keys["master"]] = _pack(from_paddle(master))
        for slot, family in (("moment1", "m1"), ("moment2", "m2")):
            acc = optimizer_slot(opt, master.name if master is not None else param.name, slot)
            if acc is not None:
                out[keys[family]] = _pack(from_paddle(acc))
        if ema is not None:
            held = ema.buffer.model_params.get(p.name) if p.dtype == "F32" else \
                ema.buffer.master_weights.get(param.name)
            if held is not None and held._is_initialized():
                out[keys["ema"]] = _pack(from_paddle(held))
    return out


def optimizer_slot(opt: Any, owner: str, slot: str) -> Any:
    """An optimizer slot of the tensor named ``owner`` as the job holds it: made by a step, else as a resume left it.
    ``set_state_dict`` keeps the loaded slots aside (``_accumulators_holder``) until the first step makes them, and
    a job resumed at its last step makes none; its ``state_dict``, which the next save writes, reads them there."""
    made = opt._accumulators.get(slot, {}).get(owner)
    if made is not None:
        return made
    prefix = f"{owner}_{slot}_"  # the slot's variable name: the owner's, the slot's and a unique-name counter
    return next((held for name, held in opt._accumulators_holder.items()
                 if name.startswith(prefix) and name[len(prefix):].isdigit()), None)


def _pack(t: Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return (t.dtype.name, tuple(t.shape), np.ascontiguousarray(t.bits).tobytes())


def _unpack(packed: tuple[str, tuple[int, ...], bytes]) -> Tensor:
    name, shape, raw = packed
    dt = dtype(name)
    return Tensor(dt, np.frombuffer(raw, dt.bits_dtype).reshape(shape).copy())


# --- CPU shims -----------------------------------------------------------------------------------------------


_shimmed: list[str] | None = None


def _install_trainer_shims() -> list[str]:
    """Process-wide, once, only on a CPU-only Paddle: see the module docstring for each and why."""
    global _shimmed
    if _shimmed is not None:
        return list(_shimmed)
    import paddle

    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.clone()

    paddle.Tensor.cpu = copy
    paddle.Tensor.pin_memory = copy
    add = paddle.Tensor.__add__

    def bf16_add(a: Any, b: Any) -> Any:
        if isinstance(b, paddle.Tensor) and a.dtype == paddle.bfloat16 and b.dtype == paddle.bfloat16:
            return add(a.astype("float32"), b.astype("float32")).astype("bfloat16")
        return add(a, b)

    paddle.Tensor.__add__ = bf16_add
    stock = paddle.optimizer.AdamW._append_optimize_op

    def adamw_update(self: Any, block: Any, param_and_grad: Any) -> Any:
        job = getattr(_run, "_ckpt_harness", None)
        if job is None:
            return stock(self, block, param_and_grad)
        if isinstance(param_and_grad, dict):
            param_and_grad = self._update_param_group(param_and_grad)
        _reference_adam(self, job, param_and_grad[0])
        return None

    paddle.optimizer.AdamW._append_optimize_op = adamw_update
    _shimmed = ["Tensor.cpu->copy", "Tensor.pin_memory->copy", "bf16 add->fp32 add, RNE",
                "AdamW update->reference Adam step", "FLAGS_selected_gpus=local rank"]
    return list(_shimmed)


def _reference_adam(opt: Any, job: dict, param: Any) -> None:
    """The reference loop's Adam step on the optimizer's own moments, master weight and beta powers."""
    import paddle

    spec: TrainingSpec = job["spec"]
    p: Param = job["params"][job["by_static"][param.name]]
    t = _run.state.global_step + 1
    low = opt._multi_precision and opt._is_dtype_fp16_or_bf16(param.dtype)
    master = opt._master_weights[param.name] if low else param
    m1 = opt._get_accumulator_master(opt._moment1_acc_str, param)
    m2 = opt._get_accumulator_master(opt._moment2_acc_str, param)
    arrays = [x.numpy().astype(np.float32) for x in (master, m1, m2)]
    adam_update(spec, t, gradient(p, rng_output(spec, t)), *arrays)
    for target, values in zip((master, m1, m2), arrays):
        target.set_value(paddle.to_tensor(values))
    for acc, beta in ((opt._beta1_pow_acc_str, spec.beta1), (opt._beta2_pow_acc_str, spec.beta2)):
        pow_acc = opt._get_accumulator_master(acc, param)
        pow_acc.set_value(pow_acc * beta)
    if low:
        bits = cast_bits(arrays[0], p.dtype)
        param.set_value(to_paddle(Tensor(dtype(p.dtype), bits)))
