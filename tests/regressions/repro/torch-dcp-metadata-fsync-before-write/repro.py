"""torch-dcp: data-loss in P-ATOMIC (torch-dcp-metadata-fsync-before-write)

torch 2.13.0 CPU, 2 ranks, async_save (thread executor).

Standalone reproduction written by ckpt-harness from ckpt-harness finding torch-dcp-metadata-fsync-before-write.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
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

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

ASYNC_EXECUTOR = 'thread'  # dcp.async_save's checkpointer type

CARRIERS = {'F8_E5M2': ('uint8', 'float8_e5m2'), 'U8': ('uint8', None)}  # numpy dtype torch reads bit for bit, and the torch dtype to view it as

DTYPE_NAMES = {'F8_E5M2': 'float8_e5m2', 'U8': 'uint8'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 1] = {
    0: {'ema/w': Piece('F8_E5M2', (2,), (0,), (1,), None, '34', (2,), ('S0',), ()), 'model/emb': Piece('U8', (), (), (), None, 'c0', (2,), ('R',), ())},
    1: {'ema/w': Piece('F8_E5M2', (2,), (1,), (1,), None, 'a1', (2,), ('S0',), ()), 'model/emb': Piece('U8', (), (), (), None, 'c0', (2,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'ema/w': Piece('F8_E5M2', (2,), (0,), (1,), None, '53', (2,), ('S0',), ()), 'model/emb': Piece('U8', (), (), (), None, '9e', (2,), ('R',), ())},
    1: {'ema/w': Piece('F8_E5M2', (2,), (1,), (1,), None, 'd6', (2,), ('S0',), ()), 'model/emb': Piece('U8', (), (), (), None, '9e', (2,), ('R',), ())},
}
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

def damage(edits):
    """Change the checkpoint's files as listed, between two steps: every rank has finished the step before (a save
    may return on one rank before another has written its file), rank 0 edits, the others wait."""
    if dist.is_initialized():
        dist.barrier()
    for e in edits if RANK == 0 else ():
        path = os.path.join(ROOT, e["path"])
        if e["kind"] == 'lose_data':
            if os.path.exists(path):  # written since its last fsync (never): a power loss empties it
                os.truncate(path, 0)
    if dist.is_initialized():
        dist.barrier()



def check(step, got, pieces):
    """Every loaded piece must have the dtype and the exact bits that were saved."""
    for key, p in pieces.items():
        if key not in got:
            continue  # an empty flattened slice: nothing was asked for
        dtype, shape, bits = bits_of(got[key])
        want = (DTYPE_NAMES[p.dtype], list(p.shape), p.bits)
        if (dtype, shape, bits) != want:
            print(f"BUG: {step} on rank {RANK}: {key} does not hold what was saved")
            print(f"EXPECTED: {want[0]} {want[1]} bits {want[2]}")
            print(f"ACTUAL:   {dtype} {shape} bits {bits}")
            sys.exit(1)


class Failed(Exception):
    """A failure this script detects itself (the framework only logged it)."""


def run(step, action, *args, expect_error=False, tolerate=False, **kwargs):
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
        check(step, result, args[-1])

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
        run('step 1: save step-1', save, 'step-1', DATA['save', 1][RANK])
        run('step 1: power loss after the save returned: the data of step-1/.metadata was never fsynced, so those files come back empty', damage, [{'kind': 'lose_data', 'path': 'step-1/.metadata'}])
    elif PHASE == 1:  # 2 process(es)
        run('step 2: load step-1', load, 'step-1', DATA['load', 1][RANK])
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
