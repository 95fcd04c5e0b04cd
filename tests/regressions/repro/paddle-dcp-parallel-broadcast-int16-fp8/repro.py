"""paddle-dcp: crash in P-RESHARD (paddle-dcp-parallel-broadcast-int16-fp8)

load_state_dict(comm_method='parallel_broadcast') on a 2 x 2 grid of groups (4 gloo ranks) of an int16 tensor that must move between ranks (I16 [4] saved Shard(0), loaded replicated): ThreeDCommGroupStateResharder broadcasts each chunk down the vertical group, all-gathers it along the horizontal one and broadcasts across the parallel group and the world, each in the chunk's own dtype, which gloo does not carry: the rank exits in C++ with no Python error after 'Begin resharding using batch broadcasting'.

Standalone reproduction written by ckpt-harness from ckpt-harness finding paddle-dcp-parallel-broadcast-int16-fp8.json. Run ``bash run.sh``: it starts each launch below with fresh processes. The script prints BUG / EXPECTED / ACTUAL and exits 1 while the bug is there; every rank exits 0 once it is fixed.
"""

import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

from collections import namedtuple


import needs  # noqa: E402  known bugs' fixes this bug shows behind (needs.py): applied in every process

needs.apply()


if os.environ.get("REPRO_WITH_FIX"):  # bash run.sh --with-fix: the candidate fix (fix.py) before any step
    import fix

    fix.apply()

ROOT, PHASE, RANK = None, None, 0  # the checkpoint directory, which launch of run.sh this is, this rank

SAFETENSORS = False  # the format= of the checkpoint
DIST_TENSORS = False  # pieces as dist tensors (else as ShardedWeight)
SAME_DIR = False  # every name a version (unique_id) of one directory
SAVE_REPLICAS = False
UNIQUE_ID = None
COMM_METHOD = 'parallel_broadcast'
PARALLEL_GRIDS = 1  # parallel_broadcast's grids of groups

CARRIERS = {'I16': ('int16', None)}  # numpy dtype Paddle reads bit for bit, and the paddle dtype to view it as

DTYPE_NAMES = {'I16': 'int16'}  # as the framework prints them

# One rank's piece of a tensor: dtype, global shape, offsets and shape of its box (or the [start, stop) of a
# flattened slice), its bits as hex, and for a dist tensor its mesh shape, placements and owner coordinates.
Piece = namedtuple("Piece", "dtype global_shape offsets shape flat bits mesh placements owner")

# What each rank saves, and what each load must give back: (layout, version) -> rank -> tensor -> piece
DATA = {}
DATA['load', 0] = {
    0: {'model/w': Piece('I16', (4,), (0,), (4,), None, '0104a53b02f8db9a', (4,), ('R',), ())},
    1: {'model/w': Piece('I16', (4,), (0,), (4,), None, '0104a53b02f8db9a', (4,), ('R',), ())},
    2: {'model/w': Piece('I16', (4,), (0,), (4,), None, '0104a53b02f8db9a', (4,), ('R',), ())},
    3: {'model/w': Piece('I16', (4,), (0,), (4,), None, '0104a53b02f8db9a', (4,), ('R',), ())},
}
DATA['save', 0] = {
    0: {'model/w': Piece('I16', (4,), (0,), (1,), None, '0104', (4,), ('S0',), ())},
    1: {'model/w': Piece('I16', (4,), (1,), (1,), None, 'a53b', (4,), ('S0',), ())},
    2: {'model/w': Piece('I16', (4,), (2,), (1,), None, '02f8', (4,), ('S0',), ())},
    3: {'model/w': Piece('I16', (4,), (3,), (1,), None, 'db9a', (4,), ('S0',), ())},
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



def location(name):
    """(directory, unique_id) of a checkpoint name: its own directory, or a version of the shared one."""
    if name is None:
        return os.path.join(ROOT, "dcp"), None  # the newest version
    if SAME_DIR:
        return os.path.join(ROOT, "dcp"), int(name.rsplit("-", 1)[-1])
    return os.path.join(ROOT, name), UNIQUE_ID


def grid_groups(count=1):
    """The rank's row (horizontal group) and column (vertical group) of its grid: the world in ``count`` equal
    blocks of consecutive ranks, each in rows of its largest proper divisor (the whole block when its size is
    prime); with several grids, its parallel group too: the ranks at its place in every block. Every rank makes
    every group, in one order, as new_group requires."""
    size, rank = dist.get_world_size(), dist.get_rank()
    block = size // count
    row = max([d for d in range(2, block) if block % d == 0], default=block)
    rows = [list(range(start, start + row)) for start in range(0, size, row)]
    columns = [[start + r + i for r in range(0, block, row)] for start in range(0, size, block) for i in range(row)]
    parallel = [list(range(place, size, block)) for place in range(block)] if count > 1 else []
    groups = {tuple(g): dist.new_group(g) for g in rows + columns + parallel}
    mine = {"h_group": rows[rank // row], "v_group": next(c for c in columns if rank in c)}
    if parallel:
        mine["p_group"] = parallel[rank % block]
    return {name: groups[tuple(ranks)] for name, ranks in mine.items()}


def worker_groups():
    """parallel_broadcast's horizontal, vertical and parallel groups: the rank's row and column of its grid among
    PARALLEL_GRIDS, and its parallel group across them (none for one grid: the two-dimensional path)."""
    groups = grid_groups(PARALLEL_GRIDS)
    return [groups["h_group"], groups["v_group"], groups.get("p_group")]


def entry(name, p, t, dist_tensors):
    """What goes in the state dict for this rank's piece ``p``, held in ``t``."""
    return dist.ShardedWeight(name, t, p.shape, p.global_shape, p.offsets)


def key(name, side):
    return name


def state_dict(pieces, zero=False, side="save"):
    """(state dict, the dense tensors behind it) for this rank; ShardedWeight for all if any piece is flattened."""
    dist_tensors = DIST_TENSORS and not any(p.flat is not None for p in pieces.values())
    state, dense = {}, {}
    for name, p in pieces.items():
        t = tensor(p, zero)
        value = entry(key(name, side), p, t, dist_tensors)
        if value is not None:
            state[key(name, side)], dense[name] = value, t
    return state, dense


def save(name, pieces):
    state, _ = state_dict(pieces)
    path, unique_id = location(name)
    dist.save_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS,
                         save_replicas=SAVE_REPLICAS)


def load(name, pieces):
    state, dense = state_dict(pieces, zero=True, side="load")
    path, unique_id = location(name)
    dist.load_state_dict(state, path, unique_id=unique_id, safetensors=SAFETENSORS, comm_method=COMM_METHOD,
                         worker_groups=worker_groups())
    return {n: getattr(state[key(n, "load")], "local_tensor", state[key(n, "load")]) for n in dense}







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
    if not paddle.is_compiled_with_cuda():
        # CPU-only Paddle: the checkpoint code calls Tensor.cuda(), Tensor.pin_memory() and paddle.device.synchronize()
        # on its reshard, offload and async paths; on a CPU wheel those raise, so they become CPU copies and a no-op
        # (nothing else is changed).
        paddle.Tensor.cuda = lambda self, *args, **kwargs: self.clone()
        paddle.Tensor.pin_memory = lambda self, *args, **kwargs: self.clone()
        paddle.device.synchronize = lambda *args, **kwargs: None
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        dist.init_parallel_env()
    RANK = dist.get_rank()
    if PHASE == 0:  # 4 process(es)
        run('step 0: save step-0', save, 'step-0', DATA['save', 0][RANK])
        run('step 1: load step-0', load, 'step-0', DATA['load', 0][RANK])
    print(f"rank {RANK}: every step of launch {PHASE} behaved as it should")


if __name__ == "__main__":
    main()
