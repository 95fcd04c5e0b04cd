"""paddleformers-uc: silent-corruption in P-ROUNDTRIP (paddleformers-uc-f16-resume-tiny-master)

A job of F16 parameters (AdamW with FP32 master weights) saved on 2 data-parallel ranks with unified_checkpoint_config 'skip_save_model_weight' stores each master in place of its weight; the resume casts it back to float16 in faster_set_state_dict (new_t.astype(v.dtype)), on CPU through Paddle's portable phi::dtype::float16(float).

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddleformers-uc-f16-resume-tiny-master.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

import os
import sys
import time
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

from collections import namedtuple



if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

KEEP_LAST = None  # TrainingArguments.save_total_limit
UC_CONFIG = 'async_save skip_save_model_weight'  # TrainingArguments.unified_checkpoint_config
SEED = 0
# As on PaddleCloud (off here): sync saves end with a .checkpoint_done marker and
# get_last_checkpoint skips a checkpoint-N without one
os.environ["FLAG_LLM_PDC"] = "False"

CARRIERS = {'F16': ('float16', None), 'F32': ('float32', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'F16': 'float16', 'F32': 'float32'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load:restored', 0] = {
    0: {'master/w': Piece('F32', (), (), (), None, '7737ad15', (2,), ('R',), ()), 'model/w': Piece('F16', (), (), (), None, '0000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ())},
    1: {'master/w': Piece('F32', (), (), (), None, '7737ad15', (2,), ('R',), ()), 'model/w': Piece('F16', (), (), (), None, '0000', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'master/w': Piece('F32', (), (), (), None, '7737ad15', (2,), ('R',), ()), 'model/w': Piece('F16', (), (), (), None, '5f82', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ())},
    1: {'master/w': Piece('F32', (), (), (), None, '7737ad15', (2,), ('R',), ()), 'model/w': Piece('F16', (), (), (), None, '5f82', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (), (), (), None, '5f82c2d9', (2,), ('R',), ())},
}

def tensor(p, zero=False):
    """A paddle tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = paddle.to_tensor(data)
    return t.view(getattr(paddle, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a dense tensor, or of a dist tensor's local part."""
    if getattr(t, "is_dist", lambda: False)():
        t = t._local_value()
    return str(t.dtype).split(".")[-1], list(t.shape), np.ascontiguousarray(t.numpy()).tobytes().hex()



from paddleformers.trainer import Trainer, TrainingArguments  # noqa: E402
from paddleformers.trainer.trainer_callback import TrainerState  # noqa: E402
from paddleformers.trainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddleformers.trainer.utils.helper import distributed_file, distributed_isfile  # noqa: E402
from paddleformers.transformers import PretrainedConfig, PretrainedModel  # noqa: E402
from paddleformers.utils.env import TRAINER_STATE_NAME  # noqa: E402

JOB = []  # this launch's training job, [trainer, parameters by name], made by its first save


class TinyConfig(PretrainedConfig):
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


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
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


def load(name, pieces):
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
    if PHASE == 0:  # 2 process(es)
        run('step 0: save step-1', save, 'step-1', DATA['save', 0][RANK])
        run('step 1: load step-1', load, 'step-1', DATA['load:restored', 0][RANK])
    handler = getattr(JOB[0], "unified_checkpoint_handler", None) if JOB else None
    if handler is not None:
        try:
            handler.unlink_shared_memory()
        except RuntimeError as exc:
            print(f"rank {RANK}: UC's end of training: {exc}")
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
