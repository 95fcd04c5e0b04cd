"""paddleformers-uc: hang in P-LIVENESS (paddleformers-uc-killed-writer-deadlocks-next-save)

(save step-2): hang: rank 0 did not finish op 3.

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddleformers-uc-killed-writer-deadlocks-next-save.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
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
SEED = 0
# As on PaddleCloud (off here): sync saves end with a .checkpoint_done marker and
# get_last_checkpoint skips a checkpoint-N without one
os.environ["FLAG_LLM_PDC"] = "False"

CARRIERS = {'BF16': ('uint16', None), 'F32': ('float32', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'BF16': 'bfloat16', 'F32': 'float32'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 2] = {
    0: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'f64342bed3b9f40e5dec65fd38c0091597938847983f3327', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, 'ef84a5ffab16bad9bc0d957f', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'b109acee2fdf2127639e5a3bc025df2d847a29285112d6ba', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000080ffcafbfa78b7f048a7f48d875847bcff5d68f110d7', (2,), ('R',), ())},
    1: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'f64342bed3b9f40e5dec65fd38c0091597938847983f3327', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, 'ef84a5ffab16bad9bc0d957f', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'b109acee2fdf2127639e5a3bc025df2d847a29285112d6ba', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '000080ffcafbfa78b7f048a7f48d875847bcff5d68f110d7', (2,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '1b91ef29d852b8e04e22fc23809fedbcbc6495c327427222', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '7737ad15ad5368a39f7cc023', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'd9be1568167f24762d4fa1797fb746b1ebf3824ab85218cb', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '4243681fb9747d32decbb26aa504e18d476fcc24c16befe0', (2,), ('R',), ())},
    1: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, '1b91ef29d852b8e04e22fc23809fedbcbc6495c327427222', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '7737ad15ad5368a39f7cc023', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'd9be1568167f24762d4fa1797fb746b1ebf3824ab85218cb', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '4243681fb9747d32decbb26aa504e18d476fcc24c16befe0', (2,), ('R',), ())},
}
DATA['save', 1] = {
    0: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'ad1ae398010000005ecd56afcf0c9c837e6e0748ceb9751e', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '7aa910576f8a191c7d51ff17', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'c7779b1a4ac684875b0519b5a5ef6e20de575b1723561f30', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '68fd89790781ef9f54c654c70c3567326d2ef669e9374ec5', (2,), ('R',), ())},
    1: {'master/w': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'ad1ae398010000005ecd56afcf0c9c837e6e0748ceb9751e', (2,), ('R',), ()), 'model/w': Piece('BF16', (3, 2), (0, 0), (3, 2), None, '7aa910576f8a191c7d51ff17', (2,), ('R',), ()), 'optimizer/w.m1': Piece('F32', (3, 2), (0, 0), (3, 2), None, 'c7779b1a4ac684875b0519b5a5ef6e20de575b1723561f30', (2,), ('R',), ()), 'optimizer/w.m2': Piece('F32', (3, 2), (0, 0), (3, 2), None, '68fd89790781ef9f54c654c70c3567326d2ef669e9374ec5', (2,), ('R',), ())},
}
DATA['save', 2] = DATA['load', 2]  # the same pieces

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


PENDING = []  # the writers (threads, processes or futures) of async saves not waited for yet


def returned(writer, tensors, mutate_after, detach):
    """An async save returned: the caller overwrites its tensors (where the step says so), then waits for the
    writer unless the step leaves it running."""
    if writer is not None:
        PENDING.append(writer)
    if mutate_after:
        for t in tensors:
            scribble(t)
    if not detach:
        wait()

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
        load_checkpoint_format="unified_checkpoint", unified_checkpoint_config="async_save",
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
    if async_save:
        returned(None, list(live.values()), mutate_after, detach)


# UC's async writers: (what each saves, its shared flag, 1 while it writes a file, and its process)
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



import signal  # noqa: E402


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







def check(step, got, pieces, also=()):
    """Every loaded piece must have the dtype and the exact bits that were saved: by one save as a whole (``also``:
    the other saves it may rightly give, after a kill in the middle of a re-save of the name)."""
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
            print(f"BUG: {step} on rank {RANK}: {key} does not hold what was saved"
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
    if action is load and not tolerate:
        check(step, result, args[-1], also)

def main():
    global ROOT, PHASE, RANK
    ROOT, PHASE = sys.argv[1], int(sys.argv[2])
    paddle.set_device("cpu")
    RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if PHASE == 0:  # 2 process(es)
        run('step 0: save step-0', save, 'step-0', DATA['save', 0][RANK])
        run('step 1: save step-1 (async)', save, 'step-1', DATA['save', 1][RANK], async_save=True, detach=True)
        run('step 2: SIGKILL the writers of the detached saves (the trainer goes on)', kill_writers)
        run('step 3: save step-2 (async)', save, 'step-2', DATA['save', 2][RANK], async_save=True, tolerate=True)
        run('step 4: load step-2', load, 'step-2', DATA['load', 2][RANK])
    handler = getattr(JOB[0], "unified_checkpoint_handler", None) if JOB else None
    if handler is not None:
        try:
            handler.unlink_shared_memory()
        except RuntimeError as exc:
            print(f"rank {RANK}: UC's end of training: {exc}")
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
