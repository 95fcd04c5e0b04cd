"""torch-dcp: hang in P-LIVENESS (torch-dcp-killed-process-writer-hangs)

torch 2.13.0 CPU (gloo), 2 ranks; also reproduced by a 25-line torchrun script outside the harness: both ranks' futures were still unresolved after 90 s The record of a hang says only which op stopped: the signature is a save (or the wait of a detached one) that hangs under P-LIVENESS, where the history checker puts every hang and where kill faults hit the async checkpoint process; another cause of a torch-dcp save hang would look the same..

Standalone reproduction written by ckpt-harness from ckpt-harness finding torch-dcp-killed-process-writer-hangs.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
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

ASYNC_EXECUTOR = 'process'  # dcp.async_save's checkpointer type

CARRIERS = {'F32': ('float32', None)}  # numpy dtype torch reads bit for bit, and the torch dtype to view it as

DTYPE_NAMES = {'F32': 'float32'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['save', 0] = {
    0: {'model/w': Piece('F32', (4, 3), (0, 0), (2, 3), None, '7737ad15ad5368a39f7cc0230100807fe9336ac7addec0ff', (2,), ('S0',), ())},
    1: {'model/w': Piece('F32', (4, 3), (2, 0), (2, 3), None, '758814a1a71c8f948bd3d24fbb31b4eaa9cb60ad9805893e', (2,), ('S0',), ())},
}
DATA['save', 1] = {
    0: {'model/w': Piece('F32', (4, 3), (0, 0), (2, 3), None, '7aa910576f8a191c7d51ff1720315d2bc6302ec15c5c3e8d', (2,), ('S0',), ())},
    1: {'model/w': Piece('F32', (4, 3), (2, 0), (2, 3), None, '1d1b5c40460ea3ea2856835e5bdec7233614fffb1b5ee88a', (2,), ('S0',), ())},
}

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


from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: E402


def save(name, pieces, async_save=False, mutate_after=False, detach=False):
    state, dense = state_dict(pieces)
    path = os.path.join(ROOT, name)
    if not async_save:
        dcp.save(state, checkpoint_id=path)
        return
    group = dist.new_group(backend="gloo") if ASYNC_EXECUTOR == "thread" and dist.is_initialized() else None
    response = dcp.async_save(state, checkpoint_id=path, process_group=group,
                              async_checkpointer_type=AsyncCheckpointerType(ASYNC_EXECUTOR))
    returned(getattr(response, "upload_completion", response), dense.values(), mutate_after, detach)


def wait():
    futures, PENDING[:] = list(PENDING), []
    for future in futures:
        future.result()


def load(name, pieces):
    state, _ = state_dict(pieces, zero=True)
    dcp.load(state, checkpoint_id=os.path.join(ROOT, name))
    return state

import multiprocessing  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402


def written(pid):
    """Bytes the process has handed to write() calls (Linux: ``wchar`` of /proc/PID/io)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def kill_writers(after_bytes=0, timeout=60):
    """SIGKILL this rank's child processes — dcp.async_save's "process" executor writes in one — once they have
    written ``after_bytes`` bytes (mid-save), as the OOM killer would, and reap them; the rank itself goes on."""
    children, deadline = multiprocessing.active_children(), time.monotonic() + timeout
    while after_bytes and sum(written(c.pid) for c in children) < after_bytes and time.monotonic() < deadline:
        time.sleep(0.001)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)





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


def run(step, action, *args, expect_error=False, tolerate=False, also=(), **kwargs):
    """Run one step; an error where none is due (or none where one is), or a load that gives back other bits than
    were saved, shows the bug."""
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
        run('step 1: save step-1 (async)', save, 'step-1', DATA['save', 1][RANK], async_save=True, detach=True)
        run('step 1: SIGKILL the writers of the detached saves (the trainer goes on)', kill_writers, 256)
        run('step 1: wait for detached saves', wait)
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
