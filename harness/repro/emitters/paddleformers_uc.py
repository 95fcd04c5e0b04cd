"""Repro scripts for PaddleFormers' Unified Checkpoint, driven as harness/sut/paddleformers_uc.py drives it: a
Trainer over a tiny model whose parameters are the case's ``model/<p>`` tensors, AdamW's moments and FP32 master
weights as ``optimizer/<p>.m1|.m2`` and ``master/<p>``; a save is the Trainer's checkpoint at global step N
(``checkpoint-N``), a load is a resume in a fresh Trainer."""

from __future__ import annotations

from harness.repro.emitters import uc_text
from harness.repro.scripted_case import ReproUnsupported, ScriptedCase
from harness.sut.paddleformers_uc import UC_FLAGS, uc_config

FRAMEWORK = "paddleformers"
TEXT = uc_text
INERT = frozenset({"commit_timeout", "op_timeout"})
RENDERED = frozenset({"keep_last", "pdc", "seed", *UC_FLAGS})


def settings(scripted: ScriptedCase) -> str:
    options = scripted.options
    unknown = sorted(set(options) - INERT - RENDERED)
    if unknown:
        raise ReproUnsupported(f"option(s) {unknown} (the script does not render them yet)")
    pdc = bool(options.get("pdc", False))
    return (f"KEEP_LAST = {options.get('keep_last')!r}  # TrainingArguments.save_total_limit\n"
            f"UC_CONFIG = {uc_config(options)!r}  # TrainingArguments.unified_checkpoint_config\n"
            f"SEED = {int(options.get('seed', 0))}\n"
            f"# As on PaddleCloud{'' if pdc else ' (off here)'}: sync saves end with a .checkpoint_done marker and\n"
            "# get_last_checkpoint skips a checkpoint-N without one\n"
            f'os.environ["FLAG_LLM_PDC"] = "{pdc}"\n')


def helpers(scripted: ScriptedCase) -> str:
    """The script's functions, leaving out UC's async writers where no step saves asynchronously or waits."""
    waits = scripted.uses("use_async") or any(s.kind in ("wait", "kill")
                                              for phase in scripted.phases for s in phase.steps)
    return "".join((IMPORTS, MODEL, SAVE, *((SAVE_RETURNS, "\n\n", ASYNC) if waits else ("\n\n",)), LOAD))


IMPORTS = '''from paddleformers.trainer import Trainer, TrainingArguments  # noqa: E402
from paddleformers.trainer.trainer_callback import TrainerState  # noqa: E402
from paddleformers.trainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddleformers.trainer.utils.helper import distributed_file, distributed_isfile  # noqa: E402
from paddleformers.transformers import PretrainedConfig, PretrainedModel  # noqa: E402
from paddleformers.utils.env import TRAINER_STATE_NAME  # noqa: E402

JOB = []  # this launch's training job, [trainer, parameters by name], made by its first save


'''

MODEL = '''class TinyConfig(PretrainedConfig):
    model_type = "tiny"


class TinyModel(PretrainedModel):
    config_class = TinyConfig
    base_model_prefix = "tiny"

    def forward(self, *args, **kwargs):
        raise RuntimeError("never run: the script sets the state a training step would leave")


def tiny_model(pieces):
    """A model whose parameters are exactly the pieces' model/<name> tensors ("layers.0.w" nests sub-layers)."""
    model = TinyModel(TinyConfig())
    for key, p in sorted(pieces.items()):
        if not key.startswith("model/"):
            continue
        layer, (*path, leaf) = model, key[len("model/"):].split(".")
        for part in path:
            if part not in layer._sub_layers:
                layer.add_sublayer(part, paddle.nn.Layer())
            layer = layer._sub_layers[part]
        layer.add_parameter(leaf, model.create_parameter(
            list(p.shape), dtype=DTYPE_NAMES[p.dtype], default_initializer=paddle.nn.initializer.Constant(0.0)))
    return model


def trainer_for(pieces, first_step=True):
    """A Trainer with Unified Checkpoint on (async saves allowed), over a fresh model. With ``first_step`` AdamW
    holds its moments (and master weights) as after one step; a resuming job gets them at its first step."""
    low = any(p.dtype != "F32" for key, p in pieces.items() if key.startswith("model/"))
    args = TrainingArguments(
        output_dir=ROOT, unified_checkpoint=True, save_checkpoint_format="unified_checkpoint",
        load_checkpoint_format="unified_checkpoint", unified_checkpoint_config=UC_CONFIG,
        save_total_limit=KEEP_LAST, amp_master_grad=False, sharding="", report_to="none", disable_tqdm=True,
        max_steps=1, save_steps=1, logging_steps=1, per_device_train_batch_size=1, seed=SEED,
        # BF16/F16 parameters as a user trains them: AMP O2, so AdamW keeps FP32 master weights
        **({"bf16": True, "fp16_opt_level": "O2"} if low else {}))
    model = tiny_model(pieces)
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    params = dict(model.named_parameters())
    if first_step:
        first_step_state(trainer, params)
    return trainer, params


def first_step_state(trainer, params):
    """What AdamW's first step creates: moments, and master weights for BF16/F16 parameters (internal API: the
    script runs no forward pass)."""
    trainer.optimizer._create_accumulators(paddle.static.default_main_program().global_block(), list(params.values()))


def slots(trainer, params, keys):
    """Each piece's live tensor: a parameter, an AdamW moment or a master weight (internal API: where AdamW keeps
    them)."""
    optimizer, out = trainer.optimizer, {}
    for key in keys:
        family, _, rest = key.partition("/")
        if family == "model":
            out[key] = params[rest]
            continue
        param, _, moment = rest.rpartition(".") if family == "optimizer" else (rest, "", "")
        master = optimizer._master_weights.get(params[param].name)
        if family == "master":
            out[key] = master
            continue
        low = master is not None and params[param].dtype != paddle.float32  # AdamW keys those moments by the master
        moments = optimizer._accumulators["moment1" if moment == "m1" else "moment2"]
        out[key] = moments[(master if low else params[param]).name]
    return out


'''

SAVE = '''def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    """Put the pieces in the live model and optimizer, then save as the Trainer does at step N of ``name``."""
    if not JOB:
        JOB.extend(trainer_for(pieces))
    trainer, params = JOB
    live = slots(trainer, params, pieces)
    for key, t in live.items():
        t.set_value(tensor(pieces[key]))
    trainer.state.global_step = int(name.rsplit("-", 1)[-1])
    trainer.is_in_train = True
    config = trainer.args.unified_checkpoint_config
    if not async_save:  # as the Trainer's final save does: async_save off for this save only
        trainer.args.unified_checkpoint_config = [c for c in config if c != "async_save"]
    try:
        trainer._save_checkpoint(trainer.model, metrics=None)
    finally:
        trainer.args.unified_checkpoint_config = config
'''

SAVE_RETURNS = '''    if async_save:
        returned(None, list(live.values()), mutate_after, detach)
'''  # the end of save() in a script whose saves can be async (returned() waits through UC's writers)

ASYNC = '''# UC's async writers: (what each saves, its shared flag, 1 while it writes a file, and its process)
WRITERS = (("model_weight", "_shared_save_model_flag", "_process_model_weight"),
           ("master_weight", "_shared_save_master_weight_flag", "_process_master_weight"),
           ("optimizer_weight", "_shared_save_optimizer_flag", "_process_optimizer_weight"))


def async_handler():
    handler = getattr(JOB[0], "unified_checkpoint_handler", None) if JOB else None
    return getattr(handler, "async_handler", None)


def wait(timeout=60):
    """Until UC's writer processes have finished their files (the Trainer waits only at its next save), on every
    rank: the next step starts once all ranks' writers are done, as a later resume would find them; a writer that
    died raises, as UC's own wait does."""
    handler, deadline, problem = async_handler(), time.monotonic() + timeout, None
    for kind, flag_name, process_name in WRITERS if handler is not None else ():
        flag, process = getattr(handler, flag_name, None), getattr(handler, process_name, None)
        while problem is None and flag is not None and flag[0] > 0:
            if process is None or not process.is_alive():
                problem = f"the UC process that saves {kind} died before finishing its file"
            elif time.monotonic() > deadline:
                problem = f"the UC {kind} writer did not finish within {timeout} s"
            time.sleep(0.01)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()  # every rank comes, its writers done or not: none waits on a rank that raised
    if problem is not None:
        raise Failed(problem)


'''

LOAD = '''def load(name, pieces):
    """Resume in a fresh Trainer, as ``Trainer.train(resume_from_checkpoint=...)`` does before its first step;
    "latest" is what get_last_checkpoint picks. Gives each piece's live tensor after AdamW's first step."""
    if name is None:
        path = get_last_checkpoint(ROOT)
        if path is None:
            raise Failed(f"get_last_checkpoint found no checkpoint-N under {ROOT}")
    else:
        path = os.path.join(ROOT, "checkpoint-" + name.rsplit("-", 1)[-1])
    trainer, params = trainer_for(pieces, first_step=False)
    trainer._load_from_checkpoint(path)
    trainer.model_wrapped = trainer._wrap_model(trainer.model_wrapped)
    trainer._load_optimizer_and_scheduler(path)
    state = os.path.join(path, TRAINER_STATE_NAME)
    if distributed_isfile(state):  # as the training loop: a missing trainer state is skipped
        state = distributed_file(state)  # the .json or .bin the save wrote
        trainer.state = TrainerState.load_from_json(state) if state.endswith(".json") else TrainerState.load(state)
    first_step_state(trainer, params)  # moments and masters come from what was loaded
    return slots(trainer, params, pieces)


'''

KILL_WRITERS = '''import signal  # noqa: E402


def kill_writers(after_bytes=None, timeout=60):
    """SIGKILL UC's writer processes, as the OOM killer or a crash would, and reap them; the trainer itself goes on.
    ``None``: once they have finished their files (a writer dies idle, waiting for the next save); otherwise at once.
    Says which were in the middle of a file (their flag still 1)."""
    handler = async_handler()
    if handler is not None and after_bytes is None:
        try:
            wait(timeout)
        except Failed:  # a writer already dead or late: it is killed where it is, as the harness does
            pass
    for kind, flag_name, process_name in WRITERS if handler is not None else ():
        process, flag = getattr(handler, process_name, None), getattr(handler, flag_name, None)
        if process is not None and process.is_alive():
            busy = flag is not None and flag[0] > 0
            os.kill(process.pid, signal.SIGKILL)
            process.join(10)
            print(f"rank {RANK}: killed the {kind} writer {'in the middle of a file' if busy else 'while idle'}")


'''
