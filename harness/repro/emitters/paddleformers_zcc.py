"""Repro scripts for PaddleFormers' Zero-Cost Checkpointing (ZCC), driven as harness/sut/paddleformers_zcc.py drives
it: the Trainer script's model, data and reference loop (paddleformers_trainer), with ZCC on (the adapter's
``_arguments``) and ONE live job per launch: ``Trainer.train`` in a thread paused at each step's begin and end
(harness/sut/trainer_job.py, as text), since ZCC saves from inside the loop while later steps train. A ``save``
has the loop save at the step end the job stands at (an async one returns there; ``wait`` finishes the copy and
waits for ``saved_signal_<rank>``), a ``load`` ends the job and resumes a new one, paused before its first step.
Master weights and moments are read from every rank's stage-1 V2 slice, put together; the EMA lives in ZCC's
worker, so only a load shows it (the EMA file the resumed job hands its worker). A stalled save holds the worker
(SIGSTOP once idle) while the job trains on, as the harness's hold does. ZCC's CPU stand-ins
(harness/sut/zcc_shims.py) are carried as text; the worker side is installed where the spawned worker imports
the script again."""

from __future__ import annotations

import inspect
from pathlib import Path

from harness.repro.emitters import paddleformers_trainer as trainer
from harness.repro.emitters import zcc_text
from harness.repro.scripted_case import ScriptedCase
from harness.sut import paddleformers_zcc as adapter
from harness.sut import trainer_job, zcc_shims
from harness.sut.paddleformers_trainer import PaddleFormersTrainerSut, _optimizers

FRAMEWORK = "paddleformers"
TEXT = zcc_text
TRAINS = True  # its scripts render train steps (harness.repro.scripted_case)
STEPS = frozenset({"train", "save", "load", "wait", "resume"})
RANK_SHIMS = [name for name in zcc_shims.SHIMS if name != "adamw-inplace"]  # the adapter's: its Adam step is ours
RENDERED = trainer.RENDERED | {"gradient_accumulation_steps"}  # the adapter reads it: ZCC_ARGUMENTS says it


def settings(scripted: ScriptedCase) -> str:
    """The Trainer script's settings (spec, losses, gradients), and ZCC's arguments beyond the Trainer's."""
    trainer.check_steps(scripted, STEPS, async_saves=True)
    return trainer.loop_settings(scripted, RENDERED) + (
        f"HORIZON = {adapter.HORIZON}  # max_steps of a live job: the steps, not the loop, decide where it stops\n"
        f"# Zero-Cost Checkpointing on, beyond the Trainer's arguments: sharding stage 1 V2 with fused optimizer\n"
        f"# states (ZCC asserts them), one worker (ZCC's EMA asserts it), the case's micro-batches per step; by the\n"
        f"# job's world\n"
        f"ZCC_ARGUMENTS = {zcc_arguments(scripted)!r}\n")


def zcc_arguments(scripted: ScriptedCase) -> dict[int, dict]:
    """What the adapter's ``_arguments`` sets beyond the Trainer SUT's, for each world the case's jobs run on (a
    resume may run on another): the adapter is the spec, the script says only the difference (its ``trainer_for``
    builds the rest)."""
    spec, params, options = scripted.training, scripted.params, scripted.options
    differences = {}
    for world in sorted({phase.world for phase in scripted.phases}):
        args = [Path("ROOT"), spec, params, options, world, adapter.HORIZON]
        base = PaddleFormersTrainerSut._arguments(adapter.PaddleFormersZccSut(), *args)
        zcc = adapter.PaddleFormersZccSut()._arguments(*args)
        differences[world] = {k: v for k, v in zcc.items() if base.get(k, not v) != v}
    return differences


def helpers(scripted: ScriptedCase) -> str:
    return "".join((trainer.IMPORTS, IMPORTS, trainer.REFERENCE, _shims(), trainer.ADAM, trainer.MODEL,
                    trainer.BUILD, _job(), JOB, trainer.SLOT, STATE))


def _source(*objects: object) -> str:
    return "".join(f"\n\n{inspect.getsource(o)}" for o in objects)  # type: ignore[arg-type]


def _shims() -> str:
    """zcc_shims' registry, installers (its own worker_loop for the worker entry) and stand-in classes, as text, in
    the module's order; the worker side installed as a spawned worker imports this file again."""
    installers = [fn for name, fn in zcc_shims._INSTALLERS.items() if name != "adamw-inplace"]
    parts = [zcc_shims._DoneCommTask, zcc_shims._to_shm, zcc_shims._DoneTask, zcc_shims.CpuAsyncLoad,
             zcc_shims.install, zcc_shims.worker_loop, *installers]
    parts.sort(key=lambda o: inspect.getsourcelines(o)[1])  # type: ignore[arg-type]
    return ("\n\n# CPU stand-ins for the CUDA mechanisms on ZCC's path (nothing is installed on a CUDA build)\n"
            "WHY = {}\n_INSTALLERS = {}\n_installed = []\n" + _source(zcc_shims.shim, *parts)
            + "\n\nSHIMS = list(_INSTALLERS)  # every shim carried, in the order a run meets them\n"
            + f"RANK_SHIMS = {RANK_SHIMS!r}\nWORKER_SHIMS = {zcc_shims.WORKER_SHIMS!r}\n" + WORKER_SIDE)


WORKER_SIDE = '''

def worker_side():
    """The worker side of the shims: ZCC's workers are spawned, fresh interpreters the rank's patches do not reach."""
    install(WORKER_SHIMS)


if __name__ == "__mp_main__":  # this file, imported again in a spawned ZCC worker (before it unpickles its task)
    worker_side()
'''


def _job() -> str:
    """trainer_job's live job, and the adapter's reading of the stage-1 V2 slices and of its workers' state, as
    text."""
    return (f"\n\nBEGIN, END = {trainer_job.BEGIN!r}, {trainer_job.END!r}"
            + _source(trainer_job.JobStopped, trainer_job.TrainerJob, trainer_job._gate, _optimizers,
                      adapter._sharding, adapter._slices, adapter._idle))


IMPORTS = '''import contextlib  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from paddleformers.trainer.utils import zero_cost_checkpoint as zcc  # noqa: E402
'''

JOB = '''

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
        trainer = trainer_for(HORIZON, **ZCC_ARGUMENTS[int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))])
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

'''

STATE = '''
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
    for row in DATA["save", 0].values():  # each key whole on some rank of the first save, whatever world now runs
        for key, p in row.items():
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

'''

# A stalled save (the harness's ``stall``): the worker held from the start, as the adapter's standing_writers and
# the harness's hold do; the launch's end kills a worker still held (the next launch is the restart).
HOLD = f'''import atexit  # noqa: E402

SETTLE_S = {adapter.SETTLE_S}  # how long a hold waits for the worker to finish what it does from before the save


{inspect.getsource(adapter._settle)}

def holding(action, *args, **kwargs):
    """Run the save with ZCC's worker held from the start: once idle (what it still does from before, the last
    EMA step's, is not this save's), SIGSTOPped until resume() (or the grace of a step that waits for it), so the
    copy out of the buffers and the dump wait while the job trains on."""
    manager = LIVE[0].trainer.zcc_manager
    _settle(manager)
    with HOLDING:
        for process in manager.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGSTOP)
                HELD.append(process.pid)
    atexit.register(resume, signal.SIGKILL)  # runs before ZCC's own exit hook, which would wait for it for ever
    with grace():
        return action(*args, **kwargs)


'''
