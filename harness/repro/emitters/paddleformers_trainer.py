"""Repro scripts for PaddleFormers' Trainer training itself, driven as harness/sut/paddleformers_trainer.py drives
it: ``Trainer.train`` over a tiny model holding the case's parameters, with ``zcc_save_ema_coef`` (the EMA without
Zero-Cost Checkpointing) and sharding stage 1 over the launch's ranks. The reference loop is data in the script:
each step's loss (what the model's forward returns) and each parameter's gradient (what AdamW's step applies, in
the reference's Adam arithmetic, copied from reference/training.py), so the Trainer's loop, EMA, save and resume are
its own code. A ``train`` step trains to a step (resumed from the checkpoint last loaded), a ``save`` makes the two
calls the loop makes at a save step, a ``load`` is a resume stopped as its first step begins; after a train and a
load the job's whole state must equal the uninterrupted reference run's."""

from __future__ import annotations

import inspect

import numpy as np

from harness.repro.emitters import trainer_text
from harness.repro.scripted_case import ReproUnsupported, ScriptedCase
from reference.training import adam_update, cast_bits, gradient, rng_output, step_loss

FRAMEWORK = "paddleformers"
TEXT = trainer_text
TRAINS = True  # its scripts render train steps (harness.repro.scripted_case)
INERT = frozenset({"commit_timeout", "op_timeout", "shims"})
RENDERED = frozenset({"format", "logging_steps", "use_async_save"})
SPEC_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "ema_every", "ema_decay", "loss_threshold", "seed")


STEPS = frozenset({"train", "save", "load", "wait"})


def settings(scripted: ScriptedCase) -> str:
    check_steps(scripted, STEPS, async_saves=bool(scripted.options.get("use_async_save")))
    return loop_settings(scripted)


def check_steps(scripted: ScriptedCase, steps: frozenset[str], async_saves: bool = False) -> None:
    """Refuse a step the script does not render (an async save where the job has no async path)."""
    for phase in scripted.phases:
        for step in phase.steps:
            if step.kind not in steps or (step.use_async and not async_saves):
                raise ReproUnsupported(f"{step.label} in a training case on {scripted.sut} (the script cannot do it "
                                       "yet)")


def loop_settings(scripted: ScriptedCase, rendered: frozenset[str] = RENDERED) -> str:
    """The reference loop as data: its spec, each step's loss and each parameter's gradient; the Trainer's options
    (``rendered``: those the script says, here or, for a script built on this one, in its own settings)."""
    options, spec = scripted.options, scripted.training
    unknown = sorted(set(options) - INERT - rendered)
    if unknown:
        raise ReproUnsupported(f"option(s) {unknown} (the script does not render them yet)")
    if spec is None:
        raise ReproUnsupported("a case without a training loop (the Trainer script trains)")
    last = max((s.table[1] for phase in scripted.phases for s in phase.steps if s.kind == "train" and s.table),
               default=0)
    # one step past the last one asked for: a job that takes a step too many must get as far as the check
    steps = range(1, last + 2)
    losses = {t: step_loss(spec, t) for t in steps}
    grads = {t: {p.name: np.ascontiguousarray(gradient(p, rng_output(spec, t))).tobytes().hex()
                 for p in scripted.params} for t in steps}
    values = ", ".join(f"{f}={getattr(spec, f)!r}" for f in SPEC_FIELDS)
    return (f"FORMAT = {options.get('format', 'flex_checkpoint')!r}  # TrainingArguments.save_checkpoint_format\n"
            f"LOGGING_STEPS = {int(options.get('logging_steps', 1))}\n"
            f"USE_ASYNC_SAVE = {bool(options.get('use_async_save'))}  # the optimizer goes to AsyncSaver's writer\n"
            f'TrainingSpec = namedtuple("TrainingSpec", {" ".join(SPEC_FIELDS)!r})\n'
            f"SPEC = TrainingSpec({values})  # zcc_save_ema_coef = ema_decay, zcc_ema_interval = ema_every, "
            "zcc_ema_loss_threshold = loss_threshold\n"
            f"PARAMS = {({p.name: p.dtype for p in scripted.params})!r}  # the model's parameters and their dtypes\n"
            "# The reference loop as data: each step's loss (what the model's forward returns) and each parameter's\n"
            "# FP32 gradient as hex (what AdamW's step applies; the forward gives zero gradients)\n"
            f"LOSSES = {losses!r}\n"
            f"GRADIENTS = {grads!r}\n")


def helpers(scripted: ScriptedCase) -> str:
    return "".join((IMPORTS, REFERENCE, BF16_ADD, ADAM, MODEL, RESUME, JOB, SLOT, STATE))


# The reference's own arithmetic, as text: the cast of FP32 master weights to the parameter's dtype, and Adam's step
REFERENCE = "".join(("\n\n", inspect.getsource(cast_bits), "\n\n", inspect.getsource(adam_update)))

IMPORTS = '''from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddleformers.trainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddleformers.transformers import PretrainedConfig, PretrainedModel  # noqa: E402

JOB = [None, None]  # the Trainer of the running job, and the checkpoint it last resumed from (None: the seeds)
'''

BF16_ADD = '''

def bf16_add(add):
    """A BF16 + BF16 as a GPU computes it: in FP32, rounded to nearest even (CPU Paddle has no BF16 add kernel)."""
    def shimmed(a, b):
        if isinstance(b, paddle.Tensor) and a.dtype == paddle.bfloat16 and b.dtype == paddle.bfloat16:
            return add(a.astype("float32"), b.astype("float32")).astype("bfloat16")
        return add(a, b)
    return shimmed
'''

ADAM = '''

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

'''

MODEL = '''
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
    """The model at step 0: its parameters ("layers.0.w" nests sub-layers) hold the job's initial values, whole on
    every rank (data parallel), as the first save's rank 0 holds them: a resume may run on more ranks than saved."""
    model = HarnessModel(HarnessConfig())
    for name, dtype in sorted(PARAMS.items()):
        piece = DATA["save", 0][0]["model/" + name]
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

'''

RESUME = '''
class Resumed(Exception):
    """Raised as the resumed job's first step begins: a load ends where the Trainer would start training."""


class StopAtFirstStep(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        raise Resumed()

'''

BUILD = '''
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

'''

JOB = BUILD + '''
def owned_range(param):
    """The elements of the flattened parameter this rank's optimizer updates: all of them (stage 1 keeps a
    parameter whole on the rank that owns it)."""
    return 0, int(np.prod(param.shape))


def train(to_step, pieces):
    """Train the job to ``to_step``: resumed from the checkpoint it last loaded, else from step 0. Paddle names
    parameters from a process-wide counter; each job counts from zero, as in a fresh process."""
    with paddle.utils.unique_name.guard():
        trainer = trainer_for(to_step)
        trainer.train(resume_from_checkpoint=JOB[1])
    return observe(trainer, pieces)


def ema_callback(trainer):
    return next((cb for cb in trainer.callback_handler.callbacks if hasattr(cb, "buffer")), None)


def save(name, pieces, async_save=False, detach=False):
    """What the training loop does at a save step: the EMA callback saves its buffer, then the checkpoint. With
    use_async_save the optimizer goes to the Trainer's AsyncSaver (a pool of one spawned writer); the switch is read
    per save, so a synchronous save turns it off for that save."""
    trainer = JOB[0]
    ema = ema_callback(trainer)
    if ema is not None:
        ema.buffer.save(trainer.state.global_step)
    trainer.args.use_async_save = USE_ASYNC_SAVE and async_save
    try:
        trainer._save_checkpoint(trainer.model_wrapped, metrics=None)
    finally:
        trainer.args.use_async_save = USE_ASYNC_SAVE
    if async_save and USE_ASYNC_SAVE:
        returned(trainer._async_optimizer_saver, (), False, detach)


def wait():
    """Every async save in flight, oldest first: the wait the Trainer makes before its next async save."""
    while PENDING:
        PENDING.pop(0)._wait_for_previous_result()


def load(name, pieces):
    """Resume from ``name``'s checkpoint-N (None: the one get_last_checkpoint picks) in a new job, stopped as its
    first step begins; the moments and master weights that step creates come from what the resume loaded."""
    path = get_last_checkpoint(ROOT) if name is None else os.path.join(ROOT, f"checkpoint-{name.rsplit('-', 1)[-1]}")
    if path is None:
        raise Failed(f"get_last_checkpoint found no checkpoint-N under {ROOT}")
    step = int(path.rsplit("-", 1)[-1])
    with paddle.utils.unique_name.guard():
        trainer = trainer_for(step + 1)
        trainer.add_callback(StopAtFirstStep())
        try:
            trainer.train(resume_from_checkpoint=path)
        except Resumed:
            pass
        else:
            raise Failed(f"the Trainer resumed from {path} without starting a step")
    owns = owned(trainer)
    params = [p for p in trainer.model.parameters() if owns(p) and not p.stop_gradient]
    inner_optimizer(trainer)._create_accumulators(paddle.static.default_main_program().global_block(), params)
    JOB[1] = path
    return observe(trainer, pieces)

'''

# the job's moments, read where a resume at its last step leaves them (harness/sut/paddleformers_trainer.py)
SLOT = '''

def optimizer_slot(opt, owner, slot):
    """A moment as the job holds it: made by a step, else kept aside by the resume until the first step makes it."""
    made = opt._accumulators.get(slot, {}).get(owner)
    if made is not None:
        return made
    prefix = f"{owner}_{slot}_"
    return next((v for k, v in opt._accumulators_holder.items() if k.startswith(prefix) and k[len(prefix):].isdigit()),
                None)

'''

STATE = '''
def optimizers(trainer):
    chain = [trainer.optimizer]  # hybrid-parallel, sharding, AdamW
    while hasattr(chain[-1], "_inner_opt"):
        chain.append(chain[-1]._inner_opt)
    return chain


def inner_optimizer(trainer):
    return next(o for o in optimizers(trainer) if hasattr(o, "_master_weights"))


def owned(trainer):
    """Which parameters this rank's optimizer updates: under sharding stage 1 those it owns, else all."""
    sharding = next((o for o in optimizers(trainer) if hasattr(o, "_param2rank")), None)
    if sharding is None:
        return lambda param: True
    return lambda param: sharding._param2rank.get(param.name) == sharding._sharding_rank


def observe(trainer, pieces):
    """The job's state by key, as (dtype, shape, bits): the parameters, and from the rank whose optimizer owns each
    parameter its master weight, moments and EMA; a slot no rank holds yet is what the job had at step 0; the step.
    (The reference's rng/state is the stream its data comes from; the Trainer holds no such state.)"""
    opt, owns, ema = inner_optimizer(trainer), owned(trainer), ema_callback(trainer)
    named = dict(trainer.model.named_parameters())
    mine = {}
    for name, dtype in PARAMS.items():
        param = named[name]
        mine["model/" + name] = bits_of(param)
        if not owns(param):
            continue
        master = param if dtype == "F32" else opt._master_weights.get(param.name)
        if master is not None:
            mine["master/" + name] = bits_of(master)
        for slot, family in (("moment1", "m1"), ("moment2", "m2")):
            acc = optimizer_slot(opt, master.name if master is not None else param.name, slot)
            if acc is not None:
                mine[f"optimizer/{name}.{family}"] = bits_of(acc)
        if ema is not None:
            held = ema.buffer.model_params.get(name) if dtype == "F32" else ema.buffer.master_weights.get(param.name)
            if held is not None and held._is_initialized():
                mine["ema/" + name] = bits_of(held)
    gathered = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = []
        dist.all_gather_object(gathered, mine)
    state = {}
    for part in gathered:
        for key, value in part.items():
            state.setdefault(key, tuple(value))
    for key, p in DATA["save", 0][0].items():  # whole on every rank
        if key.split("/")[0] in ("model", "master", "optimizer", "ema"):
            state.setdefault(key, (DTYPE_NAMES[p.dtype], list(p.shape), p.bits))
    state["meta/step"] = ("int64", [], np.array(trainer.state.global_step, np.int64).tobytes().hex())
    return state

'''
