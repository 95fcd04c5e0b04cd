"""torch-dcp: silent-corruption in P-ATOMIC (torch-dcp-resave-crash-mixes-versions)

Found by replaying the Paddle finding's shape on torch after CI met its other face (P-LIFECYCLE, below).

Standalone reproduction written by ckpt-harness from ckpt-harness finding torch-dcp-resave-crash-mixes-versions.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

import datetime
import os
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from collections import namedtuple



if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

ASYNC_EXECUTOR = 'thread'  # dcp.async_save's checkpointer type

CARRIERS = {'BF16': ('int16', 'bfloat16'), 'F32': ('float32', None)}  # numpy dtype torch reads bit for bit, and the torch dtype to view it as

DTYPE_NAMES = {'BF16': 'bfloat16', 'F32': 'float32'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 0] = {
    0: {'ema/w': Piece('BF16', (4, 2), (0, 0), (2, 2), None, '4243681fb9747d32', (2,), ('S0',), ()), 'model/b': Piece('F32', (3,), (0,), (3,), None, 'd9be1568167f24762d4fa179', (2,), ('R',), ()), 'model/emb': Piece('F32', (0, 3), (0, 0), (0, 3), None, '', (2,), ('S0',), ()), 'model/w': Piece('F32', (5, 2), (0, 0), (3, 2), None, '7737ad15ad5368a39f7cc02355e48c940000807f527fed84', (2,), ('S0',), ())},
    1: {'ema/w': Piece('BF16', (4, 2), (2, 0), (2, 2), None, 'decbb26aa504e18d', (2,), ('S0',), ()), 'model/b': Piece('F32', (3,), (0,), (3,), None, 'd9be1568167f24762d4fa179', (2,), ('R',), ()), 'model/emb': Piece('F32', (0, 3), (0, 0), (0, 3), None, '', (2,), ('S0',), ()), 'model/w': Piece('F32', (5, 2), (3, 0), (2, 2), None, '01000000a71c8f948bd3d24fbb31b4ea', (2,), ('S0',), ())},
}
DATA['load', 1] = {
    0: {'ema/w': Piece('BF16', (4, 2), (0, 0), (2, 2), None, '68fd89790781ef9f', (2,), ('S0',), ()), 'model/b': Piece('F32', (3,), (0,), (3,), None, 'c7779b1a4ac684875b0519b5', (2,), ('R',), ()), 'model/emb': Piece('F32', (0, 3), (0, 0), (0, 3), None, '', (2,), ('S0',), ()), 'model/w': Piece('F32', (5, 2), (0, 0), (3, 2), None, '7aa910576f8a191c7d51ff1720315d2bc6302ec15c5c3e8d', (2,), ('S0',), ())},
    1: {'ema/w': Piece('BF16', (4, 2), (2, 0), (2, 2), None, '54c654c70c356732', (2,), ('S0',), ()), 'model/b': Piece('F32', (3,), (0,), (3,), None, 'c7779b1a4ac684875b0519b5', (2,), ('R',), ()), 'model/emb': Piece('F32', (0, 3), (0, 0), (0, 3), None, '', (2,), ('S0',), ()), 'model/w': Piece('F32', (5, 2), (3, 0), (2, 2), None, '1d1b5c40460ea3ea2856835e5bdec723', (2,), ('S0',), ())},
}
DATA['save', 0] = DATA['load', 0]  # the same pieces
DATA['save', 1] = DATA['load', 1]  # the same pieces

WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor(p, zero=False):
    """A torch tensor holding the piece's exact bits (or zeros of its dtype and shape: a load target)."""
    carrier, view = CARRIERS[p.dtype]
    data = np.zeros(p.shape, carrier) if zero else np.frombuffer(bytes.fromhex(p.bits), carrier).reshape(p.shape)
    t = torch.from_numpy(data.copy())
    return t.view(getattr(torch, view)) if view else t


def bits_of(t):
    """(dtype name, shape, bits as hex) of a tensor, or of a DTensor's local part."""
    t = t.to_local() if hasattr(t, "to_local") else t
    raw = t.detach().contiguous().view(WIDTH[t.element_size()]).numpy()
    return str(t.dtype).removeprefix("torch."), list(t.shape), raw.tobytes().hex()



from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402

MESHES = {}


def entry(p, t):
    """What goes in the state dict for this rank's piece ``p`` held in ``t``."""
    if p.mesh is None or p.owner:
        return t  # whole on its owners: DCP treats it as replicated
    if p.mesh not in MESHES:
        MESHES[p.mesh] = init_device_mesh("cpu", p.mesh)
    placements = [Shard(int(s[1:])) if s.startswith("S") else Replicate() for s in p.placements]
    stride = tuple(int(np.prod(p.global_shape[i + 1:])) for i in range(len(p.global_shape)))
    return DTensor.from_local(t, MESHES[p.mesh], placements, shape=p.global_shape, stride=stride)


def state_dict(pieces, zero=False):
    dense = {name: tensor(p, zero) for name, p in pieces.items()}
    return {name: entry(pieces[name], t) for name, t in dense.items()}, dense


def save(name, pieces):
    state, _ = state_dict(pieces)
    dcp.save(state, checkpoint_id=os.path.join(ROOT, name))


def load(name, pieces):
    state, _ = state_dict(pieces, zero=True)
    dcp.load(state, checkpoint_id=os.path.join(ROOT, name))
    return state





import errno  # noqa: E402
import signal  # noqa: E402


def crash_step(step, call, action, *args, **kwargs):
    """Run a step in which the rank making ``call`` (an audit event, a path under ROOT, which of its calls, an errno
    or None, whether the call runs first, and which rank: None for whichever makes it) meets the fault at that
    call: SIGKILLed (no errno) — no clean-up, as a machine failure or the OOM killer ends a job — before it runs,
    or right after (an open: the kill lands before the file's first write), or the call fails with that errno, as a
    full disk or a failing device makes it.
    Every rank's launch ends with the step (the job restarts); the next launch starts fresh on what it left."""
    event, path, k, error, after, rank = call
    target, seen = os.path.abspath(os.path.join(ROOT, path)), [0]

    def hook(name, hook_args):
        if rank not in (None, RANK) or name != event or not hook_args:
            return
        if not isinstance(hook_args[0], (str, bytes, os.PathLike)):
            return
        if os.path.abspath(os.fsdecode(hook_args[0])) != target:
            return
        seen[0] += 1
        if seen[0] != k:
            return
        with open(os.path.join(os.path.dirname(os.path.abspath(ROOT)), f"fault-{PHASE}"), "w"):
            pass  # run.sh's sign that the fault happened
        if error is not None:
            print(f"{step}: call {k} of {event} on {path} fails with {error} on rank {RANK}", flush=True)
            raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)), os.fsdecode(hook_args[0]))
        if after:  # the open itself (creating or truncating the file as the framework asked), then the kill
            os.close(os.open(hook_args[0], hook_args[2], 0o666))
        print(f"{step}: rank {RANK} killed {'after' if after else 'before'} call {k} of {event} on {path}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)  # for the rest of this process, which the step ends
    try:
        action(*args, **kwargs)
        if error is not None:
            print(f"{step}: rank {RANK} finished the step despite the error (what it left is judged next)")
    except BaseException as exc:  # the injected error, or a peer killed in the middle of a collective
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"{step}: rank {RANK} stopped ({type(exc).__name__}: {str(exc)[:200]}); the launch ends")
    sys.stdout.flush()
    os._exit(0)  # the job is over: no framework teardown waits for a dead or failed rank

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
    were saved, shows the bug. ``may_fail``: the save it reads was killed part-way, never acknowledged: an error is
    a right answer there, other bits are not."""
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
            print(f"{step}: raised ({type(exc).__name__}), a right answer: the save it reads was killed part-way")
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
    if "RANK" in os.environ:  # started by torchrun: one process per rank, gloo on the CPU
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    else:  # one plain process: a world of one (DTensors need a process group)
        store = os.path.join(os.path.dirname(os.path.abspath(ROOT)), f"store-{os.getpid()}")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    RANK = dist.get_rank()
    if PHASE == 0:  # 2 process(es)
        run('step 0: save step-0', save, 'step-0', DATA['save', 0][RANK])
        crash_step('step 1: save step-0 (killed at call 1 of openat on step-0/__1_0.distcp)', ('open', 'step-0/__1_0.distcp', 1, None, False, None), save, 'step-0', DATA['save', 1][RANK])
    elif PHASE == 1:  # 2 process(es)
        run('step 2: load step-0', load, 'step-0', DATA['load', 1][RANK], also=(DATA['load', 0][RANK], ))
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
